"""This process's part of a batch: which jobs it takes, and how a group reports them as one."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, NoReturn

from ..errors import GroupExit, SpeechlensError, UsageError
from ..results import FileResult
from .collectives import Collectives
from .plan import file_seconds, input_view, owners


class Share:
    """Part `rank` of `size` (0 of 1 when alone); `collectives` when in a launcher's group."""

    def __init__(self, rank: int = 0, size: int = 1, collectives: Collectives | None = None):
        self.rank, self.size, self.collectives = rank, size, collectives
        self.owner: list[int] = []      # the part of every job of the whole batch
        self.indices: list[int] = []    # this part's jobs, as indices into the whole batch
        self.jobs_total = self.others_total = 0
        self.seconds = self.seconds_total = 0.0
        self.note: str | None = None    # what this part got, for -v

    @property
    def alone(self) -> bool:
        return self.size == 1

    @property
    def in_group(self) -> bool:
        return self.collectives is not None

    # ---------------------------------------------------------------- splitting the batch

    def check_paths(self, paths: Sequence[str]) -> None:
        if not self.alone and "-" in paths:
            raise UsageError("'-' (stdin/stdout) cannot be split across processes; "
                             "give files or folders")

    def take(self, jobs: list, others: list) -> tuple[list, list]:
        """This part's jobs (in batch order) and, on part 0 only, the non-audio files.

        `jobs` have `.name` (the input as named, the tie-break) and `.source`/`.destination`.
        """
        self.jobs_total, self.others_total = len(jobs), len(others)
        if self.alone:
            self.indices = list(range(len(jobs)))
            return jobs, others
        seconds = [file_seconds(job.source) for job in jobs]
        self.owner = owners(jobs, seconds, self.size)
        if self.collectives is not None:
            self._check_same_input(self.collectives, input_view(jobs, seconds))
        self.indices = [i for i, part in enumerate(self.owner) if part == self.rank]
        self.seconds_total = sum(seconds)
        self.seconds = sum(seconds[i] for i in self.indices)
        what = f"rank {self.rank} of {self.size}" if self.in_group \
            else f"shard {self.rank}/{self.size}"
        self.note = (f"{what}: {len(self.indices)} of {len(jobs)} files, "
                     f"{self.seconds:.2f} of {self.seconds_total:.2f} s of audio")
        return [jobs[i] for i in self.indices], (others if self.rank == 0 else [])

    def _check_same_input(self, collectives: Collectives, mine: dict) -> None:
        """Every rank must plan the same batch, or files would be lost or done twice."""
        views = [json.loads(blob) for blob in collectives.all_gather_bytes(
            json.dumps(mine).encode(), "comparing the input")]
        if any(view["digest"] != views[0]["digest"] for view in views):
            seen = "; ".join(f"rank {rank}: {view['files']} files, {view['seconds']:g} s"
                             for rank, view in enumerate(views))
            raise GroupExit(1, f"the ranks see different inputs ({seen}): every rank needs the "
                               "same input files at the same paths (a shared folder or identical "
                               "copies)", speaks=collectives.rank == 0,
                            barrier=collectives.barrier)

    # ---------------------------------------------------------------- running in a group

    def run_in_group(self, run: Callable[[Any], list[SpeechlensError]],
                     make_reporter: Callable[[bool, int], Any], *, batch: bool) -> NoReturn:
        """Run this rank's jobs quietly, gather every rank's results, let rank 0 report them as
        one batch, and raise GroupExit with the combined code on every rank (the CLI says why on
        rank 0, meets the others at the barrier and exits).

        `run(reporter)` records one result per job in order (then the non-audio files) and
        returns the per-file errors; it raises for a failure that stops the rank (no model).
        `make_reporter(live, total)` builds the CLI's reporter (quiet when not `live`).
        """
        started = time.perf_counter()
        local = make_reporter(False, len(self.indices))
        fatal = None
        try:
            errors = run(local)
        except SpeechlensError as error:
            errors, fatal = [], [error.exit_code, str(error)]
        mine = {
            "results": [result.as_dict() for result in local.results], "indices": self.indices,
            "fatal": fatal, "errors": [[error.exit_code, str(error)] for error in errors],
            "seconds": self.seconds, "elapsed": round(time.perf_counter() - started, 3),
        }
        parts = [json.loads(blob)
                 for blob in self.collectives.all_gather_bytes(json.dumps(mine).encode())]
        code, message = self._outcome(parts, batch)
        if self.rank == 0:
            self._report(parts, make_reporter(True, self.jobs_total + self.others_total))
        raise GroupExit(code, message, speaks=self.rank == 0, barrier=self.collectives.barrier)

    def _outcome(self, parts: list[dict], batch: bool) -> tuple[int, str | None]:
        """The combined exit code and its one-line message (the same on every rank)."""
        stopped: dict[str, list[int]] = {}
        for rank, part in enumerate(parts):
            if part["fatal"]:
                stopped.setdefault(part["fatal"][1], []).append(rank)
        if stopped:
            reason, ranks = next(iter(stopped.items()))
            code = parts[ranks[0]]["fatal"][0]
            missing = sum(max(len(parts[r]["indices"]) - len(parts[r]["results"]), 0)
                          for r in ranks)
            who = ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))
            more = f"; {len(stopped) - 1} other rank(s) stopped too" if len(stopped) > 1 else ""
            return code, (f"{who} of {self.size}: {reason} ({missing} files not run{more}; run "
                          "the same command again with --skip-existing to finish)")
        failed = [error for part in parts for error in part["errors"]]
        if not failed:
            return 0, None
        if not batch:  # one file, named as a file: its own error and code, as when alone
            return failed[0][0], failed[0][1]
        return 3, f"{len(failed)} of {self.jobs_total} files failed (listed above)"

    def _report(self, parts: list[dict], reporter: Any) -> None:
        """Rank 0: every result in batch order, each marked with its rank, then the summary."""
        ordered = []
        for rank, part in enumerate(parts):
            for position, result in enumerate(part["results"]):
                index = part["indices"][position] if position < len(part["indices"]) \
                    else self.jobs_total + position - len(part["indices"])
                ordered.append((index, replace(FileResult.from_dict(result), rank=rank)))
        for _, result in sorted(ordered, key=lambda pair: pair[0]):
            reporter.record(result)
            reporter.plan_line(result)
        reporter.summary()
        reporter.note(f"{self.size} ranks ({self.collectives.backend} backend): " + "; ".join(
            f"rank {rank} {len(part['indices'])} files, {part['seconds']:.2f} s of audio in "
            f"{part['elapsed']:.2f} s" for rank, part in enumerate(parts)))
