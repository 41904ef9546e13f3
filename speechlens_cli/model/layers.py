"""Small building blocks shared by the encoder and decoders (NHWC: [B, T, F, C])."""

from __future__ import annotations

import os

import mlx.core as mx
import mlx.nn as nn

from .. import kernels
from .scheduling import in_turn, joined, rows_with_halo, time_tiles

_SUM_BLOCK = 64


def accurate_sum(x: mx.array) -> mx.array:
    """Sum [B, n, C] over n in blocks of 64, level by level -> [B, C].

    MLX accumulates long float32 reductions with an error that grows with the element count;
    summing in short blocks keeps it near the float32 floor on any backend.
    The rows beyond the last whole block are summed on their own (no padded copy of x).
    """
    while x.shape[1] > _SUM_BLOCK:
        whole = x.shape[1] - x.shape[1] % _SUM_BLOCK
        blocks = x[:, :whole].reshape(x.shape[0], -1, _SUM_BLOCK, x.shape[2]).sum(axis=2)
        if whole < x.shape[1]:
            blocks = mx.concatenate([blocks, x[:, whole:].sum(axis=1, keepdims=True)], axis=1)
        x = blocks
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

    On the CPU a stride-1 conv runs in the CPU library, read straight from its input
    (`direct`): 3-4x faster than the matmuls, which copy the input once per kernel column.

    `pad_time=False` leaves out the time padding: the caller passes a time tile that already
    carries its neighbouring rows (DenseBlock).
    """

    def direct(self, planes: list[mx.array]) -> mx.array | None:
        """The conv of the channel concatenation of `planes` without building it, where the
        backend has such a kernel (the CPU library); None elsewhere."""
        return self._direct(planes)

    def _direct(self, planes: list[mx.array]) -> mx.array | None:
        if _pair(self.stride) != (1, 1):
            return None
        return kernels.conv2d(planes, self.weight, self.get("bias"), _pair(self.padding),
                              _pair(self.dilation))

    def __call__(self, x: mx.array, pad_time: bool = True) -> mx.array:
        if pad_time:
            y = self._direct([x])
            if y is not None:
                return y
        padding = self.padding if pad_time else (0, self.padding[1])
        if mx.default_device() != mx.cpu and _tf32_enabled():
            y = mx.conv2d(x, self.weight, self.stride, padding, self.dilation)
            return y + self.bias if "bias" in self else y
        return conv2d_as_matmuls(x, self.weight, self.get("bias"), self.stride, padding,
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

    def __call__(self, tiles: list[mx.array], act: PReLU | None = None) -> list[mx.array]:
        """`tiles`: the time tiles [B, t, F, C] of one plane (normalised as one plane; a whole
        plane is one tile); `act`, the PReLU that follows, is applied too (fused into one pass
        on the CPU)."""
        out = None
        if act is not None:
            out = kernels.instance_norm_prelu(tiles, self.weight, self.bias, self.eps, act.weight)
        if out is None:
            out = self._normalise(tiles)
            out = out if act is None else [act(tile) for tile in out]
        return out

    def _normalise(self, tiles: list[mx.array]) -> list[mx.array]:
        channels = tiles[0].shape[-1]

        def plane_sum(parts):
            return sum(accurate_sum(part.reshape(part.shape[0], -1, channels)) for part in parts)

        count = sum(tile.shape[1] * tile.shape[2] for tile in tiles)
        mean = (plane_sum(tiles) / count)[:, None, None, :]
        var = plane_sum([(tile - mean) * (tile - mean) for tile in tiles]) / count
        scale = mx.rsqrt(var[:, None, None, :] + self.eps) * self.weight
        return [(tile - mean) * scale + self.bias for tile in tiles]  # no centred copy kept


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
    """Apply `layers` in turn; an InstanceNorm followed by a PReLU runs as one fused step."""
    i = 0
    while i < len(layers):
        layer, following = layers[i], layers[i + 1] if i + 1 < len(layers) else None
        if isinstance(layer, InstanceNorm):
            act = following if isinstance(following, PReLU) else None
            x, i = layer([x], act=act)[0], i + (2 if act is not None else 1)
        else:
            x, i = layer(x), i + 1
    return x


class DenseBlock(nn.Module):
    """Four 3x3 CNA layers with time dilation 1, 2, 4, 8; each reads all earlier outputs.

    Each layer reads the earlier outputs as separate planes, so memory grows by one plane per
    layer instead of by the concatenation and its taps. Where the conv has no direct kernel
    (GPUs), it runs in time tiles (with `dilation` rows of context on each side) and
    InstanceNorm takes its statistics over all tiles.
    """

    def __init__(self, channels: int, depth: int = 4):
        super().__init__()
        self.dense_block = [
            conv_norm_act(channels * (i + 1), channels, (3, 3), padding=(2**i, 1),
                          dilation=(2**i, 1))
            for i in range(depth)
        ]

    def __call__(self, x: mx.array) -> mx.array:
        planes = [x]  # the conv input order: newest output first, x last
        for conv, norm, act in self.dense_block:
            whole = conv.direct(planes)  # no concatenation or taps to bound: one tile
            if whole is not None:
                planes.insert(0, norm([whole], act=act)[0])
                continue
            halo = conv.dilation[0] * (conv.weight.shape[1] // 2)
            in_channels = sum(plane.shape[-1] for plane in planes)
            width = x.shape[2]
            spans = time_tiles(x.shape[1], 4 * width * in_channels * (1 + conv.weight.shape[2]))
            z = list(in_turn(
                conv(mx.concatenate([rows_with_halo(p, s, e, halo) for p in planes], axis=-1),
                     pad_time=False)
                for s, e in spans))
            planes.insert(0, joined(list(in_turn(norm(z, act=act))), axis=1))
        return planes[0]


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
