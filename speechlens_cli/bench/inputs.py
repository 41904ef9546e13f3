"""The benchmark's inputs: a full-size checkpoint and synthetic noisy speech.

The real checkpoint is used when it is already in the Hugging Face cache
(``checkpoint.resolve(None, download=False)``); otherwise a random checkpoint of identical
layout is written (speed does not depend on weight values). In a source checkout the project's
deterministic test fixtures (``fixtures/checkpoints.py``, ``fixtures/audio.py``) make both; an
installed wheel has no ``fixtures`` package and uses the small built-in generators below.
"""

from __future__ import annotations

import importlib
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import numpy as np

from .. import checkpoint
from ..errors import ModelNotFoundError
from ..model.config import ModelConfig
from ..model.layout import expected_shapes

FULL_CONFIG = {
    "model_cfg": {"num_tfmamba": 30, "hid_feature": 64, "d_state": 16, "d_conv": 4, "expand": 4,
                  "input_channel": 2, "output_channel": 1, "compress_factor": "relu_log1p",
                  "beta": 2.0, "mapping": True, "inner_mamba_nlayer": 1, "norm_epsilon": 1e-5},
    "stft_cfg": {"n_fft": 320, "hop_size": 40, "win_size": 320, "sampling_rate": 8000,
                 "sfi": True},
}


@dataclass(frozen=True)
class BenchCheckpoint:
    weights: Path
    config: Path | None
    description: str
    real: bool


def _checkout_module(name: str):
    """Import `fixtures.<name>` from the source checkout this package lives in, if there is one."""
    root = Path(__file__).resolve().parents[2]
    if (root / "fixtures" / f"{name}.py").is_file() and str(root) not in sys.path:
        sys.path.append(str(root))
    try:
        return importlib.import_module(f"fixtures.{name}")
    except ImportError:
        return None


def _write_random_checkpoint(directory: Path, seed: int = 0) -> str:
    """Built-in fallback: mamba_ssm-style initialisation in the official layout."""
    rng = np.random.default_rng(seed)
    tensors = {}
    for key, shape in expected_shapes(ModelConfig.from_dict(FULL_CONFIG)).items():
        leaf, parent = key.split(".")[-1], key.split(".")[-2]
        if leaf == "A_log":
            value = np.broadcast_to(np.log(np.arange(1, shape[1] + 1)), shape)
        elif leaf == "D":
            value = np.ones(shape)
        elif parent == "dt_proj" and leaf == "bias":
            dt = np.exp(rng.uniform(math.log(1e-3), math.log(1e-1), shape))
            value = dt + np.log(-np.expm1(-dt))
        elif parent in ("1", "norm"):
            value = np.ones(shape) if leaf == "weight" else np.zeros(shape)
        elif parent == "2":
            value = np.full(shape, 0.25)
        elif len(shape) >= 2:
            bound = 1.0 / math.sqrt(math.prod(shape[1:]))
            value = rng.uniform(-bound, bound, shape)
        else:
            value = rng.uniform(-0.05, 0.05, shape)
        tensors[key] = mx.array(np.ascontiguousarray(value, dtype=np.float32))
    mx.save_safetensors(str(directory / "model.safetensors"), tensors, metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(FULL_CONFIG, indent=2) + "\n")
    return "built-in generator"


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
    module = _checkout_module("checkpoints")
    if module is not None:
        module.write_checkpoint(directory, module.FULL_CONFIG, seed=0)
        how = "fixtures.checkpoints.write_checkpoint(FULL_CONFIG, seed=0)"
    else:
        how = _write_random_checkpoint(directory)
    return BenchCheckpoint(
        directory / "model.safetensors", directory / "config.json",
        f"random full-size checkpoint in the official layout ({how}); the real one is not "
        "cached here. Speed does not depend on weight values.", False)


def noisy_speech(sample_rate: int, seconds: float) -> tuple[np.ndarray, str]:
    """Mono float32 synthetic noisy speech [N] and how it was made."""
    module = _checkout_module("audio")
    if module is not None:
        return (module.noisy_speech(sample_rate, seconds, seed=0).astype(np.float32),
                ("fixtures.audio.noisy_speech(seed=0): synthetic voiced syllables + coloured "
                "noise at 5 dB SNR"))
    n = round(sample_rate * seconds)
    t = np.arange(n) / sample_rate
    rng = np.random.default_rng(0)
    f0 = 120 + 40 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(f0) / sample_rate
    voiced = sum(np.sin(k * phase) / k for k in range(1, 30))
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * 3.0 * t) ** 2
    mix = 0.3 * voiced * envelope + 0.05 * rng.standard_normal(n)
    return ((0.9 / np.abs(mix).max()) * mix).astype(np.float32), "built-in harmonic + noise"
