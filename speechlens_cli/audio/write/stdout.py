"""Audio to stdout: the output is made in a private folder in TMPDIR (named for its owner,
owners.py), read back there like any output, then copied out; the --json report's lines go
through the same checked writer."""

from __future__ import annotations

import contextlib
import errno
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from ...errors import OutputError
from . import owners

_COPY_BLOCK = 1 << 20


@contextlib.contextmanager
def stdout_folder() -> Iterator[Path]:
    """A private folder in TMPDIR where the output for stdout is made, then copied out."""
    owners.sweep_tmpdir()
    try:
        folder = tempfile.TemporaryDirectory(prefix=f"{owners.STDOUT_PREFIX}{owners.owner()}-")
    except OSError as error:
        raise OutputError(f"<stdout>: no room for the output in {tempfile.gettempdir()} "
                          f"({error.strerror or error}); set TMPDIR") from None
    with folder as path:
        yield Path(path)


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
