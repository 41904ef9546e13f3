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
            with os.fdopen(handle, "w+b") as spool:
                first = stream.read(_COPY_BLOCK)
                spool.write(first)
                _check_audio_start(first, _Spooling(stream, spool))
                spool.seek(0, os.SEEK_END)
                shutil.copyfileobj(stream, spool, _COPY_BLOCK)
        except OSError as error:
            raise OutputError(f"<stdin>: could not be buffered in {folder} "
                              f"({error.strerror or error}); set TMPDIR to a folder with room") \
                from None
        yield Path(temporary)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)


class _Spooling(io.RawIOBase):
    """The input stream as FFmpeg reads it while judging it: what is already in the spool file
    is read from there, and reading or seeking past it copies more of the stream into the spool
    first, so FFmpeg can read as far into the stream as the format needs (an MP3 behind a cover
    of several MiB, a QuickTime file whose track list comes after its samples) and seek back,
    and nothing it read is lost to the spool."""

    def __init__(self, stream: BinaryIO, spool: BinaryIO):
        self.stream, self.spool, self.position = stream, spool, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def spooled(self) -> int:
        """Bytes copied from the stream so far."""
        return self.spool.seek(0, os.SEEK_END)

    def _spool_up_to(self, end: int | None) -> int:
        """Copy the stream into the spool until it holds `end` bytes (None: all); its size."""
        spooled = self.spooled()
        while end is None or spooled < end:
            block = self.stream.read(_COPY_BLOCK)
            if not block:
                break
            self.spool.write(block)
            spooled += len(block)
        return spooled

    def read(self, size: int = -1) -> bytes:
        self._spool_up_to(None if size < 0 else self.position + size)
        self.spool.seek(self.position)
        data = self.spool.read(size)
        self.position += len(data)
        return data

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self.position}.get(whence)
        if base is None:  # from the end: all of the stream
            base = self._spool_up_to(None)
        self.position = min(base + offset, self._spool_up_to(base + offset))
        return self.position

    def tell(self) -> int:
        return self.position


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


def _check_audio_start(first: bytes, stream: _Spooling) -> None:
    """Refuse a stream that is no audio before the rest of it is buffered: `yes | speechlens
    enhance - out.wav` would otherwise fill TMPDIR first. libsndfile judges its formats by the
    first bytes (a known format cut short is left to the full read: a CAF, say, does not parse
    from its first megabyte); media are FFmpeg's to judge, reading as far as it needs, as it
    would read the file: it takes no more of a stream that is none of its formats than its
    probe (1 MiB), and an MP3 behind a large cover or a QuickTime file whose track list comes
    last are read as far as that."""
    try:
        with native_stderr_silenced():
            sf.info(io.BytesIO(first))
    except libsndfile.ERRORS as error:
        if "not recognised" in libsndfile.reason(error) and not _media(stream):
            raise AudioInputError(f"<stdin>: not a readable audio file (no format recognised in "
                                  f"its first {stream.spooled():,} bytes; nothing more was read)") \
                from None


def _media(stream: _Spooling) -> bool:
    """Whether FFmpeg takes `stream` for a media container speechlens reads: it opens it, with
    an audio track, or the demuxer that recognised it says what is wrong with it (an MP4 cut
    before its track list), which the full read then reports as it would for the file."""
    from . import pyav
    with pyav.ffmpeg_errors() as said:
        try:
            with pyav.open_input(stream) as container:
                return bool(container.streams.audio) \
                    and container_for_file("", container.format.name) is not None
        except pyav.ERRORS:
            return bool(said)


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
