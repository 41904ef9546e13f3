"""Synthetic RE-USE checkpoints in exactly the official layout, generated deterministically.

Nothing here downloads NVIDIA's weights. A checkpoint is a folder holding `model.safetensors`
(PyTorch-layout float32 tensors, metadata {"format": "pt"}) and `config.json`, just like the
Hugging Face repo, filled with random weights whose initialisation follows mamba_ssm's so that
activations stay in a sane range through all 30 TF-Mamba blocks. `speechlens bench` times one
when the real checkpoint is not cached (speed does not depend on weight values); the tests and
the demo use them too.

The key names and shapes come from `speechlens_cli.model.layout.expected_shapes`.

Each tensor is drawn from its own generator, seeded by (seed, hash of the key name), so a
tensor's values depend only on the seed, its name and its shape, never on dict order.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
from pathlib import Path

import mlx.core as mx
import numpy as np

from ..model.config import ModelConfig
from ..model.layout import expected_shapes

#: The official full-size configuration (ModelConfig's defaults) as its config.json has it, with
#: the keys speechlens does not read.
FULL_CONFIG: dict = ModelConfig().to_dict()
FULL_CONFIG["model_cfg"].update(beta=2.0, mapping=True, inner_mamba_nlayer=1)

TINY_CONFIG: dict = copy.deepcopy(FULL_CONFIG)
TINY_CONFIG["model_cfg"]["num_tfmamba"] = 2
TINY_CONFIG["model_cfg"]["hid_feature"] = 16

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
PHASE_INPUT_KEY = "dense_encoder.dense_conv_1.0.weight"

# Initialisation constants.
DT_MIN, DT_MAX, DT_FLOOR = 1e-3, 1e-1, 1e-4   # mamba_ssm defaults (dt_init_floor 1e-4)
BIAS_RANGE = 0.05          # conv / linear biases: uniform +-BIAS_RANGE
NORM_JITTER = 0.1          # InstanceNorm / LayerNorm: weight 1 +- j, bias 0 +- j
PRELU_INIT, PRELU_JITTER = 0.25, 0.05


def _rng(seed: int, key: str) -> np.random.Generator:
    digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest()
    return np.random.default_rng([seed, int.from_bytes(digest, "little")])


def _uniform(rng: np.random.Generator, shape: tuple[int, ...], low: float, high: float):
    return rng.uniform(low, high, size=shape).astype(np.float32)


def _init_tensor(key: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """One tensor, chosen by what the key names (raises on a key it does not recognise)."""
    parts = key.split(".")
    leaf, parent = parts[-1], parts[-2]
    if leaf == "A_log":
        # S4D-real: A[d, n] = -(n + 1)
        d_inner, d_state = shape
        row = np.log(np.arange(1, d_state + 1, dtype=np.float64))
        return np.broadcast_to(row, (d_inner, d_state)).astype(np.float32)
    if leaf == "D":
        return np.ones(shape, np.float32)
    if parent == "dt_proj" and leaf == "bias":
        dt = np.exp(rng.uniform(math.log(DT_MIN), math.log(DT_MAX), size=shape))
        dt = np.maximum(dt, DT_FLOOR)
        return (dt + np.log(-np.expm1(-dt))).astype(np.float32)   # inverse softplus
    if parent == "dt_proj" and leaf == "weight":
        bound = shape[1] ** -0.5
        return _uniform(rng, shape, -bound, bound)
    if parent in ("1", "norm"):          # InstanceNorm2d (CNA / up_conv stage .1) or LayerNorm
        if leaf == "weight":
            return _uniform(rng, shape, 1.0 - NORM_JITTER, 1.0 + NORM_JITTER)
        if leaf == "bias":
            return _uniform(rng, shape, -NORM_JITTER, NORM_JITTER)
    if parent == "2" and leaf == "weight":   # PReLU, one slope per channel
        return _uniform(rng, shape, PRELU_INIT - PRELU_JITTER, PRELU_INIT + PRELU_JITTER)
    if leaf == "weight" and len(shape) >= 2:  # Linear, Conv1d, Conv2d: fan_in = prod(shape[1:])
        bound = 1.0 / math.sqrt(math.prod(shape[1:]))
        return _uniform(rng, shape, -bound, bound)
    if leaf == "bias" and len(shape) == 1:
        return _uniform(rng, shape, -BIAS_RANGE, BIAS_RANGE)
    raise ValueError(f"no initialiser for key {key!r} {shape}")


def model_config(config: dict) -> ModelConfig:
    """The ModelConfig a config.json dict describes (validated)."""
    return ModelConfig.from_dict(config)


def make_weights(config: dict, seed: int = 0, phase_gain: float = 1.0) -> dict[str, np.ndarray]:
    """Deterministic random float32 weights in PyTorch layout, keyed like the official checkpoint.

    `phase_gain` multiplies input channel 1 (the phase) of `dense_encoder.dense_conv_1.0.weight`.
    """
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    cfg = model_config(config)
    weights: dict[str, np.ndarray] = {}
    for key, shape in expected_shapes(cfg).items():
        tensor = np.ascontiguousarray(_init_tensor(key, shape, _rng(seed, key)))
        assert tensor.shape == shape and tensor.dtype == np.float32, key
        weights[key] = tensor
    if phase_gain != 1.0:
        weights[PHASE_INPUT_KEY][:, 1] *= np.float32(phase_gain)
    return weights


def config_json_text(config: dict) -> str:
    return json.dumps(config, indent=2) + "\n"


def write_checkpoint(
    directory: str | Path,
    config: dict = TINY_CONFIG,
    seed: int = 0,
    phase_gain: float = 1.0,
) -> Path:
    """Write model.safetensors + config.json into `directory` (created if needed); return it.

    The output is byte-identical for the same arguments.
    """
    directory = Path(directory)
    weights = make_weights(config, seed=seed, phase_gain=phase_gain)
    directory.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(
        str(directory / WEIGHTS_FILE),
        {key: mx.array(value) for key, value in weights.items()},
        metadata={"format": "pt"},
    )
    (directory / CONFIG_FILE).write_text(config_json_text(config), encoding="utf-8")
    return directory
