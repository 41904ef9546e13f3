"""The two Mamba hot spots: causal depthwise conv1d (k=4) and the fixed-16 selective scan.

Every Mamba call runs both (docs/kernels.md). The per-thread logic lives once, in
``kernels/sl_mamba.h``, and runs on three backends:

* **Metal** (``mx.metal.is_available()``): ``mx.fast.metal_kernel`` with the bodies
  ``kernels/*.metal``;
* **CUDA** (``mx.cuda.is_available()``, ``mlx[cuda13]``): ``mx.fast.cuda_kernel`` with the bodies
  ``kernels/*.cu``;
* **CPU** (the default device is the CPU, or no GPU backend): the same header compiled into a
  small C++ library (``kernels/cpu_kernels.cpp``; built by ``pip install`` as
  ``speechlens_cli/_cpu_kernels*.so``, else compiled on first use into a cache folder), called
  through ctypes on evaluated arrays. Its output is written into an MLX-allocated array, so
  nothing is copied back. If no C++ compiler is available either, the scan falls back to MLX
  ops (slow, bounded memory) and the conv to ``mx.conv1d``, each with one logged warning.

Public functions keep the signatures the model code calls:

* ``causal_conv1d(x [B,L,D], weight [D,4,1], bias [D]) -> [B,L,D]``
* ``selective_scan(u, delta_raw, A_log, B, C, D, z, strict=False) -> y * SiLU(z)``

The conv validates its inputs and falls back to ``mx.conv1d(groups=D)`` cropped to L (one logged
warning per reason) on a validation or dispatch failure, or when
``SPEECHLENS_DISABLE_METAL_CONV1D=1`` (alias ``SPEECHLENS_DISABLE_CONV1D_KERNEL=1``). The scan has
no fallback on GPU backends: a bad input is an internal error (:class:`KernelInputError`).

Environment: ``SPEECHLENS_CPU_THREADS`` (CPU threads for the CPU kernels; default: all
usable cores), ``SPEECHLENS_KERNEL_DIR`` (kernel sources), ``SPEECHLENS_CACHE_DIR`` (where a CPU
library compiled at run time goes; default ``$XDG_CACHE_HOME/speechlens`` or
``~/.cache/speechlens``).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from importlib import machinery
from pathlib import Path

import mlx.core as mx
import numpy as np

log = logging.getLogger(__name__)

MIN_MLX_VERSION = (0, 32, 1)
D_STATE = 16
CONV_WIDTH = 4

DISABLE_CONV_ENV = "SPEECHLENS_DISABLE_METAL_CONV1D"
DISABLE_CONV_ENV_ALIAS = "SPEECHLENS_DISABLE_CONV1D_KERNEL"

# Sources compiled into the CPU library; their hash must match the one built into it.
CPU_SOURCES = ("cpu_kernels.cpp", "sl_backend_cpu.h", "sl_mamba.h")
CPU_ABI_VERSION = 2
CPU_COMPILE_FLAGS = ("-O3", "-std=c++17", "-ffp-contract=off", "-fPIC", "-fvisibility=hidden",
                     "-Wno-psabi", "-pthread")

# mx.fast kernel signatures (the bodies in kernels/*.metal|*.cu use these names).
CONV_INPUTS = ("x", "weight", "bias")
SCAN_INPUTS = ("u", "delta_raw", "A_log", "Bs", "Cs", "Dskip", "z")
OUTPUTS = ("out",)
GPU_THREADGROUP = 256  # threads per threadgroup / CUDA block (SPEECHLENS_GPU_THREADGROUP)


class KernelInputError(ValueError):
    """A kernel got tensors that break its contract (internal error after a good model load)."""


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


if _version_tuple(mx.__version__) < MIN_MLX_VERSION:
    raise ImportError(
        f"speechlens needs MLX >= {'.'.join(map(str, MIN_MLX_VERSION))} "
        f"(mx.fast.metal_kernel/cuda_kernel as used here); found {mx.__version__}"
    )


# ------------------------------------------------------------------------------------------
# backend and sources
# ------------------------------------------------------------------------------------------

def backend() -> str:
    """``"metal"``, ``"cuda"`` or ``"cpu"``: where the kernels run for the default device."""
    if mx.default_device().type == mx.DeviceType.cpu:
        return "cpu"
    if mx.metal.is_available():
        return "metal"
    if mx.cuda.is_available():
        return "cuda"
    return "cpu"


def kernel_source_dir() -> Path:
    """Folder holding the kernel sources: the wheel's ``speechlens_cli/kernel_src`` or the
    checkout's ``kernels/`` (editable install), unless ``SPEECHLENS_KERNEL_DIR`` is set."""
    override = os.environ.get("SPEECHLENS_KERNEL_DIR")
    here = Path(__file__).resolve().parent
    candidates = [Path(override)] if override else [here / "kernel_src", here.parent / "kernels"]
    for folder in candidates:
        if (folder / "sl_mamba.h").is_file():
            return folder
    raise FileNotFoundError(
        "speechlens kernel sources not found (looked in "
        + ", ".join(str(c) for c in candidates) + "); reinstall speechlens"
    )


@functools.cache
def _source(name: str) -> str:
    return (kernel_source_dir() / name).read_text(encoding="utf-8")


def _sources_hash() -> str:
    digest = hashlib.sha256()
    for name in CPU_SOURCES:
        digest.update(name.encode())
        digest.update(_source(name).encode())
    return digest.hexdigest()[:16]


# ------------------------------------------------------------------------------------------
# one-time warnings
# ------------------------------------------------------------------------------------------

_warned: set[str] = set()
_warn_lock = threading.Lock()


def _warn_once(key: str, message: str) -> None:
    with _warn_lock:
        if key in _warned:
            return
        _warned.add(key)
    log.warning(message)


def _reset_warnings() -> None:
    """Forget which warnings were logged (tests)."""
    with _warn_lock:
        _warned.clear()


# ------------------------------------------------------------------------------------------
# validation
# ------------------------------------------------------------------------------------------

def _check(cond: bool, message: str) -> None:
    if not cond:
        raise KernelInputError(message)


def _check_float32(**arrays: mx.array) -> None:
    for name, a in arrays.items():
        _check(isinstance(a, mx.array), f"{name} must be an mx.array, got {type(a).__name__}")
        _check(a.dtype == mx.float32, f"{name} must be float32, got {a.dtype}")


def _validate_conv(x: mx.array, weight: mx.array, bias: mx.array) -> None:
    _check_float32(x=x, weight=weight, bias=bias)
    _check(x.ndim == 3, f"x must be [B, L, D], got shape {tuple(x.shape)}")
    batch, length, channels = x.shape
    _check(batch > 0 and length > 0 and channels > 0, f"x has an empty dimension: {x.shape}")
    _check(tuple(weight.shape) == (channels, CONV_WIDTH, 1),
           f"weight must be [D={channels}, {CONV_WIDTH}, 1], got {tuple(weight.shape)}")
    _check(tuple(bias.shape) == (channels,), f"bias must be [D={channels}], got {bias.shape}")


def _validate_scan(u, delta_raw, A_log, B, C, D, z) -> None:
    _check_float32(u=u, delta_raw=delta_raw, A_log=A_log, B=B, C=C, D=D, z=z)
    _check(u.ndim == 3, f"u must be [B, L, D], got shape {tuple(u.shape)}")
    batch, length, channels = u.shape
    _check(batch > 0 and length > 0 and channels > 0, f"u has an empty dimension: {u.shape}")
    for name, a in (("delta_raw", delta_raw), ("z", z)):
        _check(tuple(a.shape) == tuple(u.shape), f"{name} must be {tuple(u.shape)}, got {a.shape}")
    for name, a in (("B", B), ("C", C)):
        _check(tuple(a.shape) == (batch, length, D_STATE),
               f"{name} must be [{batch}, {length}, {D_STATE}], got {tuple(a.shape)}")
    _check(tuple(A_log.shape) == (channels, D_STATE),
           f"A_log must be [{channels}, {D_STATE}], got {tuple(A_log.shape)}")
    _check(tuple(D.shape) == (channels,), f"D must be [{channels}], got {tuple(D.shape)}")


# ------------------------------------------------------------------------------------------
# GPU kernels (Metal / CUDA): built once per backend
# ------------------------------------------------------------------------------------------

@functools.cache
def _gpu_kernel(name: str, which: str):
    inputs = CONV_INPUTS if name == "causal_conv1d" else SCAN_INPUTS
    common = _source("sl_mamba.h")
    if which == "metal":
        return mx.fast.metal_kernel(
            name=f"speechlens_{name}", input_names=list(inputs), output_names=list(OUTPUTS),
            source=_source(f"{name}.metal"), header=_source("sl_backend_metal.h") + common,
            ensure_row_contiguous=False)
    if which == "cuda":
        return mx.fast.cuda_kernel(
            name=f"speechlens_{name}", input_names=list(inputs), output_names=list(OUTPUTS),
            source=_source(f"{name}.cu"), header=_source("sl_backend_cuda.h") + common,
            ensure_row_contiguous=False)
    raise ValueError(f"no GPU kernels for backend {which!r}")


def _threadgroup() -> int:
    return int(os.environ.get("SPEECHLENS_GPU_THREADGROUP", GPU_THREADGROUP))


def _gpu_conv(x: mx.array, weight: mx.array, bias: mx.array, which: str) -> mx.array:
    batch, _, channels = x.shape
    kernel = _gpu_kernel("causal_conv1d", which)
    return kernel(inputs=[x, weight, bias], template=[("DI", int(channels))],
                  grid=(batch * channels, 1, 1), threadgroup=(_threadgroup(), 1, 1),
                  output_shapes=[tuple(x.shape)], output_dtypes=[mx.float32])[0]


def _gpu_scan(u, delta_raw, A_log, B, C, D, z, strict: bool, which: str) -> mx.array:
    batch, _, channels = u.shape
    kernel = _gpu_kernel("selective_scan", which)
    return kernel(inputs=[u, delta_raw, A_log, B, C, D, z],
                  template=[("DI", int(channels)), ("NS", D_STATE), ("STRICT", bool(strict))],
                  grid=(batch * channels, 1, 1), threadgroup=(_threadgroup(), 1, 1),
                  output_shapes=[tuple(u.shape)], output_dtypes=[mx.float32])[0]


_conv_probed: dict[tuple[str, int], bool] = {}


def _gpu_conv_works(which: str, channels: int) -> bool:
    """Compile and run the conv kernel once per (backend, D) on a tiny input, so a dispatch or
    compile failure (which MLX reports only at evaluation) turns into the fallback."""
    key = (which, channels)
    if key not in _conv_probed:
        try:
            x = mx.zeros((1, 2, channels), mx.float32)
            w = mx.zeros((channels, CONV_WIDTH, 1), mx.float32)
            mx.eval(_gpu_conv(x, w, mx.zeros((channels,), mx.float32), which))
            _conv_probed[key] = True
        except Exception as exc:  # noqa: BLE001 - any failure means: use the fallback
            _conv_probed[key] = False
            _warn_once(f"conv-dispatch-{which}",
                       f"causal_conv1d: the {which} kernel failed ({exc}); using mx.conv1d")
    return _conv_probed[key]


# ------------------------------------------------------------------------------------------
# CPU library (ctypes)
# ------------------------------------------------------------------------------------------

_I64P = ctypes.POINTER(ctypes.c_int64)


class _CpuLibrary:
    def __init__(self, path: Path):
        lib = ctypes.CDLL(str(path))
        self.path = path
        if lib.sl_cpu_abi_version() != CPU_ABI_VERSION:
            raise OSError(f"{path}: ABI {lib.sl_cpu_abi_version()} != {CPU_ABI_VERSION}")
        lib.sl_cpu_source_hash.restype = ctypes.c_char_p
        self.source_hash = lib.sl_cpu_source_hash().decode()
        vp, i64, cint = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
        lib.sl_cpu_causal_conv1d.argtypes = [vp, _I64P, vp, _I64P, vp, i64, vp, _I64P,
                                             i64, i64, i64, i64, cint, cint, cint]
        lib.sl_cpu_causal_conv1d.restype = cint
        lib.sl_cpu_selective_scan.argtypes = [vp, _I64P, vp, _I64P, vp, _I64P, vp, _I64P, vp,
                                              _I64P, vp, i64, vp, _I64P, vp, _I64P, i64, i64, i64,
                                              i64, cint, cint, cint, cint, vp, vp, i64]
        lib.sl_cpu_selective_scan.restype = cint
        lib.sl_cpu_exp_poly.argtypes = [vp, vp, i64, cint]
        lib.sl_cpu_exp_poly.restype = None
        lib.sl_cpu_isa.argtypes = [cint]
        lib.sl_cpu_isa.restype = cint
        lib.sl_cpu_channel_sums.argtypes = [vp, i64, i64, vp, vp, cint]
        lib.sl_cpu_channel_sums.restype = None
        lib.sl_cpu_affine_prelu.argtypes = [vp, vp, i64, i64, vp, vp, vp, vp, cint]
        lib.sl_cpu_affine_prelu.restype = None
        self.lib = lib

    def isa_name(self, requested: int = -1) -> str:
        return {0: "generic (4 lanes)", 1: "AVX2 (8 lanes)", 2: "AVX-512 (16 lanes)"}.get(
            self.lib.sl_cpu_isa(requested), "?")


def _prebuilt_paths() -> list[Path]:
    here = Path(__file__).resolve().parent
    return [here / f"_cpu_kernels{suffix}" for suffix in machinery.EXTENSION_SUFFIXES]


def _cache_dir() -> Path:
    root = os.environ.get("SPEECHLENS_CACHE_DIR")
    if root:
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "speechlens"


def find_cxx() -> str | None:
    """A C++ compiler: $CXX, else c++, g++ or clang++ on PATH."""
    for cand in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if cand and shutil.which(cand.split()[0]):
            return cand
    return None


def compile_cpu_library(dest: Path, source_hash: str, cxx: str | None = None) -> Path:
    """Compile kernels/cpu_kernels.cpp into the shared library ``dest`` (atomically)."""
    cxx = cxx or find_cxx()
    if cxx is None:
        raise OSError("no C++ compiler found (set CXX)")
    src = kernel_source_dir()
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=dest.name, suffix=".tmp", dir=dest.parent)
    os.close(fd)
    cmd = [*cxx.split(), *CPU_COMPILE_FLAGS, "-shared", f"-DSL_SOURCE_HASH=\"{source_hash}\"",
           f"-I{src}", "-o", tmp, str(src / "cpu_kernels.cpp")]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise OSError(f"compiling the CPU kernels failed: {' '.join(cmd)}\n{proc.stderr}")
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return dest


_cpu_lib_lock = threading.Lock()
_cpu_lib_state: dict[str, object] = {}


def cpu_library() -> _CpuLibrary | None:
    """The CPU kernel library, loaded once: the one ``pip install`` built if it matches the
    current sources, else one compiled now into the cache folder, else None."""
    with _cpu_lib_lock:
        if "lib" in _cpu_lib_state:
            return _cpu_lib_state["lib"]  # type: ignore[return-value]
        lib, errors = None, []
        try:
            want = _sources_hash()
        except OSError as exc:
            want, errors = None, [str(exc)]
        for path in _prebuilt_paths():
            if path.is_file():
                try:
                    cand = _CpuLibrary(path)
                    if want is None or cand.source_hash == want:
                        lib = cand
                        break
                    errors.append(f"{path.name} was built from other kernel sources")
                except OSError as exc:
                    errors.append(str(exc))
        if lib is None and want is not None:
            tag = f"{platform.machine()}-{sys.platform}"
            dest = _cache_dir() / "cpu-kernels" / f"sl_cpu_{want}_{tag}_abi{CPU_ABI_VERSION}.so"
            try:
                if not dest.is_file():
                    compile_cpu_library(dest, want)
                lib = _CpuLibrary(dest)
            except OSError as exc:
                errors.append(str(exc))
        if lib is None:
            _warn_once("cpu-library", "speechlens CPU kernels unavailable ("
                       + "; ".join(errors) + "); using slow MLX-op fallbacks")
        _cpu_lib_state["lib"] = lib
        return lib


def cpu_threads() -> int:
    env = os.environ.get("SPEECHLENS_CPU_THREADS")
    if env:
        return max(1, int(env))
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS
        return max(1, os.cpu_count() or 1)


def _view(a: mx.array) -> np.ndarray:
    """Zero-copy NumPy view of an evaluated float32 array."""
    return np.asarray(a)


def _strides(v: np.ndarray) -> ctypes.Array:
    return (ctypes.c_int64 * v.ndim)(*(s // v.itemsize for s in v.strides))


def _unit_last(v: np.ndarray) -> np.ndarray:
    return v if v.strides[-1] == v.itemsize else np.ascontiguousarray(v)


def _output_like(shape, *inputs: mx.array) -> tuple[mx.array, np.ndarray] | None:
    """A fresh MLX array to write the result into (evaluated with the inputs), with a writable
    NumPy view of its buffer; None if MLX did not give it its own contiguous buffer."""
    out = mx.zeros(shape, mx.float32)
    mx.eval(out, *inputs)
    view = _view(out)
    if view.flags.c_contiguous and view.flags.writeable:
        return out, view
    return None


def _cpu_conv(lib: _CpuLibrary, x, weight, bias, silu: bool = False) -> mx.array:
    batch, length, channels = x.shape
    pair = _output_like(x.shape, x, weight, bias)
    xv, wv, bv = _unit_last(_view(x)), _view(weight), _view(bias)
    if pair is None:
        ov = np.empty(x.shape, np.float32)
    else:
        out, ov = pair
    w2 = wv.reshape(channels, CONV_WIDTH)
    rc = lib.lib.sl_cpu_causal_conv1d(
        xv.ctypes.data, _strides(xv), w2.ctypes.data, _strides(w2), bv.ctypes.data,
        bv.strides[0] // 4, ov.ctypes.data, _strides(ov), batch, length, channels, CONV_WIDTH,
        cpu_threads(), -1, int(silu))
    if rc != 0:
        raise RuntimeError(f"sl_cpu_causal_conv1d returned {rc}")
    return out if pair is not None else mx.array(ov)


def _cpu_scan(lib: _CpuLibrary, u, delta_raw, A_log, B, C, D, z, strict: bool,
              isa: int = -1, thread_order: bool = False, dt_proj=None) -> mx.array:
    batch, length, channels = u.shape
    extra = () if dt_proj is None else (mx.contiguous(dt_proj[0].T), mx.contiguous(dt_proj[1]))
    pair = _output_like(u.shape, u, delta_raw, A_log, B, C, D, z, *extra)
    uv, zv = (_unit_last(_view(a)) for a in (u, z))
    # the rank-R input of a fused dt projection is read through its strides as it is
    dv = _view(delta_raw) if extra else _unit_last(_view(delta_raw))
    wv, biasv = (_view(a) for a in extra) if extra else (None, None)
    av, bv, cv, sv = _view(A_log), _view(B), _view(C), _view(D)
    if pair is None:
        ov = np.empty(u.shape, np.float32)
    else:
        out, ov = pair
    rc = lib.lib.sl_cpu_selective_scan(
        uv.ctypes.data, _strides(uv), dv.ctypes.data, _strides(dv), av.ctypes.data, _strides(av),
        bv.ctypes.data, _strides(bv), cv.ctypes.data, _strides(cv), sv.ctypes.data,
        sv.strides[0] // 4, zv.ctypes.data, _strides(zv), ov.ctypes.data, _strides(ov), batch,
        length, channels, D_STATE, int(bool(strict)), cpu_threads(), isa, int(thread_order),
        None if wv is None else wv.ctypes.data, None if biasv is None else biasv.ctypes.data,
        0 if wv is None else wv.shape[0])
    if rc != 0:
        raise RuntimeError(f"sl_cpu_selective_scan returned {rc}")
    return out if pair is not None else mx.array(ov)


def instance_norm_prelu(tiles: list[mx.array], weight: mx.array, bias: mx.array, eps: float,
                        slope: mx.array) -> list[mx.array] | None:
    """InstanceNorm over the time tiles [B, t, F, C] of one plane, then PReLU, by the CPU
    library: statistics summed in float64 (two passes: mean, then squared deviations), the
    affine and PReLU in one pass per tile instead of MLX's separate single-threaded ops.
    None where the default device is not the CPU or the library is unavailable."""
    if mx.default_device() != mx.cpu:
        return None
    lib = cpu_library()
    if lib is None:
        return None
    mx.eval(tiles, weight, bias, slope)
    views = [np.ascontiguousarray(_view(tile)) for tile in tiles]
    batch, _, width, channels = views[0].shape
    count = sum(v.shape[1] for v in views) * width
    weight_v, bias_v, slope_v = (np.ascontiguousarray(_view(a), dtype=np.float32)
                                 for a in (weight, bias, slope))
    outs = [_output_like(v.shape) or (None, np.empty(v.shape, np.float32)) for v in views]
    threads = cpu_threads()

    def plane_sums(b: int, center: np.ndarray | None) -> np.ndarray:
        """Per-channel float64 sums of x (center None) or (x - center)^2 over all tiles."""
        sums = np.zeros(channels, np.float64)
        for v in views:
            lib.lib.sl_cpu_channel_sums(v[b].ctypes.data, v.shape[1] * width, channels,
                                        None if center is None else center.ctypes.data,
                                        sums.ctypes.data, threads)
        return sums

    for b in range(batch):
        mean = (plane_sums(b, None) / count).astype(np.float32)
        scale = (1.0 / np.sqrt(plane_sums(b, mean) / count + eps)).astype(np.float32) * weight_v
        for v, (_, ov) in zip(views, outs, strict=True):
            lib.lib.sl_cpu_affine_prelu(v[b].ctypes.data, ov[b].ctypes.data, v.shape[1] * width,
                                        channels, mean.ctypes.data, scale.ctypes.data,
                                        bias_v.ctypes.data, slope_v.ctypes.data, threads)
    return [out if out is not None else mx.array(ov) for out, ov in outs]


def cpu_exp_poly(x: np.ndarray, isa: int = -1) -> np.ndarray:
    """The strict-mode decay exponential of kernels/sl_mamba.h, run by the CPU library."""
    lib = cpu_library()
    if lib is None:
        raise RuntimeError("the CPU kernel library is unavailable")
    xv = np.ascontiguousarray(x, dtype=np.float32)
    out = np.empty_like(xv)
    lib.lib.sl_cpu_exp_poly(xv.ctypes.data, out.ctypes.data, xv.size, isa)
    return out


# ------------------------------------------------------------------------------------------
# MLX-op versions: the conv fallback and the scan of last resort on the CPU
# ------------------------------------------------------------------------------------------

def conv1d_fallback(x: mx.array, weight: mx.array, bias: mx.array) -> mx.array:
    """``mx.conv1d(groups=D)`` with K-1 zeros of causal padding, cropped to L, plus bias."""
    channels, kernel = weight.shape[0], weight.shape[1]
    length = x.shape[1]
    y = mx.conv1d(x, weight, padding=kernel - 1, groups=channels)
    return y[:, :length, :] + bias


def _exp_poly_ops(x: mx.array) -> mx.array:
    y = x * mx.array(1.4426950408889634, mx.float32)
    y = mx.maximum(y, -127.0)
    k = mx.round(y)
    f = y - k
    p = mx.array(0.00015465313, mx.float32)
    for c in (0.0013395279, 0.0096180400, 0.055503407, 0.24022651, 0.6931472, 1.0):
        p = p * f + c
    scale = mx.view(mx.left_shift(k.astype(mx.int32) + 127, 23), mx.float32)
    return p * scale


def selective_scan_ops(u, delta_raw, A_log, B, C, D, z, strict: bool = False,
                       eval_every: int = 32) -> mx.array:
    """The scan in MLX ops, one step at a time, evaluated every ``eval_every`` steps so the
    lazy graph stays bounded. Slow; used only when no CPU kernel library can be had."""
    if strict:
        delta = mx.maximum(delta_raw, 0.0) + mx.log1p(mx.exp(-mx.abs(delta_raw)))
    else:
        delta = mx.log(1.0 + mx.exp(delta_raw))
    A = -mx.exp(A_log)
    batch, length, channels = u.shape
    h = mx.zeros((batch, channels, A.shape[1]), dtype=mx.float32)
    ys = []
    for t in range(length):
        dt = delta[:, t, :, None]
        arg = dt * A
        decay = _exp_poly_ops(arg) if strict else mx.exp(arg)
        if strict:
            h = decay * h + (dt * B[:, t, None, :]) * u[:, t, :, None]
        else:
            h = decay * h + (dt * u[:, t, :, None]) * B[:, t, None, :]
        ys.append((h * C[:, t, None, :]).sum(-1))
        if (t + 1) % eval_every == 0:
            mx.eval(h, ys)
    y = mx.stack(ys, axis=1) + D * u
    gate = z / (1.0 + mx.exp(-z)) if strict else z * (1.0 / (1.0 + mx.exp(-z)))
    return y * gate


# ------------------------------------------------------------------------------------------
# public entry points
# ------------------------------------------------------------------------------------------

def conv_kernel_disabled() -> bool:
    return any(os.environ.get(k, "").strip() not in ("", "0")
               for k in (DISABLE_CONV_ENV, DISABLE_CONV_ENV_ALIAS))


def causal_conv1d(x: mx.array, weight: mx.array, bias: mx.array, silu: bool = False) -> mx.array:
    """x [B, L, D], weight [D, 4, 1] (MLX layout), bias [D] -> [B, L, D], zero causal padding.

    ``silu=True`` returns SiLU(conv): fused into the CPU kernel (MLX's CPU sigmoid is scalar and
    cost more than the conv itself, measured); a separate op on GPU backends, where fusing
    measured slower (the seed design's Metal note).
    """
    y, fused = _dispatch_conv(x, weight, bias, silu)
    return y * mx.sigmoid(y) if silu and not fused else y


def _dispatch_conv(x, weight, bias, silu: bool) -> tuple[mx.array, bool]:
    """The conv by the best path available; the flag says whether SiLU was applied too."""
    if conv_kernel_disabled():
        _warn_once("conv-disabled", f"causal_conv1d: kernel disabled by {DISABLE_CONV_ENV}; "
                   "using mx.conv1d")
        return conv1d_fallback(x, weight, bias), False
    try:
        _validate_conv(x, weight, bias)
    except KernelInputError as exc:
        _warn_once("conv-validation", f"causal_conv1d: {exc}; using mx.conv1d")
        return conv1d_fallback(x, weight, bias), False
    which = backend()
    try:
        if which == "cpu":
            lib = cpu_library()
            if lib is not None:
                return _cpu_conv(lib, x, weight, bias, silu), silu
            _warn_once("conv-no-cpu-library", "causal_conv1d: no CPU kernel library; "
                       "using mx.conv1d")
        elif _gpu_conv_works(which, int(x.shape[2])):
            return _gpu_conv(x, weight, bias, which), False
    except Exception as exc:  # noqa: BLE001 - a dispatch failure means: use the fallback
        _warn_once(f"conv-dispatch-{which}",
                   f"causal_conv1d: the {which} kernel failed ({exc}); using mx.conv1d")
    return conv1d_fallback(x, weight, bias), False


def selective_scan(
    u: mx.array,
    delta_raw: mx.array,
    A_log: mx.array,
    B: mx.array,
    C: mx.array,
    D: mx.array,
    z: mx.array,
    strict: bool = False,
    dt_proj: tuple[mx.array, mx.array] | None = None,
) -> mx.array:
    """y_t = C_t . h_t + D*u_t with h_t = exp(dt*A) h_{t-1} + dt*B_t*u_t, then y * SiLU(z).

    dt = softplus(delta_raw), A = -exp(A_log). u, delta_raw, z [B, L, D]; B, C [B, L, 16];
    A_log [D, 16]; D [D]; all float32. ``strict`` selects strict mode (docs/kernels.md).

    ``dt_proj=(weight [D, R], bias [D])`` passes delta_raw as the rank-R input [B, L, R] of the
    dt projection instead: the CPU kernel applies it per step (a K=R GEMM is slow and its
    [B, L, D] output costs a memory round trip); elsewhere it runs as a matmul first.
    """
    which = backend()
    if dt_proj is not None:
        lib = cpu_library() if which == "cpu" else None
        if lib is not None and _fusable_dt_proj(lib, u, delta_raw, dt_proj):
            _validate_scan(u, mx.zeros_like(u), A_log, B, C, D, z)
            return _cpu_scan(lib, u, delta_raw, A_log, B, C, D, z, strict, dt_proj=dt_proj)
        weight, bias = dt_proj
        delta_raw = mx.addmm(bias, delta_raw, weight.T)
    _validate_scan(u, delta_raw, A_log, B, C, D, z)
    if which != "cpu":
        return _gpu_scan(u, delta_raw, A_log, B, C, D, z, strict, which)
    lib = cpu_library()
    if lib is not None:
        return _cpu_scan(lib, u, delta_raw, A_log, B, C, D, z, strict)
    return selective_scan_ops(u, delta_raw, A_log, B, C, D, z, strict)


def _fusable_dt_proj(lib: _CpuLibrary, u, delta_raw, dt_proj) -> bool:
    """The CPU kernel fuses the projection for whole SIMD groups of channels only."""
    weight, bias = dt_proj
    channels = u.shape[2]
    lanes = {2: 16, 1: 8}.get(lib.lib.sl_cpu_isa(-1), 4)
    return (delta_raw.ndim == 3 and delta_raw.shape[:2] == u.shape[:2]
            and weight.shape == (channels, delta_raw.shape[2]) and bias.shape == (channels,)
            and channels % lanes == 0
            and all(a.dtype == mx.float32 for a in (delta_raw, weight, bias)))


def kernel_info() -> dict[str, str]:
    """Where the kernels run here (for benchmarks and bug reports)."""
    which = backend()
    info = {"backend": which, "mlx": mx.__version__}
    if which == "cpu":
        lib = cpu_library()
        info["cpu_library"] = str(lib.path) if lib else "unavailable (MLX-op fallbacks)"
        if lib:
            info["cpu_isa"] = lib.isa_name()
            info["cpu_threads"] = str(cpu_threads())
    return info
