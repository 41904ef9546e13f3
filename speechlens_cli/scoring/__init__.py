"""Scores of enhanced speech: DNSMOS (no reference needed, ``dnsmos``) and, against a clean
recording, PESQ, STOI and SI-SDR (``reference_metrics``), every file read as 16 kHz mono
(``speech``). Their packages are the `report` extra (``extra``), imported on first use."""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..audio import AudioInfo
from . import dnsmos, extra, reference_metrics
from .dnsmos import DnsmosScores
from .reference_metrics import ReferenceScores
from .speech import RATE, Speech, load


@dataclass(frozen=True)
class FileScores:
    name: str
    info: AudioInfo
    #: What was done to the file to score it at 16 kHz mono, in words; None: nothing.
    conversion: str | None
    dnsmos: DnsmosScores
    reference: ReferenceScores | None = None

    def as_dict(self) -> dict:
        found = {"file": self.name, "dnsmos": self.dnsmos.as_dict()}
        if self.reference is not None:
            found["reference"] = self.reference.as_dict()
        found["input"] = {"sample_rate": self.info.sample_rate, "channels": self.info.channels,
                          "seconds": round(self.info.seconds, 6)}
        found["converted"] = self.conversion
        return found


def score_file(path: str | os.PathLike, name: str, reference: Speech | None = None) -> FileScores:
    """Every score of one file (the reference's too when one is given)."""
    speech = load(path, name)
    compared = reference_metrics.compare(reference, speech) if reference is not None else None
    return FileScores(name, speech.info, speech.conversion, dnsmos.score(speech.samples), compared)


__all__ = ["RATE", "DnsmosScores", "FileScores", "ReferenceScores", "Speech", "extra", "load",
           "score_file"]
