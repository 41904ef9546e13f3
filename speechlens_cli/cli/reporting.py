"""How `enhance` reports: progress bars (a terminal) or progress lines (a log) and notes on
stderr, the time it will take, JSON lines on stdout, the batch summary at the end."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path

import click

from .. import audio as audio_io
from .. import settings
from ..api import FilePlan
from ..results import FileResult, Status
from . import speed
from .before_after import score_line

_STYLES = {Status.DONE: "green", Status.SKIPPED: "yellow",
           Status.NOT_AUDIO: "dim", Status.PLANNED: "cyan"}
#: A run expected to take longer is announced with its estimate.
ESTIMATE_NOTE_S = 60.0
#: Without a terminal (a SLURM log), a long file's progress line at most this often, as its
#: windows finish.
PROGRESS_INTERVAL_S = 60.0
#: A batch of more files closes with totals and its failures, not one row per file.
SUMMARY_TABLE_MAX_FILES = 20


def _may_be_terminal() -> bool:
    """Whether Rich could take stderr for a terminal: it is a TTY, or one of Rich's switches for
    that (FORCE_COLOR, TTY_COMPATIBLE) is set. Where not, Rich would draw no bars."""
    try:
        tty = sys.stderr.isatty()
    except (AttributeError, ValueError):   # no stderr, or a closed one
        tty = False
    return tty or any(setting.raw() is not None
                      for setting in (settings.FORCE_COLOR, settings.TTY_COMPATIBLE))


class LogDisplay:
    """ProgressDisplay where stderr is a log (a batch job's, `2> log`, a pipe), without Rich's
    54 modules in every such process: its notes as plain lines, no bars; Rich only for a batch's
    closing summary."""

    is_terminal = False

    def __init__(self, *, total: int):
        self.total_files = total
        self.progress = contextlib.nullcontext()

    @property
    def console(self):
        from rich.console import Console

        return Console(stderr=True)

    def print(self, message: str) -> None:
        click.echo(message, err=True)

    def batch_seconds(self, seconds: float) -> None:
        """No batch bar to size."""

    def file_progress(self, plan: FilePlan):
        return lambda frames: None

    def file_finished(self, finished: int, name: str) -> None:
        """No bar to take down."""


class ProgressDisplay:
    """Progress bars on stderr (a terminal only): the batch, in seconds of audio, so its time
    remaining weighs a long file as such; each file on the model and not yet finished (the next
    file starts while the last one is written), in seconds of audio. Notes are printed through
    it so they do not tear the bars."""

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
        #: Files started and not finished, by name: [task, seconds, seconds enhanced so far].
        self.running: dict[str, list[list]] = {}
        self.seconds_done = 0.0    # audio of the batch's finished runs

    @property
    def is_terminal(self) -> bool:
        return self.console.is_terminal

    def print(self, message: str) -> None:
        self.progress.console.print(message, markup=False, highlight=False, soft_wrap=True)

    def batch_seconds(self, seconds: float) -> None:
        """The audio the batch will enhance, once every file is planned: the batch bar's total."""
        if self.files is not None:
            self.progress.update(self.files, total=seconds, completed=0)

    def file_progress(self, plan: FilePlan):
        """A pipeline progress callback showing this file, and the batch, in audio seconds."""
        rate, seconds = plan.info.sample_rate, plan.info.seconds
        entry = [self.progress.add_task(Path(plan.name).name, total=seconds,
                                        shown=f"0.0/{seconds:.1f} s"), seconds, 0.0]
        self.running.setdefault(plan.name, []).append(entry)

        def update(frames: int) -> None:
            entry[2] = frames / rate
            self.progress.update(entry[0], completed=entry[2],
                                 shown=f"{entry[2]:.1f}/{seconds:.1f} s")
            self._batch_bar()
        return update

    def file_finished(self, finished: int, name: str) -> None:
        """The `finished`-th result, for the input `name`: its bar (if it had one) goes."""
        started = self.running.get(name)
        if started:
            task, seconds, _ = started.pop(0)
            self.progress.remove_task(task)
            self.seconds_done += seconds
            if not started:
                del self.running[name]
        self._batch_bar(shown=f"{finished}/{self.total_files} files")

    def _batch_bar(self, **fields) -> None:
        if self.files is not None:
            running = sum(entry[2] for entries in self.running.values() for entry in entries)
            self.progress.update(self.files, completed=self.seconds_done + running, **fields)


def print_summary(console, results: list[FileResult], elapsed: float) -> None:
    """Up to SUMMARY_TABLE_MAX_FILES files, the batch's table, one row per file that did not fail
    (each failure was its own error line as it happened); above, the failures again (their lines
    have scrolled away). Then the count per status and the audio enhanced per second of the run
    (`elapsed`, the model's loading included)."""
    from rich.text import Text

    failed = [result.input for result in results if result.status is Status.FAILED]
    if len(results) > SUMMARY_TABLE_MAX_FILES:
        for name in failed:
            console.print(Text(f"failed: {name}"))
    else:
        _print_table(console, results)
    counts: dict[str, int] = {}
    for result in results:
        counts[result.status.value] = counts.get(result.status.value, 0) + 1
    audio = sum(result.audio.seconds for result in results if result.status is Status.DONE)
    totals = ", ".join(f"{n} {status}" for status, n in counts.items())
    if audio:
        totals += (f"; {audio:.1f} s of audio enhanced in {elapsed:.1f} s "
                   f"({audio / max(elapsed, 1e-9):.2f} s of audio per s)")
    console.print(Text(totals))


def _print_table(console, results: list[FileResult]) -> None:
    from rich.table import Table
    from rich.text import Text

    table = Table(title="speechlens enhance")
    for column in ("input", "status", "audio", "note"):
        table.add_column(column)
    for result in results:
        if result.status is Status.FAILED:
            continue
        note = result.reason or (
            f"{result.clamped} samples clamped" if result.clamped else "")
        audio = f"{result.audio.seconds:.2f} s" if result.audio is not None else ""
        table.add_row(Text(result.input), Text(result.status.value, _STYLES[result.status]),
                      audio, Text(note))
    if table.row_count:
        console.print(table)


class Reporter:
    """Collects every file's result and says what it needs to: its JSON line (stdout), its
    notes (stderr, unless quiet), how long the run will take, progress lines where no terminal
    shows the bars, and at the end of a batch the summary."""

    def __init__(self, *, as_json: bool, quiet: bool, verbose: bool, batch: bool, total: int,
                 plan_lines: bool = True):
        self.as_json, self.quiet, self.verbose, self.batch = as_json, quiet, verbose, batch
        self.plan_lines = plan_lines
        self.results: list[FileResult] = []
        #: Why the --json lines stopped reaching stdout, if they did.
        self.json_error: str | None = None
        self.display = (ProgressDisplay(quiet=quiet, batch=batch, total=total)
                        if _may_be_terminal() else LogDisplay(total=total))
        self.progress = self.display.progress
        #: Progress as lines: stderr is a log, not a terminal.
        self.log_lines = not quiet and not self.display.is_terminal
        self.started = time.monotonic()
        self.rate_key: str | None = None  # set once the model is loaded
        self.rate: float | None = None    # seconds per million samples, measured here before
        self.estimated = False            # the run's one estimate was given (or not needed)
        self.planned_files = 0            # the files the run will enhance (plan_batch),
        self.planned_seconds = 0.0        # their seconds of audio
        self.planned_samples = 0          # and their samples (_samples)
        self.audio_done = 0.0             # seconds of audio of the files enhanced so far
        self.samples_done = 0             # and their samples (_samples)
        self.working = 0.0                # wall seconds those files took

    def note(self, message: str, *, verbose: bool = False) -> None:
        if not self.quiet and (self.verbose or not verbose):
            self.display.print(message)

    def plan_batch(self, plans: list[FilePlan]) -> None:
        """The files the run will enhance, once every one is planned: the batch bar's total,
        and the totals the estimates and progress lines take."""
        self.planned_files = len(plans)
        self.planned_seconds = sum(plan.info.seconds for plan in plans)
        self.planned_samples = sum(_samples(plan) for plan in plans)
        self.display.batch_seconds(self.planned_seconds)

    def model_ready(self, rate_key: str) -> None:
        """The model is loaded: a batch's estimate, where this machine has timed it before."""
        self.rate_key, self.rate = rate_key, speed.stored_rate(rate_key)
        if self.batch and self.rate is not None:
            self._estimate(self.planned_samples * self.rate / 1e6,
                           f"for this batch's {self.planned_files} files "
                           f"({self.planned_seconds:.1f} s of audio)",
                           "measured here by earlier runs")

    def _estimate(self, seconds: float, what: str, source: str) -> None:
        if not self.estimated and seconds >= ESTIMATE_NOTE_S:
            self.note(f"note: {speed.about(seconds)} {what} on this machine ({source})")
        self.estimated = True

    def file_progress(self, plan: FilePlan):
        """A pipeline progress callback: the bars, the run's estimate (from earlier runs, else
        from the first window's speed, for the file or the rest of the batch) and, without a
        terminal, a line at most every PROGRESS_INTERVAL_S."""
        show = self.display.file_progress(plan)
        name, rate, total = plan.name, plan.info.sample_rate, plan.info.seconds
        samples = _samples(plan)
        if self.rate is not None:
            self._estimate(samples * self.rate / 1e6, "for this file",
                           "measured here by earlier runs")
        started = last_line = time.monotonic()

        def update(frames: int) -> None:
            nonlocal last_line
            show(frames)
            now = time.monotonic()
            per_sample = (now - started) / max(frames * plan.info.channels, 1)
            left = per_sample * (samples - frames * plan.info.channels)
            if not self.estimated and self.batch:  # the rest of the batch, this file's included
                batch_left = self.planned_samples - self.samples_done
                self._estimate(per_sample * (batch_left - frames * plan.info.channels),
                               "left for this batch", "from the speed of its first window")
            elif not self.estimated:
                self._estimate(left, "left for this file", "from the speed of its first window")
            if self.log_lines and frames < plan.info.frames \
                    and now - last_line >= PROGRESS_INTERVAL_S:
                last_line = now
                self.display.print(f"{name}: {frames / rate:.1f} of {total:.1f} s of audio, "
                                   f"{speed.about(left)} left")
        return update

    def record(self, result: FileResult) -> None:
        self.results.append(result)
        self.display.file_finished(len(self.results), result.input)
        if self.as_json and self.json_error is None:
            try:
                audio_io.write_line(json.dumps(result.as_dict()))
            except OSError as error:  # the batch goes on; the run fails at its end
                audio_io.detach_stdout()
                self.json_error = (f"<stdout>: the --json report could not be written "
                                   f"({error.strerror or error}) from {result.input} on")
        if result.status is Status.DONE:
            self._measured(result)
            if result.clamped:
                self.note(f"warning: {result.output}: {result.clamped} samples clamped to "
                          f"full scale ({result.audio.subtype} cannot hold louder peaks)")
            if not self.batch:
                self.note(f"enhanced {result.input} -> {result.output}: "
                          f"{result.audio.seconds:.2f} s of audio in "
                          f"{result.elapsed_seconds:.2f} s")
            scores = score_line(result)
            if scores:
                self.note(scores)
        elif result.status is Status.FAILED and self.batch:  # a single file's is raised
            self.display.print(f"error: {result.error}")  # errors show under --quiet too
        elif result.status is Status.NOT_AUDIO:
            self.note(f"skipped, not audio: {result.input}")

    def _measured(self, result: FileResult) -> None:
        """Keep the file's speed for the next run's estimate; in a batch without a terminal,
        its line, with the time the rest will take at this run's speed."""
        elapsed, audio = result.elapsed_seconds, result.audio
        if self.rate_key is not None:
            speed.store_rate(self.rate_key, elapsed, audio.frames * audio.channels)
        self.audio_done += audio.seconds
        self.samples_done += audio.frames * audio.channels
        self.working += elapsed
        if not (self.batch and self.log_lines):
            return
        line = (f"[{len(self.results)}/{self.display.total_files}] {result.input}: "
                f"{audio.seconds:.2f} s of audio in {elapsed:.2f} s")
        audio_left = self.planned_seconds - self.audio_done
        if audio_left > 0 and self.audio_done > 0:
            line += f"; {speed.about(audio_left * self.working / self.audio_done)} left"
        self.display.print(line)

    def plan_line(self, result: FileResult) -> None:
        if self.plan_lines and result.status is Status.PLANNED and not self.as_json:
            audio = result.audio
            click.echo(f"{result.input} -> {result.output}: {audio.sample_rate} Hz, "
                       f"{audio.channels} ch, {audio.seconds:.2f} s, "
                       f"{audio.format}/{audio.subtype}")

    def summary(self) -> None:
        if self.quiet or not self.batch:
            return
        print_summary(self.display.console, self.results, time.monotonic() - self.started)


def _samples(plan: FilePlan) -> int:
    """What the model's work grows with: frames times channels, at any rate."""
    return plan.info.frames * plan.info.channels
