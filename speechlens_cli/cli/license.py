"""NVIDIA's license, shown and accepted before the first download of its weights, whichever
command would download them."""

from __future__ import annotations

import sys

import click

from .. import checkpoint
from ..errors import UsageError


def confirm_license(spec: str | None, accepted: bool, *, may_ask: bool = True,
                    pulling: bool = False) -> None:
    """Show the license and take a yes (or `accepted`, from --accept-license) when `spec` would
    download NVIDIA's weights; without a terminal to ask on, say how to accept it instead
    (`pulling`: to a user of `models pull`, which is then no next step)."""
    if not checkpoint.needs_license(spec):
        return
    if not accepted and not (may_ask and sys.stdin.isatty()):
        others = "" if pulling else "run `speechlens models pull` in a terminal, or "
        raise checkpoint.license_required(
            checkpoint.model_spec(spec), f"{others}pass --accept-license (scripts: "
                                         f"{checkpoint.LICENSE_ENV}=1)")
    click.echo(checkpoint.LICENSE_NOTE, err=True)
    if not accepted and not click.confirm("Accept these terms and download?", err=True):
        raise UsageError("license not accepted; nothing downloaded")
    checkpoint.accept_license()
