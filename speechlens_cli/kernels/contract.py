"""What the kernels accept: fixed sizes, dtypes and shapes, checked before any dispatch."""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

from .build import CONV_WIDTH, D_STATE


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


def validate_scan(u, delta_raw, A_log, B, C, D, z, dt_proj=None) -> None:
    """``dt_proj=(weight [D, R], bias [D])``: delta_raw is the projection's input [B, L, R]."""
    _check_float32(u=u, delta_raw=delta_raw, A_log=A_log, B=B, C=C, D=D, z=z)
    _check(u.ndim == 3, f"u must be [B, L, D], got shape {tuple(u.shape)}")
    batch, length, channels = u.shape
    _check(batch > 0 and length > 0 and channels > 0, f"u has an empty dimension: {u.shape}")
    _check(tuple(z.shape) == tuple(u.shape), f"z must be {tuple(u.shape)}, got {z.shape}")
    if dt_proj is None:
        _check(tuple(delta_raw.shape) == tuple(u.shape),
               f"delta_raw must be {tuple(u.shape)}, got {delta_raw.shape}")
    else:
        weight, bias = dt_proj
        _check_float32(dt_proj_weight=weight, dt_proj_bias=bias)
        rank = delta_raw.shape[-1] if delta_raw.ndim == 3 else -1
        _check(delta_raw.ndim == 3 and tuple(delta_raw.shape[:2]) == (batch, length) and rank > 0,
               f"the dt projection's input must be [{batch}, {length}, R], got {delta_raw.shape}")
        _check(tuple(weight.shape) == (channels, rank) and tuple(bias.shape) == (channels,),
               f"dt_proj must be weight [{channels}, {rank}] and bias [{channels}], got "
               f"{tuple(weight.shape)} and {tuple(bias.shape)}")
    for name, a in (("B", B), ("C", C)):
        _check(tuple(a.shape) == (batch, length, D_STATE),
               f"{name} must be [{batch}, {length}, {D_STATE}], got {tuple(a.shape)}")
    _check(tuple(A_log.shape) == (channels, D_STATE),
           f"A_log must be [{channels}, {D_STATE}], got {tuple(A_log.shape)}")
    _check(tuple(D.shape) == (channels,), f"D must be [{channels}], got {tuple(D.shape)}")


def _check_shapes(want: dict) -> None:
    for name, (a, shape) in want.items():
        _check(tuple(a.shape) == shape, f"{name} must be {list(shape)}, got {list(a.shape)}")


def _both_directions(name: str, a: mx.array) -> tuple[int, int, int]:
    """(B, L, D) of a [B, L, 2D] tensor holding both directions side by side."""
    _check(a.ndim == 3 and min(a.shape) > 0 and a.shape[2] % 2 == 0,
           f"{name} must be [B, L, 2D], got shape {tuple(a.shape)}")
    return a.shape[0], a.shape[1], a.shape[2] // 2


def in_time_order(a, direction: int):
    """a [B, L, ...] (an MLX array or a NumPy view) as direction `direction` of a BiMamba walks
    it: as it is for the forward direction (0), time-reversed for the backward one (1), as a
    view with a negative time stride, which the kernels read in place (no copy)."""
    return a[:, ::-1] if direction else a


def validate_bimamba_conv(x: mx.array, weight: mx.array, bias: mx.array) -> None:
    """A BiMamba's two-direction conv inputs (dispatch.bimamba_conv): x [B, L, 2D] (the forward
    direction's, then the backward one's), weight [2, D, 4, 1], bias [2, D]."""
    _check_float32(x=x, weight=weight, bias=bias)
    _, _, channels = _both_directions("x", x)
    _check_shapes({"conv weight": (weight, (2, channels, CONV_WIDTH, 1)),
                   "conv bias": (bias, (2, channels))})


def validate_bimamba_scan(u, x_dbl, z, A_log, D, dt_proj) -> None:
    """A BiMamba's two-direction scan inputs (dispatch.bimamba_scan): u [2, B, L, D], x_dbl
    [2, B, L, R + 2*16], z [B, L, 2D], A_log [2, D, 16], D [2, D], dt_proj (weight
    [2, D, R], bias [2, D]). Checked from the shapes alone: no slice is made on the way to a
    kernel that reads its parts in place."""
    weight, bias = dt_proj
    _check_float32(u=u, x_dbl=x_dbl, z=z, A_log=A_log, D=D, dt_proj_weight=weight,
                   dt_proj_bias=bias)
    batch, length, channels = _both_directions("z", z)
    rank = weight.shape[2] if weight.ndim == 3 else -1
    _check(rank > 0, f"dt_proj weight must be [2, {channels}, R], got {list(weight.shape)}")
    _check_shapes({"u": (u, (2, batch, length, channels)),
                   "x_dbl": (x_dbl, (2, batch, length, rank + 2 * D_STATE)),
                   "A_log": (A_log, (2, channels, D_STATE)), "D": (D, (2, channels)),
                   "dt_proj weight": (weight, (2, channels, rank)),
                   "dt_proj bias": (bias, (2, channels))})


@dataclass(frozen=True)
class LayerNormSpec:
    """A LayerNorm over the last axis of a projection's output (dispatch.project's `norm`):
    (x - mean) / sqrt(var + eps) * weight + bias, with weight and bias [N]."""

    weight: mx.array
    bias: mx.array
    eps: float

    def fits(self, n: int) -> bool:
        """Whether a kernel can apply it to N columns: float32 weight and bias of shape [N]."""
        return all(tuple(p.shape) == (n,) and p.dtype == mx.float32
                   for p in (self.weight, self.bias))


def projection_geometry(terms, bias) -> tuple[int, int, int] | None:
    """(N, NB, rows per batch) of dispatch.project's operands where a projection kernel can take
    them, else None: one or two float32 terms, weights [K, N] or [NB, K, N] (the same NB in
    every term, and a's leading dimension NB when NB > 1), inputs a [..., K] with K >= 1 and the
    same number of rows in every term, bias [N] float32 or None."""
    if not 1 <= len(terms) <= 2:
        return None
    n = int(terms[0][1].shape[-1])
    batches = {1 if w.ndim == 2 else int(w.shape[0]) for _, w in terms}
    if len(batches) != 1 or (bias is not None and (tuple(bias.shape) != (n,)
                                                   or bias.dtype != mx.float32)):
        return None
    nb = batches.pop()
    for a, w in terms:
        if (a.dtype != mx.float32 or w.dtype != mx.float32 or w.ndim not in (2, 3)
                or int(w.shape[-1]) != n or int(a.shape[-1]) != int(w.shape[-2])
                or int(a.shape[-1]) < 1 or (nb > 1 and (a.ndim < 2 or a.shape[0] != nb))):
            return None
    rows = {a.size // (nb * a.shape[-1]) for a, _ in terms}
    if len(rows) != 1 or (count := rows.pop()) == 0:
        return None
    return n, nb, count
