"""The demo's material, made here with no download: noisy synthetic speech and a checkpoint of
the official size and layout with random weights (`speechlens demo`, `make demo`)."""

from __future__ import annotations

from pathlib import Path

import soundfile as sf

from .checkpoints import FULL_CONFIG, write_checkpoint
from .speech import noisy_speech

NOISY = "noisy.wav"
ENHANCED = "enhanced.wav"
CHECKPOINT = "random-checkpoint"
REPORT = "report.html"
SAMPLE_RATE = 16000
SECONDS = 3.0
SNR_DB = 5.0
#: The official architecture, so the demo's speed is the real model's.
CONFIG = FULL_CONFIG
RANDOM_WEIGHTS = ("a generated checkpoint of the official size and layout: its RANDOM weights "
                  "exercise the whole pipeline but do NOT enhance speech")
SCORES_DROP = ("A random checkpoint makes the scores DROP: its weights damage the speech "
               "instead of cleaning it; NVIDIA's checkpoint (speechlens models pull) is what "
               "raises them")
NOISY_TEXT = (f"{SECONDS:g} s of synthetic speech plus noise at {SAMPLE_RATE} Hz, "
              f"{SNR_DB:g} dB SNR")


def write_noisy(path: str | Path) -> Path:
    """NOISY_TEXT as a 16-bit WAV at `path`; the same bytes every time."""
    sf.write(str(path), noisy_speech(SAMPLE_RATE, SECONDS, snr_db=SNR_DB, seed=0), SAMPLE_RATE,
             subtype="PCM_16", format="WAV")
    return Path(path)


def write_random_checkpoint(folder: str | Path) -> Path:
    """RANDOM_WEIGHTS into `folder` (model.safetensors and config.json); the same every time."""
    return write_checkpoint(folder, CONFIG, seed=0)
