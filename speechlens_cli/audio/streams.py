"""Audio through stdin and stdout: spooled to and from temporary files."""

from __future__ import annotations

import contextlib
import errno
import io
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import soundfile as sf

from ..errors import AudioInputError, OutputError
from . import libsndfile, owners
from .containers import container_for_file
from .libsndfile import native_stderr_silenced

_COPY_BLOCK = 1 << 20
_SPOOL_PREFIX = "speechlens-stdin."
_SPOOL_SUFFIX = ".stdin"
#: The stdin copy in TMPDIR: "speechlens-stdin.<pid>-<machine>-<random>.stdin" (.wav before).
_SPOOL = re.compile(rf"{re.escape(_SPOOL_PREFIX)}{owners.OWNER_PATTERN}-\w+\.(stdin|wav)")
_STDOUT_PREFIX = "speechlens-stdout."
#: The folder in TMPDIR where the output for stdout is made: "speechlens-stdout.<owner>-<random>".
_STDOUT_FOLDER = re.compile(rf"{re.escape(_STDOUT_PREFIX)}{owners.OWNER_PATTERN}-\w+")


@contextlib.contextmanager
def spooled_stdin(stream: BinaryIO) -> Iterator[Path]:
    """Copy a (non-seekable) input stream to a temporary file, so it can be streamed by blocks."""
    folder = tempfile.gettempdir()
    _sweep_tmpdir()
    try:
        # not .wav: the bytes decide whether libsndfile or PyAV reads it (read.read_info)
        handle, temporary = tempfile.mkstemp(prefix=f"{_SPOOL_PREFIX}{owners.owner()}-",
                                             suffix=_SPOOL_SUFFIX)
    except OSError as error:
        raise OutputError(f"<stdin>: cannot be buffered in {folder} ({error.strerror or error}); "
                          "set TMPDIR to a writable folder") from None
    try:
        try:
            with os.fdopen(handle, "wb") as sink:
                first = stream.read(_COPY_BLOCK)
                _check_audio_start(first)
                sink.write(first)
                shutil.copyfileobj(stream, sink, _COPY_BLOCK)
        except OSError as error:
            raise OutputError(f"<stdin>: could not be buffered in {folder} "
                              f"({error.strerror or error}); set TMPDIR to a folder with room") \
                from None
        yield Path(temporary)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)


def _sweep_tmpdir() -> None:
    """What killed runs left in TMPDIR: copies of stdin, folders of stdout outputs."""
    owners.sweep(tempfile.gettempdir(), _SPOOL)
    owners.sweep(tempfile.gettempdir(), _STDOUT_FOLDER, folders=True)


@contextlib.contextmanager
def stdout_folder() -> Iterator[Path]:
    """A private folder in TMPDIR where the output for stdout is made, then copied out."""
    _sweep_tmpdir()
    try:
        folder = tempfile.TemporaryDirectory(prefix=f"{_STDOUT_PREFIX}{owners.owner()}-")
    except OSError as error:
        raise OutputError(f"<stdout>: no room for the output in {tempfile.gettempdir()} "
                          f"({error.strerror or error}); set TMPDIR") from None
    with folder as path:
        yield Path(path)


def _check_audio_start(first: bytes) -> None:
    """Refuse a stream whose first bytes are no format libsndfile knows before any more of it is
    buffered: `yes | speechlens enhance - out.wav` would otherwise fill TMPDIR first. Only an
    unknown format is refused here; a known one cut short is left to the full read (a CAF, say,
    does not parse from its first megabyte). Media (m4a, mp3, webm...) are PyAV's to judge."""
    try:
        with native_stderr_silenced():
            sf.info(io.BytesIO(first))
    except libsndfile.ERRORS as error:
        if "not recognised" in libsndfile.reason(error) and not _media_start(first):
            raise AudioInputError(f"<stdin>: not a readable audio file (no format recognised in "
                                  f"its first {len(first):,} bytes; nothing more was read)") \
                from None


def _media_start(first: bytes) -> bool:
    """Whether `first` begins a media file speechlens reads: PyAV finds an audio track in a
    container speechlens knows, or an MP4 "ftyp" box starts it (whose track list, the "moov"
    box, may come only at the end of a phone recording)."""
    if first[4:8] == b"ftyp":
        return True
    from . import pyav
    try:
        with pyav.open_input(io.BytesIO(first)) as container:
            return bool(container.streams.audio) \
                and container_for_file("", container.format.name) is not None
    except pyav.ERRORS:
        return False


def write_all(stream: BinaryIO, data: bytes) -> None:
    """Every byte of `data`, or an OSError. A raw stream (stdout under PYTHONUNBUFFERED=1, say)
    may take fewer bytes than it is given and say so only in its return value: a full disk
    then cut the audio short while the copy reported success."""
    view = memoryview(data)
    while view:
        written = stream.write(view)
        if not written:   # 0, or None from a non-blocking stream with no room
            raise OSError(errno.EIO, "the stream accepted no more bytes")
        view = view[written:]


def copy_to_stream(path: Path, stream: BinaryIO) -> None:
    try:
        with open(path, "rb") as source:
            for block in iter(lambda: source.read(_COPY_BLOCK), b""):
                write_all(stream, block)
        stream.flush()
    except BrokenPipeError:
        detach_stdout()
        raise OutputError("<stdout>: the reader closed the pipe before all the audio was written") \
            from None
    except OSError as error:
        detach_stdout()
        raise OutputError(f"<stdout>: write failed ({error.strerror or error})") from None


def write_line(line: str) -> None:
    """One line of text on stdout through the checked writer (the --json report)."""
    stream = sys.stdout.buffer
    write_all(stream, (line + "\n").encode())
    stream.flush()


def detach_stdout() -> None:
    """Point fd 1 at /dev/null: what is still buffered for stdout goes nowhere, so the
    interpreter's final flush cannot fail a second time (a traceback, exit code 120)."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        quiet = os.open(os.devnull, os.O_WRONLY)
        os.dup2(quiet, sys.stdout.fileno())
        os.close(quiet)
