"""Small building blocks shared by the encoder and decoders (NHWC: [B, T, F, C])."""

from __future__ import annotations

import os

import mlx.core as mx
import mlx.nn as nn

_SUM_BLOCK = 64


def accurate_sum(x: mx.array) -> mx.array:
    """Sum [B, n, C] over n in blocks of 64, level by level -> [B, C].

    MLX accumulates long float32 reductions with an error that grows with the element count
    (spec model.md 1.9); summing in short blocks keeps it near the float32 floor on any backend.
    """
    while x.shape[1] > _SUM_BLOCK:
        remainder = x.shape[1] % _SUM_BLOCK
        if remainder:
            x = mx.pad(x, [(0, 0), (0, _SUM_BLOCK - remainder), (0, 0)])
        x = x.reshape(x.shape[0], -1, _SUM_BLOCK, x.shape[2]).sum(axis=2)
    return x.sum(axis=1)


def _pair(value) -> tuple[int, int]:
    return (value, value) if isinstance(value, int) else tuple(value)


def conv2d_as_matmuls(x: mx.array, weight: mx.array, bias: mx.array | None, stride,
                      padding, dilation) -> mx.array:
    """A 2-D convolution (NHWC, weight [O, kh, kw, I]) as one matmul per kernel row.

    The kernel-width taps are gathered side by side, so each matmul has K = kw * I.
    """
    batch, height, width, channels = x.shape
    out_channels, kh, kw, _ = weight.shape
    (sh, sw), (ph, pw), (dh, dw) = map(_pair, (stride, padding, dilation))
    out_h = (height + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    out_w = (width + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    if ph or pw:
        x = mx.pad(x, [(0, 0), (ph, ph), (pw, pw), (0, 0)])
    taps = [x[:, :, j * dw: j * dw + sw * (out_w - 1) + 1: sw, :] for j in range(kw)]
    rows = taps[0] if kw == 1 else mx.concatenate(taps, axis=-1)  # [B, H+2ph, out_w, kw*C]
    y = None
    for i in range(kh):
        row = rows[:, i * dh: i * dh + sh * (out_h - 1) + 1: sh]
        term = row.reshape(-1, kw * channels) @ weight[:, i].reshape(out_channels, -1).T
        y = term if y is None else y + term
    y = y.reshape(batch, out_h, out_w, out_channels)
    return y if bias is None else y + bias


class Conv2d(nn.Conv2d):
    """nn.Conv2d that runs as a few large matmuls where MLX's own convolution falls short.

    On the CPU, MLX's convolution reaches ~1 GFLOP/s on the dilated 3x3 convs of the dense
    blocks (measured); one matmul per kernel row runs at BLAS speed (~20x faster). On CUDA in
    full float32 (MLX_ENABLE_TF32=0, speechlens's default), cuDNN picked algorithms whose
    workspace ran an H200 out of memory at 5-s windows (measured); the matmul form ran at the
    same speed. With TF32 on, GPUs keep mx.conv2d.
    """

    def __call__(self, x: mx.array) -> mx.array:
        if mx.default_device() != mx.cpu and _tf32_enabled():
            return super().__call__(x)
        return conv2d_as_matmuls(x, self.weight, self.get("bias"), self.stride, self.padding,
                                 self.dilation)


def _tf32_enabled() -> bool:
    return os.environ.get("MLX_ENABLE_TF32", "1").strip() not in ("0", "false", "False", "")


class InstanceNorm(nn.Module):
    """InstanceNorm2d(affine=True) over the T x F plane of each channel, accurate statistics."""

    def __init__(self, channels: int, eps: float = 1e-5):
        super().__init__()
        self.weight = mx.ones((channels,))
        self.bias = mx.zeros((channels,))
        self.eps = eps

    def __call__(self, x: mx.array) -> mx.array:
        batch, height, width, channels = x.shape
        count = height * width
        flat = x.reshape(batch, count, channels)
        mean = accurate_sum(flat)[:, None, None, :] / count
        centred = x - mean
        var = accurate_sum((centred * centred).reshape(batch, count, channels)) / count
        return centred * mx.rsqrt(var[:, None, None, :] + self.eps) * self.weight + self.bias


class PReLU(nn.Module):
    """PReLU with one slope per channel."""

    def __init__(self, channels: int):
        super().__init__()
        self.weight = mx.full((channels,), 0.25)

    def __call__(self, x: mx.array) -> mx.array:
        return mx.maximum(x, 0.0) + self.weight * mx.minimum(x, 0.0)


def conv_norm_act(
    c_in: int, c_out: int, kernel: tuple[int, int], stride=1, padding=0, dilation=1
) -> list[nn.Module]:
    """Conv2d -> InstanceNorm -> PReLU as a list, so parameters are named `.0/.1/.2` like torch."""
    return [
        Conv2d(c_in, c_out, kernel, stride=stride, padding=padding, dilation=dilation),
        InstanceNorm(c_out),
        PReLU(c_out),
    ]


def run_sequence(layers: list[nn.Module], x: mx.array) -> mx.array:
    for layer in layers:
        x = layer(x)
    return x


class DenseBlock(nn.Module):
    """Four 3x3 CNA layers with time dilation 1, 2, 4, 8; each reads all earlier outputs."""

    def __init__(self, channels: int, depth: int = 4):
        super().__init__()
        self.dense_block = [
            conv_norm_act(channels * (i + 1), channels, (3, 3), padding=(2**i, 1),
                          dilation=(2**i, 1))
            for i in range(depth)
        ]

    def __call__(self, x: mx.array) -> mx.array:
        skip = x
        for layer in self.dense_block:
            out = run_sequence(layer, skip)
            skip = mx.concatenate([out, skip], axis=-1)
        return out


class SubPixelConv(nn.Module):
    """SPConvTranspose2d: a (1,3) conv to r*C channels, then a sub-pixel shuffle along width."""

    def __init__(self, channels: int, ratio: int):
        super().__init__()
        self.conv = Conv2d(channels, channels * ratio, (1, 3), padding=(0, 1))
        self.ratio = ratio

    def __call__(self, x: mx.array) -> mx.array:
        batch, height, width, channels = x.shape
        y = self.conv(x)  # output channel k = rho * C + c lands at width index w * r + rho
        return y.reshape(batch, height, width * self.ratio, channels)
