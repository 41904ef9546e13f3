"""One file's outcome in a run: its status and what the report and ``--json`` say about it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import KW_ONLY, asdict, dataclass, fields
from enum import Enum
from typing import Any


class Status(str, Enum):
    """What happened to a file (the ``status`` of its JSON line)."""

    DONE = "done"
    FAILED = "failed"
    SKIPPED = "skipped"
    NOT_AUDIO = "not-audio"
    PLANNED = "planned"


@dataclass(frozen=True)
class AudioFacts:
    """What a report shows about a file before and after enhancing it: its input's rate,
    channels, length, and its output's container and encoding."""

    sample_rate: int
    channels: int
    frames: int
    seconds: float
    format: str
    subtype: str | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


_FACTS = tuple(item.name for item in fields(AudioFacts))


@dataclass(frozen=True)
class FileResult:
    """A file's result. What its status adds is set, the rest None; the JSON line lists them in
    the order they are declared here (the audio facts as their own keys), leaving out the None
    ones: a new one goes where its key should stand in the line."""

    input: str
    output: str | None
    status: Status
    _: KW_ONLY
    error: str | None = None          # failed: why, in one line
    reason: str | None = None         # skipped, not audio: why it was left alone
    audio: AudioFacts | None = None   # done (frames: as written), planned
    windows: int | None = None        # done: windows through the model
    clamped: int | None = None        # done: samples an integer format had to clamp
    elapsed_seconds: float | None = None  # done: first window to output published
    residual: str | None = None       # done with --residual: where what was removed went
    #: --score, --report: report.ScoreChange.as_dict() (results sits below report)
    scores: Mapping[str, Any] | None = None
    report: str | None = None         # --report: the file's page
    rank: int | None = None           # a group's run: the rank that ran it

    def as_dict(self) -> dict[str, Any]:
        """The JSON form: input, output and status first, then what is set."""
        record: dict[str, Any] = {"input": self.input, "output": self.output,
                                  "status": self.status.value}
        for item in fields(self)[3:]:
            value = getattr(self, item.name)
            if isinstance(value, AudioFacts):
                record.update(value.as_dict())
            elif value is not None:
                record[item.name] = value
        return record

    @classmethod
    def from_dict(cls, record: Mapping[str, Any]) -> FileResult:
        """The result whose as_dict() is `record` (a JSON line read back)."""
        rest = {key: value for key, value in record.items()
                if key not in ("input", "output", "status") and key not in _FACTS}
        audio = AudioFacts(**{key: record[key] for key in _FACTS}) \
            if "sample_rate" in record else None
        return cls(record["input"], record["output"], Status(record["status"]), audio=audio,
                   **rest)
