"""The `speechlens` command: a thin Click layer over the Python API.

Every typed error becomes one line on stderr and its exit code here, and only here.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import click
import mlx.core as mx

from . import __version__, api, blas, checkpoint, distributed, kernels
from . import audio as audio_io
from .bench import bench_command  # `speechlens bench` lives in speechlens_cli/bench/
from .errors import (
    BatchFailedError,
    ModelNotFoundError,
    OutputError,
    OutputExistsError,
    SpeechlensError,
    UsageError,
)
from .pipeline import (
    DEFAULT_CHUNK_SECONDS,
    DEFAULT_DEVICE,
    DEFAULT_OVERLAP,
    DEVICES,
    check_settings,
)

#: Below this a 512x512 float32 matmul means MLX runs on a reference (unoptimised) BLAS.
BLAS_SLOW_GFLOPS = 10.0
_BLAS_SIZE = 512


def _versions() -> str:
    return f"speechlens {__version__} (mlx {mx.__version__}, backend {kernels.backend()})"


class _Group(click.Group):
    """Maps SpeechlensError and bad command lines to one line and an exit code; Ctrl-C to 130."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except SpeechlensError as error:
            click.echo(f"error: {error}", err=True)
            ctx.exit(error.exit_code)
        except click.UsageError as error:
            if isinstance(error, click.exceptions.NoArgsIsHelpError):
                raise
            where = error.ctx.command_path if error.ctx else "speechlens"
            click.echo(f"error: {error.format_message()} (see '{where} --help')", err=True)
            ctx.exit(2)
        except KeyboardInterrupt:
            click.echo("interrupted (no partial output left behind)", err=True)
            ctx.exit(130)


def _show_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(_versions())
        ctx.exit()


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True,
              callback=_show_version, help="Show speechlens, MLX and backend versions.")
def main() -> None:
    """Clean up recorded speech with NVIDIA's RE-USE model on MLX."""


# --------------------------------------------------------------------------------- models

@main.group()
def models() -> None:
    """Fetch, list, check and locate RE-USE checkpoints."""


@models.command("pull")
@click.argument("model", required=False)
@click.option("--accept-license", is_flag=True,
              help="Accept NVIDIA's license without a prompt (scripts, CI).")
def models_pull(model: str | None, accept_license: bool) -> None:
    """Download a checkpoint (default nvidia/RE-USE at the pinned revision) and verify it."""
    spec = checkpoint.model_spec(model)
    if checkpoint.is_repo_id(spec):
        try:
            checkpoint.resolve(spec, download=False)
        except ModelNotFoundError:  # first pull: the license comes before any download
            click.echo(checkpoint.LICENSE_NOTE, err=True)
            if not accept_license:
                if not sys.stdin.isatty():
                    raise UsageError("pass --accept-license to accept NVIDIA's license "
                                     "without a prompt") from None
                if not click.confirm("Accept these terms and download?", err=True):
                    raise UsageError("license not accepted; nothing downloaded") from None
    report = checkpoint.inspect(spec, download=True)
    click.echo(f"{report.source}: {report.weights}")
    click.echo(f"ok: sha256 {report.sha256}, {report.parameter_count:,} parameters")


@models.command("list")
def models_list() -> None:
    """Checkpoints in the Hugging Face cache, and the one SPEECHLENS_MODEL points to."""
    from huggingface_hub import constants, scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        repos = scan_cache_dir().repos
    except CacheNotFound:
        repos = frozenset()
    found = 0
    for repo in sorted(repos, key=lambda r: r.repo_id):
        for revision in sorted(repo.revisions, key=lambda r: r.commit_hash):
            if repo.repo_type != "model" or not any(
                    f.file_name == checkpoint.WEIGHTS_FILE for f in revision.files):
                continue
            found += 1
            pinned = " (pinned)" if revision.commit_hash == checkpoint.PINNED_REVISION else ""
            click.echo(f"{repo.repo_id}@{revision.commit_hash[:12]}{pinned}  "
                       f"{revision.size_on_disk / 1e6:.1f} MB  {revision.snapshot_path}")
    env = os.environ.get(checkpoint.MODEL_ENV)
    if env:
        click.echo(f"{checkpoint.MODEL_ENV}={env}")
    if not found:
        click.echo(f"no checkpoints in the Hugging Face cache ({constants.HF_HUB_CACHE}); "
                   "run `speechlens models pull`")


@models.command("verify")
@click.argument("model", required=False)
def models_verify(model: str | None) -> None:
    """Check a checkpoint (folder, file or repo id): keys, shapes, parameters, sha256."""
    report = checkpoint.inspect(model, download=False)
    cfg = report.config
    click.echo(f"source:     {report.source}")
    click.echo(f"weights:    {report.weights}")
    click.echo(f"tensors:    {report.tensor_count:,}")
    click.echo(f"parameters: {report.parameter_count:,}")
    click.echo(f"sha256:     {report.sha256}")
    click.echo(f"config:     {cfg.num_tfmamba} TF-Mamba blocks, {cfg.hid_feature} channels, "
               f"d_state {cfg.d_state}")
    click.echo("ok: compatible with speechlens")


@models.command("path")
@click.argument("model", required=False)
def models_path(model: str | None) -> None:
    """Print where a checkpoint is on disk (never downloads), for --model or scripts."""
    files = checkpoint.resolve(model, download=False)
    local = Path(checkpoint.model_spec(model)).expanduser()
    click.echo(local.resolve() if local.exists() else files.weights.parent)


# --------------------------------------------------------------------------------- doctor

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
    info = kernels.kernel_info()
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
    except SpeechlensError as error:
        report("model", str(error), "delete that copy and run `speechlens models pull`")
    click.echo(f"{problems} problem(s) found" if problems else "no problems found")
    if problems:
        ctx.exit(1)


# --------------------------------------------------------------------------------- enhance

@dataclass(frozen=True)
class _Job:
    source: Path
    destination: Path
    name: str          # the input as the user named it
    shown_output: str  # the output as reported ("-" for stdout)
    container: str | None = None  # forced container (stdout is WAV)

    @property
    def to_stdout(self) -> bool:
        return self.shown_output == "-"


def _folder_jobs(source: Path, destination: Path) -> tuple[list[_Job], list]:
    """Every audio file under `source`, mirrored under `destination`, plus the files left alone:
    not audio (Paths) or not followed (audio_io.Skipped: symlinks leaving the tree, pipes)."""
    if audio_io.same_file(source, destination):
        raise UsageError(f"{destination}: is the input folder; choose another output folder")
    if destination.exists() and not destination.is_dir():
        raise UsageError(f"{destination}: exists and is not a folder")
    inside = destination.resolve().is_relative_to(source.resolve())
    scan = audio_io.scan_tree(source, exclude=destination if inside else None)
    jobs = [_Job(path, destination / path.relative_to(source), str(path),
                 str(destination / path.relative_to(source))) for path in scan.audio]
    if not jobs:
        raise UsageError(f"{source}: no audio files found")
    return jobs, [*scan.other, *scan.skipped]


def _left_alone(item) -> dict:
    """The record of a file a folder batch does not enhance (see _folder_jobs)."""
    if isinstance(item, audio_io.Skipped):
        return {"input": str(item.path), "output": None, "status": "skipped",
                "reason": item.reason}
    return {"input": str(item), "output": None, "status": "not-audio",
            "reason": "not an audio file"}


def _collect_jobs(paths: tuple[str, ...], output_dir: str | None,
                  stack: contextlib.ExitStack) -> tuple[list[_Job], list[Path], bool]:
    """(jobs, non-audio files, is a batch) for SOURCE DESTINATION or SOURCES... -o DIR."""
    if output_dir is not None:
        out = Path(output_dir)
        if out.exists() and not out.is_dir():
            raise UsageError(f"{out}: exists and is not a folder")
        jobs, others = [], []
        for source in paths:
            if source == "-":
                raise UsageError("'-' (stdin) cannot be combined with -o")
            if Path(source).is_dir():
                found, skipped = _folder_jobs(Path(source), out)
                jobs += found
                others += skipped
            else:
                target = out / Path(source).name
                jobs.append(_Job(Path(source), target, source, str(target)))
        return jobs, others, True
    if len(paths) != 2:
        raise UsageError("give SOURCE and DESTINATION, or several sources with -o DIR")
    source, destination = paths
    if source != "-" and Path(source).is_dir():
        if destination == "-":
            raise UsageError(f"{source}: a folder cannot be written to stdout")
        return (*_folder_jobs(Path(source), Path(destination)), True)
    if source == "-":
        read_from, name = stack.enter_context(audio_io.spooled_stdin(
            sys.stdin.buffer)), "<stdin>"
    else:
        read_from, name = Path(source), source
    if destination == "-":
        try:
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="speechlens-")))
        except OSError as error:
            raise OutputError(f"<stdout>: no room for the output in {tempfile.gettempdir()} "
                              f"({error.strerror or error}); set TMPDIR") from None
        return [_Job(read_from, folder / "stdout.wav", name, "-", "WAV")], [], False
    target = Path(destination)
    if target.is_dir() or destination.endswith(("/", os.sep)):
        if source == "-":
            raise UsageError("input from stdin needs an output file name, not a folder")
        target = target / read_from.name
    return [_Job(read_from, target, name, str(target))], [], False


class _Reporter:
    """Progress (stderr, TTY only), JSON lines (stdout), notes and the batch summary (stderr)."""

    def __init__(self, *, as_json: bool, quiet: bool, verbose: bool, batch: bool, total: int):
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

        self.as_json, self.quiet, self.verbose, self.batch = as_json, quiet, verbose, batch
        self.results: list[dict] = []
        self.console = Console(stderr=True)
        self.progress = Progress(
            TextColumn("{task.description}"), BarColumn(),
            TextColumn("{task.fields[shown]}"),
            TimeRemainingColumn(), console=self.console, transient=True,
            disable=quiet or not self.console.is_terminal,
        )
        self.files = self.progress.add_task("files", total=total, shown=f"0/{total} files") \
            if batch else None
        self.current = None

    def note(self, message: str, *, verbose: bool = False) -> None:
        if not self.quiet and (self.verbose or not verbose):
            self.progress.console.print(message, markup=False, highlight=False, soft_wrap=True)

    def file_progress(self, plan: api.FilePlan):
        """A pipeline progress callback showing this file in audio seconds."""
        rate, seconds = plan.info.sample_rate, plan.info.seconds
        self.current = self.progress.add_task(Path(plan.name).name, total=seconds,
                                              shown=f"0.0/{seconds:.1f} s")

        def update(frames: int) -> None:
            self.progress.update(self.current, completed=frames / rate,
                                 shown=f"{frames / rate:.1f}/{seconds:.1f} s")
        return update

    def record(self, result: dict) -> None:
        self.results.append(result)
        if self.current is not None:
            self.progress.remove_task(self.current)
            self.current = None
        if self.files is not None:
            total = self.progress.tasks[self.files].total
            self.progress.update(self.files, completed=len(self.results),
                                 shown=f"{len(self.results)}/{total:g} files")
        if self.as_json:
            click.echo(json.dumps(result))
        if result["status"] == "done":
            if result["clamped"]:
                self.note(f"warning: {result['output']}: {result['clamped']} samples clamped to "
                          f"full scale ({result['subtype']} cannot hold louder peaks)")
            if not self.batch:
                self.note(f"enhanced {result['input']} -> {result['output']}: "
                          f"{result['seconds']:.2f} s of audio in "
                          f"{result['elapsed_seconds']:.2f} s")
        elif result["status"] == "failed" and self.batch:
            self.note(f"failed: {result['error']}")
        elif result["status"] == "not-audio":
            self.note(f"skipped, not audio: {result['input']}")

    def plan_line(self, result: dict) -> None:
        if result["status"] == "planned" and not self.as_json:
            click.echo(f"{result['input']} -> {result['output']}: {result['sample_rate']} Hz, "
                       f"{result['channels']} ch, {result['seconds']:.2f} s, "
                       f"{result['format']}/{result['subtype']}")

    def summary(self) -> None:
        from rich.table import Table
        from rich.text import Text

        if self.quiet or not self.batch:
            return
        styles = {"done": "green", "failed": "red", "skipped": "yellow", "not-audio": "dim",
                  "planned": "cyan"}
        table = Table(title="speechlens enhance")
        for column in ("input", "status", "audio", "note"):
            table.add_column(column)
        for result in self.results:
            note = result.get("error") or result.get("reason") or (
                f"{result['clamped']} samples clamped" if result.get("clamped") else "")
            audio = f"{result['seconds']:.2f} s" if "seconds" in result else ""
            table.add_row(Text(result["input"]), Text(result["status"], styles[result["status"]]),
                          audio, Text(note))
        self.console.print(table)
        counts: dict[str, int] = {}
        for result in self.results:
            counts[result["status"]] = counts.get(result["status"], 0) + 1
        self.console.print(", ".join(f"{n} {status}" for status, n in counts.items()),
                           highlight=False)


def _raise_interrupt(_signum, _frame) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def _sigterm_interrupts():
    """SIGTERM cleans up like Ctrl-C (temporary output removed, exit 130)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@main.command(context_settings={"show_default": True})
@click.argument("paths", nargs=-1, required=True, metavar="SOURCE... [DESTINATION]")
@click.option("-o", "--output-dir", default=None,
              help="Write all SOURCEs (files or folders) into this folder.")
@click.option("--model", default=None, envvar=checkpoint.MODEL_ENV, show_default=False,
              help="Hugging Face repo id, checkpoint folder or .safetensors file "
                   "[default: SPEECHLENS_MODEL, else nvidia/RE-USE].")
@click.option("--strict-mode", is_flag=True, help="Numerically strictest scan.")
@click.option("--chunk-seconds", type=float, default=DEFAULT_CHUNK_SECONDS,
              help="Window length in seconds (5-30).")
@click.option("--overlap", type=float, default=DEFAULT_OVERLAP,
              help="Cross-fade between windows, as a fraction of the window (0-0.5).")
@click.option("--device", type=click.Choice(DEVICES), default=DEFAULT_DEVICE,
              help="Where MLX runs (auto: the GPU when this MLX build has one).")
@click.option("--overwrite", is_flag=True, help="Replace existing outputs.")
@click.option("--skip-existing", is_flag=True, help="Keep existing outputs (resume a batch).")
@click.option("--subtype", default=None, show_default=False,
              help="Output encoding, e.g. PCM_16, PCM_24, FLOAT [default: the input's].")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per file on stdout.")
@click.option("--dry-run", is_flag=True, help="Show the plan; load no model, write nothing.")
@click.option("-q", "--quiet", is_flag=True, help="Errors only.")
@click.option("-v", "--verbose", is_flag=True, help="Also show model, device and file details.")
@click.option("--shard", default=None, metavar="I/N", callback=distributed.shard_option,
              help="Enhance only part I of N (from 0), split as under mlx.launch: for SLURM "
                   "arrays, GNU parallel, Ray (docs/scale-out.md).")
def enhance(paths: tuple[str, ...], output_dir: str | None, model: str | None, strict_mode: bool,
            chunk_seconds: float, overlap: float, device: str, overwrite: bool,
            skip_existing: bool, subtype: str | None, as_json: bool, dry_run: bool, quiet: bool,
            verbose: bool, shard: tuple[int, int] | None) -> None:
    """Enhance SOURCE into DESTINATION, file to file or folder to folder ('-' is stdin/stdout).

    Outputs keep the input's sample rate, channels, length, container and subtype. A folder is
    enhanced recursively into a mirrored tree; files that are not audio are listed and skipped.
    Started by mlx.launch, the ranks share the batch and rank 0 reports it (docs/scale-out.md).
    """
    check_settings(chunk_seconds, overlap)
    if overwrite and skip_existing:
        raise UsageError("--overwrite and --skip-existing contradict each other")
    if subtype is not None:
        audio_io.check_subtype_name(subtype)
    chosen_device = api.select_device(device)
    share = distributed.join(shard)  # this process's part: --shard, an mlx.launch rank, or all
    share.check_paths(paths)
    with contextlib.ExitStack() as stack:
        stack.enter_context(_sigterm_interrupts())
        jobs, others, batch = _collect_jobs(paths, output_dir, stack)
        if as_json and any(job.to_stdout for job in jobs):
            raise UsageError("--json writes to stdout, which already carries the audio")
        jobs, others = share.take(jobs, others)

        def new_reporter(live: bool, total: int) -> _Reporter:
            return _Reporter(as_json=as_json and live, quiet=quiet or not live, verbose=verbose,
                             batch=batch, total=total)

        def run(reporter: _Reporter) -> list[SpeechlensError]:
            errors = _run_jobs(jobs, reporter, batch=batch, model_spec=model,
                               device=chosen_device, strict=strict_mode,
                               chunk_seconds=chunk_seconds, overlap=overlap, overwrite=overwrite,
                               skip_existing=skip_existing, subtype=subtype, dry_run=dry_run)
            for path in others:
                reporter.record(_left_alone(path))
            return errors

        if share.in_group:  # never returns: rank 0 reports for all, every rank exits
            share.run_in_group(run, new_reporter, batch=batch)
        reporter = new_reporter(True, len(jobs) + len(others))
        stack.enter_context(reporter.progress)
        if share.note:
            reporter.note(share.note, verbose=True)
        errors = run(reporter)
    reporter.summary()
    if errors and not batch:
        raise errors[0]
    if errors:
        raise BatchFailedError(f"{len(errors)} of {len(jobs)} files failed (listed above)")


def _run_jobs(jobs: list[_Job], reporter: _Reporter, *, batch: bool, model_spec: str | None,
              device: str, strict: bool, chunk_seconds: float, overlap: float, overwrite: bool,
              skip_existing: bool, subtype: str | None, dry_run: bool) -> list[SpeechlensError]:
    """Check and run every job in order; the model is loaded once, at the first real work.

    A file that fails is recorded and the next one runs; a model that cannot load stops the run.
    """
    model, errors, outputs = None, [], set()

    def fail(base: dict, error: SpeechlensError) -> None:
        """Record a failure; an output that appeared meanwhile is a skip under --skip-existing
        (another process wrote or finished it since the check: its file is kept)."""
        if isinstance(error, OutputExistsError) and skip_existing:
            reporter.record({**base, "status": "skipped", "reason": "output exists"})
            return
        errors.append(error)
        reporter.record({**base, "status": "failed", "error": str(error)})

    for job in jobs:
        base = {"input": job.name, "output": job.shown_output}
        if skip_existing and job.destination.exists() \
                and not audio_io.same_file(job.source, job.destination):
            reporter.record({**base, "status": "skipped", "reason": "output exists"})
            continue
        try:
            if job.destination.resolve() in outputs:
                raise OutputError(f"{job.destination}: is also the output of another input")
            outputs.add(job.destination.resolve())
            plan = api.plan_file(job.source, job.destination, overwrite=overwrite,
                                 subtype=subtype, container=job.container, name=job.name,
                                 create_folders=batch)
        except SpeechlensError as error:
            fail(base, error)
            continue
        if dry_run:
            planned = {**base, "status": "planned", "sample_rate": plan.info.sample_rate,
                       "channels": plan.info.channels, "frames": plan.info.frames,
                       "seconds": round(plan.info.seconds, 6), "format": plan.output.format,
                       "subtype": plan.output.subtype}
            reporter.record(planned)
            reporter.plan_line(planned)
            continue
        if model is None:
            model = api.get_model(model_spec)
            reporter.note(f"model: {getattr(model, 'source', model_spec)} on {device}; "
                          f"windows of {chunk_seconds:g} s, overlap {overlap:g}", verbose=True)
        reporter.note(f"{job.name}: {plan.info.frames} frames, {plan.info.sample_rate} Hz, "
                      f"{plan.info.channels} ch, {plan.output.format}/{plan.output.subtype}",
                      verbose=True)
        try:
            result = api.run_plan(plan, model, strict=strict, chunk_seconds=chunk_seconds,
                                  overlap=overlap, progress=reporter.file_progress(plan))
        except SpeechlensError as error:
            fail(base, error)
            continue
        if job.to_stdout:
            audio_io.copy_to_stream(job.destination, sys.stdout.buffer)
        reporter.record({**result, **base})
    return errors


main.add_command(bench_command)

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
