"""Build steps that pyproject.toml cannot express.

1. The kernel sources in ``kernels/`` ship inside the wheel as ``speechlens_cli/kernel_src``
   (an editable install reads them from ``kernels/`` directly).
2. ``kernels/cpu_kernels.cpp`` (the per-thread kernel logic of ``kernels/sl_mamba.h`` for the
   CPU) is compiled into ``speechlens_cli/_cpu_kernels*.so``, a plain shared library loaded
   with ctypes (no Python C API, so no Python headers are needed). The build is optional: if no
   C++ compiler works, installation still succeeds and ``speechlens_cli.kernels`` compiles the
   library on first use (or falls back to MLX ops). The library records a hash of its sources,
   so an editable install with edited kernels is rebuilt at run time instead of used stale.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from setuptools import Extension, find_namespace_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
KERNELS = ROOT / "kernels"
# Keep in step with speechlens_cli/kernels.py (CPU_SOURCES, CPU_COMPILE_FLAGS).
CPU_SOURCES = ("cpu_kernels.cpp", "sl_backend_cpu.h", "sl_mamba.h")
CPU_COMPILE_FLAGS = ["-O3", "-std=c++17", "-ffp-contract=off", "-fvisibility=hidden",
                     "-Wno-psabi", "-pthread"]


def sources_hash() -> str:
    digest = hashlib.sha256()
    for name in CPU_SOURCES:
        digest.update(name.encode())
        digest.update((KERNELS / name).read_text(encoding="utf-8").encode())
    return digest.hexdigest()[:16]


class BuildCpuKernels(build_ext):
    """build_ext for a ctypes library: no PyInit symbol is exported or required."""

    def get_export_symbols(self, ext):  # Windows-only concern; keep setuptools from adding one
        return []

    def build_extension(self, ext):
        ext.define_macros = [("SL_SOURCE_HASH", f'"{sources_hash()}"')]
        super().build_extension(ext)


cpu_kernels = Extension(
    "speechlens_cli._cpu_kernels",
    sources=["kernels/cpu_kernels.cpp"],
    depends=[f"kernels/{name}" for name in CPU_SOURCES],
    include_dirs=["kernels"],
    extra_compile_args=CPU_COMPILE_FLAGS,
    extra_link_args=["-pthread"],
    language="c++",
    optional=True,
)

# Lets MLX's Linux CPU backend use scipy-openblas (a PyPI dependency) instead of the reference
# BLAS its wheel links; see speechlens_cli/blas.py.
blas_shim = Extension(
    "speechlens_cli._blas_shim",
    sources=["csrc/blas_shim.c"],
    extra_compile_args=["-O2", "-fvisibility=hidden"],
    optional=True,
)

setup(
    # namespace discovery, as pyproject's [tool.setuptools.packages.find] did (model/ has no
    # __init__.py)
    packages=find_namespace_packages(include=["speechlens_cli", "speechlens_cli.*"],
                                     exclude=["*.__pycache__", "speechlens_cli.kernel_src"])
    + ["speechlens_cli.kernel_src"],
    package_dir={"speechlens_cli.kernel_src": "kernels"},
    package_data={"speechlens_cli.kernel_src": ["*.h", "*.metal", "*.cu", "*.cpp"]},
    ext_modules=[cpu_kernels, blas_shim],
    cmdclass={"build_ext": BuildCpuKernels},
)
