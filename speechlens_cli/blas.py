"""Fast BLAS for MLX's Linux CPU backend.

The Linux `mlx[cpu]` wheel links the slow reference BLAS (~4 GFLOP/s here). Loading an
optimized BLAS with RTLD_GLOBAL *before* MLX is imported puts its `cblas_sgemm` first in the
dynamic linker's global scope, so MLX binds to it (~5-7x faster matmuls, measured). This module
must therefore be imported before `mlx.core`; speechlens_cli/__init__.py does so.

First choice is scipy-openblas32, a PyPI dependency on Linux, reached through the small
`_blas_shim` library (csrc/blas_shim.c) because its symbols carry a `scipy_` prefix; then a
system OpenBLAS/BLIS/MKL. SPEECHLENS_BLAS=off keeps MLX's own BLAS; SPEECHLENS_BLAS=/path/to/lib.so
picks a library.
"""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

BLAS_ENV = "SPEECHLENS_BLAS"
CANDIDATES = ("libopenblas.so.0", "libopenblas.so", "libopenblasp.so.0", "libblis.so.4",
              "libmkl_rt.so.2")
INSTALL_HINT = ("install an optimized BLAS (Debian/Ubuntu: `apt install libopenblas0`; "
                "Fedora: `dnf install openblas`) or point SPEECHLENS_BLAS at one")

#: The library that was loaded, or why none was.
status: str = "not attempted"
loaded: str | None = None


def preload() -> str | None:
    """Load the first optimized BLAS found; returns its name, or None."""
    global status, loaded
    if loaded is not None:
        return loaded
    if not sys.platform.startswith("linux"):
        status = "not needed on this platform"
        return None
    if "mlx.core" in sys.modules:
        status = "MLX was imported before speechlens: MLX keeps its own BLAS"
        return None
    choice = os.environ.get(BLAS_ENV, "").strip()
    if choice.lower() in ("off", "0", "none", "reference"):
        status = f"disabled by {BLAS_ENV}"
        return None
    if not choice:
        shimmed = _load_scipy_openblas()
        if shimmed:
            loaded, status = shimmed, f"using {shimmed}"
            return shimmed
    for name in ([choice] if choice else CANDIDATES):
        try:
            library = ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
            library.cblas_sgemm  # noqa: B018 - must export the symbol MLX calls
        except (OSError, AttributeError):
            continue
        loaded, status = name, f"using {name}"
        return name
    status = f"no optimized BLAS found ({INSTALL_HINT})"
    return None


def _load_scipy_openblas() -> str | None:
    """Bind the shim's cblas_sgemm to scipy-openblas and make it global; None if unavailable."""
    try:
        import scipy_openblas32
    except ImportError:
        return None
    shims = sorted(Path(__file__).parent.glob("_blas_shim*.so"))
    if not shims:
        return None
    try:
        openblas = ctypes.CDLL(
            str(Path(scipy_openblas32.get_lib_dir()) / f"lib{scipy_openblas32.get_library()}.so")
        )
        shim = ctypes.CDLL(str(shims[0]), mode=ctypes.RTLD_GLOBAL)
        shim.speechlens_blas_bind(ctypes.cast(openblas.scipy_cblas_sgemm, ctypes.c_void_p))
    except (OSError, AttributeError):
        return None
    return f"scipy-openblas32 {scipy_openblas32.__version__}"
