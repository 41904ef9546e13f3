"""What the kernels accept: fixed sizes, dtypes and shapes, checked before any dispatch."""

from __future__ import annotations

import mlx.core as mx

D_STATE = 16
CONV_WIDTH = 4


class KernelInputError(ValueError):
    """A kernel got tensors that break its contract (internal error after a good model load)."""


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise KernelInputError(message)


def _check_float32(**arrays: mx.array) -> None:
    for name, a in arrays.items():
        _check(isinstance(a, mx.array), f"{name} must be an mx.array, got {type(a).__name__}")
        _check(a.dtype == mx.float32, f"{name} must be float32, got {a.dtype}")


def validate_conv(x: mx.array, weight: mx.array, bias: mx.array) -> None:
    _check_float32(x=x, weight=weight, bias=bias)
    _check(x.ndim == 3, f"x must be [B, L, D], got shape {tuple(x.shape)}")
    batch, length, channels = x.shape
    _check(batch > 0 and length > 0 and channels > 0, f"x has an empty dimension: {x.shape}")
    _check(tuple(weight.shape) == (channels, CONV_WIDTH, 1),
           f"weight must be [D={channels}, {CONV_WIDTH}, 1], got {tuple(weight.shape)}")
    _check(tuple(bias.shape) == (channels,), f"bias must be [D={channels}], got {bias.shape}")


def validate_scan(u, delta_raw, A_log, B, C, D, z) -> None:
    _check_float32(u=u, delta_raw=delta_raw, A_log=A_log, B=B, C=C, D=D, z=z)
    _check(u.ndim == 3, f"u must be [B, L, D], got shape {tuple(u.shape)}")
    batch, length, channels = u.shape
    _check(batch > 0 and length > 0 and channels > 0, f"u has an empty dimension: {u.shape}")
    for name, a in (("delta_raw", delta_raw), ("z", z)):
        _check(tuple(a.shape) == tuple(u.shape), f"{name} must be {tuple(u.shape)}, got {a.shape}")
    for name, a in (("B", B), ("C", C)):
        _check(tuple(a.shape) == (batch, length, D_STATE),
               f"{name} must be [{batch}, {length}, {D_STATE}], got {tuple(a.shape)}")
    _check(tuple(A_log.shape) == (channels, D_STATE),
           f"A_log must be [{channels}, {D_STATE}], got {tuple(A_log.shape)}")
    _check(tuple(D.shape) == (channels,), f"D must be [{channels}], got {tuple(D.shape)}")
