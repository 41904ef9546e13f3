"""Writing a media file: the enhanced speech track encoded in place of the original one, every
other stream (video, further audio tracks, subtitles, cover art) copied packet for packet, and
the container's metadata and chapters kept."""

from __future__ import annotations

import contextlib
import io
from fractions import Fraction

import av
import numpy as np

from ...errors import OutputError, SpeechlensError
from .. import media, pyav
from ..containers import CODECS, CONTAINERS, muxer_options
from ..formats import OutputFormat
from ..info import AudioInfo
from .blocks import clamped, incomplete

#: Tags each muxer writes itself: copied, they would name the original file's tools.
_OWN_TAGS = {"encoder", "duration"}


def _tags(metadata: dict[str, str]) -> dict[str, str]:
    return {key: value for key, value in metadata.items() if key.lower() not in _OWN_TAGS}


def _copied(stream: av.stream.Stream) -> bool:
    """Every stream but the demuxer's own (MP4 chapters) is copied."""
    return stream.discard != av.stream.Discard.all


def _is_cover(stream: av.stream.Stream) -> bool:
    return bool(stream.disposition & av.stream.Disposition.attached_pic)


def _add_copy(out: av.container.OutputContainer, stream: av.stream.Stream,
              output: OutputFormat, shown: str) -> av.stream.Stream:
    """`stream` added to `out` to be copied packet for packet, or why the container cannot."""
    try:
        return out.add_stream_from_template(stream)
    except pyav.ERRORS as error:
        raise _cannot_hold(stream, output, shown, pyav.reason(error)) from None


def _cannot_hold(stream: av.stream.Stream, output: OutputFormat, shown: str,
                 why: str) -> OutputError:
    """The stream named by its codec (mp3, not the decoder's name, mp3float)."""
    context = stream.codec_context
    codec = context.codec.canonical_name if context is not None else "data"
    return OutputError(
        f"{shown}: a {output.format} file cannot hold stream {stream.index} ({stream.type}, "
        f"{codec}) of the input ({why}); choose another container or suffix")


def _open_output(target, info: AudioInfo, output: OutputFormat) -> av.container.OutputContainer:
    container = CONTAINERS[output.format]
    return av.open(target, "w", format=container.muxer,
                   options=muxer_options(container, output.subtype, info.sample_rate))


def check_copies_fit(info: AudioInfo, output: OutputFormat, shown: str) -> None:
    """At planning, before any model runs: every stream to be copied fits the output container
    beside the speech track (an MP4 subtitle does not fit Matroska, a second MP3 track does not
    fit .mp3), tried on a container in memory whose header is written and nothing else. A stream
    the header refuses is found by trying the speech track with the copies up to each in turn.
    `output` is a media container and `info` a media input's."""
    with pyav.open_input(info.media.source) as source:
        copies = [stream for stream in source.streams
                  if stream.index != info.media.stream_index and _copied(stream)]
        cover = next((stream for stream in copies if _is_cover(stream)), None)
        if cover is not None and not CONTAINERS[output.format].covers:
            raise _cannot_hold(cover, output, shown, "cover art would be dropped: .m4a and "
                               ".mp4 keep it")
        if _header_refusal(info, output, shown, copies) is None:
            return
        for count in range(len(copies) + 1):
            why = _header_refusal(info, output, shown, copies[:count])
            if why is not None and count:
                raise _cannot_hold(copies[count - 1], output, shown, why)
            if why is not None:
                raise OutputError(f"{shown}: a {output.format} file cannot hold the speech "
                                  f"track ({why}); choose another container or suffix")


def _header_refusal(info: AudioInfo, output: OutputFormat, shown: str,
                    copies: list[av.stream.Stream]) -> str | None:
    """Why the muxer refuses its header for the speech track and `copies`, or None."""
    codec = CODECS[output.subtype]
    with pyav.ffmpeg_errors() as logs:
        try:
            with _open_output(io.BytesIO(), info, output) as trial:
                trial.add_stream(codec.encoder, rate=info.sample_rate, layout=info.media.layout)
                for stream in copies:
                    _add_copy(trial, stream, output, shown)
                trial.start_encoding()
        except pyav.ERRORS as error:
            return pyav.explained(error, logs)
    return None


class MediaSink:
    """An output media file being written, with soundfile's Sink interface: blocks in order,
    every failure an OutputError naming `shown`.

    Other streams are copied as the speech advances, up to the time already encoded, so the
    output is interleaved as a player reads it and memory stays flat in the file's length."""

    def __init__(self, path, info: AudioInfo, output: OutputFormat, shown: str):
        self.path, self.info, self.output, self.shown = path, info, output, shown
        self.written = self.clamped = 0
        self.source = None
        self.copies: dict[int, av.stream.Stream] = {}
        try:
            self.out = _open_output(pyav.native_path(path), info, output)
        except pyav.ERRORS as error:
            raise self._failure("cannot write there", error) from None
        try:
            self._add_streams()
        except BaseException:
            self.abandon()
            raise
        self.packets = self._other_packets()
        self.waiting: av.Packet | None = None
        encoder_format = self.audio.codec_context.format
        self.integer = encoder_format is not None and encoder_format.name[0] in "su"
        self.start = round(self._start() * info.sample_rate)

    def _start(self) -> Fraction:
        """When the speech plays, kept where other streams play beside it (a video, a second
        audio track) so it stays in sync with them; alone (a cover art at most), it starts at 0:
        an MP3's first sample is stamped after the encoder's delay, which another container
        would play as a gap."""
        timed = any(not _is_cover(self.source.streams[index]) for index in self.copies)
        return self.info.media.start if timed else Fraction(0)

    def _failure(self, what: str, error: Exception) -> OutputError:
        return OutputError(f"{self.shown}: {what} ({pyav.reason(error)})")

    def _add_streams(self) -> None:
        """The output's streams in the input's order, the speech track where it was."""
        track = self.info.media
        self.track_number = 0  # among the output's audio tracks
        if track is None:  # audio from a file libsndfile read: the new track alone
            self.audio = self._add_audio(None)
            return
        self.source = pyav.open_input(track.source)
        self.track_number = [s.index for s in self.source.streams.audio].index(track.stream_index)
        for stream in self.source.streams:
            if stream.index == track.stream_index:
                self.audio = self._add_audio(stream)
            elif _copied(stream):
                copy = _add_copy(self.out, stream, self.output, self.shown)
                self._keep_labels(stream, copy)
                self.copies[stream.index] = copy
        self.out.metadata.update(_tags(self.source.metadata))
        chapters = self.source.chapters()
        if chapters:
            self.out.set_chapters(chapters)

    @staticmethod
    def _keep_labels(original: av.stream.Stream, copy: av.stream.Stream) -> None:
        copy.metadata.update(_tags(original.metadata))
        copy.disposition = original.disposition

    def _add_audio(self, original: av.stream.Stream | None) -> av.audio.stream.AudioStream:
        info, codec = self.info, CODECS[self.output.subtype]
        layout = info.media.layout if info.media else pyav.layout_for(info.channels)
        try:
            stream = self.out.add_stream(codec.encoder, rate=info.sample_rate, layout=layout)
        except pyav.ERRORS as error:
            raise self._failure(f"cannot encode {codec.name}", error) from None
        if self.output.bit_rate:
            stream.bit_rate = self.output.bit_rate
        stream.time_base = Fraction(1, info.sample_rate)
        if original is not None:
            self._keep_labels(original, stream)
        return stream

    def _other_packets(self):
        if not self.copies:
            return iter(())
        return self.source.demux(*(self.source.streams[i] for i in self.copies))

    def _copy_until(self, seconds: float | None) -> None:
        """Copy the other streams' packets that play before `seconds` (all, for None)."""
        while True:
            packet = self.waiting or next(self.packets, None)
            self.waiting = None
            if packet is None:
                return
            if packet.size == 0:  # the demuxer's end-of-stream marker
                continue
            stamp = packet.dts if packet.dts is not None else packet.pts
            if seconds is not None and stamp is not None \
                    and float(stamp * packet.time_base) > seconds:
                self.waiting = packet
                return
            packet.stream = self.copies[packet.stream.index]
            self.out.mux(packet)

    def write(self, block: np.ndarray) -> None:
        if self.integer:
            block, over = clamped(block)
            self.clamped += over
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(block.T, dtype=np.float32),
                                           format="fltp", layout=self.audio.layout.name)
        frame.sample_rate = self.info.sample_rate
        frame.time_base = self.audio.time_base
        frame.pts = self.start + self.written
        try:
            self.out.mux(self.audio.encode(frame))
            self.written += len(block)
            self._copy_until((self.start + self.written) / self.info.sample_rate)
        except pyav.ERRORS as error:
            raise self._failure("write failed", error) from None

    def abandon(self) -> None:
        """Close after a failure elsewhere; that failure is the one reported."""
        for container in (self.out, self.source):
            with contextlib.suppress(Exception):
                if container is not None:
                    container.close()

    def close(self) -> None:
        """Flush the encoder, copy the rest of the other streams, finish the container."""
        try:
            self.out.mux(self.audio.encode(None))
            self._copy_until(None)
            self.out.close()
        except pyav.ERRORS as error:
            self.abandon()
            raise self._failure("write failed", error) from None
        if self.source is not None:
            self.source.close()

    def verify(self) -> None:
        """After close: the speech track must decode to exactly what was written, or up to the
        encoder's padding more where the container does not record the length (AAC in
        Matroska), and its delay too where nothing trims it (ADTS)."""
        padding, container = 1, CONTAINERS[self.output.format]
        if self.output.subtype in container.unrecorded:
            frames = max(self.audio.codec_context.frame_size or 0, 1)
            padding = frames * (2 if container.primed else 1)
        try:
            back = media.probe(self.path, self.shown, self.track_number, container.demuxer)
            # Opus decodes at 48 kHz whatever rate it was encoded from (8-48 kHz divide it)
            got = round(back.frames * self.info.sample_rate / back.sample_rate)
        except SpeechlensError:
            got = -1
        if not self.written <= got < self.written + padding:
            raise incomplete(self.shown, max(got, 0), self.written)
