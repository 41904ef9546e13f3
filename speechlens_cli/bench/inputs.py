"""The benchmark's inputs: a full-size checkpoint and synthetic noisy speech.

The real checkpoint is used when it is already in the Hugging Face cache
(``checkpoint.resolve(None, download=False)``); otherwise a random checkpoint of identical
layout is written (speed does not depend on weight values). Both come from
``speechlens_cli.synthetic``, the generators the tests use as well.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import checkpoint
from ..errors import ModelNotFoundError
from ..synthetic.checkpoints import FULL_CONFIG, write_checkpoint
from ..synthetic.speech import noisy_speech


@dataclass(frozen=True)
class BenchCheckpoint:
    weights: Path
    config: Path | None
    description: str
    real: bool

    @property
    def spec(self) -> str:
        """What load_model and `speechlens enhance --model` take: the folder when it has a
        config.json, else the weights file."""
        return str(self.weights.parent) if self.config else str(self.weights)


def bench_checkpoint(spec: str | None, workdir: Path) -> BenchCheckpoint:
    """The checkpoint to benchmark: `spec` if given, else the cached real one, else random."""
    if spec:
        files = checkpoint.resolve(spec, download=False)
        return BenchCheckpoint(files.weights, files.config, f"{files.source} (given)", True)
    try:
        files = checkpoint.resolve(None, download=False)
        return BenchCheckpoint(files.weights, files.config,
                               f"{files.source} (real weights, from the local cache)", True)
    except ModelNotFoundError:
        pass
    directory = workdir / "random-full-checkpoint"
    directory.mkdir(parents=True, exist_ok=True)
    write_checkpoint(directory, FULL_CONFIG, seed=0)
    how = "speechlens_cli.synthetic.checkpoints.write_checkpoint(FULL_CONFIG, seed=0)"
    return BenchCheckpoint(
        directory / "model.safetensors", directory / "config.json",
        f"random full-size checkpoint in the official layout ({how}); the real one is not "
        "cached here. Speed does not depend on weight values.", False)


def bench_speech(sample_rate: int, seconds: float) -> tuple[np.ndarray, str]:
    """Mono float32 synthetic noisy speech [N] and how it was made."""
    return (noisy_speech(sample_rate, seconds, seed=0).astype(np.float32),
            ("speechlens_cli.synthetic.speech.noisy_speech(seed=0): synthetic voiced syllables "
             "+ coloured noise at 5 dB SNR"))
