"""Before and after: each enhanced file's scores (``scores``) and its self-contained HTML page,
with players and spectrograms of a bounded excerpt (``excerpt``, ``pictures``, ``page``), and a
batch's summary page (``pages`` writes them). Its packages are the `report` extra
(scoring.extra)."""

from __future__ import annotations

from .excerpt import EXCERPT_SECONDS
from .page import SummaryEntry
from .pages import write_file_page, write_summary
from .scores import KEYS, ScoreChange, score_change

__all__ = ["EXCERPT_SECONDS", "KEYS", "ScoreChange", "SummaryEntry", "score_change",
           "write_file_page", "write_summary"]
