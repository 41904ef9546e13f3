"""Before and after: each enhanced file's scores (``scores``) and its self-contained HTML page,
with players and spectrograms of a bounded excerpt (``excerpt``, ``spectrogram``, ``page``), and
a batch's summary page. Its packages are the `report` extra (scoring.extra)."""

from __future__ import annotations

from .scores import KEYS, ScoreChange, score_change

__all__ = ["KEYS", "ScoreChange", "score_change"]
