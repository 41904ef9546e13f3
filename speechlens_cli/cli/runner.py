"""Running an `enhance` command's jobs in order, one result per job."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, replace

from .. import api, checkpoint
from .. import audio as audio_io
from ..errors import OutputError, OutputExistsError, SpeechlensError
from ..pipeline import MAX_WINDOW_SECONDS
from ..results import FileResult, Status
from . import interrupts, speed
from .before_after import ScoreRequest
from .jobs import Job, residual_for
from .reporting import Reporter


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """What `enhance` was asked to do: each file's api.EnhanceOptions, and the run's own."""

    enhance: api.EnhanceOptions
    model_spec: str | None   # --model (checkpoint.load_model's)
    device: str              # the device chosen (api.select_device)
    skip_existing: bool
    dry_run: bool
    #: An existing output is reported as "exists" (a skip with a hint), not a failure: outputs
    #: the run names itself (a folder's tree, -o, --suffix), unless --fail-existing.
    report_existing: bool
    residual: str | None          # --residual PATH|SUFFIX (jobs.residual_for)
    scores: ScoreRequest | None   # --score, --report (before_after.requested)

    @property
    def keeps_existing(self) -> bool:
        """Whether an existing output is left alone as a skip rather than failing its file."""
        return self.skip_existing or self.report_existing


def run_jobs(jobs: list[Job], reporter: Reporter, options: RunOptions, *,
             batch: bool, inputs: frozenset) -> list[SpeechlensError]:
    """Plan every job, then report or run each in order; the model is loaded once, at the first
    real work. Planning all first gives the batch's progress its total of audio seconds.
    `inputs`: every input of the run (audio_io.identities), this process's share or not; no
    output may replace one.

    A file that fails is recorded and the next one runs; a model that cannot load stops the run.
    """
    errors = []

    def fail(job: Job, error: SpeechlensError) -> None:
        """Record a failure; an output that appeared meanwhile is a skip where existing outputs
        are kept (another process wrote or finished it since the check: its file is kept)."""
        if isinstance(error, OutputExistsError) and options.keeps_existing:
            reporter.record(_skipped(job, options))
            return
        errors.append(error)
        reporter.record(FileResult(job.name, job.shown_output, Status.FAILED,
                                   error=str(error)))

    outcomes = _plan_jobs(jobs, options, batch=batch, inputs=inputs)
    plans = [o for o in outcomes if isinstance(o, api.FilePlan)]
    reporter.plan_batch(plans)

    def report(job: Job, outcome: SpeechlensError | FileResult) -> None:
        """A job's outcome: a failure, a skip, or a file enhanced (copied to stdout if asked)."""
        if isinstance(outcome, SpeechlensError):
            fail(job, outcome)
            return
        if outcome.status is Status.DONE:
            if job.to_stdout:
                audio_io.copy_to_stream(job.destination, sys.stdout.buffer)
            outcome = replace(outcome, input=job.name, output=job.shown_output)
        reporter.record(outcome)

    _notes(plans, reporter)
    if options.dry_run:
        _dry_run(jobs, outcomes, reporter, options, report)
        return errors
    # What comes before the first file to enhance is reported before the model loads.
    first = next((i for i, o in enumerate(outcomes) if isinstance(o, api.FilePlan)), len(jobs))
    for job, outcome in zip(jobs[:first], outcomes[:first], strict=True):
        interrupts.check()
        report(job, outcome)
    if first == len(jobs):
        return errors
    model = api.get_model(options.model_spec)
    each = options.enhance
    windows = (f"windows of {each.chunk_seconds:g} s" if each.chunk_seconds
               else f"each file whole up to {MAX_WINDOW_SECONDS:g} s")
    reporter.note(f"model: {getattr(model, 'source', options.model_spec)} on {options.device}; "
                  f"{windows}, overlap {each.overlap:g}", verbose=True)
    reporter.model_ready(speed.rate_key(model, options.device, each.strict))
    jobs_of = {id(plan): job for job, plan in zip(jobs, outcomes, strict=True)
               if isinstance(plan, api.FilePlan)}

    def started(plan: api.FilePlan):
        """A file's first window reaches the model: its progress callback."""
        reporter.note(f"{plan.name}: {plan.info.frames} frames, {plan.info.sample_rate} Hz, "
                      f"{plan.info.channels} ch, {plan.output.format}/{plan.output.subtype}",
                      verbose=True)
        return interrupts.checked(reporter.file_progress(plan))

    def scored(plan: api.FilePlan, result: FileResult) -> FileResult:
        return options.scores.scored(result, jobs_of[id(plan)])

    with api.run_plans(outcomes[first:], model, each, on_start=started,
                       after=scored if options.scores is not None else None) as runs:
        rest = iter(jobs[first:])
        try:
            for outcome, job in zip(runs, rest, strict=True):
                report(job, outcome)
                interrupts.check()
        except KeyboardInterrupt:   # the files published meanwhile count as done
            for outcome, job in zip(runs.stop(), rest, strict=False):
                report(job, outcome)
            raise
    return errors


def _notes(plans: list[api.FilePlan], reporter: Reporter) -> None:
    """What the user should know about the outputs (each note once a run) and the rates (once a
    rate), before any file runs or is refused."""
    notes = set()
    for plan in plans:
        untrained = api.untrained_rate_note(plan)
        for key, note in ((plan.output.note, plan.output.note),
                          (plan.info.sample_rate, untrained)):
            if note and key not in notes:
                notes.add(key)
                reporter.note(f"note: {note}")


def _dry_run(jobs: list[Job], outcomes: list, reporter: Reporter, options: RunOptions,
             report) -> None:
    """Every check the real run makes before the model, then each file's plan line; `report`
    gives a job's failure or skip, as in a real run."""
    config = None
    for job, plan in zip(jobs, outcomes, strict=True):
        interrupts.check()
        if not isinstance(plan, api.FilePlan):
            report(job, plan)
            continue
        if config is None:
            config = checkpoint.planning_config(options.model_spec)
        try:
            api.check_plan(plan, config, options.enhance)
        except SpeechlensError as error:
            report(job, error)
            continue
        planned = FileResult(job.name, job.shown_output, Status.PLANNED, audio=plan.facts())
        reporter.record(planned)
        reporter.plan_line(planned)


def _plan_jobs(jobs: list[Job], options: RunOptions, *, batch: bool,
               inputs: frozenset) -> list[api.FilePlan | SpeechlensError | FileResult]:
    """Each job's plan, the error that refuses it, or its result already (an existing output
    kept: options.keeps_existing)."""
    outcomes, outputs = [], set()

    def claim(path) -> None:
        """`path` is written by this job alone: no other job's output or residual."""
        resolved = path.resolve()
        if resolved in outputs:
            raise OutputError(f"{path}: is also the output of another input")
        outputs.add(resolved)

    for job in jobs:
        if options.keeps_existing and os.path.exists(job.destination) \
                and not audio_io.same_file(job.source, job.destination):
            outcomes.append(_skipped(job, options))
            continue
        try:
            claim(job.destination)
            plan = api.plan_file(job.source, job.destination, options.enhance,
                                 container=job.container, name=job.name,
                                 create_folders=batch, inputs=inputs, root=job.root)
            if options.residual is not None:
                residual = residual_for(job, options.residual)
                plan = api.plan_residual(plan, residual, options.enhance, create_folders=batch,
                                         inputs=inputs)
                claim(residual)
            outcomes.append(plan)
        except SpeechlensError as error:
            outcomes.append(error)
    return outcomes


def _skipped(job: Job, options: RunOptions) -> FileResult:
    """An existing output left alone: asked for (--skip-existing), or found by a re-run, which
    says how to replace it."""
    reason = "output exists" if options.skip_existing else "exists (--overwrite replaces it)"
    return FileResult(job.name, job.shown_output, Status.SKIPPED, reason=reason)
