"""Which container and encoding an output gets, and which file names mean audio."""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from pathlib import Path

import soundfile as sf

from ..errors import OutputError, UsageError
from . import libsndfile
from .libsndfile import native_stderr_silenced
from .read import AudioInfo

_INTEGER_SUBTYPES = ("ALAC_16", "ALAC_20", "ALAC_24", "ALAC_32")
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
    try:
        with native_stderr_silenced(), sf.SoundFile(io.BytesIO(), "w", info.sample_rate,
                                                    info.channels, subtype, format=fmt):
            pass
    except (*libsndfile.ERRORS, ValueError, TypeError):
        return False
    return True


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
