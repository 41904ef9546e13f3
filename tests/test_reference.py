"""Self-checks of the float64 NumPy reference (tests/reference.py). All fast (< a few s)."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference as ref

from speechlens_cli.synthetic.checkpoints import FULL_CONFIG as CFG
from speechlens_cli.synthetic.checkpoints import TINY_CONFIG as TINY


def _identity(mag, pha):
    return mag, pha


@pytest.mark.parametrize("sr,expected", [
    (8000, (320, 40, 320)), (16000, (640, 80, 640)), (22050, (882, 110, 882)),
    (24000, (960, 120, 960)), (32000, (1280, 160, 1280)), (44100, (1764, 220, 1764)),
    (48000, (1920, 240, 1920)), (11025, (442, 56, 442)),  # 441 -> 442, 55 -> 56 (make_even)
])
def test_stft_params_table(sr, expected):
    assert ref.stft_params(sr, CFG) == expected


def test_clamped_reflect_pad():
    rng = np.random.default_rng(0)
    x = rng.standard_normal(50)
    np.testing.assert_array_equal(ref._clamped_reflect_pad(x, 20), np.pad(x, 20, mode="reflect"))
    # too short to reflect: indices clamped (hand-derived for N=3, pad=4)
    x = np.array([10.0, 11.0, 12.0])
    want = x[[2, 2, 2, 1, 0, 1, 2, 1, 0, 0, 0]]
    np.testing.assert_array_equal(ref._clamped_reflect_pad(x, 4), want)
    # N = 1: everything is the single sample
    np.testing.assert_array_equal(ref._clamped_reflect_pad(np.array([5.0]), 3), np.full(7, 5.0))


@pytest.mark.parametrize("sr,n", [(16000, 4037), (8000, 4000), (44100, 3000), (8000, 100)])
def test_roundtrip_identity_model(sr, n):
    """STFT -> identity model -> sweep filter -> iSTFT reconstructs the signal.

    Tolerance: 1e-10 absolute on unit-variance noise (float64 FFT round trip is ~1e-15).
    The last N mod hop samples are the 1e-8 pad value. (8000, 100) exercises the clamped
    reflection (N <= n_fft/2).
    """
    rng = np.random.default_rng(sr + n)
    x = rng.standard_normal(n)
    _, hop, _ = ref.stft_params(sr, CFG)
    mag, pha = ref.reference_stft(x, sr, CFG)
    assert mag.shape == pha.shape == (ref.stft_params(sr, CFG)[0] // 2 + 1, 1 + n // hop)
    y = ref.reference_enhance(None, CFG, x, sr, forward=_identity)
    assert y.shape == (n,)
    m = hop * (n // hop)
    np.testing.assert_allclose(y[:m], x[:m], rtol=0, atol=1e-10)
    np.testing.assert_array_equal(y[m:], 1e-8)
    # the spectrum argument bypasses the STFT
    y2 = ref.reference_enhance(None, CFG, x, sr, spectrum=(mag, pha), forward=_identity)
    np.testing.assert_array_equal(y, y2)


def test_stft_matches_direct_dft():
    """One frame against an explicit DFT sum (float64, tolerance 1e-10 relative to max |X|)."""
    sr = 8000
    n_fft, hop, win = ref.stft_params(sr, CFG)
    rng = np.random.default_rng(1)
    x = rng.standard_normal(1000)
    mag, pha = ref.reference_stft(x, sr, CFG)
    t = 7
    xp = np.pad(x, n_fft // 2, mode="reflect")
    nn = np.arange(n_fft)
    w = 0.5 - 0.5 * np.cos(2 * np.pi * nn / win)  # periodic Hann
    seg = xp[t * hop:t * hop + n_fft] * w
    k = np.arange(n_fft // 2 + 1)
    X = np.exp(-2j * np.pi * np.outer(k, nn) / n_fft) @ seg
    got = np.expm1(mag[:, t]) * np.exp(1j * pha[:, t])
    scale = np.abs(X).max()
    np.testing.assert_allclose(got, X, rtol=0, atol=1e-10 * scale)
    np.testing.assert_allclose(mag[:, t], np.log1p(np.abs(X)), rtol=0, atol=1e-10)


def test_stft_dc_nyquist_phase_is_plus_pi_for_negative_real():
    x = -np.ones(400)  # DC bin real part negative, imaginary exactly +0
    _, pha = ref.reference_stft(x, 8000, CFG)
    assert np.all(pha[0] == np.pi)


def test_selective_scan_two_steps_by_hand():
    """Tiny case (B=1, L=2, D=2, N=3) against a hand-unrolled recurrence; tolerance 1e-13."""
    rng = np.random.default_rng(2)
    u = rng.standard_normal((1, 2, 2))
    dr = rng.standard_normal((1, 2, 2))
    A_log = rng.standard_normal((2, 3))
    B = rng.standard_normal((1, 2, 3))
    C = rng.standard_normal((1, 2, 3))
    D = rng.standard_normal(2)
    z = rng.standard_normal((1, 2, 2))
    got = ref.reference_selective_scan(u, dr, A_log, B, C, D, z)
    want = np.zeros((1, 2, 2))
    for d in range(2):
        a = [-np.exp(A_log[d, n]) for n in range(3)]
        dt0 = np.log(1 + np.exp(dr[0, 0, d]))
        dt1 = np.log(1 + np.exp(dr[0, 1, d]))
        h0 = [dt0 * B[0, 0, n] * u[0, 0, d] for n in range(3)]
        h1 = [np.exp(dt1 * a[n]) * h0[n] + dt1 * B[0, 1, n] * u[0, 1, d] for n in range(3)]
        y0 = sum(C[0, 0, n] * h0[n] for n in range(3)) + D[d] * u[0, 0, d]
        y1 = sum(C[0, 1, n] * h1[n] for n in range(3)) + D[d] * u[0, 1, d]
        s0 = z[0, 0, d] / (1 + np.exp(-z[0, 0, d]))
        s1 = z[0, 1, d] / (1 + np.exp(-z[0, 1, d]))
        want[0, 0, d] = y0 * s0
        want[0, 1, d] = y1 * s1
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-14)


def test_causal_conv1d_direct_formula():
    rng = np.random.default_rng(3)
    bsz, length, d, k = 2, 9, 5, 4
    x = rng.standard_normal((bsz, length, d))
    w = rng.standard_normal((d, 1, k))
    b = rng.standard_normal(d)
    got = ref.reference_causal_conv1d(x, w, b)
    want = np.zeros_like(x)
    for bi in range(bsz):
        for t in range(length):
            for c in range(d):
                acc = b[c]
                for j in range(k):
                    src = t - (k - 1) + j
                    if src >= 0:
                        acc += w[c, 0, j] * x[bi, src, c]
                want[bi, t, c] = acc
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-13)


def test_exp_poly_accuracy_and_cutoff():
    """Max relative error <= 3.8e-6 on a 100,001-point float32 grid over [-86, 0] (the
    polynomial's own bound: 3.79e-6), compared with float64 exp of the same float32 arguments;
    exactly 0 below the cutoff."""
    x = np.linspace(-86.0, 0.0, 100001).astype(np.float32)
    got = ref.reference_exp_poly(x)
    assert got.dtype == np.float32
    want = np.exp(x.astype(np.float64))
    rel = np.max(np.abs(got.astype(np.float64) - want) / want)
    assert rel <= 3.8e-6, rel
    assert rel > 1e-7  # it really is an approximation, not np.exp
    assert ref.reference_exp_poly(np.float32(0.0)) == 1.0
    below = np.concatenate([np.linspace(-88.0, -1000.0, 1001), [-1e6, -1e30, -np.inf]])
    out = ref.reference_exp_poly(below)
    assert np.all(out == 0.0) and np.all(np.isfinite(out))
    # strict mode must stay finite at dt = 1000 (decay argument dt * A, A = -exp(A_log))
    assert np.all(np.isfinite(ref.reference_exp_poly(-1000.0 * np.exp(np.linspace(-5, 3, 50)))))


def test_sweep_filter():
    m = np.array([[1.0, 0.0, -1.0, 0.5, 0.0],
                  [2.0, -3.0, 0.0, 0.5, 0.0],
                  [3.0, 4.0, 0.0, -0.5, 1.0],
                  [3.0, -4.0, 0.0, -0.5, 1.0]])
    got = ref.sweep_filter(m)
    want = m.copy()
    want[:, 1] = 0.0  # 3/4 bins <= 0
    want[:, 2] = 0.0  # 4/4 bins <= 0
    # columns 0 (0/4), 3 and 4 (exactly 2/4, not > half) are kept
    np.testing.assert_array_equal(got, want)


def test_istft_ignores_imag_of_dc_and_nyquist():
    rng = np.random.default_rng(9)
    mag = rng.random((161, 6)) + 0.1
    pha = rng.uniform(-np.pi, np.pi, (161, 6))
    pha2 = pha.copy()
    pha2[[0, -1]] = -pha2[[0, -1]]  # same real part, imaginary part negated
    y1 = ref.reference_istft(mag, pha, 8000, CFG)
    y2 = ref.reference_istft(mag, pha2, 8000, CFG)
    assert y1.shape == (200,)
    np.testing.assert_allclose(y1, y2, rtol=0, atol=1e-12)


def test_sp_conv_transpose_shuffle():
    """Output channel k = rho*C + c lands at W index w*r + rho."""
    c, r, h, w = 2, 3, 2, 4
    rng = np.random.default_rng(4)
    x = rng.standard_normal((c, h, w))
    weight = np.zeros((c * r, c, 1, 3))
    for rho in range(r):
        for ci in range(c):
            weight[rho * c + ci, ci, 0, 1] = rho + 1.0  # centre tap, scaled by rho + 1
    W = {"p.weight": weight, "p.bias": np.zeros(c * r)}
    y = ref._sp_conv_transpose(W, "p", x, r)
    assert y.shape == (c, h, w * r)
    for rho in range(r):
        np.testing.assert_array_equal(y[:, :, rho::r], x * (rho + 1.0))


def test_mamba_is_causal_and_bimamba_sees_both_ways():
    cfg = TINY
    W = {k: v.astype(np.float64) for k, v in ref.random_weights(cfg, seed=5).items()}
    rng = np.random.default_rng(6)
    x = rng.standard_normal((3, 10, 16))
    x2 = x.copy()
    x2[:, 6:] += 1.0
    p = "TSMamba.0.time_mamba"
    y1 = ref.reference_mamba(W, p + ".forward_blocks", x, cfg)
    y2 = ref.reference_mamba(W, p + ".forward_blocks", x2, cfg)
    np.testing.assert_array_equal(y1[:, :6], y2[:, :6])
    assert np.abs(y1[:, 6:] - y2[:, 6:]).max() > 1e-3
    b1 = ref.reference_bimamba(W, p, x, cfg)
    b2 = ref.reference_bimamba(W, p, x2, cfg)
    assert np.abs(b1[:, :6] - b2[:, :6]).max() > 1e-3  # backward branch carries the future


def test_tiny_forward_shapes_and_layout():
    rng = np.random.default_rng(7)
    W = ref.random_weights(TINY, seed=8)
    x = 0.1 * rng.standard_normal(1003)
    mag, pha = ref.reference_stft(x, 8000, TINY)
    mo, po = ref.reference_forward(W, TINY, mag, pha)
    assert mo.shape == po.shape == mag.shape == (161, 26)
    assert np.all(np.isfinite(mo)) and np.all(np.abs(po) <= np.pi)
    y = ref.reference_enhance(W, TINY, x, 8000)
    assert y.shape == (1003,) and np.all(np.isfinite(y))
    try:
        from speechlens_cli.model.config import ModelConfig
        from speechlens_cli.model.layout import expected_shapes
    except ImportError:
        pytest.skip("speechlens_cli layout not importable")
    for cfg in (CFG, TINY):
        theirs = {k: tuple(v) for k, v in expected_shapes(ModelConfig.from_dict(cfg)).items()}
        assert theirs == ref.weight_shapes(cfg)


def _f64(cfg, seed):
    return {k: v.astype(np.float64) for k, v in ref.random_weights(cfg, seed=seed).items()}


def test_bimamba_flip_symmetry():
    """With identical forward/backward weights and a symmetric merge, BiMamba commutes with
    flipping the sequence; this fails if the backward branch (or its conv) is not run on the
    reversed sequence."""
    W = _f64(TINY, 10)
    p = "TSMamba.0.freq_mamba"
    for k in [k for k in W if k.startswith(p + ".forward_blocks.")]:
        W[k.replace("forward_blocks", "backward_blocks")] = W[k]
    wo = W[p + ".output_proj.weight"]
    W[p + ".output_proj.weight"] = np.concatenate([wo[:, :16], wo[:, :16]], axis=1)
    x = np.random.default_rng(11).standard_normal((2, 12, 16))
    y = ref.reference_bimamba(W, p, x, TINY)
    yr = ref.reference_bimamba(W, p, x[:, ::-1], TINY)
    np.testing.assert_allclose(yr, y[:, ::-1], rtol=1e-12, atol=1e-12)
    assert np.abs(y - y[:, ::-1]).max() > 1e-3


def test_tf_block_time_pass_runs_along_t():
    """Silence the freq pass (LayerNorm gain and bias 0): a change in one F column may then only
    change that column of the block output."""
    W = _f64(TINY, 12)
    W["TSMamba.0.freq_mamba.norm.weight"][:] = 0.0
    W["TSMamba.0.freq_mamba.norm.bias"][:] = 0.0
    x = np.random.default_rng(13).standard_normal((16, 7, 9))  # [C, T', F']
    x2 = x.copy()
    x2[:, 3, 4] += 1.0
    d = np.abs(ref._tf_mamba(W, "TSMamba.0", x2, TINY) - ref._tf_mamba(W, "TSMamba.0", x, TINY))
    assert d[:, :, 4].max() > 1e-3
    assert np.delete(d, 4, axis=2).max() == 0.0


def test_dense_block_concat_newest_first():
    """Layer 1 with zero weights on its last C input channels must see only layer 0's output."""
    W = _f64(TINY, 14)
    p = "dense_encoder.dense_block"
    W = {k: v for k, v in W.items() if not k.startswith(p + ".dense_block.2.")
         and not k.startswith(p + ".dense_block.3.")}  # depth 2
    W[p + ".dense_block.1.0.weight"][:, 16:] = 0.0
    x = np.random.default_rng(15).standard_normal((16, 6, 5))
    got = ref._dense_block(W, p, x)
    out0 = ref._cna(W, p + ".dense_block.0", x, padding=(1, 1), dilation=(1, 1))
    W1 = dict(W)
    W1[p + ".dense_block.1.0.weight"] = W[p + ".dense_block.1.0.weight"][:, :16]
    want = ref._cna(W1, p + ".dense_block.1", out0, padding=(2, 1), dilation=(2, 1))
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
