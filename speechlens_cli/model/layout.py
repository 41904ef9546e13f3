"""The official checkpoint layout (PyTorch names and shapes), read off the MLX model itself.

The model's parameter names are the checkpoint's; only convolution weights differ, in axis
order. That difference is stated once here, both ways: checkpoint loading converts with it and
the expected layout is derived with it, so the layout can never disagree with the modules.
"""

from __future__ import annotations

import functools

import numpy as np
from mlx.utils import tree_flatten

from .config import ModelConfig
from .semamba import SEMamba

#: By number of dimensions: the axes of a PyTorch weight in MLX's order. Conv2d [O, I, kh, kw]
#: -> [O, kh, kw, I]; Conv1d [C, 1, K] -> [C, K, 1].
TORCH_TO_MLX_AXES = {4: (0, 2, 3, 1), 3: (0, 2, 1)}


def to_mlx_layout(value: np.ndarray) -> np.ndarray:
    """A PyTorch-layout weight in MLX's layout."""
    axes = TORCH_TO_MLX_AXES.get(value.ndim)
    return value if axes is None else value.transpose(axes)


def _torch_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    axes = TORCH_TO_MLX_AXES.get(len(shape))
    if axes is None:
        return shape
    torch = [0] * len(shape)
    for mlx_axis, torch_axis in enumerate(axes):
        torch[torch_axis] = shape[mlx_axis]
    return tuple(torch)


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of the official checkpoint, in PyTorch layout, in the model's order."""
    return dict(_expected_shapes(cfg))


def shapes_of(model: SEMamba) -> dict[str, tuple[int, ...]]:
    """expected_shapes read off a model already built (loading builds one anyway)."""
    return {name: _torch_shape(tuple(value.shape))
            for name, value in tree_flatten(model.parameters())}


@functools.lru_cache(maxsize=4)
def _expected_shapes(cfg: ModelConfig) -> tuple[tuple[str, tuple[int, ...]], ...]:
    # Building a model to read its shapes takes tens of milliseconds; `models verify` and a
    # dry run need the shapes alone, and may need them more than once.
    return tuple(shapes_of(SEMamba(cfg)).items())
