"""`speechlens bench`: end-to-end benchmark, component profile and PyTorch peer.

speechlens_cli/cli/__init__.py adds the command to the CLI group; everything else lives in this
package and is imported only when the command runs.

- runner.py: windowed end-to-end timings of speechlens (and the peer) per case;
- cases.py: the matrix (5 s at 16/44.1/48 kHz, 120 s at 16/44.1 kHz, 30 s at 48 kHz for the
  memory target; windows of 5 and 30 s; standard and strict) and the per-backend defaults;
- profiling.py: per-component profile with evaluation barriers (--profile);
- torch_peer.py: the same model in plain PyTorch (optional extra `speechlens[bench]`);
- report.py: JSON + Markdown reports and the performance targets; environment.py: what they name.
"""

from __future__ import annotations

import datetime as _dt
import sys
from pathlib import Path

import click

from .. import settings
from ..model.config import MAX_SAMPLE_RATE, MIN_SAMPLE_RATE
from ..pipeline import CHUNK_SECONDS_RANGE, DEFAULT_DEVICE, DEVICES, OVERLAP_RANGE

#: A profile runs the whole signal as one window: at most the CLI's longest window (longer grew
#: memory without bound: 1e9 s asked for terabytes).
PROFILE_SECONDS_RANGE = (0.1, CHUNK_SECONDS_RANGE[1])
#: The start-up file is generated in memory first: up to 10 minutes (the longest measured).
STARTUP_SECONDS_RANGE = (0.1, 600.0)
_RATES = click.IntRange(MIN_SAMPLE_RATE, MAX_SAMPLE_RATE)


def default_out() -> Path:
    """Where reports go without --out: a folder of the user's own
    (``$XDG_DATA_HOME/speechlens/bench``, default ``~/.local/share/speechlens/bench``), never the
    current folder. ``make bench`` passes ``--out docs/bench``."""
    xdg = settings.XDG_DATA_HOME.value()
    return (xdg if xdg else Path.home() / ".local" / "share") / "speechlens" / "bench"


def _within(low: float, high: float):
    """Click callback: a number from `low` to `high` (click's FloatRange lets NaN through)."""
    def check(_ctx: click.Context, _param: click.Parameter, value: float | None):
        if value is not None and not low <= value <= high:
            raise click.BadParameter(f"{value:g} is not from {low:g} to {high:g}")
        return value
    return check


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


@click.command("bench")
@click.option("--cases", "patterns", default=None, metavar="PATTERNS",
              help="Comma-separated shell patterns over case names (see --list-cases), or 'all'. "
                   "Default: the whole matrix on a GPU; on the CPU 5 s at 16 kHz, 5-s windows, "
                   "both modes (the full matrix takes hours on a small CPU).")
@click.option("--list-cases", is_flag=True, help="Print the case names and exit.")
@click.option("--quick", is_flag=True,
              help="Smoke run: 5 s at 16 kHz, standard mode, 1 trial (GPU: 1 warm-up + 3).")
@click.option("--warmup", type=click.IntRange(0), default=None,
              help="Warm-up runs per case (default: 5 for 5-s files on a GPU, 1 on the CPU; "
                   "1 / 0 for longer files).")
@click.option("--trials", type=click.IntRange(1), default=None,
              help="Timed runs per case (default: 20 for 5-s files on a GPU, 3 on the CPU; 2 / 1 "
                   "for longer files).")
@click.option("--budget-s", type=float, default=None, callback=_within(1, float("inf")),
              help="Stop a case's trials (after at least one) once the next would end past this "
                   "many seconds; the report says so. Default: none on a GPU, 1800 on the CPU.")
@click.option("--peer/--no-peer", default=True, show_default=True,
              help=("Also run the peers: the plain-loop PyTorch one (pip install "
                    "'speechlens[bench]') and, on CUDA with mamba_ssm, NVIDIA's stack."))
@click.option("--peer-cases", default=None, metavar="PATTERNS",
              help="Case patterns whose input/window the peers also run (default: '5s-*'; "
                   "on a GPU '5s-*,30s-*', the plain-loop peer only on 5-s files where "
                   "NVIDIA's stack runs).")
@click.option("--peer-warmup", type=click.IntRange(0), default=None,
              help="Peer warm-ups (default: 1 on a GPU, 0 on the CPU).")
@click.option("--peer-trials", type=click.IntRange(1), default=None,
              help="Peer trials (default: 3 on a GPU, 2 on the CPU).")
@click.option("--peer-device", type=click.Choice(["auto", "cpu", "cuda", "mps"]),
              default="auto", show_default=True,
              help="torch device for the peer: auto (cuda, else mps, else cpu), cpu, cuda, mps.")
@click.option("--overlap", type=float, default=None, callback=_within(*OVERLAP_RANGE),
              help="Window overlap (default: the CLI's).")
@click.option("--model", default=None,
              help="Checkpoint to time (default: nvidia/RE-USE if cached, else a random "
                   "full-size checkpoint of the same layout).")
@click.option("--device", type=click.Choice(DEVICES), default=DEFAULT_DEVICE,
              show_default=True, help="MLX device.")
@click.option("--out", "out_dir", default=None, type=click.Path(file_okay=False),
              help="Folder for the JSON and Markdown reports [default: "
                   "$XDG_DATA_HOME/speechlens/bench, else ~/.local/share/speechlens/bench].")
@click.option("--name", default=None,
              help="Report file name without suffix (default: the machine kind, e.g. "
                   "cpu-intel-xeon-2cores or cuda-nvidia-h200).")
@click.option("--profile", is_flag=True,
              help="Instead of the timing matrix, profile one run component by component "
                   "(evaluation barriers in the profiler only) at --profile-seconds/"
                   "--profile-rate.")
@click.option("--profile-rate", type=_RATES, default=44100, show_default=True)
@click.option("--profile-seconds", type=float, default=5.0, show_default=True,
              callback=_within(*PROFILE_SECONDS_RANGE),
              help=f"Seconds of audio, run as one window ({PROFILE_SECONDS_RANGE[0]:g}-"
                   f"{PROFILE_SECONDS_RANGE[1]:g}).")
@click.option("--profile-runs", type=click.IntRange(1), default=None,
              help="Profiled runs (median per component; default 3 on a GPU, 1 on the CPU).")
@click.option("--profile-warmup", type=click.IntRange(0), default=None,
              help="Profiled warm-up runs (default 1 on a GPU, 0 on the CPU).")
@click.option("--strict-mode", "profile_strict", is_flag=True,
              help="Profile strict mode instead of standard.")
@click.option("--startup", is_flag=True,
              help="Instead of the timing matrix, time whole `speechlens enhance` processes "
                   "(start-up included) against whole processes of the peer, alternating, "
                   "--trials times each [default: 3] on a file of --startup-seconds at "
                   "--startup-rate.")
@click.option("--startup-seconds", type=float, default=None,
              callback=_within(*STARTUP_SECONDS_RANGE),
              help=f"{STARTUP_SECONDS_RANGE[0]:g}-{STARTUP_SECONDS_RANGE[1]:g} "
                   "[default: 1 on the CPU, 5 on a GPU]")
@click.option("--startup-rate", type=_RATES, default=None,
              help="[default: 16000 on the CPU, 44100 on a GPU]")
@click.option("--corpus", "corpora", multiple=True, metavar="RATE:COUNT:MIN-MAX",
              help="Instead of the timing matrix, time whole processes over a generated corpus "
                   "of COUNT files of MIN-MAX seconds at RATE Hz (repeatable): speechlens cold "
                   "and warm, one file of the same audio, the peer's per-file loop; --trials "
                   "rounds [default: 3 on a GPU, 1 on the CPU]. 'default' runs "
                   "16000:200:1-20 and 44100:60:2-30 on a GPU, 16000:60:0.5-2 on the CPU.")
def bench_command(patterns, list_cases, quick, warmup, trials, budget_s, peer, peer_cases,
                  peer_warmup, peer_trials, peer_device, overlap, model, device, out_dir, name,
                  profile, profile_rate, profile_seconds, profile_runs, profile_warmup,
                  profile_strict, startup, startup_seconds, startup_rate, corpora):
    """Time speechlens end to end (and the PyTorch peer); write JSON + Markdown reports."""
    from . import cases as matrix

    if list_cases:
        for case in matrix.all_cases():
            click.echo(case.name)
        return
    from .. import api, kernels
    from .. import audio as audio_io
    from ..errors import UsageError

    if name is not None:
        audio_io.check_name_part(name, "--name")   # the reports stay inside --out
    out_dir = Path(out_dir) if out_dir is not None else default_out()
    problem = audio_io.name_problem(out_dir / f"{name or 'report'}.json")
    if problem:
        raise UsageError(f"--out {out_dir}: {problem}")
    audio_io.check_writable(audio_io.nearest_existing(out_dir))   # before hours of timing

    api.select_device(device)
    gpu = kernels.backend() != "cpu"
    if quick:
        patterns = patterns or matrix.QUICK_CASES
        if not gpu:
            warmup = 0 if warmup is None else warmup
            trials = 1 if trials is None else trials
            peer_trials = 1 if peer_trials is None else peer_trials
        else:
            warmup = 1 if warmup is None else warmup
            trials = 3 if trials is None else trials
            peer_warmup = 1 if peer_warmup is None else peer_warmup
            peer_trials = 3 if peer_trials is None else peer_trials
    if budget_s is None and not gpu:
        budget_s = 1800.0

    def log(line: str) -> None:
        click.echo(line, err=True)

    if profile:
        _profile(model, out_dir, name, profile_rate, profile_seconds, profile_runs,
                 profile_warmup, profile_strict, gpu, log)
        return
    if startup:
        _startup(model, out_dir, name, startup_seconds, startup_rate, trials, peer, peer_device,
                 gpu, log)
        return
    if corpora:
        _corpus(model, out_dir, name, corpora, trials, peer, peer_device, gpu, log)
        return
    kind = "gpu" if gpu else "cpu"
    _bench(patterns or matrix.DEFAULT_CASES[kind], warmup, trials, budget_s, peer,
           peer_cases or matrix.DEFAULT_PEER_CASES[kind], peer_warmup, peer_trials, peer_device,
           overlap, model, out_dir, name, gpu, log)


def _bench(patterns, warmup, trials, budget_s, peer, peer_cases, peer_warmup, peer_trials,
           peer_device, overlap, model, out_dir, name, gpu, log):
    import tempfile

    from ..errors import UsageError
    from ..pipeline import DEFAULT_OVERLAP
    from . import cases as matrix
    from . import report as rep
    from . import runner
    from .environment import environment, load_average, machine_kind
    from .inputs import bench_checkpoint

    selected = matrix.select(patterns)
    if not selected:
        raise UsageError(f"--cases {patterns!r} matches no case (see --list-cases)")
    options = runner.Options(
        cases=selected, peer_patterns=peer_cases if peer else None, warmup=warmup, trials=trials,
        peer_warmup=peer_warmup, peer_trials=peer_trials, peer_device=peer_device,
        budget_s=budget_s, overlap=DEFAULT_OVERLAP if overlap is None else overlap, model=model)
    machine = machine_kind()
    name = name or machine
    settings = runner.describe(options)
    settings["repeats"] = (
        (f"warm-up {warmup}" if warmup is not None else "warm-up: per-case default")
        + ", " + (f"trials {trials}" if trials is not None else "trials: per-case default")
        + (" (GPU defaults: 5 + 20 for 5-s files, 1 + 2 for longer ones; peer 1 + 3)" if gpu else
           " (CPU defaults: 1 + 3 for 5-s files, 0 + 1 for longer ones; peer 0 + 2)")
        + (f"; at most {budget_s:g} s of trials per case" if budget_s else ""))
    with tempfile.TemporaryDirectory(prefix="speechlens-bench-ckpt-") as tmp:
        ckpt = bench_checkpoint(model, Path(tmp))
        report = {"schema": 1, "kind": "bench", "machine": machine, "started": _now(),
                  "environment": environment(), "checkpoint": ckpt.description,
                  "settings": settings}
        log(f"speechlens bench on {machine}: {len(selected)} case(s); checkpoint: "
            f"{ckpt.description}")

        def save(body: dict) -> None:
            report.update(body)
            report["environment"].update(body.get("peer_info", {}))
            report["targets"] = rep.targets(report)
            rep.write(report, out_dir, name)

        body = runner.run(options, ckpt, log, on_progress=save)
    report["finished"] = _now()
    report["environment"]["load average at end"] = load_average()
    save(body)
    json_path, md_path = rep.write(report, out_dir, name)
    click.echo(rep.markdown(report))
    log(f"wrote {json_path} and {md_path}")
    failed = [r for r in report["cases"] if "error" in r]
    if failed:
        sys.exit(1)


def _finish(report: dict, out_dir: Path, name: str, log) -> None:
    """Stamp the end of a profile or start-up run, write its reports and show the Markdown."""
    from . import report as rep
    from .environment import load_average

    report["finished"] = _now()
    report["environment"]["load average at end"] = load_average()
    json_path, md_path = rep.write(report, out_dir, name)
    click.echo(rep.markdown(report))
    log(f"wrote {json_path} and {md_path}")


def _profile(model, out_dir, name, rate, seconds, runs, warmup, strict, gpu, log):
    import tempfile

    from .. import checkpoint
    from .environment import environment, machine_kind
    from .inputs import bench_checkpoint, bench_speech
    from .profiling import run_profile

    machine = machine_kind()
    name = name or f"{machine}-profile"
    runs = runs or (3 if gpu else 1)
    warmup = (1 if gpu else 0) if warmup is None else warmup
    with tempfile.TemporaryDirectory(prefix="speechlens-bench-ckpt-") as tmp:
        ckpt = bench_checkpoint(model, Path(tmp))
        net = checkpoint.load_model(ckpt.spec, download=False)
    audio, how = bench_speech(rate, seconds)
    report = {"schema": 1, "kind": "profile", "machine": machine, "started": _now(),
              "environment": environment(), "checkpoint": ckpt.description, "fixture": how}
    log(f"speechlens bench --profile on {machine}: {seconds:g} s at {rate} Hz")
    report["profile"] = run_profile(net, audio, rate, strict=strict, runs=runs, warmup=warmup,
                                    log=log)
    _finish(report, out_dir, name, log)


def _startup(model, out_dir, name, seconds, rate, trials, peer, peer_device, gpu, log):
    import tempfile

    from .. import api, checkpoint, kernels
    from . import report as rep
    from .environment import environment, machine_kind
    from .inputs import bench_checkpoint
    from .startup import DEFAULT_FILE, DEFAULT_TRIALS, run_startup

    default_seconds, default_rate = DEFAULT_FILE["gpu" if gpu else "cpu"]
    seconds = default_seconds if seconds is None else seconds
    rate = default_rate if rate is None else rate
    api.check_sample_rate(rate)
    machine = machine_kind()
    name = name or f"{machine}-startup"
    report = {"schema": 1, "kind": "startup", "machine": machine, "started": _now(),
              "environment": environment()}
    log(f"speechlens bench --startup on {machine}: {seconds:g} s at {rate} Hz")
    with tempfile.TemporaryDirectory(prefix="speechlens-bench-ckpt-") as tmp:
        ckpt = bench_checkpoint(model, Path(tmp))
        report["checkpoint"] = ckpt.description
        cfg = checkpoint.inspect(ckpt.spec, download=False).config
        report["architecture"] = rep.architecture(cfg)
        report["startup"] = run_startup(ckpt, kernels.backend(), seconds, rate,
                                        trials or DEFAULT_TRIALS, peer, peer_device, log)
    report["targets"] = rep.startup_targets(report)
    _finish(report, out_dir, name, log)



def _corpus(model, out_dir, name, corpora, rounds, peer, peer_device, gpu, log):
    import tempfile

    from .. import checkpoint, kernels
    from . import report as rep
    from .corpus import DEFAULT_CORPORA, CorpusSpec, run_corpus
    from .environment import environment, machine_kind
    from .inputs import bench_checkpoint

    if "default" in corpora:
        corpora = DEFAULT_CORPORA["gpu" if gpu else "cpu"]
    specs = [CorpusSpec.parse(text) for text in corpora]
    machine = machine_kind()
    name = name or f"{machine}-corpus"
    report = {"schema": 1, "kind": "corpus", "machine": machine, "started": _now(),
              "environment": environment(), "corpora": []}
    with tempfile.TemporaryDirectory(prefix="speechlens-bench-ckpt-") as tmp:
        ckpt = bench_checkpoint(model, Path(tmp))
        report["checkpoint"] = ckpt.description
        cfg = checkpoint.inspect(ckpt.spec, download=False).config
        report["architecture"] = rep.architecture(cfg)
        for spec in specs:
            log(f"speechlens bench --corpus on {machine}: {spec}")
            report["corpora"].append(run_corpus(ckpt, kernels.backend(), spec,
                                                rounds or (3 if gpu else 1), peer, peer_device,
                                                log))
            report["targets"] = rep.corpus_targets(report)
            rep.write(report, out_dir, name)
    _finish(report, out_dir, name, log)


__all__ = ["bench_command"]
