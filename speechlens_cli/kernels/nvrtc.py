"""CUDA kernels compiled once per machine with NVRTC and kept on disk.

MLX's ``mx.fast.cuda_kernel`` compiles a custom kernel in every process (its disk cache covers
MLX's own kernels only): on an H200 that was most of the ~6 s a one-file ``speechlens enhance``
spent before its first window was done. Here each kernel variant is compiled to a cubin for this
GPU's architecture the first time it is needed, stored under the cache folder by a hash of its
source, the architecture and the NVRTC version, and launched through
``mx.fast.precompiled_cuda_kernel``. Any failure (no NVRTC, no driver, a compile error) returns
None and the caller uses ``mx.fast.cuda_kernel`` instead.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import hashlib
import importlib.util
import os
from pathlib import Path

from .. import settings
from .sources import cache_dir, store_in_cache

#: Library names and places where NVRTC may be: already loaded with MLX, NVIDIA's wheel
#: (nvidia-cuda-nvrtc: the package nvidia.cu13 from CUDA 13, nvidia.cuda_nvrtc before), or a
#: toolkit.
NVRTC_NAMES = ("libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so")
NVRTC_PACKAGES = ("nvidia.cu13", "nvidia.cuda_nvrtc")
NVRTC_IN_PACKAGE = "lib/libnvrtc.so*"
TOOLKIT_LIBS = ("lib64", "lib")
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76


class NvrtcError(RuntimeError):
    """NVRTC refused a kernel source (the log is in the message)."""


def _wheel_libraries() -> list[str]:
    """NVRTC in NVIDIA's wheels, found through their packages as Python would import them
    (every folder of the package counts); finding the spec imports only the `nvidia` namespace,
    which has no code in NVIDIA's wheels."""
    paths = []
    for package in NVRTC_PACKAGES:
        try:
            spec = importlib.util.find_spec(package)
        except ImportError:  # no nvidia package at all
            continue
        folders = spec.submodule_search_locations if spec is not None else None
        for folder in folders or ():
            paths += sorted(glob.glob(os.path.join(folder, NVRTC_IN_PACKAGE)), reverse=True)
    return paths


def _candidates() -> list[str]:
    paths = [*NVRTC_NAMES, *_wheel_libraries()]
    for home in (settings.CUDA_HOME.value(), settings.CUDA_PATH.value(), "/usr/local/cuda"):
        if home:
            for lib in TOOLKIT_LIBS:
                paths += sorted(glob.glob(os.path.join(home, lib, "libnvrtc.so*")), reverse=True)
    return paths


@functools.cache
def nvrtc() -> ctypes.CDLL | None:
    """NVRTC's library, or None where there is none."""
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        if hasattr(lib, "nvrtcCreateProgram") and hasattr(lib, "nvrtcGetCUBIN"):
            return lib
    return None


def nvrtc_version(lib: ctypes.CDLL) -> str:
    major, minor = ctypes.c_int(), ctypes.c_int()
    lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    return f"{major.value}.{minor.value}"


@functools.cache
def compute_capability() -> tuple[int, int] | None:
    """The compute capability of CUDA device 0 (MLX's GPU) from the driver, or None."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    device, major, minor = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGet(ctypes.byref(device), 0) != 0:
        return None
    for attribute, value in ((CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, major),
                             (CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, minor)):
        if cuda.cuDeviceGetAttribute(ctypes.byref(value), attribute, device) != 0:
            return None
    return major.value, minor.value


def _check(lib: ctypes.CDLL, result: int, what: str) -> None:
    if result != 0:
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        raise NvrtcError(f"{what}: {lib.nvrtcGetErrorString(result).decode()}")


def compile_cubin(lib: ctypes.CDLL, source: str, name: str, arch: tuple[int, int],
                  options: tuple[str, ...] = ("--std=c++17",)) -> bytes:
    """`source` compiled for sm_<arch> (a cubin: no driver JIT at load)."""
    program = ctypes.c_void_p()
    _check(lib, lib.nvrtcCreateProgram(ctypes.byref(program), source.encode(),
                                       f"{name}.cu".encode(), 0, None, None),
           "nvrtcCreateProgram")
    try:
        opts = [f"--gpu-architecture=sm_{arch[0]}{arch[1]}".encode(),
                *(o.encode() for o in options)]
        argv = (ctypes.c_char_p * len(opts))(*opts)
        result = lib.nvrtcCompileProgram(program, len(opts), argv)
        if result != 0:
            size = ctypes.c_size_t()
            lib.nvrtcGetProgramLogSize(program, ctypes.byref(size))
            log = ctypes.create_string_buffer(size.value)
            lib.nvrtcGetProgramLog(program, log)
            raise NvrtcError(f"compiling {name} failed:\n{log.value.decode(errors='replace')}")
        size = ctypes.c_size_t()
        _check(lib, lib.nvrtcGetCUBINSize(program, ctypes.byref(size)), "nvrtcGetCUBINSize")
        cubin = ctypes.create_string_buffer(size.value)
        _check(lib, lib.nvrtcGetCUBIN(program, cubin), "nvrtcGetCUBIN")
        return cubin.raw
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(program))


def cubin_path(source: str, name: str, arch: tuple[int, int], version: str) -> Path:
    """Where the cubin of `source` for sm_<arch> from NVRTC `version` is kept."""
    key = hashlib.sha256("\0".join((source, f"sm_{arch[0]}{arch[1]}", version)).encode())
    return cache_dir() / "cuda-kernels" / f"{name}-{key.hexdigest()[:20]}.cubin"


def cached_cubin(source: str, name: str) -> bytes | None:
    """The cubin of `source` for this GPU: read from the cache folder, else compiled and stored
    there (atomically; a cache that cannot be written only costs the next process a compile).
    None where NVRTC or the driver is missing; NvrtcError if the source does not compile."""
    lib, arch = nvrtc(), compute_capability()
    if lib is None or arch is None:
        return None
    path = cubin_path(source, name, arch, nvrtc_version(lib))
    try:
        return path.read_bytes()
    except OSError:
        pass
    cubin = compile_cubin(lib, source, name, arch)
    store_in_cache(path, cubin)
    return cubin

