"""`speechlens enhance --residual PATH|SUFFIX`: what was removed, the input minus the output, sample
for sample aligned with both, written by the output's rules (the other stem, as demucs gives)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import soundfile as sf

from tests.reliability import invoke, leftovers, make_audio, one_error_line

SECONDS = 1.5


def _enhance(tiny_checkpoint, *args):
    return invoke("enhance", *args, "--model", tiny_checkpoint, "--device", "cpu")


@pytest.mark.parametrize("chunk", [None, "5"])
def test_the_residual_is_the_input_minus_the_output(tmp_path, tiny_checkpoint, on_cpu, chunk):
    """Float samples: input = output + residual exactly, one window or several cross-faded (a
    file longer than the 5-s windows)."""
    seconds = 12 if chunk else SECONDS
    source = make_audio(tmp_path / "in.wav", int(seconds * 16000), subtype="FLOAT")
    windows = ("--chunk-seconds", chunk) if chunk else ()
    result = _enhance(tiny_checkpoint, source, tmp_path / "out.wav", "--residual",
                      tmp_path / "removed.wav", *windows)
    assert result.exit_code == 0, result.output
    original, _ = sf.read(source, dtype="float32")
    enhanced, _ = sf.read(tmp_path / "out.wav", dtype="float32")
    removed, rate = sf.read(tmp_path / "removed.wav", dtype="float32")
    assert rate == sf.info(source).samplerate
    assert sf.info(tmp_path / "removed.wav").subtype == "FLOAT"
    assert len(removed) == len(original)
    np.testing.assert_array_equal(removed, original - enhanced)
    assert np.abs(removed).max() > 0


def test_pcm_outputs_add_up_to_the_input_within_their_rounding(tmp_path, tiny_checkpoint,
                                                                on_cpu):
    source = make_audio(tmp_path / "in.wav", int(SECONDS * 16000), channels=2)
    result = _enhance(tiny_checkpoint, source, tmp_path / "out.wav", "--residual",
                      tmp_path / "removed.flac")
    assert result.exit_code == 0, result.output
    info = sf.info(tmp_path / "removed.flac")
    assert (info.format, info.subtype, info.channels) == ("FLAC", "PCM_16", 2)
    original = sf.read(source)[0]
    total = sf.read(tmp_path / "out.wav")[0] + sf.read(tmp_path / "removed.flac")[0]
    assert np.abs(total - original).max() <= 2 / 32768


def test_no_attenuation_leaves_a_silent_residual(tmp_path, tiny_checkpoint, on_cpu):
    source = make_audio(tmp_path / "in.wav", int(SECONDS * 16000))
    result = _enhance(tiny_checkpoint, source, tmp_path / "out.wav", "--atten-lim", "0",
                      "--residual", "_removed")
    assert result.exit_code == 0, result.output
    assert not np.any(sf.read(tmp_path / "out_removed.wav")[0])


@pytest.mark.parametrize("residual, kilobits", [("_removed", 32), ("removed.wav", None)])
def test_bitrate_applies_to_a_lossy_residual_as_to_the_output(tmp_path, tiny_checkpoint,
                                                               residual, kilobits):
    """A lossy residual (beside out.mp3: an MP3) is encoded at --bitrate; a lossless one takes
    none, and is no reason to refuse the option."""
    import av

    source = make_audio(tmp_path / "in.wav", 96000, rate=48000)
    result = _enhance(tiny_checkpoint, source, tmp_path / "out.mp3", "--bitrate", "32k",
                      "--residual", tmp_path / residual if kilobits is None else residual)
    assert result.exit_code == 0, result.output
    if kilobits is None:
        assert sf.info(tmp_path / residual).subtype == "PCM_16"
        return
    with av.open(str(tmp_path / "out_removed.mp3")) as container:
        rate = container.streams.audio[0].codec_context.bit_rate
    assert abs(rate / 1000 - kilobits) < 0.2 * kilobits


def test_a_suffix_writes_each_residual_beside_its_output(tmp_path, tiny_checkpoint, on_cpu):
    sources = [make_audio(tmp_path / "in" / name, 8000, seed=i)
               for i, name in enumerate(("a.wav", "b.wav"))]
    result = _enhance(tiny_checkpoint, *sources, "-o", tmp_path / "out", "--residual", "_removed",
                      "--json")
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [line["residual"] for line in lines] == [str(tmp_path / "out" / "a_removed.wav"),
                                                   str(tmp_path / "out" / "b_removed.wav")]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "a.wav", "a_removed.wav", "b.wav", "b_removed.wav"]


@pytest.mark.parametrize("case, args, line", [
    ("a path for a batch", ("a.wav", "b.wav", "-o", "out", "--residual", "removed.wav"),
     "error: --residual removed.wav: names one file, and this run writes several outputs; give "
     "a SUFFIX (e.g. _removed) to write each beside its output"),
    ("a suffix beside stdout", ("a.wav", "-", "--residual", "_removed"),
     "error: --residual _removed: a SUFFIX goes beside the output, which is stdout here; give "
     "the residual a file name (e.g. removed.wav)"),
    ("the output itself", ("a.wav", "out.wav", "--residual", "out.wav"),
     "error: out.wav: is the output itself; the residual needs its own name"),
    ("the input itself", ("a.wav", "out.wav", "--residual", "a.wav"),
     "error: a.wav: is the input itself; choose another output"),
    ("a suffix that is a name", ("a.wav", "out.wav", "--residual", ""),
     "error: --residual: '' must be part of a file name: not empty, no '/', no NUL"),
])
def test_a_residual_that_cannot_be_is_one_line_before_any_work(tmp_path, tiny_checkpoint,
                                                               monkeypatch, case, args, line):
    monkeypatch.chdir(tmp_path)
    make_audio(tmp_path / "a.wav", 8000)
    make_audio(tmp_path / "b.wav", 8000)
    before = sorted(p.name for p in tmp_path.iterdir())
    result = _enhance(tiny_checkpoint, *args)
    assert result.exit_code == 2, result.output
    assert one_error_line(result.stderr) == line
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_an_existing_residual_fails_the_file_and_writes_nothing(tmp_path, tiny_checkpoint):
    source = make_audio(tmp_path / "in.wav", 8000)
    (tmp_path / "removed.wav").write_bytes(b"keep")
    result = _enhance(tiny_checkpoint, source, tmp_path / "out.wav", "--residual",
                      tmp_path / "removed.wav")
    assert result.exit_code == 1
    assert one_error_line(result.stderr) == (
        f"error: {tmp_path / 'removed.wav'}: already exists (use --overwrite to replace it or "
        "--skip-existing to keep it)")
    assert (tmp_path / "removed.wav").read_bytes() == b"keep"
    assert not (tmp_path / "out.wav").exists() and not leftovers(tmp_path)
