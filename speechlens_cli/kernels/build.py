"""How the CPU kernel library is built: its sources, compiler flags and source hash.

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
#: Bumped together with SL_CPU_ABI_VERSION in cpu_kernels.cpp whenever an entry point changes.
CPU_ABI_VERSION = 6
#: No -ffast-math, and no fused multiply-adds: the CPU results must match the other backends'.
CPU_COMPILE_FLAGS = ("-O3", "-std=c++17", "-ffp-contract=off", "-fPIC", "-fvisibility=hidden",
                     "-Wno-psabi", "-pthread")
CPU_LINK_FLAGS = ("-pthread",)
#: The preprocessor macro that carries the source hash into the library.
HASH_MACRO = "SL_SOURCE_HASH"


def sources_hash(folder: Path) -> str:
    """A short hash of the CPU library's sources as they are in `folder`."""
    digest = hashlib.sha256()
    for name in CPU_SOURCES:
        digest.update(name.encode())
        digest.update((Path(folder) / name).read_text(encoding="utf-8").encode())
    return digest.hexdigest()[:16]
