"""Reading the speech track of a media file (phone recordings, video, podcasts) through PyAV:
which track, how many samples it really holds, and its samples in blocks at the native rate and
channel count, with memory flat in the file's length."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

from ..errors import AudioInputError, UsageError
from . import pyav
from .containers import codec_name, container_for_file, container_for_suffix
from .info import AudioInfo, MediaTrack, check_channels


def select_track(container: av.container.InputContainer, name: str,
                 track: int | None) -> av.audio.stream.AudioStream:
    """The audio track marked default (the first one when none is), or audio track `track`
    counted from 0, as ffmpeg's -map 0:a:N counts."""
    tracks = list(container.streams.audio)
    if not tracks:
        raise AudioInputError(f"{name}: has no audio track")
    if track is None:
        return next((s for s in tracks if s.disposition & av.stream.Disposition.default),
                    tracks[0])
    if not 0 <= track < len(tracks):
        raise UsageError(f"{name}: has no audio track {track} (its {len(tracks)} audio "
                         f"track(s) are numbered 0-{len(tracks) - 1})")
    return tracks[track]


@contextlib.contextmanager
def opened(path: str | os.PathLike, name: str,
           demuxer: str | None = None) -> Iterator[av.container.InputContainer]:
    try:
        container = pyav.open_input(path, demuxer)
    except pyav.ERRORS as error:
        raise AudioInputError(f"{name}: not a readable audio file ({pyav.reason(error)})") \
            from None
    with container:
        yield container


#: How far short of the decoded samples a recorded length may fall and still be taken: an
#: encoder pads the last codec frame (and some flush one more), which MP4 edit lists and MP3's
#: encoder header leave out of the length they record.
PADDING_CODEC_FRAMES = 2


def track_frames(decoded: int, declared: int | None, codec_frame: int) -> int:
    """The samples a track holds: those that decode. A recorded length only trims the encoder's
    padding from the end; one shorter than that is an estimate or damage (a VBR MP3 without an
    encoder header is timed by its first frame's bit rate, an MP4's mdhd may under-state its
    samples), and one longer than what decodes cannot be delivered."""
    if declared is not None and 0 <= decoded - declared < PADDING_CODEC_FRAMES * codec_frame:
        return declared
    return decoded


def _declared_frames(stream: av.audio.stream.AudioStream, rate: int) -> int | None:
    """The track's length as the container records it, in samples, or None."""
    if stream.duration is None or stream.time_base is None:
        return None
    return round(stream.duration * stream.time_base * rate)


def _check_same_shape(first: av.AudioFrame, frame: av.AudioFrame, decoded: int,
                      name: str) -> None:
    """A track is enhanced at one rate and channel layout: joined recordings (`cat a.mp3 b.mp3`)
    may change either mid-stream, which one output track cannot hold."""
    for what, before, now in (("sample rate", first.sample_rate, frame.sample_rate),
                              ("channel layout", first.layout.name, frame.layout.name)):
        if before != now:
            raise AudioInputError(
                f"{name}: the audio track changes its {what} at "
                f"{decoded / first.sample_rate:.2f} s (from {before} to {now}); speechlens "
                f"needs one {what} per track (split it where it changes)")


def probe(path: str | os.PathLike, name: str, track: int | None = None,
          demuxer: str | None = None) -> AudioInfo:
    """Decode the chosen track once to count its samples: containers record lengths roughly or
    not at all, and the windows need the exact count before the first one is enhanced.
    `demuxer`: the one to read it with (an output read back), else its suffix's where FFmpeg's
    guess may fail (a short .aac)."""
    path = Path(path)
    named = container_for_suffix(path.suffix)
    with opened(path, name, demuxer or (named and named.demuxer)) as container:
        stream = select_track(container, name, track)
        decoded, first, size, codec_frame = 0, None, 0, 0
        try:
            for packet in container.demux(stream):
                size += packet.size
                for frame in packet.decode():
                    first = first or frame
                    _check_same_shape(first, frame, decoded, name)
                    decoded += frame.samples
                    codec_frame = max(codec_frame, frame.samples)
        except pyav.ERRORS as error:
            raise AudioInputError(f"{name}: could not be decoded ({pyav.reason(error)})") \
                from None
        if first is None or not decoded:
            raise AudioInputError(f"{name}: its audio track holds no samples")
        rate, channels = first.sample_rate, first.layout.nb_channels
        check_channels(channels, f"{name}:", "split it into files of fewer channels first")
        frames = track_frames(decoded, _declared_frames(stream, rate), codec_frame)
        kind = container_for_file(path.suffix, container.format.name)
        start = (Fraction(first.pts) * first.time_base
                 if first.pts is not None and first.time_base else Fraction(0))
        # Matroska records no bit rate: the packets' own is the rate to keep
        bit_rate = stream.codec_context.bit_rate or round(8 * size * rate / frames)
        media = MediaTrack(path, stream.index, first.layout.name, bit_rate, start, track)
        return AudioInfo(frames, rate, channels, kind.name if kind else container.format.name,
                         codec_name(stream.codec_context.name), media)


class MediaReader:
    """Blocks of the selected track as float32 [frames, channels], like a soundfile handle's
    read(), ending where the probe counted the track to end."""

    def __init__(self, container: av.container.InputContainer, info: AudioInfo, name: str):
        self.info, self.name, self.channels = info, name, info.channels
        stream = container.streams[info.media.stream_index]
        self.frames = container.decode(stream)
        self.convert = av.AudioResampler(format="flt", layout=info.media.layout,
                                         rate=info.sample_rate)
        self.pending = np.zeros((0, info.channels), np.float32)
        self.left = info.frames

    def _next(self) -> np.ndarray | None:
        try:
            frame = next(self.frames, None)
            if frame is None:
                return None
            blocks = [f.to_ndarray().reshape(-1, self.channels)
                      for f in self.convert.resample(frame)]
        except pyav.ERRORS as error:
            raise AudioInputError(f"{self.name}: could not be decoded ({pyav.reason(error)})") \
                from None
        return np.concatenate(blocks) if blocks else np.zeros((0, self.channels), np.float32)

    def read(self, frames: int, dtype: str = "float32", always_2d: bool = True) -> np.ndarray:
        """Up to `frames` frames; `dtype` and `always_2d` are soundfile's, always float32 2-D."""
        wanted = min(frames, self.left)
        parts, have = [self.pending], len(self.pending)
        while have < wanted:
            block = self._next()
            if block is None:
                break
            parts.append(block)
            have += len(block)
        joined = np.concatenate(parts) if len(parts) > 1 else self.pending
        out, self.pending = joined[:wanted], joined[wanted:]
        self.left -= len(out)
        return out.astype(np.float32, copy=False)


@contextlib.contextmanager
def media_reader(info: AudioInfo, name: str) -> Iterator[MediaReader]:
    with opened(info.media.source, name) as container:
        yield MediaReader(container, info, name)


def has_audio(path: Path) -> bool:
    """Whether PyAV opens `path` as one of the media containers speechlens knows, with an audio
    track (FFmpeg opens almost anything as something: a text file as an ANSI-art video)."""
    try:
        with pyav.open_input(path) as container:
            known = container_for_file(path.suffix, container.format.name) is not None
            return known and bool(container.streams.audio)
    except pyav.ERRORS:
        return False
