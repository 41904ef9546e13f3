"""The Metal and CUDA kernels: built once per backend through ``mx.fast``; selfcheck.py checks
each variant before the dispatch first launches it."""

from __future__ import annotations

import functools

import mlx.core as mx

from .. import settings
from .build import define_lines
from .contract import D_STATE
from .sources import source

# mx.fast kernel signatures (the bodies kernels/*_body.h use these names).
CONV_INPUTS = ("x", "weight", "bias")
# Both directions of a BiMamba's conv and (on Metal) scan in one launch (bimamba_*_body.h).
BICONV_INPUTS = ("xf", "xb", "weight", "bias")
BISCAN_INPUTS = ("u", "delta_raw", "zf", "zb", "Bs", "Cs", "A_log", "Dskip")
SCAN_INPUTS = ("u", "delta_raw", "A_log", "Bs", "Cs", "Dskip", "z")
# The CUDA scan can fuse the dt projection: dt is delta_raw or the projection's rank-R input.
CUDA_SCAN_INPUTS = ("u", "dt", "dt_w", "dt_b", "A_log", "Bs", "Cs", "Dskip", "z")
OUTPUTS = ("out",)
THREADGROUP_ENV = settings.GPU_THREADGROUP.name
GPU_THREADGROUP = 256  # threads per threadgroup / CUDA block (THREADGROUP_ENV overrides)
# The CUDA scan (selective_scan_cuda_body.h): 128 threads per block, B/C staged per block in
# chunks of 16 steps (standard) or 32 (strict). The kernel takes both as template values (TG,
# CHUNK), so they are set here only; no sweep of either is recorded. It applies a dt projection
# of rank up to CUDA_MAX_DT_RANK itself (RE-USE's is 4).
CUDA_SCAN_THREADS = 128
CUDA_MAX_DT_RANK = 16
CUDA_SCAN_CHUNK = {False: 16, True: 32}


#: CUDA's bodies, with the header of their thread, where the shared ones leave the GPU idle
#: (bimamba_conv_body.h is shared: it takes sl_conv_cuda.h's thread where that is included).
CUDA_BODIES = {"selective_scan": ("selective_scan_cuda_body.h", "sl_scan_cuda.h"),
               "bimamba_scan": ("bimamba_scan_cuda_body.h", "sl_scan_cuda.h"),
               "bimamba_conv": ("bimamba_conv_body.h", "sl_conv_cuda.h"),
               "projection": ("projection_cuda_body.h", "sl_gemm_cuda.h"),
               "project_conv": ("project_conv_cuda_body.h", "sl_gemm_cuda.h"),
               "conv2d": ("conv2d_cuda_body.h", "sl_gemm_cuda.h")}


def kernel_sources(name: str, which: str) -> tuple[str, str]:
    """(body, header) of kernel `name` (causal_conv1d, selective_scan, bimamba_conv,
    bimamba_scan) on `which` (metal, cuda): build.py's macros for the backend, its header and
    sl_mamba.h, and on CUDA its own body and thread header where it has one (CUDA_BODIES)."""
    header = define_lines(which) + source(f"sl_backend_{which}.h") + source("sl_mamba.h")
    if which == "cuda" and name in CUDA_BODIES:
        body, thread = CUDA_BODIES[name]
        return source(body), header + source(thread)
    return source(f"{name}_body.h"), header


@functools.cache
def _gpu_kernel(name: str, which: str):
    if which not in ("metal", "cuda"):
        raise ValueError(f"no GPU kernels for backend {which!r}")
    cuda_scan = which == "cuda" and name == "selective_scan"
    body, header = kernel_sources(name, which)
    build = mx.fast.cuda_kernel if which == "cuda" else mx.fast.metal_kernel
    inputs = {"causal_conv1d": CONV_INPUTS, "bimamba_conv": BICONV_INPUTS,
              "bimamba_scan": BISCAN_INPUTS}.get(
        name, CUDA_SCAN_INPUTS if cuda_scan else SCAN_INPUTS)
    return build(name=f"speechlens_{name}" + ("_cuda" if cuda_scan else ""),
                 input_names=list(inputs),
                 output_names=list(OUTPUTS), source=body, header=header,
                 ensure_row_contiguous=False)


def threadgroup() -> int:
    return settings.GPU_THREADGROUP.value() or GPU_THREADGROUP


def gpu_conv(x: mx.array, weight: mx.array, bias: mx.array, which: str,
             silu: bool = False) -> mx.array:
    """``silu`` fuses SiLU into the kernel (one pass over [B, L, D] instead of two)."""
    batch, _, channels = x.shape
    kernel = _gpu_kernel("causal_conv1d", which)
    return kernel(inputs=[x, weight, bias],
                  template=[("DI", int(channels)), ("SILU", bool(silu))],
                  grid=(batch * channels, 1, 1), threadgroup=(threadgroup(), 1, 1),
                  output_shapes=[tuple(x.shape)], output_dtypes=[mx.float32])[0]


def bimamba_conv_threads(which: str, batch: int, channels: int) -> int:
    """Threads of a two-direction conv launch: one per (direction, batch, channel), on CUDA
    one per four adjacent channels when D is a multiple of 4 (bimamba_conv_body.h)."""
    lanes = 4 if which == "cuda" and channels % 4 == 0 else 1
    return 2 * batch * channels // lanes


def gpu_bimamba_conv(x: mx.array, weight: mx.array, bias: mx.array, which: str,
                     silu: bool = False) -> mx.array:
    """Both directions of a BiMamba's conv (bimamba_conv_body.h; on CUDA with the thread of
    sl_conv_cuda.h) on their inputs side by side, x [B, L, 2D] (row contiguous) ->
    [2, B, L, D]; the halves are read through their strides (no copy)."""
    batch, length, width = x.shape
    channels = width // 2
    kernel = _gpu_kernel("bimamba_conv", which)
    return kernel(inputs=[x[..., :channels], x[..., channels:], weight, bias],
                  template=[("DI", int(channels)), ("SILU", bool(silu))],
                  grid=(bimamba_conv_threads(which, batch, channels), 1, 1),
                  threadgroup=(threadgroup(), 1, 1),
                  output_shapes=[(2, batch, length, channels)], output_dtypes=[mx.float32])[0]


def metal_bimamba_scan(u: mx.array, delta_raw: mx.array, z: mx.array, B: mx.array,
                       C: mx.array, A_log: mx.array, D: mx.array, strict: bool) -> mx.array:
    """Both directions' scans on Metal in one launch (bimamba_scan_body.h): u, delta_raw
    [2, B, L, D], z [B, L, 2D], B, C [2, B, L, 16] (views), A_log [2, D, 16], D [2, D] ->
    [B, L, 2D]."""
    _, batch, length, channels = u.shape
    kernel = _gpu_kernel("bimamba_scan", "metal")
    return kernel(inputs=[u, delta_raw, z[..., :channels], z[..., channels:], B, C, A_log, D],
                  template=[("DI", int(channels)), ("NS", D_STATE), ("STRICT", bool(strict))],
                  grid=(2 * batch * channels, 1, 1), threadgroup=(threadgroup(), 1, 1),
                  output_shapes=[(batch, length, 2 * channels)], output_dtypes=[mx.float32])[0]


def cuda_scan_threads() -> int:
    return settings.GPU_THREADGROUP.value() or CUDA_SCAN_THREADS


def gpu_scan(u, delta_raw, A_log, B, C, D, z, strict: bool, which: str,
             dt_proj: tuple[mx.array, mx.array] | None = None) -> mx.array:
    """``dt_proj=(weight, bias)`` (CUDA only): delta_raw is the projection's rank-R input."""
    batch, _, channels = u.shape
    template = [("DI", int(channels)), ("NS", D_STATE), ("STRICT", bool(strict))]
    threads = threadgroup()
    inputs = [u, delta_raw, A_log, B, C, D, z]
    if which == "cuda":
        threads = cuda_scan_threads()
        rank = 0 if dt_proj is None else int(delta_raw.shape[2])
        weight, bias = dt_proj if dt_proj is not None else _no_dt_proj()
        template += [("R", rank), ("CHUNK", CUDA_SCAN_CHUNK[bool(strict)]), ("TG", threads)]
        inputs = [u, delta_raw, weight, bias, A_log, B, C, D, z]
    elif dt_proj is not None:
        raise ValueError(f"the {which} scan takes delta_raw, not a dt projection")
    kernel = _gpu_kernel("selective_scan", which)
    return kernel(inputs=inputs, template=template,
                  grid=(batch * channels, 1, 1), threadgroup=(threads, 1, 1),
                  output_shapes=[tuple(u.shape)], output_dtypes=[mx.float32])[0]


@functools.cache
def _no_dt_proj() -> tuple[mx.array, mx.array]:
    """Placeholders for the CUDA scan's dt projection inputs when there is none (never read)."""
    return mx.zeros((1, 1), mx.float32), mx.zeros((1,), mx.float32)


def launch_description(which: str) -> str:
    """The launch geometry of this backend's kernels (for benchmark and bug reports)."""
    conv = f"conv: threadgroup {threadgroup()}"
    if which == "cuda":
        return (f"mx.fast.cuda_kernel; {conv}, SiLU fused; scan: selective_scan_cuda_body.h, "
                f"{cuda_scan_threads()} threads per block, B/C and the dt projection's input "
                f"staged per block (D a multiple of it) in chunks of {CUDA_SCAN_CHUNK[False]} "
                f"(standard) / {CUDA_SCAN_CHUNK[True]} (strict) steps, dt projection fused")
    return (f"mx.fast.{which}_kernel; {conv}, SiLU as a separate op; scan: "
            f"selective_scan_body.h, threadgroup {threadgroup()}")

