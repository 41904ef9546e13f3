"""What speechlens needs from PyAV (FFmpeg's libraries) beyond decoding and encoding: file names
as the operating system stores them, one-line reasons from its errors, what it encodes. Imported
only where a media container is read or written: PyAV's own import costs 50-200 ms."""

from __future__ import annotations

import contextlib
import errno
import functools
import io
import os
from collections.abc import Iterator
from typing import BinaryIO

import av
import av.logging

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


def open_input(source: str | os.PathLike | BinaryIO,
               demuxer: str | None = None) -> av.container.InputContainer:
    """An input (a file's name, or a file object) opened only as one of the containers
    speechlens reads (containers.DEMUXERS; `demuxer` names the one, where it is known), through
    the file protocol alone: nothing FFmpeg opens can lead to another file or a URL."""
    allowed = {"format_whitelist": DEMUXERS, "protocol_whitelist": "file"}
    name = native_path(source) if isinstance(source, (str, os.PathLike)) else source
    try:
        return av.open(name, format=demuxer, container_options=allowed)
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


@contextlib.contextmanager
def ffmpeg_errors() -> Iterator[list[tuple[int, str, str]]]:
    """FFmpeg's error messages while the block runs. PyAV drops FFmpeg's log unless a level is
    set, and its exceptions then say only "Invalid argument" where FFmpeg said why ("Exactly
    one MP3 audio stream is required")."""
    level, skip = av.logging.get_level(), av.logging.get_skip_repeated()
    av.logging.set_level(av.logging.ERROR)
    av.logging.set_skip_repeated(False)  # the same refusal, tried twice, is said twice
    try:
        with av.logging.Capture(local=False) as logs:
            yield logs
    finally:
        av.logging.set_skip_repeated(skip)
        av.logging.set_level(level)


def explained(error: Exception, logs: list[tuple[int, str, str]]) -> str:
    """FFmpeg's first error message from `logs` (ffmpeg_errors), else the error's reason."""
    said = next((message.strip() for level, _, message in logs
                 if level <= av.logging.ERROR and message.strip()), None)
    return said or reason(error)


@functools.cache
def cannot_write(muxer: str, encoder: str, sample_rate: int, layout: str,
                 options: tuple[tuple[str, str], ...] = (),
                 bit_rate: int | None = None) -> str | None:
    """Why FFmpeg cannot write a track of `encoder` at this rate and layout (and `bit_rate`)
    with `muxer` (opened with `options`), or None where it can: the encoder opens (Opus takes
    8-48 kHz in five steps and at most 256 kb/s a channel, MP3 no more than two channels, ALAC
    no 7.1) and the muxer writes its header in memory (the mp4 muxer refuses MP3 below
    16 kHz)."""
    with ffmpeg_errors() as logs:
        try:
            with av.open(io.BytesIO(), "w", format=muxer, options=dict(options)) as trial:
                stream = trial.add_stream(encoder, rate=sample_rate, layout=layout)
                if bit_rate:
                    stream.bit_rate = bit_rate
                trial.start_encoding()
        except ERRORS as error:
            return explained(error, logs)
    return None
