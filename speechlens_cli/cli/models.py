"""`speechlens models`: fetch, list, check and locate checkpoints."""

from __future__ import annotations

import os

import click

from .. import checkpoint
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
    confirm_license(spec, accept_license)
    report = checkpoint.inspect(spec, download=True)
    click.echo(f"{report.source}: {report.weights}")
    click.echo(f"ok: sha256 {report.sha256}, {report.parameter_count:,} parameters")


@models.command("list")
def models_list() -> None:
    """Checkpoints in the Hugging Face cache, and the one SPEECHLENS_MODEL points to."""
    from huggingface_hub import constants, scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        repos = scan_cache_dir().repos
    except CacheNotFound:
        repos = frozenset()
    found = 0
    for repo in sorted(repos, key=lambda r: r.repo_id):
        for revision in sorted(repo.revisions, key=lambda r: r.commit_hash):
            if repo.repo_type != "model" or not any(
                    f.file_name == checkpoint.WEIGHTS_FILE for f in revision.files):
                continue
            found += 1
            pinned = " (pinned)" if revision.commit_hash == checkpoint.PINNED_REVISION else ""
            click.echo(f"{repo.repo_id}@{revision.commit_hash[:12]}{pinned}  "
                       f"{revision.size_on_disk / 1e6:.1f} MB  {revision.snapshot_path}")
    env = os.environ.get(checkpoint.MODEL_ENV)
    if env:
        click.echo(f"{checkpoint.MODEL_ENV}={env}")
    if not found:
        click.echo(f"no checkpoints in the Hugging Face cache ({constants.HF_HUB_CACHE}); "
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
