"""Writing an output, whole or not at all: the one home of every step, each in a file of its own.

- ``places``: where an output may go, checked at planning (a name the system takes, a writable
  folder, never through a link below the output folder, never an input of the run) and the
  folders made one level at a time;
- ``atomic``: atomic_output, a temporary beside the destination, published (on the disk, then
  named; --overwrite or never replacing) only on success and removed on any failure;
- ``owners``: the temporaries' names, which say which process left them, and the sweep of those
  a killed run left;
- the writers, chosen here (open_sink): ``sink`` (libsndfile's containers) and ``remux`` (media
  through PyAV, imported only for those: its import costs a WAV or FLAC run 50-200 ms), sharing
  ``blocks``; each writes blocks in order, then close() and verify() (the read-back check), or
  abandon();
- ``stdout``: an output for standard output, made in a private folder and copied out.

A caller opens atomic_output(destination), open_sink() on the temporary path it yields, writes,
closes and verifies, and leaves the with block to publish (or raises, to abandon).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..formats import OutputFormat
from ..info import AudioInfo
from .atomic import atomic_output
from .places import (
    SEPARATORS,
    check_name_part,
    check_no_links,
    check_writable,
    identities,
    make_folders,
    name_problem,
    nearest_existing,
    same_file,
)
from .sink import Sink
from .stdout import copy_to_stream, detach_stdout, stdout_folder, write_line

if TYPE_CHECKING:
    from .remux import MediaSink

__all__ = [
    "SEPARATORS", "Sink", "atomic_output", "check_copies_fit", "check_name_part",
    "check_no_links", "check_writable", "copy_to_stream", "detach_stdout", "identities",
    "make_folders", "name_problem", "nearest_existing", "open_sink", "same_file",
    "stdout_folder", "write_line",
]


def check_copies_fit(info: AudioInfo, output: OutputFormat, shown: str) -> None:
    """At planning, before any model runs: the streams a media output copies from a media
    input (video, subtitles) fit its container."""
    if output.is_media and info.media is not None:
        from .remux import check_copies_fit as check_media_copies
        check_media_copies(info, output, shown)


def open_sink(path: str | Path, info: AudioInfo, output: OutputFormat,
              shown: str) -> Sink | MediaSink:
    """The writer of `output`'s container at `path` (a temporary of atomic_output): blocks of
    `info`'s rate and channels, every failure an OutputError naming `shown`."""
    if output.is_media:
        from .remux import MediaSink
        return MediaSink(path, info, output, shown)
    return Sink(path, info.sample_rate, info.channels, output, shown)
