"""The conv1d / selective-scan kernels behind speechlens_cli.kernels, on whatever backend runs here.

On Linux CI that is the CPU library (kernels/cpu_kernels.cpp); on an NVIDIA host with
mlx[cuda13] the same tests exercise the CUDA kernels, and on Apple Silicon the Metal ones. The
CPU library's own tests (needs_cpu_library) run on MLX's CPU device on any machine.
Tolerances: conv vs mx.conv1d fallback max abs diff <= 1e-5; scan vs float64 reference relative
RMS error <= 1e-5 (both modes); polynomial exp max relative error <= 3.8e-6 on [-86, 0]; the
CPU's standard-mode decay 2^x max relative error <= 2e-7 on [-125, 0].
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import mlx.core as mx
import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference as ref

from speechlens_cli import kernels
from speechlens_cli.errors import UsageError
from speechlens_cli.kernels import (
    build,
    cpu_binding,
    cpu_ops,
    cuda_conv2d,
    cuda_projection,
    dispatch,
    notices,
)
from tests.reliability import invoke

ATOL_CONV = 1e-5
RTOL_SCAN = 1e-5
BACKEND = kernels.backend()


def needs_cpu_library(test):
    """A test of the CPU kernel library: on MLX's CPU device (the on_cpu fixture), so it runs on
    a GPU host too; skipped only where no library could be built (no C++ compiler)."""
    test = pytest.mark.usefixtures("on_cpu")(test)
    return pytest.mark.skipif(kernels.cpu_library() is None,
                              reason="no CPU kernel library here (no C++ compiler)")(test)


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch):
    monkeypatch.delenv(kernels.DISABLE_CONV_ENV, raising=False)
    monkeypatch.delenv(kernels.DISABLE_CONV_ENV_ALIAS, raising=False)
    notices.reset_warnings()
    yield
    notices.reset_warnings()


def _conv_inputs(rng, batch, length, channels, strided=True):
    xz = mx.array(rng.standard_normal((batch, length, 2 * channels)).astype(np.float32))
    x = xz[..., :channels] if strided else mx.contiguous(xz[..., :channels])
    weight = mx.array(rng.standard_normal((channels, 4, 1)).astype(np.float32))
    bias = mx.array(rng.standard_normal(channels).astype(np.float32))
    return x, weight, bias


def _scan_inputs(rng, batch, length, channels, dt_shift=-1.0):
    """The model's layout: u, z column slices of in_proj's output, B, C slices of x_proj's."""
    xz = mx.array(rng.standard_normal((batch, length, 2 * channels)).astype(np.float32))
    dbl = mx.array(rng.standard_normal((batch, length, 36)).astype(np.float32))
    u, z = xz[..., :channels], xz[..., channels:]
    Bm, Cm = dbl[..., 4:20], dbl[..., 20:36]
    delta_raw = mx.array((rng.standard_normal((batch, length, channels)) + dt_shift)
                         .astype(np.float32))
    A_log = mx.array(np.log(rng.uniform(0.5, 16.0, (channels, 16))).astype(np.float32))
    D = mx.array(rng.standard_normal(channels).astype(np.float32))
    return u, delta_raw, A_log, Bm, Cm, D, z


def _np(arrays):
    return [np.array(a) for a in arrays]


def _rel_rms(out, want):
    return float(np.sqrt(np.mean((out - want) ** 2) / np.mean(want ** 2)))


# ----------------------------------------------------------------------------- conv ----------

@pytest.mark.parametrize("batch,length,channels", [
    (1, 1, 1), (2, 1, 8), (3, 2, 5), (2, 3, 16), (4, 4, 33), (2, 37, 64), (3, 200, 256),
    (1, 500, 40)])
@pytest.mark.parametrize("strided", [True, False])
def test_conv_kernel_equals_conv1d_fallback(batch, length, channels, strided):
    rng = np.random.default_rng(batch * 1000 + length * 10 + channels)
    x, weight, bias = _conv_inputs(rng, batch, length, channels, strided)
    out = kernels.causal_conv1d(x, weight, bias)
    fallback = kernels.conv1d_fallback(x, weight, bias)
    assert out.shape == fallback.shape == x.shape
    assert out.dtype == mx.float32
    assert float(mx.max(mx.abs(out - fallback))) <= ATOL_CONV
    want = ref.reference_causal_conv1d(np.array(x), np.array(weight).transpose(0, 2, 1),
                                       np.array(bias))
    assert float(np.max(np.abs(np.array(out) - want))) <= ATOL_CONV


@pytest.mark.parametrize("batch,length,channels", [(1, 1, 1), (3, 2, 5), (4, 9, 33),
                                                    (2, 37, 256)])
def test_conv_with_silu_equals_silu_of_reference(batch, length, channels):
    """silu=True (fused on the CPU) == SiLU of the float64 conv; float32 rounding bound."""
    rng = np.random.default_rng(7 + channels)
    x, weight, bias = _conv_inputs(rng, batch, length, channels, False)
    out = np.array(kernels.causal_conv1d(x, weight, bias, silu=True))
    conv = ref.reference_causal_conv1d(np.array(x), np.array(weight).transpose(0, 2, 1),
                                       np.array(bias))
    want = conv / (1.0 + np.exp(-conv))
    assert out.shape == x.shape
    assert np.max(np.abs(out - want)) <= ATOL_CONV


@needs_cpu_library
def test_cpu_conv_silu_is_accurate_over_the_whole_range():
    """The CPU conv's SiLU (an exp2 polynomial with a clamped exponent) over [-100, 100] through
    an identity conv: relative error <= 5e-7 where SiLU is not tiny (|SiLU| >= 1e-30; below,
    absolute <= 1e-30), NaN stays NaN."""
    z = np.concatenate([np.linspace(-100.0, 100.0, 40001), [0.0, -0.0, np.nan]])
    x = mx.array(z.astype(np.float32).reshape(1, -1, 1))
    weight = mx.array(np.float32([0, 0, 0, 1]).reshape(1, 4, 1))
    out = np.array(kernels.causal_conv1d(x, weight, mx.zeros((1,)), silu=True)).ravel()
    zf = np.array(x, np.float64).ravel()
    with np.errstate(over="ignore"):
        want = zf / (1.0 + np.exp(-zf))
    finite = ~np.isnan(zf)
    big = finite & (np.abs(want) >= 1e-30)
    assert np.max(np.abs(out[big] - want[big]) / np.abs(want[big])) <= 5e-7
    assert np.max(np.abs(out[finite & ~big] - want[finite & ~big])) <= 1e-30
    assert np.isnan(out[~finite]).all()


def test_conv_kernel_is_causal_with_zero_padding():
    """Output t depends on inputs t-3..t only; the first outputs see zeros before t = 0."""
    rng = np.random.default_rng(5)
    x, weight, bias = _conv_inputs(rng, 2, 12, 8)
    base = np.array(kernels.causal_conv1d(x, weight, bias))
    xn = np.array(x)
    xn[:, 6] += 100.0
    moved = np.array(kernels.causal_conv1d(mx.array(xn), weight, bias))
    changed = np.any(moved != base, axis=(0, 2))
    assert changed.tolist() == [t in (6, 7, 8, 9) for t in range(12)]
    w = np.array(weight)[:, :, 0]
    np.testing.assert_allclose(base[:, 0], xn[:, 0] * w[:, 3] + np.array(bias), atol=ATOL_CONV)


def test_conv_env_var_forces_fallback_and_warns_once(monkeypatch, caplog):
    rng = np.random.default_rng(11)
    x, weight, bias = _conv_inputs(rng, 2, 9, 8)
    monkeypatch.setenv(kernels.DISABLE_CONV_ENV, "1")
    calls = []
    real = kernels.conv1d_fallback
    monkeypatch.setattr(dispatch, "conv1d_fallback", lambda *a: calls.append(1) or real(*a))
    with caplog.at_level(logging.WARNING, logger=kernels.__name__):
        for _ in range(3):
            out = kernels.causal_conv1d(x, weight, bias)
    assert len(calls) == 3
    assert np.array_equal(np.array(out), np.array(real(x, weight, bias)))
    records = [r for r in caplog.records if "causal_conv1d" in r.getMessage()]
    assert len(records) == 1 and kernels.DISABLE_CONV_ENV in records[0].getMessage()


def test_conv_env_alias_and_zero(monkeypatch):
    monkeypatch.setenv(kernels.DISABLE_CONV_ENV, "0")
    assert not kernels.conv_kernel_disabled()
    monkeypatch.setenv(kernels.DISABLE_CONV_ENV_ALIAS, "1")
    assert kernels.conv_kernel_disabled()


@pytest.mark.parametrize("bad", ["dtype", "weight_shape", "rank", "bias_shape"])
def test_conv_validation_failure_falls_back_with_one_warning(bad, caplog):
    rng = np.random.default_rng(2)
    x, weight, bias = _conv_inputs(rng, 2, 10, 8)
    if bad == "dtype":
        x = x.astype(mx.float16)
    elif bad == "weight_shape":
        weight = mx.array(rng.standard_normal((8, 3, 1)).astype(np.float32))  # kernel size 3
    elif bad == "rank":
        x = x[0]
    else:
        bias = mx.zeros((9,), mx.float32)
    with caplog.at_level(logging.WARNING, logger=kernels.__name__):
        if bad in ("rank", "bias_shape"):
            with pytest.raises(Exception):  # noqa: B017 - mx.conv1d rejects it too
                kernels.causal_conv1d(x, weight, bias)
            with pytest.raises(Exception):  # noqa: B017
                kernels.causal_conv1d(x, weight, bias)
        else:
            for _ in range(2):
                out = kernels.causal_conv1d(x, weight, bias)
            assert np.allclose(np.array(out), np.array(kernels.conv1d_fallback(x, weight, bias)))
    msgs = [r.getMessage() for r in caplog.records if "causal_conv1d" in r.getMessage()]
    assert len(msgs) == 1 and "mx.conv1d" in msgs[0]


# ----------------------------------------------------------------------------- scan ----------

@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("batch,length,channels", [
    (1, 1, 1), (2, 1, 16), (2, 2, 7), (3, 3, 32), (2, 17, 64), (1, 100, 256), (2, 251, 48),
    (1, 500, 24)])
def test_scan_matches_float64_reference(strict, batch, length, channels):
    rng = np.random.default_rng(batch * 7919 + length * 31 + channels)
    args = _scan_inputs(rng, batch, length, channels)
    out = kernels.selective_scan(*args, strict=strict)
    assert out.shape == args[0].shape and out.dtype == mx.float32
    got = np.array(out)
    want = ref.reference_selective_scan(*_np(args))
    assert np.all(np.isfinite(got))
    assert _rel_rms(got, want) <= RTOL_SCAN, _rel_rms(got, want)


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("batch,length,channels", [(2, 17, 64), (1, 251, 256), (2, 9, 40)])
def test_scan_with_fused_dt_projection_matches_float64_reference(strict, batch, length, channels):
    """dt_proj=(W, b): delta_raw = dt_r @ W.T + b formed per step (fused on the CPU where the
    channels fill whole SIMD groups; 40 does not and takes the matmul path)."""
    rng = np.random.default_rng(11 + channels)
    u, _, A_log, Bm, Cm, D, z = _scan_inputs(rng, batch, length, channels)
    dbl = mx.array(rng.standard_normal((batch, length, 36)).astype(np.float32))
    dt_r = dbl[..., :4]
    weight = mx.array((rng.standard_normal((channels, 4)) * 0.5).astype(np.float32))
    bias = mx.array((rng.standard_normal(channels) - 1.0).astype(np.float32))
    out = kernels.selective_scan(u, dt_r, A_log, Bm, Cm, D, z, strict=strict,
                                 dt_proj=(weight, bias))
    delta_raw = (np.array(dt_r).astype(np.float64) @ np.array(weight).astype(np.float64).T
                 + np.array(bias))
    want = ref.reference_selective_scan(*_np([u]), delta_raw, *_np([A_log, Bm, Cm, D, z]))
    assert _rel_rms(np.array(out), want) <= RTOL_SCAN


@pytest.mark.parametrize("strict", [False, True])
def test_scan_and_conv_accept_reversed_and_transposed_views(strict):
    """Views with negative time strides (the backward branch flips sequences) or a non-unit
    channel stride give the same result as contiguous copies."""
    rng = np.random.default_rng(19)
    args = _scan_inputs(rng, 3, 40, 24)
    flipped = [a[:, ::-1] if a.ndim == 3 else a for a in args]
    trans = mx.array(rng.standard_normal((3, 24, 40)).astype(np.float32)).transpose(0, 2, 1)
    flipped[0] = trans  # u with channel stride 40
    got = np.array(kernels.selective_scan(*flipped, strict=strict))
    want = ref.reference_selective_scan(*_np(flipped))
    assert _rel_rms(got, want) <= RTOL_SCAN
    x, weight, bias = _conv_inputs(rng, 2, 30, 24)
    for view in (x[:, ::-1], trans):
        out = kernels.causal_conv1d(view, weight, bias)
        assert float(mx.max(mx.abs(out - kernels.conv1d_fallback(view, weight, bias)))) \
            <= ATOL_CONV


def test_scan_strict_is_finite_at_dt_1000():
    rng = np.random.default_rng(17)
    args = list(_scan_inputs(rng, 2, 64, 32))
    args[1] = mx.full(args[1].shape, 1000.0, mx.float32)  # dt = softplus(1000) = 1000
    got = np.array(kernels.selective_scan(*args, strict=True))
    assert np.all(np.isfinite(got))
    assert _rel_rms(got, ref.reference_selective_scan(*_np(args))) <= RTOL_SCAN


@pytest.mark.parametrize("strict", [False, True])
def test_scan_repeated_runs_are_bit_identical(strict):
    args = _scan_inputs(np.random.default_rng(23), 5, 131, 64)
    first = np.array(kernels.selective_scan(*args, strict=strict))
    for _ in range(2):
        again = np.array(kernels.selective_scan(*args, strict=strict))
        assert np.array_equal(first.view(np.uint32), again.view(np.uint32))


def test_scan_modes_differ_only_slightly():
    """Standard and strict are two roundings of the same math, not two models."""
    args = _scan_inputs(np.random.default_rng(29), 2, 60, 32)
    std = np.array(kernels.selective_scan(*args, strict=False))
    strict = np.array(kernels.selective_scan(*args, strict=True))
    assert _rel_rms(std, strict) <= 2 * RTOL_SCAN


@pytest.mark.parametrize("bad", ["A_log", "B", "dtype", "rank", "z"])
def test_scan_rejects_bad_inputs(bad):
    rng = np.random.default_rng(31)
    args = list(_scan_inputs(rng, 2, 5, 8))
    if bad == "A_log":
        args[2] = mx.zeros((8, 8), mx.float32)  # d_state 8: not the fixed-16 kernel
    elif bad == "B":
        args[3] = mx.zeros((2, 5, 15), mx.float32)
    elif bad == "dtype":
        args[0] = args[0].astype(mx.float16)
    elif bad == "rank":
        args[0] = args[0][0]
    else:
        args[6] = mx.zeros((2, 6, 8), mx.float32)
    with pytest.raises(kernels.KernelInputError):
        kernels.selective_scan(*args)


def test_scan_ops_fallback_matches_reference():
    """The MLX-op scan (used only without a CPU library) is right too, in both modes."""
    args = _scan_inputs(np.random.default_rng(37), 2, 45, 16)
    want = ref.reference_selective_scan(*_np(args))
    for strict in (False, True):
        got = np.array(kernels.selective_scan_ops(*args, strict=strict, eval_every=8))
        assert _rel_rms(got, want) <= RTOL_SCAN


# ------------------------------------------------------ both directions of a BiMamba ------


def _bimamba_inputs(rng, batch, length, channels, rank):
    """bimamba_conv / bimamba_scan inputs as float32 NumPy arrays (the model's layouts)."""
    f32 = np.float32
    x = rng.standard_normal((batch, length, 2 * channels)).astype(f32)
    z = rng.standard_normal((batch, length, 2 * channels)).astype(f32)
    conv_w = rng.standard_normal((2, channels, 4, 1)).astype(f32)
    conv_b = rng.standard_normal((2, channels)).astype(f32)
    u = rng.standard_normal((2, batch, length, channels)).astype(f32)
    x_dbl = rng.standard_normal((2, batch, length, rank + 32)).astype(f32)
    A_log = np.log(rng.uniform(0.5, 16.0, (2, channels, 16))).astype(f32)
    D = rng.standard_normal((2, channels)).astype(f32)
    dt_w = (rng.standard_normal((2, channels, rank)) / np.sqrt(rank)).astype(f32)
    dt_b = (rng.standard_normal((2, channels)) - 1.0).astype(f32)
    return x, z, conv_w, conv_b, u, x_dbl, A_log, D, dt_w, dt_b


def _time_order(a, k):
    return a[:, ::-1] if k else a


def _bimamba_reference(x_in, z_in, conv_w, conv_b, u, x_dbl, A_log, D, dt_w, dt_b):
    """float64: direction 0 the causal conv / scan of the sequence, direction 1 those of the
    time-reversed sequence, returned in time order."""
    channels, rank, n = conv_w.shape[1], dt_w.shape[2], 16
    scan = []
    for k in (0, 1):
        dbl = _time_order(x_dbl[k], k).astype(np.float64)
        delta_raw = dt_b[k] + dbl[..., :rank] @ dt_w[k].T.astype(np.float64)
        z = _time_order(z_in[..., k * channels:(k + 1) * channels], k)
        scan.append(_time_order(ref.reference_selective_scan(
            _time_order(u[k], k), delta_raw, A_log[k], dbl[..., rank:rank + n],
            dbl[..., rank + n:], D[k], z), k))
    return ref.reference_bimamba_conv(x_in, conv_w, conv_b), np.concatenate(scan, axis=-1)


@pytest.mark.parametrize("composed", [False, True], ids=["backend", "per-direction"])
@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("batch,length,channels,rank", [(2, 1, 8, 1), (3, 37, 17, 1),
                                                        (2, 50, 64, 4)])
def test_both_directions_match_float64(monkeypatch, request, composed, strict, batch, length,
                                       channels, rank):
    """bimamba_conv / bimamba_scan: the backend's one-call path (on the CPU, the library through
    time-reversed views) and the per-direction composition used where there is none."""
    if composed:  # no CPU library: each direction through the MLX-op fallbacks, on the CPU
        request.getfixturevalue("on_cpu")
        monkeypatch.setattr(dispatch, "cpu_library", lambda: None)
    arrays = _bimamba_inputs(np.random.default_rng(length + rank), batch, length, channels,
                             rank)
    x, z, conv_w, conv_b, u, x_dbl, A_log, D, dt_w, dt_b = (mx.array(a) for a in arrays)
    want_conv, want_scan = _bimamba_reference(*arrays)
    got_conv = np.array(kernels.bimamba_conv(x, conv_w, conv_b))
    assert got_conv.shape == want_conv.shape
    assert float(np.max(np.abs(got_conv - want_conv))) <= ATOL_CONV
    got = np.array(kernels.bimamba_scan(u, x_dbl, z, A_log, D, (dt_w, dt_b), strict=strict))
    assert got.shape == want_scan.shape
    assert _rel_rms(got, want_scan) <= RTOL_SCAN


@needs_cpu_library
def test_cpu_both_directions_equal_the_kernels_on_reversed_copies():
    """The CPU library reads the backward direction through negative time strides: the same
    arithmetic as on a reversed copy, bit for bit."""
    arrays = _bimamba_inputs(np.random.default_rng(3), 2, 41, 64, 4)
    x, z, conv_w, conv_b, u, x_dbl, A_log, D, dt_w, dt_b = (mx.array(a) for a in arrays)
    conv = np.array(kernels.bimamba_conv(x, conv_w, conv_b))
    back = mx.array(np.ascontiguousarray(arrays[0][:, ::-1, 64:]))
    want = np.array(kernels.causal_conv1d(back, conv_w[1], conv_b[1], silu=True))[:, ::-1]
    assert np.array_equal(conv[1], want)
    y = np.array(kernels.bimamba_scan(u, x_dbl, z, A_log, D, (dt_w, dt_b)))

    def reversed_copy(a):
        return mx.array(np.ascontiguousarray(np.array(a)[:, ::-1]))

    dbl = reversed_copy(x_dbl[1])
    want = np.array(kernels.selective_scan(
        reversed_copy(u[1]), dbl[..., :4], A_log[1], dbl[..., 4:20], dbl[..., 20:], D[1],
        reversed_copy(z[..., 64:]), dt_proj=(dt_w[1], dt_b[1])))[:, ::-1]
    assert np.array_equal(y[..., 64:], want)


@pytest.mark.parametrize("bad", ["x", "conv_w", "z", "x_dbl", "A_log", "dt_w"])
def test_both_directions_reject_bad_inputs(bad):
    arrays = [mx.array(a) for a in _bimamba_inputs(np.random.default_rng(4), 2, 5, 8, 1)]
    replaced = {"x": mx.zeros((2, 5, 15)), "z": mx.zeros((2, 5, 14)),
                "conv_w": mx.zeros((8, 4, 1)),
                "x_dbl": mx.zeros((2, 2, 5, 32)), "A_log": mx.zeros((2, 8, 8)),
                "dt_w": mx.zeros((8, 1))}[bad]
    names = ("x", "z", "conv_w", "conv_b", "u", "x_dbl", "A_log", "D", "dt_w", "dt_b")
    x, z, conv_w, conv_b, u, x_dbl, A_log, D, dt_w, dt_b = (
        replaced if name == bad else a for name, a in zip(names, arrays, strict=True))
    with pytest.raises(kernels.KernelInputError):
        if bad in ("x", "conv_w"):
            kernels.bimamba_conv(x, conv_w, conv_b)
        else:
            kernels.bimamba_scan(u, x_dbl, z, A_log, D, (dt_w, dt_b))


# ------------------------------------------------------------------- CPU library details ------

ISA_NAMES = {1: "AVX2", 2: "AVX-512"}


@needs_cpu_library
@pytest.mark.parametrize("strict", [False, True])
def test_cpu_thread_order_walk_matches_the_baseline(strict):
    """The GPU-style thread-order walk and the baseline (4-lane, no FMA) row walk are
    bit-identical: the same per-thread function in the same order of operations."""
    lib = kernels.cpu_library()
    args = _scan_inputs(np.random.default_rng(41), 3, 90, 72)  # 72: partial SIMD groups
    baseline = np.array(cpu_ops.cpu_scan(lib, *args, strict=strict, isa=0))
    threads = np.array(cpu_ops.cpu_scan(lib, *args, strict=strict, thread_order=True))
    assert np.array_equal(threads.view(np.uint32), baseline.view(np.uint32))


@needs_cpu_library
@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("isa", sorted(ISA_NAMES))
def test_cpu_isa_matches_the_baseline(isa, strict):
    """Each SIMD build agrees with the baseline. Strict mode never contracts, so they are
    bit-identical; standard mode lets the compiler fuse multiply-adds where the ISA has FMA
    (AVX2, AVX-512; also differently in the scalar tail of a partial SIMD group), so there they
    agree to rounding. An ISA this CPU lacks is skipped, by name: the library would quietly run
    the best one it has instead."""
    lib = kernels.cpu_library()
    if lib.isa(isa) != isa:
        pytest.skip(f"this CPU has no {ISA_NAMES[isa]} (best here: {lib.isa_name()})")
    args = _scan_inputs(np.random.default_rng(41), 3, 90, 72)
    baseline = np.array(cpu_ops.cpu_scan(lib, *args, strict=strict, isa=0))
    got = np.array(cpu_ops.cpu_scan(lib, *args, strict=strict, isa=isa))
    if strict:
        assert np.array_equal(got.view(np.uint32), baseline.view(np.uint32))
    else:
        assert _rel_rms(got, baseline) <= RTOL_SCAN


@needs_cpu_library
def test_cpu_threads_do_not_change_results(monkeypatch):
    args = _scan_inputs(np.random.default_rng(43), 7, 33, 64)
    monkeypatch.setenv("SPEECHLENS_CPU_THREADS", "1")
    one = np.array(kernels.selective_scan(*args, strict=True))
    monkeypatch.setenv("SPEECHLENS_CPU_THREADS", "3")
    three = np.array(kernels.selective_scan(*args, strict=True))
    assert np.array_equal(one.view(np.uint32), three.view(np.uint32))


@pytest.mark.parametrize("kernel", ["0", "1"])
def test_project_adds_the_residual_last(kernel, monkeypatch):
    """x + LayerNorm(x @ w0 + y @ w1 + b), the TF block's x + BiMamba(x): on CUDA the kernel
    ("1") adds x in its store, elsewhere MLX adds it; against float64."""
    monkeypatch.setenv("SPEECHLENS_CUDA_PROJECTION", kernel)
    rng = np.random.default_rng(45)
    x = rng.standard_normal((3, 41, 64)).astype(np.float32)
    y = rng.standard_normal((3, 41, 512)).astype(np.float32)
    w0 = (rng.standard_normal((64, 64)) / 8).astype(np.float32)
    w1 = (rng.standard_normal((512, 64)) / 23).astype(np.float32)
    b, gain, shift = (rng.standard_normal(64).astype(np.float32) for _ in range(3))
    xm = mx.array(x)
    norm = kernels.LayerNormSpec(mx.array(gain), mx.array(shift), 1e-5)
    out = np.array(kernels.project([(xm, mx.array(w0)), (mx.array(y), mx.array(w1))],
                                   mx.array(b), norm, residual=xm))
    want = x + _layer_norm64(x.astype(np.float64) @ w0 + y.astype(np.float64) @ w1 + b, gain,
                             shift, 1e-5)
    assert _rel_rms(out, want) <= RTOL_PROJECT


@needs_cpu_library
def test_cpu_isa_setting_picks_the_library_build(monkeypatch):
    """SPEECHLENS_CPU_ISA runs the build it names (a build this CPU lacks resolves to its
    best): the generic build's projection and scan equal the explicit isa=0 calls bit for bit,
    and kernel_info names it."""
    rng = np.random.default_rng(44)
    terms = [(mx.array(rng.standard_normal((2, 29, 64)).astype(np.float32)),
              mx.array(rng.standard_normal((64, 48)).astype(np.float32)))]
    scan = _scan_inputs(rng, 3, 21, 64)
    monkeypatch.setenv(kernels.CPU_ISA_ENV, "generic")
    assert kernels.cpu_isa() == 0 and kernels.kernel_info()["cpu_isa"].startswith("generic")
    chosen = np.array(kernels.project(terms))
    assert np.array_equal(chosen, np.array(cpu_ops.cpu_project(terms, None, isa=0)))
    chosen_scan = np.array(kernels.selective_scan(*scan))
    monkeypatch.delenv(kernels.CPU_ISA_ENV)
    explicit = np.array(cpu_ops.cpu_scan(kernels.cpu_library(), *scan, strict=False, isa=0))
    assert np.array_equal(chosen_scan, explicit)
    assert kernels.kernel_info()["cpu_isa"] == kernels.cpu_library().isa_name()


def test_cpu_isa_setting_is_checked(monkeypatch):
    for value, isa in (("", -1), ("best", -1), ("AVX512", 2), (" avx2 ", 1), ("generic", 0)):
        monkeypatch.setenv(kernels.CPU_ISA_ENV, value)
        assert kernels.cpu_isa() == isa
    monkeypatch.setenv(kernels.CPU_ISA_ENV, "sse9")
    with pytest.raises(UsageError, match="SPEECHLENS_CPU_ISA must be one of"):
        kernels.cpu_isa()


@needs_cpu_library
def test_exp_poly_accuracy_and_cutoff():
    x = np.linspace(-86.0, 0.0, 100_001).astype(np.float32)
    y = kernels.cpu_exp_poly(x)
    rel = np.abs(y.astype(np.float64) / np.exp(x.astype(np.float64)) - 1.0)
    assert rel.max() <= 3.8e-6
    assert np.array_equal(y.view(np.uint32), ref.reference_exp_poly(x).view(np.uint32))
    below = np.linspace(-1000.0, -87.7, 5_001).astype(np.float32)  # rint(x*log2 e) < -126
    assert np.all(np.rint(below.astype(np.float64) * np.log2(np.e)) < -126)
    assert np.all(kernels.cpu_exp_poly(below) == 0.0)
    assert kernels.cpu_exp_poly(np.array([-np.inf], np.float32))[0] == 0.0


#: 2^x in float32 on the standard decay's domain, against float64: the degree-5 polynomial's
#: 1.6e-7 (FMA) / 1.8e-7 (no FMA) plus the exact exponent-field scale; 2e-7 covers every ISA.
EXP2_DECAY_RTOL = 2e-7


@needs_cpu_library
@pytest.mark.parametrize("isa", [0, *sorted(ISA_NAMES)])
def test_exp2_decay_accuracy_and_cutoff(isa):
    """The standard-mode scan decay 2^x (x <= 0), each ISA build: max relative error over a
    dense grid where the result is a normal float, exactly 1 at 0, 2^-125 from -125 down (and
    for -inf), never above 1; a NaN stays NaN."""
    lib = kernels.cpu_library()
    if isa and lib.isa(isa) != isa:
        pytest.skip(f"this CPU has no {ISA_NAMES[isa]} (best here: {lib.isa_name()})")
    x = np.concatenate([np.linspace(-125.0, 0.0, 2_000_001), -np.geomspace(1e-30, 1.0, 10_001)])
    x = x.astype(np.float32)
    y = kernels.cpu_exp2_decay(x, isa=isa)
    rel = np.abs(y.astype(np.float64) / np.exp2(x.astype(np.float64)) - 1.0)
    assert rel.max() <= EXP2_DECAY_RTOL, rel.max()
    assert np.all(y <= 1.0)
    assert np.all(kernels.cpu_exp2_decay(np.float32([0.0, -0.0]), isa=isa) == 1.0)
    below = np.float32([-125.0, -127.0, -200.0, -1e30, -np.inf])
    assert np.array_equal(kernels.cpu_exp2_decay(below, isa=isa),
                          np.full(5, 2.0**-125, np.float32))
    assert np.isnan(kernels.cpu_exp2_decay(np.float32([np.nan]), isa=isa)).all()


@needs_cpu_library
def test_cpu_output_is_written_into_mlx_memory():
    """The result is an ordinary evaluated MLX array that later ops consume correctly."""
    args = _scan_inputs(np.random.default_rng(47), 2, 20, 16)
    out = kernels.selective_scan(*args)
    doubled = np.array(out * 2.0)
    assert np.array_equal(doubled, 2.0 * np.array(out))


@pytest.mark.slow
@pytest.mark.skipif(kernels.find_cxx() is None, reason="no C++ compiler")
def test_cpu_library_compiles_at_run_time(tmp_path):
    """The path used when pip could not build the library, or the kernel sources changed; the
    library reports the numbers it shares with the Python code (build.py's) back."""
    dest = kernels.compile_cpu_library(tmp_path / "lib.so", "testhash")
    lib = cpu_binding.CpuLibrary(dest)
    assert lib.source_hash == "testhash"
    assert lib.defines == build.KERNEL_DEFINES["cpu"]
    args = _scan_inputs(np.random.default_rng(53), 2, 30, 16)
    got = np.array(cpu_ops.cpu_scan(lib, *args, strict=False))
    assert _rel_rms(got, ref.reference_selective_scan(*_np(args))) <= RTOL_SCAN


@pytest.mark.slow
@pytest.mark.skipif(kernels.find_cxx() is None, reason="no C++ compiler")
def test_cpu_library_built_with_another_state_size_is_refused(tmp_path, monkeypatch):
    """A library compiled with a state size other than build.D_STATE would read the wrong
    number of B and C values per step: loading it fails and says which number differs."""
    other = dict(build.KERNEL_DEFINES["cpu"], SL_NSTATE=2 * build.D_STATE)
    monkeypatch.setitem(build.KERNEL_DEFINES, "cpu", other)
    dest = kernels.compile_cpu_library(tmp_path / "lib.so", "testhash")
    monkeypatch.undo()
    with pytest.raises(OSError, match=f"SL_NSTATE {2 * build.D_STATE} .build.py: "
                                      f"{build.D_STATE}."):
        cpu_binding.CpuLibrary(dest)


@pytest.mark.skipif(kernels.find_cxx() is None, reason="no C++ compiler")
@pytest.mark.parametrize("includes, which, dropped", [
    (["cpu_kernels.cpp"], "cpu", "SL_NSTATE"),
    (["metal_cpu_shim.h", "sl_backend_metal.h", "sl_mamba.h"], "metal", "SL_CONV_WIDTH"),
    (["cuda_cpu_shim.h", "sl_backend_cuda.h", "sl_mamba.h", "sl_gemm_cuda.h"], "cuda",
     "SL_GEMM_BM"),
])
def test_kernel_sources_do_not_compile_without_the_shared_numbers(tmp_path, includes, which,
                                                                  dropped):
    """The numbers build.py declares are not written again in the sources: compiled without
    one of its macros they stop at an #error instead of using a value of their own."""
    cpp = tmp_path / "only.cpp"
    cpp.write_text("".join(f'#include "{name}"\n' for name in includes))
    base = [*kernels.find_cxx().split(), "-std=c++17", "-fsyntax-only", "-Wno-psabi",
            f"-I{kernels.kernel_source_dir()}", str(cpp)]
    flags = build.define_flags(which)
    whole = subprocess.run([*base, *flags], capture_output=True, text=True, check=False)
    assert whole.returncode == 0, whole.stderr[-2000:]
    short = [flag for flag in flags if not flag.startswith(f"-D{dropped}=")]
    assert len(short) == len(flags) - 1
    proc = subprocess.run([*base, *short], capture_output=True, text=True, check=False)
    assert proc.returncode != 0 and "build.py" in proc.stderr, proc.stderr[-2000:]


def test_kernel_info_names_backend():
    info = kernels.kernel_info()
    assert info["backend"] in ("cpu", "metal", "cuda")
    assert info["mlx"] == mx.__version__


@needs_cpu_library
@pytest.mark.parametrize("threads", ["1", "3"])
def test_cpu_instance_norm_prelu_matches_float64(monkeypatch, threads):
    """The fused InstanceNorm + PReLU over time tiles agrees with a float64 InstanceNorm of the
    whole plane (float32 output rounding: 2e-6 absolute on unit-scale outputs), and the
    statistics do not depend on the thread count (bit-identical)."""
    monkeypatch.setenv("SPEECHLENS_CPU_THREADS", threads)
    rng = np.random.default_rng(53)
    x = (rng.standard_normal((2, 2100, 33, 16)) * 3.0 + 1.5).astype(np.float32)
    weight, bias = rng.uniform(0.5, 2.0, 16), rng.standard_normal(16)
    slope = rng.uniform(0.0, 0.5, 16)
    tiles = [mx.array(x[:, a:b]) for a, b in ((0, 700), (700, 1500), (1500, 2100))]
    out = kernels.instance_norm_prelu(tiles, *(mx.array(v.astype(np.float32))
                                               for v in (weight, bias)), 1e-5,
                                      mx.array(slope.astype(np.float32)))
    got = np.concatenate([np.array(tile) for tile in out], axis=1)
    xd = x.astype(np.float64)
    mean, var = xd.mean(axis=(1, 2), keepdims=True), xd.var(axis=(1, 2), keepdims=True)
    y = (xd - mean) / np.sqrt(var + 1e-5) * weight + bias
    want = np.where(y >= 0, y, slope * y)
    assert np.abs(got - want).max() <= 2e-6
    monkeypatch.setenv("SPEECHLENS_CPU_THREADS", "2")
    again = kernels.instance_norm_prelu(tiles, *(mx.array(v.astype(np.float32))
                                                 for v in (weight, bias)), 1e-5,
                                        mx.array(slope.astype(np.float32)))
    assert all(np.array_equal(np.array(a).view(np.uint32), np.array(b).view(np.uint32))
               for a, b in zip(out, again, strict=True))


RTOL_PROJECT = 2e-6  # relative RMS vs float64: float32 accuracy (TF32 alone is ~3e-4)


@pytest.mark.parametrize("rows_shape,ks,n,batched,bias", [
    ((3, 29), (64,), 512, False, False),  # in_proj, a [B, L, d]
    ((2, 70), (256,), 36, True, False),  # both directions' x_proj, batched weights
    ((5, 13), (64, 512), 64, False, True),  # the merge: two terms and a bias
    ((4, 7), (2,), 64, False, True),  # K = 2 (the encoder's first 1x1 conv): MLX's matmul
])
@pytest.mark.parametrize("kernel", ["0", "1"])
def test_project_matches_float64(rows_shape, ks, n, batched, bias, kernel, monkeypatch):
    """On CUDA "1" runs the tensor-core kernel (cuda_projection.py), "0" MLX's matmul; on the
    CPU both run the CPU library's projections."""
    monkeypatch.setenv("SPEECHLENS_CUDA_PROJECTION", kernel)
    rng = np.random.default_rng(sum(ks) + n)
    lead = (2,) if batched else ()
    a = [rng.standard_normal((*lead, *rows_shape, k)).astype(np.float32) for k in ks]
    w = [(rng.standard_normal((*lead, k, n)) / np.sqrt(k)).astype(np.float32) for k in ks]
    b = rng.standard_normal(n).astype(np.float32) if bias else None
    terms = [(mx.array(x), mx.array(y)) for x, y in zip(a, w, strict=True)]
    if batched:  # rows flattened per direction, as project_x passes them
        terms = [(x.reshape(2, -1, x.shape[-1]), y) for x, y in terms]
    out = np.array(kernels.project(terms, None if b is None else mx.array(b)))
    want = sum(np.einsum("...rk,...kn->...rn",
                         x.reshape(*lead, -1, x.shape[-1]).astype(np.float64), y)
               for x, y in zip(a, w, strict=True))
    if b is not None:
        want = want + b
    assert out.shape == ((2, int(np.prod(rows_shape)), n) if batched else (*rows_shape, n))
    assert _rel_rms(out.reshape(want.shape), want) <= RTOL_PROJECT


@pytest.mark.parametrize("fused", ["0", "1"])
@pytest.mark.parametrize("batch,length,channels", [(3, 29, 64), (2, 260, 256), (4, 2, 64)])
def test_project_conv_matches_float64(fused, batch, length, channels, monkeypatch):
    """kernels.project_conv, a BiMamba's in_proj conv-input half with both directions' conv: on
    CUDA "1" one kernel with the conv in the projection's store (tiles of 125 rows, so
    sequences of 29 and 260 steps cross tiles), "0" the projection and then the conv, as
    elsewhere. Against float64, and against the two calls of the same run."""
    monkeypatch.setenv(cuda_projection.PROJECT_CONV_ENV, fused)
    rng = np.random.default_rng(batch * length + channels)
    x = rng.standard_normal((batch, length, 64)).astype(np.float32)
    w = (rng.standard_normal((64, 2 * channels)) / 8).astype(np.float32)
    conv_w = (0.5 * rng.standard_normal((2, channels, 4, 1))).astype(np.float32)
    conv_b = (0.1 * rng.standard_normal((2, channels))).astype(np.float32)
    args = [mx.array(a) for a in (x, w, conv_w, conv_b)]
    got = np.array(kernels.project_conv(*args))
    want = ref.reference_bimamba_conv(x.astype(np.float64) @ w.astype(np.float64), conv_w,
                                      conv_b.astype(np.float64))
    assert got.shape == want.shape == (2, batch, length, channels)
    assert _rel_rms(got, want) <= RTOL_PROJECT
    two_calls = np.array(kernels.bimamba_conv(kernels.project([(args[0], args[1])]), *args[2:]))
    assert float(np.max(np.abs(got - two_calls))) <= 1e-6 * float(np.max(np.abs(want)))


@pytest.mark.parametrize("setting,arch,on", [
    (None, (9, 0), True),  # the default on a GPU that has the tensor-core instructions
    ("0", (9, 0), False), ("off", (9, 0), False), ("1", (9, 0), True),
    (None, (7, 5), False),  # no TF32 mma before compute capability 8.0
    (None, None, False),  # no CUDA at all
])
def test_projection_kernel_is_the_default_where_it_runs(setting, arch, on, monkeypatch):
    """The tensor-core projections run by default on compute capability 8.0+;
    SPEECHLENS_CUDA_PROJECTION=0 falls back to MLX's matmul."""
    if setting is None:
        monkeypatch.delenv(cuda_projection.PROJECTION_KERNEL_ENV, raising=False)
    else:
        monkeypatch.setenv(cuda_projection.PROJECTION_KERNEL_ENV, setting)
    monkeypatch.setattr(cuda_projection, "compute_capability", lambda: arch)
    monkeypatch.setattr(cuda_projection, "unusable", lambda: False)
    assert cuda_projection.enabled() is on


@needs_cpu_library
@pytest.mark.parametrize("isa", [0, *sorted(ISA_NAMES)])
@pytest.mark.parametrize("rows,ks,n,batch,bias", [
    (29, (64,), 512, 0, False),  # in_proj; 29 rows: a partial last row tile
    (70, (256,), 36, 2, False),  # x_proj, batched: 36 columns, a partial column block
    (13, (64, 512), 64, 0, True),  # the merge: two terms and a bias
    (1, (3,), 5, 0, True),  # one row, five columns
])
def test_cpu_project_matches_float64(isa, rows, ks, n, batch, bias):
    """The CPU library's projections, each ISA build, with `a` read through a row stride wider
    than K (a column slice, as the model's views are)."""
    lib = kernels.cpu_library()
    if isa and lib.isa(isa) != isa:
        pytest.skip(f"this CPU has no {ISA_NAMES[isa]} (best here: {lib.isa_name()})")
    rng = np.random.default_rng(rows + n)
    lead = (batch,) if batch else ()
    wide = [rng.standard_normal((*lead, rows, k + 3)).astype(np.float32) for k in ks]
    w = [(rng.standard_normal((*lead, k, n)) / np.sqrt(k)).astype(np.float32) for k in ks]
    b = rng.standard_normal(n).astype(np.float32) if bias else None
    terms = [(mx.array(x)[..., :k], mx.array(y)) for x, y, k in zip(wide, w, ks, strict=True)]
    out = np.array(cpu_ops.cpu_project(terms, None if b is None else mx.array(b), isa=isa))
    want = sum(np.einsum("...rk,...kn->...rn", x[..., :k].astype(np.float64), y)
               for x, y, k in zip(wide, w, ks, strict=True)) + (0.0 if b is None else b)
    assert out.shape == want.shape
    assert _rel_rms(out, want) <= RTOL_PROJECT


def _layer_norm64(y: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    mean = y.mean(axis=-1, keepdims=True)
    var = ((y - mean) ** 2).mean(axis=-1, keepdims=True)
    return (y - mean) / np.sqrt(var + eps) * weight + bias


@pytest.mark.parametrize("isa", [None, 0, *sorted(ISA_NAMES)])
@pytest.mark.parametrize("rows,ks,n", [
    (13, (64, 512), 64),  # the merge: two terms, then the BiMamba's LayerNorm
    (29, (64,), 36),  # columns past the last whole vector and column block
    (3, (3,), 5),  # fewer columns than a vector
])
@pytest.mark.parametrize("kernel", ["0", "1"])
def test_project_with_layer_norm_matches_float64(isa, rows, ks, n, kernel, monkeypatch):
    """kernels.project's LayerNorm of each output row (isa None: the default path of this
    backend, on CUDA the tensor-core kernel (which applies the LayerNorm itself where a block
    holds whole rows) for kernel "1", MLX's matmul and LayerNorm for "0"; else the CPU library's
    build for that ISA) against float64."""
    monkeypatch.setenv("SPEECHLENS_CUDA_PROJECTION", kernel)
    rng = np.random.default_rng(rows * n)
    a = [rng.standard_normal((2, rows, k)).astype(np.float32) for k in ks]
    w = [(rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32) for k in ks]
    b, gain, shift = (rng.standard_normal(n).astype(np.float32) for _ in range(3))
    terms = [(mx.array(x), mx.array(y)) for x, y in zip(a, w, strict=True)]
    norm = kernels.LayerNormSpec(mx.array(gain), mx.array(shift), 1e-5)
    if isa is None:
        out = kernels.project(terms, mx.array(b), norm)
    else:
        lib = kernels.cpu_library()
        if lib is None or (isa and lib.isa(isa) != isa):
            pytest.skip(f"no CPU library build for ISA {isa} here")
        out = cpu_ops.cpu_project(terms, mx.array(b), norm, isa=isa)
    want = _layer_norm64(sum(x.astype(np.float64) @ y for x, y in zip(a, w, strict=True)) + b,
                         gain, shift, 1e-5)
    assert _rel_rms(np.array(out), want) <= RTOL_PROJECT


@needs_cpu_library
@pytest.mark.parametrize("layer_norm", [False, True])
def test_cpu_project_is_the_same_on_one_and_two_threads(layer_norm, monkeypatch):
    rng = np.random.default_rng(70)
    terms = [(mx.array(rng.standard_normal((41, 64)).astype(np.float32)),
              mx.array(rng.standard_normal((64, 48)).astype(np.float32)))]
    norm = kernels.LayerNormSpec(mx.ones((48,)), mx.zeros((48,)), 1e-5) if layer_norm else None
    runs = []
    for threads in ("1", "2"):
        monkeypatch.setenv(kernels.CPU_THREADS_ENV, threads)
        runs.append(np.array(kernels.project(terms, None, norm)))
    assert np.array_equal(runs[0].view(np.uint32), runs[1].view(np.uint32))


# ---- the CPU's direct 2-D convolution (encoder and decoders) ----
# Tolerance: largest error <= 1e-6 of the largest output against float64 (measured 1-2e-7 at
# 3 x 3 x 192 inputs; BLAS's matmul form: 3.3e-7).
RTOL_CONV2D = 1e-6

CONV2D_CASES = [
    # plane channels, out channels, kernel, padding, dilation, frames, width
    ([64, 64, 64], 64, (3, 3), (4, 1), (4, 1), 37, 23),  # a dense layer: three planes
    ([3, 5], 8, (3, 3), (1, 1), (1, 1), 9, 7),  # planes of odd widths; 2 batch items
    ([16], 32, (1, 3), (0, 1), (1, 1), 20, 13),  # the decoders' (1, 3) conv
    ([7], 16, (3, 3), (0, 0), (2, 1), 12, 30),  # no padding: a smaller output
]


def _conv2d_inputs(rng, channels, out_channels, kernel, frames, width, batch=2):
    planes = [mx.array(rng.standard_normal((batch, frames, width, c)).astype(np.float32))
              for c in channels]
    weight = mx.array((rng.standard_normal((out_channels, *kernel, sum(channels))) * 0.1)
                      .astype(np.float32))
    bias = mx.array(rng.standard_normal(out_channels).astype(np.float32))
    return planes, weight, bias


def _conv2d_float64(planes, weight, bias, padding, dilation):
    x = np.concatenate([np.array(p, np.float64) for p in planes], axis=-1)
    w = np.array(weight, np.float64)
    (ph, pw), (dh, dw) = padding, dilation
    _, kh, kw, _ = w.shape
    x = np.pad(x, [(0, 0), (ph, ph), (pw, pw), (0, 0)])
    frames, width = x.shape[1] - dh * (kh - 1), x.shape[2] - dw * (kw - 1)
    y = np.zeros((x.shape[0], frames, width, w.shape[0])) + np.array(bias, np.float64)
    for i in range(kh):
        for j in range(kw):
            y += x[:, i * dh:i * dh + frames, j * dw:j * dw + width] @ w[:, i, j].T
    return y


@needs_cpu_library
@pytest.mark.parametrize("isa", [0, *sorted(ISA_NAMES)])
@pytest.mark.parametrize("case", range(len(CONV2D_CASES)))
def test_cpu_conv2d_matches_float64(isa, case):
    """Every ISA build, every padding, dilation and plane split, widths that do not fill the
    register tile; an ISA this CPU lacks is skipped by name."""
    lib = kernels.cpu_library()
    if isa and lib.isa(isa) != isa:
        pytest.skip(f"this CPU has no {ISA_NAMES[isa]} (best here: {lib.isa_name()})")
    channels, out_channels, kernel, padding, dilation, frames, width = CONV2D_CASES[case]
    planes, weight, bias = _conv2d_inputs(np.random.default_rng(50 + case), channels,
                                          out_channels, kernel, frames, width)
    got = np.array(cpu_ops.cpu_conv2d(planes, weight, bias, padding, dilation, isa=isa))
    expected = _conv2d_float64(planes, weight, bias, padding, dilation)
    assert got.shape == expected.shape
    assert np.abs(got - expected).max() <= RTOL_CONV2D * np.abs(expected).max()


@needs_cpu_library
def test_cpu_conv2d_is_the_same_on_one_and_two_threads(monkeypatch):
    planes, weight, bias = _conv2d_inputs(np.random.default_rng(60), [64, 64], 64, (3, 3),
                                          15, 11, batch=1)
    runs = []
    for threads in ("1", "2"):
        monkeypatch.setenv(kernels.CPU_THREADS_ENV, threads)
        runs.append(np.array(kernels.conv2d(planes, weight, bias, (2, 1), (2, 1))))
    assert np.array_equal(runs[0].view(np.uint32), runs[1].view(np.uint32))


@needs_cpu_library
def test_cpu_conv2d_declines_what_it_cannot_take():
    """The caller then runs the matmul form: None for output channels that are not a multiple
    of 8 and for planes of different sizes; no bias is fine."""
    rng = np.random.default_rng(61)
    planes, weight, _ = _conv2d_inputs(rng, [4], 12, (3, 3), 5, 5)
    assert kernels.conv2d(planes, weight, None, (1, 1), (1, 1)) is None
    planes, weight, _ = _conv2d_inputs(rng, [4, 4], 8, (3, 3), 5, 5)
    assert kernels.conv2d([planes[0], planes[1][:, 1:]], weight, None, (1, 1), (1, 1)) is None
    got = np.array(kernels.conv2d(planes, weight, None, (1, 1), (1, 1)))
    expected = _conv2d_float64(planes, weight, np.zeros(8), (1, 1), (1, 1))
    assert np.abs(got - expected).max() <= RTOL_CONV2D * np.abs(expected).max()


# What the CUDA conv takes (planes of one shape, channels per plane and out channels multiples of
# 16), shaped like the model's uses.
CUDA_CONV2D_CASES = [
    ([64, 64, 64, 64], 64, (3, 3), (8, 1), (8, 1), 21, 17),  # a dense block's last layer
    ([64], 128, (1, 3), (0, 1), (1, 1), 9, 13),  # the decoders' (1, 3) conv: two column blocks
    ([32, 32], 16, (3, 3), (0, 0), (2, 1), 12, 10),  # no padding: a smaller output
]


@pytest.mark.skipif(BACKEND != "cuda", reason="tests the CUDA conv kernel (no CUDA here): the "
                    "GPU suite runs it on an NVIDIA host (make gpu-test)")
@pytest.mark.parametrize("case", range(len(CUDA_CONV2D_CASES)))
def test_cuda_conv2d_matches_float64(case, monkeypatch):
    """The tensor-core conv on the GPU (its logic runs on the CPU in test_gemm_source.py)."""
    monkeypatch.delenv(cuda_conv2d.CONV_KERNEL_ENV, raising=False)
    channels, out_channels, kernel, padding, dilation, frames, width = CUDA_CONV2D_CASES[case]
    planes, weight, bias = _conv2d_inputs(np.random.default_rng(70 + case), channels,
                                          out_channels, kernel, frames, width)
    assert cuda_conv2d.enabled()
    got = kernels.conv2d(planes, weight, bias, padding, dilation)
    assert got is not None, "the kernel ran"
    expected = _conv2d_float64(planes, weight, bias, padding, dilation)
    assert got.shape == expected.shape
    assert np.abs(np.array(got) - expected).max() <= RTOL_CONV2D * np.abs(expected).max()


def test_cuda_conv2d_takes_only_what_it_can_read():
    """Declined operands go to the caller's matmul form: channels per plane or out channels
    not a multiple of 16, planes of different shapes or more than four, inputs that do not
    add up to the weight's."""
    def planes(*shapes):
        return [mx.zeros(shape) for shape in shapes]

    weight = mx.zeros((64, 3, 3, 128))
    assert cuda_conv2d.takes(planes((1, 5, 7, 64), (1, 5, 7, 64)), weight)
    assert not cuda_conv2d.takes(planes((1, 5, 7, 64), (1, 5, 6, 64)), weight)
    assert not cuda_conv2d.takes(planes((1, 5, 7, 64)), weight)
    assert not cuda_conv2d.takes(planes((1, 5, 7, 8)), mx.zeros((64, 3, 3, 8)))
    assert not cuda_conv2d.takes(planes((1, 5, 7, 64)), mx.zeros((12, 3, 3, 64)))
    assert not cuda_conv2d.takes(planes(*[(1, 5, 7, 16)] * 5), mx.zeros((16, 3, 3, 80)))


def test_projection_geometry_takes_well_formed_operands_only():
    """The one check both projection kernels (CPU, CUDA) start from."""
    from speechlens_cli.kernels.contract import projection_geometry

    def arr(*shape, dtype=mx.float32):
        return mx.zeros(shape, dtype)

    assert projection_geometry([(arr(3, 5, 8), arr(8, 12))], None) == (12, 1, 15)
    assert projection_geometry([(arr(2, 7, 8), arr(2, 8, 4))], arr(4)) == (4, 2, 7)
    assert projection_geometry([(arr(3, 8), arr(8, 4)), (arr(3, 6), arr(6, 4))],
                               arr(4)) == (4, 1, 3)
    declined = [
        ([(arr(3, 8), arr(7, 4))], None),  # K differs
        ([(arr(3, 8), arr(8, 4)), (arr(4, 6), arr(6, 4))], None),  # rows differ
        ([(arr(2, 3, 8), arr(2, 8, 4)), (arr(3, 3, 8), arr(3, 8, 4))], None),  # two NBs
        ([(arr(3, 0), arr(0, 4))], None),  # K = 0
        ([(arr(3, 8, dtype=mx.float16), arr(8, 4))], None),
        ([(arr(3, 8), arr(8, 4))], arr(5)),  # bias shape
        ([(arr(3, 8), arr(8, 4))], arr(4, dtype=mx.float16)),
        ([], None),
    ]
    for terms, bias in declined:
        assert projection_geometry(terms, bias) is None


# ------------------------------------------------------------------------ the dispatch table ----

def _bimamba_operands(rng, channels=64, rank=4):
    arrays = _bimamba_inputs(rng, 2, 9, channels, rank)
    x, z, conv_w, conv_b, u, x_dbl, A_log, D, dt_w, dt_b = (mx.array(a) for a in arrays)
    return (x, conv_w, conv_b), (u, x_dbl, z, A_log, D, (dt_w, dt_b), False)


def _representative_cases(rng):
    """(operation, operands as its dispatch passes them, what runs on the CPU with the library)
    for shapes the model passes and shapes an implementation declines."""
    x, weight, bias = _conv_inputs(rng, 2, 9, 8)
    scan = _scan_inputs(rng, 2, 9, 64)
    conv, biscan = _bimamba_operands(rng)
    a = mx.array(rng.standard_normal((2, 9, 64)).astype(np.float32))
    w = mx.array(rng.standard_normal((64, 48)).astype(np.float32))
    planes = [mx.array(rng.standard_normal((1, 6, 5, 8)).astype(np.float32))]
    w16 = mx.array(rng.standard_normal((16, 3, 3, 8)).astype(np.float32))
    w12 = mx.array(rng.standard_normal((12, 3, 3, 8)).astype(np.float32))
    tiles = [mx.array(rng.standard_normal((1, 4, 5, 16)).astype(np.float32))]
    ones, zeros = mx.ones((16,)), mx.zeros((16,))
    return [
        ("causal_conv1d", (x, weight, bias, True), "cpu-library"),
        ("causal_conv1d", (x.astype(mx.float16), weight, bias, False), "mlx"),  # not float32
        ("selective_scan", (*scan, False, None), "cpu-library"),
        ("bimamba_conv", conv, "cpu-library"),
        ("bimamba_scan", biscan, "cpu-library"),
        ("project", ([(a, w)], None, None, None), "cpu-library"),
        ("project", ([(a, w)] * 3, None, None, None), "mlx"),  # three terms: no kernel's
        ("project_conv", (a, mx.array(rng.standard_normal((64, 128)).astype(np.float32)),
                          conv[1], conv[2]), "project+bimamba_conv"),
        ("conv2d", (planes, w16, None, (1, 1), (1, 1)), "cpu-library"),
        ("conv2d", (planes, w12, None, (1, 1), (1, 1)), "caller-mlx"),  # O not a multiple of 8
        ("instance_norm_prelu", (tiles, ones, zeros, 1e-5, zeros), "cpu-library"),
    ]


@needs_cpu_library
def test_the_table_picks_what_the_dispatch_picked_before():
    """On the CPU with the library, each operation runs the implementation the dispatch took
    before the table (the library's, or MLX where the library declines the operands); and the
    public function gives what the chosen implementation gives."""
    for name, operands, want in _representative_cases(np.random.default_rng(61)):
        assert dispatch.chosen(name, *operands) == want, (name, dispatch.explain(name, *operands))
    x, weight, bias = _conv_inputs(np.random.default_rng(62), 2, 9, 8)
    assert np.array_equal(np.array(kernels.causal_conv1d(x, weight, bias)),
                          np.array(cpu_ops.cpu_conv(kernels.cpu_library(), x, weight, bias)))


@pytest.mark.usefixtures("on_cpu")
def test_without_the_library_every_operation_falls_back_and_says_why(monkeypatch):
    monkeypatch.setattr(dispatch, "cpu_library", lambda: None)
    for name, operands, _ in _representative_cases(np.random.default_rng(63)):
        trace = dispatch.explain(name, *operands)
        if name != "project_conv":  # the two calls: no library of its own
            assert trace[0][0] == "cpu-library" and trace[0][1].startswith(
                "skipped: no CPU kernel library"), (name, trace)
        assert trace[-1][1] == "ran" and trace[-1][0] in ("mlx", "per-direction",
                                                          "caller-mlx", "project+bimamba_conv")


@pytest.mark.usefixtures("on_cpu")
@pytest.mark.parametrize("variable", [kernels.DISABLE_CONV_ENV, kernels.DISABLE_CONV_ENV_ALIAS])
def test_a_disabled_kernel_names_its_variable(monkeypatch, variable):
    monkeypatch.setenv(variable, "yes")
    reason = f"turned off by {variable}=yes"
    table = kernels.dispatch_table()
    for name in ("causal_conv1d", "bimamba_conv"):
        assert table[name]["cpu"][0] == ["cpu-library", False, reason]
        assert table[name]["cpu"][-1][1:] == [True, None]
    assert table["selective_scan"]["cpu"][0][0] == "cpu-library"
    operands = _representative_cases(np.random.default_rng(64))[0][1]
    assert dispatch.explain("causal_conv1d", *operands) == [
        ("cpu-library", f"skipped: {reason}"), ("mlx", "ran")]


@pytest.mark.usefixtures("on_cpu")
@pytest.mark.parametrize("setting", ["SPEECHLENS_CUDA_PROJECTION", "SPEECHLENS_CUDA_CONV2D",
                                     "SPEECHLENS_CUDA_PROJECT_CONV"])
def test_a_cuda_switch_turned_off_names_its_variable(monkeypatch, setting):
    """On CUDA (compute capability 9.0 stood in) a tensor-core kernel whose switch is 0 is
    skipped with the variable as the reason, and its operation runs the next entry."""
    monkeypatch.setenv(setting, "0")
    monkeypatch.setattr(cuda_projection, "compute_capability", lambda: (9, 0))
    monkeypatch.setattr(cuda_projection, "unusable", lambda: False)
    monkeypatch.setattr(dispatch, "nvrtc", lambda: object())
    monkeypatch.setattr(dispatch, "compute_capability", lambda: (9, 0))
    monkeypatch.setattr(dispatch, "gpu_backend", lambda: "cuda")
    name = {"SPEECHLENS_CUDA_PROJECTION": "project", "SPEECHLENS_CUDA_CONV2D": "conv2d",
            "SPEECHLENS_CUDA_PROJECT_CONV": "project_conv"}[setting]
    rows = kernels.dispatch_table()[name]["cuda"]
    assert rows[0] == ["cuda-tensor-cores", False, f"turned off by {setting}=0"]
    assert rows[-1][1:] == [True, None]
    if name == "project":
        a = mx.array(np.ones((2, 9, 64), np.float32))
        w = mx.array(np.ones((64, 48), np.float32))
        assert dispatch.explain("project", [(a, w)], None, None, None, which="cuda") == [
            ("cuda-tensor-cores", f"skipped: turned off by {setting}=0"), ("mlx", "ran")]


def test_the_table_has_every_operation_on_every_backend():
    """Each operation lists every backend; the last entry of each runs wherever its backend
    does (no skip), so the walk always ends; a backend this MLX build lacks says so."""
    table = kernels.dispatch_table()
    assert list(table) == ["causal_conv1d", "selective_scan", "bimamba_conv", "bimamba_scan",
                           "project", "project_conv", "conv2d", "instance_norm_prelu"]
    for op in dispatch.OPERATIONS:
        assert list(op.table) == list(dispatch.BACKENDS)
        for which, impls in op.table.items():
            assert impls[-1].skip is None, (op.name, which)
            names = [impl.name for impl in impls]
            assert len(names) == len(set(names))
            rows = table[op.name][which]
            assert [row[0] for row in rows] == names
            missing = dispatch._backend_missing(which)
            assert all(row[1] == (row[2] is None) for row in rows)
            if missing:
                assert all(row == [row[0], False, missing] for row in rows)


def test_doctor_prints_the_table(tiny_checkpoint, monkeypatch):
    """doctor --json: checks.kernels.dispatch is the table for this machine (operation ->
    backend -> [implementation, available, reason]); the text report shows this backend's
    order per operation, and a skipped entry's reason."""
    monkeypatch.setenv(kernels.DISABLE_CONV_ENV, "1")
    report = json.loads(invoke("doctor", "--json", "--model", tiny_checkpoint).stdout)
    table = report["checks"]["kernels"]["dispatch"]
    assert table == kernels.dispatch_table()
    assert table["causal_conv1d"][BACKEND][0][1:] == [
        False, f"turned off by {kernels.DISABLE_CONV_ENV}=1"]
    text = invoke("doctor", "--model", tiny_checkpoint).stdout
    lines = [line.strip() for line in text.splitlines()]
    row = table["selective_scan"][BACKEND]
    assert "selective_scan: " + " > ".join(r[0] for r in row if r[1]) in lines
    assert any(line.startswith("causal_conv1d: ") and f"skipped: turned off by "
               f"{kernels.DISABLE_CONV_ENV}=1" in line for line in lines)
