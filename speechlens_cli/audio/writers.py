"""Which writer an output gets: soundfile for libsndfile's containers, PyAV for media (imported
only for those: PyAV's import costs a WAV or FLAC run 50-200 ms)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from .formats import OutputFormat
from .info import AudioInfo
from .sink import Sink

if TYPE_CHECKING:
    from .remux import MediaSink


def check_copies_fit(info: AudioInfo, output: OutputFormat, shown: str) -> None:
    """At planning, before any model runs: the streams a media output copies from a media
    input (video, subtitles) fit its container."""
    if output.is_media and info.media is not None:
        from .remux import check_copies_fit as check_media_copies
        check_media_copies(info, output, shown)


def open_sink(path: str | Path, info: AudioInfo, output: OutputFormat,
              shown: str) -> Sink | MediaSink:
    if output.is_media:
        from .remux import MediaSink
        return MediaSink(path, info, output, shown)
    return Sink(path, info.sample_rate, info.channels, output, shown)
