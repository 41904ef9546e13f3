"""One file's outcome in a run: its status and what the report and ``--json`` say about it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
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
class FileResult:
    """`fields` are what the status adds, in the order they are reported: ``error`` (failed),
    ``reason`` (skipped, not audio), the audio facts (done, planned), ``rank`` (a group run)."""

    input: str
    output: str | None
    status: Status
    fields: Mapping[str, Any] = field(default_factory=dict)

    def get(self, key: str, default: Any = None) -> Any:
        return self.fields.get(key, default)

    def __getitem__(self, key: str) -> Any:
        return self.fields[key]

    def as_dict(self) -> dict[str, Any]:
        """The JSON form: input, output and status first, then the fields."""
        return {"input": self.input, "output": self.output, "status": self.status.value,
                **self.fields}

    @classmethod
    def from_dict(cls, record: Mapping[str, Any]) -> FileResult:
        rest = {k: v for k, v in record.items() if k not in ("input", "output", "status")}
        return cls(record["input"], record["output"], Status(record["status"]), rest)
