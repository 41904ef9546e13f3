"""`speechlens demo`: the whole pipeline tried offline, on generated speech with a generated
checkpoint of random weights, so a user sees it work (and how fast) before any download."""

from __future__ import annotations

import os
import secrets
import shutil
import time
from pathlib import Path

import click

from .. import api
from .. import audio as audio_io
from ..errors import OutputError, OutputExistsError, UsageError
from . import interrupts
from .app import main
from .jobs import check_name


@main.command("demo")
@click.argument("folder", default="speechlens-demo", type=click.Path(path_type=Path))
@click.option("--overwrite", is_flag=True, help="Replace the files an earlier demo left there.")
def demo(folder: Path, overwrite: bool) -> None:
    """Try speechlens offline: make noisy speech and a checkpoint with RANDOM weights in FOLDER
    (default speechlens-demo) and enhance it. It shows the tool working on this machine and how
    fast; random weights do not clean speech (speechlens models pull fetches the real model)."""
    from ..synthetic import demo as material  # the command's own, not every start's

    check_name(str(folder))
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"{folder}: is not a folder")
    noisy, enhanced = folder / material.NOISY, folder / material.ENHANCED
    weights, page = folder / material.CHECKPOINT, folder / material.REPORT
    if not overwrite:
        for path in (noisy, enhanced, weights, page):
            if os.path.lexists(path):
                raise OutputExistsError(f"{path}: exists (--overwrite replaces the demo's files)")
    device = api.select_device()
    with interrupts.signals_interrupt():
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise OutputError(f"{folder}: cannot be made ({error.strerror or error})") from None
        with audio_io.atomic_output(noisy, overwrite=True) as temporary:
            material.write_noisy(temporary)
        click.echo(f"made {noisy}: {material.NOISY_TEXT}")
        _write_checkpoint(weights)
        click.echo(f"made {weights}: {material.RANDOM_WEIGHTS}")
        click.echo(f"enhancing on the {device.upper()}...")
        started = time.perf_counter()
        api.enhance_file(noisy, enhanced, model=str(weights), overwrite=True)
        elapsed = time.perf_counter() - started
    click.echo(f"wrote {enhanced}: {material.SECONDS:g} s of audio in {elapsed:.1f} s on the "
               f"{device.upper()} (model load included; real-time factor "
               f"{elapsed / material.SECONDS:.1f}), with RANDOM weights: it will not sound "
               "cleaner. For real enhancement: speechlens models pull, then speechlens enhance.")
    with interrupts.signals_interrupt():
        for line in report_lines(noisy, enhanced, page, random_weights=True):
            click.echo(line)


def report_lines(noisy: Path, enhanced: Path, page: Path, *, random_weights: bool) -> list[str]:
    """The demo's report (`page`), and what to say of it: its scores and, from a random
    checkpoint, that they drop; without the `report` extra, how to get it (the demo itself
    needs none of it)."""
    from .. import report
    from ..errors import MissingExtraError
    from ..scoring import extra

    try:
        extra.require(extra.DNSMOS + extra.PICTURES)
    except MissingExtraError as error:
        return [f"no report of the run: {error}"]
    from ..synthetic import demo as material

    names = (str(noisy), str(enhanced))
    change = report.score_change(noisy, enhanced, *names)
    report.write_file_page(page, noisy, enhanced, names, change)
    lines = [f"wrote {page}: listen to both, see their spectrograms; DNSMOS OVRL "
             f"{change.input.ovrl:.2f} -> {change.output.ovrl:.2f} "
             f"({change.change.ovrl:+.2f}), SIG {change.change.sig:+.2f}, BAK "
             f"{change.change.bak:+.2f}"]
    return lines + ([f"{material.SCORES_DROP}."] if random_weights else [])


def _write_checkpoint(weights: Path) -> None:
    """The random checkpoint into a temporary folder beside `weights`, then renamed into place
    (an earlier demo's replaced), so an interrupted demo leaves no half-written checkpoint."""
    from ..synthetic import demo as material

    temporary = weights.with_name(f".{weights.name}.{secrets.token_hex(4)}")
    try:
        temporary.mkdir()  # the umask's permissions, as the folder it becomes should have
    except OSError as error:
        raise OutputError(f"{weights.parent}: not writable ({error.strerror or error})") from None
    try:
        material.write_random_checkpoint(temporary)
        if weights.is_dir() and not weights.is_symlink():
            shutil.rmtree(weights)
        elif os.path.lexists(weights):
            weights.unlink()
        os.replace(temporary, weights)
    except OSError as error:
        raise OutputError(f"{weights}: cannot be written ({error.strerror or error})") from None
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
