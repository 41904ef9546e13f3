"""Reading audio: what a file holds, whether speechlens can enhance it, and its samples in
blocks."""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import soundfile as sf

from ..errors import AudioInputError
from . import libsndfile
from .containers import media_suffixes
from .info import AudioInfo, FileStamp, check_channels, check_finite
from .libsndfile import native_stderr_silenced

#: libsndfile's log line for a WAV data chunk longer than the file: "data : 16000 (should be 7978)".
_DATA_SHORTFALL = re.compile(r"^data\s*:\s*(\d+)\s*\(should be (\d+)\)", re.MULTILINE)
#: Data sizes that streaming writers put in a WAV header when they cannot seek back.
_STREAMED_SIZES = (0, 0xFFFFFFFF)
#: libsndfile's reason when its MPEG probe gives up on bytes that merely looked like MP3.
_MISLEADING_REASON = "File does not exist or is not a regular file"
#: Frame counts from here up mean "not recorded" (libsndfile reports SF_COUNT_MAX for a FLAC
#: streamed without a length); soundfile cannot read such a file past its first block.
_UNKNOWN_FRAMES = 1 << 62
#: libsndfile's name for MPEG audio. Its frame count comes from the first frame's header alone
#: (two MP3s joined count as the first), so MP3 is always read through PyAV, which decodes it.
_MPEG = "MP3"


def _media():
    """The PyAV reader, imported on the first media file (a WAV or FLAC run never needs it)."""
    from . import media
    return media


def decode_error(name: str, error: Exception) -> AudioInputError:
    return AudioInputError(f"{name}: could not be decoded ({libsndfile.reason(error)})")


def read_info(path: str | os.PathLike, name: str | None = None,
              track: int | None = None) -> AudioInfo:
    """Header facts of an audio file, or the typed error that says why it cannot be enhanced.

    Media containers (a suffix naming one, MP3 by any name, or a file libsndfile does not
    recognise whose suffix is none of libsndfile's) are read through PyAV, `track` choosing
    among their audio tracks; libsndfile reads the rest, natively and exactly. The result is
    stamped with the file's identity and version (open_reader checks it again)."""
    path = Path(path)
    name = name or str(path)
    status = _regular_file(path, name)
    return replace(_header(path, name, track), stamp=FileStamp.of(status))


def _regular_file(path: Path, name: str) -> os.stat_result:
    """The status of `path`, a regular file holding something; a FIFO would block the reader
    forever, so only its status is ever read."""
    try:
        status = path.stat()
    except FileNotFoundError:
        raise AudioInputError(f"{name}: no such file") from None
    except OSError as error:
        raise AudioInputError(f"{name}: cannot be read ({error.strerror or error})") from None
    if stat.S_ISDIR(status.st_mode):
        raise AudioInputError(f"{name}: is a folder, not an audio file")
    if not stat.S_ISREG(status.st_mode):
        raise AudioInputError(f"{name}: not a regular file (a pipe, socket or device); "
                              "use '-' to read a stream from stdin")
    if status.st_size == 0:
        raise AudioInputError(f"{name}: is empty (0 bytes)")
    return status


def _header(path: Path, name: str, track: int | None) -> AudioInfo:
    if path.suffix.lower() in media_suffixes():
        return _media().probe(path, name, track)
    try:
        with native_stderr_silenced():
            info = sf.info(libsndfile.native_path(path))
    except libsndfile.ERRORS as error:
        reason = libsndfile.reason(error)
        if reason.startswith(_MISLEADING_REASON) and path.is_file():
            reason = "format not recognised"
        if "not recognised" in reason and not _libsndfile_suffix(path):
            with contextlib.suppress(AudioInputError):
                return _media().probe(path, name, track)
        raise AudioInputError(f"{name}: not a readable audio file ({reason})") from None
    if info.format == _MPEG:
        return _media().probe(path, name, track)
    if info.frames <= 0:
        raise AudioInputError(f"{name}: contains no audio frames")
    if info.frames >= _UNKNOWN_FRAMES:
        raise AudioInputError(
            f"{name}: its header does not record the length (a stream cut short or written to "
            "a pipe); re-encode it to a file"
        )
    check_channels(info.channels, f"{name}:", "split it into files of fewer channels first")
    shortfall = _DATA_SHORTFALL.search(info.extra_info or "")
    if shortfall:
        declared, present = (int(v) for v in shortfall.groups())
        if declared > present and declared not in _STREAMED_SIZES:
            raise AudioInputError(
                f"{name}: truncated (header promises {declared} bytes of audio, "
                f"file holds {present})"
            )
    return AudioInfo(info.frames, info.samplerate, info.channels, info.format, info.subtype)


def _unchanged(path: Path, name: str, info: AudioInfo) -> AudioInfo:
    """`info` from planning while the file keeps its stamp; a file replaced or rewritten since
    is read again, and must still hold what the run planned for (its windows, its output)."""
    try:
        current = FileStamp.of(path.stat())
    except OSError:
        current = None
    if info.stamp is not None and current == info.stamp:
        return info
    fresh = read_info(path, name, info.media.track if info.media else None)
    if fresh.shape != info.shape or _stream(fresh) != _stream(info):
        raise _changed(name, fresh.shape, info.shape)
    return fresh


def _stream(info: AudioInfo) -> int | None:
    """The media stream the speech is in (the others are copied around it); None: libsndfile."""
    return info.media.stream_index if info.media else None


def _changed(name: str, now: tuple[int, int, int], planned: tuple[int, int, int]) \
        -> AudioInputError:
    def shown(shape: tuple[int, int, int]) -> str:
        frames, rate, channels = shape
        return f"{frames} frames, {rate} Hz, {channels} ch"
    return AudioInputError(f"{name}: changed after the run began (now {shown(now)}; planned "
                           f"for {shown(planned)}); enhance it again")


def _libsndfile_suffix(path: Path) -> bool:
    return path.suffix.lstrip(".").upper() in sf.available_formats()


@contextlib.contextmanager
def open_reader(path: str | os.PathLike, name: str,
                info: AudioInfo | None = None) -> Iterator[tuple[sf.SoundFile, AudioInfo]]:
    """A handle whose read() gives float32 blocks; `info`, when the caller has it already,
    spares reading the header (or decoding a media track) again unless the file has changed
    since: it is then read again, and must hold the frames, rate and channels planned for."""
    path = Path(path)
    info = read_info(path, name) if info is None else _unchanged(path, name, info)
    if info.media is not None:
        with _media().media_reader(info, name) as reader:
            yield reader, info
        return
    try:
        with libsndfile.decoding_silenced(info.subtype):
            handle = sf.SoundFile(libsndfile.native_path(path))
    except libsndfile.ERRORS as error:
        raise decode_error(name, error) from None
    with handle:
        opened = (handle.frames, handle.samplerate, handle.channels)
        if opened != info.shape:  # replaced between the check and the opening
            raise _changed(name, opened, info.shape)
        yield handle, info


def read_block(handle: sf.SoundFile, frames: int, name: str, position: int,
               total: int) -> np.ndarray:
    """The next `frames` frames (from frame `position` of `total`) as float32
    [frames, channels]; a file that ends early or holds samples that are not finite is an
    error."""
    try:   # a media reader (PyAV) has no subtype: FFmpeg's logging is off
        with libsndfile.decoding_silenced(getattr(handle, "subtype", "")):
            block = handle.read(frames, dtype="float32", always_2d=True)
    except libsndfile.ERRORS as error:
        raise decode_error(name, error) from None
    if len(block) < frames:
        raise AudioInputError(
            f"{name}: truncated (audio ends at frame {position + len(block)} of {total})")
    check_finite(block, f"{name}:")
    return block


def readable(path: Path) -> bool:
    """Whether libsndfile can read the header of `path`, or PyAV finds an audio track in it."""
    try:
        with native_stderr_silenced():
            sf.info(libsndfile.native_path(path))
    except libsndfile.ERRORS:
        return not _libsndfile_suffix(path) and _media().has_audio(path)
    return True
