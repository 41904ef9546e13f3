"""`speechlens enhance`: files or folders in, enhanced files out."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import click

from .. import api, checkpoint, distributed
from .. import audio as audio_io
from ..errors import BatchFailedError, OutputError, SpeechlensError, UsageError
from ..pipeline import CHUNK_SECONDS_RANGE, DEFAULT_DEVICE, DEVICES, MAX_WINDOW_SECONDS
from ..results import Status
from . import before_after, interrupts
from .app import main
from .jobs import (
    check_residual,
    check_shared_destination,
    collect_jobs,
    left_alone,
    standard_stream,
)
from .license import confirm_license
from .reporting import Reporter
from .runner import RunOptions, run_jobs

#: Each file's options as the API has them: where the options below take their defaults.
_DEFAULT = api.EnhanceOptions()


def _format_suffix(name: str | None) -> str | None:
    """--format's container as a suffix (".m4a"): one speechlens writes, or a usage error."""
    if name is None:
        return None
    suffix = "." + name.lower().lstrip(".")
    if suffix not in audio_io.writable_suffixes():   # SD2 is known but never written
        raise audio_io.unwritable(f"--format {name}")
    return suffix


def _shard_option(_ctx: click.Context, _param: click.Parameter,
                  value: str | None) -> tuple[int, int] | None:
    """Click callback for --shard: a bad value is a usage error (exit 2)."""
    if value is None:
        return None
    try:
        return distributed.parse_shard(value)
    except ValueError as error:
        raise click.BadParameter(str(error)) from None


def _bit_rate_option(_ctx: click.Context, _param: click.Parameter,
                     value: str | None) -> int | None:
    """Click callback for --bitrate: checked before any work (one usage line)."""
    return None if value is None else audio_io.parse_bit_rate(value)


_EXAMPLES = """\b
Examples:
  speechlens enhance memo.m4a clean.m4a        phone memo: AAC stays AAC at its bit rate
  speechlens enhance talk.mp4 clean.mp4        video: picture, subtitles, other tracks copied
  speechlens enhance talk.mkv clean.mkv --track 1   the second audio track instead
  speechlens enhance noisy.wav clean.flac      another container: the suffix decides
  speechlens enhance *.m4a --suffix _clean     clean copies next to the inputs
  speechlens enhance in.wav out.wav --atten-lim 12   keep some of the original:
                                               what is removed goes at most 12 dB down
  speechlens enhance recordings/ cleaned/      a folder, recursively, into a mirrored tree
  speechlens enhance a.wav b.m4a -o cleaned/   several files into one folder
  speechlens enhance - - < in.wav > out.wav    WAV through stdin and stdout
  speechlens enhance - clean.m4a < memo.m4a    any readable format on stdin
  speechlens enhance - - --format flac < in.wav > out.flac   another container on stdout
  speechlens enhance in.wav out.mp3 --bitrate 128k            a lossy output's bit rate
  speechlens enhance in/ out/ --report report/   a page per file to listen and compare,
                                               scores before and after, index.html

\b
Formats: WAV, FLAC, AIFF, OGG and libsndfile's others, exactly; M4A, MP4, MOV, WebM,
MKV, MP3, AAC (ADTS) and Opus through FFmpeg (PyAV). `speechlens formats` lists them
with their encodings.
An output suffix nothing writes (.txt, none) is refused; an encoding the container
cannot hold becomes the nearest lossless one it has, with a note.

\b
Exit codes: 0 all done, 1 a failure, 2 a usage error, 3 a batch finished with some files
failed, 130 interrupted (Ctrl-C; 143 SIGTERM, 128 + N for signal N). Every failure is one
line on stderr; no partial output is left.
"""


@main.command(context_settings={"show_default": True}, epilog=_EXAMPLES)
@click.argument("paths", nargs=-1, required=True,
                metavar="SOURCE DESTINATION | SOURCE... -o DIR | SOURCE... --suffix S")
@click.option("-o", "--output-dir", default=None,
              help="Write all SOURCEs (files or folders) into this folder.")
@click.option("--suffix", "name_suffix", default=None, metavar="S",
              help="Write each output beside its input file, named NAME{S}.EXT.")
@click.option("--model", default=None, show_default=False,
              help="Hugging Face repo id, checkpoint folder or .safetensors file "
                   "[default: SPEECHLENS_MODEL, else nvidia/RE-USE].")
@click.option("--strict-mode", is_flag=True, default=_DEFAULT.strict,
              help="A little slower; the output is the same on every kind of CPU and closest "
                   "to an exact (float64) run of the model, by far less than can be heard: for "
                   "research comparisons.")
@click.option("--chunk-seconds", type=float, default=_DEFAULT.chunk_seconds, show_default=False,
              help=f"Force windows of this many seconds ({CHUNK_SECONDS_RANGE[0]:g}-"
                   f"{CHUNK_SECONDS_RANGE[1]:g}) [default: each file whole up to "
                   f"{MAX_WINDOW_SECONDS:g} s, longer ones in {MAX_WINDOW_SECONDS:g}-s windows; "
                   "shorter where memory is short].")
@click.option("--overlap", type=float, default=_DEFAULT.overlap,
              help="Cross-fade between windows, as a fraction of the window (0-0.5).")
@click.option("--atten-lim", "atten_lim_db", type=float, default=_DEFAULT.atten_lim_db,
              metavar="DB", show_default=False,
              help="Limit the attenuation to DB decibels: each window is mixed as "
                   "g*input + (1-g)*enhanced with g = 10^(-DB/20), so what the model removes "
                   "ends up at most DB dB down (0: the input unchanged; inf: no limit) "
                   "[default: no limit].")
@click.option("--residual", default=None, metavar="PATH|SUFFIX", show_default=False,
              help="Also write what was removed (the input minus the output, sample for sample), "
                   "as the output is written: to PATH (one input), or beside each output as "
                   "NAME{SUFFIX}.EXT.")
@click.option("--report", default=None, metavar="PATH", show_default=False,
              help="Also write an HTML report, self-contained (players, spectrograms, scores "
                   "before and after): PATH.html for one input, a folder for a batch (a page per "
                   "file and index.html, worst first). Needs the `report` extra.")
@click.option("--score", is_flag=True,
              help="Score each file before and after (DNSMOS) without a report: a line per "
                   "file, and in each --json object. Needs the `report` extra.")
@click.option("--device", type=click.Choice(DEVICES), default=DEFAULT_DEVICE,
              help="Where MLX runs (auto: the GPU when this MLX build has one).")
@click.option("--overwrite", is_flag=True, default=_DEFAULT.overwrite,
              help="Replace existing outputs.")
@click.option("--skip-existing", is_flag=True, help="Keep existing outputs (resume a batch).")
@click.option("--fail-existing", is_flag=True,
              help="An existing output fails its file (a batch exits 3), where a batch or "
                   "--suffix otherwise reports it as exists and goes on.")
@click.option("--subtype", default=_DEFAULT.subtype, show_default=False,
              help="Output encoding, e.g. PCM_16, PCM_24, FLOAT [default: the input's].")
@click.option("--format", "output_suffix", default=None, metavar="SUFFIX", show_default=False,
              help="Container of every output, by suffix (wav, flac, m4a, mp4, webm, ...), "
                   "also on stdout where a pipe can carry it (not MP4's family) "
                   "[default: the output name's, else the input's; WAV on stdout].")
@click.option("--bitrate", "bit_rate", default=_DEFAULT.bit_rate, metavar="RATE",
              show_default=False, callback=_bit_rate_option,
              help="Bit rate of a lossy output (AAC, Opus, MP3), e.g. 64k or 64000 "
                   "[default: the input's for the same codec, else 64k a channel for AAC and "
                   "MP3, 32k for Opus].")
@click.option("--track", type=click.IntRange(min=0), default=_DEFAULT.track,
              show_default=False,
              help="Audio track of a media file to enhance, from 0 as in ffmpeg's -map 0:a:N "
                   "[default: the default track]; the others are copied.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per file on stdout.")
@click.option("--dry-run", is_flag=True, help="Show the plan; load no model, write nothing.")
@click.option("-q", "--quiet", is_flag=True, help="Errors only.")
@click.option("-v", "--verbose", is_flag=True, help="Also show model, device and file details.")
@click.option("--accept-license", is_flag=True,
              help="Accept NVIDIA's license for the first download of its weights without a "
                   f"prompt (also {checkpoint.LICENSE_ENV}=1).")
@click.option("--shard", default=None, metavar="I/N", callback=_shard_option,
              help="Enhance only part I of N (from 0), split as under mlx.launch: for SLURM "
                   "arrays, GNU parallel, Ray (docs/scale-out.md).")
def enhance(paths: tuple[str, ...], output_dir: str | None, name_suffix: str | None,
            model: str | None, strict_mode: bool,
            chunk_seconds: float, overlap: float, atten_lim_db: float | None,
            residual: str | None, report: str | None, score: bool, device: str,
            overwrite: bool, fail_existing: bool,
            skip_existing: bool, subtype: str | None, output_suffix: str | None,
            bit_rate: int | None,
            track: int | None, as_json: bool, dry_run: bool, quiet: bool,
            verbose: bool, accept_license: bool, shard: tuple[int, int] | None) -> None:
    """Enhance SOURCE into DESTINATION, file to file or folder to folder ('-' is stdin/stdout).

    Outputs keep the input's sample rate, channels, length, container and subtype. A folder is
    enhanced recursively into a mirrored tree; files that are not audio are listed and skipped.
    Started by mlx.launch, the processes share the batch and one report covers it all
    (docs/scale-out.md).
    """
    each = api.EnhanceOptions(strict=strict_mode, overwrite=overwrite,
                              chunk_seconds=chunk_seconds, overlap=overlap, subtype=subtype,
                              atten_lim_db=atten_lim_db, bit_rate=bit_rate, track=track)
    chosen = [name for name, on in (("--overwrite", overwrite), ("--skip-existing", skip_existing),
                                    ("--fail-existing", fail_existing)) if on]
    if len(chosen) > 1:
        raise UsageError(f"{' and '.join(chosen)} contradict each other")
    if subtype is not None:
        audio_io.check_subtype_name(subtype)
    suffix = _format_suffix(output_suffix)
    if as_json:
        standard_stream("stdout", "--json has nowhere to write; leave it out")
    chosen_device = api.select_device(device)
    share = distributed.join(shard)  # this process's part: --shard, an mlx.launch rank, or all
    share.check_paths(paths)
    with contextlib.ExitStack() as stack:
        stack.enter_context(interrupts.signals_interrupt())
        jobs, others, batch = collect_jobs(paths, output_dir, stack, name_suffix)
        if suffix:
            named = not batch and not paths[-1].endswith(("/", os.sep)) \
                and not Path(paths[-1]).is_dir()
            jobs = [job.in_format(suffix, named=named) for job in jobs]
        if as_json and any(job.to_stdout for job in jobs):
            raise UsageError("--json writes to stdout, which already carries the audio")
        # before sharing them out; those left alone too (a_clean.wav skipped under --suffix
        # _clean is still never replaced by a.wav's output, --overwrite or not)
        inputs = audio_io.identities(*(job.source for job in jobs),
                                     *(getattr(item, "path", item) for item in others))
        jobs, others = share.take(jobs, others)
        report_existing = (batch or name_suffix is not None) and not (fail_existing or overwrite)
        if residual is not None:
            check_residual(residual, jobs, batch=batch)
        if batch:
            check_shared_destination(jobs, skip_existing=skip_existing or report_existing)
        scores = before_after.requested(report, score, jobs, batch=batch, overwrite=overwrite,
                                        inputs=inputs, shared=share.in_group)
        if jobs and not dry_run:  # the license before anything could start a download
            confirm_license(model, accept_license, may_ask="-" not in paths)

        options = RunOptions(enhance=each, model_spec=model, device=chosen_device,
                             skip_existing=skip_existing, dry_run=dry_run,
                             report_existing=report_existing, residual=residual, scores=scores)

        def new_reporter(live: bool, total: int) -> Reporter:
            # a rank that is not rank 0 reports nothing itself; rank 0 prints the whole plan
            return Reporter(as_json=as_json and live, quiet=quiet or not live, verbose=verbose,
                            batch=batch, total=total, plan_lines=live)

        def run(reporter: Reporter) -> list[SpeechlensError]:
            if name_suffix is not None and others:   # the only ones --suffix leaves alone
                reporter.note(f"note: {len(others)} of the inputs already end in {name_suffix} "
                              "(outputs of an earlier run): left alone")
            if scores is not None and dry_run:
                reporter.note(scores.plan_note())
            errors = run_jobs(jobs, reporter, options, batch=batch, inputs=inputs)
            for path in others:
                reporter.record(left_alone(path))
            if scores is not None and not dry_run:
                scores.finish(reporter.results)
            return errors

        if share.in_group:  # raises GroupExit: rank 0 reports for all, every rank exits
            share.run_in_group(run, new_reporter, batch=batch)
        reporter = new_reporter(True, len(jobs) + len(others))
        stack.enter_context(reporter.progress)
        if share.note:
            reporter.note(share.note, verbose=True)
        try:
            errors = run(reporter)
        except KeyboardInterrupt:
            if not batch:
                raise
            done = sum(r.status in (Status.DONE, Status.SKIPPED) and r.output is not None
                       for r in reporter.results)
            raise interrupts.BatchInterrupted(done, len(jobs)) from None
    reporter.summary()
    if errors and not batch:
        raise errors[0]
    if reporter.json_error:
        raise OutputError(reporter.json_error)
    if errors:
        raise BatchFailedError(f"{len(errors)} of {len(jobs)} files failed (listed above)")
