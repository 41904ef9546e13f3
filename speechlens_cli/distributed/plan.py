"""The plan: which part of a batch enhances which file, computed the same on every process
without communicating."""

from __future__ import annotations

import hashlib
import heapq
import json
import re
from collections.abc import Sequence
from pathlib import Path

from .. import audio as audio_io
from ..errors import SpeechlensError

_SHARD = re.compile(r"\s*(\d+)\s*/\s*(\d+)\s*")
#: A part count of up to 12 digits is plenty; more would only be a typo.
_MAX_SHARD_DIGITS = 12


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
    # Beyond one part per item the extra parts stay empty (each item takes the lowest empty
    # part first), so a huge `parts` needs no more than len(keys) of them.
    loads = [(0.0, part) for part in range(min(parts, len(keys)))]  # a heap: (load, part)
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
    if max(len(match[1]), len(match[2])) > _MAX_SHARD_DIGITS:
        raise ValueError(f"N must be at most {10 ** _MAX_SHARD_DIGITS - 1}, got {text!r}")
    index, count = int(match[1]), int(match[2])
    if count < 1:
        raise ValueError(f"N must be at least 1, got {text!r}")
    if index >= count:
        raise ValueError(f"part {index} does not exist in {count} parts (0 to {count - 1})")
    return index, count


def owners(jobs: list, seconds: list[float], parts: int) -> list[int]:
    """The part of every job. `jobs` have `.name` (the input as named, the tie-break) and
    `.destination`; jobs writing the same output stay on one part, so the collision is still
    reported."""
    units: dict[str, list[int]] = {}
    for index, job in enumerate(jobs):
        units.setdefault(str(job.destination.resolve()), []).append(index)
    members = list(units.values())
    owner_of_unit = assign([sum(seconds[i] for i in unit) for unit in members],
                           [jobs[unit[0]].name for unit in members], parts)
    owner = [0] * len(jobs)
    for unit, part in zip(members, owner_of_unit, strict=True):
        for index in unit:
            owner[index] = part
    return owner


def input_view(jobs: list, seconds: list[float]) -> dict:
    """What one process sees of the batch, for comparing with the others: a digest of every
    input, output and duration, and totals to name in a message."""
    listing = json.dumps([[job.name, str(job.destination), s]
                          for job, s in zip(jobs, seconds, strict=True)]).encode()
    return {"digest": hashlib.sha256(listing).hexdigest(), "files": len(jobs),
            "seconds": round(sum(seconds), 3)}
