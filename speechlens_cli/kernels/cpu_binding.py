"""The CPU kernel library (``kernels/cpu_kernels.cpp``) through ctypes: finding or compiling
it, checking its ABI and source hash, and binding its C entry points by parameter name."""

from __future__ import annotations

import ctypes
import os
import platform
import sys
import threading
from importlib import machinery
from pathlib import Path

from .. import settings
from .build import CPU_ABI_VERSION, CPU_ISAS, KERNEL_DEFINES
from .compiler import compile_cpu_library
from .notices import warn_once
from .sources import cache_dir, cpu_sources_hash

CPU_THREADS_ENV = settings.CPU_THREADS.name
#: Which of the library's SIMD builds runs (the best this CPU has unless set): benchmarks
#: compare them on a CPU that runs more than one.
CPU_ISA_ENV = settings.CPU_ISA.name
CPU_ISA_CHOICES = {"best": -1, **CPU_ISAS}

_VP, _I64, _INT, _F32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
_I64P = ctypes.POINTER(ctypes.c_int64)
_ISA_LABELS = {CPU_ISAS["generic"]: "generic", CPU_ISAS["avx2"]: "AVX2",
               CPU_ISAS["avx512"]: "AVX-512"}

# The C parameter lists, in order: Python calls the entry points by these names, so a call site
# says what every argument is. Strides are in elements.
_CONV_PARAMS = (
    ("x", _VP), ("x_strides", _I64P), ("weight", _VP), ("weight_strides", _I64P),
    ("bias", _VP), ("bias_stride", _I64), ("out", _VP), ("out_strides", _I64P),
    ("batch", _I64), ("length", _I64), ("channels", _I64), ("taps", _I64),
    ("threads", _INT), ("isa", _INT), ("silu", _INT),
)
_BIMAMBA_CONV_PARAMS = (
    ("x", _VP), ("x_strides", _I64P), ("weight", _VP), ("weight_strides", _I64P),
    ("bias", _VP), ("bias_strides", _I64P), ("out", _VP), ("out_strides", _I64P),
    ("batch", _I64), ("length", _I64), ("channels", _I64), ("taps", _I64),
    ("threads", _INT), ("isa", _INT),
)
_SCAN_PARAMS = (
    ("u", _VP), ("u_strides", _I64P), ("dt", _VP), ("dt_strides", _I64P),
    ("A_log", _VP), ("A_log_strides", _I64P), ("B", _VP), ("B_strides", _I64P),
    ("C", _VP), ("C_strides", _I64P), ("D", _VP), ("D_stride", _I64),
    ("z", _VP), ("z_strides", _I64P), ("out", _VP), ("out_strides", _I64P),
    ("batch", _I64), ("length", _I64), ("channels", _I64), ("states", _I64),
    ("strict", _INT), ("threads", _INT), ("isa", _INT), ("flags", _INT),
    ("dt_weight_t", _VP), ("dt_bias", _VP), ("rank", _I64),
)
_EXP_POLY_PARAMS = (("x", _VP), ("y", _VP), ("n", _I64), ("isa", _INT))
_CHANNEL_SUMS_PARAMS = (("x", _VP), ("rows", _I64), ("channels", _I64), ("center", _VP),
                        ("sums", _VP), ("threads", _INT))
_AFFINE_PRELU_PARAMS = (("x", _VP), ("out", _VP), ("rows", _I64), ("channels", _I64),
                        ("mean", _VP), ("scale", _VP), ("bias", _VP), ("slope", _VP),
                        ("threads", _INT))

_CONV2D_PARAMS = (
    ("planes", _VP), ("plane_channels", _I64P), ("nplanes", _I64), ("weight", _VP),
    ("bias", _VP), ("out", _VP), ("batch", _I64), ("height", _I64), ("width", _I64),
    ("out_channels", _I64), ("kernel_height", _I64), ("kernel_width", _I64),
    ("pad_height", _I64), ("pad_width", _I64), ("dilation_height", _I64),
    ("dilation_width", _I64), ("threads", _INT), ("isa", _INT),
)

_PROJECT_PARAMS = (
    ("a0", _VP), ("a0_strides", _I64P), ("k0", _I64), ("w0", _VP), ("w0_strides", _I64P),
    ("a1", _VP), ("a1_strides", _I64P), ("k1", _I64), ("w1", _VP), ("w1_strides", _I64P),
    ("bias", _VP), ("bias_stride", _I64), ("out", _VP), ("out_strides", _I64P),
    ("batch", _I64), ("rows", _I64), ("columns", _I64), ("norm_weight", _VP),
    ("norm_bias", _VP), ("norm_eps", _F32), ("threads", _INT), ("isa", _INT),
)


class _Entry:
    """One C entry point, called with keyword arguments only (all of them, no others)."""

    def __init__(self, lib: ctypes.CDLL, name: str, params, restype):
        self.name = name
        self.names = tuple(param for param, _ in params)
        self.function = getattr(lib, name)
        self.function.argtypes = [kind for _, kind in params]
        self.function.restype = restype

    def __call__(self, **arguments):
        if arguments.keys() != set(self.names):
            missing = sorted(set(self.names) - arguments.keys())
            extra = sorted(arguments.keys() - set(self.names))
            raise TypeError(f"{self.name}: missing {missing}, unknown {extra}")
        return self.function(*(arguments[param] for param in self.names))


def _built_with(lib: ctypes.CDLL) -> dict[str, int]:
    """The macros `lib` reports it was compiled with (sl_cpu_defines)."""
    lib.sl_cpu_defines.restype = ctypes.c_char_p
    pairs = (item.split("=", 1) for item in lib.sl_cpu_defines().decode().split())
    return {name: int(value) for name, value in pairs}


class CpuLibrary:
    """A loaded library whose ABI and shared numbers (build.KERNEL_DEFINES) match this Python
    code: one built with another state size would read the wrong number of B and C values."""

    def __init__(self, path: Path):
        lib = ctypes.CDLL(str(path))
        self.path = path
        if lib.sl_cpu_abi_version() != CPU_ABI_VERSION:
            raise OSError(f"{path}: ABI {lib.sl_cpu_abi_version()} != {CPU_ABI_VERSION}")
        self.defines = built = _built_with(lib)
        want = KERNEL_DEFINES["cpu"]
        if built != want:
            differ = ", ".join(f"{name} {built.get(name)} (build.py: {want.get(name)})"
                               for name in sorted(built.keys() | want.keys())
                               if built.get(name) != want.get(name))
            raise OSError(f"{path} was built with other kernel numbers: {differ}")
        lib.sl_cpu_source_hash.restype = ctypes.c_char_p
        self.source_hash = lib.sl_cpu_source_hash().decode()
        self.causal_conv1d = _Entry(lib, "sl_cpu_causal_conv1d", _CONV_PARAMS, _INT)
        self.bimamba_conv1d = _Entry(lib, "sl_cpu_bimamba_conv1d", _BIMAMBA_CONV_PARAMS, _INT)
        self.selective_scan = _Entry(lib, "sl_cpu_selective_scan", _SCAN_PARAMS, _INT)
        self.exp_poly = _Entry(lib, "sl_cpu_exp_poly", _EXP_POLY_PARAMS, None)
        self.exp2_decay = _Entry(lib, "sl_cpu_exp2_decay", _EXP_POLY_PARAMS, None)
        self.channel_sums = _Entry(lib, "sl_cpu_channel_sums", _CHANNEL_SUMS_PARAMS, None)
        self.affine_prelu = _Entry(lib, "sl_cpu_affine_prelu", _AFFINE_PRELU_PARAMS, None)
        self.conv2d = _Entry(lib, "sl_cpu_conv2d", _CONV2D_PARAMS, _INT)
        self.project = _Entry(lib, "sl_cpu_project", _PROJECT_PARAMS, _INT)
        self._isa = _Entry(lib, "sl_cpu_isa", (("requested", _INT),), _INT)
        self._lanes = _Entry(lib, "sl_cpu_lanes", (("requested", _INT),), _INT)

    def isa(self, requested: int = -1) -> int:
        """The ISA `requested` (-1 best, else a code of CPU_ISAS) resolves to here."""
        return self._isa(requested=requested)

    def isa_name(self, requested: int = -1) -> str:
        label = _ISA_LABELS.get(self.isa(requested), "?")
        return f"{label} ({self._lanes(requested=requested)} lanes)"

    def lanes(self) -> int:
        """SIMD width, in channels, of the ISA the kernels run here (cpu_isa)."""
        return self._lanes(requested=cpu_isa())


def _prebuilt_paths() -> list[Path]:
    package = Path(__file__).resolve().parents[1]  # where setup.py puts _cpu_kernels*.so
    return [package / f"_cpu_kernels{suffix}" for suffix in machinery.EXTENSION_SUFFIXES]


_cpu_lib_lock = threading.Lock()
_cpu_lib_state: dict[str, object] = {}


def cpu_library() -> CpuLibrary | None:
    """The CPU kernel library, loaded once: the one ``pip install`` built if it matches the
    current sources, else one compiled now into the cache folder, else None."""
    with _cpu_lib_lock:
        if "lib" in _cpu_lib_state:
            return _cpu_lib_state["lib"]  # type: ignore[return-value]
        lib, errors = None, []
        try:
            want = cpu_sources_hash()
        except OSError as exc:
            want, errors = None, [str(exc)]
        for path in _prebuilt_paths():
            if path.is_file():
                try:
                    cand = CpuLibrary(path)
                    if want is None or cand.source_hash == want:
                        lib = cand
                        break
                    errors.append(f"{path.name} was built from other kernel sources")
                except OSError as exc:
                    errors.append(str(exc))
        if lib is None and want is not None:
            tag = f"{platform.machine()}-{sys.platform}"
            dest = cache_dir() / "cpu-kernels" / f"sl_cpu_{want}_{tag}_abi{CPU_ABI_VERSION}.so"
            try:
                if not dest.is_file():
                    compile_cpu_library(dest, want)
                lib = CpuLibrary(dest)
            except OSError as exc:
                errors.append(str(exc))
        if lib is None:
            warn_once("cpu-library", "speechlens CPU kernels unavailable ("
                      + "; ".join(errors) + "); using slow MLX-op fallbacks")
        _cpu_lib_state["lib"] = lib
        _cpu_lib_state["errors"] = errors
        return lib


def cpu_library_errors() -> list[str]:
    """Why cpu_library() found no library it could load (no C++ compiler, a build that
    failed, one built from other sources), as it logged it; empty before it ran or where it
    found one."""
    with _cpu_lib_lock:
        return list(_cpu_lib_state.get("errors", ())) if _cpu_lib_state.get("lib") is None \
            else []


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # macOS has no affinity call
        return max(1, os.cpu_count() or 1)


def cpu_isa() -> int:
    """The ISA SPEECHLENS_CPU_ISA asks for (best, avx512, avx2, generic), -1 (the best this CPU
    has) if unset; a build the CPU lacks resolves to its best (CpuLibrary.isa)."""
    return CPU_ISA_CHOICES[settings.CPU_ISA.value()]


def cpu_threads() -> int:
    """SPEECHLENS_CPU_THREADS, at most the cores this process may use (the kernels are
    compute-bound: more threads only contend), else all of those cores."""
    cores = usable_cores()
    return min(settings.CPU_THREADS.value() or cores, cores)
