"""How `enhance` reports: progress bars and notes on stderr, JSON lines on stdout, the batch
summary table at the end."""

from __future__ import annotations

import json
from pathlib import Path

import click

from .. import audio as audio_io
from ..api import FilePlan
from ..results import FileResult, Status

_STYLES = {Status.DONE: "green", Status.SKIPPED: "yellow",
           Status.NOT_AUDIO: "dim", Status.PLANNED: "cyan"}


class ProgressDisplay:
    """Progress bars on stderr (a terminal only): the batch, in seconds of audio, so its time
    remaining weighs a long file as such; the current file in seconds of audio. Notes are printed
    through it so they do not tear the bars."""

    def __init__(self, *, quiet: bool, batch: bool, total: int):
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

        self.console = Console(stderr=True)
        self.progress = Progress(
            TextColumn("{task.description}"), BarColumn(),
            TextColumn("{task.fields[shown]}"),
            TimeRemainingColumn(), console=self.console, transient=True,
            disable=quiet or not self.console.is_terminal,
        )
        self.total_files = total
        self.files = self.progress.add_task("batch", total=None, shown=f"0/{total} files") \
            if batch else None
        self.current = None
        self.seconds_done = 0.0    # audio of the batch's finished runs
        self.current_seconds = 0.0

    def print(self, message: str) -> None:
        self.progress.console.print(message, markup=False, highlight=False, soft_wrap=True)

    def batch_seconds(self, seconds: float) -> None:
        """The audio the batch will enhance, once every file is planned: the batch bar's total."""
        if self.files is not None:
            self.progress.update(self.files, total=seconds, completed=0)

    def file_progress(self, plan: FilePlan):
        """A pipeline progress callback showing this file, and the batch, in audio seconds."""
        rate, seconds = plan.info.sample_rate, plan.info.seconds
        self.current_seconds = seconds
        self.current = self.progress.add_task(Path(plan.name).name, total=seconds,
                                              shown=f"0.0/{seconds:.1f} s")

        def update(frames: int) -> None:
            self.progress.update(self.current, completed=frames / rate,
                                 shown=f"{frames / rate:.1f}/{seconds:.1f} s")
            if self.files is not None:
                self.progress.update(self.files, completed=self.seconds_done + frames / rate)
        return update

    def file_finished(self, finished: int) -> None:
        if self.current is not None:
            self.progress.remove_task(self.current)
            self.current = None
            self.seconds_done += self.current_seconds
        if self.files is not None:
            self.progress.update(self.files, completed=self.seconds_done,
                                 shown=f"{finished}/{self.total_files} files")


def print_summary(console, results: list[FileResult]) -> None:
    """The batch's table, one row per file that did not fail (each failure was its own error line
    as it happened), and the count per status."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title="speechlens enhance")
    for column in ("input", "status", "audio", "note"):
        table.add_column(column)
    for result in results:
        if result.status is Status.FAILED:
            continue
        note = result.get("reason") or (
            f"{result.get('clamped')} samples clamped" if result.get("clamped") else "")
        audio = f"{result.fields['seconds']:.2f} s" if "seconds" in result.fields else ""
        table.add_row(Text(result.input), Text(result.status.value, _STYLES[result.status]),
                      audio, Text(note))
    if table.row_count:
        console.print(table)
    counts: dict[str, int] = {}
    for result in results:
        counts[result.status.value] = counts.get(result.status.value, 0) + 1
    console.print(", ".join(f"{n} {status}" for status, n in counts.items()), highlight=False)


class Reporter:
    """Collects every file's result and says what it needs to: its JSON line (stdout), its
    notes (stderr, unless quiet), and at the end of a batch the summary."""

    def __init__(self, *, as_json: bool, quiet: bool, verbose: bool, batch: bool, total: int,
                 plan_lines: bool = True):
        self.as_json, self.quiet, self.verbose, self.batch = as_json, quiet, verbose, batch
        self.plan_lines = plan_lines
        self.results: list[FileResult] = []
        #: Why the --json lines stopped reaching stdout, if they did.
        self.json_error: str | None = None
        self.display = ProgressDisplay(quiet=quiet, batch=batch, total=total)
        self.progress = self.display.progress
        self.file_progress = self.display.file_progress
        self.batch_seconds = self.display.batch_seconds

    def note(self, message: str, *, verbose: bool = False) -> None:
        if not self.quiet and (self.verbose or not verbose):
            self.display.print(message)

    def record(self, result: FileResult) -> None:
        self.results.append(result)
        self.display.file_finished(len(self.results))
        if self.as_json and self.json_error is None:
            try:
                audio_io.write_line(json.dumps(result.as_dict()))
            except OSError as error:  # the batch goes on; the run fails at its end
                audio_io.detach_stdout()
                self.json_error = (f"<stdout>: the --json report could not be written "
                                   f"({error.strerror or error}) from {result.input} on")
        if result.status is Status.DONE:
            if result["clamped"]:
                self.note(f"warning: {result.output}: {result['clamped']} samples clamped to "
                          f"full scale ({result['subtype']} cannot hold louder peaks)")
            if not self.batch:
                self.note(f"enhanced {result.input} -> {result.output}: "
                          f"{result['seconds']:.2f} s of audio in "
                          f"{result['elapsed_seconds']:.2f} s")
        elif result.status is Status.FAILED and self.batch:  # a single file's is raised
            self.display.print(f"error: {result['error']}")  # errors show under --quiet too
        elif result.status is Status.NOT_AUDIO:
            self.note(f"skipped, not audio: {result.input}")

    def plan_line(self, result: FileResult) -> None:
        if self.plan_lines and result.status is Status.PLANNED and not self.as_json:
            click.echo(f"{result.input} -> {result.output}: {result['sample_rate']} Hz, "
                       f"{result['channels']} ch, {result['seconds']:.2f} s, "
                       f"{result['format']}/{result['subtype']}")

    def summary(self) -> None:
        if self.quiet or not self.batch:
            return
        print_summary(self.display.console, self.results)
