"""The media containers and codecs speechlens reads and writes through PyAV: the one table of
which file suffix means which container, and which audio codecs each can hold."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Codec:
    """An audio codec by the name speechlens shows (AAC), with FFmpeg's encoder and decoders."""

    name: str
    encoder: str | None
    decoders: tuple[str, ...]
    lossless: bool = False


@dataclass(frozen=True)
class MediaContainer:
    """A container by the name speechlens shows (M4A), FFmpeg's muxer for it, and the audio codecs
    it can be written with, in order of preference: the lossless one first where there is one,
    then the one players expect. `edit_lists`: it records a track's length in an edit list, in
    the movie's timescale (FFmpeg's mov muxers). `unrecorded`: the codecs whose length it does
    not record, which decode to whole codec frames (AAC in Matroska)."""

    name: str
    muxer: str
    suffixes: tuple[str, ...]
    codecs: tuple[str, ...]
    edit_lists: bool = False
    unrecorded: tuple[str, ...] = ()


CODECS = {codec.name: codec for codec in (
    Codec("AAC", "aac", ("aac", "aac_fixed", "aac_latm")),
    Codec("OPUS", "libopus", ("opus", "libopus")),
    Codec("MP3", "libmp3lame", ("mp3", "mp3float", "libmp3lame")),
    Codec("ALAC", "alac", ("alac",), lossless=True),
    Codec("FLAC", "flac", ("flac",), lossless=True),
    Codec("VORBIS", None, ("vorbis", "libvorbis")),  # FFmpeg in PyAV's wheels has no encoder
)}

CONTAINERS = {container.name: container for container in (
    MediaContainer("M4A", "ipod", (".m4a", ".m4b"), ("ALAC", "AAC"), edit_lists=True),
    MediaContainer("MP4", "mp4", (".mp4", ".m4v"), ("ALAC", "FLAC", "AAC", "OPUS", "MP3"),
                   edit_lists=True),
    MediaContainer("MOV", "mov", (".mov", ".qt"), ("ALAC", "AAC"), edit_lists=True),
    MediaContainer("3GP", "3gp", (".3gp",), ("AAC",), edit_lists=True),
    MediaContainer("WEBM", "webm", (".webm",), ("OPUS",)),
    MediaContainer("MKV", "matroska", (".mkv", ".mka"), ("FLAC", "ALAC", "OPUS", "AAC", "MP3"),
                   unrecorded=("AAC",)),
    MediaContainer("MP3", "mp3", (".mp3",), ("MP3",)),
)}

#: FFmpeg's demuxer name -> the container, for a file whose suffix does not say.
_DEMUXED_AS = {"mov,mp4,m4a,3gp,3g2,mj2": "MP4", "matroska,webm": "MKV", "mp3": "MP3"}
#: The only demuxers FFmpeg may open an input with: it would otherwise choose among all of its
#: readers by a file's first bytes, playlists (HLS) and concat lists among them, which open and
#: read other files, anywhere, named inside the one given.
DEMUXERS = ",".join(_DEMUXED_AS)
#: Bits per second and channel for a lossy encoding when the input's own rate is not kept (a WAV
#: into .m4a, say): transparent for speech with AAC, Opus and MP3.
LOSSY_BIT_RATE_PER_CHANNEL = 96_000


#: The rate Opus always decodes at, whatever rate it was encoded from.
OPUS_RATE = 48_000


def muxer_options(container: MediaContainer, codec: str, sample_rate: int) -> dict[str, str]:
    """What FFmpeg's muxer is opened with. The mov muxers' edit lists count in the movie's
    timescale, 1/1000 s unless one is given: a length that is no whole number of milliseconds
    came back short (1001 frames at 22.05 kHz as 992). The speech track's own rate records it
    exactly (Opus's: 48 kHz, the rate it decodes at)."""
    if not container.edit_lists:
        return {}
    return {"movie_timescale": str(OPUS_RATE if codec == "OPUS" else sample_rate)}


def container_for_suffix(suffix: str) -> MediaContainer | None:
    suffix = suffix.lower()
    return next((c for c in CONTAINERS.values() if suffix in c.suffixes), None)


def container_for_file(suffix: str, demuxer: str) -> MediaContainer | None:
    """What a file read through PyAV is: its suffix says, else the demuxer that opened it."""
    return container_for_suffix(suffix) or CONTAINERS.get(_DEMUXED_AS.get(demuxer, ""))


def codec_name(decoder: str) -> str:
    """The name speechlens shows for the codec FFmpeg decoded a track with ("aac" -> "AAC");
    a codec speechlens cannot write keeps FFmpeg's name, upper-cased."""
    return next((c.name for c in CODECS.values() if decoder in c.decoders), decoder.upper())


def media_suffixes() -> set[str]:
    return {suffix for container in CONTAINERS.values() for suffix in container.suffixes}
