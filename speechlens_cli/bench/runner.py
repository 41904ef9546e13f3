"""Timing loop of `speechlens bench`: end-to-end windowed runs of speechlens and the peer.

Each trial streams one synthetic file through ``speechlens_cli.pipeline.enhance_stream`` (the
pipeline `speechlens enhance` uses: windows, cross-fade, a float WAV read and written block by
block) and is timed with ``time.perf_counter`` from the first read to the last write. Every
window is evaluated (``mx.eval``) and copied back to NumPy before the next one, so GPU work is
included. The plain-loop peer runs the same windows through the same function on the same input,
in a process of its own (peer_process.py: torch must load its CUDA libraries before MLX does).
With MLX's CUDA backend and mamba_ssm installed, NVIDIA's own stack (nvidia_peer.py, also a
process of its own) runs the same input too, whole file as one window as NVIDIA's scripts do,
once per TF32 setting; it runs only for groups whose window holds the whole file.
"""

from __future__ import annotations

import contextlib
import fnmatch
import gc
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import mlx.core as mx
import numpy as np
import soundfile as sf

from .. import api, checkpoint, kernels, settings
from .. import audio as audio_io
from ..pipeline import DEFAULT_OVERLAP, Geometry, enhance_stream
from . import cases as matrix
from . import report
from .environment import load_average
from .inputs import BenchCheckpoint, bench_speech

Log = Callable[[str], None]


# ------------------------------------------------------------------------------ measurements

def reset_rss_peak() -> bool:
    """Reset the kernel's peak-RSS mark (Linux >= 4.0: write 5 to clear_refs)."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def _status_kib(field_name: str) -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def rss_now() -> int | None:
    kib = _status_kib("VmRSS")
    return None if kib is None else kib * 1024


def rss_peak() -> int:
    kib = _status_kib("VmHWM")
    if kib is not None:
        return kib * 1024
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolation percentile (NumPy's default)."""
    return float(np.percentile(np.asarray(values, np.float64), q))


def rel_rmse(actual: np.ndarray, expected: np.ndarray) -> float:
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    return float(np.sqrt(np.mean((actual - expected) ** 2) / np.mean(expected ** 2)))


@dataclass
class Timing:
    warmup: int
    trials_planned: int
    times_s: list[float] = field(default_factory=list)
    note: str = ""

    @property
    def median_s(self) -> float:
        return statistics.median(self.times_s)

    @property
    def p90_s(self) -> float:
        return percentile(self.times_s, 90)


def time_runs(run_once: Callable[[], None], warmup: int, trials: int, budget_s: float | None,
              log: Log, label: str) -> Timing:
    """`warmup` untimed runs, then up to `trials` timed ones; stops early (after at least one
    trial) when the next trial would end past `budget_s` seconds since the start."""
    timing = Timing(warmup, trials)
    start = time.perf_counter()
    for i in range(warmup):
        t0 = time.perf_counter()
        run_once()
        log(f"  {label}: warm-up {i + 1}/{warmup} {time.perf_counter() - t0:.3f} s")
    for i in range(trials):
        t0 = time.perf_counter()
        run_once()
        elapsed = time.perf_counter() - t0
        timing.times_s.append(elapsed)
        log(f"  {label}: trial {i + 1}/{trials} {elapsed:.3f} s")
        spent = time.perf_counter() - start
        if budget_s is not None and i + 1 < trials and spent + elapsed > budget_s:
            timing.note = (f"stopped after {i + 1} of {trials} trials: the next would pass the "
                           f"{budget_s:g}-s budget per case")
            log(f"  {label}: {timing.note}")
            break
    return timing


def nvidia_peer_missing(backend: str) -> str | None:
    """Why NVIDIA's stack cannot run here, or None when it can."""
    if backend != "cuda":
        return (f"mamba_ssm's fused kernels need an NVIDIA GPU and MLX's CUDA backend; this "
                f"run's backend is {backend}")
    for name in ("torch", "mamba_ssm"):
        if importlib.util.find_spec(name) is None:
            return (f"{name} is not installed (mamba_ssm and causal-conv1d with their CUDA "
                    "extensions)")
    return None


# ------------------------------------------------------------------------------ runs

@dataclass
class Options:
    cases: list[matrix.Case]
    peer_patterns: str | None         # None: no peer
    warmup: int | None = None         # None: per-case defaults
    trials: int | None = None
    peer_warmup: int | None = None
    peer_trials: int | None = None
    peer_device: str = "auto"
    budget_s: float | None = None
    overlap: float = DEFAULT_OVERLAP
    model: str | None = None


def stream(src: Path, dst: Path, window_fn, rate: int, window_s: float, overlap: float) -> int:
    info = audio_io.read_info(src)
    output = audio_io.output_format(info, dst)
    result = enhance_stream(src, dst, window_fn, Geometry.from_seconds(window_s, overlap, rate),
                            output)
    return result.windows


def _read(path: Path) -> np.ndarray:
    return sf.read(str(path), dtype="float32", always_2d=True)[0][:, 0]


def run(options: Options, ckpt: BenchCheckpoint, log: Log,
        on_progress: Callable[[dict], None] | None = None) -> dict:
    """Run the selected cases; returns the report body (cases, peer groups, settings)."""
    gpu = kernels.backend() != "cpu"
    t0 = time.perf_counter()
    model = checkpoint.load_model(ckpt.spec, download=False)
    load_s = time.perf_counter() - t0
    cfg = model.config
    body: dict = {"model_load_s": load_s,
                  "architecture": report.architecture(cfg),
                  "cases": [], "peer": [], "peer_info": {},
                  "fixtures": {}, "rss_peak_reset": reset_rss_peak()}
    peer_missing = None if importlib.util.find_spec("torch") else (
        "torch is not installed (pip install 'speechlens[bench]')")
    nvidia_missing = nvidia_peer_missing(kernels.backend())
    groups: dict[tuple, list[matrix.Case]] = {}
    for case in options.cases:
        groups.setdefault(case.group, []).append(case)
    with tempfile.TemporaryDirectory(prefix="speechlens-bench-") as tmp:
        tmp = Path(tmp)
        inputs: dict[tuple[float, int], Path] = {}
        for key, group in groups.items():
            seconds, rate, _window = key
            if (seconds, rate) not in inputs:
                audio, how = bench_speech(rate, seconds)
                path = tmp / f"in-{seconds:g}s-{rate}.wav"
                sf.write(str(path), audio, rate, subtype="FLOAT")
                inputs[(seconds, rate)] = path
                body["fixtures"][f"{seconds:g}s-{matrix.rate_label(rate)}"] = (
                    f"{how}; {len(audio)} samples, mono float32 WAV")
            src = inputs[(seconds, rate)]
            outputs: dict[str, np.ndarray] = {}
            for case in group:
                row = _run_case(case, model, src, tmp, options, gpu, log)
                body["cases"].append(row)
                if "error" not in row:
                    outputs[case.mode] = _read(tmp / f"out-{case.name}.wav")
                for build in other_cpu_builds():
                    body["cases"].append(_run_case(case, model, src, tmp, options, gpu, log,
                                                   build))
                if on_progress:
                    on_progress(body)
            want_peer = options.peer_patterns is not None and any(
                fnmatch.fnmatchcase(group[0].group_name + "-" + m, p.strip())
                for m in matrix.MODES for p in options.peer_patterns.split(","))
            plain_skipped = want_peer and plain_peer_skipped(seconds, nvidia_missing)
            if want_peer and peer_missing:
                body["peer_info"][matrix.PLAIN_PEER] = f"not run: {peer_missing}"
            elif plain_skipped:
                label = f"{matrix.PLAIN_PEER}, files over {matrix.PLAIN_PEER_MAX_SECONDS:g} s"
                body["peer_info"][label] = f"not run: {plain_skipped}"
            elif want_peer:
                row = _run_peer(group[0], ckpt, src, tmp, outputs, options, gpu, log)
                body["peer"].append(row)
                body["peer_info"].update(row.pop("info", {}))
                if on_progress:
                    on_progress(body)
            if want_peer:
                _nvidia_peers(group[0], ckpt, src, tmp, outputs, options, nvidia_missing, body,
                              log)
                if on_progress:
                    on_progress(body)
    return body


def other_cpu_builds() -> list[tuple[str, str]]:
    """(SPEECHLENS_CPU_ISA value, name) of each CPU library build this CPU runs besides the one
    it picks: AVX2 where the best is AVX-512, so a report has both builds' numbers. None on a
    GPU, without the library, or where SPEECHLENS_CPU_ISA already chose a build."""
    lib = kernels.cpu_library() if kernels.backend() == "cpu" else None
    if lib is None or settings.CPU_ISA.is_set():
        return []
    avx2 = kernels.CPU_ISA_CHOICES["avx2"]
    has_both = lib.isa() > avx2 and lib.isa(avx2) == avx2
    return [("avx2", lib.isa_name(avx2))] if has_both else []


def _run_case(case: matrix.Case, model, src: Path, tmp: Path, options: Options, gpu: bool,
              log: Log, build: tuple[str, str] | None = None) -> dict:
    """One case's trials; `build` (other_cpu_builds) runs them on that CPU library build, as
    the case named with the build's suffix."""
    defaults = matrix.default_repeats(case, gpu)
    warmup = defaults.warmup if options.warmup is None else options.warmup
    trials = defaults.trials if options.trials is None else options.trials
    name = case.name if build is None else f"{case.name}-{build[0]}"
    dst = tmp / f"out-{name}.wav"
    strict = case.mode == "strict"
    windows = 0

    def once() -> None:
        nonlocal windows
        windows = stream(src, dst, lambda w: api.enhance_channels(model, w, case.rate, strict),
                          case.rate, case.window, options.overlap)

    row = {"case": name, "seconds": case.seconds, "rate": case.rate, "window_s": case.window,
           "overlap": options.overlap, "mode": case.mode, "load_at_start": load_average()}
    log(f"{name}: {warmup} warm-up + {trials} trials (load {row['load_at_start']})")
    gc.collect()
    mx.clear_cache()
    mx.reset_peak_memory()
    row["rss_before_bytes"] = rss_now()
    reset_rss_peak()
    try:
        with _cpu_build(build):
            timing = time_runs(once, warmup, trials, options.budget_s, log, name)
    except Exception as error:  # noqa: BLE001 - one failing case must not lose the others
        row["error"] = f"{type(error).__name__}: {error}"
        log(f"{name}: FAILED {row['error']}")
        return row
    row.update(_timing_fields(timing, case.seconds))
    if build is not None:
        built = f"the CPU library's {build[1]} build ({kernels.CPU_ISA_ENV}={build[0]})"
        row["note"] = "; ".join(n for n in (built, row["note"]) if n)
    row.update(windows=windows, mlx_peak_bytes=int(mx.get_peak_memory()),
               rss_peak_bytes=rss_peak(), load_at_end=load_average())
    log(f"{name}: median {timing.median_s:.3f} s, RTF {row['rtf_median']:.3f}, "
        f"MLX peak {row['mlx_peak_bytes'] / 2**20:.0f} MiB, RSS peak "
        f"{row['rss_peak_bytes'] / 2**20:.0f} MiB")
    return row


@contextlib.contextmanager
def _cpu_build(build: tuple[str, str] | None) -> Iterator[None]:
    """SPEECHLENS_CPU_ISA set to `build`'s value for the duration (nothing if None)."""
    if build is None:
        yield
        return
    os.environ[kernels.CPU_ISA_ENV] = build[0]
    try:
        yield
    finally:
        del os.environ[kernels.CPU_ISA_ENV]


def _timing_fields(timing: Timing, seconds: float) -> dict:
    return {"warmup": timing.warmup, "trials_planned": timing.trials_planned,
            "trials": len(timing.times_s), "times_s": timing.times_s,
            "median_s": timing.median_s, "p90_s": timing.p90_s, "min_s": min(timing.times_s),
            "rtf_median": timing.median_s / seconds, "rtf_p90": timing.p90_s / seconds,
            "note": timing.note}


def timed_process(argv: list[str], label: str, log: Log,
                  env: dict[str, str] | None = None) -> tuple[float, int]:
    """(seconds from start to exit, peak RSS in bytes) of a process that must succeed."""
    started = time.perf_counter()
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True, env=env)
    with process.stderr:
        stderr = process.stderr.read()
    _, status, usage = os.wait4(process.pid, 0)
    elapsed = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise RuntimeError(f"{label} exited with {process.returncode}: {failure_message(stderr)}")
    peak = usage.ru_maxrss * (1 if sys.platform == "darwin" else 1024)
    log(f"  {label}: {elapsed:.3f} s, peak RSS {peak / 2**20:,.0f} MiB")
    return elapsed, peak


#: The most lines naming failed files that failure_message keeps.
FAILED_FILE_LINES = 10


def failure_message(stderr: str) -> str:
    """What a failed process said, for a report: its last stderr line, after the lines that name
    files it failed (a batch's "error: FILE: why" as each failed; at most FAILED_FILE_LINES,
    with a count of the rest), which the last line ("27 of 200 files failed (listed above)")
    only refers to."""
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    if not lines:
        return "no message"
    last, errors = lines[-1], [line for line in lines[:-1] if line.startswith("error: ")]
    if not errors:
        return last
    kept = errors[:FAILED_FILE_LINES]
    more = len(errors) - len(kept)
    listed = "\n".join(f"  {line}" for line in kept)
    return f"{last}\n{listed}" + (f"\n  ... and {more} more" if more else "")


def peer_argv(module: str, args: dict) -> list[str]:
    """The command line that runs a peer module of this package (peer_process, nvidia_peer) as
    __main__ in a process of its own, torch imported first: torch must load its CUDA libraries
    before MLX, which importing this package loads, loads its own."""
    launch = f"import runpy, torch; runpy.run_module('{__package__}.{module}', run_name='__main__')"
    return [sys.executable, "-c", launch, json.dumps(args)]


def _peer_process(module: str, args: dict, row: dict, label: str, log: Log) -> dict | None:
    """Run a peer module of this package in its own process; its last stdout line (JSON), or
    None with row["error"] set."""
    proc = subprocess.run(peer_argv(module, args), stdout=subprocess.PIPE, text=True,
                          check=False)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        row["error"] = f"{module} failed (exit {proc.returncode}; see its stderr above)"
        log(f"{label}: FAILED {row['error']}")
        return None
    return json.loads(lines[-1])


def _run_peer(case: matrix.Case, ckpt: BenchCheckpoint, src: Path, tmp: Path,
              outputs: dict[str, np.ndarray], options: Options, gpu: bool, log: Log) -> dict:
    """Time the peer on the same input and windows, in a process of its own (peer_process.py)."""
    defaults = matrix.default_peer_repeats(gpu)
    warmup = defaults.warmup if options.peer_warmup is None else options.peer_warmup
    trials = defaults.trials if options.peer_trials is None else options.peer_trials
    dst = tmp / f"peer-{case.group_name}.wav"
    label = f"{case.group_name} peer"
    row = {"group": case.group_name, "peer": matrix.PLAIN_PEER, "seconds": case.seconds,
           "rate": case.rate, "window_s": case.window, "overlap": options.overlap,
           "device": options.peer_device, "load_at_start": load_average()}
    log(f"{label}: {warmup} warm-up + {trials} trials (device {options.peer_device})")
    args = {"weights": str(ckpt.weights), "config": str(ckpt.config) if ckpt.config else None,
            "device": options.peer_device, "src": str(src), "dst": str(dst), "rate": case.rate,
            "window": case.window, "overlap": options.overlap, "warmup": warmup,
            "trials": trials, "budget_s": options.budget_s, "label": label}
    result = _peer_process("peer_process", args, row, label, log)
    if result is None:
        return row
    timing = Timing(result["warmup"], result["trials_planned"], result["times_s"], result["note"])
    row.update(_timing_fields(timing, case.seconds))
    row.update(device=result["device"], peer_load_s=result["load_s"], info=result["info"],
               torch_peak_bytes=result["torch_peak_bytes"], rss_peak_bytes=result["rss_peak_bytes"],
               rss_before_bytes=result["rss_before_bytes"], load_at_end=load_average())
    out = _read(dst)
    row["parity_rel_rmse"] = {mode: rel_rmse(out, ref) for mode, ref in outputs.items()}
    row["finite"] = bool(np.isfinite(out).all())
    log(f"{label}: median {timing.median_s:.3f} s; parity (waveform rel-RMSE vs speechlens) "
        + ", ".join(f"{m} {v:.2e}" for m, v in row["parity_rel_rmse"].items()))
    return row


def plain_peer_skipped(seconds: float, nvidia_missing: str | None) -> str | None:
    """Why the plain-loop peer does not run on a file this long, or None if it does."""
    if nvidia_missing is None and seconds > matrix.PLAIN_PEER_MAX_SECONDS:
        return ("its Python step loop takes minutes there, and NVIDIA's stack, which runs, is "
                "the peer that counts on this GPU")
    return None


def _nvidia_peers(case: matrix.Case, ckpt: BenchCheckpoint, src: Path, tmp: Path,
                  outputs: dict[str, np.ndarray], options: Options, missing: str | None,
                  body: dict, log: Log) -> None:
    """NVIDIA's stack on this group's input, once per TF32 setting, or why it did not run."""
    if missing is None and case.window < case.seconds:
        missing = (f"it runs whole files as one window; this group's window ({case.window:g} s) "
                   f"is shorter than the file ({case.seconds:g} s)")
    if missing:
        note = body["peer_info"].get(matrix.NVIDIA_PEER, "")
        if f"not run: {missing}" not in note:
            body["peer_info"][matrix.NVIDIA_PEER] = (note + "; " if note else "") + (
                f"not run: {missing}")
            log(f"{matrix.NVIDIA_PEER}: not run: {missing}")
        return
    for tf32 in matrix.NVIDIA_TF32_MODES:
        row = _run_nvidia_peer(case, ckpt, src, tmp, outputs, options, tf32, log)
        body["peer"].append(row)
        body["peer_info"].update(row.pop("info", {}))


def _run_nvidia_peer(case: matrix.Case, ckpt: BenchCheckpoint, src: Path, tmp: Path,
                     outputs: dict[str, np.ndarray], options: Options, tf32: str,
                     log: Log) -> dict:
    """Time nvidia_peer.py (its own process) on the whole file; parity against speechlens."""
    defaults = matrix.default_repeats(case, gpu=True)  # as fast as speechlens: same repeats
    warmup = defaults.warmup if options.peer_warmup is None else options.peer_warmup
    trials = defaults.trials if options.peer_trials is None else options.peer_trials
    name = f"{matrix.NVIDIA_PEER}, TF32 {'torch defaults' if tf32 == 'default' else tf32}"
    dst = tmp / f"nvidia-{tf32}-{case.group_name}.npy"
    label = f"{case.group_name} nvidia"
    row = {"group": case.group_name, "peer": name, "seconds": case.seconds, "rate": case.rate,
           "window_s": case.seconds, "overlap": 0.0, "device": "cuda",
           "load_at_start": load_average()}
    log(f"{label} (TF32 {tf32}): {warmup} warm-up + {trials} trials")
    args = {"weights": str(ckpt.weights), "config": str(ckpt.config) if ckpt.config else None,
            "device": "cuda", "tf32": tf32, "warmup": warmup, "trials": trials,
            "cases": [{"src": str(src), "rate": case.rate, "label": label, "dst": str(dst)}]}
    result = _peer_process("nvidia_peer", args, row, label, log)
    if result is None:
        return row
    timed, info = result["cases"][0], result["info"]
    timing = Timing(timed["warmup"], timed["trials"], timed["times_s"])
    row.update(_timing_fields(timing, case.seconds))
    row.update(peer_load_s=result["load_s"], torch_peak_bytes=timed.get(
        "max_memory_allocated_bytes"), rss_peak_bytes=None, load_at_end=load_average())
    row["info"] = {name: (
        f"torch {info.get('torch')}, CUDA {info.get('cuda')}, cuDNN {info.get('cudnn')}, "
        f"mamba_ssm {info.get('mamba_ssm', '?')}, {info.get('mamba_modules')} x "
        f"{info.get('mamba_module_class')}, fused path {info.get('fused_path')}; "
        f"cuda.matmul.allow_tf32={info.get('cuda.matmul.allow_tf32')}, "
        f"cudnn.allow_tf32={info.get('cudnn.allow_tf32')}; whole file as one window, own "
        "process; peak = torch.cuda.max_memory_allocated")}
    out = np.load(dst)
    row["parity_rel_rmse"] = {mode: rel_rmse(out, ref) for mode, ref in outputs.items()}
    row["finite"] = bool(np.isfinite(out).all())
    log(f"{label} (TF32 {tf32}): median {timing.median_s:.3f} s; parity vs speechlens "
        + ", ".join(f"{m} {v:.2e}" for m, v in row["parity_rel_rmse"].items()))
    return row


def describe(options: Options) -> dict:
    """The settings a report states."""
    settings = asdict(options)
    settings["cases"] = [c.name for c in options.cases]
    settings["windowing"] = (f"speechlens_cli.pipeline.enhance_stream, overlap "
                             f"{options.overlap:g} of the window, sin^2/cos^2 cross-fade")
    settings["timing"] = ("wall time (time.perf_counter) of one whole file: read float WAV, every "
                          "window through the model and evaluated, cross-fade, write float WAV")
    settings["p90"] = "90th percentile, linear interpolation between trials"
    settings["rtf"] = "wall seconds / audio seconds (below 1 = faster than real time)"
    settings["memory"] = ("MLX peak = mx.get_peak_memory() over the case (reset before it); RSS "
                          "peak = the process's VmHWM over the case (reset through "
                          "/proc/self/clear_refs where allowed, else the lifetime peak)")
    return settings

