"""Where the model runs, decided in one place, and what speechlens changes in its process.

**The runtime context.** `current()` is the `Runtime` of MLX's default device: the device
("gpu" or "cpu"), the backend the kernels run on ("metal", "cuda" or "cpu") and the facts the
model, the kernels and the pipeline read off it (tile budgets are keyed by `device`). One frozen
value per device, decided here and nowhere else; `use()` (api.select_device, the CLI's
--device) changes the default device. The default device is read at each call, so a test's or a
user's own mx.set_default_device (or an ``mx.stream(mx.cpu)`` scope) counts at once.

**The process.** Importing speechlens_cli changes nothing in the process. `prepare()` makes the
changes a run wants, once: the CLI's entry point (speechlens_cli/__main__.py) calls it first,
and so do the API's functions that load or run a model (api.get_model and the package's
`speechlens_cli.enhance`, `enhance_file`, `get_model`):

* MLX_ENABLE_TF32=0 unless set (full float32 matmuls and convolutions; MLX's default is TF32
  on CUDA and M5 Metal, which moved the enhanced waveform by 1.6e-3-3.3e-3 relative RMSE on an
  H200 against ~8e-6 in float32). Read by MLX at its first matmul or convolution;
* on Linux, an optimized BLAS loaded with RTLD_GLOBAL (blas.py). MLX binds its BLAS when
  mlx.core is imported (Python loads extensions with RTLD_NOW), so this takes effect only if
  `prepare()` runs before anything imports mlx.core, `speechlens_cli.api` included; otherwise
  MLX keeps its reference BLAS (5-7x slower matmuls, other rounding) and blas.status says so;
* on Linux, glibc keeps large freed blocks in the heap (heap.py, mallopt);
* on CUDA, MLX_MAX_MB_PER_BUFFER=10 unless set (`CUDA_GRAPH_MB`, below). Read by MLX at its
  first GPU operation;
* on CUDA, MLX_PTX_CACHE_DIR=<speechlens's cache folder>/mlx-ptx unless set: the kernels MLX's
  CUDA backend compiles are kept with speechlens's own (the user's cache folder, XDG rules),
  not in $TMPDIR/mlx, MLX's default, which a user's TMPDIR (a run's scratch folder, a cleaned
  /tmp) does not keep, and which removing speechlens's cache would not clear.

Opting out: `opt_out()` before the first call (or SPEECHLENS_BLAS=off, SPEECHLENS_HEAP=default,
and the two MLX variables set to values of one's own). Undoing: `restore()` puts the variables
and glibc's settings back; a loaded BLAS stays (MLX is bound to it), and MLX keeps the values it
has already read. mlx.core is imported here only inside functions, so importing this module
does not import it.
"""

from __future__ import annotations

import functools
import os
import threading
from dataclasses import dataclass

from . import blas, heap, settings

#: MLX's CUDA backend keeps every input of an op until the command graph holding it completes,
#: and closes a graph only once the arrays bound to it pass MLX_MAX_MB_PER_BUFFER (counted in
#: millions of elements, not bytes; 1000 on an H100/H200): those pending graphs, not the model,
#: set the peak memory. Measured on an H200, 5 s at 44.1 kHz (both BiMamba directions per
#: launch): 3.34 GiB at 25, 2.14 GiB at 10, 2.15 GiB at 5, for 0.184 / 0.189 / 0.193 s (a row of
#: docs/performance.md's tried-and-lost table); a 30-s window at 48 kHz 1.19 s at 25 and at 10.
#: Metal keeps its own limits.
CUDA_GRAPH_MB = 10
#: The folder in speechlens's cache folder for the kernels MLX's CUDA backend compiles.
PTX_CACHE = "mlx-ptx"
#: Full float32 unless the user set MLX_ENABLE_TF32 (see the module's docstring).
TF32_OFF = "0"


@dataclass(frozen=True)
class Runtime:
    """Where the model runs: MLX's default device and the backend its kernels use there."""

    #: "gpu" or "cpu": MLX's default device.
    device: str
    #: "metal", "cuda" or "cpu": where the kernels run on that device.
    backend: str
    #: This MLX build's GPU backend, "metal" or "cuda", whatever the device; None without one.
    gpu_backend: str | None

    @property
    def on_cpu(self) -> bool:
        return self.device == "cpu"

    @property
    def host_memory(self) -> bool:
        """Whether the model's arrays live in the host's memory (the CPU, or a Metal GPU's
        unified memory) rather than a CUDA GPU's own."""
        return self.on_cpu or self.gpu_backend == "metal"


@functools.cache
def gpu_backend() -> str | None:
    """``"metal"`` or ``"cuda"`` when this MLX build has that GPU backend, else None (decided
    once)."""
    import mlx.core as mx

    return "metal" if mx.metal.is_available() else "cuda" if mx.cuda.is_available() else None


@functools.cache
def _runtime(device: str) -> Runtime:
    gpu = gpu_backend()
    return Runtime(device, "cpu" if device == "cpu" else gpu or "cpu", gpu)


def current() -> Runtime:
    """The runtime of MLX's default device now."""
    import mlx.core as mx

    return _runtime("cpu" if mx.default_device() == mx.cpu else "gpu")


def use(device: str) -> Runtime:
    """Make `device` ("gpu" or "cpu") MLX's default device; returns its runtime."""
    if device not in ("gpu", "cpu"):
        raise ValueError(f"device must be 'gpu' or 'cpu', got {device!r}")
    import mlx.core as mx

    mx.set_default_device(mx.gpu if device == "gpu" else mx.cpu)
    return current()


class _Process:
    """What prepare() changed, so that restore() can put it back."""

    def __init__(self):
        self.lock = threading.Lock()
        self.prepared = False
        self.declined = False
        #: The variables prepare() set (each was unset), with the value it gave them.
        self.variables: dict[str, str] = {}


_process = _Process()


def prepare() -> None:
    """Make the process changes a run wants (the module's docstring lists them), once; later
    calls, and every call after opt_out(), do nothing. To get the optimized BLAS, call it before
    anything imports mlx.core."""
    with _process.lock:
        if _process.prepared or _process.declined:
            return
        _set_default(settings.TF32.name, TF32_OFF)
        blas.preload()                      # before mlx.core is imported, or it has no effect
        heap.keep_large_buffers()
        if gpu_backend() == "cuda":         # imports mlx.core
            from .kernels.sources import cache_dir

            _set_default(settings.MAX_MB_PER_BUFFER.name, str(CUDA_GRAPH_MB))
            _set_default(settings.PTX_CACHE_DIR.name, str(cache_dir() / PTX_CACHE))
        _process.prepared = True


def _set_default(name: str, value: str) -> None:
    if name not in os.environ:
        _process.variables[name] = os.environ[name] = value


def restore() -> None:
    """Undo what prepare() did, as far as it can be undone: the variables it set are unset
    again (unless changed since) and glibc's large-block settings are its defaults again
    (heap.restore). A loaded BLAS stays: MLX is bound to it. MLX keeps the values it has already
    read (at its first matmul or GPU operation). A later prepare() prepares again."""
    with _process.lock:
        for name, value in _process.variables.items():
            if os.environ.get(name) == value:
                del os.environ[name]
        _process.variables.clear()
        heap.restore()
        _process.prepared = False


def opt_out() -> None:
    """Leave this process as it is: what prepare() did is undone (restore()), and prepare()
    does nothing from now on (the CLI's entry point and the API's functions included)."""
    restore()
    with _process.lock:
        _process.declined = True


def is_prepared() -> bool:
    return _process.prepared
