"""Phone recordings, videos and podcasts through PyAV: the speech track replaced, every other
stream copied packet for packet, metadata kept, the duration the input's (docs: within the
tolerance stated in README's "Formats"), the track chosen, the output format strict.

The files are fixtures.media's, made at test time from a real recording; the model is the tiny
fixture checkpoint."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import av
import numpy as np
import pytest
import soundfile as sf

from fixtures import media as made
from speechlens_cli.audio import read_info
from tests.reliability import invoke, leftovers, one_error_line


def packets(path: Path) -> dict[int, list[tuple]]:
    """Every stream's packets: (pts, dts, bytes), in order."""
    found: dict[int, list[tuple]] = {}
    with av.open(str(path)) as container:
        for packet in container.demux():
            if packet.size:
                found.setdefault(packet.stream.index, []).append(
                    (packet.pts, packet.dts, bytes(packet)))
    return found


def streams(path: Path) -> list[dict]:
    with av.open(str(path)) as container:
        return [{"type": s.type, "codec": getattr(s.codec_context, "name", None),
                 "language": s.metadata.get("language"), "disposition": int(s.disposition)}
                for s in container.streams]


def enhanced(source: Path, target: Path, checkpoint: Path, *extra) -> Path:
    result = invoke("enhance", source, target, "--model", checkpoint, *extra)
    assert result.exit_code == 0, result.output
    return target


def decoded(path: Path, track: int = 0) -> np.ndarray:
    """The audio track's samples, as speechlens reads them (trimmed to the recorded length)."""
    info = read_info(path, track=track)
    with av.open(str(path)) as container:
        stream = container.streams.audio[track]
        blocks = [f.to_ndarray().reshape(f.layout.nb_channels, -1).T
                  if f.format.is_planar else f.to_ndarray().reshape(-1, f.layout.nb_channels)
                  for f in container.decode(stream)]
    return np.concatenate(blocks)[:info.frames]


def test_video_streams_are_copied_and_only_the_speech_track_is_new(tmp_path, media_files,
                                                                   tiny_checkpoint):
    source = media_files["mp4"]
    out = enhanced(source, tmp_path / "clean.mp4", tiny_checkpoint)
    before, after = packets(source), packets(out)
    kinds = streams(source)
    assert streams(out) == kinds            # same streams, codecs, languages and dispositions
    video = next(i for i, s in enumerate(kinds) if s["type"] == "video")
    subtitle = next(i for i, s in enumerate(kinds) if s["type"] == "subtitle")
    speech, second = (i for i, s in enumerate(kinds) if s["type"] == "audio")
    assert after[video] == before[video]    # picture byte for byte, timestamps included
    assert after[subtitle] == before[subtitle]
    assert after[second] == before[second]  # the other audio track untouched
    assert after[speech] != before[speech]
    assert not np.allclose(decoded(out), decoded(source), atol=1e-3)


def test_cover_art_is_copied_byte_for_byte(tmp_path, media_files, tiny_checkpoint):
    source = media_files["cover"]
    out = enhanced(source, tmp_path / "clean.mp3", tiny_checkpoint)
    kinds = streams(source)
    assert streams(out) == kinds  # the picture stream keeps its attached-picture disposition
    cover = next(i for i, s in enumerate(kinds) if s["type"] == "video")
    assert kinds[cover]["disposition"] & int(av.stream.Disposition.attached_pic)
    before, after = packets(source), packets(out)
    assert after[cover] == before[cover] and len(before[cover]) == 1
    speech = next(i for i, s in enumerate(kinds) if s["type"] == "audio")
    assert after[speech] != before[speech]


def test_video_keeps_title_chapters_and_track_labels(tmp_path, media_files, tiny_checkpoint):
    out = enhanced(media_files["mp4"], tmp_path / "clean.mp4", tiny_checkpoint)
    with av.open(str(out)) as container:
        assert container.metadata["title"] == made.TITLE
        assert [c["metadata"]["title"] for c in container.chapters()] == ["first", "second"]
        audio = container.streams.audio
        assert [s.metadata.get("language") for s in audio] == ["eng", "fra"]
        assert audio[0].disposition & av.stream.Disposition.default
        assert not audio[1].disposition & av.stream.Disposition.default


@pytest.mark.parametrize("kind, codec", [("m4a", "aac"), ("webm", "opus"), ("mp3", "mp3float"),
                                         ("surround", "aac")])
def test_container_codec_rate_channels_and_length_are_kept(tmp_path, media_files,
                                                           tiny_checkpoint, kind, codec):
    """The tolerance README states: the length is exact where the container records it
    (MP4/M4A edit lists, MP3's encoder header, Opus in WebM)."""
    source = media_files[kind]
    out = enhanced(source, tmp_path / f"clean{source.suffix}", tiny_checkpoint)
    before, after = read_info(source), read_info(out)
    assert (after.format, after.subtype) == (before.format, before.subtype)
    assert (after.frames, after.sample_rate, after.channels) == \
        (before.frames, before.sample_rate, before.channels)
    assert streams(out)[0]["codec"] == codec
    with av.open(str(out)) as container:
        assert container.metadata["title"] == made.TITLE


def test_lossy_output_keeps_the_source_bit_rate(tmp_path, media_files, tiny_checkpoint):
    source = media_files["m4a"]
    out = enhanced(source, tmp_path / "clean.m4a", tiny_checkpoint)
    wanted = read_info(source).media.bit_rate
    assert abs(read_info(out).media.bit_rate - wanted) < 0.15 * wanted


def test_five_one_channels_stay_apart(tmp_path, media_files, tiny_checkpoint):
    out = enhanced(media_files["surround"], tmp_path / "clean.m4a", tiny_checkpoint)
    audio = decoded(out)
    assert audio.shape == (read_info(media_files["surround"]).frames, 6)
    assert read_info(out).media.layout == "5.1"
    assert min(np.abs(audio[:, 0] - audio[:, k]).max() for k in range(1, 6)) > 1e-3


def test_track_chooses_the_audio_track_and_keeps_the_others(tmp_path, media_files,
                                                            tiny_checkpoint):
    source = media_files["mp4"]
    out = enhanced(source, tmp_path / "second.mp4", tiny_checkpoint, "--track", "1")
    before, after = packets(source), packets(out)
    speech, second = (i for i, s in enumerate(streams(source)) if s["type"] == "audio")
    assert after[speech] == before[speech]
    assert after[second] != before[second]


def test_a_track_that_is_not_there_is_a_usage_error(tmp_path, media_files, tiny_checkpoint):
    result = invoke("enhance", media_files["m4a"], tmp_path / "o.m4a", "--model",
                    tiny_checkpoint, "--track", "2")
    assert result.exit_code == 2
    assert "has no audio track 2 (its 1 audio track(s) are numbered 0-0)" in \
        one_error_line(result.stderr)


def test_a_file_without_audio_is_one_clear_error(tmp_path, tiny_checkpoint):
    silent = tmp_path / "picture.mp4"
    with av.open(str(silent), "w") as out:
        video = made._video(out)
        made._encode_video(out, video)
    result = invoke("enhance", silent, tmp_path / "o.mp4", "--model", tiny_checkpoint)
    assert result.exit_code == 1
    assert one_error_line(result.stderr) == f"error: {silent}: has no audio track"


@pytest.mark.parametrize("suffix, codec", [(".wav", None), (".flac", None), (".webm", "opus"),
                                           (".mkv", "aac")])
def test_media_to_another_container(tmp_path, media_files, tiny_checkpoint, suffix, codec):
    """m4a -> WAV/FLAC decodes; -> WebM re-encodes as Opus (AAC cannot go there, announced);
    -> MKV keeps AAC. Lengths stay within one codec frame (AAC in Matroska records none)."""
    source = media_files["m4a"]
    result = invoke("enhance", source, tmp_path / f"o{suffix}", "--model", tiny_checkpoint)
    assert result.exit_code == 0, result.output
    info, wanted = read_info(tmp_path / f"o{suffix}"), read_info(source)
    seconds = info.frames / info.sample_rate
    assert abs(seconds - wanted.seconds) <= (1024 / wanted.sample_rate if suffix == ".mkv"
                                             else 0)
    if codec:
        assert streams(tmp_path / f"o{suffix}")[0]["codec"] == codec
    if suffix == ".webm":
        assert "note: AAC cannot be written in a WEBM file: OPUS instead" in result.stderr


def test_a_stream_the_container_cannot_hold_is_refused_at_planning(tmp_path, media_files):
    """The video's mov_text subtitle cannot go into Matroska: one line naming the stream, before
    any model is loaded (the model named here does not exist), nothing written; in a batch the
    other file is still planned (--dry-run)."""
    source = media_files["mp4"]
    result = invoke("enhance", source, tmp_path / "o.mkv", "--model", tmp_path / "none")
    assert result.exit_code == 1
    assert one_error_line(result.stderr) == (
        f"error: {tmp_path / 'o.mkv'}: a MKV file cannot hold stream 3 (subtitle, mov_text) of "
        "the input ('matroska' format does not support 'mov_text' codec); choose another "
        "container or suffix")
    assert list(tmp_path.iterdir()) == []
    batch = invoke("enhance", source, media_files["m4a"], "-o", tmp_path / "out", "--format",
                   "mkv", "--dry-run", "--json", "--model", tmp_path / "none")
    assert batch.exit_code == 3
    assert [json.loads(line)["status"] for line in batch.stdout.splitlines()] == \
        ["failed", "planned"]


@pytest.mark.parametrize("kind, suffix", [("m4a", ".wav"), ("webm", ".wav"), ("m4a", ".m4a")])
def test_media_on_stdin(tmp_path, media_files, tiny_checkpoint, kind, suffix):
    """Phone memo or web call bytes piped in: read through PyAV like the file, every sample
    there; into .m4a the AAC stays AAC."""
    source = media_files[kind]
    target = tmp_path / f"out{suffix}"
    result = invoke("enhance", "-", target, "--model", tiny_checkpoint,
                    input=source.read_bytes())
    assert result.exit_code == 0, result.output
    wanted, got = read_info(source), read_info(target)
    assert (got.frames, got.sample_rate, got.channels) == \
        (wanted.frames, wanted.sample_rate, wanted.channels)
    if suffix == ".m4a":
        assert got.subtype == "AAC"


def test_wav_to_m4a_is_lossless_alac_and_announced(tmp_path, tiny_checkpoint):
    audio, rate = made.speech()
    sf.write(tmp_path / "in.wav", audio, rate, subtype="PCM_16")
    result = invoke("enhance", tmp_path / "in.wav", tmp_path / "o.m4a", "--model",
                    tiny_checkpoint)
    assert result.exit_code == 0, result.output
    assert "note: PCM_16 cannot be written in a M4A file: ALAC instead" in result.stderr
    assert streams(tmp_path / "o.m4a")[0]["codec"] == "alac"
    assert read_info(tmp_path / "o.m4a").frames == len(audio)


def test_a_name_that_is_not_utf8_is_read_and_written(tmp_path, media_files, tiny_checkpoint):
    source = Path(os.fsdecode(bytes(tmp_path) + b"/caf\xe9.m4a"))
    shutil.copy(media_files["m4a"], source)
    out = Path(os.fsdecode(bytes(tmp_path) + b"/clean\xe9.m4a"))
    enhanced(source, out, tiny_checkpoint)
    assert read_info(out).frames == read_info(source).frames


def test_a_failed_media_write_leaves_nothing(tmp_path, media_files, tiny_checkpoint,
                                             monkeypatch):
    """Muxing fails after the first encoded block: one line naming the output, no output and
    no temporary file left."""
    from speechlens_cli.audio.write import remux

    def failing(self, seconds):
        raise av.error.InvalidDataError(1094995529, "Invalid data found")

    monkeypatch.setattr(remux.MediaSink, "_copy_until", failing)
    result = invoke("enhance", media_files["mp4"], tmp_path / "o.mp4", "--model",
                    tiny_checkpoint)
    assert result.exit_code == 1
    assert "o.mp4:" in one_error_line(result.stderr)
    assert not (tmp_path / "o.mp4").exists() and not leftovers(tmp_path)


def test_a_folder_of_media_is_a_batch(tmp_path, media_files, tiny_checkpoint):
    folder = tmp_path / "in"
    folder.mkdir()
    for kind in ("m4a", "mp3"):
        shutil.copy(media_files[kind], folder)
    result = invoke("enhance", folder, tmp_path / "out", "--model", tiny_checkpoint, "-q")
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["memo.m4a", "podcast.mp3"]


_LOADS_PYAV = """
import sys
from speechlens_cli.__main__ import main
main(sys.argv[1:], standalone_mode=False)
print("av" in sys.modules)
"""


@pytest.mark.parametrize(("kind", "suffix", "loaded"), [("wav", ".flac", False),
                                                         ("m4a", ".m4a", True)])
def test_pyav_is_imported_only_for_media_files(tmp_path, audio_dir, media_files,
                                               tiny_checkpoint, kind, suffix, loaded):
    """PyAV's import costs a run 50-200 ms: a WAV to FLAC run never pays it, a media file does."""
    source = audio_dir / "mono_16000_pcm24.wav" if kind == "wav" else media_files[kind]
    run = subprocess.run(
        [sys.executable, "-c", _LOADS_PYAV, "enhance", "--model", str(tiny_checkpoint), "-q",
         str(source), str(tmp_path / f"out{suffix}")],
        capture_output=True, text=True, check=True)
    assert run.stdout.strip().splitlines()[-1] == str(loaded)
    assert (tmp_path / f"out{suffix}").is_file()
