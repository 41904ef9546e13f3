"""The kernels in plain MLX ops: the conv fallback and the scan of last resort on the CPU."""

from __future__ import annotations

import mlx.core as mx


def conv1d_fallback(x: mx.array, weight: mx.array, bias: mx.array) -> mx.array:
    """``mx.conv1d(groups=D)`` with K-1 zeros of causal padding, cropped to L, plus bias."""
    channels, kernel = weight.shape[0], weight.shape[1]
    length = x.shape[1]
    y = mx.conv1d(x, weight, padding=kernel - 1, groups=channels)
    return y[:, :length, :] + bias


def _exp_poly_ops(x: mx.array) -> mx.array:
    y = x * mx.array(1.4426950408889634, mx.float32)
    y = mx.maximum(y, -127.0)
    k = mx.round(y)
    f = y - k
    p = mx.array(0.00015465313, mx.float32)
    for c in (0.0013395279, 0.0096180400, 0.055503407, 0.24022651, 0.6931472, 1.0):
        p = p * f + c
    scale = mx.view(mx.left_shift(k.astype(mx.int32) + 127, 23), mx.float32)
    return p * scale


def selective_scan_ops(u, delta_raw, A_log, B, C, D, z, strict: bool = False,
                       eval_every: int = 32) -> mx.array:
    """The scan in MLX ops, one step at a time, evaluated every ``eval_every`` steps so the
    lazy graph stays bounded. Slow; used only when no CPU kernel library can be had."""
    if strict:
        delta = mx.maximum(delta_raw, 0.0) + mx.log1p(mx.exp(-mx.abs(delta_raw)))
    else:
        delta = mx.log(1.0 + mx.exp(delta_raw))
    A = -mx.exp(A_log)
    batch, length, channels = u.shape
    h = mx.zeros((batch, channels, A.shape[1]), dtype=mx.float32)
    ys = []
    for t in range(length):
        dt = delta[:, t, :, None]
        arg = dt * A
        decay = _exp_poly_ops(arg) if strict else mx.exp(arg)
        if strict:
            h = decay * h + (dt * B[:, t, None, :]) * u[:, t, :, None]
        else:
            h = decay * h + (dt * u[:, t, :, None]) * B[:, t, None, :]
        ys.append((h * C[:, t, None, :]).sum(-1))
        if (t + 1) % eval_every == 0:
            mx.eval(h, ys)
    y = mx.stack(ys, axis=1) + D * u
    gate = z / (1.0 + mx.exp(-z)) if strict else z * (1.0 / (1.0 + mx.exp(-z)))
    return y * gate


def two_direction_delta_raw(x_dbl: mx.array, dt_proj: tuple[mx.array, mx.array]) -> mx.array:
    """Both directions' dt projection as one batched matmul, for a scan that does not apply it
    itself: x_dbl [2, B, L, R + 2N] (dt's rank-R input first), weight [2, D, R], bias [2, D]
    -> delta_raw [2, B, L, D]."""
    weight, bias = dt_proj
    two, batch, length, _ = x_dbl.shape
    rank = weight.shape[2]
    rows = x_dbl[..., :rank].reshape(two, batch * length, rank)
    delta = mx.matmul(rows, mx.swapaxes(weight, 1, 2)) + bias[:, None, :]
    return delta.reshape(two, batch, length, weight.shape[1])

