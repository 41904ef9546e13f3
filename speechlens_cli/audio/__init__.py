"""Audio files with soundfile: reading (``read``), output formats (``formats``), writing
(``sink``), atomic outputs (``outputs``), stdin/stdout (``streams``), folder trees (``tree``) and
the libsndfile details they share (``libsndfile``)."""

from __future__ import annotations

from .formats import OutputFormat, check_subtype_name, format_for_suffix, output_format
from .outputs import atomic_output, check_writable, nearest_existing, same_file
from .read import (
    MAX_CHANNELS,
    AudioInfo,
    check_channels,
    check_finite,
    open_reader,
    read_block,
    read_info,
)
from .sink import Sink
from .streams import copy_to_stream, detach_stdout, spooled_stdin, stdout_folder, write_line
from .tree import Skipped, TreeScan, scan_tree

__all__ = [
    "MAX_CHANNELS", "AudioInfo", "OutputFormat", "Sink", "Skipped", "TreeScan",
    "atomic_output", "check_channels", "check_finite", "check_subtype_name", "check_writable",
    "copy_to_stream", "detach_stdout", "format_for_suffix", "nearest_existing", "open_reader",
    "output_format", "read_block", "read_info", "same_file", "scan_tree", "spooled_stdin",
    "stdout_folder", "write_line",
]
