"""Mamba (mamba_ssm `Mamba`, reference math), the bidirectional wrapper and the TF block."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from .. import kernels
from .config import ModelConfig
from .scheduling import in_turn, joined, tiles

#: A BiMamba takes its sequences in groups whose in_proj output is about this size, so a
#: pending TF block on a GPU holds two groups, not every intermediate of the window (30 s at
#: 48 kHz: 1.5 GB per in_proj output, ~13 GB per block). Large enough that 5-s windows run as
#: one group: smaller groups starve the scan kernel of threads on a GPU.
GROUP_BYTES = 2**30


class Mamba(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d, di, n, r = cfg.hid_feature, cfg.d_inner, cfg.d_state, cfg.dt_rank
        self.d_inner, self.d_state, self.dt_rank = di, n, r
        self.in_proj = nn.Linear(d, 2 * di, bias=False)
        self.conv1d = nn.Conv1d(di, di, cfg.d_conv, groups=di, bias=True)
        self.x_proj = nn.Linear(di, r + 2 * n, bias=False)
        self.dt_proj = nn.Linear(r, di, bias=True)
        self.A_log = mx.zeros((di, n))
        self.D = mx.ones((di,))
        self.out_proj = nn.Linear(di, d, bias=False)

    def __call__(self, u: mx.array, strict: bool) -> mx.array:
        xz = self.in_proj(u)  # x, then the gate z
        x = kernels.mamba_conv(xz, self.conv1d.weight, self.conv1d.bias)
        x_dbl = self.x_proj(x)  # dt's rank-R input, B, C
        y = kernels.mamba_scan(x, x_dbl, xz, self.A_log, self.D,
                               (self.dt_proj.weight, self.dt_proj.bias), strict=strict)
        return self.out_proj(y)


class BiMamba(nn.Module):
    """Forward and backward (flipped-sequence) Mamba, concatenated, merged by Linear + LayerNorm."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d = cfg.hid_feature
        self.forward_blocks = Mamba(cfg)
        self.backward_blocks = Mamba(cfg)
        self.output_proj = nn.Linear(2 * d, d)
        self.norm = nn.LayerNorm(d, eps=cfg.norm_epsilon)

    def __call__(self, x: mx.array, strict: bool) -> mx.array:
        forward = self.forward_blocks(x, strict) + x
        reversed_x = mx.flip(x, axis=1)
        backward = mx.flip(self.backward_blocks(reversed_x, strict) + reversed_x, axis=1)
        return self.norm(self.output_proj(mx.concatenate([forward, backward], axis=-1)))


class TFMambaBlock(nn.Module):
    """Bidirectional Mamba along time for every frequency, then along frequency for every frame."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.time_mamba = BiMamba(cfg)
        self.freq_mamba = BiMamba(cfg)

    def __call__(self, x: mx.array, strict: bool) -> mx.array:
        batch, frames, bins, channels = x.shape
        along_time = x.transpose(0, 2, 1, 3).reshape(batch * bins, frames, channels)
        along_time = self._residual_in_groups(self.time_mamba, along_time, strict)
        x = along_time.reshape(batch, bins, frames, channels).transpose(0, 2, 1, 3)
        along_freq = x.reshape(batch * frames, bins, channels)
        along_freq = self._residual_in_groups(self.freq_mamba, along_freq, strict)
        return along_freq.reshape(batch, frames, bins, channels)

    @staticmethod
    def _residual_in_groups(mamba: BiMamba, seqs: mx.array, strict: bool) -> mx.array:
        """mamba(seqs) + seqs, over groups of sequences (independent of each other)."""
        inner = mamba.forward_blocks.in_proj.weight.shape[0]
        groups = tiles(seqs.shape[0], 4 * seqs.shape[1] * inner, GROUP_BYTES)
        return joined(list(in_turn(mamba(seqs[s:e], strict) + seqs[s:e] for s, e in groups)),
                      axis=0)
