"""The `speechlens` command: a thin Click layer over the Python API.

Every typed error becomes one line on stderr and its exit code here, and only here.
"""

from __future__ import annotations

import sys

import click

from . import __version__, checkpoint
from .errors import SpeechlensError


def _versions() -> str:
    import mlx.core as mx

    backend = "cuda" if mx.cuda.is_available() else "metal" if mx.metal.is_available() else "cpu"
    return f"speechlens {__version__} (mlx {mx.__version__}, backend {backend})"


class _Group(click.Group):
    """Maps SpeechlensError to one line and its exit code; Ctrl-C to 130."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except SpeechlensError as error:
            click.echo(f"error: {error}", err=True)
            ctx.exit(error.exit_code)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            ctx.exit(130)


def _show_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(_versions())
        ctx.exit()


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True,
              callback=_show_version, help="Show speechlens, MLX and backend versions.")
def main() -> None:
    """Clean up recorded speech with NVIDIA's RE-USE model on MLX."""


@main.group()
def models() -> None:
    """Fetch, list, check and locate RE-USE checkpoints."""


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


@main.command()
@click.argument("source", type=click.Path(dir_okay=False, allow_dash=False))
@click.argument("destination", type=click.Path(dir_okay=False, allow_dash=False))
@click.option("--model", "model", default=None, envvar=checkpoint.MODEL_ENV,
              help="Hugging Face repo id, checkpoint folder or .safetensors file.")
@click.option("--strict-mode", is_flag=True, help="Numerically strictest scan.")
@click.option("--overwrite", is_flag=True, help="Replace an existing output file.")
def enhance(source: str, destination: str, model: str | None, strict_mode: bool,
            overwrite: bool) -> None:
    """Enhance SOURCE into DESTINATION (same rate, channels, length and format)."""
    from .api import enhance_file

    enhance_file(source, destination, model=model, strict=strict_mode, overwrite=overwrite)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
