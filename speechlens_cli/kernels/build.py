"""How the kernels are built: the numbers they share with the Python code, and the CPU
library's sources, compiler flags and source hash.

setup.py (before speechlens is installed, so without MLX) and the run-time compile in
``compiler.py`` both read this one description, so an installed library and one compiled later
come from the same sources with the same flags. Standard library only, no package imports:
setup.py loads this file by path.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

#: The library's C entry point (relative to the kernel source folder) and every file it includes;
#: the hash over them is compiled in, so a library built from other sources is recognised.
CPU_ENTRY = "cpu_kernels.cpp"
CPU_SOURCES = (CPU_ENTRY, "sl_backend_cpu.h", "sl_tile_cpu.h", "sl_conv2d_cpu.h",
               "sl_project_cpu.h", "sl_mamba.h")
#: Bumped whenever an entry point of the CPU library changes.
CPU_ABI_VERSION = 7

# The numbers the kernel sources and the Python code share, written only here. The sources
# take them as macros (KERNEL_DEFINES): -D flags on the CPU library's compile line, #defines
# ahead of the Metal and CUDA headers (gpu.kernel_sources); a source compiled without them
# stops at an #error, and one whose code is written for a single value says so in a
# static_assert. The CPU library reports what it was built with (sl_cpu_defines), which
# cpu_binding compares when it loads it.
#: States per channel of the selective scan (RE-USE's d_state).
D_STATE = 16
#: Taps of the Mamba block's causal conv (RE-USE's d_conv).
CONV_WIDTH = 4
#: sl_cpu_selective_scan's flags bit: walk (batch, channel group) units as GPU threads do.
SCAN_THREAD_ORDER = 1
#: The CPU library's SIMD builds, by the code its `isa` arguments take (-1: the best this CPU
#: has).
CPU_ISAS = {"avx512": 2, "avx2": 1, "generic": 0}
#: The CUDA tensor-core products' block (sl_gemm_cuda.h): 256 threads (8 warps, 4 along rows x
#: 2 along columns), 128 output rows, K staged in slices of 16.
GEMM_THREADS = 256
GEMM_ROWS = 128
GEMM_SLICE = 16
#: The macros each backend's sources are compiled with.
KERNEL_DEFINES = {
    "cpu": {"SL_CPU_ABI_VERSION": CPU_ABI_VERSION, "SL_NSTATE": D_STATE,
            "SL_CONV_WIDTH": CONV_WIDTH, "SL_SCAN_THREAD_ORDER": SCAN_THREAD_ORDER,
            **{f"SL_ISA_{name.upper()}": code for name, code in CPU_ISAS.items()}},
    "metal": {"SL_CONV_WIDTH": CONV_WIDTH},
    "cuda": {"SL_CONV_WIDTH": CONV_WIDTH, "SL_GEMM_THREADS": GEMM_THREADS,
             "SL_GEMM_BM": GEMM_ROWS, "SL_GEMM_BK": GEMM_SLICE},
}
#: No -ffast-math, and no fused multiply-adds: the CPU results must match the other backends'.
CPU_COMPILE_FLAGS = ("-O3", "-std=c++17", "-ffp-contract=off", "-fPIC", "-fvisibility=hidden",
                     "-Wno-psabi", "-pthread")
CPU_LINK_FLAGS = ("-pthread",)
#: The preprocessor macro that carries the source hash into the library.
HASH_MACRO = "SL_SOURCE_HASH"


def define_flags(which: str) -> list[str]:
    """KERNEL_DEFINES[which] as compiler flags (-DNAME=value)."""
    return [f"-D{name}={value}" for name, value in KERNEL_DEFINES[which].items()]


def define_lines(which: str) -> str:
    """KERNEL_DEFINES[which] as #define lines, for sources compiled from text."""
    return "".join(f"#define {name} {value}\n" for name, value in KERNEL_DEFINES[which].items())


def sources_hash(folder: Path) -> str:
    """A short hash of the CPU library's sources as they are in `folder`, and of the macros it
    is compiled with."""
    digest = hashlib.sha256(" ".join(define_flags("cpu")).encode())
    for name in CPU_SOURCES:
        digest.update(name.encode())
        digest.update((Path(folder) / name).read_text(encoding="utf-8").encode())
    return digest.hexdigest()[:16]
