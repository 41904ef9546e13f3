"""Writing the pages: each gathered, rendered and written under a temporary name, then renamed
into place, so an interrupted or failed run leaves no half-written page."""

from __future__ import annotations

import os
from pathlib import Path

from .. import audio as audio_io
from ..errors import OutputError
from .excerpt import mp3_uri, read_excerpt
from .page import FileView, SummaryEntry, file_page, summary_page
from .pictures import change_histograms, spectrograms
from .scores import ScoreChange


def write_file_page(path: Path, source: str | os.PathLike, destination: str | os.PathLike,
                    names: tuple[str, str], change: ScoreChange) -> None:
    """The page of one enhanced file (`names`: the input's and the output's, as shown)."""
    excerpt = read_excerpt(source, destination, *names)
    sounds = {"input": mp3_uri(excerpt.input, excerpt.rate),
              "output": mp3_uri(excerpt.output, excerpt.rate),
              "removed (input - output)": mp3_uri(excerpt.removed, excerpt.rate)}
    view = FileView(*names, change, excerpt, sounds, spectrograms(excerpt))
    _write(path, file_page(view))


def write_summary(path: Path, entries: list[SummaryEntry], unscored: int) -> None:
    """A batch's summary page (index.html beside the files' pages)."""
    histograms = change_histograms([entry.change for entry in entries]) if entries else None
    _write(path, summary_page(entries, histograms, unscored))


def _write(path: Path, html: str) -> None:
    with audio_io.atomic_output(path, overwrite=True) as temporary:
        try:
            temporary.write_text(html, encoding="utf-8")
        except OSError as error:   # a full disk, a quota
            raise OutputError(f"{path}: could not be written ({error.strerror or error})") \
                from None
