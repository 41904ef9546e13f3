"""The CUDA tensor-core kernels (kernels/sl_gemm_cuda.h: the projection, projection_cuda_body.h,
the in_proj with the Mamba conv in its store, project_conv_cuda_body.h, and the direct 2-D
convolution, conv2d_cuda_body.h), compiled as C++ on the CPU and checked against float64.

CI has no NVIDIA GPU, so the shipped body is built into a CPU library with the CUDA shim, whose
``sl_mma_tf32`` emulates the warp-wide tensor-core product from PTX's fragment layout (each
block's threads run concurrently, so the warp's lanes meet as on the GPU) and whose ``sl_tf32``
is the TF32 rounding. That checks the tiling, staging, bounds, batching, the second term and the
bias, and that splitting each operand into two TF32 parts keeps float32 accuracy (the emulated
sum is truncated, as the tensor core's is, so an accumulation that drifts fails here as it did on
an H200). Whether the GPU lays out fragments as emulated here is checked on a GPU
(tests/test_kernels.py::test_project_matches_float64 and test_cuda_conv2d_matches_float64 run
the kernels there).

Skips only if no C++ compiler is found.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference as ref

from speechlens_cli import kernels
from speechlens_cli.kernels import build

# (N, K0, LDA0, K1, LDA1, BN, NB, BIAS, NORM, RESIDUAL): the template variants the harness
# instantiates, shaped like the model's uses (in_proj from a column range of a wider parent, the
# batched x_proj with N not a multiple of the tile, two terms with a bias, the merge's own
# K = 64 + 512, where a drifting accumulation shows, the merge with its LayerNorm, and with the
# residual x + f(x) too) plus K tails below a slice, and a residual without a LayerNorm read
# through a wider row stride over two column blocks.
VARIANTS = (
    (64, 64, 128, 0, 4, 64, 1, False, False, False),
    (36, 64, 64, 0, 4, 48, 2, False, False, False),
    (64, 96, 96, 32, 32, 64, 1, True, False, False),
    (64, 64, 64, 512, 512, 64, 1, True, False, False),
    (24, 36, 40, 12, 12, 16, 1, True, False, False),
    (64, 64, 64, 512, 512, 64, 1, True, True, False),
    (32, 20, 20, 0, 4, 32, 1, False, True, False),
    (64, 64, 64, 512, 512, 64, 1, True, True, True),
    (128, 128, 132, 0, 4, 64, 1, True, False, True),
)
# (N, BN, C, NP, KH, KW, PH, PW, DH, DW, WIDTH, OW, BIAS): the conv variants, shaped like the
# model's (a dense block's last layer: four planes, dilation 8 in time; its first layer; the
# decoders' (1, 3) conv with two column blocks, the second partial) plus a conv without padding
# whose output is smaller than its input.
CONV_VARIANTS = (
    (16, 16, 16, 4, 3, 3, 8, 1, 8, 1, 9, 9, True),
    (64, 64, 32, 1, 3, 3, 1, 1, 1, 1, 7, 7, True),
    (80, 64, 16, 1, 1, 3, 0, 1, 1, 1, 5, 5, True),
    (16, 16, 16, 2, 3, 3, 0, 0, 2, 1, 6, 4, False),
)
# (K0, LDA0, DI, BN): the in_proj with the conv in its store, as the full model (d = 64, D = 256)
# and the tiny one (D = 64) run it, and a narrower column block read from a wider row.
PROJECT_CONV_VARIANTS = (
    (64, 64, 256, 64),
    (32, 32, 64, 64),
    (20, 24, 32, 16),
)
EPS = 1e-5
# 3xTF32 keeps float32's accuracy: the error of a K-term float32 dot product, relative to the
# RMS of the result, stays near 1e-7 * sqrt(K); TF32 alone would be ~1e-3. A LayerNorm'd row has
# unit variance, so the same bound holds for it.
RTOL = 2e-6


def _harness() -> str:
    lines = ['#include "cuda_cpu_shim.h"', '#include "sl_backend_cuda.h"',
             '#include "sl_mamba.h"', '#include "sl_gemm_cuda.h"', "",
             "template <int N, int K0, int LDA0, int K1, int LDA1, int BN, int NB, bool BIAS,",
             "          bool NORM, bool RESIDUAL>",
             "void projection(const float* a0, const float* w0, const float* a1,",
             "                const float* w1, const float* bias, const float* norm_w,",
             "                const float* norm_b, float* out, int B, int L) {",
             f"  constexpr float EPS = {EPS!r}f;",
             '#include "projection_cuda_body.h"', "}", ""]
    for i, (n, k0, lda0, k1, lda1, bn, nb, bias, norm, residual) in enumerate(VARIANTS):
        args = (f"{n}, {k0}, {lda0}, {k1}, {lda1}, {bn}, {nb}, {str(bias).lower()}, "
                f"{str(norm).lower()}, {str(residual).lower()}")
        lines += [
            f'extern "C" void run_{i}(const float* a0, const float* w0, const float* a1,',
            "    const float* w1, const float* bias, const float* norm_w, const float* norm_b,",
            "    float* out, int B, int L) {",
            f"  const unsigned blocks = {nb} * ((B * L + SL_GEMM_BM - 1) / SL_GEMM_BM)"
            f" * (({n} + {bn} - 1) / {bn});",
            "  sl_cuda_cpu_launch(blocks, SL_GEMM_THREADS,",
            f"    [=] {{ projection<{args}>(a0, w0, a1, w1, bias, norm_w, norm_b, out, B, L); }});",
            "}"]
    lines += ["template <int N, int BN, int C, int NP, int KH, int KW, int PH, int PW, int DH,",
              "          int DW, int WIDTH, int OW, bool BIAS>",
              "void conv2d(const float* x0, const float* x1, const float* x2, const float* x3,",
              "            const float* w, const float* bias, float* out, int B, int L) {",
              '#include "conv2d_cuda_body.h"', "}", ""]
    for i, variant in enumerate(CONV_VARIANTS):
        n, bn, _, _, kh, _, ph, _, dh = variant[:9]
        args = ", ".join(str(v).lower() for v in variant)
        ow = variant[11]
        lines += [
            f'extern "C" void conv_{i}(const float* x0, const float* x1, const float* x2,',
            "    const float* x3, const float* w, const float* bias, float* out, int B, int L) {",
            f"  const int rows = B * (L + {2 * ph - dh * (kh - 1)}) * {ow};",
            f"  const unsigned blocks = (rows + SL_GEMM_BM - 1) / SL_GEMM_BM * (({n} + {bn} - 1)"
            f" / {bn});",
            "  sl_cuda_cpu_launch(blocks, SL_GEMM_THREADS,",
            f"    [=] {{ conv2d<{args}>(x0, x1, x2, x3, w, bias, out, B, L); }});",
            "}"]
    lines += ["template <int K0, int LDA0, int DI, int BN>",
              "void project_conv(const float* a0, const float* w0, const float* conv_w,",
              "                  const float* conv_b, float* out, int B, int L) {",
              '#include "project_conv_cuda_body.h"', "}", ""]
    for i, (k0, lda0, di, bn) in enumerate(PROJECT_CONV_VARIANTS):
        lines += [
            f'extern "C" void project_conv_{i}(const float* a0, const float* w0,',
            "    const float* conv_w, const float* conv_b, float* out, int B, int L) {",
            f"  const unsigned blocks = (B * L + SL_GEMM_BM - SL_CONV_HALO - 1) /"
            f" (SL_GEMM_BM - SL_CONV_HALO) * (2 * {di} / {bn});",
            "  sl_cuda_cpu_launch(blocks, SL_GEMM_THREADS,",
            f"    [=] {{ project_conv<{k0}, {lda0}, {di}, {bn}>(a0, w0, conv_w, conv_b, out, B, L);"
            " });",
            "}"]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    cxx = kernels.find_cxx()
    if cxx is None:
        pytest.skip("no C++ compiler (set CXX) to build the kernel sources on the CPU")
    folder = tmp_path_factory.mktemp("gemm_on_cpu")
    cpp, lib = folder / "gemm_harness.cpp", folder / "gemm_harness.so"
    cpp.write_text(_harness())
    cmd = [*cxx.split(), "-O1", "-std=c++17", "-ffp-contract=off", "-fPIC", "-shared", "-pthread",
           "-Wall", "-Wno-unknown-pragmas", *build.define_flags("cuda"),
           f"-I{kernels.kernel_source_dir()}", "-o", str(lib), str(cpp)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stderr}"
    return ctypes.CDLL(str(lib))


def _run(lib, variant: int, batch: int, length: int, seed: int):
    n, k0, lda0, k1, lda1, _, nb, bias, norm, residual = VARIANTS[variant]
    rng = np.random.default_rng(seed)
    rows = batch * length
    a0 = rng.standard_normal((nb, rows, lda0)).astype(np.float32)  # columns [0, K0) are read
    a1 = rng.standard_normal((nb, rows, lda1)).astype(np.float32)
    w0 = rng.standard_normal((nb, k0, n)).astype(np.float32)
    w1 = rng.standard_normal((nb, max(k1, 1), n)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    norm_w = (1 + 0.5 * rng.standard_normal(n)).astype(np.float32)
    norm_b = rng.standard_normal(n).astype(np.float32)
    out = np.full((nb, rows, n), np.nan, np.float32)
    ptr = [x.ctypes.data_as(ctypes.c_void_p) for x in (a0, w0, a1, w1, b, norm_w, norm_b, out)]
    getattr(lib, f"run_{variant}")(*ptr, batch, length)
    want = np.einsum("brk,bkn->brn", a0[..., :k0].astype(np.float64), w0.astype(np.float64))
    if k1:
        want += np.einsum("brk,bkn->brn", a1[..., :k1].astype(np.float64),
                          w1.astype(np.float64))
    if bias:
        want += b
    if norm:
        centred = want - want.mean(axis=-1, keepdims=True)
        want = (centred / np.sqrt((centred ** 2).mean(axis=-1, keepdims=True) + EPS)
                * norm_w + norm_b)
    if residual:
        want += a0[..., :n]
    return out, want


@pytest.mark.parametrize("variant", range(len(VARIANTS)))
@pytest.mark.parametrize("batch,length", [(1, 1), (3, 29), (2, 70)])
def test_projection_source_matches_float64(harness, variant, batch, length):
    out, want = _run(harness, variant, batch, length, seed=100 * variant + length)
    assert np.isfinite(out).all(), "every output element is written"
    scale = np.sqrt(np.mean(want ** 2))
    err = np.sqrt(np.mean((out - want) ** 2)) / scale
    assert err <= RTOL, f"rel-RMS error {err:.2e} > {RTOL:.0e}"
    # tf32 alone would miss the bound by far: the low parts carry real weight. The bound scales
    # with the result: sqrt(K) for these unnormalised products, 1 for a LayerNorm'd row
    k = VARIANTS[variant][1] + VARIANTS[variant][3]
    assert np.max(np.abs(out - want)) <= 4e-5 * min(scale, np.sqrt(k))


def test_projection_source_bit_identical_runs(harness):
    first, _ = _run(harness, 2, 3, 29, seed=7)
    again, _ = _run(harness, 2, 3, 29, seed=7)
    assert np.array_equal(first, again)


def _conv_float64(planes, weight, bias, padding, dilation):
    """[B, OH, OW, O] of the stride-1 conv of the planes' concatenation, weight [kh, kw, I, O]."""
    x = np.pad(np.concatenate(planes, axis=-1).astype(np.float64),
               [(0, 0), (padding[0],) * 2, (padding[1],) * 2, (0, 0)])
    kh, kw = weight.shape[:2]
    frames = x.shape[1] - dilation[0] * (kh - 1)
    width = x.shape[2] - dilation[1] * (kw - 1)
    y = np.zeros((x.shape[0], frames, width, weight.shape[-1])) + bias
    for i in range(kh):
        for j in range(kw):
            rows = x[:, i * dilation[0]:i * dilation[0] + frames,
                     j * dilation[1]:j * dilation[1] + width]
            y += rows @ weight[i, j].astype(np.float64)
    return y


@pytest.mark.parametrize("variant", range(len(CONV_VARIANTS)))
@pytest.mark.parametrize("batch,height", [(1, 11), (2, 13)])
def test_conv2d_source_matches_float64(harness, variant, batch, height):
    """Every tap, plane and channel slice lands on the right pixel, zeros outside the planes,
    partial row and column blocks, batches; float32 accuracy."""
    n, _, c, nplanes, kh, kw, ph, pw, dh, dw, width, ow, bias = CONV_VARIANTS[variant]
    rng = np.random.default_rng(10 * variant + height)
    planes = [rng.standard_normal((batch, height, width, c)).astype(np.float32)
              for _ in range(nplanes)]
    weight = rng.standard_normal((kh, kw, nplanes * c, n)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32) if bias else np.zeros(n, np.float32)
    out_height = height + 2 * ph - dh * (kh - 1)
    out = np.full((batch, out_height, ow, n), np.nan, np.float32)
    inputs = planes + [planes[0]] * (4 - nplanes) + [weight, b, out]
    getattr(harness, f"conv_{variant}")(
        *[x.ctypes.data_as(ctypes.c_void_p) for x in inputs], batch, height)
    want = _conv_float64(planes, weight, b, (ph, pw), (dh, dw))
    assert want.shape == out.shape and np.isfinite(out).all(), "every output element is written"
    scale = np.sqrt(np.mean(want ** 2))
    err = np.sqrt(np.mean((out - want) ** 2)) / scale
    assert err <= RTOL, f"rel-RMS error {err:.2e} > {RTOL:.0e}"


@pytest.mark.parametrize("variant", range(len(PROJECT_CONV_VARIANTS)))
@pytest.mark.parametrize("batch,length", [(1, 1), (1, 3), (3, 29), (2, 130), (5, 61)])
def test_project_conv_source_matches_float64(harness, variant, batch, length):
    """Tiles that start three rows early (forward) or end three rows late (backward), taps that
    cross a tile's edge or a sequence's, sequences shorter than the taps and longer than a tile,
    and the last partial tile; float32 accuracy."""
    k0, lda0, di, _ = PROJECT_CONV_VARIANTS[variant]
    rng = np.random.default_rng(1000 * variant + length)
    a0 = rng.standard_normal((batch * length, lda0)).astype(np.float32)  # [0, K0) are read
    w0 = (rng.standard_normal((k0, 2 * di)) / np.sqrt(k0)).astype(np.float32)
    conv_w = (0.5 * rng.standard_normal((2, di, 4, 1))).astype(np.float32)
    conv_b = (0.1 * rng.standard_normal((2, di))).astype(np.float32)
    out = np.full((2, batch, length, di), np.nan, np.float32)
    getattr(harness, f"project_conv_{variant}")(
        *[v.ctypes.data_as(ctypes.c_void_p) for v in (a0, w0, conv_w, conv_b, out)], batch,
        length)
    x = (a0[:, :k0].astype(np.float64) @ w0.astype(np.float64)).reshape(batch, length, 2 * di)
    want = ref.reference_bimamba_conv(x, conv_w.astype(np.float64), conv_b.astype(np.float64))
    assert np.isfinite(out).all(), "every output element is written"
    err = np.sqrt(np.mean((out - want) ** 2)) / np.sqrt(np.mean(want ** 2))
    assert err <= RTOL, f"rel-RMS error {err:.2e} > {RTOL:.0e}"
