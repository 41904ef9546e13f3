"""The benchmark peer: RE-USE (SEMamba) in plain PyTorch, as a PyTorch user without mamba_ssm's
CUDA kernels would run it.

Written from the official model's architecture and mamba_ssm's reference Mamba math rather than
from speechlens's MLX code, channel-first (NCHW) like the original torch model, loading the same
official-layout ``model.safetensors`` + ``config.json`` that speechlens loads. The selective
scan is a plain per-step loop over time, vectorised over batch, channels and state, with
bounded memory (the state is updated in place of materialising ``exp(dt*A)`` for every step).
Everything runs in float32 on one torch device (CPU here, CUDA on an NVIDIA GPU).

Needs ``torch`` (``pip install 'speechlens[bench]'``); users of speechlens never do: only
``speechlens bench`` and ``tests/test_torch_peer.py`` import this module.

Frame-0 phase: a frame that is exactly mirror-symmetric about its centre
(frame 0 under reflect padding, the last frame when ``N mod hop == 1``) has a real spectrum, and
so do the DC and Nyquist bins; the imaginary part there is rounding noise whose sign decides
+pi or -pi. Like speechlens and the float64 reference, the peer snaps those bins to a real
spectrum (+0 imaginary part, signed zeros made +0), so both read the same phase input.
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..model.config import ModelConfig

TAIL_FILL = 1e-8
SWEEP_ZERO_SHARE = 0.5
_PREFIXES = ("model.", "SEMamba.")


# ------------------------------------------------------------------------------------ weights

def read_safetensors(path: str | Path) -> dict[str, np.ndarray]:
    """A minimal safetensors reader (float32 tensors only): name -> array (copied)."""
    data = Path(path).read_bytes()
    header_len = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + header_len])
    start = 8 + header_len
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] != "F32":
            raise ValueError(f"{path}: tensor {name} is {info['dtype']}, the peer reads F32 only")
        lo, hi = info["data_offsets"]
        out[name] = np.frombuffer(data[start + lo:start + hi], dtype="<f4").reshape(
            info["shape"]).copy()
    return out


def read_config(path: str | Path | None) -> dict:
    """config.json's model_cfg + stft_cfg merged, with the official defaults (ModelConfig's)."""
    defaults = ModelConfig().to_dict()
    cfg = defaults["model_cfg"] | defaults["stft_cfg"]
    if path is not None and Path(path).is_file():
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
        cfg.update(raw.get("model_cfg", {}))
        cfg.update(raw.get("stft_cfg", {}))
    return cfg


def stft_sizes(cfg: dict, sample_rate: int) -> tuple[int, int, int]:
    """(n_fft, hop, win) at `sample_rate`: base * sr // base_sr, odd values rounded up."""
    if not cfg.get("sfi", True):
        return cfg["n_fft"], cfg["hop_size"], cfg["win_size"]

    def scale(base: int) -> int:
        value = base * sample_rate // cfg["sampling_rate"]
        return value + 1 if value % 2 else value

    return scale(cfg["n_fft"]), scale(cfg["hop_size"]), scale(cfg["win_size"])


# ------------------------------------------------------------------------------------ layers

def _cna(c_in: int, c_out: int, kernel, stride=1, padding=0, dilation=1) -> nn.Sequential:
    """Conv2d -> InstanceNorm2d(affine) -> PReLU(per channel), named .0/.1/.2 like the original."""
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, kernel, stride=stride, padding=padding, dilation=dilation),
        nn.InstanceNorm2d(c_out, affine=True, eps=1e-5),
        nn.PReLU(c_out),
    )


class DenseBlock(nn.Module):
    """Four 3x3 CNA layers, time dilation 1, 2, 4, 8; layer i reads cat(newest .. oldest, x).
    Keys `<prefix>.dense_block.dense_block.{i}.*` as in the official checkpoint."""

    def __init__(self, ch: int, depth: int = 4):
        super().__init__()
        self.dense_block = nn.ModuleList(
            _cna(ch * (i + 1), ch, (3, 3), padding=(2**i, 1), dilation=(2**i, 1))
            for i in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skip = x
        for layer in self.dense_block:
            out = layer(skip)
            skip = torch.cat([out, skip], dim=1)
        return out


class SPConvTranspose2d(nn.Module):
    """Zero-pad W by 1, (1,3) conv to C*r channels, sub-pixel shuffle along W."""

    def __init__(self, ch: int, r: int):
        super().__init__()
        self.r = r
        self.conv = nn.Conv2d(ch, ch * r, (1, 3))

    def forward(self, x):
        y = self.conv(F.pad(x, (1, 1, 0, 0)))
        b, cr, h, w = y.shape
        c = cr // self.r
        return y.view(b, self.r, c, h, w).permute(0, 2, 3, 4, 1).reshape(b, c, h, w * self.r)


class DenseEncoder(nn.Module):
    def __init__(self, c_in: int, ch: int):
        super().__init__()
        self.dense_conv_1 = _cna(c_in, ch, (1, 1))
        self.dense_block = DenseBlock(ch)
        self.dense_conv_2 = _cna(ch, ch, (1, 3), stride=(4, 2))

    def forward(self, x):
        return self.dense_conv_2(self.dense_block(self.dense_conv_1(x)))


class _Decoder(nn.Module):
    def __init__(self, ch: int):
        super().__init__()
        self.dense_block = DenseBlock(ch)
        self.up_conv1 = nn.Sequential(SPConvTranspose2d(ch, 2), nn.InstanceNorm2d(ch, affine=True),
                                      nn.PReLU(ch))
        self.up_conv2 = nn.Sequential(SPConvTranspose2d(ch, 4), nn.InstanceNorm2d(ch, affine=True),
                                      nn.PReLU(ch))

    def trunk(self, x):
        x = self.up_conv1(self.dense_block(x))                       # F x2
        return self.up_conv2(x.transpose(2, 3)).transpose(2, 3)     # T x4


class MaskDecoder(_Decoder):
    def __init__(self, ch: int, out: int = 1):
        super().__init__(ch)
        self.final_conv = nn.Conv2d(ch, out, (1, 1))

    def forward(self, x):
        return self.final_conv(self.trunk(x))


class PhaseDecoder(_Decoder):
    def __init__(self, ch: int, out: int = 1):
        super().__init__(ch)
        self.phase_conv_r = nn.Conv2d(ch, out, (1, 1))
        self.phase_conv_i = nn.Conv2d(ch, out, (1, 1))

    def forward(self, x):
        x = self.trunk(x)
        return torch.atan2(self.phase_conv_i(x), self.phase_conv_r(x))


def selective_scan_loop(u, delta, A, B, C, D):
    """Per-step scan. u, delta [N, L, Di]; A [Di, S]; B, C [N, L, S]; D [Di] -> y [N, L, Di].

    h_t = exp(delta_t * A) * h_{t-1} + (delta_t * u_t) * B_t ;  y_t = h_t . C_t + D * u_t
    """
    n, length, di = u.shape
    h = u.new_zeros(n, di, A.shape[1])
    du = delta * u
    ys = []
    for t in range(length):
        decay = torch.exp(delta[:, t, :, None] * A)
        h = decay * h + du[:, t, :, None] * B[:, t, None, :]
        ys.append(torch.bmm(h, C[:, t, :, None])[..., 0])
    return torch.stack(ys, dim=1) + u * D


class Mamba(nn.Module):
    """mamba_ssm `Mamba` (reference path): in_proj, causal depthwise conv + SiLU, x_proj,
    dt_proj + softplus, selective scan, SiLU(z) gate, out_proj."""

    def __init__(self, d: int, d_state: int, d_conv: int, expand: int):
        super().__init__()
        di = expand * d
        self.di, self.d_state, self.dt_rank = di, d_state, math.ceil(d / 16)
        self.in_proj = nn.Linear(d, 2 * di, bias=False)
        self.conv1d = nn.Conv1d(di, di, d_conv, groups=di, padding=d_conv - 1, bias=True)
        self.x_proj = nn.Linear(di, self.dt_rank + 2 * d_state, bias=False)
        self.dt_proj = nn.Linear(self.dt_rank, di, bias=True)
        self.A_log = nn.Parameter(torch.zeros(di, d_state))
        self.D = nn.Parameter(torch.ones(di))
        self.out_proj = nn.Linear(di, d, bias=False)

    def forward(self, u):
        length = u.shape[1]
        x, z = self.in_proj(u).split(self.di, dim=-1)
        x = F.silu(self.conv1d(x.transpose(1, 2))[..., :length].transpose(1, 2))
        dt, B, C = self.x_proj(x).split([self.dt_rank, self.d_state, self.d_state], dim=-1)
        delta = F.softplus(self.dt_proj(dt))
        y = selective_scan_loop(x, delta, -torch.exp(self.A_log), B.contiguous(), C.contiguous(),
                                self.D)
        return self.out_proj(y * F.silu(z))


class BiMamba(nn.Module):
    """`mamba` builds each direction's module from (d, d_state, d_conv, expand): this file's
    plain Mamba by default, mamba_ssm's for the NVIDIA peer (nvidia_peer.py)."""

    def __init__(self, cfg: dict, mamba=None):
        super().__init__()
        d = cfg["hid_feature"]
        args = (d, cfg["d_state"], cfg["d_conv"], cfg["expand"])
        make = Mamba if mamba is None else mamba
        self.forward_blocks = make(*args)
        self.backward_blocks = make(*args)
        self.output_proj = nn.Linear(2 * d, d)
        self.norm = nn.LayerNorm(d, eps=cfg["norm_epsilon"])

    def forward(self, x):
        fw = self.forward_blocks(x) + x
        xr = torch.flip(x, dims=[1])
        bw = torch.flip(self.backward_blocks(xr) + xr, dims=[1])
        return self.norm(self.output_proj(torch.cat([fw, bw], dim=-1)))


class TFMambaBlock(nn.Module):
    def __init__(self, cfg: dict, mamba=None):
        super().__init__()
        self.time_mamba = BiMamba(cfg, mamba)
        self.freq_mamba = BiMamba(cfg, mamba)

    def forward(self, x):                                    # [B, C, T, F]
        b, c, t, f = x.shape
        seq = x.permute(0, 3, 2, 1).reshape(b * f, t, c)     # along time, per bin
        seq = self.time_mamba(seq) + seq
        seq = seq.view(b, f, t, c).transpose(1, 2).reshape(b * t, f, c)  # along freq, per frame
        seq = self.freq_mamba(seq) + seq
        return seq.view(b, t, f, c).permute(0, 3, 1, 2)


class SEMambaPeer(nn.Module):
    """The generator: [B, F, T] compressed magnitude and phase in, enhanced ones out."""

    def __init__(self, cfg: dict, mamba=None):
        super().__init__()
        self.cfg = cfg
        ch = cfg["hid_feature"]
        self.dense_encoder = DenseEncoder(cfg["input_channel"], ch)
        self.TSMamba = nn.ModuleList(TFMambaBlock(cfg, mamba) for _ in range(cfg["num_tfmamba"]))
        self.mask_decoder = MaskDecoder(ch, cfg["output_channel"])
        self.phase_decoder = PhaseDecoder(ch, cfg["output_channel"])

    def forward(self, mag, pha):
        f, t = mag.shape[1:]
        x = torch.stack([mag.transpose(1, 2), pha.transpose(1, 2)], dim=1)   # [B, 2, T, F]
        x = F.pad(x, (0, 2, 0, 2))                                          # anti-error pad
        x = self.dense_encoder(x)
        for block in self.TSMamba:
            x = block(x)
        mag = self.mask_decoder(x)[:, 0, :t, :f].transpose(1, 2)
        pha = self.phase_decoder(x)[:, 0, :t, :f].transpose(1, 2)
        return mag, pha

    # -------------------------------------------------------------------------- waveform side

    def stft(self, audio: torch.Tensor, sample_rate: int):
        """[B, N] -> (log1p |X|, angle X), each [B, F, T]; exactly-real bins snapped (see top)."""
        n_fft, hop, win = stft_sizes(self.cfg, sample_rate)
        window = torch.hann_window(win, periodic=True, device=audio.device)
        spec = torch.stft(audio, n_fft, hop, win, window=window, center=True, pad_mode="reflect",
                          normalized=False, onesided=True, return_complex=True)
        real_mask = torch.as_tensor(_real_bins(audio.shape[-1], n_fft, hop),
                                    device=audio.device)
        real = spec.real + 0.0
        imag = torch.where(real_mask, torch.zeros_like(spec.imag), spec.imag) + 0.0
        return torch.log1p(torch.sqrt(real * real + imag * imag)), torch.atan2(imag, real)

    def istft(self, mag, pha, sample_rate: int, num_samples: int):
        n_fft, hop, win = stft_sizes(self.cfg, sample_rate)
        amp = torch.expm1(torch.relu(mag))
        spec = torch.complex(amp * torch.cos(pha), amp * torch.sin(pha))
        window = torch.hann_window(win, periodic=True, device=mag.device)
        y = torch.istft(spec, n_fft, hop, win, window=window, center=True)
        if y.shape[-1] >= num_samples:
            return y[..., :num_samples]
        return F.pad(y, (0, num_samples - y.shape[-1]), value=TAIL_FILL)

    @torch.inference_mode()
    def enhance(self, audio: torch.Tensor, sample_rate: int) -> torch.Tensor:
        """[B, N] float32 -> [B, N]: STFT, generator, sweep filter, iSTFT, pad/trim to N."""
        mag, pha = self.stft(audio, sample_rate)
        mag, pha = self(mag, pha)
        zero_share = (mag <= 0).float().mean(dim=1, keepdim=True)        # per frame
        mag = torch.where(zero_share > SWEEP_ZERO_SHARE, torch.zeros_like(mag), mag)
        return self.istft(mag, pha, sample_rate, audio.shape[-1])


@lru_cache(maxsize=32)
def _real_bins(num_samples: int, n_fft: int, hop: int) -> np.ndarray:
    """[F, T] bool: bins whose exact spectrum is real (mirror-symmetric frames, DC, Nyquist)."""
    half = n_fft // 2
    j = np.arange(-half, num_samples + half)
    j = np.where(j < 0, np.minimum(-j, num_samples - 1), j)
    j = np.where(j >= num_samples, np.maximum(2 * (num_samples - 1) - j, 0), j)
    frames = 1 + num_samples // hop
    index = j[np.arange(frames)[:, None] * hop + np.arange(n_fft)[None, :]]
    k = np.arange(1, half)
    even = (index[:, half + k] == index[:, half - k]).all(axis=1)           # [T]
    bins = np.zeros(n_fft // 2 + 1, bool)
    bins[[0, -1]] = True
    return bins[:, None] | even[None, :]


def load_peer(weights: str | Path, config: str | Path | None = None,
              device: str | torch.device = "cpu", mamba=None) -> SEMambaPeer:
    """Build the peer from an official-layout checkpoint (a folder or its model.safetensors);
    `mamba` as in BiMamba."""
    weights = Path(weights)
    if weights.is_dir():
        weights = weights / "model.safetensors"
    if config is None:
        config = weights.with_name("config.json")
    cfg = read_config(config)
    model = SEMambaPeer(cfg, mamba)
    state = {}
    for name, value in read_safetensors(weights).items():
        for prefix in _PREFIXES:
            name = name.removeprefix(prefix)
        state[name] = torch.from_numpy(value)
    model.load_state_dict(state, strict=True)
    return model.to(device).eval()


def device_name(device: str | torch.device) -> str:
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu, {torch.get_num_threads()} threads"


def synchronize(device: str | torch.device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
