"""Dense encoder and the magnitude / phase decoders (NHWC: [B, T, F, C])."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from .layers import (
    Conv2d,
    DenseBlock,
    InstanceNorm,
    PReLU,
    SubPixelConv,
    conv_norm_act,
    run_sequence,
)
from .long_windows import TiledEncoder, decode_last_stage, is_long


class DenseEncoder(nn.Module):
    """[B, T, F, 2] -> [B, T', F', C] with T' = (T - 1)//4 + 1 and F' = (F - 3)//2 + 1."""

    def __init__(self, in_channels: int, channels: int):
        super().__init__()
        self.dense_conv_1 = conv_norm_act(in_channels, channels, (1, 1))
        self.dense_block = DenseBlock(channels)
        self.dense_conv_2 = conv_norm_act(channels, channels, (1, 3), stride=(4, 2))

    def __call__(self, x: mx.array) -> mx.array:
        if is_long(x.shape, self.dense_conv_1[0].weight.shape[0]):
            return TiledEncoder(self)(x)  # nothing full-resolution held (long_windows.py)
        x = run_sequence(self.dense_conv_1, x)
        x = self.dense_block(x)
        return run_sequence(self.dense_conv_2, x)


class _Decoder(nn.Module):
    """Dense block, then upsample frequency x2 and time x4 with sub-pixel convs."""

    def __init__(self, channels: int):
        super().__init__()
        self.dense_block = DenseBlock(channels)
        self.up_conv1 = [SubPixelConv(channels, 2), InstanceNorm(channels), PReLU(channels)]
        self.up_conv2 = [SubPixelConv(channels, 4), InstanceNorm(channels), PReLU(channels)]

    def __call__(self, x: mx.array) -> mx.array:
        """head(upsampled x): the last upsampling and the head in frequency tiles where the
        full-resolution plane is large (long_windows.py)."""
        x = run_sequence(self.up_conv1, self.dense_block(x))
        sub_pixel, norm, act = self.up_conv2
        batch, frames, bins, channels = x.shape
        if is_long((batch, frames * sub_pixel.ratio, bins), channels):
            return decode_last_stage(sub_pixel, norm, act, self.head, x)
        return self.head(norm([sub_pixel.along_height(x)], act=act)[0])

    def head(self, x: mx.array) -> mx.array:
        """The full-resolution plane [B, T, F, C] -> the decoder's output [B, T, F]
        (each decoder's own)."""
        raise NotImplementedError


class MagnitudeDecoder(_Decoder):
    """Predicts the enhanced compressed magnitude directly (mapping, not a mask)."""

    def __init__(self, channels: int, out_channels: int = 1):
        super().__init__(channels)
        self.final_conv = Conv2d(channels, out_channels, (1, 1))

    def head(self, x: mx.array) -> mx.array:
        return self.final_conv(x)[..., 0]


class PhaseDecoder(_Decoder):
    """Predicts phase as atan2 of two 1x1-conv heads."""

    def __init__(self, channels: int, out_channels: int = 1):
        super().__init__(channels)
        self.phase_conv_r = Conv2d(channels, out_channels, (1, 1))
        self.phase_conv_i = Conv2d(channels, out_channels, (1, 1))

    def head(self, x: mx.array) -> mx.array:
        return mx.arctan2(self.phase_conv_i(x), self.phase_conv_r(x))[..., 0]
