"""The RE-USE generator (SEMamba) and the waveform-to-waveform enhancement around it."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from .. import kernels
from .config import ModelConfig
from .encoder_decoders import DenseEncoder, MagnitudeDecoder, PhaseDecoder
from .mamba import TFMambaBlock
from .scheduling import Pending
from .stft import istft, stft

#: A frame whose enhanced magnitude is zero in more than this share of bins is silenced.
SWEEP_ZERO_SHARE = 0.5


class SEMamba(nn.Module):
    def __init__(self, cfg: ModelConfig, source: str | None = None):
        """`source`: where the weights come from (a path, or a repo at a revision), for the
        reports; None for a model built without a checkpoint."""
        super().__init__()
        self.config, self.source = cfg, source
        self.dense_encoder = DenseEncoder(cfg.input_channel, cfg.hid_feature)
        self.TSMamba = [TFMambaBlock(cfg) for _ in range(cfg.num_tfmamba)]
        self.mask_decoder = MagnitudeDecoder(cfg.hid_feature, cfg.output_channel)
        self.phase_decoder = PhaseDecoder(cfg.hid_feature, cfg.output_channel)

    def __call__(
        self, magnitude: mx.array, phase: mx.array, strict: bool = False
    ) -> tuple[mx.array, mx.array]:
        """Compressed magnitude and phase [B, T, F] -> enhanced ones, same shape."""
        _, frames, bins = magnitude.shape
        x = mx.stack([magnitude, phase], axis=-1)
        x = mx.pad(x, [(0, 0), (0, 2), (0, 2), (0, 0)])  # the 2-sample "anti-error" T/F pad
        x = self.dense_encoder(x)
        pending = Pending()
        pending.add(x)
        with kernels.scratch_pool():
            for block in self.TSMamba:
                x = block(x, strict, pending)
        magnitude = self.mask_decoder(x)[:, :frames, :bins]
        phase = self.phase_decoder(x)[:, :frames, :bins]
        return magnitude, phase

    def prepare(self) -> None:
        """Derive every BiMamba's two-direction weights now (after loading a checkpoint), so
        that a process's first window does not."""
        for tf in self.TSMamba:
            tf.time_mamba.weights()
            tf.freq_mamba.weights()

    def enhance(self, audio: mx.array, sample_rate: int, strict: bool = False) -> mx.array:
        """Waveforms [B, N] at `sample_rate` -> enhanced waveforms [B, N] (lazy)."""
        params = self.config.stft_params(sample_rate)
        magnitude, phase = stft(audio, params)
        magnitude, phase = self(magnitude, phase, strict)
        return istft(suppress_sweeps(magnitude), phase, params, audio.shape[-1])


def suppress_sweeps(magnitude: mx.array) -> mx.array:
    """Zero every frame whose enhanced magnitude is mostly zero (the reference post-filter)."""
    zero_share = (magnitude <= 0).astype(mx.float32).mean(axis=-1, keepdims=True)
    return mx.where(zero_share > SWEEP_ZERO_SHARE, mx.zeros_like(magnitude), magnitude)
