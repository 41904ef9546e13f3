"""The two Mamba hot spots: causal depthwise conv1d (k=4) and the fixed-16 selective scan.

Plain MLX-op versions for now; the fused Metal/CUDA/CPU kernels replace them behind the same
signatures.
"""

from __future__ import annotations

import mlx.core as mx


def causal_conv1d(x: mx.array, weight: mx.array, bias: mx.array) -> mx.array:
    """x [B, L, D], weight [D, K, 1] (MLX layout), bias [D] -> [B, L, D], zero causal padding."""
    channels, kernel = weight.shape[0], weight.shape[1]
    length = x.shape[1]
    y = mx.conv1d(x, weight, padding=kernel - 1, groups=channels)
    return y[:, :length, :] + bias


def selective_scan(
    u: mx.array,
    delta_raw: mx.array,
    A_log: mx.array,
    B: mx.array,
    C: mx.array,
    D: mx.array,
    z: mx.array,
    strict: bool = False,
) -> mx.array:
    """y_t = C_t . h_t + D*u_t with h_t = exp(dt*A) h_{t-1} + dt*B_t*u_t, then y * SiLU(z)."""
    delta = mx.logaddexp(delta_raw, mx.array(0.0, dtype=delta_raw.dtype))  # softplus
    A = -mx.exp(A_log)  # [D, N]
    batch, length, channels = u.shape
    h = mx.zeros((batch, channels, A.shape[1]), dtype=u.dtype)
    ys = []
    for t in range(length):
        dt = delta[:, t, :, None]
        h = mx.exp(dt * A) * h + (dt * u[:, t, :, None]) * B[:, t, None, :]
        ys.append((h * C[:, t, None, :]).sum(-1))
    y = mx.stack(ys, axis=1) + D * u
    return y * (z * mx.sigmoid(z))
