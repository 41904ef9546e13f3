"""Loading a validated checkpoint: its tensors read, converted to MLX's layout, into the model
the layout was checked against."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import mlx.core as mx
import numpy as np

from ..errors import IncompatibleModelError
from ..model.layout import to_mlx_layout
from ..model.semamba import SEMamba
from .locate import names_the_variable, resolve
from .validate import TensorEntry, canonical_name, unreadable, validate


def sanitize(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """PyTorch layout -> MLX layout (the axis orders of model/layout.py), canonical names."""
    converted = {}
    for name, value in weights.items():
        converted[canonical_name(name)] = np.ascontiguousarray(to_mlx_layout(value))
    return converted


def _read_tensors(path: Path, entries: dict[str, TensorEntry], data_start: int):
    """Read with read(), not mapped: a failing disk is then an OSError (one line), where a
    mapped page that cannot be read kills the process (SIGBUS)."""
    data = np.empty(max((e.end for e in entries.values()), default=0), np.uint8)
    with open(path, "rb") as handle:
        handle.seek(data_start)
        if handle.readinto(memoryview(data)) != len(data):
            raise OSError(errno.EIO, "the file ended early")
    return {
        name: np.frombuffer(data[e.start:e.end], dtype="<f4").reshape(e.shape)
        for name, e in entries.items()
    }


@names_the_variable
def load_model(spec: str | os.PathLike | None = None, *, download: bool = True) -> SEMamba:
    """Resolve, validate, convert and load a checkpoint into an evaluated SEMamba. Validation
    is `inspect`'s, without an unpinned file's sha256, which only reports need."""
    files = resolve(spec, download=download)
    try:
        checked = validate(files, build=True)
        weights = sanitize(_read_tensors(files.weights, checked.entries, checked.data_start))
    except OSError as error:
        raise unreadable(files.weights, error) from None
    for name, value in weights.items():
        if not np.isfinite(value).all():
            raise IncompatibleModelError(f"{files.source}: tensor {name} has NaN or Inf values")
    model = checked.model
    # not strict: check_layout matched the names and shapes to this very model's parameters
    model.load_weights([(k, mx.array(v)) for k, v in weights.items()], strict=False)
    model.eval()
    mx.eval(model.parameters())
    model.prepare()
    return model
