"""Audio files: what an input holds (``info``), reading (``read``; media containers through PyAV
in ``media``; standard input in ``stdin``), output formats (``formats``, the media
``containers``), writing every output whole or not at all (the ``write`` package: where an
output may go, atomic publication, the writers, standard output), folder trees (``tree``) and
the library details they share (``libsndfile``, ``pyav``)."""

from __future__ import annotations

from .formats import (
    OutputFormat,
    check_piped,
    check_subtype_name,
    container_subtypes,
    format_for_suffix,
    output_format,
    parse_bit_rate,
    unwritable,
    writable_subtypes,
    writable_suffixes,
)
from .info import MAX_CHANNELS, AudioInfo, MediaTrack, check_channels, check_finite
from .read import open_reader, read_block, read_info
from .stdin import spooled_stdin
from .tree import Skipped, TreeScan, scan_tree
from .write import (
    SEPARATORS,
    Sink,
    atomic_output,
    check_copies_fit,
    check_name_part,
    check_no_links,
    check_writable,
    copy_to_stream,
    detach_stdout,
    identities,
    make_folders,
    name_problem,
    nearest_existing,
    open_sink,
    same_file,
    stdout_folder,
    write_line,
)

__all__ = [
    "MAX_CHANNELS", "SEPARATORS", "AudioInfo", "MediaTrack", "OutputFormat", "Sink", "Skipped",
    "TreeScan",
    "atomic_output", "check_channels", "check_copies_fit", "check_finite", "check_name_part",
    "check_no_links", "check_piped", "check_subtype_name", "check_writable", "container_subtypes",
    "copy_to_stream", "detach_stdout", "format_for_suffix", "identities", "make_folders",
    "name_problem", "nearest_existing", "open_reader", "open_sink", "output_format",
    "parse_bit_rate", "read_block",
    "read_info", "same_file", "scan_tree", "spooled_stdin", "stdout_folder", "unwritable",
    "writable_subtypes", "writable_suffixes", "write_line",
]
