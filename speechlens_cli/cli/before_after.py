"""`enhance --score` and `--report`: each enhanced file scored before and after (DNSMOS of the
input and of the output), the scores added to its result, and with --report its page written;
a batch's summary page once every file is done. All of it is checked before any work."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, replace
from pathlib import Path

from .. import audio as audio_io
from ..errors import OutputError, OutputExistsError, UsageError
from ..results import FileResult, Status
from .jobs import Job, check_name

PAGE_SUFFIXES = (".html", ".htm")
#: A batch's summary page, in the report's folder beside the files' pages.
SUMMARY = "index.html"


@dataclass(frozen=True)
class ScoreRequest:
    """What --score and --report asked for, checked (see `requested`)."""

    #: The page (one input) or the folder of pages (a batch); None: --score alone.
    report: Path | None = None
    batch: bool = False

    def scored(self, result: FileResult, job: Job) -> FileResult:
        """`result` of a file just enhanced, with its scores and, with --report, its page: the
        output is in place, so a file whose scoring fails fails alone, its output kept."""
        from .. import report

        change = report.score_change(job.source, job.destination, job.name, job.shown_output)
        result = replace(result, scores=change.as_dict())
        if self.report is not None:
            page = self._page(job)
            report.write_file_page(page, job.source, job.destination,
                                   (job.name, job.shown_output), change)
            result = replace(result, report=str(page))
        return result

    def _page(self, job: Job) -> Path:
        """One input's page is the path named; a batch's pages are named after their outputs
        (with a digest of the whole name, so a/x.wav and b/x.wav get a page each)."""
        if not self.batch:
            return self.report
        stem = re.sub(r"[^\w.-]+", "_", Path(job.shown_output).stem)[:80]
        digest = hashlib.sha256(job.shown_output.encode()).hexdigest()[:8]
        return self._folder() / f"{stem}-{digest}.html"

    def _folder(self) -> Path:
        """A batch's report folder, made at its first page (its parent was checked)."""
        try:
            self.report.mkdir(exist_ok=True)
        except OSError as error:
            raise OutputError(f"{self.report}: the report's folder cannot be made "
                              f"({error.strerror or error})") from None
        return self.report

    def finish(self, results: list[FileResult]) -> None:
        """A batch's summary page, from every file's result (the pages' files)."""
        if not (self.batch and self.report is not None):
            return
        from .. import report

        entries = [report.SummaryEntry(result.input, Path(result.report).name,
                                       report.ScoreChange.from_dict(result.scores))
                   for result in results if result.report is not None]
        report.write_summary(self._folder() / SUMMARY, entries, len(results) - len(entries))

    def plan_note(self) -> str:
        """What a dry run would write."""
        if self.report is None:
            return "note: --score: each file would be scored (DNSMOS) before and after"
        if self.batch:
            return (f"note: --report: would write each file's page into {self.report} and the "
                    f"batch's summary {self.report / SUMMARY}")
        return f"note: --report: would write the file's page {self.report}"


def requested(report: str | None, score: bool, jobs: list[Job], *, batch: bool,
              overwrite: bool, inputs: frozenset, shared: bool) -> ScoreRequest | None:
    """--report and --score checked before any work: the extra's packages importable, and the
    report's page or folder one this run can write and no input or output of it (`inputs`:
    audio_io.identities of every input; `shared`: the batch is shared among processes)."""
    if report is None and not score:
        return None
    from ..scoring import extra  # here: a run without them never imports scoring

    extra.require(extra.DNSMOS + (extra.PICTURES if report is not None else ()))
    if report is None:
        return ScoreRequest(None, batch)
    if report == "-":
        raise UsageError("--report -: a report is HTML pages, not a stream; name a page "
                         "(report.html) or, for a batch, a folder")
    check_name(report)
    path = Path(report)
    if batch:   # the folder is made at the first page, in a folder that must exist
        _check_folder(report, path, shared)
        summary, folder = path / SUMMARY, path if path.is_dir() else path.parent
    else:
        _check_page(report, path)
        summary, folder = path, path.parent
    if audio_io.identities(path) & (inputs | audio_io.identities(*(job.destination
                                                                   for job in jobs))):
        raise UsageError(f"--report {report}: is an input or output of this run; name another "
                         "page or folder")
    if not folder.is_dir():
        raise OutputError(f"--report {report}: its folder {folder} does not exist")
    audio_io.check_writable(folder)
    if summary.exists() and not overwrite:
        raise OutputExistsError(f"{summary}: exists (--overwrite replaces the report)")
    return ScoreRequest(path, batch)


def _check_folder(report: str, path: Path, shared: bool) -> None:
    if path.suffix.lower() in PAGE_SUFFIXES:
        raise UsageError(f"--report {report}: names one page, and this run enhances several "
                         "files; give a folder (its index.html leads to each file's page)")
    if path.exists() and not path.is_dir():
        raise UsageError(f"--report {report}: exists and is not a folder")
    if shared:
        raise UsageError("--report: a batch shared among processes (mlx.launch) has no report "
                         "yet; use --score, whose scores come with each file's --json line")


def _check_page(report: str, path: Path) -> None:
    if path.is_dir():
        raise UsageError(f"--report {report}: is a folder; for one input the report is one page "
                         "(report.html)")
    if path.suffix.lower() not in PAGE_SUFFIXES:
        raise UsageError(f"--report {report}: for one input the report is one page; give it a "
                         "name ending in .html")


def score_line(result: FileResult) -> str | None:
    """A done file's scores in words (input -> output, change), or None without scores."""
    if result.status is not Status.DONE or result.scores is None:
        return None
    from .. import report

    change = report.ScoreChange.from_dict(result.scores)
    parts = ", ".join(f"{key.upper()} {getattr(change.input, key):.2f} -> "
                      f"{getattr(change.output, key):.2f} ({getattr(change.change, key):+.2f})"
                      for key in report.KEYS)
    page = f"; page {result.report}" if result.report is not None else ""
    return f"{result.input}: DNSMOS {parts}{page}"
