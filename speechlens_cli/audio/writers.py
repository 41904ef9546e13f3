"""Which writer an output gets: soundfile for libsndfile's containers, PyAV for media."""

from __future__ import annotations

from pathlib import Path

from .formats import OutputFormat
from .info import AudioInfo
from .remux import MediaSink
from .sink import Sink


def open_sink(path: str | Path, info: AudioInfo, output: OutputFormat,
              shown: str) -> Sink | MediaSink:
    if output.is_media:
        return MediaSink(path, info, output, shown)
    return Sink(path, info.sample_rate, info.channels, output, shown)
