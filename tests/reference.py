"""Independent float64 NumPy reference of the RE-USE (SEMamba) forward pass.

Ground truth for the MLX implementation in the tests. Written from the official model's
architecture (STFT rule, generator, encoder/decoders, TF-Mamba blocks), mamba_ssm's reference
Mamba math and the kernels' standard and strict modes (docs/kernels.md); it deliberately does not
import anything from ``speechlens_cli`` so that it stays independent of the code it checks.
Only NumPy and the standard library are used.

Conventions
-----------
* Weights: ``dict[str, np.ndarray]`` with the official PyTorch names and layouts
  (``dense_encoder.dense_conv_1.0.weight [C,2,1,1]``, ``...conv1d.weight [D,1,K]`` ...).
* Config: the ``config.json`` dict ``{"model_cfg": {...}, "stft_cfg": {...}}``, every size
  read from it (no defaults here: the tests pass the synthetic checkpoints' configs).
* Feature maps are kept channel-first for one channel of audio: ``[C, T, F]``
  (torch's ``[B, C, T, F]`` with B = 1).
* Everything is computed in float64 except :func:`reference_exp_poly`, which emulates the
  strict-mode float32 kernel exponential bit for bit.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "random_weights",
    "reference_bimamba",
    "reference_causal_conv1d",
    "reference_enhance",
    "reference_exp_poly",
    "reference_forward",
    "reference_istft",
    "reference_mamba",
    "reference_selective_scan",
    "reference_stft",
    "stft_params",
    "sweep_filter",
    "weight_shapes",
]

_EPS_NORM = 1e-5


# --------------------------------------------------------------------------------------------
# config helpers
# --------------------------------------------------------------------------------------------

def _stft_cfg(cfg: dict) -> dict:
    if isinstance(cfg, dict) and isinstance(cfg.get("stft_cfg"), dict):
        return cfg["stft_cfg"]
    return cfg or {}


def _model_cfg(cfg: dict) -> dict:
    if isinstance(cfg, dict) and isinstance(cfg.get("model_cfg"), dict):
        return cfg["model_cfg"]
    return cfg or {}


def _sizes(cfg: dict) -> dict:
    m = _model_cfg(cfg)
    hid = int(m["hid_feature"])
    expand = int(m["expand"])
    return {
        "num_tfmamba": int(m["num_tfmamba"]),
        "hid": hid,
        "d_state": int(m["d_state"]),
        "d_conv": int(m["d_conv"]),
        "expand": expand,
        "d_inner": expand * hid,
        "dt_rank": math.ceil(hid / 16),
        "input_channel": int(m["input_channel"]),
        "norm_epsilon": float(m.get("norm_epsilon", _EPS_NORM)),
    }


def _make_even(v: int) -> int:
    return v + 1 if v % 2 else v


def stft_params(sample_rate: int, cfg: dict) -> tuple[int, int, int]:
    """(n_fft, hop, win) at ``sample_rate``: ``make_even(base * sr // base_sr)``.

    ``cfg`` may be the whole config.json dict or just its ``stft_cfg``. With ``sfi`` false the
    base values are used unscaled.
    """
    s = _stft_cfg(cfg)
    n_fft, hop, win = int(s["n_fft"]), int(s["hop_size"]), int(s["win_size"])
    base_sr = int(s["sampling_rate"])
    if not s["sfi"]:
        return n_fft, hop, win
    sr = int(sample_rate)
    return (_make_even(n_fft * sr // base_sr), _make_even(hop * sr // base_sr),
            _make_even(win * sr // base_sr))


# --------------------------------------------------------------------------------------------
# STFT / iSTFT
# --------------------------------------------------------------------------------------------

def _window(n_fft: int, win: int) -> np.ndarray:
    """Periodic Hann of length ``win`` zero-padded (centred) to ``n_fft``, as torch.stft does."""
    n = np.arange(win, dtype=np.float64)
    w = 0.5 - 0.5 * np.cos(2.0 * np.pi * n / win)
    if win == n_fft:
        return w
    if win > n_fft:
        raise ValueError(f"win ({win}) > n_fft ({n_fft})")
    left = (n_fft - win) // 2
    out = np.zeros(n_fft, dtype=np.float64)
    out[left:left + win] = w
    return out


def _clamped_reflect_pad(x: np.ndarray, pad: int) -> np.ndarray:
    """Reflect padding (edge not repeated) with indices clamped into range for short input."""
    n = x.shape[0]
    j = np.arange(-pad, n + pad)
    idx = j.copy()
    lo = j < 0
    hi = j >= n
    idx[lo] = np.minimum(-j[lo], n - 1)
    idx[hi] = np.maximum(2 * (n - 1) - j[hi], 0)
    return x[idx]


def _stft_complex(x: np.ndarray, n_fft: int, hop: int, win: int) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 1 or x.shape[0] < 1:
        raise ValueError("x must be a non-empty 1-D signal")
    n = x.shape[0]
    xp = _clamped_reflect_pad(x, n_fft // 2)
    t = 1 + n // hop
    idx = np.arange(t)[:, None] * hop + np.arange(n_fft)[None, :]
    raw = xp[idx]
    frames = raw * _window(n_fft, win)[None, :]
    spec = np.fft.rfft(frames, n=n_fft, axis=-1).T  # [F, T]
    # A frame that is exactly symmetric about its centre sample has a real spectrum; its
    # computed imaginary part is rounding noise whose sign would decide +-pi.
    half = n_fft // 2
    k = np.arange(1, half)
    symmetric = np.all(raw[:, half + k] == raw[:, half - k], axis=1)
    spec[:, symmetric] = spec[:, symmetric].real + 0.0j
    # torch gives an exact +0 imaginary part at DC and (even n_fft) Nyquist; make it explicit so
    # a negative real part there has phase +pi, deterministically.
    spec[0] = spec[0].real + 0.0j
    if n_fft % 2 == 0:
        spec[-1] = spec[-1].real + 0.0j
    return spec


def reference_stft(x: np.ndarray, sample_rate: int, cfg: dict) -> tuple[np.ndarray, np.ndarray]:
    """``(log1p(|X|), angle(X))``, each ``[F, T]`` with ``T = 1 + N // hop``."""
    n_fft, hop, win = stft_params(sample_rate, cfg)
    spec = _stft_complex(x, n_fft, hop, win)
    mag = np.log1p(np.abs(spec))
    pha = np.arctan2(spec.imag, spec.real)
    return mag, pha


def reference_istft(mag: np.ndarray, pha: np.ndarray, sample_rate: int, cfg: dict) -> np.ndarray:
    """Inverse of the compressed spectrum: ``torch.istft(center=True, length=None)`` semantics.

    mag is the compressed magnitude (``expm1(max(m, 0))`` is applied here); returns
    ``hop * (T - 1)`` samples.
    """
    n_fft, hop, win = stft_params(sample_rate, cfg)
    mag = np.asarray(mag, dtype=np.float64)
    pha = np.asarray(pha, dtype=np.float64)
    f, t = mag.shape
    if f != n_fft // 2 + 1:
        raise ValueError(f"expected {n_fft // 2 + 1} bins, got {f}")
    amp = np.expm1(np.maximum(mag, 0.0))
    spec = amp * np.cos(pha) + 1j * (amp * np.sin(pha))
    # an inverse real FFT ignores the imaginary part of the DC and Nyquist bins
    spec[0] = spec[0].real + 0.0j
    if n_fft % 2 == 0:
        spec[-1] = spec[-1].real + 0.0j
    frames = np.fft.irfft(spec.T, n=n_fft, axis=-1)  # [T, n_fft]
    w = _window(n_fft, win)
    frames = frames * w[None, :]
    total = n_fft + hop * (t - 1)
    y = np.zeros(total, dtype=np.float64)
    env = np.zeros(total, dtype=np.float64)
    w2 = w * w
    for i in range(t):
        y[i * hop:i * hop + n_fft] += frames[i]
        env[i * hop:i * hop + n_fft] += w2
    start, end = n_fft // 2, total - n_fft // 2
    y = y[start:end]
    env = env[start:end]
    if env.size and env.min() < 1e-11:
        raise ValueError("window envelope vanishes (NOLA violated)")
    return y / env


def sweep_filter(mag: np.ndarray) -> np.ndarray:
    """Zero every frame of the compressed magnitude [F, T] where > half the bins are <= 0."""
    mag = np.array(mag, dtype=np.float64, copy=True)
    frac = np.mean(mag <= 0.0, axis=0)
    mag[:, frac > 0.5] = 0.0
    return mag


# --------------------------------------------------------------------------------------------
# elementary layers (channel-first, one item: x [C, H, W])
# --------------------------------------------------------------------------------------------

def _sigmoid(x: np.ndarray) -> np.ndarray:
    # 1/(1+exp(-x)) is accurate to a few ulp everywhere in float64; exp overflow -> inf -> 0.
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


def _silu(x: np.ndarray) -> np.ndarray:
    return x * _sigmoid(x)


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0.0) + np.log1p(np.exp(-np.abs(x)))


def _conv2d(x, w, b=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1)):
    """torch Conv2d for one item: x [Cin, H, W], w [Cout, Cin, kh, kw] -> [Cout, Ho, Wo]."""
    cin = x.shape[0]
    cout, cin_w, kh, kw = w.shape
    if cin != cin_w:
        raise ValueError(f"conv expects {cin_w} input channels, got {cin}")
    sh, sw = stride
    ph, pw = padding
    dh, dw = dilation
    xp = np.pad(x, ((0, 0), (ph, ph), (pw, pw))) if (ph or pw) else x
    hp, wp = xp.shape[1:]
    ho = (hp - dh * (kh - 1) - 1) // sh + 1
    wo = (wp - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((cout, ho * wo), dtype=np.float64)
    for a in range(kh):
        for c in range(kw):
            sl = xp[:, a * dh:a * dh + sh * (ho - 1) + 1:sh, c * dw:c * dw + sw * (wo - 1) + 1:sw]
            out += w[:, :, a, c] @ sl.reshape(cin, ho * wo)
    out = out.reshape(cout, ho, wo)
    if b is not None:
        out += b[:, None, None]
    return out


def _instance_norm(x, gamma, beta, eps=_EPS_NORM):
    mean = x.mean(axis=(1, 2), keepdims=True)
    var = ((x - mean) ** 2).mean(axis=(1, 2), keepdims=True)  # biased
    return (x - mean) / np.sqrt(var + eps) * gamma[:, None, None] + beta[:, None, None]


def _prelu(x, a):
    return np.maximum(x, 0.0) + a[:, None, None] * np.minimum(x, 0.0)


def _linear(x, w, b=None):
    """x [..., in] @ w[out, in].T (+ b), through one 2-D BLAS call."""
    y = np.ascontiguousarray(x).reshape(-1, x.shape[-1]) @ w.T
    if b is not None:
        y += b
    return y.reshape(x.shape[:-1] + (w.shape[0],))


def _layer_norm(x, gamma, beta, eps=_EPS_NORM):
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def _norm_act(W, p, x):
    """InstanceNorm2d(affine) ``p.1`` then PReLU ``p.2``."""
    x = _instance_norm(x, W[p + ".1.weight"], W[p + ".1.bias"])
    return _prelu(x, W[p + ".2.weight"])


def _cna(W, p, x, **conv_kw):
    x = _conv2d(x, W[p + ".0.weight"], W[p + ".0.bias"], **conv_kw)
    return _norm_act(W, p, x)


def _dense_block(W, p, x):
    """DenseBlock: layer i sees cat([out_{i-1}, ..., out_0, x]); returns the last output."""
    skip = x
    out = x
    i = 0
    while f"{p}.dense_block.{i}.0.weight" in W:
        d = 2 ** i
        out = _cna(W, f"{p}.dense_block.{i}", skip, padding=(d, 1), dilation=(d, 1))
        skip = np.concatenate([out, skip], axis=0)
        i += 1
    if i == 0:
        raise KeyError(f"no dense block layers under {p}")
    return out


def _sp_conv_transpose(W, p, x, r):
    """SPConvTranspose2d on the last axis: pad W by 1, conv k(1,3) to C*r, sub-pixel shuffle."""
    y = _conv2d(x, W[p + ".weight"], W[p + ".bias"], padding=(0, 1))
    cr, h, w = y.shape
    c = cr // r
    # torch: view(r, C, H, W) -> permute(C, H, W, r) -> view(C, H, W*r)
    return y.reshape(r, c, h, w).transpose(1, 2, 3, 0).reshape(c, h, w * r)


# --------------------------------------------------------------------------------------------
# Mamba
# --------------------------------------------------------------------------------------------

def reference_causal_conv1d(x: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """Causal depthwise conv1d. x [B, L, D], weight [D, 1, K] (torch layout), bias [D].

    ``out[b, t, d] = bias[d] + sum_k weight[d, 0, k] * x[b, t - (K-1) + k, d]`` (zeros for t < 0).
    """
    x = np.asarray(x, dtype=np.float64)
    w = np.asarray(weight, dtype=np.float64)
    w = w.reshape(w.shape[0], w.shape[-1])  # [D, K]
    k = w.shape[1]
    bsz, length, d = x.shape
    xp = np.concatenate([np.zeros((bsz, k - 1, d)), x], axis=1)
    out = np.broadcast_to(np.asarray(bias, dtype=np.float64), (bsz, length, d)).copy()
    for j in range(k):
        out += w[:, j] * xp[:, j:j + length, :]
    return out


def reference_bimamba_conv(x: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """Both directions' SiLU(causal conv) of a BiMamba -> [2, B, L, D]: x [B, L, 2D] holds
    the forward direction's conv inputs, then the backward one's; weight [2, D, 4, 1] (MLX
    layout), bias [2, D]. [1] is the conv of the time-reversed sequence, in time order."""
    channels = weight.shape[1]
    out = []
    for k in (0, 1):
        half = np.asarray(x)[..., k * channels:(k + 1) * channels]
        y = reference_causal_conv1d(half[:, ::-1] if k else half,
                                    np.asarray(weight[k]).transpose(0, 2, 1), bias[k])
        y = y / (1.0 + np.exp(-y))
        out.append(y[:, ::-1] if k else y)
    return np.stack(out)


def reference_selective_scan(u, delta_raw, A_log, B, C, D, z) -> np.ndarray:
    """Selective scan in float64 (both modes: docs/kernels.md).

    u, delta_raw, z: [B, L, D]; B, C: [B, L, N]; A_log: [D, N]; D: [D]. delta_raw is the
    dt_proj output with its bias already added; softplus is applied here.
    """
    u = np.asarray(u, dtype=np.float64)
    delta = _softplus(np.asarray(delta_raw, dtype=np.float64))
    A = -np.exp(np.asarray(A_log, dtype=np.float64))  # [D, N]
    Bm = np.asarray(B, dtype=np.float64)
    Cm = np.asarray(C, dtype=np.float64)
    Dv = np.asarray(D, dtype=np.float64)
    z = np.asarray(z, dtype=np.float64)
    bsz, length, d = u.shape
    h = np.zeros((bsz, d, A.shape[1]), dtype=np.float64)
    y = np.empty((bsz, length, d), dtype=np.float64)
    du = delta * u
    for t in range(length):
        decay = np.exp(delta[:, t, :, None] * A[None])  # [B, D, N]
        h = decay * h + du[:, t, :, None] * Bm[:, t, None, :]
        y[:, t] = np.matmul(h, Cm[:, t, :, None])[..., 0] + Dv * u[:, t]
    return y * _silu(z)


def reference_mamba(W: dict, p: str, u: np.ndarray, cfg: dict) -> np.ndarray:
    """One bare ``mamba_ssm.Mamba`` (its reference path) on u [N, L, d_model]."""
    s = _sizes(cfg)
    d_inner, dt_rank, d_state = s["d_inner"], s["dt_rank"], s["d_state"]
    x_proj = W[p + ".x_proj.weight"]
    if x_proj.shape[0] != dt_rank + 2 * d_state:
        raise ValueError(f"{p}.x_proj.weight rows {x_proj.shape[0]} != dt_rank + 2*d_state")
    xz = _linear(u, W[p + ".in_proj.weight"])
    x, z = xz[..., :d_inner], xz[..., d_inner:]
    xa = _silu(reference_causal_conv1d(x, W[p + ".conv1d.weight"], W[p + ".conv1d.bias"]))
    x_dbl = _linear(xa, x_proj)
    dt_r = x_dbl[..., :dt_rank]
    Bm = x_dbl[..., dt_rank:dt_rank + d_state]
    Cm = x_dbl[..., dt_rank + d_state:dt_rank + 2 * d_state]
    delta_raw = _linear(dt_r, W[p + ".dt_proj.weight"], W[p + ".dt_proj.bias"])
    y = reference_selective_scan(xa, delta_raw, W[p + ".A_log"], Bm, Cm, W[p + ".D"], z)
    return _linear(y, W[p + ".out_proj.weight"])


def reference_bimamba(W: dict, p: str, x: np.ndarray, cfg: dict) -> np.ndarray:
    """``MambaBlock`` (bidirectional, as in the TF-Mamba block) on x [N, L, C], without the
    outer residual."""
    out_fw = reference_mamba(W, p + ".forward_blocks", x, cfg) + x
    xr = x[:, ::-1]
    out_bw = (reference_mamba(W, p + ".backward_blocks", xr, cfg) + xr)[:, ::-1]
    y = _linear(np.concatenate([out_fw, out_bw], axis=-1), W[p + ".output_proj.weight"],
                W[p + ".output_proj.bias"])
    return _layer_norm(y, W[p + ".norm.weight"], W[p + ".norm.bias"],
                       _sizes(cfg)["norm_epsilon"])


def _tf_mamba(W, p, x, cfg):
    """TFMambaBlock on x [C, T', F']: time pass (along T per F), then freq pass (along F per T)."""
    seq = np.ascontiguousarray(x.transpose(2, 1, 0))  # [F', T', C]
    seq = reference_bimamba(W, p + ".time_mamba", seq, cfg) + seq
    seq = np.ascontiguousarray(seq.transpose(1, 0, 2))  # [T', F', C]
    seq = reference_bimamba(W, p + ".freq_mamba", seq, cfg) + seq
    return seq.transpose(2, 0, 1)  # [C, T', F']


# --------------------------------------------------------------------------------------------
# generator
# --------------------------------------------------------------------------------------------

def _decoder_trunk(W, p, x):
    x = _dense_block(W, p + ".dense_block", x)
    x = _sp_conv_transpose(W, p + ".up_conv1.0.conv", x, 2)  # F x2
    x = _norm_act(W, p + ".up_conv1", x)
    xs = x.transpose(0, 2, 1)  # [C, F, T]
    xs = _sp_conv_transpose(W, p + ".up_conv2.0.conv", xs, 4)  # T x4
    x = xs.transpose(0, 2, 1)
    return _norm_act(W, p + ".up_conv2", x)


def _as_f64(weights: dict) -> dict:
    return {k: np.asarray(v, dtype=np.float64) for k, v in weights.items()}


def reference_forward(weights: dict, cfg: dict, mag: np.ndarray, pha: np.ndarray,
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Generator (encoder, TF-Mamba blocks, decoders) for one channel: [F, T] in, [F, T] out
    (cropped).

    Returns the enhanced compressed magnitude and the phase.
    """
    W = _as_f64(weights)
    s = _sizes(cfg)
    mag = np.asarray(mag, dtype=np.float64)
    pha = np.asarray(pha, dtype=np.float64)
    if mag.shape != pha.shape or mag.ndim != 2:
        raise ValueError("mag and pha must both be [F, T]")
    f, t = mag.shape
    x = np.stack([mag.T, pha.T], axis=0)  # [2, T, F]
    x = np.pad(x, ((0, 0), (0, 2), (0, 2)))  # anti-error pad at the end of T and F
    # encoder
    x = _cna(W, "dense_encoder.dense_conv_1", x)
    x = _dense_block(W, "dense_encoder.dense_block", x)
    x = _cna(W, "dense_encoder.dense_conv_2", x, stride=(4, 2))
    # TF-Mamba blocks
    for i in range(s["num_tfmamba"]):
        x = _tf_mamba(W, f"TSMamba.{i}", x, cfg)
    # magnitude decoder (direct mapping)
    m = _decoder_trunk(W, "mask_decoder", x)
    m = _conv2d(m, W["mask_decoder.final_conv.weight"], W["mask_decoder.final_conv.bias"])
    mag_out = m[0, :t, :f].T
    # phase decoder
    q = _decoder_trunk(W, "phase_decoder", x)
    r = _conv2d(q, W["phase_decoder.phase_conv_r.weight"], W["phase_decoder.phase_conv_r.bias"])
    im = _conv2d(q, W["phase_decoder.phase_conv_i.weight"], W["phase_decoder.phase_conv_i.bias"])
    pha_out = np.arctan2(im[0], r[0])[:t, :f].T
    return np.ascontiguousarray(mag_out), np.ascontiguousarray(pha_out)


def reference_enhance(weights: dict, cfg: dict, x: np.ndarray, sample_rate: int,
                      spectrum: tuple[np.ndarray, np.ndarray] | None = None,
                      forward=None) -> np.ndarray:
    """Whole-file pipeline for one channel: STFT, model, sweep filter, iSTFT, pad/trim to N.

    ``spectrum``: use this (mag, pha) instead of computing the STFT of x.
    ``forward``: optional callable ``(mag, pha) -> (mag, pha)`` replacing the model (tests use
    the identity); by default :func:`reference_forward` with ``weights``.
    """
    x = np.asarray(x, dtype=np.float64)
    n = x.shape[0]
    if spectrum is None:
        mag, pha = reference_stft(x, sample_rate, cfg)
    else:
        mag, pha = (np.asarray(a, dtype=np.float64) for a in spectrum)
    if forward is None:
        mag_g, pha_g = reference_forward(weights, cfg, mag, pha)
    else:
        mag_g, pha_g = forward(mag, pha)
    mag_g = sweep_filter(mag_g)
    y = reference_istft(mag_g, pha_g, sample_rate, cfg)
    if y.shape[0] >= n:
        return y[:n].copy()
    return np.concatenate([y, np.full(n - y.shape[0], 1e-8)])


# --------------------------------------------------------------------------------------------
# strict-mode exponential (kernels.md)
# --------------------------------------------------------------------------------------------

_LOG2E_F32 = np.float32(1.4426950408889634)
_POLY_F32 = tuple(np.float32(c) for c in (
    1.0, 0.6931472, 0.24022651, 0.055503407, 0.0096180400, 0.0013395279, 0.00015465313))


def reference_exp_poly(x) -> np.ndarray:
    """Strict-mode bitcast polynomial exp, emulated in float32 arithmetic (no FMA).

    y = x*log2(e); k = rint(y); f = y - k; p(f) by Horner with the 6th-degree coefficients;
    result = p * 2^k with 2^k built in the IEEE exponent field ((k + 127) << 23) when k >= -126,
    else 0. Intended for x <= 0. Returns float32.
    """
    x32 = np.asarray(x, dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        y = x32 * _LOG2E_F32
        k = np.rint(y)
        f = (y - k).astype(np.float32)
        p = _POLY_F32[6]
        for c in _POLY_F32[5::-1]:
            p = (p * f).astype(np.float32) + c
        p = np.asarray(p, dtype=np.float32)
        ok = k >= np.float32(-126.0)
        ki = np.where(ok, k, 0.0).astype(np.int64)
        ki = np.clip(ki, -126, 127)
        scale = ((ki + 127).astype(np.uint32) << np.uint32(23)).view(np.float32)
        res = (p * scale).astype(np.float32)
        res = np.where(ok, res, np.float32(0.0)).astype(np.float32)
    return res


# --------------------------------------------------------------------------------------------
# checkpoint layout and random weights (for tests)
# --------------------------------------------------------------------------------------------

def weight_shapes(cfg: dict, dense_depth: int = 4) -> dict[str, tuple[int, ...]]:
    """Official key -> torch shape for a config (the layout of NVIDIA's checkpoint)."""
    s = _sizes(cfg)
    c, di, rk, ds, kc = s["hid"], s["d_inner"], s["dt_rank"], s["d_state"], s["d_conv"]
    out: dict[str, tuple[int, ...]] = {}

    def cna(p, cin, cout, kh, kw):
        out[p + ".0.weight"] = (cout, cin, kh, kw)
        out[p + ".0.bias"] = (cout,)
        out[p + ".1.weight"] = (cout,)
        out[p + ".1.bias"] = (cout,)
        out[p + ".2.weight"] = (cout,)

    def dense(p):
        for i in range(dense_depth):
            cna(f"{p}.dense_block.dense_block.{i}", c * (i + 1), c, 3, 3)

    cna("dense_encoder.dense_conv_1", s["input_channel"], c, 1, 1)
    dense("dense_encoder")
    cna("dense_encoder.dense_conv_2", c, c, 1, 3)
    for i in range(s["num_tfmamba"]):
        for br in ("time_mamba", "freq_mamba"):
            p = f"TSMamba.{i}.{br}"
            for d in ("forward_blocks", "backward_blocks"):
                q = f"{p}.{d}"
                out[q + ".in_proj.weight"] = (2 * di, c)
                out[q + ".conv1d.weight"] = (di, 1, kc)
                out[q + ".conv1d.bias"] = (di,)
                out[q + ".x_proj.weight"] = (rk + 2 * ds, di)
                out[q + ".dt_proj.weight"] = (di, rk)
                out[q + ".dt_proj.bias"] = (di,)
                out[q + ".A_log"] = (di, ds)
                out[q + ".D"] = (di,)
                out[q + ".out_proj.weight"] = (c, di)
            out[p + ".output_proj.weight"] = (c, 2 * c)
            out[p + ".output_proj.bias"] = (c,)
            out[p + ".norm.weight"] = (c,)
            out[p + ".norm.bias"] = (c,)
    for dec in ("mask_decoder", "phase_decoder"):
        dense(dec)
        for name, r in (("up_conv1", 2), ("up_conv2", 4)):
            out[f"{dec}.{name}.0.conv.weight"] = (c * r, c, 1, 3)
            out[f"{dec}.{name}.0.conv.bias"] = (c * r,)
            out[f"{dec}.{name}.1.weight"] = (c,)
            out[f"{dec}.{name}.1.bias"] = (c,)
            out[f"{dec}.{name}.2.weight"] = (c,)
        heads = ("final_conv",) if dec == "mask_decoder" else ("phase_conv_r", "phase_conv_i")
        for h in heads:
            out[f"{dec}.{h}.weight"] = (1, c, 1, 1)
            out[f"{dec}.{h}.bias"] = (1,)
    return out


def random_weights(cfg: dict, seed: int = 0, dtype=np.float32) -> dict[str, np.ndarray]:
    """Plausibly scaled random weights in the official layout (Mamba-style A_log / dt init)."""
    rng = np.random.default_rng(seed)
    out = {}
    for k, shape in weight_shapes(cfg).items():
        if k.endswith("A_log"):
            a = np.log(np.arange(1, shape[1] + 1, dtype=np.float64))
            v = np.broadcast_to(a, shape) + 0.05 * rng.standard_normal(shape)
        elif k.endswith(".D"):
            v = 1.0 + 0.1 * rng.standard_normal(shape)
        elif k.endswith("dt_proj.bias"):
            dt = np.exp(rng.uniform(np.log(1e-3), np.log(1e-1), shape))
            v = dt + np.log(-np.expm1(-dt))  # inverse softplus
        elif len(shape) == 1 and k.endswith(".2.weight"):  # PReLU
            v = 0.25 + 0.05 * rng.standard_normal(shape)
        elif len(shape) == 1 and k.endswith((".1.weight", "norm.weight")):  # gains
            v = 1.0 + 0.1 * rng.standard_normal(shape)
        elif len(shape) == 1:  # biases
            v = 0.05 * rng.standard_normal(shape)
        else:
            fan_in = int(np.prod(shape[1:]))
            v = rng.standard_normal(shape) / np.sqrt(fan_in)
        out[k] = np.asarray(v, dtype=dtype)
    return out
