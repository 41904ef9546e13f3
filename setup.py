"""Build steps that pyproject.toml cannot express.

1. The kernel sources in ``kernels/`` ship inside the wheel as ``speechlens_cli/kernel_src``
   (an editable install reads them from ``kernels/`` directly).
2. ``kernels/cpu_kernels.cpp`` (the per-thread kernel logic of ``kernels/sl_mamba.h`` for the
   CPU) is compiled into ``speechlens_cli/_cpu_kernels*.so``, a plain shared library loaded
   with ctypes (no Python C API, so no Python headers are needed). The build is optional: if no
   C++ compiler works, installation still succeeds and ``speechlens_cli.kernels`` compiles the
   library on first use (or falls back to MLX ops). The library records a hash of its sources,
   so an editable install with edited kernels is rebuilt at run time instead of used stale.
   Sources, flags and the hash come from ``speechlens_cli/kernels/build.py``, which the run-time
   compile uses too.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from setuptools import Extension, find_namespace_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
KERNELS = ROOT / "kernels"


def _load_build_description():
    """speechlens_cli/kernels/build.py, by path: the package itself needs MLX, which is not
    installed yet when setup.py runs."""
    path = ROOT / "speechlens_cli" / "kernels" / "build.py"
    spec = importlib.util.spec_from_file_location("_speechlens_kernel_build", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BUILD = _load_build_description()


class BuildCpuKernels(build_ext):
    """build_ext for a ctypes library: no PyInit symbol is exported or required."""

    def get_export_symbols(self, ext):  # Windows-only concern; keep setuptools from adding one
        return []

    def build_extension(self, ext):
        ext.define_macros = [(BUILD.HASH_MACRO, f'"{BUILD.sources_hash(KERNELS)}"')] + [
            (name, str(value)) for name, value in BUILD.KERNEL_DEFINES["cpu"].items()]
        super().build_extension(ext)


cpu_kernels = Extension(
    "speechlens_cli._cpu_kernels",
    sources=[f"kernels/{BUILD.CPU_ENTRY}"],
    depends=[f"kernels/{name}" for name in BUILD.CPU_SOURCES],
    include_dirs=["kernels"],
    extra_compile_args=list(BUILD.CPU_COMPILE_FLAGS),
    extra_link_args=list(BUILD.CPU_LINK_FLAGS),
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
    package_data={"speechlens_cli.kernel_src": ["*.h", "*.cpp"]},
    # the shims that let tests compile the Metal/CUDA bodies as C++ are not needed at run time
    exclude_package_data={"speechlens_cli.kernel_src": ["*_cpu_shim.h"]},
    ext_modules=[cpu_kernels, blas_shim],
    cmdclass={"build_ext": BuildCpuKernels},
)
