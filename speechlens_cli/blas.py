"""Fast BLAS for MLX's Linux CPU backend, with results independent of the thread count.

The Linux `mlx[cpu]` wheel links the slow reference BLAS (~4 GFLOP/s here). Loading an
optimized BLAS's `cblas_sgemm` with RTLD_GLOBAL *before* MLX is imported puts it first in the
dynamic linker's global scope, so MLX binds to it (~5-7x faster matmuls, measured). MLX binds
its BLAS when mlx.core is imported (Python loads extensions with RTLD_NOW: a library loaded
after that changes nothing, measured), so preload() must run before `mlx.core` is imported;
runtime.prepare() calls it, and importing this module loads nothing.

MLX's calls go through the small `_blas_shim` library (csrc/blas_shim.c): it reaches
scipy-openblas32, whose symbols carry a `scipy_` prefix, and it runs the BLAS single-threaded
over blocks of rows that depend on the shape alone, spread over the threads the BLAS would have
used. OpenBLAS's own threading rounds differently with 1 and 2 threads on some CPUs (AMD Zen,
measured), so without the shim the output would depend on OPENBLAS_NUM_THREADS.

First choice is scipy-openblas32, a PyPI dependency on Linux; then a system OpenBLAS/BLIS/MKL.
SPEECHLENS_BLAS=off keeps MLX's own BLAS; SPEECHLENS_BLAS=/path/to/lib.so picks a library.
"""

from __future__ import annotations

import ctypes
import importlib.util
import sys
from pathlib import Path

from . import settings

BLAS_ENV = settings.BLAS.name
CANDIDATES = ("libopenblas.so.0", "libopenblas.so", "libopenblasp.so.0", "libblis.so.4",
              "libmkl_rt.so.2")
INSTALL_HINT = ("install an optimized BLAS (Debian/Ubuntu: `apt install libopenblas0`; "
                "Fedora: `dnf install openblas`) or point SPEECHLENS_BLAS at one")
#: (get, set) thread-count functions of the BLAS libraries speechlens knows, by symbol prefix.
THREAD_CONTROLS = (("scipy_openblas_get_num_threads", "scipy_openblas_set_num_threads"),
                   ("openblas_get_num_threads", "openblas_set_num_threads"),
                   ("bli_thread_get_num_threads", "bli_thread_set_num_threads"),
                   ("MKL_Get_Max_Threads", "MKL_Set_Num_Threads"))

#: The library that was loaded, or why none was.
status: str = "not attempted"
loaded: str | None = None
#: Threads the shim spreads a matmul over (None: no shim, or no BLAS loaded).
threads: int | None = None
#: Whether speechlens sets the loaded BLAS's thread count (so its results do not depend on it).
threads_controlled: bool = False


def preload() -> str | None:
    """Load the first optimized BLAS found; returns its name, or None."""
    global status, loaded
    if loaded is not None:
        return loaded
    if not sys.platform.startswith("linux"):
        status = "not needed on this platform"
        return None
    if "mlx.core" in sys.modules:
        status = ("MLX was imported before speechlens_cli.runtime.prepare(): MLX keeps its "
                  "own BLAS")
        return None
    choice = settings.BLAS.value()
    if choice is None:
        status = f"disabled by {BLAS_ENV}"
        return None
    found = None if choice else _scipy_openblas()
    for name in ([choice] if choice else CANDIDATES):
        if found:
            break
        try:
            found = (name, ctypes.CDLL(name))
        except OSError:
            continue
    threading = _bind(*found) if found else None
    if threading:
        loaded = found[0]
        status = f"using {loaded}, {threading}"
        return loaded
    if status == "not attempted":
        status = f"no optimized BLAS found ({INSTALL_HINT})"
    return None


def _scipy_openblas() -> tuple[str, ctypes.CDLL] | None:
    """scipy-openblas32's library and its version (the one OpenBLAS reports: the package's, as
    scipy-openblas builds it)."""
    path = scipy_openblas_path()
    if path is None:
        return None
    try:
        library = ctypes.CDLL(str(path))
        config = library.scipy_openblas_get_config
    except (OSError, AttributeError):
        return None
    config.restype = ctypes.c_char_p
    words = (config() or b"").decode(errors="replace").split()   # "OpenBLAS 0.3.34.481.3 ..."
    return f"scipy-openblas32 {words[1] if len(words) > 1 else '(version unknown)'}", library


def scipy_openblas_path() -> Path | None:
    """Where scipy-openblas32 keeps its library, found without importing the package: its
    __init__ reads its version through importlib.metadata, whose imports (~30 modules: email,
    zipfile, ...) nothing else in a run needs. It is where the package's get_lib_dir() and
    get_library() name it (tests/test_blas.py checks that)."""
    spec = importlib.util.find_spec("scipy_openblas32")
    if spec is None or not spec.submodule_search_locations:
        return None
    found = sorted(Path(spec.submodule_search_locations[0], "lib").glob("libscipy_openblas*.so"))
    return found[0] if found else None


def _bind(name: str, library: ctypes.CDLL) -> str | None:
    """Point the shim's cblas_sgemm at `library`'s and make it global; returns how it threads,
    or None if either lacks what is needed (the shim is built at install time by a C compiler)."""
    global status, threads, threads_controlled
    sgemm = next((getattr(library, s) for s in ("scipy_cblas_sgemm", "cblas_sgemm")
                  if hasattr(library, s)), None)
    shims = sorted(Path(__file__).parent.glob("_blas_shim*.so"))
    if sgemm is None or not shims:
        return None
    count, set_threads = 1, None
    for get_name, set_name in THREAD_CONTROLS:
        if hasattr(library, get_name) and hasattr(library, set_name):
            count = int(getattr(library, get_name)())
            set_threads = ctypes.cast(getattr(library, set_name), ctypes.c_void_p)
            break
    try:
        # Checked while still private: a shim left by an older build must never become global
        # (MLX would bind to a cblas_sgemm that forwards nowhere).
        if not hasattr(ctypes.CDLL(str(shims[0])), "speechlens_blas_threads"):
            status = f"{shims[0].name} is from an older build: reinstall speechlens"
            return None
        shim = ctypes.CDLL(str(shims[0]), mode=ctypes.RTLD_GLOBAL)
    except OSError:
        return None
    # A BLAS whose threads speechlens cannot turn off keeps them: its rounding may then depend
    # on the thread count, so the shim adds no threads of its own.
    shim.speechlens_blas_bind(ctypes.cast(sgemm, ctypes.c_void_p), set_threads,
                              count if set_threads else 1)
    threads = int(shim.speechlens_blas_threads())
    threads_controlled = set_threads is not None
    if set_threads is None:
        return "its own threads (its rounding may depend on their count)"
    return f"{threads} thread(s) over fixed row blocks (results independent of the thread count)"
