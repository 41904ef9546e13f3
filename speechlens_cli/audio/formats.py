"""Which container and encoding an output gets, and which file names mean audio.

The output's suffix decides its container; a suffix nothing writes is refused. The encoding is the
input's where the container can hold it; otherwise the nearest lossless one the container has
(a lossy one only where it has none), announced in the plan's note."""

from __future__ import annotations

import contextlib
import functools
import io
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf

from ..errors import OutputError, UsageError
from . import libsndfile
from .containers import (
    CODECS,
    CONTAINERS,
    container_for_suffix,
    muxer_options,
)
from .info import AudioInfo

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
#: Encodings that are not on the ladder, by the ladder's step that holds them without loss (PCM
#: in MOV and MP4: its own width).
_ON_LADDER = {"ALAC_16": "PCM_16", "ALAC_20": "PCM_24", "ALAC_24": "PCM_24",
              "ALAC_32": "PCM_32", "ALAC": "PCM_24", "FLAC": "PCM_24",
              **{codec.name: codec.pcm for codec in CODECS.values() if codec.pcm}}
#: Where lossy encodings (AAC, MP3, Vorbis, GSM...) start down the ladder: they decode to
#: floating point, but 24 bits hold all they keep and, unlike FLOAT, every tool reads them
#: (--subtype FLOAT keeps peaks beyond full scale).
_LOSSY_STEP = "PCM_24"
#: Bit rates a lossy encoding may be asked for (--bitrate), in bits per second.
BIT_RATE_RANGE = (6_000, 512_000)
#: Frames the encoding probe writes, rounded up to whole blocks: libsndfile's containers that
#: pack samples into packets read nothing back from less than one (SDS: 60 frames, PAF 24-bit:
#: 10), and every output is longer than this minimum's order (one STFT frame: 320 and up).
_PROBE_FRAMES = 1024
#: A container and encoding is listed by `speechlens formats` when it is written at one of these
#: rates and channel counts (each is still probed for the input's own).
_LISTED_SHAPES = ((8000, 1), (16000, 1), (44100, 1), (48000, 1), (22050, 1), (11025, 1),
                  (32000, 1), (96000, 1), (44100, 2))
#: The sample type a file is read back as, by subtype: its own where soundfile has it, so
#: decoding is a copy (a float WAV read back as int16 took 2.5 ms per 5 s at 44.1 kHz, as float32
#: 0.3 ms; AMD EPYC); int16 for the rest, whose decoders convert anyway.
_READ_BACK_DTYPE = {"FLOAT": "float32", "DOUBLE": "float64", "PCM_32": "int32",
                    "PCM_24": "int32"}
#: Frames per read when a file is read back to count what decodes.
_COUNT_BLOCK = 1 << 16


@dataclass(frozen=True)
class OutputFormat:
    """`subtype` is libsndfile's encoding (PCM_24), or the codec (AAC) in a media container;
    `bit_rate` is a lossy codec's; `note` says in one line what was not kept as asked. `block`:
    the frames one block of the encoding holds (IMA ADPCM in WAV: 505 at 8 kHz), of which a file
    holds a whole number: the output is padded with silence to the next one."""

    format: str
    subtype: str
    bit_rate: int | None = None
    note: str | None = None
    block: int = 1

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
                  source: str | os.PathLike | None = None,
                  bit_rate: int | None = None) -> OutputFormat:
    """The container the destination's suffix names (`container` forces one: stdout is WAV),
    the input's encoding in it or the nearest one it can hold; `bit_rate`, a lossy encoding's
    (the input's where it has the same codec, else the codec's speech rate).

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
        block = _block_of(fmt, subtype, info)
        return OutputFormat(fmt, subtype, _bit_rate(fmt, subtype, info, bit_rate, destination),
                            _joined(_pcm_caveat(fmt, subtype), _padding_note(subtype, block,
                                                                               info)), block)
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
    if not kept and _ON_LADDER.get(info.subtype) != chosen:  # PCM_S16LE is PCM_16 in a WAV
        notes.append(f"{info.subtype} cannot be written in a {fmt} file: {chosen} instead")
    block = _block_of(fmt, chosen, info)
    notes += [_pcm_caveat(fmt, chosen), _padding_note(chosen, block, info)]
    return OutputFormat(fmt, chosen, _bit_rate(fmt, chosen, info, bit_rate, destination),
                        _joined(*notes), block)


def _joined(*notes: str | None) -> str | None:
    return "; ".join(n for n in notes if n) or None


def _pcm_caveat(fmt: str, subtype: str) -> str | None:
    """What a container says about PCM in it (MP4's is 'ipcm', not every player's)."""
    codec = CODECS.get(subtype)
    return CONTAINERS[fmt].pcm_caveat if fmt in CONTAINERS and codec and codec.pcm else None


def _block_of(fmt: str, subtype: str, info: AudioInfo) -> int:
    """A media codec's frames are the muxer's to trim (edit lists, encoder headers): 1."""
    return 1 if fmt in CONTAINERS else block_frames(fmt, subtype, info.sample_rate,
                                                     info.channels)


def _padding_note(subtype: str, block: int, info: AudioInfo) -> str | None:
    """Where the input's length is not a whole number of the encoding's blocks, says how much
    silence ends the output."""
    padding = -info.frames % block
    if not padding:
        return None
    return (f"{subtype} stores whole blocks of {block} frames: {padding} frame(s) of silence end "
            "the output")


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
        start = _LADDER.index(step if step in _LADDER else _LOSSY_STEP)
        candidates = _LADDER[start:] + tuple(sf.available_subtypes(fmt))
    return next((c for c in candidates if _can_write(fmt, c, info)), None)


def _bit_rate(fmt: str, subtype: str, info: AudioInfo, asked: int | None,
              destination) -> int | None:
    """The rate asked for, which the encoder must take (Opus refuses more than 256 kb/s a
    channel); else the input's where it had the same codec, or the codec's speech rate. Only a
    lossy codec FFmpeg writes has one (libsndfile's Vorbis and Opus take none)."""
    codec = CODECS.get(subtype)
    lossy = fmt in CONTAINERS and codec is not None and not codec.lossless
    if asked is not None:
        if not lossy:
            raise UsageError(f"{destination or 'output'}: --bitrate applies to the lossy "
                             f"encodings FFmpeg writes (AAC, OPUS, MP3), not {fmt}/{subtype}; "
                             "ask for one with "
                             "--subtype or a suffix whose container has one (.m4a: --subtype "
                             "AAC, .mp3, .opus)")
        why = _media_refusal(fmt, subtype, info, asked)
        if why is not None:
            raise UsageError(f"--bitrate {asked}: {subtype} cannot be encoded at that rate "
                             f"here ({why})")
        return asked
    if not lossy:
        return None
    if info.media is not None and info.subtype == subtype and info.media.bit_rate:
        return info.media.bit_rate
    return codec.speech_bit_rate * info.channels


def parse_bit_rate(text: str, name: str = "--bitrate") -> int:
    """A bit rate as given on a command line (`name`): bits per second (64000) or kilobits
    (64k), within BIT_RATE_RANGE; else a UsageError saying what is."""
    digits = text.strip().lower()
    scale = 1000 if digits.endswith("k") else 1
    try:
        value = float(digits.removesuffix("k")) * scale
    except ValueError:
        value = float("nan")
    low, high = BIT_RATE_RANGE
    if not low <= value <= high or value != int(value):
        raise UsageError(f"{name} {text}: give bits per second from {low // 1000}k to "
                         f"{high // 1000}k (64000 or 64k)")
    return int(value)


def container_subtypes(fmt: str) -> list[str]:
    """The encodings a container holds, at some rate and channel count: libsndfile's where a file
    of them reads back exactly at one of _LISTED_SHAPES (libsndfile names some it cannot write,
    MPEG_LAYER_III in WAV, or not read back, DWVW and VOX_ADPCM)."""
    if fmt in CONTAINERS:
        from .pyav import encoders
        return [c for c in CONTAINERS[fmt].codecs if CODECS[c].encoder in encoders()]
    return [s for s in sf.available_subtypes(fmt) if sf.check_format(fmt, s)
            and any(block_frames(fmt, s, rate, channels) for rate, channels in _LISTED_SHAPES)]


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
    """PyAV's containers: FFmpeg writes a track of that codec at this rate and layout
    (_media_refusal). libsndfile's: a file of that encoding reads back exactly (block_frames)."""
    if fmt in CONTAINERS:
        return _media_refusal(fmt, subtype, info) is None
    return block_frames(fmt, subtype, info.sample_rate, info.channels) is not None


def _media_refusal(fmt: str, subtype: str, info: AudioInfo,
                   bit_rate: int | None = None) -> str | None:
    """Why a `fmt` media file cannot hold the speech track in `subtype` (at `bit_rate`), or None
    where it can."""
    container, codec = CONTAINERS[fmt], CODECS.get(subtype)
    if subtype not in container.codecs or codec is None or codec.encoder is None:
        return "not a codec it holds"
    from . import pyav
    layout = info.media.layout if info.media else pyav.layout_for(info.channels)
    options = muxer_options(container, subtype, info.sample_rate)
    return pyav.cannot_write(container.muxer, codec.encoder, info.sample_rate, layout,
                             tuple(options.items()), bit_rate)


@functools.cache
def block_frames(fmt: str, subtype: str, sample_rate: int, channels: int) -> int | None:
    """The frames one block of `subtype` holds in a `fmt` file at this rate and channel count
    (1: any length is stored as it is), or None where such a file cannot be written exactly.

    Probed in memory: a file of one frame holds one block (IMA ADPCM in WAV holds 505 frames at
    8 kHz, 8-bit AIFF mono 2); one of whole blocks must read back with its rate, its channel
    count and exactly its frames, every one decoding. Some containers take any rate and keep
    another (XI: 44.1 kHz; WVE: 8 kHz; HTK rounds 48 kHz); VOC adds a frame to 8-bit mono, and
    soundfile cannot read DWVW back (libsndfile seeks after each read, which DWVW refuses)."""
    if subtype not in sf.available_subtypes() or not sf.check_format(fmt, subtype):
        return None
    output = OutputFormat(fmt, subtype)
    try:   # in memory, nothing prints (libsndfile.decoding_silenced): fd 2 is left alone
        block, _ = _read_back(output, sample_rate, channels, 1)
        if block < 1:
            return None
        whole = block * -(-_PROBE_FRAMES // block)
        return block if _read_back(output, sample_rate, channels, whole) == (whole, whole) \
            else None
    except (*libsndfile.ERRORS, ValueError, TypeError, AssertionError):
        # soundfile asserts that a write took every frame: VOX_ADPCM writes only pairs
        return None


def _read_back(output: OutputFormat, sample_rate: int, channels: int,
               frames: int) -> tuple[int, int]:
    """(frames its header counts, frames that decode) of a file of `frames` silent frames
    written to memory; (-1, -1) when its rate or channel count changed."""
    memory = io.BytesIO()
    with sf.SoundFile(memory, "w", sample_rate, channels, output.subtype,
                      format=output.format) as probe:
        probe.write(np.zeros((frames, channels), np.float32))
    memory.seek(0)
    with sf.SoundFile(memory, **read_back_params(output, sample_rate, channels)) as back:
        if (back.samplerate, back.channels) != (sample_rate, channels):
            return -1, -1
        return back.frames, count_decoded(back, back.frames)


def count_decoded(handle: sf.SoundFile, limit: int) -> int:
    """The frames `handle` decodes from where it is, up to `limit`, read in blocks of its own
    sample type (all that is needed is a count). On a file libsndfile cannot seek in (GSM 6.10,
    G.72x), soundfile asserts that a read got every frame it asked for: one that did not is
    where the decodable frames end."""
    dtype = _READ_BACK_DTYPE.get(handle.subtype, "int16")
    width = np.dtype(dtype).itemsize * handle.channels
    got = 0
    with contextlib.suppress(AssertionError):
        while got < limit:
            block = handle.buffer_read(min(_COUNT_BLOCK, limit - got), dtype=dtype)
            if not len(block):
                break
            got += len(block) // width
    return got


def read_back_params(output: OutputFormat, sample_rate: int, channels: int) -> dict:
    """What soundfile needs to open a written file: nothing for a container with a header,
    everything for RAW."""
    if output.format not in _HEADERLESS:
        return {}
    return {"samplerate": sample_rate, "channels": channels, "subtype": output.subtype,
            "format": output.format}


def _shape_note(fmt: str, subtype: str, info: AudioInfo) -> str:
    """A valid pair refused for this rate or channel count says so, and why where FFmpeg
    said."""
    if subtype not in container_subtypes(fmt):
        return ""
    shape = f" at {info.sample_rate} Hz with {info.channels} channel(s)"
    return shape + (f" ({_media_refusal(fmt, subtype, info)})" if fmt in CONTAINERS else "")


def check_piped(suffix: str) -> None:
    """Standard output is a pipe: a container whose reader must seek to its end (MP4's index
    is written last) is refused there, with those that are not."""
    media = container_for_suffix(suffix)
    if media is not None and not media.piped:
        piped = [s for s in writable_suffixes()
                 if getattr(container_for_suffix(s), "piped", True)]
        raise UsageError(f"--format {suffix[1:]}: a {media.name} file cannot be read from a pipe "
                         "(its index comes last); on standard output use one of "
                         + " ".join(piped))


def check_subtype_name(subtype: str) -> None:
    if subtype.upper() not in sf.available_subtypes() and subtype.upper() not in CODECS:
        raise UsageError(f"unknown subtype {subtype!r} (for example PCM_16, PCM_24, FLOAT, "
                         "AAC, OPUS)")


def audio_suffixes() -> set[str]:
    """File suffixes that claim audio: every container soundfile knows, the aliases, and the
    media containers."""
    return ({"." + name.lower() for name in sf.available_formats()} | set(_SUFFIX_ALIASES)
            | {s for c in CONTAINERS.values() for s in c.suffixes})
