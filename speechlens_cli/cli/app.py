"""The `speechlens` group: every typed error becomes one line on stderr and its exit code here,
and only here."""

from __future__ import annotations

import io
import os
import signal
import sys
from typing import NoReturn

import click
import mlx.core as mx

from .. import __version__, kernels
from ..errors import GroupExit, SpeechlensError
from . import interrupts


def _versions() -> str:
    return f"speechlens {__version__} (mlx {mx.__version__}, backend {kernels.backend()})"


class _Group(click.Group):
    """Maps SpeechlensError and bad command lines to one line and an exit code; an interrupt
    to 128 + its signal's number (Ctrl-C 130, SIGTERM 143)."""

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """Each command's whole first sentence, wrapped rather than cut off with "..."."""
        rows = [(name, command.get_short_help_str(limit=1_000))
                for name, command in sorted(self.commands.items()) if not command.hidden]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except GroupExit as leaving:
            _leave_group(leaving)
        except SpeechlensError as error:
            click.echo(f"error: {error}", err=True)
            ctx.exit(error.exit_code)
        except click.UsageError as error:
            if isinstance(error, click.exceptions.NoArgsIsHelpError):
                raise
            where = error.ctx.command_path if error.ctx else "speechlens"
            click.echo(f"error: {error.format_message()} (see '{where} --help')", err=True)
            ctx.exit(2)
        except KeyboardInterrupt as interrupt:   # a BatchInterrupted says how far it got
            click.echo(str(interrupt) or "interrupted (no partial output left behind)", err=True)
            ctx.exit(interrupts.exit_code())


def _leave_group(leaving: GroupExit) -> NoReturn:
    """Every rank of a launcher's group, together: rank 0 prints the error line, all meet at the
    barrier, and each exits at once with the group's code."""
    if leaving.speaks and leaving.message:
        click.echo(f"error: {leaving}", err=True)
    sys.stdout.flush()
    sys.stderr.flush()
    # Everything is reported: from here a SIGTERM (mlx.launch stops the other ranks once one
    # exits non-zero) only makes this rank leave with the same code.
    signal.signal(signal.SIGTERM, lambda _signum, _frame: os._exit(leaving.exit_code))
    leaving.barrier()
    # Leave at once rather than tear the interpreter down while the launcher watches.
    os._exit(leaving.exit_code)


def _show_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(_versions())
        ctx.exit()


@click.group(cls=_Group, invoke_without_command=True,
             context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True,
              callback=_show_version, help="Show speechlens, MLX and backend versions.")
@click.pass_context
def main(ctx: click.Context) -> None:
    """Clean up recorded speech with NVIDIA's RE-USE model on MLX."""
    _stderr_of_its_own()
    if ctx.invoked_subcommand is None:  # bare `speechlens`: the help, as asked for
        click.echo(ctx.get_help())


def _stderr_of_its_own() -> None:
    """Python's messages on a descriptor of their own. Fd 2 points to /dev/null for a moment
    while libsndfile probes bytes of a format not yet known or decodes MPEG (audio's
    native_stderr_silenced), on the reader and writer threads too, beside the main thread: an
    error line or the interrupt's, printed then, would be lost.
    Where stderr is no descriptor (a test runner's buffer) there is nothing to move."""
    stream = sys.stderr
    try:
        if stream.fileno() != 2:
            return
        fd = os.dup(2)
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return
    stream.flush()
    sys.stderr = open(fd, "w", buffering=1, encoding=stream.encoding,
                      errors=stream.errors)
