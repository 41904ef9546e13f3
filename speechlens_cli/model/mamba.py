"""Mamba (mamba_ssm `Mamba`, reference math), the bidirectional wrapper and the TF block."""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from .. import kernels
from .config import ModelConfig
from .scheduling import Pending, in_turn, joined, tiles

#: A BiMamba takes its sequences in groups whose in_proj output (both directions) is about
#: this size, so a pending TF block on a GPU holds two groups, not every intermediate of the
#: window (30 s at 48 kHz: 3 GB per in_proj output, ~13 GB per block). Large enough that 5-s
#: windows run as one group (494 MB at 48 kHz): smaller groups starve the scan kernel of
#: threads on a GPU. 30-s windows take groups of this size, not 1 GiB as before, since their
#: encoder and decoders no longer hold full-resolution planes (long_windows.py).
GROUP_BYTES = 2**29


class Mamba(nn.Module):
    """One direction's parameters (mamba_ssm `Mamba`, the checkpoint's layout); BiMamba runs
    both directions at once from them (BiMambaWeights)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d, di, n, r = cfg.hid_feature, cfg.d_inner, cfg.d_state, cfg.dt_rank
        self.in_proj = nn.Linear(d, 2 * di, bias=False)
        self.conv1d = nn.Conv1d(di, di, cfg.d_conv, groups=di, bias=True)
        self.x_proj = nn.Linear(di, r + 2 * n, bias=False)
        self.dt_proj = nn.Linear(r, di, bias=True)
        self.A_log = mx.zeros((di, n))
        self.D = mx.ones((di,))
        self.out_proj = nn.Linear(di, d, bias=False)


@dataclass(frozen=True)
class BiMambaWeights:
    """A BiMamba's weights laid out for running both directions at once (one matmul per
    projection, one kernel launch per hot spot), derived from the checkpoint's per-direction
    layout by BiMamba.weights. Index 0 is the forward direction, 1 the backward one."""

    #: Where the parameters these were derived from sit: (module, key, the value then), every
    #: array and submodule of the three modules (BiMamba._slots).
    sources: tuple[tuple[nn.Module, str, object], ...]
    in_x: mx.array  # [d, 2D]: in_proj's conv-input half, the forward direction's, then backward's
    in_z: mx.array  # [d, 2D]: in_proj's gate half, likewise
    conv_weight: mx.array  # [2, D, 4, 1]
    conv_bias: mx.array  # [2, D]
    x_proj: mx.array  # [2, D, R + 2N]
    A_log: mx.array  # [2, D, N]
    D: mx.array  # [2, D]
    dt_weight: mx.array  # [2, D, R]
    dt_bias: mx.array  # [2, D]
    merge_y: mx.array  # [2D, d]: each direction's out_proj, then its half of output_proj
    merge_x: mx.array  # [d, d]: the residual input's share of output_proj (both halves)
    merge_bias: mx.array  # [d]


def _host(a: mx.array | np.ndarray) -> np.ndarray:
    """`a` as a NumPy array over its own memory (no copy)."""
    return np.asarray(a)


def project_in(x: mx.array, weights: BiMambaWeights) -> tuple[mx.array, mx.array]:
    """Both directions' in_proj, conv and SiLU, and their gates: [B, L, d] -> u [2, B, L, D]
    and z [B, L, 2D]. A projection acts on each step alone, so the backward direction's in_proj
    of the reversed sequence is this one's columns read from the end. The conv-input half is
    projected apart from the gates, so it goes straight into the conv (on CUDA, inside one
    kernel) and is never held beside them."""
    u = kernels.project_conv(x, weights.in_x, weights.conv_weight, weights.conv_bias)
    return u, kernels.project([(x, weights.in_z)])


def project_x(u: mx.array, weights: BiMambaWeights) -> mx.array:
    """Both directions' x_proj: [2, B, L, D] -> [2, B, L, R + 2N], one batched matmul."""
    two, batch, length, channels = u.shape
    rows = kernels.project([(u.reshape(two, batch * length, channels), weights.x_proj)])
    return rows.reshape(two, batch, length, -1)


def merge(y: mx.array, x: mx.array, weights: BiMambaWeights, norm: nn.LayerNorm,
          residual: bool) -> mx.array:
    """norm(output_proj(concat[out_proj(y_f) + x, out_proj(y_b) + x])) with the out_projs folded
    into output_proj: y [B, L, 2D] (bimamba_scan's), x [B, L, d] -> [B, L, d] in one projection
    of two terms, the LayerNorm applied by the projection (on the CPU, in the same pass), and
    with `residual` x added to the result (by the projection's store on CUDA)."""
    return kernels.project([(x, weights.merge_x), (y, weights.merge_y)], weights.merge_bias,
                           kernels.LayerNormSpec(norm.weight, norm.bias, norm.eps),
                           residual=x if residual else None)


class BiMamba(nn.Module):
    """Forward and backward (time-reversed) Mamba, each plus its input, concatenated and merged
    by Linear + LayerNorm. Both directions run together: in_proj as two projections (conv inputs,
    gates), one conv launch (on CUDA inside the first projection) and one scan launch (the
    backward direction reads the sequence from its end; nothing is flipped), one batched x_proj
    and one merge whose matmuls include the out_projs and whose projection applies the
    LayerNorm."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d = cfg.hid_feature
        self.forward_blocks = Mamba(cfg)
        self.backward_blocks = Mamba(cfg)
        self.output_proj = nn.Linear(2 * d, d)
        self.norm = nn.LayerNorm(d, eps=cfg.norm_epsilon)

    def __call__(self, x: mx.array, strict: bool, residual: bool = False) -> mx.array:
        """BiMamba(x), or x + BiMamba(x) with `residual` (the TF block's form)."""
        w = self.weights()
        # on the CPU the intermediates' buffers are reused by the next BiMamba (kernels.scratch)
        with kernels.lend_scratch() as scratch:
            u, gates = project_in(x, w)
            y = kernels.bimamba_scan(u, project_x(u, w), gates, w.A_log, w.D,
                                     (w.dt_weight, w.dt_bias), strict=strict)
            return scratch.result(lambda: merge(y, x, w, self.norm, residual))

    def _slots(self) -> tuple[tuple[nn.Module, str, object], ...]:
        """(module, key, value) of every array and submodule of this BiMamba, at any depth:
        where the parameters BiMambaWeights is derived from sit."""
        found, modules = [], [self]
        while modules:
            module = modules.pop()
            for key, value in module.items():
                found.append((module, key, value))
                if isinstance(value, nn.Module):
                    modules.append(value)
        return tuple(found)

    def weights(self) -> BiMambaWeights:
        """The two-direction layout of the current parameters, derived once and again only
        after a parameter or a module holding them is replaced (a new checkpoint loaded into
        the same model). The check reads each slot where a parameter sits, not the parameter
        tree (mlx's parameters(), a few milliseconds a window for RE-USE's 60 BiMambas)."""
        cached = getattr(self, "_weights", None)
        if cached is not None and all(module.get(key) is value
                                      for module, key, value in cached.sources):
            return cached
        sources = self._slots()
        f, b = self.forward_blocks, self.backward_blocks
        d, inner = self.output_proj.weight.shape[0], f.D.shape[0]
        # Derived in NumPy from the parameters' memory, each result handed to MLX as one array,
        # not as ~10 small MLX operations per BiMamba (RE-USE has 60) for the device to run at
        # load time. Only copies and float64 sums: the values are bit for bit the same.
        halves = _host(self.output_proj.weight).astype(np.float64).T  # [2d, d]: rows [0, d)
        # take forward + x. einsum rather than @: NumPy's matmul goes to its own multi-threaded
        # OpenBLAS, whose worker then spins for a while and takes a core from the kernels
        merge_y = np.concatenate([np.einsum("ji,jk->ik",
                                            _host(m.out_proj.weight).astype(np.float64),
                                            halves[k * d:(k + 1) * d])
                                  for k, m in enumerate((f, b))], axis=0)

        def stacked(get) -> mx.array:  # both directions' arrays as one new [2, ...] array
            return mx.array(np.stack([_host(get(m)) for m in (f, b)]))

        def columns(rows: slice) -> mx.array:  # both directions' in_proj rows, as [d, 2D]
            return mx.array(np.concatenate([_host(m.in_proj.weight)[rows] for m in (f, b)]).T)

        weights = BiMambaWeights(
            sources=sources,
            in_x=columns(slice(None, inner)), in_z=columns(slice(inner, None)),
            conv_weight=stacked(lambda m: m.conv1d.weight),
            conv_bias=stacked(lambda m: m.conv1d.bias),
            x_proj=stacked(lambda m: _host(m.x_proj.weight).T),
            A_log=stacked(lambda m: m.A_log), D=stacked(lambda m: m.D),
            dt_weight=stacked(lambda m: m.dt_proj.weight),
            dt_bias=stacked(lambda m: m.dt_proj.bias),
            merge_y=mx.array(merge_y.astype(np.float32)),
            merge_x=mx.array((halves[:d] + halves[d:]).astype(np.float32)),
            merge_bias=self.output_proj.bias)
        self._weights = weights
        return weights


class TFMambaBlock(nn.Module):
    """Bidirectional Mamba along time for every frequency, then along frequency for every frame."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.time_mamba = BiMamba(cfg)
        self.freq_mamba = BiMamba(cfg)

    def __call__(self, x: mx.array, strict: bool, pending: Pending | None = None) -> mx.array:
        """`pending`: the chain the caller bounds its device work with (the TF stack's), which
        each group of sequences joins; a chain of its own if None."""
        pending = Pending() if pending is None else pending
        batch, frames, bins, channels = x.shape
        along_time = x.transpose(0, 2, 1, 3).reshape(batch * bins, frames, channels)
        along_time = self._residual_in_groups(self.time_mamba, along_time, strict, pending)
        x = along_time.reshape(batch, bins, frames, channels).transpose(0, 2, 1, 3)
        along_freq = x.reshape(batch * frames, bins, channels)
        along_freq = self._residual_in_groups(self.freq_mamba, along_freq, strict, pending)
        return along_freq.reshape(batch, frames, bins, channels)

    @staticmethod
    def _residual_in_groups(mamba: BiMamba, seqs: mx.array, strict: bool,
                            pending: Pending) -> mx.array:
        """mamba(seqs) + seqs, over groups of sequences (independent of each other)."""
        inner = mamba.forward_blocks.in_proj.weight.shape[0]  # one direction's x and z
        groups = tiles(seqs.shape[0], 4 * seqs.shape[1] * 2 * inner, GROUP_BYTES)
        return joined(list(in_turn((mamba(seqs[s:e], strict, residual=True)
                                    for s, e in groups), pending)), axis=0)
