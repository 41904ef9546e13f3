"""Small building blocks shared by the encoder and decoders (NHWC: [B, T, F, C])."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from .. import kernels, runtime, settings
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
    height, width = x.shape[1:3]
    kh, kw = weight.shape[1:3]
    (sh, sw), (ph, pw), (dh, dw) = map(_pair, (stride, padding, dilation))
    out_h = (height + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    out_w = (width + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    if ph or pw:
        x = mx.pad(x, [(0, 0), (ph, ph), (pw, pw), (0, 0)])
    return _row_matmuls(_taps([x], kw, dw, sw, out_w), weight, bias, out_h, sh, dh)


def conv2d_of_padded(planes: list[mx.array], weight: mx.array, bias: mx.array | None,
                     dilation) -> mx.array:
    """conv2d_as_matmuls at stride 1 of the channel concatenation of `planes`, each already
    padded in time and width: the taps are read from the planes, so neither their
    concatenation nor a padded copy of it is built."""
    kh, kw = weight.shape[1:3]
    dh, dw = _pair(dilation)
    out_h = planes[0].shape[1] - dh * (kh - 1)
    out_w = planes[0].shape[2] - dw * (kw - 1)
    return _row_matmuls(_taps(planes, kw, dw, 1, out_w), weight, bias, out_h, 1, dh)


def _taps(planes: list[mx.array], kw: int, dw: int, sw: int, out_w: int) -> mx.array:
    """[B, H, out_w, kw * sum C_p]: for each kernel column, every plane's channels (the order of
    a weight's [kw, I] axes when its input is the planes' channel concatenation)."""
    taps = [p[:, :, j * dw: j * dw + sw * (out_w - 1) + 1: sw, :]
            for j in range(kw) for p in planes]
    return taps[0] if len(taps) == 1 else mx.concatenate(taps, axis=-1)


def _row_matmuls(rows: mx.array, weight: mx.array, bias: mx.array | None, out_h: int,
                 sh: int, dh: int) -> mx.array:
    """The conv from its taps `rows` [B, H, out_w, kw * I]: one matmul per kernel row."""
    batch, _, out_w, k = rows.shape
    out_channels, kh = weight.shape[:2]
    y = None
    for i in range(kh):
        row = rows[:, i * dh: i * dh + sh * (out_h - 1) + 1: sh]
        term = row.reshape(-1, k) @ weight[:, i].reshape(out_channels, -1).T
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

    A stride-1 conv runs straight from its input planes (`direct`) where a kernel does that:
    the CPU library (3-4x faster than the matmuls, which copy the input once per kernel
    column) and on CUDA the tensor-core conv (no taps, so no time tiles either).

    `of_padded` takes time tiles of planes that already carry their neighbouring rows and
    zero columns (DenseBlock).
    """

    def direct(self, planes: list[mx.array],
               padding: tuple[int, int] | None = None) -> mx.array | None:
        """The conv of the channel concatenation of `planes` without building it, where the
        backend has such a kernel (the CPU library, CUDA in full float32); None elsewhere.
        `padding` replaces the conv's own (of_rows)."""
        return _direct(planes, self.weight, self.get("bias"), _pair(self.stride),
                       _pair(self.padding) if padding is None else padding,
                       _pair(self.dilation))

    def of_padded(self, planes: list[mx.array]) -> mx.array:
        """The stride-1 conv, without padding, of the channel concatenation of `planes`, each
        padded already."""
        if _cudnn_convs():
            return _cudnn_conv(mx.concatenate(planes, axis=-1), self.weight, self.get("bias"),
                               1, 0, self.dilation)
        return conv2d_of_padded(planes, self.weight, self.get("bias"), self.dilation)

    def of_rows(self, planes: list[mx.array]) -> mx.array:
        """The conv of the channel concatenation of `planes`, whose rows carry the conv's time
        context already (long_windows' tiles): only the width is padded."""
        return self._padded(planes, (0, _pair(self.padding)[1]))

    def __call__(self, x: mx.array) -> mx.array:
        return self._padded([x], _pair(self.padding))

    def along_height(self, x: mx.array, pad_height: int | None = None) -> mx.array:
        """This (1, k) conv run along the height of x [B, H, W, C] instead of its width: the
        same taps in the same order (a kernel [O, 1, k, I] is [O, k, 1, I] in memory), with
        the width's padding and dilation. `pad_height` replaces that padding (rows that carry
        their context already)."""
        out_channels, kh, kw, in_channels = self.weight.shape
        if kh != 1 or _pair(self.stride) != (1, 1):
            raise ValueError("along_height turns a stride-1 (1, k) conv")
        pad = _pair(self.padding)[1] if pad_height is None else pad_height
        turned = self.weight.reshape(out_channels, kw, 1, in_channels)
        return _convolve([x], turned, self.get("bias"), (1, 1), (pad, 0),
                         (_pair(self.dilation)[1], 1))

    def _padded(self, planes: list[mx.array], padding: tuple[int, int]) -> mx.array:
        return _convolve(planes, self.weight, self.get("bias"), _pair(self.stride), padding,
                         _pair(self.dilation))


def _direct(planes: list[mx.array], weight: mx.array, bias: mx.array | None,
            stride: tuple[int, int], padding: tuple[int, int],
            dilation: tuple[int, int]) -> mx.array | None:
    """The stride-1 conv straight from `planes` where the backend has such a kernel."""
    if stride != (1, 1) or _cudnn_convs():
        return None
    return kernels.conv2d(planes, weight, bias, padding, dilation)


def _convolve(planes: list[mx.array], weight: mx.array, bias: mx.array | None,
              stride: tuple[int, int], padding: tuple[int, int],
              dilation: tuple[int, int]) -> mx.array:
    """The conv of the channel concatenation of `planes` by the best path here: direct,
    cuDNN, or the matmuls."""
    y = _direct(planes, weight, bias, stride, padding, dilation)
    if y is not None:
        return y
    x = planes[0] if len(planes) == 1 else mx.concatenate(planes, axis=-1)
    if _cudnn_convs():
        return _cudnn_conv(x, weight, bias, stride, padding, dilation)
    return conv2d_as_matmuls(x, weight, bias, stride, padding, dilation)


def _cudnn_conv(x: mx.array, weight: mx.array, bias: mx.array | None, stride, padding,
                dilation) -> mx.array:
    y = mx.conv2d(x, weight, stride, padding, dilation)
    return y if bias is None else y + bias


def _cudnn_convs() -> bool:
    """Whether convs go to mx.conv2d: on a GPU with TF32 on (cuDNN's choice of algorithms)."""
    return not runtime.current().on_cpu and settings.TF32.value()


class InstanceNorm(nn.Module):
    """InstanceNorm2d(affine=True) over the T x F plane of each channel, accurate statistics."""

    def __init__(self, channels: int, eps: float = 1e-5):
        super().__init__()
        self.weight = mx.ones((channels,))
        self.bias = mx.zeros((channels,))
        self.eps = eps

    def __call__(self, tiles: list[mx.array], act: PReLU | None = None) -> list[mx.array]:
        """`tiles`: the time tiles [B, t, F, C] of one plane (normalised as one plane; a whole
        plane is one tile); `act`, the PReLU that follows, is applied in the same pass (the CPU
        library's, or one compiled kernel per tile on a GPU)."""
        out = None
        if act is not None:
            out = kernels.instance_norm_prelu(tiles, self.weight, self.bias, self.eps, act.weight)
        return out if out is not None else self._normalise(tiles, act)

    def _normalise(self, tiles: list[mx.array], act: PReLU | None = None) -> list[mx.array]:
        channels = tiles[0].shape[-1]
        squared_deviation = _elementwise()[0]

        def plane_sum(parts):
            return sum(accurate_sum(part.reshape(part.shape[0], -1, channels)) for part in parts)

        count = sum(tile.shape[1] * tile.shape[2] for tile in tiles)
        mean = plane_sum(tiles) / count
        var = plane_sum([squared_deviation(tile, mean[:, None, None, :]) for tile in tiles])
        return [self._apply(tile, mean, var / count, act) for tile in tiles]

    def normalise_with(self, tile: mx.array, stats: PlaneStats,
                       act: PReLU | None = None) -> mx.array:
        """`tile` of a plane normalised by the plane's `stats`, then `act` if given."""
        return self._apply(tile, *stats.mean_variance(), act)

    def _apply(self, tile: mx.array, mean: mx.array, var: mx.array,
               act: PReLU | None) -> mx.array:
        """(tile - mean) / sqrt(var + eps) * weight + bias, then `act`; mean, var [B, C]."""
        _, affine, affine_prelu = _elementwise()
        mean = mean[:, None, None, :]
        scale = mx.rsqrt(var[:, None, None, :] + self.eps) * self.weight
        if act is None:  # no centred copy kept
            return affine(tile, mean, scale, self.bias)
        return affine_prelu(tile, mean, scale, self.bias, act.weight)


class PlaneStats:
    """Per-channel mean and variance over the T x F plane of [B, T, F, C], gathered tile by
    tile: each tile's own mean and sum of squared deviations from it, merged pairwise (Chan,
    Golub and LeVeque's update), which keeps the accuracy of two passes over the whole plane
    without ever holding it."""

    def __init__(self):
        self.count = 0
        self.mean: mx.array | None = None  # [B, C]
        self.m2: mx.array | None = None  # [B, C]: the sum of squared deviations from mean

    def add(self, tile: mx.array) -> list[mx.array]:
        """Merge in `tile` [B, t, F, C]; returns the updated statistics (to evaluate)."""
        batch, channels = tile.shape[0], tile.shape[-1]
        count = tile.shape[1] * tile.shape[2]
        flat = tile.reshape(batch, -1, channels)
        mean = accurate_sum(flat) / count
        m2 = accurate_sum(_elementwise()[0](flat, mean[:, None, :]))
        if self.count:
            total = self.count + count
            delta = mean - self.mean
            mean = self.mean + delta * (count / total)
            m2 = self.m2 + m2 + mx.square(delta) * (self.count * count / total)
        self.count += count
        self.mean, self.m2 = mean, m2
        return [mean, m2]

    def mean_variance(self) -> tuple[mx.array, mx.array]:
        return self.mean, self.m2 / self.count


def prelu(x: mx.array, slope: mx.array) -> mx.array:
    return mx.maximum(x, 0.0) + slope * mx.minimum(x, 0.0)


def _squared_deviation(x: mx.array, mean: mx.array) -> mx.array:
    return mx.square(x - mean)


def _affine(x: mx.array, mean: mx.array, scale: mx.array, bias: mx.array) -> mx.array:
    return (x - mean) * scale + bias


def _affine_prelu(x: mx.array, mean: mx.array, scale: mx.array, bias: mx.array,
                  slope: mx.array) -> mx.array:
    return prelu(_affine(x, mean, scale, bias), slope)


_COMPILED = tuple(mx.compile(f, shapeless=True)
                  for f in (_squared_deviation, _affine, _affine_prelu))


def _elementwise() -> tuple:
    """InstanceNorm's elementwise steps: on a GPU compiled into one kernel each (5-s windows
    at 44.1 and 48 kHz on an H200: 5-14 ms faster, and no tile-sized intermediate per
    operation held by a pending graph; measured). The CPU keeps plain ops: MLX compiles there
    with the system's C++ compiler at run time, and the CPU library does this work where it is
    present."""
    if runtime.current().on_cpu:
        return _squared_deviation, _affine, _affine_prelu
    return _COMPILED


class PReLU(nn.Module):
    """PReLU with one slope per channel."""

    def __init__(self, channels: int):
        super().__init__()
        self.weight = mx.full((channels,), 0.25)

    def __call__(self, x: mx.array) -> mx.array:
        return prelu(x, self.weight)


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
    (Metal, CUDA without NVRTC), it runs in time tiles (with `dilation` rows of context on
    each side) and InstanceNorm takes its statistics over all tiles.
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
                mx.eval(planes[0])  # a GPU holds a pending graph's every buffer: a layer at a time
                continue
            planes.insert(0, self._in_time_tiles(planes, conv, norm, act, x.shape[2]))
        newest = planes[0]
        return newest if newest.shape[2] == x.shape[2] else newest[:, :, 1:-1]

    @staticmethod
    def _in_time_tiles(planes: list[mx.array], conv: Conv2d, norm: InstanceNorm, act: PReLU,
                       width: int) -> mx.array:
        """One layer in time tiles (with `dilation` rows of context on each side), InstanceNorm
        over all of them; the output is kept with a zero column on each side, so the next
        layers' tiles take their kernel-width taps straight from it (a tile then builds its
        taps and nothing else: not the channel concatenation, nor a padded copy of it)."""
        halo = conv.dilation[0] * (conv.weight.shape[1] // 2)
        pad = conv.padding[1]
        in_channels = sum(plane.shape[-1] for plane in planes)
        spans = time_tiles(planes[0].shape[1], width, in_channels, conv.weight.shape[2])

        def tile_rows(plane: mx.array, start: int, end: int) -> mx.array:
            return rows_with_halo(plane, start, end, halo, 0 if plane.shape[2] > width else pad)

        raw = list(in_turn(
            conv.of_padded([tile_rows(p, s, e) for p in planes]) for s, e in spans))
        out = list(in_turn(mx.pad(tile, [(0, 0), (0, 0), (pad, pad), (0, 0)])
                           for tile in norm(raw, act=act)))
        del raw  # evaluated: the raw tiles go before the joined plane is built
        return joined(out, axis=1)


class SubPixelConv(nn.Module):
    """SPConvTranspose2d: a (1,3) conv to r*C channels, then a sub-pixel shuffle along width
    (or, `along_height`, the same upsampling along the height)."""

    def __init__(self, channels: int, ratio: int):
        super().__init__()
        self.conv = Conv2d(channels, channels * ratio, (1, 3), padding=(0, 1))
        self.ratio = ratio

    def __call__(self, x: mx.array) -> mx.array:
        batch, height, width, channels = x.shape
        y = self.conv(x)  # output channel k = rho * C + c lands at width index w * r + rho
        return y.reshape(batch, height, width * self.ratio, channels)

    @property
    def context(self) -> int:
        """Rows of context `along_height` reads on each side of an output row."""
        return self.conv.weight.shape[2] // 2 * _pair(self.conv.dilation)[1]

    def along_height(self, x: mx.array, pad_height: int | None = None) -> mx.array:
        """The upsampling of the transposed plane, in x's own layout: x [B, H, W, C] ->
        [B, r H, W, C], equal to swap(self(swap(x))) with swap the H/W transpose. The decoders
        upsample time so ([B, T, F, C]): no transposes, and the conv's plane width stays the
        frequency bins (which the rate fixes), so CUDA builds no kernel per file length.
        `pad_height` as Conv2d.along_height's (rows with their context: H shrinks by 2)."""
        y = self.conv.along_height(x, pad_height)
        batch, height, width, _ = y.shape
        # output channel k = rho * C + c lands at height index h * r + rho
        y = y.reshape(batch, height, width, self.ratio, -1).transpose(0, 1, 3, 2, 4)
        return y.reshape(batch, height * self.ratio, width, -1)
