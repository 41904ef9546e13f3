"""What a readable input holds, whichever library reads it, and the limits every input meets."""

from __future__ import annotations

import os
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np

from ..errors import AudioInputError

#: Most channels a file may have: mono, stereo, 5.1 and 7.1 all fit. Each channel is enhanced on
#: its own, so time and window memory grow with the count; a header claiming hundreds of channels
#: is far more likely damage than a recording.
MAX_CHANNELS = 8


@dataclass(frozen=True)
class MediaTrack:
    """The speech track of a file read through PyAV, and what rebuilding the file around a new
    version of it needs: every other stream is copied from `source` as it is."""

    source: Path
    stream_index: int
    layout: str
    bit_rate: int | None
    #: When the track's first sample plays, in seconds from the start of the file (kept, so the
    #: speech stays in sync with the picture).
    start: Fraction
    #: The audio track asked for (from 0), None for the default one: a file changed after
    #: planning is read again with the same choice.
    track: int | None = None


@dataclass(frozen=True)
class FileStamp:
    """Which file a header was read from, and which version of it: a file replaced, rewritten
    or touched after planning has another stamp, and is checked again before it is read."""

    device: int
    inode: int
    size: int
    modified_ns: int

    @classmethod
    def of(cls, status: os.stat_result) -> FileStamp:
        return cls(status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns)


@dataclass(frozen=True)
class AudioInfo:
    """`format` and `subtype` are libsndfile's names (WAV, PCM_16) for what libsndfile reads, the
    container and codec (MP4, AAC) for media read through PyAV, which also sets `media`."""

    frames: int
    sample_rate: int
    channels: int
    format: str
    subtype: str
    media: MediaTrack | None = None
    stamp: FileStamp | None = None

    @property
    def seconds(self) -> float:
        return self.frames / self.sample_rate

    @property
    def shape(self) -> tuple[int, int, int]:
        """What the windows and the output are planned from: frames, rate and channels."""
        return self.frames, self.sample_rate, self.channels


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

