"""How every rank of a group leaves: together, with one exit code, once all is reported."""

from __future__ import annotations

import os
import signal
import sys
from typing import NoReturn

import click

from .collectives import Collectives


def leave(collectives: Collectives, code: int, message: str | None) -> NoReturn:
    """Every rank, together: rank 0 prints the error line, all meet at a barrier, and each
    exits at once with `code` (a decision every rank made from the same gathered data)."""
    if collectives.rank == 0 and message:
        click.echo(f"error: {message}", err=True)
    sys.stdout.flush()
    sys.stderr.flush()
    # Everything is reported: from here a SIGTERM (mlx.launch stops the other ranks once one
    # exits non-zero) only makes this rank leave with the same code.
    signal.signal(signal.SIGTERM, lambda _signum, _frame: os._exit(code))
    collectives.barrier()
    # Leave at once rather than tear the interpreter down while the launcher watches.
    os._exit(code)
