"""What an `enhance` command line asks for: one job per input file, and the files left alone."""

from __future__ import annotations

import contextlib
import io
import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import BinaryIO

from .. import audio as audio_io
from ..errors import OutputError, UsageError
from ..results import FileResult, Status
from . import interrupts


@dataclass(frozen=True)
class Job:
    source: Path
    destination: Path
    name: str          # the input as the user named it
    shown_output: str  # the output as reported ("-" for stdout)
    container: str | None = None  # forced container (stdout is WAV)
    root: Path | None = None  # the output folder named, for an output mirrored below it

    @property
    def to_stdout(self) -> bool:
        return self.shown_output == "-"

    def in_format(self, suffix: str, *, named: bool) -> Job:
        """The job writing `suffix` (--format); `named`: the user typed the output's name, whose
        own suffix may not say otherwise."""
        if self.to_stdout:  # a pipe: the suffix decides, for a container a pipe can carry
            audio_io.check_piped(suffix)
            return replace(self, destination=self.destination.with_suffix(suffix),
                           container=None)
        own = self.destination.suffix.lower()
        if named and audio_io.format_for_suffix(own) and own != suffix:
            raise UsageError(f"{self.destination}: its suffix contradicts --format {suffix[1:]}")
        target = self.destination.with_suffix(suffix)
        return replace(self, destination=target, shown_output=str(target))


def folder_jobs(source: Path, destination: Path) -> tuple[list[Job], list]:
    """Every audio file under `source`, mirrored under `destination`, plus the files left alone:
    not audio (Paths) or not followed (audio_io.Skipped: symlinks leaving the tree, pipes)."""
    if audio_io.same_file(source, destination):
        raise UsageError(f"{destination}: is the input folder; choose another output folder")
    if destination.exists() and not destination.is_dir():
        raise UsageError(f"{destination}: exists and is not a folder")
    inside = destination.resolve().is_relative_to(source.resolve())
    scan = audio_io.scan_tree(source, exclude=destination if inside else None)
    interrupts.check()  # a signal whose interrupt a library swallowed while the scan read files
    jobs = [Job(path, destination / path.relative_to(source), str(path),
                 str(destination / path.relative_to(source)), root=destination)
            for path in scan.audio]
    if not jobs:
        raise UsageError(f"{source}: no audio files found")
    return jobs, [*scan.other, *scan.skipped]


def check_shared_destination(jobs: list[Job], *, skip_existing: bool) -> None:
    """Stop a batch whose every output folder fails (unwritable, full, a file where the folder
    goes) before its first file, in one line, rather than failing each file with it in turn."""
    folders = sorted({audio_io.nearest_existing(job.destination.parent) for job in jobs
                      if not (skip_existing and os.path.exists(job.destination))})
    failures = []
    for folder in folders:
        try:
            audio_io.check_writable(folder)
        except OutputError as error:
            failures.append(error)
        else:
            return
    if len(failures) > 1:
        raise OutputError(f"{failures[0]}; and so are the other {len(failures) - 1} output "
                          "folders")
    if failures:
        raise failures[0]


def left_alone(item) -> FileResult:
    """The result of a file a folder batch does not enhance (see folder_jobs)."""
    if isinstance(item, audio_io.Skipped):
        return FileResult(str(item.path), None, Status.SKIPPED, reason=item.reason)
    return FileResult(str(item), None, Status.NOT_AUDIO, reason="not an audio file")


def beside_inputs(paths: tuple[str, ...], suffix: str) -> tuple[list[Job], list]:
    """SOURCES... --suffix S: each output next to its input, as NAME{S}.EXT; and the inputs
    left alone (audio_io.Skipped) because their NAME already ends in S: outputs of an earlier
    run, which `*.m4a` matches again (enhanced, they would become NAME{S}{S}.EXT)."""
    audio_io.check_name_part(suffix, "--suffix")
    jobs, outputs = [], []
    for source in paths:
        path = Path(source)
        if source == "-" or path.is_dir():
            raise UsageError(f"{source}: --suffix names outputs beside input files; for "
                             "stdin or a folder give a destination")
        if path.stem.endswith(suffix):
            outputs.append(audio_io.Skipped(path, f"its name ends in {suffix}: an output, "
                                                  "not enhanced again"))
            continue
        target = suffixed(path, suffix)
        check_name(str(target))
        jobs.append(Job(path, target, source, str(target)))
    return jobs, outputs


def suffixed(path: Path, suffix: str) -> Path:
    """NAME{suffix}.EXT beside NAME.EXT: --suffix's outputs, --residual SUFFIX's files."""
    return path.with_name(path.stem + suffix + path.suffix)


def residual_is_path(value: str) -> bool:
    """--residual VALUE names a file (a folder in it, or an audio suffix: noise.wav), else it is
    a SUFFIX added to each output's name (_removed: out_removed.wav)."""
    return any(c in value for c in audio_io.SEPARATORS) or \
        audio_io.format_for_suffix(Path(value).suffix.lower()) is not None


def check_residual(value: str, jobs: list[Job], *, batch: bool) -> None:
    """--residual before any work: a PATH for one output, a SUFFIX for outputs with names."""
    if residual_is_path(value):
        check_name(value)
        if batch:
            raise UsageError(f"--residual {value}: names one file, and this run writes several "
                             "outputs; give a SUFFIX (e.g. _removed) to write each beside its "
                             "output")
        return
    audio_io.check_name_part(value, "--residual")
    if any(job.to_stdout for job in jobs):
        raise UsageError(f"--residual {value}: a SUFFIX goes beside the output, which is stdout "
                         "here; give the residual a file name (e.g. removed.wav)")


def residual_for(job: Job, value: str) -> Path:
    """Where --residual VALUE puts this job's residual (check_residual has passed)."""
    if residual_is_path(value):
        return Path(value)
    return suffixed(job.destination, value)


def check_name(name: str) -> None:
    """A name the system cannot hold (too long) is a usage error, before any check of the file
    it names raises instead of answering."""
    problem = audio_io.name_problem(name)
    if problem:
        raise UsageError(f"{name}: {problem}")


def check_names(*names: str | None) -> None:
    """check_name for each name given on the command line ('-' is a stream; None: not given)."""
    for name in names:
        if name is not None and name != "-":
            check_name(name)


def standard_stream(which: str, use: str) -> BinaryIO:
    """sys.stdin's or sys.stdout's bytes, for `use`. A process started with that stream closed
    (`<&-`, `>&-`: Python sets it to None) is refused before any work, not after the model ran."""
    stream = getattr(sys, which)
    if stream is None or not _descriptor_open(stream):
        raise UsageError(f"<{which}>: is closed, so {use}")
    return stream.buffer


def _descriptor_open(stream) -> bool:
    if stream.closed:
        return False
    try:
        descriptor = stream.fileno()
    except io.UnsupportedOperation:   # no descriptor (a test harness's buffer): nothing to check
        return True
    try:
        os.fstat(descriptor)
    except OSError:
        return False
    return True


def _folders_by_name(paths: tuple[str, ...]) -> dict[str, str]:
    """{source: the name its tree keeps under -o} for each folder among several sources; two
    folders of one name (a/x, b/x) would mix their files in one tree, a usage error."""
    names: dict[str, str] = {}
    for source in paths:
        if source != "-" and Path(source).is_dir():
            name = Path(source).resolve().name
            twin = next((other for other, its in names.items() if its == name), None)
            if twin is not None:
                raise UsageError(f"{source}: has the name of {twin}, and -o keeps each folder's "
                                 "name; enhance them into different folders")
            names[source] = name
    return names


def collect_jobs(paths: tuple[str, ...], output_dir: str | None,
                  stack: contextlib.ExitStack,
                  suffix: str | None = None) -> tuple[list[Job], list[Path], bool]:
    """(jobs, non-audio files, is a batch) for SOURCE DESTINATION, SOURCES... -o DIR or
    SOURCES... --suffix S."""
    check_names(*paths, output_dir)
    if suffix is not None:
        if output_dir is not None:
            raise UsageError("--suffix writes beside the inputs, -o into a folder: choose one")
        return (*beside_inputs(paths, suffix), len(paths) > 1)
    if output_dir is not None:
        out = Path(output_dir)
        if out.exists() and not out.is_dir():
            raise UsageError(f"{out}: exists and is not a folder")
        jobs, others = [], []
        folders = _folders_by_name(paths) if len(paths) > 1 else {}
        for source in paths:
            if source == "-":
                raise UsageError("'-' (stdin) cannot be combined with -o")
            if Path(source).is_dir():   # several keep their names: out/dirA/..., out/dirB/...
                found, skipped = folder_jobs(Path(source), out / folders[source] if folders
                                             else out)
                jobs += found
                others += skipped
            else:
                target = out / Path(source).name
                jobs.append(Job(Path(source), target, source, str(target)))
        return jobs, others, True
    if len(paths) != 2:
        raise UsageError("give SOURCE and DESTINATION, or several sources with -o DIR or "
                         "--suffix S")
    source, destination = paths
    if source != "-" and Path(source).is_dir():
        if destination == "-":
            raise UsageError(f"{source}: a folder cannot be written to stdout")
        if not os.path.lexists(destination) and not destination.endswith(("/", os.sep)) \
                and audio_io.format_for_suffix(Path(destination).suffix):  # made a folder x.wav
            raise UsageError(f"{destination}: names an audio file, but {source} is a folder; "
                             "give an output folder")
        return (*folder_jobs(Path(source), Path(destination)), True)
    if destination == "-" and standard_stream(
            "stdout", "the audio for '-' has nowhere to go; name an output file").isatty():
        raise UsageError("<stdout>: is a terminal, which cannot show audio; redirect it "
                         "(> out.wav) or name an output file")
    if source == "-":
        stdin = standard_stream("stdin", "there is no audio to read for '-'; name the input file")
        read_from, name = stack.enter_context(audio_io.spooled_stdin(stdin)), "<stdin>"
    else:
        read_from, name = Path(source), source
    if destination == "-":
        folder = stack.enter_context(audio_io.stdout_folder())
        return [Job(read_from, folder / "stdout.wav", name, "-", "WAV")], [], False
    target = Path(destination)
    if target.is_dir() or destination.endswith(("/", os.sep)):
        if source == "-":
            raise UsageError("input from stdin needs an output file name, not a folder")
        target = target / read_from.name
    return [Job(read_from, target, name, str(target))], [], False
