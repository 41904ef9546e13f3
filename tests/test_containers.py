"""Containers as podcasters, journalists and camera users hand them in (issue 32, build item 1):
cover art in M4A kept, PCM in a camera's MOV/MP4 kept PCM, ADTS `.aac` and Ogg `.opus` read and
written, `--bitrate` for lossy outputs, lossy -> WAV as PCM_24, `--format` on stdout.

Every file is made in memory with PyAV (fixtures.media's speech, tests.test_reliability_inputs'
encoder) and every output read back through PyAV; the model is the tiny fixture checkpoint."""

from __future__ import annotations

import io
from pathlib import Path

import av
import numpy as np
import pytest
import soundfile as sf

from fixtures import media as made
from speechlens_cli.audio import read_info
from tests.reliability import invoke, leftovers, make_audio, one_error_line
from tests.test_media import packets, streams
from tests.test_reliability_inputs import _encoded

COVER = {"jpeg": ("mjpeg", "yuvj420p"), "png": ("png", "rgb24")}


def _m4a_with_cover(path: Path, picture: str) -> Path:
    """AAC speech, two chapters and a cover (JPEG or PNG), as Apple Music and podcast tools
    write them: FFmpeg reads the cover (an iTunes 'covr' tag) as an attached picture."""
    codec, pixels = COVER[picture]
    audio, rate = made.speech()
    with av.open(str(path), "w", format="mp4", options={"brand": "M4A "}) as out:
        out.metadata["title"] = made.TITLE
        stream = made._add_audio(out, "aac", rate, "mono", 64_000, "eng")
        out.set_chapters(made._chapters())
        cover = out.add_stream(codec)
        cover.width = cover.height = made.COVER_SIZE
        cover.pix_fmt = pixels
        cover.disposition = av.stream.Disposition.attached_pic
        stripes = np.zeros((made.COVER_SIZE, made.COVER_SIZE, 3), np.uint8)
        stripes[::2] = 255
        frame = av.VideoFrame.from_ndarray(stripes, format="rgb24").reformat(format=pixels)
        frame.pts = 0
        pictures = [*cover.encode(frame), *cover.encode(None)]
        made._encode_audio(out, stream, audio, rate)
        for packet in pictures:
            out.mux(packet)
    return path


def _camera_file(path: Path, muxer: str, pcm: str) -> Path:
    """H.264 with PCM speech, as cameras and recorders write .mov and .mp4."""
    audio, rate = made.speech()
    with av.open(str(path), "w", format=muxer) as out:
        video = made._video(out)
        stream = made._add_audio(out, pcm, rate, "mono", 0, "eng")
        made._encode_video(out, video)
        made._encode_audio(out, stream, audio, rate)
    return path


def _codec(path: Path) -> str:
    return next(s["codec"] for s in streams(path) if s["type"] == "audio")


@pytest.mark.parametrize("picture", sorted(COVER))
def test_cover_art_in_m4a_is_kept(tmp_path, tiny_checkpoint, picture):
    """Before: "'ipod' format does not support 'mjpeg'" (exit 1). The cover comes back byte for
    byte as a cover, the chapters and the M4A brand with it."""
    source = _m4a_with_cover(tmp_path / "episode.m4a", picture)
    out = tmp_path / "clean.m4a"
    result = invoke("enhance", source, out, "--model", tiny_checkpoint)
    assert result.exit_code == 0, result.output
    kinds = streams(source)
    assert streams(out) == kinds
    cover = next(i for i, s in enumerate(kinds) if s["type"] == "video")
    assert kinds[cover]["codec"] == COVER[picture][0]
    assert kinds[cover]["disposition"] & int(av.stream.Disposition.attached_pic)
    assert packets(out)[cover] == packets(source)[cover]
    with av.open(str(out)) as container:
        assert [c["metadata"]["title"] for c in container.chapters()] == ["first", "second"]
    assert out.read_bytes()[8:12] == b"M4A "
    assert read_info(out).frames == read_info(source).frames


def test_a_cover_mov_would_drop_is_refused_at_planning(tmp_path, tiny_checkpoint):
    """FFmpeg's QuickTime writer takes a cover and leaves it out of the file: before, exit 0 and
    the cover gone. Now one line naming the stream, nothing written."""
    source = _m4a_with_cover(tmp_path / "episode.m4a", "png")
    result = invoke("enhance", source, tmp_path / "clean.mov", "--model", tiny_checkpoint)
    assert result.exit_code == 1
    assert one_error_line(result.stderr) == (
        f"error: {tmp_path / 'clean.mov'}: a MOV file cannot hold stream 2 (video, png) of the "
        "input (cover art would be dropped: .m4a and .mp4 keep it); choose another container "
        "or suffix")
    assert [p.name for p in tmp_path.iterdir()] == ["episode.m4a"]


@pytest.mark.parametrize("suffix, muxer, pcm", [(".mov", "mov", "pcm_s16le"),
                                                (".mov", "mov", "pcm_s24be"),
                                                (".mp4", "mp4", "pcm_s16be")])
def test_pcm_in_a_camera_file_stays_pcm(tmp_path, tiny_checkpoint, suffix, muxer, pcm):
    """Before: ALAC (FLAC in MP4) with a note that the container cannot hold PCM. Now the same
    PCM, the picture copied packet for packet, the length exact; in MP4 the note says what
    FFmpeg writes there."""
    source = _camera_file(tmp_path / f"camera{suffix}", muxer, pcm)
    out = tmp_path / f"clean{suffix}"
    result = invoke("enhance", source, out, "--model", tiny_checkpoint)
    assert result.exit_code == 0, result.output
    assert _codec(out) == pcm
    assert packets(out)[0] == packets(source)[0]
    assert read_info(out).frames == read_info(source).frames
    notes = [line for line in result.stderr.splitlines() if line.startswith("note:")]
    assert notes == ([] if muxer == "mov" else [
        "note: PCM in an MP4 file is ISO 'ipcm', which some players and editors do not read "
        "yet (.mov holds PCM as cameras write it)"])


def test_camera_pcm_into_wav_keeps_its_width(tmp_path, tiny_checkpoint):
    """PCM_S16LE is PCM_16 in a WAV: no float, no note."""
    source = _camera_file(tmp_path / "camera.mov", "mov", "pcm_s16le")
    result = invoke("enhance", source, tmp_path / "clean.wav", "--model", tiny_checkpoint)
    assert result.exit_code == 0, result.output
    assert sf.info(str(tmp_path / "clean.wav")).subtype == "PCM_16"
    assert "note:" not in result.stderr


#: name: (input suffix, its bytes at 48 kHz for 2 s (None: a WAV), output suffix, codec)
_ADTS_OPUS = {
    "aac-to-aac": (".aac", lambda: _encoded(48000, 2.0, "adts", "aac", 64_000, 1), ".aac", "aac"),
    "wav-to-aac": (".wav", None, ".aac", "aac"),
    "opus-to-opus": (".opus", lambda: _encoded(48000, 2.0, "opus", "libopus", 32_000, 1),
                     ".opus", "opus"),
    "wav-to-opus": (".wav", None, ".opus", "opus"),
    "aac-to-wav": (".aac", lambda: _encoded(48000, 2.0, "adts", "aac", 64_000, 1), ".wav", None),
}


@pytest.mark.parametrize("name", sorted(_ADTS_OPUS))
def test_adts_aac_and_ogg_opus_are_read_and_written(tmp_path, tiny_checkpoint, name):
    """Before: an .aac input "not a readable audio file", WAV -> .opus "names no format". The
    length: Ogg Opus records it (exact); ADTS records nothing, so AAC comes back with the
    encoder's delay and its last frame's padding, at most two codec frames (2048) longer."""
    suffix, build, target, codec = _ADTS_OPUS[name]
    source = tmp_path / f"in{suffix}"
    if build is None:
        make_audio(source, 96000, rate=48000)
    else:
        source.write_bytes(build())
    out = tmp_path / f"out{target}"
    result = invoke("enhance", source, out, "--model", tiny_checkpoint)
    assert result.exit_code == 0, result.output
    wanted, got = read_info(source).frames, read_info(out).frames
    assert 0 <= got - wanted < (2048 if target == ".aac" else 1)
    if codec:
        assert _codec(out) == codec
    else:
        assert sf.info(str(out)).subtype == "PCM_24"


def test_formats_lists_aac_and_opus():
    result = invoke("formats")
    rows = {line.split()[0]: line.split()[1:] for line in result.output.splitlines()
            if line.startswith(".")}
    assert rows[".aac"] == ["ADTS", "AAC"]
    assert rows[".opus"] == ["OPUS", "OPUS"]
    assert "PCM_S16LE" in rows[".mov"]


def _kilobits(path: Path) -> float:
    """The speech track's bytes over its length: the bit rate it was encoded at."""
    audio = next(i for i, s in enumerate(streams(path)) if s["type"] == "audio")
    return 8 * sum(len(data) for *_, data in packets(path)[audio]) / read_info(path).seconds \
        / 1000


@pytest.mark.parametrize("bitrate, suffix, wanted", [("128k", ".mp3", 128), ("24000", ".opus", 24),
                                                     (None, ".m4a", 64), (None, ".opus", 32)])
def test_bitrate_of_a_lossy_output(tmp_path, tiny_checkpoint, bitrate, suffix, wanted):
    """--bitrate is what the encoder gets; without it, a WAV becomes speech at 64 kb/s a channel
    (AAC, MP3) or 32 kb/s (Opus), not 96 kb/s."""
    source = make_audio(tmp_path / "in.wav", 96000, rate=48000)
    out = tmp_path / f"out{suffix}"
    extra = ("--bitrate", bitrate) if bitrate else ("--subtype", "AAC") if suffix == ".m4a" \
        else ()
    result = invoke("enhance", source, out, "--model", tiny_checkpoint, *extra)
    assert result.exit_code == 0, result.output
    assert abs(_kilobits(out) - wanted) < 0.2 * wanted


@pytest.mark.parametrize("value", ["abc", "0", "3k", "nan", "-64k", "1e9", "64.5"])
def test_a_bitrate_that_is_no_rate_is_one_usage_line(tmp_path, value):
    """Checked before anything is read (the input does not exist) or written."""
    result = invoke("enhance", tmp_path / "none.wav", tmp_path / "out.mp3", "--bitrate", value)
    assert result.exit_code == 2
    assert one_error_line(result.stderr) == (
        f"error: --bitrate {value}: give bits per second from 6k to 512k (64000 or 64k)")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("target, error", [
    ("out.wav", "{out}: --bitrate applies to the lossy encodings FFmpeg writes (AAC, OPUS, "
                "MP3), not WAV/PCM_16; ask for one with --subtype or a suffix whose container "
                "has one (.m4a: --subtype AAC, .mp3, .opus)"),
    ("out.opus", "--bitrate 300000: OPUS cannot be encoded at that rate here (The bit rate "
                 "300000 bps is unsupported. Please choose a value between 500 and 256000.)"),
])
def test_a_bitrate_the_output_cannot_take_is_refused_at_planning(tmp_path, target, error):
    """A lossless output has no bit rate; Opus takes at most 256 kb/s a channel. Both found
    before any model loads (the model named does not exist), nothing written."""
    source = make_audio(tmp_path / "in.wav", 8000, rate=16000)
    result = invoke("enhance", source, tmp_path / target, "--bitrate", "300k", "--model",
                    tmp_path / "none")
    assert result.exit_code == 2
    assert one_error_line(result.stderr) == "error: " + error.format(out=tmp_path / target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.wav"]


@pytest.mark.parametrize("subtype, wanted", [(None, "PCM_24"), ("FLOAT", "FLOAT")])
def test_lossy_into_wav_is_24_bit_unless_float_is_asked(tmp_path, media_files, tiny_checkpoint,
                                                        subtype, wanted):
    """Before: 32-bit float, which many tools refuse."""
    extra = ("--subtype", subtype) if subtype else ()
    result = invoke("enhance", media_files["m4a"], tmp_path / "out.wav", "--model",
                    tiny_checkpoint, *extra)
    assert result.exit_code == 0, result.output
    assert sf.info(str(tmp_path / "out.wav")).subtype == wanted
    if subtype is None:
        assert "note: AAC cannot be written in a WAV file: PCM_24 instead" in result.stderr


@pytest.mark.parametrize("fmt, container", [("flac", "FLAC"), ("ogg", "OGG"), ("mp3", "mp3"),
                                            ("opus", "ogg")])
def test_format_is_honoured_on_stdout(tmp_path, tiny_checkpoint, fmt, container):
    """Before: "--format does not apply to standard output (always WAV)". The bytes on stdout
    are a file of that container, every frame there."""
    source = make_audio(tmp_path / "in.wav", 32000, rate=16000)
    result = invoke("enhance", "-", "-", "--format", fmt, "--model", tiny_checkpoint,
                    input=source.read_bytes())
    assert result.exit_code == 0, result.stderr
    if container.isupper():   # libsndfile's
        info = sf.info(io.BytesIO(result.stdout_bytes))
        assert (info.format, info.frames) == (container, 32000)
    else:
        with av.open(io.BytesIO(result.stdout_bytes)) as read:
            assert read.format.name == container
            frames = sum(f.samples for f in read.decode(audio=0))
        # Opus decodes at 48 kHz; MP3 and Opus trim to the length they record
        assert abs(frames * 16000 / (48000 if fmt == "opus" else 16000) - 32000) < 1152
    assert not leftovers(tmp_path)


def test_a_container_no_pipe_can_carry_is_refused_on_stdout(tmp_path):
    """An MP4's index comes last: a reader of the pipe could not play it."""
    source = make_audio(tmp_path / "in.wav", 8000, rate=16000)
    result = invoke("enhance", "-", "-", "--format", "m4a", "--model", tmp_path / "none",
                    input=source.read_bytes())
    assert result.exit_code == 2
    line = one_error_line(result.stderr)
    assert line.startswith("error: --format m4a: a M4A file cannot be read from a pipe (its "
                           "index comes last); on standard output use one of .aif ")
    assert " .flac " in line and " .mp4" not in line and " .mov" not in line
    assert result.stdout_bytes == b""


def test_the_python_api_takes_a_bit_rate(tmp_path, tiny_checkpoint):
    """enhance_file(bit_rate=...) is --bitrate: the encoder gets it; a rate out of range or not
    a whole number is a UsageError naming the argument, nothing written."""
    from speechlens_cli import api
    from speechlens_cli.errors import UsageError
    source = make_audio(tmp_path / "in.wav", 96000, rate=48000)
    out = tmp_path / "out.mp3"
    api.enhance_file(source, out, model=tiny_checkpoint, bit_rate=128_000)
    assert abs(_kilobits(out) - 128) < 0.2 * 128
    with pytest.raises(UsageError, match=r"^bit_rate 3000: give bits per second from 6k to 512k"):
        api.enhance_file(source, tmp_path / "low.mp3", model=tiny_checkpoint, bit_rate=3000)
    with pytest.raises(UsageError, match=r"^bit_rate must be bits per second \(an integer\)"):
        api.enhance_file(source, tmp_path / "odd.mp3", model=tiny_checkpoint, bit_rate=64.5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.wav", "out.mp3"]
