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
    #: A lossy codec's bits per second and channel when the input's own rate is not kept (a WAV
    #: into .m4a, say): clean speech at a podcast's rates.
    speech_bit_rate: int | None = None
    #: PCM's libsndfile encoding of the same samples (PCM_S16LE: PCM_16), for a WAV output.
    pcm: str | None = None


@dataclass(frozen=True)
class MediaContainer:
    """A container by the name speechlens shows (M4A), FFmpeg's muxer for it, and the audio codecs
    it can be written with, in order of preference: the lossless one first where there is one,
    then the one players expect. `edit_lists`: it records a track's length in an edit list, in
    the movie's timescale (FFmpeg's mov muxers). `unrecorded`: the codecs whose length it does
    not record, which decode to whole codec frames (AAC in Matroska and ADTS); `primed`: the
    encoder's delay (one codec frame) decodes first too, as nothing records it (ADTS).
    `options`: the muxer's own, always. `piped`: a reader of a pipe can play it (an MP4's index
    comes last). `pcm_caveat`: what the user should know about PCM in it. `covers`: it keeps
    cover art (FFmpeg's QuickTime writer accepts a cover and drops it). `demuxer`: what reads
    a written file back, where FFmpeg's guess from its bytes may fail (a short ADTS file, whose
    temporary name has no .aac to help)."""

    name: str
    muxer: str
    suffixes: tuple[str, ...]
    codecs: tuple[str, ...]
    edit_lists: bool = False
    unrecorded: tuple[str, ...] = ()
    primed: bool = False
    options: tuple[tuple[str, str], ...] = ()
    piped: bool = True
    pcm_caveat: str | None = None
    covers: bool = True
    demuxer: str | None = None


#: PCM as cameras and recorders put it in MOV and MP4: FFmpeg's codec, libsndfile's encoding.
_PCM = {"pcm_s16le": "PCM_16", "pcm_s16be": "PCM_16", "pcm_s24le": "PCM_24",
        "pcm_s24be": "PCM_24", "pcm_s32le": "PCM_32", "pcm_s32be": "PCM_32",
        "pcm_f32le": "FLOAT", "pcm_f32be": "FLOAT"}
_PCM_CODECS = tuple(name.upper() for name in _PCM)

CODECS = {codec.name: codec for codec in (
    Codec("AAC", "aac", ("aac", "aac_fixed", "aac_latm"), speech_bit_rate=64_000),
    Codec("OPUS", "libopus", ("opus", "libopus"), speech_bit_rate=32_000),
    Codec("MP3", "libmp3lame", ("mp3", "mp3float", "libmp3lame"), speech_bit_rate=64_000),
    Codec("ALAC", "alac", ("alac",), lossless=True),
    Codec("FLAC", "flac", ("flac",), lossless=True),
    Codec("VORBIS", None, ("vorbis", "libvorbis")),  # FFmpeg in PyAV's wheels has no encoder
    *(Codec(name.upper(), name, (name,), lossless=True, pcm=pcm) for name, pcm in _PCM.items()),
)}

#: The mp4 muxer writes what ipod writes (the chapter track, the iTunes tags) with the M4A brand;
#: ipod's own list of codecs has no JPEG or PNG, so PyAV refused the cover an M4A carries.
_M4A_BRAND = (("brand", "M4A "),)
_IPCM = ("PCM in an MP4 file is ISO 'ipcm', which some players and editors do not read yet "
         "(.mov holds PCM as cameras write it)")

CONTAINERS = {container.name: container for container in (
    MediaContainer("M4A", "mp4", (".m4a", ".m4b"), ("ALAC", "AAC"), edit_lists=True,
                   options=_M4A_BRAND, piped=False),
    MediaContainer("MP4", "mp4", (".mp4", ".m4v"),
                   ("ALAC", "FLAC", *_PCM_CODECS, "AAC", "OPUS", "MP3"), edit_lists=True,
                   piped=False, pcm_caveat=_IPCM),
    MediaContainer("MOV", "mov", (".mov", ".qt"), ("ALAC", *_PCM_CODECS, "AAC"),
                   edit_lists=True, piped=False, covers=False),
    MediaContainer("3GP", "3gp", (".3gp",), ("AAC",), edit_lists=True, piped=False),
    MediaContainer("WEBM", "webm", (".webm",), ("OPUS",)),
    MediaContainer("MKV", "matroska", (".mkv", ".mka"), ("FLAC", "ALAC", "OPUS", "AAC", "MP3"),
                   unrecorded=("AAC",)),
    MediaContainer("MP3", "mp3", (".mp3",), ("MP3",)),
    MediaContainer("ADTS", "adts", (".aac",), ("AAC",), unrecorded=("AAC",), primed=True,
                   demuxer="aac"),
    MediaContainer("OPUS", "opus", (".opus",), ("OPUS",)),
)}

#: FFmpeg's demuxer name -> the container, for a file whose suffix does not say.
_DEMUXED_AS = {"mov,mp4,m4a,3gp,3g2,mj2": "MP4", "matroska,webm": "MKV", "mp3": "MP3",
               "aac": "ADTS", "ogg": "OPUS"}
#: The only demuxers FFmpeg may open an input with: it would otherwise choose among all of its
#: readers by a file's first bytes, playlists (HLS) and concat lists among them, which open and
#: read other files, anywhere, named inside the one given.
DEMUXERS = ",".join(_DEMUXED_AS)
#: The rate Opus always decodes at, whatever rate it was encoded from.
OPUS_RATE = 48_000


def muxer_options(container: MediaContainer, codec: str, sample_rate: int) -> dict[str, str]:
    """What FFmpeg's muxer is opened with. The mov muxers' edit lists count in the movie's
    timescale, 1/1000 s unless one is given: a length that is no whole number of milliseconds
    came back short (1001 frames at 22.05 kHz as 992). The speech track's own rate records it
    exactly (Opus's: 48 kHz, the rate it decodes at)."""
    options = dict(container.options)
    if container.edit_lists:
        options["movie_timescale"] = str(OPUS_RATE if codec == "OPUS" else sample_rate)
    return options


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
