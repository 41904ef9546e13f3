"""Scale-out: one batch split over processes, GPUs or hosts (docs/scale-out.md).

Two ways to split a batch, one plan:

* A group started by MLX's own launcher (`mlx.launch`: the ring backend over TCP on CPUs and
  Macs, NCCL on CUDA hosts, JACCL over Thunderbolt RDMA; or `mpirun` for MPI). Every rank
  computes the same plan from the same file list, enhances only its share, and the per-file
  results are gathered with `mx.distributed.all_gather` so that rank 0 prints one report.
* `--shard I/N`: the same split without a launcher, for any scheduler (SLURM arrays, GNU
  parallel, Ray). Shards never talk to each other; each reports and exits on its own.

The plan balances audio duration: files (read from their headers) go largest first onto the
least-loaded part, equal durations in path order, equal loads to the lower part, so every
process computes the same plan without communicating. Outputs that would collide stay together.
With --skip-existing the plan is still made over the full list (shares stay stable across
re-runs) and each part skips inside its share.

In a group every rank exits with the combined code (0 all done, 3 some files failed, 1 a rank
stopped), after rank 0 has printed the whole report and all ranks have met at a final barrier:
`mlx.launch` terminates the remaining ranks as soon as one exits with a non-zero code, so nothing
may still be printing by then. (`mlx.launch` itself exits 0 whatever its ranks return; it logs
"Node with rank R exited with code C".)
"""

from __future__ import annotations

import hashlib
import heapq
import json
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

import click
import mlx.core as mx
import numpy as np

from . import audio as audio_io
from .errors import SpeechlensError, UsageError

#: Per launcher backend, where the collectives run (NCCL needs a CUDA stream).
_GPU_BACKENDS = ("nccl",)
_SHARD = re.compile(r"\s*(\d+)\s*/\s*(\d+)\s*")


# ------------------------------------------------------------------------------ the plan

def assign(seconds: Sequence[float], keys: Sequence[str], parts: int) -> list[int]:
    """The part (0..parts-1) of each item: largest first onto the least-loaded part.

    Equal durations are taken in `keys` order, equal loads go to the lower part, so the plan
    depends only on the items, never on the order they come in. Greedy least-loaded keeps every
    part's total within the largest item of every other part's.
    """
    if parts < 1:
        raise ValueError(f"need at least one part, got {parts}")
    if len(seconds) != len(keys):
        raise ValueError("one key per duration")
    owner = [0] * len(keys)
    loads = [(0.0, part) for part in range(parts)]  # a heap: (load, part)
    for item in sorted(range(len(keys)), key=lambda i: (-seconds[i], keys[i], i)):
        load, part = heapq.heappop(loads)
        owner[item] = part
        heapq.heappush(loads, (load + seconds[item], part))
    return owner


def file_seconds(path: Path) -> float:
    """Duration from the header; 0 for a file that cannot be read (it fails quickly anyway)."""
    try:
        return audio_io.read_info(path).seconds
    except (SpeechlensError, OSError):
        return 0.0


def parse_shard(text: str) -> tuple[int, int]:
    """'I/N' -> (I, N): part I (counted from 0) of N."""
    match = _SHARD.fullmatch(text)
    if not match:
        raise ValueError(f"expected I/N (part I of N, counted from 0), e.g. 0/4; got {text!r}")
    index, count = int(match[1]), int(match[2])
    if count < 1:
        raise ValueError(f"N must be at least 1, got {text!r}")
    if index >= count:
        raise ValueError(f"part {index} does not exist in {count} parts (0 to {count - 1})")
    return index, count


def shard_option(_ctx: click.Context, _param: click.Parameter,
                 value: str | None) -> tuple[int, int] | None:
    """Click callback for --shard: a bad value is a usage error (exit 2)."""
    if value is None:
        return None
    try:
        return parse_shard(value)
    except ValueError as error:
        raise click.BadParameter(str(error)) from None


# ------------------------------------------------------------------------------ the group

def _integer(text: str | None) -> int:
    try:
        return int(text or 0)
    except ValueError:
        return 0


def launched_backend(env: Mapping[str, str] | None = None) -> str | None:
    """The mx.distributed backend a launcher started this process for, or None when alone.

    mlx.launch sets MLX_RANK plus MLX_HOSTFILE (ring), NCCL_HOST_IP and MLX_WORLD_SIZE (nccl) or
    MLX_IBV_DEVICES (jaccl); mpirun sets OMPI_COMM_WORLD_SIZE or PMI_SIZE. `mlx.launch -n 1`
    writes an empty hostfile: that is one process, not a group.
    """
    env = os.environ if env is None else env
    if "MLX_RANK" in env or "JACCL_RANK" in env:
        if env.get("NCCL_HOST_IP"):
            return "nccl" if _integer(env.get("MLX_WORLD_SIZE")) > 1 else None
        if env.get("MLX_IBV_DEVICES") or env.get("JACCL_IBV_DEVICES"):
            return "jaccl"
        if env.get("MLX_HOSTFILE"):
            hostfile = Path(env["MLX_HOSTFILE"])
            try:
                blank = hostfile.is_file() and not hostfile.read_text().strip()
            except OSError:
                blank = False
            return None if blank else "ring"
    if max(_integer(env.get("OMPI_COMM_WORLD_SIZE")), _integer(env.get("PMI_SIZE"))) > 1:
        return "mpi"
    return None


class Share:
    """This process's part of a batch: part `rank` of `size` (0 of 1 when alone)."""

    def __init__(self, rank: int = 0, size: int = 1, group: Any = None,
                 backend: str | None = None):
        self.rank, self.size, self.group, self.backend = rank, size, group, backend
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
        return self.group is not None

    # ---------------------------------------------------------------- splitting the batch

    def check_paths(self, paths: Sequence[str]) -> None:
        if not self.alone and "-" in paths:
            raise UsageError("'-' (stdin/stdout) cannot be split across processes; "
                             "give files or folders")

    def take(self, jobs: list, others: list) -> tuple[list, list]:
        """This part's jobs (in batch order) and, on part 0 only, the non-audio files.

        `jobs` have `.name` (the input as named, the tie-break) and `.source`/`.destination`.
        Jobs writing the same output stay on one part, so the collision is still reported.
        """
        self.jobs_total, self.others_total = len(jobs), len(others)
        if self.alone:
            self.indices = list(range(len(jobs)))
            return jobs, others
        seconds = [file_seconds(job.source) for job in jobs]
        units: dict[str, list[int]] = {}
        for index, job in enumerate(jobs):
            units.setdefault(str(job.destination.resolve()), []).append(index)
        members = list(units.values())
        owner_of_unit = assign([sum(seconds[i] for i in unit) for unit in members],
                               [jobs[unit[0]].name for unit in members], self.size)
        self.owner = [0] * len(jobs)
        for unit, part in zip(members, owner_of_unit, strict=True):
            for index in unit:
                self.owner[index] = part
        if self.in_group:
            self._check_same_input(jobs, seconds)
        self.indices = [i for i, part in enumerate(self.owner) if part == self.rank]
        self.seconds_total = sum(seconds)
        self.seconds = sum(seconds[i] for i in self.indices)
        what = f"rank {self.rank} of {self.size}" if self.in_group \
            else f"shard {self.rank}/{self.size}"
        self.note = (f"{what}: {len(self.indices)} of {len(jobs)} files, "
                     f"{self.seconds:.2f} of {self.seconds_total:.2f} s of audio")
        return [jobs[i] for i in self.indices], (others if self.rank == 0 else [])

    def _check_same_input(self, jobs: list, seconds: list[float]) -> None:
        """Every rank must plan the same batch, or files would be lost or done twice."""
        listing = json.dumps([[job.name, str(job.destination), s]
                              for job, s in zip(jobs, seconds, strict=True)]).encode()
        mine = {"digest": hashlib.sha256(listing).hexdigest(), "files": len(jobs),
                "seconds": round(sum(seconds), 3)}
        views = [json.loads(blob) for blob in self.all_gather_bytes(json.dumps(mine).encode(),
                                                                    "comparing the input")]
        if any(view["digest"] != views[0]["digest"] for view in views):
            seen = "; ".join(f"rank {rank}: {view['files']} files, {view['seconds']:g} s"
                             for rank, view in enumerate(views))
            self._leave(1, f"the ranks see different inputs ({seen}): every rank needs the same "
                           "input files at the same paths (a shared folder or identical copies)")

    # ---------------------------------------------------------------- talking to the group

    @property
    def _stream(self):
        return mx.gpu if self.backend in _GPU_BACKENDS else mx.cpu

    def _all_gather(self, array: mx.array, doing: str) -> np.ndarray:
        try:
            gathered = mx.distributed.all_gather(array, group=self.group, stream=self._stream)
            mx.eval(gathered)
        except RuntimeError as error:
            raise SpeechlensError(
                f"rank {self.rank} of {self.size}: lost the other ranks while {doing} ({error}); "
                "every output already written is complete: run the same command again with "
                "--skip-existing to finish the rest") from None
        return np.array(gathered)

    def all_gather_bytes(self, data: bytes, doing: str = "gathering the results") -> list[bytes]:
        """Every rank's `data`, in rank order: lengths first, then the bytes padded to the
        longest, gathered as uint8 (all_gather needs one shape on every rank)."""
        lengths = self._all_gather(mx.array([len(data)], dtype=mx.int32), doing).tolist()
        width = max(max(lengths), 1)
        padded = np.zeros(width, np.uint8)
        padded[:len(data)] = np.frombuffer(data, np.uint8)
        blob = self._all_gather(mx.array(padded), doing)
        return [blob[rank * width:rank * width + length].tobytes()
                for rank, length in enumerate(lengths)]

    def _barrier(self) -> None:
        try:
            mx.eval(mx.distributed.all_sum(mx.array(1), group=self.group, stream=self._stream))
        except RuntimeError:
            pass  # a rank already left; everything has been reported

    # ---------------------------------------------------------------- running in a group

    def run_in_group(self, run: Callable[[Any], list[SpeechlensError]],
                     make_reporter: Callable[[bool, int], Any], *, batch: bool) -> NoReturn:
        """Run this rank's jobs quietly, gather every rank's results, let rank 0 report them as
        one batch, meet at a barrier, and exit with the combined code on every rank.

        `run(reporter)` records one result per job in order (then the non-audio files) and
        returns the per-file errors; it raises for a failure that stops the rank (no model).
        `make_reporter(live, total)` builds the CLI's reporter (quiet when not `live`).
        """
        started = time.perf_counter()
        local = make_reporter(False, len(self.indices))
        local.plan_line = lambda _result: None  # --dry-run: rank 0 prints the whole plan
        fatal = None
        try:
            errors = run(local)
        except SpeechlensError as error:
            errors, fatal = [], [error.exit_code, str(error)]
        mine = {
            "results": local.results, "indices": self.indices, "fatal": fatal,
            "errors": [[error.exit_code, str(error)] for error in errors],
            "seconds": self.seconds, "elapsed": round(time.perf_counter() - started, 3),
        }
        parts = [json.loads(blob) for blob in self.all_gather_bytes(json.dumps(mine).encode())]
        code, message = self._outcome(parts, batch)
        if self.rank == 0:
            self._report(parts, make_reporter(True, self.jobs_total + self.others_total))
        self._leave(code, message)

    def _leave(self, code: int, message: str | None) -> NoReturn:
        """Every rank, together: rank 0 prints the error line, all meet at a barrier, and each
        exits at once with `code` (a decision every rank made from the same gathered data)."""
        if self.rank == 0 and message:
            click.echo(f"error: {message}", err=True)
        sys.stdout.flush()
        sys.stderr.flush()
        # Everything is reported: from here a SIGTERM (mlx.launch stops the other ranks once one
        # exits non-zero) only makes this rank leave with the same code.
        signal.signal(signal.SIGTERM, lambda _signum, _frame: os._exit(code))
        self._barrier()
        # Leave at once rather than tear the interpreter down while the launcher watches.
        os._exit(code)

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
                ordered.append((index, {**result, "rank": rank}))
        for _, result in sorted(ordered, key=lambda pair: pair[0]):
            reporter.record(result)
            reporter.plan_line(result)
        reporter.summary()
        reporter.note(f"{self.size} ranks ({self.backend} backend): " + "; ".join(
            f"rank {rank} {len(part['indices'])} files, {part['seconds']:.2f} s of audio in "
            f"{part['elapsed']:.2f} s" for rank, part in enumerate(parts)))


def join(shard: tuple[int, int] | None, env: Mapping[str, str] | None = None) -> Share:
    """This process's Share: --shard's part, a launcher's group, or the whole batch."""
    backend = launched_backend(env)
    if shard is not None:
        if backend in ("ring", "nccl", "jaccl"):
            raise UsageError("--shard splits the batch itself: do not also start it with "
                             "mlx.launch (use one or the other)")
        return Share(*shard)
    if backend is None:
        return Share()
    if not mx.distributed.is_available(backend):
        raise SpeechlensError(
            f"started by a launcher for MLX's {backend} backend, which this MLX build does not "
            "have; use mlx.launch --backend ring, or --shard I/N")
    try:
        group = mx.distributed.init(strict=True, backend=backend)
    except RuntimeError as error:
        raise SpeechlensError(f"could not join the {backend} group the launcher started "
                              f"({error})") from None
    if group.size() == 1:
        return Share()
    return Share(group.rank(), group.size(), group, backend)
