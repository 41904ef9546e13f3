"""Which container and encoding an output gets, and which file names mean audio.

The output's suffix decides its container; a suffix nothing writes is refused. The encoding is the
input's where the container can hold it; otherwise the nearest lossless one the container has
(a lossy one only where it has none), announced in the plan's note."""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf

from ..errors import OutputError, UsageError
from . import libsndfile
from .containers import CODECS, CONTAINERS, LOSSY_BIT_RATE_PER_CHANNEL, container_for_suffix
from .info import AudioInfo
from .libsndfile import native_stderr_silenced

_INTEGER_SUBTYPES = ("ALAC_16", "ALAC_20", "ALAC_24", "ALAC_32")
#: Containers never written, and why: their probe alone would leave a file behind.
_NEVER_WRITTEN = {
    "SD2": "it keeps its header in a second file, ._NAME, outside a Mac, which a copy loses",
}
#: Containers without a header: read back with the rate, channels and encoding given.
_HEADERLESS = ("RAW",)
#: Suffixes that name a soundfile container besides the format names themselves (".wav", ...).
_SUFFIX_ALIASES = {".aif": "AIFF", ".oga": "OGG", ".snd": "AU"}
#: libsndfile's encodings from the widest down: a kept encoding a container cannot hold becomes
#: the first one below it that it can (FLOAT -> FLAC is PCM_24).
_LADDER = ("DOUBLE", "FLOAT", "PCM_32", "PCM_24", "PCM_16", "PCM_S8", "PCM_U8")
#: Encodings that are not on the ladder, by the ladder's step that holds them without loss;
#: lossy ones decode to floating point.
_ON_LADDER = {"ALAC_16": "PCM_16", "ALAC_20": "PCM_24", "ALAC_24": "PCM_24",
              "ALAC_32": "PCM_32", "ALAC": "PCM_24", "FLAC": "PCM_24"}


@dataclass(frozen=True)
class OutputFormat:
    """`subtype` is libsndfile's encoding (PCM_24), or the codec (AAC) in a media container;
    `bit_rate` is a lossy codec's; `note` says in one line what was not kept as asked."""

    format: str
    subtype: str
    bit_rate: int | None = None
    note: str | None = None

    @property
    def is_integer(self) -> bool:
        """Integer encodings cannot hold peaks beyond full scale: they are clamped and counted."""
        return self.subtype.startswith("PCM") or self.subtype in _INTEGER_SUBTYPES

    @property
    def is_media(self) -> bool:
        """Written through PyAV (MediaSink), not soundfile."""
        return self.format in CONTAINERS


def _libsndfile_formats() -> dict[str, str]:
    """Suffix -> libsndfile container, leaving out those PyAV writes (MP3 with its tags)."""
    named = {"." + name.lower(): name for name in sf.available_formats()
             if container_for_suffix("." + name.lower()) is None}
    return {**named, **_SUFFIX_ALIASES}


def format_for_suffix(suffix: str) -> str | None:
    """The container a file suffix names, if speechlens writes one (".flac" -> "FLAC",
    ".m4a" -> "M4A")."""
    media = container_for_suffix(suffix)
    return media.name if media else _libsndfile_formats().get(suffix.lower())


def writable_suffixes() -> list[str]:
    """Every output suffix speechlens accepts, in the order `speechlens formats` lists them
    (each still subject to the input's rate and channels)."""
    named = [s for s in sorted(_libsndfile_formats())
             if _libsndfile_formats()[s] not in _NEVER_WRITTEN]
    return named + [s for c in CONTAINERS.values() for s in c.suffixes]


def output_format(info: AudioInfo, destination: str | os.PathLike | None,
                  subtype: str | None = None, *, container: str | None = None,
                  source: str | os.PathLike | None = None) -> OutputFormat:
    """The container the destination's suffix names (`container` forces one: stdout is WAV),
    the input's encoding in it or the nearest one it can hold.

    A suffix that names nothing writable is refused, unless it is the input's own (a file
    libsndfile reads by its content, mirrored into a batch's output tree under its name).
    """
    fmt = container or _named_container(info, destination, source)  # `container`: stdout
    if fmt in _NEVER_WRITTEN:
        raise UsageError(f"{destination or 'output'}: {fmt} is not written ("
                         f"{_NEVER_WRITTEN[fmt]}); write one of {', '.join(writable_suffixes())}")
    if subtype is not None:
        subtype = subtype.upper()
        if not _can_write(fmt, subtype, info):
            raise UsageError(f"subtype {subtype} cannot be written in a {fmt} file"
                             + _shape_note(fmt, subtype, info) + f"; {_valid_list(fmt, info)}")
        return OutputFormat(fmt, subtype, _bit_rate(subtype, info))
    kept = _can_write(fmt, info.subtype, info)
    chosen = info.subtype if kept else _nearest(fmt, info)
    if chosen is None:
        raise OutputError(f"{destination or 'output'}: a {fmt} file cannot hold "
                          f"{info.channels} channel(s) at {info.sample_rate} Hz; choose another "
                          "container (e.g. .wav)")
    notes = []
    if container and container != info.format:
        notes.append(f"{info.format} input written as {fmt}/{chosen} "
                     f"(standard output carries {fmt})")
    if not kept:
        notes.append(f"{info.subtype} cannot be written in a {fmt} file: {chosen} instead")
    return OutputFormat(fmt, chosen, _bit_rate(chosen, info), "; ".join(notes) or None)


def _named_container(info: AudioInfo, destination, source) -> str:
    if destination is None:
        return info.format
    suffix = Path(destination).suffix
    named = format_for_suffix(suffix)
    if named is not None:
        return named
    if source is not None and suffix and suffix.lower() == Path(source).suffix.lower():
        return info.format
    raise unwritable(f"{destination}: "
                     + (f"'{suffix}'" if suffix else "a name without a suffix"))


def _nearest(fmt: str, info: AudioInfo) -> str | None:
    """The kept encoding's nearest lossless stand-in the container holds: down the ladder from
    it, or a lossless codec; failing that, the container's first lossy codec."""
    if fmt in CONTAINERS:
        candidates = CONTAINERS[fmt].codecs
        lossless = [c for c in candidates if CODECS[c].lossless]
        candidates = lossless + [c for c in candidates if c not in lossless]
    else:
        step = _ON_LADDER.get(info.subtype, info.subtype)
        start = _LADDER.index(step) if step in _LADDER else _LADDER.index("FLOAT")
        candidates = _LADDER[start:] + tuple(sf.available_subtypes(fmt))
    return next((c for c in candidates if _can_write(fmt, c, info)), None)


def _bit_rate(subtype: str, info: AudioInfo) -> int | None:
    """A lossy codec keeps the input's rate when the input had the same codec."""
    codec = CODECS.get(subtype)
    if codec is None or codec.lossless:
        return None
    if info.media is not None and info.subtype == subtype and info.media.bit_rate:
        return info.media.bit_rate
    return LOSSY_BIT_RATE_PER_CHANNEL * info.channels


def container_subtypes(fmt: str) -> list[str]:
    """The encodings a container holds, at some rate and channel count."""
    if fmt in CONTAINERS:
        from .pyav import encoders
        return [c for c in CONTAINERS[fmt].codecs if CODECS[c].encoder in encoders()]
    return [s for s in sf.available_subtypes(fmt) if sf.check_format(fmt, s)]


def writable_subtypes(fmt: str, info: AudioInfo) -> list[str]:
    """The encodings a container holds at the input's rate and channel count."""
    return [subtype for subtype in container_subtypes(fmt) if _can_write(fmt, subtype, info)]


def unwritable(what: str) -> UsageError:
    """The refusal of a format nothing here writes, with the list of those that are."""
    return UsageError(f"{what} names no format speechlens writes; writable: "
                      + " ".join(writable_suffixes()))


def _valid_list(fmt: str, info: AudioInfo) -> str:
    valid = writable_subtypes(fmt, info)
    return f"valid here: {', '.join(valid)}" if valid else "nothing is valid here"


def _can_write(fmt: str, subtype: str, info: AudioInfo) -> bool:
    """PyAV's containers: the codec's encoder takes this rate and layout. libsndfile's: one
    frame written to memory and read back with its rate and channel count: some containers take
    any rate and keep another (XI: 44.1 kHz; WVE: 8 kHz; HTK rounds 48 kHz)."""
    if fmt in CONTAINERS:
        from . import pyav
        codec = CODECS.get(subtype)
        return (subtype in CONTAINERS[fmt].codecs and codec is not None
                and codec.encoder is not None
                and pyav.can_encode(codec.encoder, info.sample_rate,
                                    info.media.layout if info.media
                                    else pyav.layout_for(info.channels)))
    if subtype not in sf.available_subtypes() or not sf.check_format(fmt, subtype):
        return False
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


def _shape_note(fmt: str, subtype: str, info: AudioInfo) -> str:
    """A valid pair refused for this rate or channel count says so."""
    valid = (subtype in CONTAINERS[fmt].codecs if fmt in CONTAINERS
             else subtype in sf.available_subtypes() and sf.check_format(fmt, subtype))
    return f" at {info.sample_rate} Hz with {info.channels} channel(s)" if valid else ""


def check_subtype_name(subtype: str) -> None:
    if subtype.upper() not in sf.available_subtypes() and subtype.upper() not in CODECS:
        raise UsageError(f"unknown subtype {subtype!r} (for example PCM_16, PCM_24, FLOAT, "
                         "AAC, OPUS)")


def audio_suffixes() -> set[str]:
    """File suffixes that claim audio: every container soundfile knows, the aliases, and the
    media containers."""
    return ({"." + name.lower() for name in sf.available_formats()} | set(_SUFFIX_ALIASES)
            | {s for c in CONTAINERS.values() for s in c.suffixes})
