"""`speechlens models`: fetch, list, check and locate checkpoints."""

from __future__ import annotations

import click

from .. import checkpoint, hub, settings
from ..errors import ModelNotFoundError
from .app import main
from .license import confirm_license


@main.group()
def models() -> None:
    """Fetch, list, check and locate RE-USE checkpoints."""


@models.command("pull")
@click.argument("model", required=False)
@click.option("--accept-license", is_flag=True,
              help="Accept NVIDIA's license without a prompt (scripts, CI).")
def models_pull(model: str | None, accept_license: bool) -> None:
    """Download a checkpoint (default nvidia/RE-USE at the pinned revision) and verify it."""
    spec = checkpoint.model_spec(model)
    confirm_license(spec, accept_license, pulling=True)
    report = checkpoint.inspect(spec, download=True)
    click.echo(f"{report.source}: {report.weights}")
    click.echo(f"ok: sha256 {report.sha256}, {report.parameter_count:,} parameters")


@models.command("list")
def models_list() -> None:
    """Checkpoints in the Hugging Face cache, and the one SPEECHLENS_MODEL points to."""
    found, problems = hub.cached_revisions(checkpoint.WEIGHTS_FILE)
    for revision in sorted(found, key=lambda r: (r.repo_id, r.commit)):
        pinned = " (pinned)" if revision.commit == checkpoint.PINNED_REVISION else ""
        click.echo(f"{revision.repo_id}@{revision.commit[:12]}{pinned}  "
                   f"{revision.size / 1e6:.1f} MB  {revision.folder}")
    env = settings.MODEL.value()
    if env:
        click.echo(f"{checkpoint.MODEL_ENV}={env}")
    if problems:
        more = (f"; and {len(problems) - 1} more entries of the cache cannot be read"
                if len(problems) > 1 else "")
        raise ModelNotFoundError(problems[0] + more)
    if not found:
        click.echo(f"no checkpoints in the Hugging Face cache ({hub.cache_folder()}); "
                   "run `speechlens models pull`")


@models.command("verify")
@click.argument("model", required=False)
def models_verify(model: str | None) -> None:
    """Check a checkpoint (folder, file or repo id): keys, shapes, parameters, sha256."""
    report = checkpoint.inspect(model, download=False)
    cfg = report.config
    click.echo(f"source:     {report.source}")
    click.echo(f"weights:    {report.weights}")
    click.echo(f"tensors:    {report.tensor_count:,}")
    click.echo(f"parameters: {report.parameter_count:,}")
    click.echo(f"sha256:     {report.sha256}")
    click.echo(f"config:     {cfg.num_tfmamba} TF-Mamba blocks, {cfg.hid_feature} channels, "
               f"d_state {cfg.d_state}")
    click.echo("ok: compatible with speechlens")


@models.command("path")
@click.argument("model", required=False)
def models_path(model: str | None) -> None:
    """Print where a checkpoint is on disk (never downloads), for --model or scripts."""
    files = checkpoint.resolve(model, download=False)
    local, mode = checkpoint.local_path(checkpoint.model_spec(model))
    click.echo(local.resolve() if mode is not None else files.weights.parent)
