"""What a page lets one hear and see: the start of the input and of the output, at most
EXCERPT_SECONDS of each, mixed to mono, and the part removed (input minus output). Only that
much is read, so a page stays a few MB, and its making a few MB of memory, however long the
file; the scores still cover the whole file."""

from __future__ import annotations

import base64
import io
import os
from dataclasses import dataclass

import numpy as np
import soundfile as sf

from .. import audio as audio_io
from ..scoring import extra

EXCERPT_SECONDS = 30.0
#: The rates MP3 holds; the players' audio is MP3, which every browser plays (WAV would make a
#: page of 30 s at 48 kHz stereo 23 MB).
MP3_RATES = (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)


@dataclass(frozen=True)
class Excerpt:
    """float32 mono [N] of the input and of the output at the input's `rate`."""

    rate: int
    input: np.ndarray
    output: np.ndarray
    #: The whole input's length and channels, to say what the excerpt leaves out.
    seconds: float
    channels: int

    @property
    def removed(self) -> np.ndarray:
        return self.input - self.output

    @property
    def excerpt_seconds(self) -> float:
        return len(self.input) / self.rate

    @property
    def is_cut(self) -> bool:
        return self.excerpt_seconds < self.seconds - 0.5 / self.rate


def read_excerpt(source: str | os.PathLike, destination: str | os.PathLike, name: str,
                 output_name: str) -> Excerpt:
    """The excerpt of a file and its output, cut to the shorter (a codec's padding); an output
    at another rate (Opus decodes at 48 kHz) is resampled to the input's."""
    before, rate, info = _start(source, name)
    after, output_rate, _ = _start(destination, output_name)
    if output_rate != rate:
        after = extra.load("soxr").resample(after, output_rate, rate).astype(np.float32)
    length = min(len(before), len(after))
    return Excerpt(rate, before[:length], after[:length], info.seconds, info.channels)


def _start(path: str | os.PathLike, name: str) -> tuple[np.ndarray, int, audio_io.AudioInfo]:
    with audio_io.open_reader(path, name) as (handle, info):
        frames = min(info.frames, round(EXCERPT_SECONDS * info.sample_rate))
        block = audio_io.read_block(handle, frames, name, 0, info.frames)
    return block.mean(axis=1, dtype=np.float32), info.sample_rate, info


def mp3_uri(samples: np.ndarray, rate: int) -> str:
    """`samples` as an MP3 data: URI for an <audio> element (resampled to a rate MP3 holds,
    clipped to full scale: the removed part of a loud file can pass it)."""
    target = min((allowed for allowed in MP3_RATES if allowed >= rate), default=MP3_RATES[-1])
    if target != rate:
        samples = extra.load("soxr").resample(samples, rate, target)
    encoded = io.BytesIO()
    with sf.SoundFile(encoded, "w", target, 1, format="MP3", subtype="MPEG_LAYER_III",
                      compression_level=0.5, bitrate_mode="CONSTANT") as handle:
        handle.write(np.clip(samples, -1.0, 1.0))
    return "data:audio/mpeg;base64," + base64.b64encode(encoded.getvalue()).decode("ascii")
