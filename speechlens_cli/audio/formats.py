"""Which container and encoding an output gets, and which file names mean audio."""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf

from ..errors import OutputError, UsageError
from . import libsndfile
from .libsndfile import native_stderr_silenced
from .read import AudioInfo

_INTEGER_SUBTYPES = ("ALAC_16", "ALAC_20", "ALAC_24", "ALAC_32")
#: Containers never written, and why: their probe alone would leave a file behind.
_NEVER_WRITTEN = {
    "SD2": "it keeps its header in a second file, ._NAME, outside a Mac, which a copy loses",
}
#: Containers without a header: read back with the rate, channels and encoding given.
_HEADERLESS = ("RAW",)
#: Suffixes that name a soundfile container besides the format names themselves (".wav", ...).
_SUFFIX_ALIASES = {".aif": "AIFF", ".oga": "OGG", ".snd": "AU"}


@dataclass(frozen=True)
class OutputFormat:
    format: str
    subtype: str

    @property
    def is_integer(self) -> bool:
        """Integer encodings cannot hold peaks beyond full scale: they are clamped and counted."""
        return self.subtype.startswith("PCM") or self.subtype in _INTEGER_SUBTYPES


def format_for_suffix(suffix: str) -> str | None:
    """The soundfile container a file suffix names, if any (".flac" -> "FLAC")."""
    suffix = suffix.lower()
    if suffix in _SUFFIX_ALIASES:
        return _SUFFIX_ALIASES[suffix]
    name = suffix.lstrip(".").upper()
    return name if name and name in sf.available_formats() else None


def output_format(info: AudioInfo, destination: str | os.PathLike | None,
                  subtype: str | None = None, *, container: str | None = None) -> OutputFormat:
    """Keep the input's container and subtype unless the caller asks otherwise.

    A destination whose suffix differs from the input's and names another container (in.wav ->
    out.flac) asks for that container; `container` forces one (stdout is always WAV). A subtype
    the new container cannot hold falls back to that container's default.
    """
    fmt = container or info.format
    if container is None and destination is not None:
        wanted = format_for_suffix(Path(destination).suffix)
        if wanted is not None and wanted != info.format:
            fmt = wanted
    if fmt in _NEVER_WRITTEN:
        raise UsageError(f"{destination or 'output'}: {fmt} is not written ("
                         f"{_NEVER_WRITTEN[fmt]}); write one of {', '.join(writable_suffixes())}")
    if subtype is not None:
        subtype = subtype.upper()
        if not sf.check_format(fmt, subtype) or not _can_write(fmt, subtype, info):
            raise UsageError(f"subtype {subtype} cannot be written in a {fmt} file"
                             + _shape_note(fmt, subtype, info))
        return OutputFormat(fmt, subtype)
    # libsndfile reads some encodings it cannot write (an MP3 stream in a WAV file), and some
    # containers limit rates and channels: try the encoding on an empty in-memory file first.
    if sf.check_format(fmt, info.subtype) and _can_write(fmt, info.subtype, info):
        return OutputFormat(fmt, info.subtype)
    fallback = sf.default_subtype(fmt)
    if fallback is None or not _can_write(fmt, fallback, info):
        raise OutputError(f"{destination or 'output'}: a {fmt} file cannot hold "
                          f"{info.channels} channel(s) at {info.sample_rate} Hz; choose another "
                          "container (e.g. .wav)")
    return OutputFormat(fmt, fallback)


def _can_write(fmt: str, subtype: str, info: AudioInfo) -> bool:
    """One frame written to memory and read back with its rate and channel count: some
    containers take any rate and keep another (XI: 44.1 kHz; WVE: 8 kHz; HTK rounds 48 kHz)."""
    memory = io.BytesIO()
    try:
        with native_stderr_silenced():
            with sf.SoundFile(memory, "w", info.sample_rate, info.channels, subtype,
                              format=fmt) as probe:
                probe.write(np.zeros((1, info.channels), np.float32))
            memory.seek(0)
            output = OutputFormat(fmt, subtype)
            with sf.SoundFile(memory, **read_back_params(output, info.sample_rate,
                                                         info.channels)) as back:
                return (back.samplerate, back.channels) == (info.sample_rate, info.channels)
    except (*libsndfile.ERRORS, ValueError, TypeError, RuntimeError):
        return False


def read_back_params(output: OutputFormat, sample_rate: int, channels: int) -> dict:
    """What soundfile needs to open a written file: nothing for a container with a header,
    everything for RAW."""
    if output.format not in _HEADERLESS:
        return {}
    return {"samplerate": sample_rate, "channels": channels, "subtype": output.subtype,
            "format": output.format}


def writable_suffixes() -> list[str]:
    """The output suffixes speechlens writes (each still subject to the input's rate and
    channels)."""
    return sorted(suffix for suffix in audio_suffixes()
                  if format_for_suffix(suffix) not in _NEVER_WRITTEN)


def _shape_note(fmt: str, subtype: str, info: AudioInfo) -> str:
    if sf.check_format(fmt, subtype):  # a valid pair refused for this rate or channel count
        return f" at {info.sample_rate} Hz with {info.channels} channel(s)"
    return ""


def check_subtype_name(subtype: str) -> None:
    if subtype.upper() not in sf.available_subtypes():
        raise UsageError(f"unknown subtype {subtype!r} (for example PCM_16, PCM_24, FLOAT)")


def audio_suffixes() -> set[str]:
    """File suffixes that claim audio: every container soundfile knows, and the aliases."""
    return {"." + name.lower() for name in sf.available_formats()} | set(_SUFFIX_ALIASES)
