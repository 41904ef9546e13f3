"""A file as every score reads it: 16 kHz mono. Channels are averaged (librosa's to_mono) and
other rates resampled with soxr's high quality, as librosa.resample does by default in Microsoft's
dnsmos_local.py, its length then fixed to ceil(frames * 16000 / rate) the same way."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np

from .. import audio as audio_io
from ..audio import AudioInfo
from . import extra

RATE = 16_000
#: Frames read (and resampled) at a time: memory stays a block plus the 16-kHz result.
_BLOCK = 1 << 16


@dataclass(frozen=True)
class Speech:
    """`samples`: float32 [N] at RATE; `info`: the file as it is."""

    name: str
    samples: np.ndarray
    info: AudioInfo

    @property
    def seconds(self) -> float:
        return len(self.samples) / RATE

    @property
    def conversion(self) -> str | None:
        """What was done to reach 16 kHz mono, in words; None: nothing."""
        done = []
        if self.info.channels > 1:
            done.append(f"{self.info.channels} channels mixed to mono")
        if self.info.sample_rate != RATE:
            done.append(f"resampled from {self.info.sample_rate} Hz")
        return ", ".join(done) or None


def load(path: str | os.PathLike, name: str) -> Speech:
    """The samples of `path` at 16 kHz mono; a file that cannot be read is the same one-line
    error `enhance` gives."""
    with audio_io.open_reader(path, name) as (handle, info):
        resampler = None
        if info.sample_rate != RATE:
            resampler = extra.load("soxr").ResampleStream(info.sample_rate, RATE, 1,
                                                          dtype="float32", quality="HQ")
        pieces = []
        for position in range(0, info.frames, _BLOCK):
            count = min(_BLOCK, info.frames - position)
            block = audio_io.read_block(handle, count, name, position, info.frames)
            mono = block.mean(axis=1, dtype=np.float32) if info.channels > 1 else block[:, 0]
            if resampler is not None:
                mono = resampler.resample_chunk(mono, last=position + count == info.frames)
            pieces.append(mono)
    samples = np.concatenate(pieces)
    if resampler is not None:   # librosa.util.fix_length to ceil(frames * ratio): zeros or cut
        wanted = int(math.ceil(info.frames * (float(RATE) / info.sample_rate)))
        samples = np.pad(samples[:wanted], (0, max(0, wanted - len(samples))))
    return Speech(name, samples, info)
