"""Reliability, media and encodings written and read back, and media on stdin (docs/reliability.md).

Where the model is not the point, the stand-in of test_reliability_inputs (the real config, the
output half the input) takes its place, so a file costs milliseconds: every container and
encoding `speechlens formats` lists is written at several rates and lengths and read back.
Refusals that must come before any model runs name a model that does not exist: loading it
would fail with another line."""

from __future__ import annotations

import io
import re
import struct
from pathlib import Path
from unittest import mock

import av
import numpy as np
import pytest
import soundfile as sf

from speechlens_cli import api
from speechlens_cli.audio import (
    container_subtypes,
    format_for_suffix,
    read_info,
    writable_suffixes,
)
from speechlens_cli.audio.containers import CONTAINERS
from speechlens_cli.synthetic.speech import noisy_speech
from tests.reliability import cases, invoke, leftovers, one_error_line
from tests.test_reliability_inputs import _BARE_MP3, _encoded, _Halver


def _stand_in():
    return mock.patch.object(api, "get_model", lambda _spec=None: _Halver())


def _write_input(path: Path, rate: int, frames: int, channels: int,
                 subtype: str = "FLOAT") -> np.ndarray:
    audio = noisy_speech(rate, frames / rate, channels=channels, seed=frames)
    sf.write(path, audio, rate, subtype=subtype)
    return audio


# ------------------------------------------------------------ every listed encoding round-trips

def _listed() -> list[tuple[str, str]]:
    """(suffix, encoding) for every container `speechlens formats` lists (its first suffix) and
    every encoding listed for it."""
    pairs, seen = [], set()
    for suffix in writable_suffixes():
        container = format_for_suffix(suffix)
        if container not in seen:
            seen.add(container)
            pairs += [(suffix, subtype) for subtype in container_subtypes(container)]
    return pairs


LISTED = _listed()
#: (rate, frames, channels): lengths that are no whole number of milliseconds (the mov muxers'
#: default timescale) nor of any encoding's block, stereo once; 44.1 kHz is XI's only rate,
#: 8 kHz WVE's.
SHAPES = ((8000, 1001, 1), (22050, 2206, 2), (44100, 4411, 1), (48000, 4801, 1))


def _whole_blocks(fmt: str, subtype: str, rate: int, channels: int, frames: int) -> int:
    """`frames` rounded up to whole blocks of the encoding, as libsndfile stores them: a file of
    one frame holds one block (IMA ADPCM in WAV: 505 frames at 8 kHz)."""
    params = {"samplerate": rate, "channels": channels, "subtype": subtype, "format": fmt}
    memory = io.BytesIO()
    sf.write(memory, np.zeros((1, channels)), rate, subtype=subtype, format=fmt)
    memory.seek(0)
    with sf.SoundFile(memory, **(params if fmt == "RAW" else {})) as one:
        block = one.frames
    return -(-frames // block) * block


def _read_back(path: Path, fmt: str, subtype: str, rate: int, channels: int) -> tuple:
    """(frames, rate, channels) of a written output, as a reader sees it (RAW is told its
    encoding)."""
    if fmt in CONTAINERS:
        return read_info(path).shape
    params = ({"samplerate": rate, "channels": channels, "subtype": subtype, "format": fmt}
              if fmt == "RAW" else {})
    with sf.SoundFile(path, **params) as back:
        return back.frames, back.samplerate, back.channels


@cases(len(LISTED) * len(SHAPES))
def test_every_listed_encoding_round_trips(tmp_path):
    """Each listed container and encoding, at each shape: written and read back at the input's
    rate and channel count with exactly its frames - rounded up to whole blocks where the
    encoding stores blocks, the rest silence, announced in a note - or refused at planning as
    not holding this rate or channel count. Every one is written at one shape at least. Opus
    decodes at 48 kHz whatever rate it was made from, AAC in Matroska to whole codec frames
    (in ADTS, the encoder's delay first too)."""
    written = set()
    for suffix, subtype in LISTED:
        fmt = format_for_suffix(suffix)
        for rate, frames, channels in SHAPES:
            source, target = tmp_path / "in.wav", tmp_path / f"out{suffix}"
            _write_input(source, rate, frames, channels)
            with _stand_in():
                result = invoke("enhance", source, target, "--model", "stand-in", "--subtype",
                                subtype)
            case = (suffix, subtype, rate, frames, channels)
            if result.exit_code == 2:
                assert f"cannot be written in a {fmt} file at {rate} Hz with {channels} " \
                       "channel(s)" in one_error_line(result.stderr), case
                assert not target.exists(), case
                continue
            assert result.exit_code == 0, (case, result.output)
            written.add((suffix, subtype))
            got = _read_back(target, fmt, subtype, rate, channels)
            if subtype == "OPUS" and fmt in CONTAINERS:
                assert got == (frames * 48000 // rate, 48000, channels), case
            elif fmt in CONTAINERS and subtype in CONTAINERS[fmt].unrecorded:
                slack = 1024 * (2 if CONTAINERS[fmt].primed else 1)
                assert got[1:] == (rate, channels) and frames <= got[0] < frames + slack, case
            else:
                expected = (frames if fmt in CONTAINERS
                            else _whole_blocks(fmt, subtype, rate, channels, frames))
                assert got == (expected, rate, channels), (case, got)
                if expected > frames:
                    assert f"{expected - frames} frame(s) of silence end the output" \
                        in result.stderr, case
            target.unlink()
    assert written == set(LISTED), set(LISTED) - written
    assert not leftovers(tmp_path)


@pytest.mark.parametrize("suffix, subtype", [(".aiff", "DWVW_16"), (".raw", "DWVW_12"),
                                             (".raw", "VOX_ADPCM"),
                                             (".wav", "MPEG_LAYER_III")])
def test_an_encoding_that_cannot_round_trip_is_not_listed_and_is_refused(tmp_path, suffix,
                                                                         subtype):
    """DWVW: soundfile cannot read it back (libsndfile seeks after every read, which DWVW
    refuses); VOX ADPCM: two samples a byte and no header, so an odd length is lost (its probe
    was an AssertionError traceback); MPEG layer III in WAV: libsndfile names it but writes
    none. Not in `speechlens formats`; asked for, one line before any model runs."""
    listed = invoke("formats").stdout
    row = next(line for line in listed.splitlines() if line.startswith(f"{suffix} "))
    assert subtype not in row.split()
    source = tmp_path / "in.wav"
    _write_input(source, 8000, 1001, 1)
    result = invoke("enhance", source, tmp_path / f"out{suffix}", "--model", tmp_path / "none",
                    "--subtype", subtype)
    assert result.exit_code == 2
    assert f"subtype {subtype} cannot be written in a {format_for_suffix(suffix)} file; " \
           "valid here: " in one_error_line(result.stderr)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.wav"]


@pytest.mark.parametrize("subtype, block", [("IMA_ADPCM", 505), ("GSM610", 640)])
def test_a_block_encoding_still_catches_a_short_write(tmp_path, monkeypatch, subtype, block):
    """The read-back check compares against the whole blocks written: a WAV whose last 256
    bytes never reached the disk (cut after closing, as a full disk would leave it) fails in
    one line and is never renamed into place; GSM 6.10 is one libsndfile cannot seek in."""
    from speechlens_cli.audio.write import sink

    close = sink.Sink.close

    def close_then_lose_the_end(self):
        close(self)
        path = Path(self.path)
        path.write_bytes(path.read_bytes()[:-256])

    monkeypatch.setattr(sink.Sink, "close", close_then_lose_the_end)
    source, target = tmp_path / "in.wav", tmp_path / "out.wav"
    _write_input(source, 8000, 13 * block, 1)   # whole blocks: no note
    with _stand_in():
        result = invoke("enhance", source, target, "--model", "stand-in", "--subtype", subtype)
    assert result.exit_code == 1
    assert "the written file does not read back complete" in one_error_line(result.stderr)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.wav"]


# ------------------------------------------------------------ lossy media from libsndfile inputs

@pytest.mark.parametrize("input_format, suffix, subtype, rate", [
    ("WAV", ".m4a", "AAC", 44100), ("FLAC", ".mp4", "MP3", 22050), ("WAV", ".mp4", "OPUS", 48000),
    ("FLAC", ".mov", "AAC", 48000), ("WAV", ".3gp", None, 48000), ("FLAC", ".3gp", None, 22050),
])
def test_media_from_wav_and_flac_keep_the_exact_length(tmp_path, input_format, suffix, subtype,
                                                       rate):
    """The mov muxers' edit lists counted in 1/1000 s: 1.0001 s came back short ("does not
    read back complete ... the disk may be full"). Now in the track's own timescale: exactly
    the input's frames. `.3gp` with no options (AAC) included."""
    frames = rate + rate // 10_000 + 1
    source = tmp_path / f"in.{input_format.lower()}"
    _write_input(source, rate, frames, 1, "PCM_16")
    target = tmp_path / f"out{suffix}"
    with _stand_in():
        result = invoke("enhance", source, target, "--model", "stand-in",
                        *(["--subtype", subtype] if subtype else []))
    assert result.exit_code == 0, result.output
    assert read_info(target).shape == (frames, rate, 1)


# ------------------------------------------------------------ media on stdin

def _mp3_behind_a_large_cover() -> bytes:
    """1 s of MP3 after an ID3 tag holding a 1.4 MiB PNG cover (noise does not compress)."""
    rate, side = 16000, 700
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="mp3") as out:
        out.metadata["title"] = "large cover"
        audio = out.add_stream("libmp3lame", rate=rate, layout="mono")
        cover = out.add_stream("png")
        cover.width = cover.height = side
        cover.pix_fmt = "rgb24"
        cover.disposition = av.stream.Disposition.attached_pic
        picture = av.VideoFrame.from_ndarray(
            np.random.default_rng(0).integers(0, 256, (side, side, 3), np.uint8), format="rgb24")
        picture.pts = 0
        pictures = [*cover.encode(picture), *cover.encode(None)]
        frame = av.AudioFrame.from_ndarray(noisy_speech(rate, 1.0, seed=3)[None], format="flt",
                                           layout="mono")
        frame.sample_rate, frame.pts = rate, 0
        out.mux(audio.encode(frame))
        out.mux(audio.encode(None))
        for packet in pictures:
            out.mux(packet)
    return buffer.getvalue()


def _quicktime_starting_with(box: bytes, folder: Path) -> bytes:
    """6 s of 48 kHz stereo PCM in QuickTime (1.1 MiB), its first box turned into `box`:
    b"free" or b"mdat" in place of the "ftyp" before the samples and the track list last;
    b"moov" first where the track list was written first ([ftyp][moov] swapped: the samples
    keep their offsets)."""
    rate, path = 48000, folder / "made.mov"
    options = {"movflags": "faststart"} if box == b"moov" else {}
    with av.open(str(path), "w", format="mov", options=options) as out:
        stream = out.add_stream("pcm_s16le", rate=rate, layout="stereo")
        audio = noisy_speech(rate, 6.0, channels=2, seed=4)
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(audio.T), format="fltp",
                                           layout="stereo")
        frame.sample_rate, frame.pts = rate, 0
        out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
    data = path.read_bytes()
    path.unlink()
    ftyp = struct.unpack(">I", data[:4])[0]
    assert data[4:8] == b"ftyp"
    if box != b"moov":
        return data[:4] + box + data[8:]
    moov = struct.unpack(">I", data[ftyp:ftyp + 4])[0]
    assert data[ftyp + 4:ftyp + 8] == b"moov"
    return data[ftyp:ftyp + moov] + data[:ftyp] + data[ftyp + moov:]


@pytest.mark.parametrize("case", ["mp3-behind-a-1.4-MiB-cover", "quicktime-starting-with-free",
                                  "quicktime-starting-with-mdat", "quicktime-starting-with-moov"])
def test_media_on_stdin_is_read_like_the_file(tmp_path, case):
    """Judged from its first MiB, stdin refused an MP3 behind a large cover and QuickTime files
    whose track list comes after the samples ("no format recognised in its first 1,048,576
    bytes"); read as a file they were fine. Now FFmpeg reads as far as the format needs."""
    data = (_mp3_behind_a_large_cover() if case.startswith("mp3")
            else _quicktime_starting_with(case.rsplit("-", 1)[1].encode(), tmp_path))
    assert len(data) > 1 << 20
    as_file = tmp_path / "in"
    as_file.write_bytes(data)
    with _stand_in():
        result = invoke("enhance", "-", tmp_path / "out.wav", "--model", "stand-in",
                        input=data)
    assert result.exit_code == 0, result.output
    assert read_info(tmp_path / "out.wav").shape == read_info(as_file).shape


def test_an_mp3_on_stdin_keeps_its_cover_tags_and_bit_rate(tmp_path, media_files):
    """Through stdin an MP3 lost its cover art, its title and its bit rate, which the file's
    path kept: it was read by libsndfile, which knows none of them."""
    source = media_files["cover"]
    with _stand_in():
        piped = invoke("enhance", "-", tmp_path / "piped.mp3", "--model", "stand-in",
                       input=source.read_bytes())
        named = invoke("enhance", source, tmp_path / "named.mp3", "--model", "stand-in")
    assert piped.exit_code == named.exit_code == 0, piped.output + named.output

    def kept(path: Path) -> tuple:
        with av.open(str(path)) as container:
            audio, cover = container.streams.audio[0], container.streams.video[0]
            pictures = [bytes(p) for p in container.demux(cover) if p.size]
            return (container.metadata.get("title"), audio.codec_context.bit_rate,
                    int(cover.disposition), pictures)

    assert kept(tmp_path / "piped.mp3") == kept(tmp_path / "named.mp3")
    title, bit_rate, disposition, pictures = kept(tmp_path / "piped.mp3")
    assert (title, bit_rate, len(pictures)) == ("speechlens test clip", 64_000, 1)
    assert disposition & av.stream.Disposition.attached_pic


# ------------------------------------------------------------ refused at planning, not after

def _two_mp3_tracks(path: Path) -> Path:
    """Matroska with two MP3 tracks (1 s at 16 kHz each)."""
    rate = 16000
    with av.open(str(path), "w", format="matroska") as out:
        tracks = [out.add_stream("libmp3lame", rate=rate, layout="mono") for _ in range(2)]
        for seed, track in enumerate(tracks):
            frame = av.AudioFrame.from_ndarray(noisy_speech(rate, 1.0, seed=seed)[None],
                                               format="flt", layout="mono")
            frame.sample_rate, frame.pts = rate, 0
            out.mux(track.encode(frame))
            out.mux(track.encode(None))
    return path


def test_two_mp3_tracks_into_mp3_are_refused_at_planning(tmp_path):
    """The mp3 muxer holds one audio track: the second one was found only when the header was
    written, after the model ran ("write failed (Invalid argument)"). Now FFmpeg's own reason,
    naming the stream, before any model."""
    source = _two_mp3_tracks(tmp_path / "two.mkv")
    result = invoke("enhance", source, tmp_path / "out.mp3", "--model", tmp_path / "none")
    assert result.exit_code == 1
    assert one_error_line(result.stderr) == (
        f"error: {tmp_path / 'out.mp3'}: a MP3 file cannot hold stream 1 (audio, mp3) of the "
        "input (Invalid audio stream. Exactly one MP3 audio stream is required.); choose "
        "another container or suffix")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["two.mkv"]


@cases(2)
def test_mp3_at_8_khz_into_mp4_is_refused_or_kept_lossless_at_planning(tmp_path):
    """The mp4 muxer refuses MP3 below 16 kHz, which showed only after the model ran ("write
    failed (Invalid argument)"). Asked for, it is refused in one line with FFmpeg's reason;
    an 8 kHz MP3 input into .mp4 becomes ALAC, announced."""
    source = tmp_path / "in.wav"
    _write_input(source, 8000, 8000, 1)
    asked = invoke("enhance", source, tmp_path / "out.mp4", "--model", tmp_path / "none",
                   "--subtype", "MP3")
    assert asked.exit_code == 2
    line = one_error_line(asked.stderr)
    assert "subtype MP3 cannot be written in a MP4 file at 8000 Hz with 1 channel(s) (track 0: " \
           "muxing mp3 at 8000hz is not standard" in line
    assert "valid here: ALAC, FLAC, PCM_S16LE, PCM_S16BE, PCM_S24LE, PCM_S24BE, PCM_S32LE, " \
           "PCM_S32BE, PCM_F32LE, PCM_F32BE, AAC, OPUS" in line
    mp3 = tmp_path / "in.mp3"
    mp3.write_bytes(_encoded(8000, 1.0, "mp3", "libmp3lame", 32_000, 1))
    with _stand_in():
        kept = invoke("enhance", mp3, tmp_path / "out.mp4", "--model", "stand-in")
    assert kept.exit_code == 0, kept.output
    assert "note: MP3 cannot be written in a MP4 file: ALAC instead" in kept.stderr
    assert read_info(tmp_path / "out.mp4").shape == read_info(mp3).shape


def test_a_rate_change_mid_stream_is_one_line_at_planning(tmp_path):
    """`cat a.mp3 b.mp3` of a 16 kHz and a 22.05 kHz file: the track changes its rate where the
    second begins. It failed after the model had started, in FFmpeg's resampler's words ("Frame
    does not match AudioResampler setup"); now the probe that counts the samples says where."""
    first = _encoded(16000, 1.23, "mp3", "libmp3lame", 64_000, 1, _BARE_MP3)
    second = _encoded(22050, 1.0, "mp3", "libmp3lame", 64_000, 2, _BARE_MP3)
    source = tmp_path / "joined.mp3"
    source.write_bytes(first + second)
    result = invoke("enhance", source, tmp_path / "out.wav", "--model", tmp_path / "none")
    assert result.exit_code == 1
    line = one_error_line(result.stderr)
    found = re.search(r"the audio track changes its sample rate at (\d+\.\d\d) s \(from 16000 "
                      r"to 22050\); speechlens needs one sample rate per track", line)
    assert found and 1.23 <= float(found[1]) < 1.35, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["joined.mp3"]
