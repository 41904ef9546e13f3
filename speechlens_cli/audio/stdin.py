"""Audio from stdin: copied to a temporary file (named for its owner, write.owners) so it can
be read by blocks, refused early when its first bytes are no audio."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import soundfile as sf

from ..errors import AudioInputError, OutputError
from . import libsndfile
from .containers import container_for_file
from .libsndfile import native_stderr_silenced
from .write import owners

_COPY_BLOCK = 1 << 20


@contextlib.contextmanager
def spooled_stdin(stream: BinaryIO) -> Iterator[Path]:
    """Copy a (non-seekable) input stream to a temporary file, so it can be streamed by blocks."""
    folder = tempfile.gettempdir()
    owners.sweep_tmpdir()
    try:
        # not .wav: the bytes decide whether libsndfile or PyAV reads it (read.read_info)
        handle, temporary = tempfile.mkstemp(prefix=f"{owners.SPOOL_PREFIX}{owners.owner()}-",
                                             suffix=owners.SPOOL_SUFFIX)
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
