"""The two Mamba hot spots: causal depthwise conv1d (k=4) and the fixed-16 selective scan.

Every Mamba call runs both (docs/kernels.md). The per-thread logic lives once, in
``kernels/sl_mamba.h``, and runs on three backends:

* **Metal** (``mx.metal.is_available()``): ``mx.fast.metal_kernel``;
* **CUDA** (``mx.cuda.is_available()``, ``mlx[cuda13]``): ``mx.fast.cuda_kernel``; both run
  ``kernels/*_body.h`` with their backend header (``sl_backend_metal.h``, ``sl_backend_cuda.h``):
  the conv body is shared, the CUDA scan has its own (``selective_scan_cuda_body.h`` +
  ``sl_scan_cuda.h``: B/C staged per block, next-step prefetch), the math is ``sl_mamba.h``'s;
* **CPU** (the default device is the CPU, or no GPU backend): the same header compiled into a
  small C++ library (``kernels/cpu_kernels.cpp``; built by ``pip install`` as
  ``speechlens_cli/_cpu_kernels*.so``, else compiled on first use into a cache folder), called
  through ctypes on evaluated arrays. Its output is written into an MLX-allocated array, so
  nothing is copied back. If no C++ compiler is available either, the scan falls back to MLX
  ops (slow, bounded memory) and the conv to ``mx.conv1d``, each with one logged warning.

Public functions keep the signatures the model code calls:

* ``causal_conv1d(x [B,L,D], weight [D,4,1], bias [D]) -> [B,L,D]``
* ``selective_scan(u, delta_raw, A_log, B, C, D, z, strict=False) -> y * SiLU(z)``
* ``project(terms, bias=None, norm=None) -> sum(a @ w) + bias``, then an optional LayerNorm of
  each row (``LayerNormSpec``): the model's projections (the CPU library's register tiles on the
  CPU; on CUDA a float32-accurate tensor-core kernel, ``cuda_projection``; MLX's matmul
  elsewhere)
* ``project_conv(x, w, conv_weight, conv_bias)``: a BiMamba's in_proj conv-input half, then
  both directions' conv and SiLU (on CUDA one kernel, the conv in the projection's store)
* ``conv2d(planes, weight, bias, padding, dilation)``: the encoder's and decoders' stride-1
  convolutions read straight from their input planes: on the CPU the CPU library's
  (``kernels/sl_conv2d_cpu.h``), on CUDA a float32-accurate tensor-core kernel
  (``cuda_conv2d``); None elsewhere
* ``instance_norm_prelu(tiles, weight, bias, eps, slope)``: the decoders' InstanceNorm and
  PReLU in one pass by the CPU library on the CPU; None elsewhere

The conv validates its inputs and falls back to ``mx.conv1d(groups=D)`` cropped to L (one logged
warning per reason) on a validation or dispatch failure, or when
``SPEECHLENS_DISABLE_METAL_CONV1D=1`` (alias ``SPEECHLENS_DISABLE_CONV1D_KERNEL=1``). A bad scan
input is an internal error on every backend (:class:`KernelInputError`).

On a GPU each kernel variant (kernel, template values) is run once on a small random input and
compared with the MLX-ops path before its first use (``selfcheck``; verdicts kept per machine
and MLX version in ``verdicts_file()``): a compile error, a run error or a mismatch sends its
calls to the fallback (the conv's, the scan in MLX ops) with one logged warning;
``self_check(channels, rank)`` gives every verdict (``speechlens doctor``).

Environment: ``SPEECHLENS_CPU_THREADS`` (CPU threads for the CPU kernels; default: all
usable cores), ``SPEECHLENS_CPU_ISA`` (which SIMD build of the CPU library runs: best, avx512,
avx2, generic; default: the best this CPU has), ``SPEECHLENS_KERNEL_DIR`` (kernel sources),
``SPEECHLENS_CACHE_DIR`` (where a CPU library compiled at run time goes; default
``$XDG_CACHE_HOME/speechlens`` or ``~/.cache/speechlens``).

Modules: ``dispatch`` (the public entry points, and per operation one table of its
implementations per backend, walked by one function: ``dispatch_table()``), ``gpu`` (Metal
and CUDA through ``mx.fast``), ``cuda_packed`` and ``nvrtc`` (on CUDA, the Mamba block's
kernels compiled once per machine and cached), ``cuda_projection`` and ``cuda_conv2d`` (the
tensor-core kernels), ``cpu_binding`` and ``cpu_ops`` (the C++ library through ctypes),
``fallback`` (MLX ops), ``selfcheck`` (each GPU kernel checked against them before use),
``contract`` (accepted shapes), ``sources``, ``build`` (the build description setup.py shares,
and the numbers the kernel sources take from it) and ``compiler`` (building the CPU library at
run time).
"""

from __future__ import annotations

import re

import mlx.core as mx

MIN_MLX_VERSION = (0, 32, 1)


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


if _version_tuple(mx.__version__) < MIN_MLX_VERSION:
    raise ImportError(
        f"speechlens needs MLX >= {'.'.join(map(str, MIN_MLX_VERSION))} "
        f"(mx.fast.metal_kernel/cuda_kernel as used here); found {mx.__version__}"
    )

# The public names, importable as speechlens_cli.kernels.NAME.
from .build import CPU_COMPILE_FLAGS  # noqa: E402
from .compiler import compile_cpu_library, find_cxx  # noqa: E402
from .contract import CONV_WIDTH, D_STATE, KernelInputError, LayerNormSpec  # noqa: E402
from .cpu_binding import (  # noqa: E402
    CPU_ISA_CHOICES,
    CPU_ISA_ENV,
    CPU_THREADS_ENV,
    cpu_isa,
    cpu_library,
    cpu_threads,
    usable_cores,
)
from .cpu_ops import cpu_exp2_decay, cpu_exp_poly  # noqa: E402
from .dispatch import (  # noqa: E402
    DISABLE_CONV_ENV,
    DISABLE_CONV_ENV_ALIAS,
    backend,
    bimamba_conv,
    bimamba_scan,
    causal_conv1d,
    conv2d,
    conv_kernel_disabled,
    dispatch_table,
    gpu_backend,
    instance_norm_prelu,
    kernel_info,
    project,
    project_conv,
    selective_scan,
    self_check,
)
from .fallback import conv1d_fallback, selective_scan_ops  # noqa: E402
from .gpu import CONV_INPUTS, GPU_THREADGROUP, SCAN_INPUTS, THREADGROUP_ENV  # noqa: E402
from .scratch import lend_scratch, scratch_pool  # noqa: E402
from .selfcheck import verdicts_file  # noqa: E402
from .sources import kernel_source_dir  # noqa: E402

__all__ = [
    "CONV_INPUTS", "CONV_WIDTH", "CPU_COMPILE_FLAGS", "CPU_ISA_CHOICES", "CPU_ISA_ENV",
    "CPU_THREADS_ENV",
    "DISABLE_CONV_ENV",
    "DISABLE_CONV_ENV_ALIAS", "D_STATE", "GPU_THREADGROUP", "KernelInputError", "LayerNormSpec",
    "MIN_MLX_VERSION", "SCAN_INPUTS", "THREADGROUP_ENV", "backend", "bimamba_conv",
    "bimamba_scan", "causal_conv1d", "conv2d",
    "compile_cpu_library", "conv1d_fallback", "conv_kernel_disabled", "cpu_exp2_decay",
    "dispatch_table",
    "cpu_exp_poly", "cpu_isa", "cpu_library", "cpu_threads", "find_cxx", "gpu_backend",
    "instance_norm_prelu",
    "kernel_info", "kernel_source_dir", "lend_scratch", "project", "project_conv",
    "scratch_pool",
    "selective_scan", "selective_scan_ops", "self_check", "usable_cores", "verdicts_file",
]
