"""Reading audio: what a file holds, whether speechlens can enhance it, and its samples in
blocks."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf

from ..errors import AudioInputError
from . import libsndfile
from .libsndfile import native_stderr_silenced

#: Most channels a file may have: mono, stereo, 5.1 and 7.1 all fit. Each channel is enhanced on
#: its own, so time and window memory grow with the count; a header claiming hundreds of channels
#: is far more likely damage than a recording.
MAX_CHANNELS = 8

#: libsndfile's log line for a WAV data chunk longer than the file: "data : 16000 (should be 7978)".
_DATA_SHORTFALL = re.compile(r"^data\s*:\s*(\d+)\s*\(should be (\d+)\)", re.MULTILINE)
#: Data sizes that streaming writers put in a WAV header when they cannot seek back.
_STREAMED_SIZES = (0, 0xFFFFFFFF)
#: libsndfile's reason when its MPEG probe gives up on bytes that merely looked like MP3.
_MISLEADING_REASON = "File does not exist or is not a regular file"
#: Frame counts from here up mean "not recorded" (libsndfile reports SF_COUNT_MAX for a FLAC
#: streamed without a length); soundfile cannot read such a file past its first block.
_UNKNOWN_FRAMES = 1 << 62


@dataclass(frozen=True)
class AudioInfo:
    frames: int
    sample_rate: int
    channels: int
    format: str
    subtype: str

    @property
    def seconds(self) -> float:
        return self.frames / self.sample_rate


def check_channels(channels: int, subject: str, hint: str) -> None:
    """At least one channel and at most MAX_CHANNELS; `subject` names the audio in the message
    ("audio", "<file>:") and `hint` says how to get there."""
    if channels <= 0:
        raise AudioInputError(f"{subject} has no channels")
    if channels > MAX_CHANNELS:
        raise AudioInputError(f"{subject} has {channels} channels; speechlens enhances at most "
                              f"{MAX_CHANNELS} ({hint})")


def check_finite(samples: np.ndarray, subject: str) -> None:
    """`subject` names the samples in the message ("audio", "<file>:")."""
    if not np.isfinite(samples).all():
        raise AudioInputError(f"{subject} contains NaN or Inf samples")


def decode_error(name: str, error: Exception) -> AudioInputError:
    return AudioInputError(f"{name}: could not be decoded ({libsndfile.reason(error)})")


def read_info(path: str | os.PathLike, name: str | None = None) -> AudioInfo:
    """Header facts of an audio file, or the typed error that says why it cannot be enhanced."""
    path = Path(path)
    name = name or str(path)
    if path.is_dir():
        raise AudioInputError(f"{name}: is a folder, not an audio file")
    if not path.exists():
        raise AudioInputError(f"{name}: no such file")
    if not path.is_file():  # a FIFO would block the reader forever
        raise AudioInputError(f"{name}: not a regular file (a pipe, socket or device); "
                              "use '-' to read a stream from stdin")
    if path.stat().st_size == 0:
        raise AudioInputError(f"{name}: is empty (0 bytes)")
    try:
        with native_stderr_silenced():
            info = sf.info(libsndfile.native_path(path))
    except libsndfile.ERRORS as error:
        reason = libsndfile.reason(error)
        if reason.startswith(_MISLEADING_REASON) and path.is_file():
            reason = "format not recognised"
        raise AudioInputError(f"{name}: not a readable audio file ({reason})") from None
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


@contextlib.contextmanager
def open_reader(path: str | os.PathLike, name: str) -> Iterator[tuple[sf.SoundFile, AudioInfo]]:
    info = read_info(path, name)
    try:
        with native_stderr_silenced():
            handle = sf.SoundFile(libsndfile.native_path(path))
    except libsndfile.ERRORS as error:
        raise decode_error(name, error) from None
    with handle:
        yield handle, info


def read_block(handle: sf.SoundFile, frames: int, name: str, position: int,
               total: int) -> np.ndarray:
    """The next `frames` frames (from frame `position` of `total`) as float32
    [frames, channels]; a file that ends early or holds samples that are not finite is an
    error."""
    try:
        with native_stderr_silenced():  # libmpg123 prints resync notes to fd 2
            block = handle.read(frames, dtype="float32", always_2d=True)
    except libsndfile.ERRORS as error:
        raise decode_error(name, error) from None
    if len(block) < frames:
        raise AudioInputError(
            f"{name}: truncated (audio ends at frame {position + len(block)} of {total})")
    check_finite(block, f"{name}:")
    return block


def readable(path: Path) -> bool:
    """Whether libsndfile can read the header of `path`."""
    try:
        with native_stderr_silenced():
            sf.info(libsndfile.native_path(path))
    except libsndfile.ERRORS:
        return False
    return True
