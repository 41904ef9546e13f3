"""What speechlens needs from PyAV (FFmpeg's libraries) beyond decoding and encoding: file names
as the operating system stores them, one-line reasons from its errors, what it encodes. Imported
only where a media container is read or written: PyAV's own import costs 50-200 ms."""

from __future__ import annotations

import errno
import io
import os

import av

from .containers import CONTAINERS, DEMUXERS

#: What PyAV raises for a file FFmpeg cannot open, read, encode or write.
ERRORS = (av.FFmpegError, OSError, ValueError)


class NotReadHere(ValueError):
    """FFmpeg knows the input's format, but speechlens does not read it through FFmpeg."""


def native_path(path: str | os.PathLike) -> str:
    """The name for every PyAV call: "file:" and the absolute path, so FFmpeg never takes a name
    such as "http:talk.m4a" or "concat:a|b" for another protocol. PyAV encodes a str name with
    the file system's encoding and its surrogate escapes, so a name that is not valid UTF-8
    reaches FFmpeg byte for byte; a bytes name it would take for a file object."""
    return "file:" + os.path.abspath(os.fsdecode(path))


def open_input(source: str | os.PathLike | io.BytesIO) -> av.container.InputContainer:
    """An input opened only as one of the containers speechlens reads (containers.DEMUXERS),
    through the file protocol alone: nothing FFmpeg opens can lead to another file or a URL."""
    allowed = {"format_whitelist": DEMUXERS, "protocol_whitelist": "file"}
    name = source if isinstance(source, io.BytesIO) else native_path(source)
    try:
        return av.open(name, container_options=allowed)
    except av.ArgumentError as error:
        if error.errno != errno.EINVAL:
            raise
        readable = ", ".join(CONTAINERS)
        raise NotReadHere(f"not a container speechlens reads through FFmpeg ({readable})") \
            from None


def reason(error: Exception) -> str:
    """FFmpeg's reason without the errno and path PyAV adds (the path may be a temporary name
    that means nothing to users)."""
    text = getattr(error, "strerror", None)
    if not text:
        lines = str(error).strip().splitlines()
        text = lines[0] if lines else ""
    return text or type(error).__name__


#: The channel layout a file libsndfile read gets in a media file (libsndfile records none).
_LAYOUTS = {1: "mono", 2: "stereo", 3: "3.0", 4: "quad", 5: "5.0", 6: "5.1", 7: "6.1",
            8: "7.1"}


def layout_for(channels: int) -> str:
    return _LAYOUTS.get(channels, f"{channels}c")


def encoders() -> set[str]:
    """The encoders this PyAV's FFmpeg has."""
    return av.codecs_available


def can_encode(encoder: str, sample_rate: int, layout: str) -> bool:
    """Whether FFmpeg's `encoder` opens for this rate and layout (Opus takes 8-48 kHz in five
    steps, MP3 no more than two channels, ALAC no 7.1)."""
    try:
        context = av.CodecContext.create(encoder, "w")
        context.sample_rate, context.layout = sample_rate, layout
        context.format = context.codec.audio_formats[0]
        context.open()
    except ERRORS:
        return False
    return True
