"""A file's DNSMOS before and after enhancing it, and the change: the one form `enhance --score`
and `--report` give it in, in the JSON lines, on the pages and in a batch's summary."""

from __future__ import annotations

import os
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields

from .. import scoring
from ..scoring import DnsmosScores

#: The scores in the order every table and JSON object lists them.
KEYS = tuple(field.name for field in fields(DnsmosScores))


@dataclass(frozen=True)
class ScoreChange:
    input: DnsmosScores
    output: DnsmosScores
    #: What was done to the input to score it at 16 kHz mono, in words; None: nothing.
    converted: str | None = None

    @property
    def change(self) -> DnsmosScores:
        """Output minus input, score by score: above 0 is better."""
        return DnsmosScores(**{key: getattr(self.output, key) - getattr(self.input, key)
                               for key in KEYS})

    def as_dict(self) -> dict:
        return {"input": self.input.as_dict(), "output": self.output.as_dict(),
                "change": self.change.as_dict(), "converted": self.converted}

    @classmethod
    def from_dict(cls, record: Mapping) -> ScoreChange:
        return cls(DnsmosScores(**record["input"]), DnsmosScores(**record["output"]),
                   record.get("converted"))


def score_change(source: str | os.PathLike, destination: str | os.PathLike, name: str,
                 output_name: str) -> ScoreChange:
    """DNSMOS of the whole input and of the whole output (`name`, `output_name`: as shown),
    side by side: each runs its models on one thread, which leaves the GIL while they run."""
    with ThreadPoolExecutor(2, thread_name_prefix="speechlens-score") as pool:
        after = pool.submit(scoring.score_file, destination, output_name)
        before = scoring.score_file(source, name)
        return ScoreChange(before.dnsmos, after.result().dnsmos, before.conversion)
