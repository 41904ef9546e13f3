"""The CUDA kernels compiled once per machine (kernels/cuda_packed.py, kernels/nvrtc.py).

No GPU here, so three things are checked apart:
* the generated ``extern "C"`` wrappers, compiled as C++ with the CUDA shim and called the way
  MLX calls a precompiled kernel (input pointers, the output, then the int scalars B and L)
  on parents laid out as the model's x, z, u and x_dbl (both directions of a BiMamba),
  against float64: this proves the offsets, the rebuilt shapes and strides, the backward
  direction's reversed walk and the argument order;
* every variant the model launches compiles with NVRTC for sm_80 and sm_90 (skipped by name
  where no NVRTC library is installed; the dev extra installs one on Linux x86-64);
* the disk cache: a variant is compiled once, then read; an unwritable cache still works;
  no NVRTC means None (the caller uses MLX's JIT kernels).
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference as ref

from speechlens_cli import kernels
from speechlens_cli.kernels import cuda_conv2d, cuda_packed, cuda_projection, gpu, nvrtc
from speechlens_cli.kernels.sources import source

RTOL = 1e-5  # relative RMS error vs float64
ATOL_CONV = 1e-5
RANK = 4  # the full model's dt rank


def _variant(kind, channels, rank=None, strict=None):
    """(name, wrapper source, template) of a variant, exactly as cuda_packed builds it."""
    if kind == "biconv":
        parts, template = cuda_packed.biconv_parts(channels), cuda_packed.conv_template(channels)
    else:
        parts = cuda_packed.biscan_parts(channels, rank)
        template = cuda_packed.scan_template(channels, rank, strict, gpu.CUDA_SCAN_THREADS)
    name, text = cuda_packed.variant_source(kind, parts, template)
    return name, text, template


CPU_VARIANTS = [("biconv", c, None, None) for c in (17, 256)] + [
    ("biscan", c, r, s) for c in (17, 256) for s in (False, True) for r in (1, RANK)]
#: Inputs of each kind as its dispatch function passes them.
N_INPUTS = {"biconv": 4, "biscan": 10}


def _runner(name, n_inputs, block):
    args = [f"(const float*)p[{i}]" for i in range(n_inputs)] + [f"(float*)p[{n_inputs}]"]
    return (f'extern "C" void run_{name}(void** p, int B, int L, unsigned threads) {{\n'
            f"  sl_cuda_cpu_launch((threads + {block} - 1) / {block}, {block}, [&] {{ "
            f"{name}({', '.join(args)}, B, L); }});\n}}\n")


@pytest.fixture(scope="module")
def cpu_wrappers(tmp_path_factory):
    """The wrappers of CPU_VARIANTS in one C++ library, with a runner per variant."""
    cxx = kernels.find_cxx()
    if cxx is None:
        pytest.skip("no C++ compiler (set CXX) to build the kernel sources on the CPU")
    parts = ['#include "cuda_cpu_shim.h"']
    seen_header = False
    for kind, channels, rank, strict in CPU_VARIANTS:
        name, text, template = _variant(kind, channels, rank, strict)
        header = source("sl_backend_cuda.h") + source("sl_mamba.h")
        if seen_header:  # the headers once per translation unit; they are include-guarded
            text = text.replace(header, "")
        seen_header = True
        parts += [text, _runner(name, N_INPUTS[kind], dict(template).get("TG", 32))]
    folder = tmp_path_factory.mktemp("cuda_packed_on_cpu")
    cpp, lib = folder / "wrappers.cpp", folder / "wrappers.so"
    cpp.write_text("\n".join(parts))
    cmd = [*cxx.split(), "-O1", "-std=c++17", "-ffp-contract=off", "-fPIC", "-shared", "-pthread",
           "-Wno-unknown-pragmas", f"-I{kernels.kernel_source_dir()}", "-o", str(lib), str(cpp)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return ctypes.CDLL(str(lib))


def _call(lib, kind, template, inputs, out_shape, batch, length, threads):
    """Launch as MLX does: the input pointers, the output, then the scalars B and L."""
    name = cuda_packed.kernel_name(kind, template)
    out = np.full(out_shape, np.nan, np.float32)
    keep = [np.ascontiguousarray(a) for a in inputs]
    ptrs = (ctypes.c_void_p * (len(keep) + 1))(*[a.ctypes.data for a in keep],
                                               out.ctypes.data)
    getattr(lib, f"run_{name}")(ptrs, batch, length, threads)
    return out


def _model_tensors(rng, batch, length, channels, rank):
    xz = rng.standard_normal((batch, length, 2 * channels)).astype(np.float32)
    x_dbl = rng.standard_normal((batch, length, rank + 32)).astype(np.float32)
    u = rng.standard_normal((batch, length, channels)).astype(np.float32)
    weight = (rng.standard_normal((channels, rank)) / np.sqrt(rank)).astype(np.float32)
    bias = (rng.standard_normal(channels) - 1.0).astype(np.float32)
    A_log = np.log(rng.uniform(0.5, 16.0, (channels, 16))).astype(np.float32)
    D = rng.standard_normal(channels).astype(np.float32)
    return xz, x_dbl, u, weight, bias, A_log, D


def _silu(x):
    return x / (1.0 + np.exp(-x))


def _reversed(a, k):
    """a [B, L, ...] in the forward direction's time order (k = 0) or reversed (k = 1)."""
    return a[:, ::-1] if k else a


@pytest.mark.parametrize("channels", [17, 256])
@pytest.mark.parametrize("batch,length", [(1, 1), (2, 37)])
def test_precompiled_two_direction_conv_wrapper_reads_both_directions_in_place(
        cpu_wrappers, channels, batch, length):
    rng = np.random.default_rng(channels + 3 * length)
    xs = rng.standard_normal((batch, length, 2 * channels)).astype(np.float32)
    w = rng.standard_normal((2, channels, 4, 1)).astype(np.float32)
    b = rng.standard_normal((2, channels)).astype(np.float32)
    # the inputs in bimamba_conv's order: xs stands for both directions' x
    out = _call(cpu_wrappers, "biconv", cuda_packed.conv_template(channels), [xs, xs, w, b],
                (2, batch, length, channels), batch, length,
                gpu.bimamba_conv_threads("cuda", batch, channels))
    for k in (0, 1):
        x = _reversed(xs[..., k * channels:(k + 1) * channels], k)
        want = _reversed(ref.reference_causal_conv1d(x, w[k].transpose(0, 2, 1), b[k]), k)
        assert float(np.max(np.abs(out[k] - _silu(want)))) <= ATOL_CONV, k


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("rank", [1, RANK])
@pytest.mark.parametrize("channels,batch,length", [(17, 3, 45), (256, 2, 70), (256, 1, 1)])
def test_precompiled_two_direction_scan_wrapper_reads_the_packed_tensors(
        cpu_wrappers, strict, rank, channels, batch, length):
    """Direction 1 is the scan of the time-reversed sequence, written back in time order, into
    the output's second half; B, C and the dt input stay staged per block (D = 256)."""
    rng = np.random.default_rng(11 * rank + length)
    n = 16
    gates = rng.standard_normal((batch, length, 2 * channels)).astype(np.float32)
    dirs = [_model_tensors(rng, batch, length, channels, rank) for _ in (0, 1)]
    x_dbl, u, weight, bias, A_log, D = (np.stack([t[i] for t in dirs]) for i in range(1, 7))
    template = cuda_packed.scan_template(channels, rank, strict, gpu.CUDA_SCAN_THREADS)
    # the inputs in bimamba_scan's order: x_dbl stands for dt, B and C, gates for zf and zb
    inputs = [u, x_dbl, weight, bias, A_log, x_dbl, x_dbl, D, gates, gates]
    out = _call(cpu_wrappers, "biscan", template, inputs, (batch, length, 2 * channels), batch,
                length, 2 * batch * channels)
    assert np.all(np.isfinite(out)), "unwritten or non-finite outputs"
    for k in (0, 1):
        dbl = _reversed(x_dbl[k], k)
        delta_raw = bias[k].astype(np.float64) + dbl[..., :rank].astype(np.float64) @ weight[k].T
        z = _reversed(gates[..., k * channels:(k + 1) * channels], k)
        want = _reversed(ref.reference_selective_scan(
            _reversed(u[k], k), delta_raw, A_log[k], dbl[..., rank:rank + n],
            dbl[..., rank + n:], D[k], z), k)
        got = out[..., k * channels:(k + 1) * channels]
        rel = float(np.sqrt(np.mean((got - want) ** 2) / np.mean(want ** 2)))
        assert rel <= RTOL, (k, rel)


def test_the_packed_layout_gives_the_parents_row_major_strides():
    z = cuda_packed.biscan_parts(256, RANK)[-1]
    assert (z.name, z.offset, z.shape()) == ("zb", 256, ["B", "L", "256"])
    assert z.strides() == ["(long long)(L) * (long long)(512) * 1", "(long long)(512) * 1", "1"]


MODEL_VARIANTS = [("biconv", c, None, None) for c in (64, 256)] + [
    ("biscan", c, r, s) for c, r in ((64, 1), (256, RANK)) for s in (False, True)]


@pytest.mark.parametrize("arch", [(8, 0), (9, 0)])
@pytest.mark.parametrize("kind,channels,rank,strict", MODEL_VARIANTS)
def test_every_model_variant_compiles_with_nvrtc(kind, channels, rank, strict, arch):
    """The tiny test model's (D = 64, R = 1) and the full model's (D = 256, R = 4) variants."""
    lib = nvrtc.nvrtc()
    if lib is None:
        pytest.skip("no NVRTC library here (pip install nvidia-cuda-nvrtc)")
    name, text, _ = _variant(kind, channels, rank, strict)
    cubin = nvrtc.compile_cubin(lib, text, name, arch)
    assert cubin[:4] == b"\x7fELF" and name.encode() in cubin


@pytest.mark.parametrize("out_channels,nplanes,kernel,padding,dilation", [
    (64, 4, (3, 3), (8, 1), (8, 1)),  # a dense block's last layer
    (128, 1, (1, 3), (0, 1), (1, 1)),  # the decoders' (1, 3) conv: two column blocks
    (16, 2, (3, 3), (0, 0), (2, 1)),  # narrower than a warp: no LayerNorm code for it
])
def test_conv2d_variants_compile_with_nvrtc(out_channels, nplanes, kernel, padding, dilation,
                                            monkeypatch):
    """The CUDA conv's variants, as cuda_conv2d builds them (the CPU shim's compiler accepts
    things NVRTC refuses, such as an array of size zero)."""
    lib = nvrtc.nvrtc()
    if lib is None:
        pytest.skip("no NVRTC library here (pip install nvidia-cuda-nvrtc)")
    monkeypatch.setattr(cuda_packed, "cached_cubin",
                        lambda text, name: nvrtc.compile_cubin(lib, text, name, (9, 0)))
    out_width = 27 + 2 * padding[1] - dilation[1] * (kernel[1] - 1)
    built = cuda_conv2d._kernel.__wrapped__(out_channels, 64, nplanes, kernel, padding, dilation,
                                            27, out_width, True)
    assert built is not None and built[1][:4] == b"\x7fELF"


@pytest.mark.parametrize("n,ks,nb,bias,eps,residual", [
    (256, (64,), 1, False, None, False),  # an in_proj half
    (36, (256,), 2, False, None, False),  # both directions' x_proj
    (64, (64, 512), 1, True, 1e-5, True),  # the merge: LayerNorm and the TF block's residual
])
def test_projection_variants_compile_with_nvrtc(n, ks, nb, bias, eps, residual, monkeypatch):
    lib = nvrtc.nvrtc()
    if lib is None:
        pytest.skip("no NVRTC library here (pip install nvidia-cuda-nvrtc)")
    monkeypatch.setattr(cuda_packed, "cached_cubin",
                        lambda text, name: nvrtc.compile_cubin(lib, text, name, (9, 0)))
    built = cuda_projection._kernel.__wrapped__(n, ks, nb, bias, eps, residual)
    assert built is not None and built[1][:4] == b"\x7fELF"


@pytest.mark.parametrize("k,channels", [(64, 256), (64, 64)])  # the full and the tiny model
def test_project_conv_variants_compile_with_nvrtc(k, channels, monkeypatch):
    lib = nvrtc.nvrtc()
    if lib is None:
        pytest.skip("no NVRTC library here (pip install nvidia-cuda-nvrtc)")
    monkeypatch.setattr(cuda_packed, "cached_cubin",
                        lambda text, name: nvrtc.compile_cubin(lib, text, name, (9, 0)))
    built = cuda_projection._conv_kernel.__wrapped__(k, channels)
    assert built is not None and built[1][:4] == b"\x7fELF"


def test_a_compile_error_is_reported_with_the_log():
    lib = nvrtc.nvrtc()
    if lib is None:
        pytest.skip("no NVRTC library here (pip install nvidia-cuda-nvrtc)")
    with pytest.raises(nvrtc.NvrtcError, match="undefined_thing"):
        nvrtc.compile_cubin(lib, 'extern "C" __global__ void k() { undefined_thing(); }', "k",
                            (9, 0))


def _library(path: Path) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    return str(path)


def test_nvrtc_is_found_through_nvidia_s_packages(tmp_path, monkeypatch):
    """NVIDIA's wheel laid out as pip installs it (nvidia-cuda-nvrtc: nvidia/cu13/lib from CUDA
    13, nvidia/cuda_nvrtc/lib before) is found through the package Python imports, after the
    names already loadable and before the toolkit's; a folder of nvidia that is not NVRTC's
    package is not searched."""
    site, toolkit = tmp_path / "site", tmp_path / "cuda"
    cu13 = [_library(site / "nvidia" / "cu13" / "lib" / name)
            for name in ("libnvrtc.so.13", "libnvrtc.so.13.5")]
    older = _library(site / "nvidia" / "cuda_nvrtc" / "lib" / "libnvrtc.so.12")
    _library(site / "nvidia" / "cublas" / "lib" / "libnvrtc.so.13")
    system = _library(toolkit / "lib64" / "libnvrtc.so.12")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("CUDA_HOME", str(toolkit))
    found = nvrtc._candidates()
    assert found[:len(nvrtc.NVRTC_NAMES)] == list(nvrtc.NVRTC_NAMES)
    ours = [path for path in found if path.startswith(str(tmp_path))]
    assert ours == [cu13[1], cu13[0], older, system], found


def test_no_nvidia_package_leaves_the_names_and_the_toolkit(tmp_path, monkeypatch):
    toolkit = tmp_path / "cuda"
    system = _library(toolkit / "lib" / "libnvrtc.so.13")
    monkeypatch.setattr(sys, "path", [str(tmp_path / "empty")])
    for name in [name for name in sys.modules if name == "nvidia" or name.startswith("nvidia.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setenv("CUDA_HOME", str(toolkit))
    found = nvrtc._candidates()
    assert found[:len(nvrtc.NVRTC_NAMES)] == list(nvrtc.NVRTC_NAMES)
    assert [path for path in found if path.startswith(str(tmp_path))] == [system]


@pytest.fixture
def fake_nvrtc(monkeypatch, tmp_path):
    """NVRTC and the driver replaced by counters; the cache folder in tmp_path."""
    calls = []
    monkeypatch.setenv("SPEECHLENS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(nvrtc, "nvrtc", lambda: object())
    monkeypatch.setattr(nvrtc, "compute_capability", lambda: (9, 0))
    monkeypatch.setattr(nvrtc, "nvrtc_version", lambda lib: "13.0")

    def compile_cubin(lib, text, name, arch):
        calls.append(name)
        return b"\x7fELF" + text.encode()

    monkeypatch.setattr(nvrtc, "compile_cubin", compile_cubin)
    return calls


def test_a_variant_is_compiled_once_then_read_from_the_cache(fake_nvrtc):
    first = nvrtc.cached_cubin("source A", "k")
    again = nvrtc.cached_cubin("source A", "k")
    other = nvrtc.cached_cubin("source B", "k")
    assert first == again == b"\x7fELFsource A" and other == b"\x7fELFsource B"
    assert fake_nvrtc == ["k", "k"]  # A once, B once
    path = nvrtc.cubin_path("source A", "k", (9, 0), "13.0")
    assert path.read_bytes() == first
    assert [p.name for p in path.parent.iterdir() if p.suffix == ".tmp"] == []


def test_an_unwritable_cache_still_gives_the_kernel(fake_nvrtc, tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("SPEECHLENS_CACHE_DIR", str(blocker))
    assert nvrtc.cached_cubin("source A", "k") == b"\x7fELFsource A"
    assert nvrtc.cached_cubin("source A", "k") == b"\x7fELFsource A"
    assert fake_nvrtc == ["k", "k"]  # nothing could be stored, so compiled each time


def test_no_nvrtc_means_mlx_compiles(monkeypatch):
    monkeypatch.setattr(nvrtc, "nvrtc", lambda: None)
    assert nvrtc.cached_cubin("source", "k") is None


@pytest.mark.parametrize("sample_rate", [8000, 44100])
def test_the_conv_variants_of_a_corpus_do_not_grow_with_its_lengths(tiny_checkpoint, monkeypatch,
                                                                    sample_rate):
    """A corpus of many file lengths must not compile a CUDA conv kernel per length: the
    variants the model asks cuda_conv2d for (recorded here, on the CPU, in place of compiling
    them; the matmul path then computes) are those of the first length, whatever the lengths
    after it. The decoders' time upsampling ran on the time/frequency-swapped plane, whose width
    (a quarter of the frames) made a new variant for every length; so did the plain path and
    the long-window tiles."""
    import mlx.core as mx

    from speechlens_cli import checkpoint
    from speechlens_cli.model import long_windows

    model = checkpoint.load_model(tiny_checkpoint)
    asked = set()
    monkeypatch.setattr(cuda_conv2d, "_kernel", lambda *key: asked.add(key))
    monkeypatch.setattr(kernels, "conv2d", cuda_conv2d.conv2d)
    counts = {}
    for tiled in (False, True):
        if tiled:  # the long-window path (every window long, small tiles): its own variants
            monkeypatch.setattr(long_windows, "LONG_PLANE_BYTES", {"cpu": 0, "gpu": 0})
            monkeypatch.setattr(long_windows, "TILE_PLANE_BYTES", 2**16)
        for seconds in (0.5, 0.61, 0.8, 1.1):
            x = np.random.default_rng(0).standard_normal(int(sample_rate * seconds))
            mx.eval(model.enhance(mx.array(x.astype(np.float32))[None], sample_rate))
            counts.setdefault(tiled, []).append(len(asked))
    for plain_or_tiled in counts.values():
        assert plain_or_tiled == [plain_or_tiled[0]] * 4, counts
