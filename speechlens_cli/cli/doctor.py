"""`speechlens doctor`: what this machine runs speechlens on, and what would fix a problem."""

from __future__ import annotations

import json
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import click
import mlx.core as mx

from .. import blas, checkpoint, hub, kernels, settings
from ..errors import MissingExtraError, ModelNotFoundError, SpeechlensError, UsageError
from ..model.config import ModelConfig
from .app import main

_BLAS_SIZE = 512
_ENDPOINT_FIX = "unset HF_ENDPOINT or set it to the hub's URL"


@dataclass(frozen=True)
class Check:
    """One line of the report: what was found and, for a problem, what would fix it. The verdict
    counts fixes only, and every fix follows from a fact (a library found or not, a setting),
    never from a timing, which the machine's load changes."""

    name: str
    value: str
    fix: str | None = None
    extra: dict = field(default_factory=dict)
    #: Lines printed under the check's line (the text report's compact form of `extra`).
    details: tuple[str, ...] = ()

    def as_dict(self) -> dict:
        return {"value": self.value, "ok": self.fix is None, "fix": self.fix, **self.extra}


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


def _blas_fix() -> str | None:
    """What is wrong with the BLAS MLX's Linux CPU backend runs on, from facts alone."""
    if blas.loaded is None:
        if blas.status.startswith("disabled"):
            return f"unset {blas.BLAS_ENV} to let speechlens load an optimized BLAS"
        return blas.INSTALL_HINT
    if not blas.threads_controlled:
        return (f"speechlens cannot set {blas.loaded}'s thread count, so results may depend on "
                f"it: pip install scipy-openblas32, or point {blas.BLAS_ENV} at OpenBLAS, BLIS "
                "or MKL")
    return None


def _blas_check(backend: str) -> Check:
    """The BLAS MLX's Linux CPU backend uses, and its measured speed (information only)."""
    if not (sys.platform.startswith("linux") and backend == "cpu"):
        return Check("blas", f"not measured ({blas.status}; backend {backend})",
                     extra={"gflops": None})
    gflops = _matmul_gflops()
    return Check("blas", f"{gflops:.1f} GFLOP/s ({_BLAS_SIZE}x{_BLAS_SIZE} float32 matmul on "
                         f"the CPU, varies with the load; {blas.status})", _blas_fix(),
                 {"gflops": round(gflops, 3)})


def _backend_fix(backend: str) -> str | None:
    if sys.platform == "darwin" and platform.machine() == "arm64" and backend != "metal":
        return "reinstall MLX's Metal build: pip install --force-reinstall mlx"
    if sys.platform.startswith("linux") and Path("/dev/nvidiactl").exists() and backend != "cuda":
        return "an NVIDIA GPU is present: pip install 'speechlens[cuda]' to use it"
    return None


def _self_check(backend: str) -> Check:
    """Each GPU kernel's self-check verdict at RE-USE's channel counts (checked now where none
    is kept): a failed one runs as MLX ops, correct but slower."""
    config = ModelConfig()
    verdicts = kernels.self_check(config.d_inner, config.dt_rank)
    file = kernels.verdicts_file()
    extra = {"verdicts": verdicts, "file": str(file)}
    if not verdicts:
        return Check("selfcheck", f"none to run: backend {backend} compiles no GPU kernel "
                     "at run time", extra=extra)
    text = (f"DI={config.d_inner}: " + ", ".join(f"{name} {verdict}"
                                                 for name, verdict in verdicts.items())
            + f" (kept in {file})")
    if all(verdict == "ok" for verdict in verdicts.values()):
        return Check("selfcheck", text, extra=extra)
    return Check("selfcheck", text, "the failed kernels run as MLX ops, slower: a new MLX "
                 "(pip install --upgrade mlx) is checked again; to check again now, delete "
                 f"{file}", extra)


def _dispatch_lines(table: dict, backend: str) -> tuple[str, ...]:
    """The dispatch table's compact form: per operation, on this backend, what runs first and
    what is skipped, and why."""
    lines = []
    for op, backends in table.items():
        rows = backends[backend]
        runs = [name for name, available, _ in rows if available]
        skipped = [f"{name} skipped: {reason}" for name, available, reason in rows
                   if not available]
        lines.append(f"{op}: " + " > ".join(runs) + "".join(f"; {s}" for s in skipped))
    return tuple(lines)


def _kernel_check(backend: str) -> Check:
    """speechlens_cli.kernels' own account of where the kernels run, which implementation each
    operation takes (the dispatch table), and what would fix a fallback to the slow MLX-op
    versions. A bad setting is the settings check's problem, not counted again here."""
    table = kernels.dispatch_table()
    extra = {"dispatch": table}
    details = _dispatch_lines(table, backend)
    try:
        info = kernels.kernel_info()
        disabled = kernels.conv_kernel_disabled()
    except settings.SettingError as error:  # e.g. a bad SPEECHLENS_CPU_THREADS
        return Check("kernels", f"not known: {error} (see settings)", extra=extra,
                     details=details)
    text = ", ".join(f"{key} {value}" for key, value in info.items() if key != "mlx")
    fix = None
    if disabled:
        text += " (conv1d kernel disabled)"
        fix = f"unset {kernels.DISABLE_CONV_ENV} and {kernels.DISABLE_CONV_ENV_ALIAS}"
    elif info.get("cpu_library", "").startswith("unavailable"):
        fix = ("install a C++ compiler (g++ or clang++) so the CPU kernels can be built, or "
               "reinstall speechlens with one present")
    return Check("kernels", text, fix, extra, details)


def _model_check(model: str | None) -> Check:
    try:
        found = checkpoint.inspect(model, download=False)
    except ModelNotFoundError as error:
        return Check("model", str(error), "speechlens models pull (or pass --model PATH)")
    except settings.SettingError as error:
        return Check("model", str(error), error.fix)
    except UsageError as error:
        if str(error).startswith("HF_ENDPOINT"):
            return Check("model", str(error), _ENDPOINT_FIX)
        return Check("model", str(error), "pass --model a checkpoint path or a valid repo id")
    except SpeechlensError as error:
        return Check("model", str(error), "delete that copy and run `speechlens models pull`")
    return Check("model", f"{found.source}: ok, sha256 {found.sha256[:12]}... ({found.weights})")


def _cache_check() -> Check:
    try:
        folder = hub.cache_folder()
    except UsageError as error:   # an HF_ENDPOINT the Hugging Face client cannot even load with
        return Check("cache", str(error), _ENDPOINT_FIX)
    from huggingface_hub import constants

    return Check("cache", f"{folder}"
                 + (" (HF_HUB_OFFLINE: no downloads)" if constants.HF_HUB_OFFLINE else ""))


def _scoring_check() -> Check:
    """Whether `speechlens score` runs here: its packages (the optional `report` extra) import.
    Information only: speechlens enhances without them. The scoring package is imported here,
    not by every start of speechlens."""
    from ..scoring import extra as scoring_extra

    versions = scoring_extra.versions()
    extra = {"available": False, "versions": versions}
    try:
        scoring_extra.require()
    except MissingExtraError as error:
        return Check("scoring", f"unavailable: {error}", extra=extra)
    return Check("scoring", "available (" + ", ".join(f"{name} {version}" for name, version
                                                     in versions.items()) + ")",
                 extra={**extra, "available": True})


def _settings_check() -> Check:
    """The variables of settings.ALL that are set, each checked against its declaration."""
    given = [setting.shown()[:len(setting.name) + 41]
             for setting in settings.ALL if setting.is_set()]
    text = ", ".join(given) or "none set"
    problems = settings.problems()
    if problems:
        return Check("settings", "; ".join(str(error) for error in problems),
                     "; ".join(error.fix for error in problems))
    return Check("settings", text)


def _checks(model: str | None) -> list[Check]:
    backend = kernels.backend()
    return [
        Check("platform", f"{platform.platform()} ({platform.machine()}), "
                          f"Python {platform.python_version()}"),
        _settings_check(),
        Check("mlx", f"{mx.__version__}, backend {backend}, default device "
                     f"{mx.default_device()}", _backend_fix(backend)),
        _kernel_check(backend),
        _self_check(backend),
        _blas_check(backend),
        _cache_check(),
        _model_check(model),
        _scoring_check(),
    ]


@main.command()
@click.option("--model", default=None, envvar=checkpoint.MODEL_ENV,
              help="Checkpoint to check (default: SPEECHLENS_MODEL, else nvidia/RE-USE).")
@click.option("--json", "as_json", is_flag=True,
              help="The same facts as one JSON object: ok, problems, and per check its value, "
                   "ok and fix (kernels also dispatch: operation -> backend -> [implementation, "
                   "available, reason], in the order tried; blas also gflops; selfcheck also "
                   "verdicts and file; scoring also available and versions).")
@click.pass_context
def doctor(ctx: click.Context, model: str | None, as_json: bool) -> None:
    """Check this machine: platform, settings (the variables set, each checked), MLX backend,
    kernels (on a GPU, each one's self-check), BLAS, model cache, scoring (`speechlens score`);
    exit 1 on a problem (found facts only: the BLAS speed measured is shown, never judged;
    scoring is optional, shown, never a problem)."""
    checks = _checks(model)
    problems = sum(check.fix is not None for check in checks)
    if as_json:
        click.echo(json.dumps({"ok": not problems, "problems": problems,
                               "checks": {check.name: check.as_dict() for check in checks}}))
    else:
        for check in checks:
            click.echo(f"{check.name + ':':<10} {check.value}")
            for line in check.details:
                click.echo(f"{'':<10} {line}")
            if check.fix:
                click.echo(f"{'':<10} fix: {check.fix}")
        click.echo(f"{problems} problem(s) found" if problems else "no problems found")
    if problems:
        ctx.exit(1)
