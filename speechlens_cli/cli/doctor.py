"""`speechlens doctor`: what this machine runs speechlens on, and what would fix a problem."""

from __future__ import annotations

import platform
import sys
import time
from pathlib import Path

import click
import mlx.core as mx

from .. import blas, checkpoint, kernels
from ..errors import ModelNotFoundError, SpeechlensError, UsageError
from .app import main

#: Below this a 512x512 float32 matmul means MLX runs on a reference (unoptimised) BLAS.
BLAS_SLOW_GFLOPS = 10.0
_BLAS_SIZE = 512


def _matmul_gflops() -> float:
    """Best of three 512x512 float32 matmuls on MLX's CPU device."""
    with mx.stream(mx.cpu):
        a = mx.random.normal((_BLAS_SIZE, _BLAS_SIZE))
        b = mx.random.normal((_BLAS_SIZE, _BLAS_SIZE))
        mx.eval(a @ b)
        best = float("inf")
        for _ in range(3):
            started = time.perf_counter()
            mx.eval(a @ b)
            best = min(best, time.perf_counter() - started)
    return 2 * _BLAS_SIZE ** 3 / best / 1e9


def _blas_fix() -> str:
    if blas.loaded:
        return (f"{blas.loaded} is loaded but slow: check OPENBLAS_NUM_THREADS / "
                "OMP_NUM_THREADS and other load on the machine")
    if blas.status.startswith("disabled"):
        return f"unset {blas.BLAS_ENV} to let speechlens load an optimized BLAS"
    return blas.INSTALL_HINT


def _backend_fix(backend: str) -> str | None:
    if sys.platform == "darwin" and platform.machine() == "arm64" and backend != "metal":
        return "reinstall MLX's Metal build: pip install --force-reinstall mlx"
    if sys.platform.startswith("linux") and Path("/dev/nvidiactl").exists() and backend != "cuda":
        return "an NVIDIA GPU is present: pip install 'speechlens[cuda]' to use it"
    return None


def _kernel_check() -> tuple[str, str | None]:
    """speechlens_cli.kernels' own account of where the kernels run, and what would fix a
    fallback to the slow MLX-op versions."""
    try:
        info = kernels.kernel_info()
    except UsageError as error:  # a bad SPEECHLENS_CPU_THREADS
        return str(error), f"unset {kernels.CPU_THREADS_ENV} or set it to a thread count"
    text = ", ".join(f"{key} {value}" for key, value in info.items() if key != "mlx")
    if kernels.conv_kernel_disabled():
        return (text + " (conv1d kernel disabled)",
                f"unset {kernels.DISABLE_CONV_ENV} and {kernels.DISABLE_CONV_ENV_ALIAS}")
    if info.get("cpu_library", "").startswith("unavailable"):
        return text, ("install a C++ compiler (g++ or clang++) so the CPU kernels can be built, "
                      "or reinstall speechlens with one present")
    return text, None


@main.command()
@click.option("--model", default=None, envvar=checkpoint.MODEL_ENV,
              help="Checkpoint to check (default: SPEECHLENS_MODEL, else nvidia/RE-USE).")
@click.pass_context
def doctor(ctx: click.Context, model: str | None) -> None:
    """Check this machine: platform, MLX backend, kernels, BLAS speed, model cache."""
    from huggingface_hub import constants

    problems = 0

    def report(label: str, value: str, fix: str | None = None) -> None:
        nonlocal problems
        click.echo(f"{label + ':':<10} {value}")
        if fix:
            problems += 1
            click.echo(f"{'':<10} fix: {fix}")

    report("platform", f"{platform.platform()} ({platform.machine()}), "
                       f"Python {platform.python_version()}")
    backend = kernels.backend()
    report("mlx", f"{mx.__version__}, backend {backend}, default device {mx.default_device()}",
           _backend_fix(backend))
    report("kernels", *_kernel_check())
    if sys.platform.startswith("linux") and backend == "cpu":
        gflops = _matmul_gflops()
        report("blas", f"{gflops:.1f} GFLOP/s ({_BLAS_SIZE}x{_BLAS_SIZE} float32 matmul on the "
                       f"CPU; {blas.status})", _blas_fix() if gflops < BLAS_SLOW_GFLOPS else None)
    report("cache", f"{constants.HF_HUB_CACHE}"
                    + (" (HF_HUB_OFFLINE: no downloads)" if constants.HF_HUB_OFFLINE else ""))
    try:
        found = checkpoint.inspect(model, download=False)
        report("model", f"{found.source}: ok, sha256 {found.sha256[:12]}... ({found.weights})")
    except ModelNotFoundError as error:
        report("model", str(error), "speechlens models pull (or pass --model PATH)")
    except UsageError as error:
        report("model", str(error), "pass --model a checkpoint path or a valid repo id")
    except SpeechlensError as error:
        report("model", str(error), "delete that copy and run `speechlens models pull`")
    click.echo(f"{problems} problem(s) found" if problems else "no problems found")
    if problems:
        ctx.exit(1)
