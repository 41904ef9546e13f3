"""`enhance --score` and `--report`: each enhanced file scored before and after (DNSMOS of the
input and of the output), the scores added to its result, and with --report its page written;
a batch's summary page once every file is done."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from ..results import FileResult
from .jobs import Job


@dataclass(frozen=True)
class ScoreRequest:
    """What --score and --report asked for, checked before any work (see `requested`)."""

    #: The page (one input) or the folder of pages (a batch); None: --score alone.
    report: Path | None = None
    batch: bool = False

    def scored(self, result: FileResult, job: Job) -> FileResult:
        """`result` of a file just enhanced, with its scores: the output is in place, so a
        file whose scoring fails fails alone, its output kept."""
        from .. import report

        change = report.score_change(job.source, job.destination, job.name, job.shown_output)
        return replace(result, fields={**result.fields, "scores": change.as_dict()})
