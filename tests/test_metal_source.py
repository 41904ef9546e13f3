"""The Metal (and CUDA) kernel sources, compiled as C++ on the CPU and checked against float64.

Metal cannot run on Linux and CI has no NVIDIA GPU, so this test builds the *shipped* kernel
sources -- ``kernels/sl_backend_metal.h`` + ``kernels/sl_mamba.h`` + the ``*_body.h`` bodies, and
likewise the CUDA backend with its bodies (the conv body is shared; the CUDA scan has its own,
``selective_scan_cuda_body.h`` + ``sl_scan_cuda.h``, with B/C staged in shared memory) -- into a
CPU library, with a shim header for the few Metal/CUDA names they use
(``kernels/metal_cpu_shim.h``, ``kernels/cuda_cpu_shim.h``). The harness wraps each body in the
same signature MLX generates (pointers, ``<name>_shape`` and ``<name>_strides`` for the names the
body mentions, template constants) and runs one call per thread of the grid (CUDA: each block's
threads as concurrent std::threads, so the staged scan's shared memory and __syncthreads work as
on the GPU), so the bodies' indexing, strides, bounds checks and the per-thread logic are all
exercised. Differences from the GPU: the shims' fast exp/exp2/log are the C library's, and no
FMA contraction happens here (-ffp-contract=off).

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
from speechlens_cli.kernels import build, gpu

# Channel counts the harness instantiates (template DI); tests draw shapes from these. 256 (the
# model's) is a multiple of the CUDA scan's block, so it takes the staged path there.
DI_VALUES = (1, 3, 8, 17, 64, 256)
# Ranks of a fused dt projection the CUDA harness instantiates: the tiny test model's (1), the
# full model's (4), and one that is not a multiple of a float4 (6).
DT_RANKS = (1, 4, 6)
CUDA_THREADS = gpu.CUDA_SCAN_THREADS
CUDA_CHUNK = gpu.CUDA_SCAN_CHUNK
RTOL_SCAN = 1e-5  # relative RMS error vs float64
ATOL_CONV = 1e-5  # max abs error vs float64 (inputs ~N(0,1))


def _signature(which: str, inputs: tuple[str, ...], body: str) -> str:
    params = []
    for name in inputs:
        if which == "metal":
            params.append(f"const device float* {name}")
            if f"{name}_shape" in body:
                params.append(f"const constant int* {name}_shape")
            if f"{name}_strides" in body:
                params.append(f"const constant int64_t* {name}_strides")
        else:
            params.append(f"const float* {name}")
            if f"{name}_shape" in body:
                params.append(f"const Shape {name}_shape")
            if f"{name}_strides" in body:
                params.append(f"const Strides {name}_strides")
    params.append("device float* out" if which == "metal" else "float* out")
    if which == "metal":
        params.append("uint3 thread_position_in_grid")
    return ",\n    ".join(params)


def _harness(which: str) -> str:
    src = kernels.kernel_source_dir()
    conv_body = (src / "causal_conv1d_body.h").read_text()
    biconv_body = (src / "bimamba_conv_body.h").read_text()
    biscan_body = (src / "bimamba_scan_body.h").read_text()
    scan_file = "selective_scan_body.h" if which == "metal" else "selective_scan_cuda_body.h"
    scan_body = (src / scan_file).read_text()
    shim = "metal_cpu_shim.h" if which == "metal" else "cuda_cpu_shim.h"
    scan_template = ("template <int DI, int NS, bool STRICT>" if which == "metal" else
                     "template <int DI, int NS, bool STRICT, int R, int CHUNK, int TG>")
    scan_inputs = kernels.SCAN_INPUTS if which == "metal" else gpu.CUDA_SCAN_INPUTS
    lines = [
        f'#include "{shim}"',
        f'#include "sl_backend_{which}.h"',
        '#include "sl_mamba.h"',
        *(['#include "sl_scan_cuda.h"', '#include "sl_conv_cuda.h"'] if which == "cuda" else []),
        "#include <array>",
        "typedef std::array<int32_t, 10> Shape;",
        "typedef std::array<int64_t, 10> Strides;",
        "",
        "template <int DI, bool SILU>",
        f"void conv_kernel(\n    {_signature(which, kernels.CONV_INPUTS, conv_body)}) {{",
        '#include "causal_conv1d_body.h"',
        "}",
        "",
        "template <int DI, bool SILU>",
        f"void biconv_kernel(\n    {_signature(which, gpu.BICONV_INPUTS, biconv_body)}) {{",
        '#include "bimamba_conv_body.h"',
        "}",
        "",
        *([] if which != "metal" else [
            "template <int DI, int NS, bool STRICT>",
            f"void biscan_kernel(\n    {_signature(which, gpu.BISCAN_INPUTS, biscan_body)}) {{",
            '#include "bimamba_scan_body.h"',
            "}",
            "",
        ]),
        scan_template,
        f"void scan_kernel(\n    {_signature(which, scan_inputs, scan_body)}) {{",
        f'#include "{scan_file}"',
        "}",
        "",
        "namespace {",
        "const int kThreadgroup = 32;  // the grid is rounded up to whole groups",
    ]
    # Shape / stride arguments: Metal gets pointers, CUDA gets arrays by value.
    if which == "metal":
        lines += [
            "typedef const int* ShapeArg;",
            "typedef const int64_t* StridesArg;",
            "inline ShapeArg shape_arg(const int* p) { return p; }",
            "inline StridesArg strides_arg(const int64_t* p) { return p; }",
            "inline void set_thread(uint3& pos, unsigned g) { pos.x = g; pos.y = 0; pos.z = 0; }",
        ]
    else:
        lines += [
            "typedef Shape ShapeArg;",
            "typedef Strides StridesArg;",
            ("inline Shape shape_arg(const int* p) { Shape s{}; for (int i = 0; i < 4; ++i) "
             "s[i] = p[i]; return s; }"),
            ("inline Strides strides_arg(const int64_t* p) { Strides s{}; for (int i = 0; i < 4;"
             " ++i) s[i] = p[i]; return s; }"),
        ]
    lines.append("}  // namespace")

    def args(inputs, body):
        out = []
        for i, name in enumerate(inputs):
            out.append(f"in[{i}]")
            if f"{name}_shape" in body:
                out.append(f"shape_arg(shape[{i}])")
            if f"{name}_strides" in body:
                out.append(f"strides_arg(strides[{i}])")
        out.append("out")
        if which == "metal":
            out.append("pos")
        return ", ".join(out)

    def launch(call: str, block: str = "kThreadgroup") -> list[str]:
        if which == "metal":
            return ["    uint3 pos;",
                    ("    for (unsigned g = 0; g < rounded; ++g) { set_thread(pos, g); "
                     f"{call}; }}")]
        return [f"    sl_cuda_cpu_launch((threads + {block} - 1) / {block}, {block},",
                f"                       [&] {{ {call}; }});"]

    def runner(name: str, flag: str, kernel, inputs, body) -> list[str]:
        """run_<name>(di, <flag>, ...): kernel(di, flag) (its template call) at every DI, the
        flag off and on."""
        out = [
            f'extern "C" int run_{name}(int di, int {flag}, const float* const* in,',
            "    const int* const* shape, const int64_t* const* strides, float* out,",
            "    unsigned threads) {",
            "  const unsigned rounded = (threads + kThreadgroup - 1) / kThreadgroup"
            " * kThreadgroup;",
            "  (void)rounded;",
            f"  switch (di * 2 + ({flag} ? 1 : 0)) {{",
        ]
        for di in DI_VALUES:
            for on in (0, 1):
                out += [f"  case {di * 2 + on}: {{"]
                out += launch(f"{kernel(di, 'true' if on else 'false')}({args(inputs, body)})")
                out += ["    return 0;", "  }"]
        return out + ["  default: return -1;", "  }", "}", ""]

    lines += runner("conv", "silu", lambda di, on: f"conv_kernel<{di}, {on}>",
                    kernels.CONV_INPUTS, conv_body)
    lines += runner("biconv", "silu", lambda di, on: f"biconv_kernel<{di}, {on}>",
                    gpu.BICONV_INPUTS, biconv_body)
    if which == "metal":
        lines += runner("biscan", "strict", lambda di, on: f"biscan_kernel<{di}, 16, {on}>",
                        gpu.BISCAN_INPUTS, biscan_body)
    lines += [
        'extern "C" int run_scan(int di, int strict, int rank, const float* const* in,',
        "                        const int* const* shape, const int64_t* const* strides,",
        "                        float* out, unsigned threads) {",
        "  const unsigned rounded = (threads + kThreadgroup - 1) / kThreadgroup * kThreadgroup;",
        "  (void)rounded;",
        "  switch ((di * 2 + (strict ? 1 : 0)) * 64 + rank) {",
    ]
    for di in DI_VALUES:
        for strict in (0, 1):
            for rank in (0,) if which == "metal" else (0, *DT_RANKS):
                # CUDA: the launch geometry gpu.py uses (block size, staged chunk per mode)
                extra = ("" if which == "metal" else
                         f", {rank}, {CUDA_CHUNK[bool(strict)]}, {CUDA_THREADS}")
                call = (f"scan_kernel<{di}, 16, {'true' if strict else 'false'}{extra}>"
                        f"({args(scan_inputs, scan_body)})")
                lines += [f"  case {(di * 2 + strict) * 64 + rank}: {{"]
                lines += launch(call, "kThreadgroup" if which == "metal" else str(CUDA_THREADS))
                lines += ["    return 0;", "  }"]
    lines += ["  default: return -1;", "  }", "}", ""]
    lines += [
        'extern "C" void run_exp_poly(const float* x, float* y, long n) {',
        "  for (long i = 0; i < n; ++i) y[i] = sl_exp_poly(x[i]);",
        "}",
    ]
    return "\n".join(lines) + "\n"


_BUILT: dict[str, tuple[str, ctypes.CDLL]] = {}


def _build(which: str, tmp_path_factory) -> tuple[str, ctypes.CDLL]:
    """The harness library of one backend, built once per test session."""
    if which in _BUILT:
        return _BUILT[which]
    cxx = kernels.find_cxx()
    if cxx is None:
        pytest.skip("no C++ compiler (set CXX) to build the kernel sources on the CPU")
    folder = tmp_path_factory.mktemp(f"{which}_on_cpu")
    cpp = folder / f"{which}_harness.cpp"
    cpp.write_text(_harness(which))
    lib = folder / f"{which}_harness.so"
    cmd = [*cxx.split(), "-O1", "-std=c++17", "-ffp-contract=off", "-fPIC", "-shared", "-pthread",
           "-Wall", "-Wno-unknown-pragmas", "-Wno-unused-variable", *build.define_flags(which),
           f"-I{kernels.kernel_source_dir()}", "-o", str(lib), str(cpp)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stderr}"
    handle = ctypes.CDLL(str(lib))
    handle.run_exp_poly.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long]
    _BUILT[which] = (which, handle)
    return _BUILT[which]


@pytest.fixture(scope="module", params=["metal", "cuda"])
def harness(request, tmp_path_factory):
    return _build(request.param, tmp_path_factory)


@pytest.fixture(scope="module")
def cuda_harness(tmp_path_factory):
    return _build("cuda", tmp_path_factory)


@pytest.fixture(scope="module")
def metal_harness(tmp_path_factory):
    return _build("metal", tmp_path_factory)


def _pack(arrays):
    n = len(arrays)
    ptrs = (ctypes.c_void_p * n)(*[a.ctypes.data for a in arrays])
    shapes = [np.array(list(a.shape) + [0] * (4 - a.ndim), dtype=np.int32) for a in arrays]
    strides = [np.array([s // 4 for s in a.strides] + [0] * (4 - a.ndim), dtype=np.int64)
               for a in arrays]
    shape_p = (ctypes.c_void_p * n)(*[s.ctypes.data for s in shapes])
    stride_p = (ctypes.c_void_p * n)(*[s.ctypes.data for s in strides])
    return ptrs, shape_p, stride_p, (shapes, strides)


def _scan_inputs(rng, batch, length, channels, dt_shift=-1.0):
    """u and z as column slices of one [B, L, 2D] tensor and B, C as slices of [B, L, 36]
    (the model's layout), so the strided addressing is exercised."""
    xz = rng.standard_normal((batch, length, 2 * channels)).astype(np.float32)
    dbl = rng.standard_normal((batch, length, 36)).astype(np.float32)
    u, z = xz[..., :channels], xz[..., channels:]
    Bm, Cm = dbl[..., 4:20], dbl[..., 20:36]
    delta_raw = (rng.standard_normal((batch, length, channels)) + dt_shift).astype(np.float32)
    A_log = np.log(rng.uniform(0.5, 16.0, (channels, 16))).astype(np.float32)
    D = rng.standard_normal(channels).astype(np.float32)
    return u, delta_raw, A_log, Bm, Cm, D, z


def _run_scan(handle, args, strict, dt_proj=None):
    """args in SCAN_INPUTS order; on CUDA, ``dt_proj=(weight, bias)`` makes args[1] the dt
    projection's input (the fused form), otherwise placeholders are passed for them."""
    which, lib = handle
    u = args[0]
    batch, _, channels = u.shape
    rank = 0 if dt_proj is None else args[1].shape[2]
    if which == "cuda":
        weight, bias = dt_proj if dt_proj is not None else (np.zeros((1, 1), np.float32),
                                                            np.zeros(1, np.float32))
        args = (args[0], args[1], weight, bias, *args[2:])
    out = np.full(u.shape, np.nan, np.float32)
    ptrs, shp, strd, _keep = _pack(args)
    rc = lib.run_scan(channels, int(strict), rank, ptrs, shp, strd, out.ctypes.data_as(
        ctypes.c_void_p), batch * channels)
    assert rc == 0
    return out


def _rel_rms(out, want):
    return float(np.sqrt(np.mean((out - want) ** 2) / np.mean(want ** 2)))


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("batch,length,channels", [
    (1, 1, 1), (2, 1, 8), (3, 2, 17), (2, 3, 3), (2, 57, 64), (1, 500, 8), (4, 131, 17)])
def test_scan_source_matches_float64(harness, strict, batch, length, channels):
    which, _ = harness
    rng = np.random.default_rng(1000 * length + channels)
    args = _scan_inputs(rng, batch, length, channels)
    out = _run_scan(harness, args, strict)
    want = ref.reference_selective_scan(*args)
    assert np.all(np.isfinite(out)), f"{which}: unwritten or non-finite outputs"
    assert _rel_rms(out, want) <= RTOL_SCAN, f"{which} strict={strict}: {_rel_rms(out, want)}"


def test_scan_source_strict_finite_at_large_dt(harness):
    rng = np.random.default_rng(7)
    args = list(_scan_inputs(rng, 2, 40, 17))
    args[1] = np.full_like(args[1], 1000.0)  # softplus(1000) = 1000 = dt
    out = _run_scan(harness, args, strict=True)
    assert np.all(np.isfinite(out))
    assert _rel_rms(out, ref.reference_selective_scan(*args)) <= RTOL_SCAN


def test_scan_source_bit_identical_runs(harness):
    args = _scan_inputs(np.random.default_rng(3), 3, 77, 64)
    for strict in (False, True):
        first = _run_scan(harness, args, strict)
        assert np.array_equal(first.view(np.uint32), _run_scan(harness, args, strict).view(
            np.uint32))


@pytest.mark.parametrize("silu", [False, True])
@pytest.mark.parametrize("batch,length,channels", [(1, 1, 1), (2, 2, 3), (3, 3, 8), (2, 50, 17),
                                                   (1, 300, 64), (2, 20, 256)])
def test_conv_source_matches_float64(harness, batch, length, channels, silu):
    which, handle = harness
    rng = np.random.default_rng(length * 31 + channels)
    xz = rng.standard_normal((batch, length, 2 * channels)).astype(np.float32)
    x = xz[..., :channels]  # strided, as in the model
    weight = rng.standard_normal((channels, 4, 1)).astype(np.float32)  # MLX layout
    bias = rng.standard_normal(channels).astype(np.float32)
    out = np.full(x.shape, np.nan, np.float32)
    ptrs, shp, strd, _keep = _pack([x, weight, bias])
    assert handle.run_conv(channels, int(silu), ptrs, shp, strd,
                           out.ctypes.data_as(ctypes.c_void_p), batch * channels) == 0
    want = ref.reference_causal_conv1d(x, weight.transpose(0, 2, 1), bias)
    if silu:
        want = want / (1.0 + np.exp(-want))
    assert out.shape == want.shape
    assert float(np.max(np.abs(out - want))) <= ATOL_CONV, which


@pytest.mark.parametrize("silu", [False, True])
@pytest.mark.parametrize("batch,length,channels", [(1, 1, 1), (2, 3, 3), (2, 50, 17),
                                                   (1, 40, 256)])
def test_two_direction_conv_source_matches_float64(harness, batch, length, channels, silu):
    """bimamba_conv_body.h: [0] the causal conv of x's columns [0, D), [1] the causal conv
    of the time-reversed columns [D, 2D), written back in time order."""
    which, handle = harness
    rng = np.random.default_rng(length * 7 + channels)
    xs = rng.standard_normal((batch, length, 2 * channels)).astype(np.float32)
    weight = rng.standard_normal((2, channels, 4, 1)).astype(np.float32)
    bias = rng.standard_normal((2, channels)).astype(np.float32)
    out = np.full((2, batch, length, channels), np.nan, np.float32)
    ptrs, shp, strd, _keep = _pack([xs[..., :channels], xs[..., channels:], weight, bias])
    assert handle.run_biconv(channels, int(silu), ptrs, shp, strd,
                             out.ctypes.data_as(ctypes.c_void_p),
                             gpu.bimamba_conv_threads(which, batch, channels)) == 0
    for k in (0, 1):
        x = xs[..., k * channels:(k + 1) * channels]
        want = ref.reference_causal_conv1d(x[:, ::-1] if k else x, weight[k].transpose(0, 2, 1),
                                           bias[k])
        want = want[:, ::-1] if k else want
        if silu:
            want = want / (1.0 + np.exp(-want))
        assert float(np.max(np.abs(out[k] - want))) <= ATOL_CONV, (which, k)


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("batch,length,channels", [(1, 1, 1), (2, 9, 17), (2, 40, 256)])
def test_metal_two_direction_scan_source_matches_float64(metal_harness, strict, batch, length,
                                                         channels):
    """bimamba_scan_body.h: columns [0, D) the scan of the sequence, [D, 2D) the scan of the
    time-reversed sequence written back in time order; B, C as column views of x_dbl."""
    _, handle = metal_harness
    rng = np.random.default_rng(length * 13 + channels)
    u = rng.standard_normal((2, batch, length, channels)).astype(np.float32)
    delta_raw = (rng.standard_normal((2, batch, length, channels)) - 1.0).astype(np.float32)
    z = rng.standard_normal((batch, length, 2 * channels)).astype(np.float32)
    dbl = rng.standard_normal((2, batch, length, 36)).astype(np.float32)
    A_log = np.log(rng.uniform(0.5, 16.0, (2, channels, 16))).astype(np.float32)
    D = rng.standard_normal((2, channels)).astype(np.float32)
    out = np.full((batch, length, 2 * channels), np.nan, np.float32)
    ptrs, shp, strd, _keep = _pack([u, delta_raw, z[..., :channels], z[..., channels:],
                                    dbl[..., 4:20], dbl[..., 20:], A_log, D])
    assert handle.run_biscan(channels, int(strict), ptrs, shp, strd,
                             out.ctypes.data_as(ctypes.c_void_p), 2 * batch * channels) == 0
    for k in (0, 1):
        def order(a, k=k):
            return a[:, ::-1] if k else a
        want = order(ref.reference_selective_scan(
            order(u[k]), order(delta_raw[k]), A_log[k], order(dbl[k][..., 4:20]),
            order(dbl[k][..., 20:]), D[k], order(z[..., k * channels:(k + 1) * channels])))
        assert _rel_rms(out[..., k * channels:(k + 1) * channels], want) <= RTOL_SCAN, k


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("batch,length", [(1, 1), (2, 16), (3, 33), (2, 70)])
def test_scan_source_model_width(harness, strict, batch, length):
    """D = 256, the model's: on CUDA a multiple of the block, so B/C are staged in shared memory
    (chunks of 16/32 steps; lengths below, at and past a chunk, and not a multiple of it)."""
    which, _ = harness
    args = _scan_inputs(np.random.default_rng(length), batch, length, 256)
    out = _run_scan(harness, args, strict)
    assert np.all(np.isfinite(out)), f"{which}: unwritten or non-finite outputs"
    assert _rel_rms(out, ref.reference_selective_scan(*args)) <= RTOL_SCAN, which


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("rank", DT_RANKS)
@pytest.mark.parametrize("batch,length,channels", [(2, 1, 17), (3, 45, 17), (2, 16, 256),
                                                   (2, 70, 256)])
def test_cuda_scan_source_fuses_the_dt_projection(cuda_harness, strict, rank, batch, length,
                                                  channels):
    """The CUDA scan given the dt projection's rank-R input (a strided slice of the x_proj
    output, as the model passes it) matches float64 with delta_raw = bias + input @ weight.T,
    staged (D = 256) and in place (D = 17), and stays bit-identical from run to run."""
    rng = np.random.default_rng(100 * rank + length)
    u, _, A_log, _, _, D, z = _scan_inputs(rng, batch, length, channels)
    dbl = rng.standard_normal((batch, length, rank + 32)).astype(np.float32)
    dt_low, Bm, Cm = dbl[..., :rank], dbl[..., rank:rank + 16], dbl[..., rank + 16:]
    weight = (rng.standard_normal((channels, rank)) / np.sqrt(rank)).astype(np.float32)
    bias = (rng.standard_normal(channels) - 1.0).astype(np.float32)
    args = (u, dt_low, A_log, Bm, Cm, D, z)
    out = _run_scan(cuda_harness, args, strict, dt_proj=(weight, bias))
    delta_raw = bias.astype(np.float64) + dt_low.astype(np.float64) @ weight.T.astype(np.float64)
    want = ref.reference_selective_scan(u, delta_raw, A_log, Bm, Cm, D, z)
    assert np.all(np.isfinite(out)), "unwritten or non-finite outputs"
    assert _rel_rms(out, want) <= RTOL_SCAN, _rel_rms(out, want)
    again = _run_scan(cuda_harness, args, strict, dt_proj=(weight, bias))
    assert np.array_equal(out.view(np.uint32), again.view(np.uint32))


@pytest.mark.parametrize("channels", [17, 256])
def test_scan_source_unaligned_bc(harness, channels):
    """B and C at an odd offset (no float4 loads possible) and with a state stride of 2."""
    which, _ = harness
    rng = np.random.default_rng(11)
    u, delta_raw, A_log, _, _, D, z = _scan_inputs(rng, 2, 41, channels)
    dbl = rng.standard_normal((2, 41, 70)).astype(np.float32)
    Bm, Cm = dbl[..., 1:17], dbl[..., 37:69:2]
    args = (u, delta_raw, A_log, Bm, Cm, D, z)
    for strict in (False, True):
        out = _run_scan(harness, args, strict)
        assert _rel_rms(out, ref.reference_selective_scan(*args)) <= RTOL_SCAN, (which, strict)


def test_exp_poly_source_is_the_reference_polynomial(harness):
    """The backend's strict decay exponential is bit-for-bit the float32 emulation in
    tests/reference.py: max relative error <= 3.8e-6 on [-86, 0], exactly 0 below the cutoff."""
    which, handle = harness
    x = np.linspace(-86.0, 0.0, 100_001).astype(np.float32)
    low = np.linspace(-300.0, -87.5, 2_001).astype(np.float32)
    for grid in (x, low):
        y = np.empty_like(grid)
        handle.run_exp_poly(grid.ctypes.data, y.ctypes.data, grid.size)
        assert np.array_equal(y.view(np.uint32), ref.reference_exp_poly(grid).view(np.uint32)), \
            which
    y = np.empty_like(x)
    handle.run_exp_poly(x.ctypes.data, y.ctypes.data, x.size)
    rel = np.abs(y.astype(np.float64) / np.exp(x.astype(np.float64)) - 1.0)
    assert rel.max() <= 3.8e-6
