"""`speechlens score`: DNSMOS of each file and, against a clean recording, PESQ, STOI, SI-SDR."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

from .. import audio as audio_io
from ..errors import BatchFailedError, OutputError, SpeechlensError, UsageError
from .app import main
from .jobs import check_names, standard_stream

if TYPE_CHECKING:   # imported by the command itself, not by every start of speechlens
    from .. import scoring

_COLUMNS = (("SIG", 5), ("BAK", 5), ("OVRL", 5), ("P808", 5))
_REFERENCE_COLUMNS = (("PESQ-WB", 7), ("STOI", 5), ("SI-SDR dB", 9))

_EXAMPLES = """\b
Examples:
  speechlens score noisy.wav clean.wav          DNSMOS of each, side by side
  speechlens score out.wav --reference studio.wav   also PESQ, STOI and SI-SDR
  speechlens score *.m4a --json                 one JSON object per file

\b
DNSMOS is Microsoft's (DNS Challenge, dnsmos_local.py): P.835 SIG (speech), BAK (background),
OVRL (overall) and P.808 MOS, each from 1 (bad) to 5, no reference needed. Every file is read
as 16 kHz mono (other rates resampled, channels averaged: the note column says so). Needs the
`report` extra: pip install 'speechlens[report]'.
"""


def _inputs(files: tuple[str, ...], stack: contextlib.ExitStack) -> list[tuple[Path, str]]:
    """(path to read, name to show) per file: a FILE, every audio file under a folder (as
    `enhance` finds them; the others noted), '-' (once) stdin, spooled to a file."""
    found = []
    for name in files:
        if name == "-":
            stdin = standard_stream("stdin", "there is no audio to read for '-'")
            found.append((stack.enter_context(audio_io.spooled_stdin(stdin)), "<stdin>"))
        elif Path(name).is_dir():
            scan = audio_io.scan_tree(Path(name))
            if not scan.audio:
                raise UsageError(f"{name}: no audio files found")
            for left in (*scan.other, *scan.skipped):
                click.echo(f"skipped, not audio: {left}", err=True)
            found += [(path, str(path)) for path in scan.audio]
        else:
            found.append((Path(name), name))
    return found


def _number(value: float | None, width: int, digits: int = 2) -> str:
    return f"{'-' if value is None else f'{value:.{digits}f}':>{width}}"


def _row(result: scoring.FileScores, name_width: int, with_reference: bool) -> str:
    scores = result.dnsmos.as_dict()
    cells = [f"{result.name:<{name_width}}",
             *(_number(scores[title.lower()], width) for title, width in _COLUMNS)]
    if with_reference:
        found = result.reference
        cells += [_number(found.pesq_wb, 7), _number(found.stoi, 5, 3),
                  _number(found.si_sdr_db, 9, 1)]
    return "  ".join(cells) + (f"  {result.conversion}" if result.conversion else "")


def _table(results: list[scoring.FileScores], with_reference: bool) -> list[str]:
    width = max(len("file"), *(len(result.name) for result in results))
    columns = _COLUMNS + (_REFERENCE_COLUMNS if with_reference else ())
    header = "  ".join([f"{'file':<{width}}", *(f"{title:>{size}}" for title, size in columns)])
    if any(result.conversion for result in results):
        header += "  note (scored as 16 kHz mono)"
    return [header, *(_row(result, width, with_reference) for result in results)]


def _emit(text: str) -> None:
    """Scores on stdout, which is all the command delivers: a write that fails (a full disk, a
    closed pipe) is one line and exit 1, never a traceback."""
    try:
        audio_io.write_line(text)
    except OSError as error:
        audio_io.detach_stdout()
        raise OutputError(f"<stdout>: the scores could not be written "
                          f"({error.strerror or error})") from None


@main.command(epilog=_EXAMPLES)
@click.argument("files", nargs=-1, required=True, metavar="FILE...")
@click.option("--reference", default=None, metavar="REF",
              help="A clean recording of the same speech: adds PESQ wide-band, STOI and SI-SDR "
                   "of each FILE against it.")
@click.option("--json", "as_json", is_flag=True,
              help='One JSON object per file on stdout: {"file", "dnsmos": {"sig", "bak", '
                   '"ovrl", "p808"}, "reference": {"pesq_wb", "stoi", "si_sdr_db"} with '
                   '--reference, "input", "converted"}.')
def score(files: tuple[str, ...], reference: str | None, as_json: bool) -> None:
    """Score speech: DNSMOS (SIG, BAK, OVRL, P.808) of each FILE (a folder: every audio file
    in it; '-': stdin); with --reference also PESQ, STOI and SI-SDR against a clean recording of
    the same speech."""
    from .. import scoring

    check_names(*files, reference)
    if files.count("-") > 1:
        raise UsageError("'-' (stdin) can be scored once")
    if reference == "-":
        raise UsageError("--reference: must name a file, not '-'")
    standard_stream("stdout", "--json has nowhere to write; leave it out" if as_json
                    else "the scores have nowhere to go")
    scoring.extra.require(scoring.extra.DNSMOS
                          + (scoring.extra.REFERENCE if reference is not None else ()))
    with contextlib.ExitStack() as stack:
        inputs = _inputs(files, stack)
        clean = scoring.load(reference, reference) if reference is not None else None
        results, errors = [], []
        for path, name in inputs:
            try:
                result = scoring.score_file(path, name, clean)
            except SpeechlensError as error:
                if len(inputs) == 1:
                    raise
                click.echo(f"error: {error}", err=True)
                errors.append(error)
                continue
            results.append(result)
            if as_json:
                _emit(json.dumps(result.as_dict()))
    if results and not as_json:
        _emit("\n".join(_table(results, clean is not None)))
    if errors:
        raise BatchFailedError(f"{len(errors)} of {len(inputs)} files failed (listed above)")
