"""The `speechlens` command: files, folders, stdin/stdout, safety, exit codes, models, doctor.

Audio here is short (a few hundred samples at 8 kHz, one window at the CLI's 5-s minimum) and
the model is the tiny fixture checkpoint passed with --model, so a model run costs ~0.2 s.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import platform
import re
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
import soundfile as sf
from click.testing import CliRunner

from speechlens_cli import api, blas, checkpoint, cli, kernels
from speechlens_cli.audio import AudioInfo, OutputFormat
from speechlens_cli.cli import interrupts, main
from speechlens_cli.cli.reporting import ProgressDisplay
from speechlens_cli.errors import UsageError
from speechlens_cli.synthetic.checkpoints import TINY_CONFIG, write_checkpoint
from speechlens_cli.synthetic.speech import noisy_speech
from tests.reliability import make_audio
from tests.test_score import needs_extra

RATE = 8000
COLOR_CODE = re.compile(r"\x1b\[(3\d|9\d)m")  # a foreground colour, not bold or cursor moves


def invoke(*args, **kwargs):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False, **kwargs)


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def leftovers(root: Path) -> list[Path]:
    """Temporary outputs anywhere under `root` (there must never be any after a run)."""
    return list(root.rglob("*.partial"))


def one_error_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


@pytest.fixture
def tree(tmp_path) -> Path:
    """in/ with nested folders: three good files (mono PCM16, stereo FLAC 24, mono float), one
    damaged .wav and one text file."""
    root = tmp_path / "in"
    make_audio(root / "a.wav", 400, seed=1)
    make_audio(root / "sub" / "b.flac", 450, channels=2, subtype="PCM_24", fmt="FLAC", seed=2)
    make_audio(root / "sub" / "deeper" / "c.wav", 500, subtype="FLOAT", seed=3)
    (root / "sub" / "corrupt.wav").write_bytes(b"RIFF\x24\x00\x00\x00WAVEfmt not really")
    (root / "notes.txt").write_text("not audio\n")
    return root


@pytest.fixture
def load_count(monkeypatch) -> list[int]:
    """How many times a model gets loaded (the real loader still runs)."""
    calls = [0]
    real = checkpoint.load_model

    def counting(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(checkpoint, "load_model", counting)
    return calls


# ------------------------------------------------------------------------------ one file

def test_file_to_file_keeps_format_and_prints_json(tmp_path, tiny_checkpoint):
    src = make_audio(tmp_path / "in.wav", 500, channels=2, subtype="PCM_24")
    dst = tmp_path / "out.wav"
    result = invoke("enhance", src, dst, "--model", tiny_checkpoint, "--json")
    assert result.exit_code == 0, result.output
    (record,) = json_lines(result.stdout)
    assert record["status"] == "done" and record["frames"] == 500 and record["channels"] == 2
    info = sf.info(str(dst))
    assert (info.frames, info.channels, info.samplerate, info.subtype) == (500, 2, RATE, "PCM_24")
    assert not leftovers(tmp_path)


def test_progress_is_off_without_a_terminal(tmp_path, tiny_checkpoint):
    """CliRunner's stderr is not a TTY: the only output is the one-line result."""
    src = make_audio(tmp_path / "in.wav")
    result = invoke("enhance", src, tmp_path / "out.wav", "--model", tiny_checkpoint)
    assert result.exit_code == 0
    assert result.stderr.startswith("enhanced ") and result.stderr.count("\n") == 1
    assert "\x1b" not in result.stderr and "\r" not in result.stderr


def test_quiet_prints_nothing_and_overwrite_replaces(tmp_path, tiny_checkpoint):
    src = make_audio(tmp_path / "in.wav")
    dst = tmp_path / "out.wav"
    dst.write_bytes(b"old")
    result = invoke("enhance", src, dst, "--model", tiny_checkpoint, "--overwrite", "-q")
    assert result.exit_code == 0
    assert result.stderr == "" and result.stdout == ""
    assert sf.info(str(dst)).frames == 400


def test_stdin_to_stdout(tmp_path, tiny_checkpoint):
    src = make_audio(tmp_path / "in.wav", 450, subtype="PCM_24")
    result = invoke("enhance", "-", "-", "--model", tiny_checkpoint, "-q",
                    input=src.read_bytes())
    assert result.exit_code == 0, result.stderr
    data, rate = sf.read(io.BytesIO(result.stdout_bytes), dtype="float32")
    info = sf.info(io.BytesIO(result.stdout_bytes))
    assert (len(data), rate, info.format, info.subtype) == (450, RATE, "WAV", "PCM_24")


def test_options_reach_the_pipeline(tmp_path, tiny_checkpoint, monkeypatch):
    """--strict-mode reaches the model, --subtype changes the encoding, --device cpu runs."""
    from speechlens_cli import api

    seen = []
    real = api.enhance_channels
    monkeypatch.setattr(api, "enhance_channels",
                        lambda model, audio, rate, strict: seen.append(strict) or
                        real(model, audio, rate, strict))
    src = make_audio(tmp_path / "in.wav")
    result = invoke("enhance", src, tmp_path / "out.wav", "--model", tiny_checkpoint,
                    "--strict-mode", "--subtype", "float", "--device", "cpu")
    assert result.exit_code == 0, result.stderr
    assert seen == [True]
    assert sf.info(str(tmp_path / "out.wav")).subtype == "FLOAT"


def test_streamed_wav_from_a_pipe_is_accepted(tmp_path, tiny_checkpoint):
    """Writers that cannot seek (ffmpeg to a pipe) leave 0xFFFFFFFF as the data size: that is
    not truncation."""
    raw = bytearray(make_audio(tmp_path / "in.wav", 400).read_bytes())
    data = raw.find(b"data")
    raw[4:8] = raw[data + 4:data + 8] = struct.pack("<I", 0xFFFFFFFF)
    result = invoke("enhance", "-", tmp_path / "out.wav", "--model", tiny_checkpoint,
                    input=bytes(raw))
    assert result.exit_code == 0, result.stderr
    assert sf.info(str(tmp_path / "out.wav")).frames == 400


def test_suffix_names_the_container(tmp_path, tiny_checkpoint):
    """in.wav -> out.flac writes FLAC (PCM_16 kept: FLAC holds it)."""
    src = make_audio(tmp_path / "in.wav")
    result = invoke("enhance", src, tmp_path / "out.flac", "--model", tiny_checkpoint)
    assert result.exit_code == 0
    info = sf.info(str(tmp_path / "out.flac"))
    assert (info.format, info.subtype, info.frames) == ("FLAC", "PCM_16", 400)


def test_file_into_a_folder_keeps_its_name(tmp_path, tiny_checkpoint):
    src = make_audio(tmp_path / "in.wav")
    (tmp_path / "out").mkdir()
    result = invoke("enhance", src, tmp_path / "out", "--model", tiny_checkpoint)
    assert result.exit_code == 0
    assert sf.info(str(tmp_path / "out" / "in.wav")).frames == 400
    missing = invoke("enhance", src, f"{tmp_path / 'nowhere'}/", "--model", tiny_checkpoint)
    assert missing.exit_code == 1 and "nowhere: output folder does not exist" in \
        one_error_line(missing)


# ------------------------------------------------------------------------------ batches

def test_batch_finishes_the_others_then_resumes_without_redoing(tmp_path, tree, tiny_checkpoint,
                                                                load_count):
    out = tmp_path / "out"
    result = invoke("enhance", tree, out, "--model", tiny_checkpoint, "--json")
    assert result.exit_code == 3
    records = {Path(r["input"]).name: r for r in json_lines(result.stdout)}
    assert {name: r["status"] for name, r in records.items()} == {
        "a.wav": "done", "b.flac": "done", "c.wav": "done", "corrupt.wav": "failed",
        "notes.txt": "not-audio"}
    assert "corrupt.wav" in records["corrupt.wav"]["error"]
    assert load_count[0] == 1
    for name in ("a.wav", "sub/b.flac", "sub/deeper/c.wav"):
        before, after = sf.info(str(tree / name)), sf.info(str(out / name))
        assert (after.format, after.subtype, after.channels, after.frames, after.samplerate) == \
            (before.format, before.subtype, before.channels, before.frames, before.samplerate)
    assert not (out / "sub" / "corrupt.wav").exists() and not (out / "notes.txt").exists()
    assert not leftovers(tmp_path)
    failure = f"error: {records['corrupt.wav']['error']}"
    assert failure.startswith(f"error: {tree / 'sub' / 'corrupt.wav'}: ")
    assert result.stderr.splitlines().count(failure) == 1   # once, not again in the summary
    assert result.stderr.count("corrupt.wav") == 1
    assert f"skipped, not audio: {tree / 'notes.txt'}" in result.stderr
    assert result.stderr.strip().splitlines()[-1] == "error: 1 of 4 files failed (listed above)"

    stamps = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    again = invoke("enhance", tree, out, "--model", tmp_path / "no-such-model", "--json",
                   "--skip-existing")
    assert again.exit_code == 3  # the damaged file still fails; no model was needed
    statuses = {Path(r["input"]).name: r["status"] for r in json_lines(again.stdout)}
    assert statuses == {"a.wav": "skipped", "b.flac": "skipped", "c.wav": "skipped",
                        "corrupt.wav": "failed", "notes.txt": "not-audio"}
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()} == stamps
    assert load_count[0] == 1


def test_quiet_batch_still_names_each_failure_once(tmp_path, tree, tiny_checkpoint):
    """-q is "errors only": the failed file's line and the batch's verdict, nothing else."""
    result = invoke("enhance", tree, tmp_path / "out", "--model", tiny_checkpoint, "-q")
    assert result.exit_code == 3
    failure, verdict = result.stderr.strip().splitlines()
    assert failure.startswith(f"error: {tree / 'sub' / 'corrupt.wav'}: not a readable audio")
    assert verdict == "error: 1 of 4 files failed (listed above)"


def test_batch_time_remaining_follows_audio_seconds_not_files():
    """After a 1 s file of a batch of 1 s + 9 s, a tenth is done, not a half; the estimate of
    the time left (Rich's TimeRemainingColumn on the batch bar) follows from that. The next file
    starts on the model while the last one is written: both bars show until the first is
    reported, and the batch counts each file's audio once."""
    display = ProgressDisplay(quiet=True, batch=True, total=2)

    def plan(seconds: int, name: str) -> api.FilePlan:
        return api.FilePlan(Path(name), Path("y.wav"), AudioInfo(seconds * RATE, RATE, 1,
                            "WAV", "PCM_16"), OutputFormat("WAV", "PCM_16"), False, name)

    display.batch_seconds(10.0)
    batch = display.progress.tasks[display.files]
    display.file_progress(plan(1, "a.wav"))(RATE)
    second = display.file_progress(plan(9, "b.wav"))
    second(RATE * 3)
    assert batch.completed == 4.0 and len(display.progress.tasks) == 3
    display.file_finished(1, "a.wav")
    assert (batch.completed, batch.total, batch.fields["shown"]) == (4.0, 10.0, "1/2 files")
    assert [task.description for task in display.progress.tasks] == ["batch", "b.wav"]
    second(RATE * 9 // 2)
    assert batch.completed == 5.5


def test_atten_lim_reaches_the_file_and_the_api(tmp_path, tiny_checkpoint):
    """--atten-lim 0 gives the input back sample for sample (so does the API's in-memory
    enhance); a negative limit is a usage error in one line."""
    src = make_audio(tmp_path / "in.wav", 900)
    result = invoke("enhance", src, tmp_path / "out.wav", "--model", tiny_checkpoint,
                    "--atten-lim", "0")
    assert result.exit_code == 0, result.output
    original = sf.read(str(src), dtype="int16")[0]
    np.testing.assert_array_equal(sf.read(str(tmp_path / "out.wav"), dtype="int16")[0], original)
    audio = sf.read(str(src), dtype="float32")[0]
    np.testing.assert_array_equal(api.enhance(audio, RATE, model=tiny_checkpoint,
                                              atten_lim_db=0.0), audio)
    refused = invoke("enhance", src, tmp_path / "other.wav", "--atten-lim", "-3")
    assert refused.exit_code == 2
    assert one_error_line(refused).startswith("error: attenuation limit -3 dB")


def test_batch_without_failures_exits_0(tmp_path, tiny_checkpoint):
    make_audio(tmp_path / "in" / "x" / "one.wav")
    result = invoke("enhance", tmp_path / "in", tmp_path / "out", "--model", tiny_checkpoint)
    assert result.exit_code == 0
    assert (tmp_path / "out" / "x" / "one.wav").is_file()
    assert "1 done" in result.stderr


def test_several_inputs_into_one_folder(tmp_path, tiny_checkpoint):
    """Files and folders with -o (a folder keeps its name); a second input with the same output
    name fails, not clobbers."""
    one = make_audio(tmp_path / "a" / "same.wav", seed=1)
    two = make_audio(tmp_path / "b" / "same.wav", seed=2)
    make_audio(tmp_path / "folder" / "inner.wav", seed=3)
    out = tmp_path / "out"
    result = invoke("enhance", one, two, tmp_path / "folder", "-o", out, "--model",
                    tiny_checkpoint, "--json")
    assert result.exit_code == 3
    statuses = [r["status"] for r in json_lines(result.stdout)]
    assert statuses == ["done", "failed", "done"]
    assert "also the output of another input" in result.stdout
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*.wav")) == \
        ["folder/inner.wav", "same.wav"]


def test_dry_run_writes_nothing_and_loads_no_model(tmp_path, load_count):
    make_audio(tmp_path / "in" / "a.wav", 400)
    make_audio(tmp_path / "in" / "sub" / "b.wav", 480, channels=2)
    before = sorted(tmp_path.rglob("*"))
    out = tmp_path / "out"
    result = invoke("enhance", tmp_path / "in", out, "--dry-run", "--json",
                    "--model", tmp_path / "no-such-model")
    assert result.exit_code == 0, result.output
    records = json_lines(result.stdout)
    assert [(r["status"], r["frames"], r["channels"], r["sample_rate"]) for r in records] == \
        [("planned", 400, 1, RATE), ("planned", 480, 2, RATE)]
    assert records[1]["output"] == str(out / "sub" / "b.wav")
    assert sorted(tmp_path.rglob("*")) == before and not out.exists()
    assert load_count[0] == 0
    plain = invoke("enhance", tmp_path / "in", out, "--dry-run", "--model", "unused")
    assert f"-> {out / 'a.wav'}: 8000 Hz, 1 ch, 0.05 s, WAV/PCM_16" in plain.stdout


# Re-runs, resumes and mistakes a batch meets (issue 32, build item 4)

def _stamps(root: Path) -> dict[Path, int]:
    return {p: p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()}


def test_a_suffix_rerun_leaves_its_own_outputs_alone(tmp_path, tiny_checkpoint):
    """`enhance *.wav --suffix _clean` run again: the glob now matches a_clean.wav too, which
    became a_clean_clean.wav (and the done files errors, exit 3). Now the outputs of the first
    run are skipped by name, the done ones reported as exists: exit 0, nothing written."""
    inputs = [make_audio(tmp_path / f"{name}.wav", seed=seed) for seed, name in enumerate("ab")]
    first = invoke("enhance", *inputs, "--suffix", "_clean", "--model", tiny_checkpoint)
    assert first.exit_code == 0, first.output
    stamps = _stamps(tmp_path)
    again = invoke("enhance", *sorted(tmp_path.glob("*.wav")), "--suffix", "_clean", "--json",
                   "--model", tmp_path / "no-such-model")
    assert again.exit_code == 0, again.output
    reasons = {Path(r["input"]).name: (r["status"], r["reason"]) for r in json_lines(again.stdout)}
    assert reasons == {
        "a.wav": ("skipped", "exists (--overwrite replaces it)"),
        "b.wav": ("skipped", "exists (--overwrite replaces it)"),
        "a_clean.wav": ("skipped", "its name ends in _clean: an output, not enhanced again"),
        "b_clean.wav": ("skipped", "its name ends in _clean: an output, not enhanced again")}
    assert again.stderr.splitlines()[0] == ("note: 2 of the inputs already end in _clean "
                                            "(outputs of an earlier run): left alone")
    assert _stamps(tmp_path) == stamps   # no a_clean_clean.wav, nothing rewritten
    alone = invoke("enhance", tmp_path / "a_clean.wav", "--suffix", "_clean")   # not a batch
    assert alone.exit_code == 0 and alone.stderr.startswith("note: 1 of the inputs"), alone.output


def test_a_rerun_batch_reports_exists_unless_asked_to_fail(tmp_path, tree, tiny_checkpoint):
    """A finished batch run again: every done file was an error (exit 3). Now each is a skip
    that says how to replace it, exit 0 when nothing else failed; --fail-existing keeps the
    strict answer (exit 3, each existing output one error line)."""
    (tree / "sub" / "corrupt.wav").unlink()
    out = tmp_path / "out"
    assert invoke("enhance", tree, out, "--model", tiny_checkpoint).exit_code == 0
    stamps = _stamps(out)
    again = invoke("enhance", tree, out, "--model", tmp_path / "no-such-model", "--json")
    assert again.exit_code == 0, again.output
    assert [(r["status"], r.get("reason")) for r in json_lines(again.stdout)] == \
        [("skipped", "exists (--overwrite replaces it)")] * 3 + \
        [("not-audio", "not an audio file")]
    strict = invoke("enhance", tree, out, "--model", tmp_path / "no-such-model",
                    "--fail-existing", "-q")
    assert strict.exit_code == 3
    *failures, verdict = strict.stderr.strip().splitlines()
    assert len(failures) == 3 and all("already exists (use --overwrite" in f for f in failures)
    assert verdict == "error: 3 of 3 files failed (listed above)"
    both = invoke("enhance", tree, out, "--fail-existing", "--skip-existing")
    assert both.exit_code == 2
    assert "--skip-existing and --fail-existing contradict" in one_error_line(both)
    assert _stamps(out) == stamps
    replaced = invoke("enhance", tree, out, "--model", tiny_checkpoint, "--overwrite", "--json")
    assert replaced.exit_code == 0, replaced.output
    assert [r["status"] for r in json_lines(replaced.stdout)] == ["done"] * 3 + ["not-audio"]


def test_a_dry_run_refuses_what_the_real_run_would(tmp_path, tiny_checkpoint):
    """A 10-ms file was "planned" by --dry-run and failed in the real run: the dry run now makes
    the length check too (with the checkpoint's configuration, its weights never loaded)."""
    make_audio(tmp_path / "in" / "long-enough.wav", 400)
    make_audio(tmp_path / "in" / "ten-ms.wav", RATE // 100)
    out = tmp_path / "out"
    for model in (tiny_checkpoint, tmp_path / "no-such-model"):   # official config if absent
        result = invoke("enhance", tmp_path / "in", out, "--dry-run", "--json", "-q",
                        "--model", model)
        assert result.exit_code == 3, result.output
        assert [r["status"] for r in json_lines(result.stdout)] == ["planned", "failed"]
        assert result.stderr.strip().splitlines()[0] == (
            f"error: {tmp_path / 'in' / 'ten-ms.wav'}: too short (80 samples; one STFT frame "
            "needs 320 at 8000 Hz)")
    alone = invoke("enhance", tmp_path / "in" / "ten-ms.wav", tmp_path / "x.wav", "--dry-run",
                   "--model", tiny_checkpoint)
    assert alone.exit_code == 1 and "ten-ms.wav: too short" in one_error_line(alone)
    assert not out.exists() and not (tmp_path / "x.wav").exists()


def test_a_folder_into_an_audio_file_name_is_a_usage_error(tmp_path, tiny_checkpoint):
    """`enhance folder out/x.wav` made a folder named x.wav; a name with a trailing slash, or a
    folder of that name already there, still says "folder"."""
    make_audio(tmp_path / "in" / "a.wav")
    result = invoke("enhance", tmp_path / "in", tmp_path / "out" / "x.wav",
                    "--model", tiny_checkpoint)
    assert result.exit_code == 2
    assert one_error_line(result) == (
        f"error: {tmp_path / 'out' / 'x.wav'}: names an audio file, but {tmp_path / 'in'} is a "
        "folder; give an output folder")
    assert not (tmp_path / "out").exists()
    meant = invoke("enhance", tmp_path / "in", f"{tmp_path / 'out' / 'x.wav'}/",
                   "--model", tiny_checkpoint)
    assert meant.exit_code == 0 and (tmp_path / "out" / "x.wav" / "a.wav").is_file()


def test_several_folders_into_one_keep_their_names(tmp_path, tiny_checkpoint):
    """`enhance dirA dirB -o out` flattened both into out/ (dirB's a.wav then failed as "also
    the output of another input"); now out/dirA/... and out/dirB/..., as cp -r does. Two
    folders of one name would mix: a usage error before any work."""
    for seed, folder in enumerate(("dirA", "dirB")):
        make_audio(tmp_path / folder / "a.wav", seed=seed)
    out = tmp_path / "out"
    result = invoke("enhance", tmp_path / "dirA", tmp_path / "dirB", "-o", out,
                    "--model", tiny_checkpoint)
    assert result.exit_code == 0, result.output
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*.wav")) == \
        ["dirA/a.wav", "dirB/a.wav"]
    make_audio(tmp_path / "other" / "dirA" / "b.wav")
    twins = invoke("enhance", tmp_path / "dirA", tmp_path / "other" / "dirA", "-o",
                   tmp_path / "out2", "--model", tiny_checkpoint)
    assert twins.exit_code == 2 and "has the name of" in one_error_line(twins)
    assert not (tmp_path / "out2").exists()


# Messages (issue 32, build item 5)

def test_a_terminal_on_stdout_is_refused_for_audio(tmp_path):
    """`enhance in.wav -` on a terminal dumped binary WAV on it; now one usage line before the
    model (a missing one is never looked at) and nothing written."""
    controller, terminal = os.openpty()
    try:
        result = subprocess.run(
            [sys.executable, "-c", _CHILD, "enhance", str(make_audio(tmp_path / "in.wav")), "-",
             "--model", str(tmp_path / "no-such-model")],
            stdout=terminal, stderr=subprocess.PIPE, text=True, timeout=120, check=False)
    finally:
        os.close(terminal)
        os.close(controller)
    assert result.returncode == 2, result.stderr
    assert one_error_line(result) == ("error: <stdout>: is a terminal, which cannot show audio; "
                                      "redirect it (> out.wav) or name an output file")


def test_a_rate_above_the_trained_range_is_announced(tmp_path, tiny_checkpoint):
    """96 kHz ran silently outside the 8-48 kHz the model was trained on: one note per rate."""
    for name in ("a", "b"):
        make_audio(tmp_path / "in" / f"{name}.wav", 9600, rate=96000)
    result = invoke("enhance", tmp_path / "in", tmp_path / "out", "--dry-run",
                    "--model", tiny_checkpoint)
    assert result.exit_code == 0, result.output
    notes = [line for line in result.stderr.splitlines() if line.startswith("note: ")]
    assert notes == [f"note: {tmp_path / 'in' / 'a.wav'}: 96000 Hz is above the 8-48 kHz "
                     "RE-USE was trained on; it is enhanced at 96000 Hz all the same and may "
                     "come out less clean (resample to 48000 Hz for the model's own range)"]
    single = invoke("enhance", tmp_path / "in" / "a.wav", tmp_path / "o.wav", "--dry-run",
                    "--model", tiny_checkpoint)
    assert "note: " in single.stderr
    make_audio(tmp_path / "c.wav", rate=48000)
    assert "note:" not in invoke("enhance", tmp_path / "c.wav", tmp_path / "o.wav",
                                 "--dry-run", "--model", tiny_checkpoint).stderr


def test_a_checkpoint_from_the_environment_is_named_as_such(tmp_path, monkeypatch):
    """SPEECHLENS_MODEL=/nope failed as "/nope: no such checkpoint": a user who never typed
    /nope could not tell where it came from."""
    monkeypatch.setenv(checkpoint.MODEL_ENV, str(tmp_path / "nope"))
    expected = f"error: SPEECHLENS_MODEL={tmp_path / 'nope'}: no such checkpoint file or folder"
    for command in (["enhance", make_audio(tmp_path / "in.wav"), tmp_path / "out.wav"],
                    ["models", "verify"], ["models", "path"]):
        result = invoke(*command)
        assert result.exit_code == 1 and one_error_line(result) == expected, command
    (tmp_path / "folder").mkdir()
    monkeypatch.setenv(checkpoint.MODEL_ENV, str(tmp_path / "folder"))
    empty = invoke("models", "verify")
    assert one_error_line(empty) == (f"error: SPEECHLENS_MODEL={tmp_path / 'folder'}: no "
                                     "model.safetensors in this folder")
    given = invoke("models", "verify", tmp_path / "nope")   # typed: the path alone
    assert one_error_line(given) == f"error: {tmp_path / 'nope'}: no such checkpoint file or folder"


def test_help_speaks_of_what_the_user_gets():
    """--help said "Numerically strictest scan" and "rank 0 reports it": words about how it is
    built. Every help text of enhance and models is in the user's words."""
    commands = [["enhance"], ["models"], *(["models", name] for name in main.commands["models"]
                                           .commands)]
    for command in commands:
        text = invoke(*command, "--help").output
        for words in ("strictest", "rank", "peer", "Numerically"):
            assert words not in text, (command, words)


def test_the_api_scales_integer_pcm_as_soundfile_does(tiny_checkpoint):
    """int16 samples were taken as float amplitudes (outputs 32,768 times too loud); now int16
    and int32 are scaled to [-1, 1) as soundfile reads them, and integers with no agreed full
    scale are refused. (--atten-lim 0 returns the input: its float reading, exactly.)"""
    model = api.get_model(tiny_checkpoint)
    pcm = (noisy_speech(RATE, 0.05) * 2 ** 15).astype(np.int16)
    for samples, full_scale in ((pcm, 2 ** 15), (pcm.astype(np.int32) << 16, 2 ** 31)):
        back = api.enhance(samples, RATE, model=model, atten_lim_db=0)
        np.testing.assert_array_equal(back, (samples / full_scale).astype(np.float32))
    np.testing.assert_array_equal(api.enhance(pcm, RATE, model=model),
                                  api.enhance(pcm / 2 ** 15, RATE, model=model))
    for other in (np.uint8, np.int64):
        with pytest.raises(UsageError, match=f"audio of {np.dtype(other)} has no full scale"):
            api.enhance(pcm.astype(other), RATE, model=model)


def test_no_color_is_honoured(tmp_path):
    """FORCE_COLOR makes Rich colour the summary; NO_COLOR takes the colours out again."""
    make_audio(tmp_path / "in" / "a.wav")
    args = ("enhance", tmp_path / "in", tmp_path / "out", "--dry-run", "--model", "unused")
    coloured = invoke(*args, env={"FORCE_COLOR": "1", "NO_COLOR": None})
    plain = invoke(*args, env={"FORCE_COLOR": "1", "NO_COLOR": "1"})
    assert coloured.exit_code == plain.exit_code == 0
    assert COLOR_CODE.search(coloured.stderr)
    assert not COLOR_CODE.search(plain.stderr) and "planned" in plain.stderr


#: The CLI with Ctrl-C handling on even when pytest runs in a background job (which starts
#: children with SIGINT ignored, as a terminal never would).
_CHILD = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
          "from speechlens_cli.__main__ import main; sys.argv[0] = 'speechlens'; main()")


INTERRUPTS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
              signal.SIGALRM)


def test_an_interrupt_whose_exception_was_lost_still_stops_the_batch(monkeypatch):
    """The handler's KeyboardInterrupt lands wherever the main thread is; code that clears it
    there must not let the run finish as if never interrupted (every later signal is ignored):
    the batch checks again between windows (its progress callback) and between files."""
    monkeypatch.setattr(interrupts, "_interrupted", False)
    saved = {number: signal.getsignal(number) for number in interrupts._INTERRUPTING}
    try:
        with interrupts.signals_interrupt():
            with contextlib.suppress(KeyboardInterrupt):  # the first one, lost
                interrupts._raise_interrupt(signal.SIGALRM, None)
            shown = []
            with pytest.raises(KeyboardInterrupt):
                interrupts.checked(shown.append)(1000)
            assert shown == []
            with pytest.raises(KeyboardInterrupt):
                interrupts.check()
    finally:
        for number, handler in saved.items():
            signal.signal(number, handler)


@pytest.mark.parametrize("sig", INTERRUPTS, ids=[s.name for s in INTERRUPTS])
def test_interrupt_mid_file_leaves_nothing_and_exits_128_plus_the_signal(tmp_path,
                                                                         tiny_checkpoint, sig):
    """A real process, signalled once its temporary output exists (the model is mid-file).
    SIGHUP (a closed terminal), SIGQUIT, SIGUSR1 and SIGALRM used to leave the temporary file;
    every signal exited 130, SIGTERM's included (the shells' convention: 128 + N, SIGTERM 143)."""
    # A minute of noise (12 windows): tens of seconds of model time, so even a busy machine
    # cannot finish the file before the signal lands; the interrupt takes effect within a second.
    src = tmp_path / "long.wav"
    sf.write(str(src), 0.1 * np.random.default_rng(0).standard_normal(60 * RATE), RATE,
             subtype="PCM_16")
    out = tmp_path / "out"
    out.mkdir()
    # as from a terminal: the signal's default action, whatever this test process inherited
    # (a shell's background job starts with SIGQUIT ignored, and speechlens keeps an ignore)
    default = f"import signal; signal.signal({int(sig)}, signal.SIG_DFL); "
    process = subprocess.Popen(
        [sys.executable, "-c", (default if sig != signal.SIGINT else "") + _CHILD, "enhance",
         str(src), str(out / "o.wav"), "--model", str(tiny_checkpoint)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    deadline = time.monotonic() + 60
    while not leftovers(out):
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "no temporary output appeared"
        time.sleep(0.01)
    process.send_signal(sig)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 128 + sig, stderr
    assert stderr.strip().splitlines()[-1] == "interrupted (no partial output left behind)"
    assert list(out.iterdir()) == []


# ------------------------------------------------------------------------------ bad input

def _wav_bytes(frames: int, subtype="PCM_16", rate=RATE, fmt="WAV") -> bytes:
    buffer = io.BytesIO()
    sf.write(buffer, noisy_speech(rate, frames / rate), rate, subtype=subtype, format=fmt)
    return buffer.getvalue()


def _with_sample(tmp: Path, value: float) -> Path:
    data = noisy_speech(RATE, 0.1)
    data[500] = value
    sf.write(str(tmp / "in.wav"), data, RATE, subtype="FLOAT")
    return tmp / "in.wav"


def _case_inputs(tmp: Path) -> dict[str, Callable[[], tuple[list, int, str]]]:
    """name -> a set-up in `tmp` returning (enhance arguments, exit code, text the one error
    line must contain). "OUT" stands for tmp/out.wav; cases without --model get the tiny one."""
    def write(name: str, data: bytes) -> Path:
        (tmp / name).write_bytes(data)
        return tmp / name

    def good() -> Path:
        return make_audio(tmp / "in.wav")

    return {
        "not-audio": lambda: ([write("in.wav", b"hello, not audio"), "OUT"], 1,
                              "in.wav: not a readable audio file"),
        "truncated-wav": lambda: ([write("in.wav", _wav_bytes(4000)[:4000]), "OUT"], 1,
                                  "in.wav: truncated"),
        "truncated-flac": lambda: ([write("in.flac", _wav_bytes(4000, fmt="FLAC")[:3000]),
                                    tmp / "out.flac"], 1, "in.flac: could not be decoded"),
        "empty": lambda: ([write("in.wav", b""), "OUT"], 1, "in.wav: is empty"),
        "zero-length": lambda: ([write("in.wav", _wav_bytes(0)), "OUT"], 1,
                                "in.wav: contains no audio frames"),
        "nan": lambda: ([_with_sample(tmp, np.nan), "OUT"], 1, "in.wav: contains NaN or Inf"),
        "inf": lambda: ([_with_sample(tmp, np.inf), "OUT"], 1, "in.wav: contains NaN or Inf"),
        "rate-below-8k": lambda: ([make_audio(tmp / "in.wav", 4000, rate=4000), "OUT"], 1,
                                  "in.wav: sample rate 4000 Hz is not supported"),
        "too-short": lambda: ([make_audio(tmp / "in.wav", 100), "OUT"], 1,
                              "in.wav: too short (100 samples; one STFT frame needs 320"),
        "missing": lambda: ([tmp / "in.wav", "OUT"], 1, "in.wav: no such file"),
        "output-exists": lambda: ([good(), write("out.wav", b"keep me")], 1,
                                  "out.wav: already exists (use --overwrite"),
        "output-is-input": lambda: ([good(), tmp / "in.wav"], 2, "is the input itself"),
        "output-is-input-via-dotdot": lambda: ([good(), _via_dotdot(tmp), "--overwrite"], 2,
                                               "is the input itself"),
        "output-is-input-via-symlink": lambda: (
            [good(), _symlink(tmp / "link.wav", tmp / "in.wav"), "--overwrite"], 2,
            "is the input itself"),
        "unwritable-folder-before-model": lambda: (
            [good(), "/sys/speechlens-test.wav", "--model", tmp / "no-such-model"], 1,
            "/sys: not writable"),
        "missing-output-folder": lambda: ([good(), tmp / "nowhere" / "out.wav"], 1,
                                          "output folder does not exist"),
        "folder-to-stdout": lambda: ([_folder(tmp), "-"], 2, "cannot be written to stdout"),
        "folder-without-audio": lambda: ([_folder(tmp, audio=False), tmp / "out"], 2,
                                         "no audio files found"),
        "bad-model": lambda: ([good(), "OUT", "--model", tmp / "no-such-model"], 1,
                              "no-such-model: no such checkpoint"),
        "chunk-too-short": lambda: ([good(), "OUT", "--chunk-seconds", "4"], 2,
                                    "chunk length 4 s is outside 5-30 s"),
        "chunk-too-long": lambda: ([good(), "OUT", "--chunk-seconds", "31"], 2, "outside 5-30 s"),
        "overlap-too-large": lambda: ([good(), "OUT", "--overlap", "0.6"], 2,
                                      "overlap 0.6 is outside 0-0.5"),
        "overwrite-and-skip": lambda: ([good(), "OUT", "--overwrite", "--skip-existing"], 2,
                                       "contradict"),
        "unknown-subtype": lambda: ([good(), "OUT", "--subtype", "PCM_99"], 2,
                                    "unknown subtype 'PCM_99'"),
        "subtype-not-in-container": lambda: ([good(), tmp / "out.flac", "--subtype", "FLOAT"],
                                             2, "FLOAT cannot be written in a FLAC file"),
        "json-with-stdout": lambda: ([good(), "-", "--json"], 2, "--json writes to stdout"),
        "one-path": lambda: ([good()], 2, "give SOURCE and DESTINATION"),
        "unknown-option": lambda: ([good(), "OUT", "--loud"], 2, "No such option '--loud'"),
    }


def _via_dotdot(tmp: Path) -> Path:
    (tmp / "sub").mkdir()
    return tmp / "sub" / ".." / "in.wav"


def _symlink(link: Path, target: Path) -> Path:
    link.symlink_to(target)
    return link


def _folder(tmp: Path, audio: bool = True) -> Path:
    folder = tmp / "folder"
    folder.mkdir()
    (folder / "readme.txt").write_text("text")
    if audio:
        make_audio(folder / "a.wav")
    return folder


BAD_CASES = sorted(_case_inputs(Path("/nonexistent")))


@pytest.mark.parametrize("case", BAD_CASES)
def test_bad_input_gives_one_clear_line_and_a_nonzero_exit(tmp_path, tiny_checkpoint, case):
    args, code, fragment = _case_inputs(tmp_path)[case]()
    args = [tmp_path / "out.wav" if a == "OUT" else a for a in args]
    if "--model" not in args:
        args += ["--model", tiny_checkpoint]
    before = {p for p in tmp_path.rglob("*")}
    result = invoke("enhance", *args)
    assert result.exit_code == code, result.output
    assert fragment in one_error_line(result)
    created = {p for p in tmp_path.rglob("*")} - before
    assert not created, created
    if case == "output-exists":
        assert (tmp_path / "out.wav").read_bytes() == b"keep me"


@pytest.mark.skipif(mx.is_available(mx.gpu),
                    reason="needs a machine without a GPU (runs in CI, which has none)")
def test_gpu_without_a_gpu_is_a_usage_error(tmp_path):
    result = invoke("enhance", make_audio(tmp_path / "in.wav"), tmp_path / "out.wav",
                    "--device", "gpu")
    assert result.exit_code == 2
    assert "no GPU" in one_error_line(result)


# ------------------------------------------------------------------------------ models, doctor

@pytest.fixture
def hf_cache(tmp_path, monkeypatch) -> Path:
    """An empty Hugging Face cache, offline: nothing here may reach the network."""
    from huggingface_hub import constants

    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv(checkpoint.MODEL_ENV, raising=False)
    return cache


def _cache_pinned_copy(cache: Path) -> Path:
    """The tiny checkpoint laid out as the pinned nvidia/RE-USE revision (its sha256 differs)."""
    repo = cache / "models--nvidia--RE-USE"
    snapshot = write_checkpoint(repo / "snapshots" / checkpoint.PINNED_REVISION, TINY_CONFIG)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(checkpoint.PINNED_REVISION)
    return snapshot


def test_models_list_and_path(hf_cache, tiny_checkpoint):
    empty = invoke("models", "list")
    assert empty.exit_code == 0 and "no checkpoints in the Hugging Face cache" in empty.stdout
    missing = invoke("models", "path")
    assert missing.exit_code == 1
    assert "nvidia/RE-USE is not in the Hugging Face cache" in one_error_line(missing)

    snapshot = _cache_pinned_copy(hf_cache)
    listed = invoke("models", "list", env={checkpoint.MODEL_ENV: str(tiny_checkpoint)})
    assert f"nvidia/RE-USE@{checkpoint.PINNED_REVISION[:12]} (pinned)" in listed.stdout
    assert f"{checkpoint.MODEL_ENV}={tiny_checkpoint}" in listed.stdout
    assert invoke("models", "path").stdout.strip() == str(snapshot)
    assert invoke("models", "path", tiny_checkpoint).stdout.strip() == str(tiny_checkpoint)


def test_models_pull_shows_the_license_first(hf_cache, tiny_checkpoint, monkeypatch):
    from huggingface_hub import constants

    # online, but the hub is a closed local port: whatever happens, nothing leaves the machine
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    # CliRunner's stdin is not a terminal: the license once, then what this user can do (a
    # user of `models pull` was told to run `models pull`, after the license's name twice)
    accept = "pass --accept-license (scripts: SPEECHLENS_ACCEPT_LICENSE=1)"
    for command, step in ((["models", "pull"], accept),
                          (["enhance", "in.wav", "out.wav"],
                           f"run `speechlens models pull` in a terminal, or {accept}")):
        refused = invoke(*command)
        assert refused.exit_code == 2
        assert one_error_line(refused) == (
            f"error: nvidia/RE-USE is not downloaded yet. {checkpoint.LICENSE_NOTE} To accept "
            f"these terms and download it, {step}")

    accepted = invoke("models", "pull", "--accept-license")   # shown, then the download
    assert accepted.exit_code == 1 and checkpoint.LICENSE_NOTE in accepted.stderr
    assert "hub (127.0.0.1) cannot be reached" in accepted.stderr.strip().splitlines()[-1]

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    offline = invoke("models", "pull", "--accept-license")
    assert offline.exit_code == 1
    assert "HF_HUB_OFFLINE" in one_error_line(offline)

    _cache_pinned_copy(hf_cache)   # cached now: no license text, straight to verification
    cached = invoke("models", "pull")
    assert checkpoint.LICENSE_NOTE not in cached.stderr
    assert cached.exit_code == 1 and "does not match the pinned" in one_error_line(cached)

    local = invoke("models", "pull", tiny_checkpoint)
    assert local.exit_code == 0 and "ok: sha256" in local.stdout
    assert checkpoint.LICENSE_NOTE not in local.stderr


def test_a_license_variable_that_says_neither_yes_nor_no_is_named(hf_cache, monkeypatch):
    """SPEECHLENS_ACCEPT_LICENSE=maybe was a silent no, refused with "set
    SPEECHLENS_ACCEPT_LICENSE=1" to a user who had set it: now the variable's SettingError, the
    values it takes. A local checkpoint never asks."""
    from huggingface_hub import constants

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(checkpoint.locate, "_license_accepted", False)   # not by an earlier test
    monkeypatch.setenv(checkpoint.LICENSE_ENV, "maybe")
    for command in (["models", "pull"], ["enhance", "in.wav", "out.wav"]):
        refused = invoke(*command)
        assert refused.exit_code == 2
        assert one_error_line(refused) == ("error: SPEECHLENS_ACCEPT_LICENSE must be 1, true, "
                                           "yes or on, or 0, false, no or off, got 'maybe'")


def _doctor_lines(result) -> dict[str, str]:
    return {line.split(":", 1)[0]: line for line in result.stdout.splitlines()
            if re.match(r"^[a-z]+:", line)}


def test_doctor_reports_each_part_with_fixes(hf_cache, tiny_checkpoint, monkeypatch):
    lines = _doctor_lines(healthy := invoke("doctor", "--model", tiny_checkpoint))
    assert set(lines) == {"platform", "settings", "mlx", "kernels", "selfcheck", "blas", "cache",
                          "model", "scoring"}
    assert mx.__version__ in lines["mlx"] and ": ok, sha256" in lines["model"]
    assert f"backend {kernels.backend()}" in lines["kernels"]
    assert blas.INSTALL_HINT not in healthy.stdout
    baseline = healthy.stdout.count("fix:")   # e.g. a GPU this MLX build does not use
    assert healthy.exit_code == (1 if baseline else 0)
    blas_checked = "GFLOP/s" in lines["blas"]

    monkeypatch.setattr(blas, "loaded", None)
    monkeypatch.setattr(blas, "status", "no optimized BLAS found")
    monkeypatch.setattr(kernels, "kernel_info", lambda: {
        "backend": "cpu", "cpu_library": "unavailable (MLX-op fallbacks)"})
    sick = invoke("doctor")   # nothing cached, no optimized BLAS, no CPU kernel library
    assert sick.exit_code == 1
    assert "unavailable (MLX-op fallbacks)" in _doctor_lines(sick)["kernels"]
    assert "fix: install a C++ compiler" in sick.stdout
    assert "fix: speechlens models pull" in sick.stdout
    assert (f"fix: {blas.INSTALL_HINT}" in sick.stdout) == blas_checked
    assert f"{baseline + 2 + blas_checked} problem(s) found" in sick.stdout


@pytest.mark.skipif(not sys.platform.startswith("linux"),
                    reason="the BLAS is measured for MLX's Linux CPU backend only")
def test_doctor_verdict_follows_facts_not_the_measured_speed(tiny_checkpoint, monkeypatch,
                                                             on_cpu):
    """The same BLAS measured at 1000 and at 0.01 GFLOP/s (a loaded machine) gets the same
    verdict and no blas fix; a BLAS whose threads speechlens cannot set is a problem at any
    speed. On MLX's CPU device (the doctor checks the BLAS where the CPU backend runs), so on a
    GPU host too."""
    verdicts = {}
    for speed in (1000.0, 0.01):
        monkeypatch.setattr(cli.doctor, "_matmul_gflops", lambda speed=speed: speed)
        result = invoke("doctor", "--model", tiny_checkpoint)
        assert f"{speed:.1f} GFLOP/s" in _doctor_lines(result)["blas"]
        verdicts[speed] = (result.exit_code, result.stdout.count("fix:"))
    assert verdicts[1000.0] == verdicts[0.01]
    report = json.loads(invoke("doctor", "--model", tiny_checkpoint, "--json").stdout)
    assert report["checks"]["blas"]["gflops"] == 0.01
    assert report["checks"]["blas"]["ok"] == (blas.loaded is not None and blas.threads_controlled)

    monkeypatch.setattr(blas, "loaded", "libsomeblas.so")
    monkeypatch.setattr(blas, "threads_controlled", False)
    result = invoke("doctor", "--model", tiny_checkpoint)
    assert "fix: speechlens cannot set libsomeblas.so's thread count" in result.stdout
    assert result.exit_code == 1


def test_doctor_json_is_one_object_with_the_text_report_facts(hf_cache, tiny_checkpoint,
                                                              monkeypatch):
    monkeypatch.setattr(cli.doctor, "_matmul_gflops", lambda: 42.0)
    text = invoke("doctor", "--model", tiny_checkpoint)
    result = invoke("doctor", "--model", tiny_checkpoint, "--json")
    report = json.loads(result.stdout)   # one object, nothing else on stdout
    assert list(report) == ["ok", "problems", "checks"]
    assert list(report["checks"]) == list(_doctor_lines(text))
    for name, line in _doctor_lines(text).items():
        check = report["checks"][name]
        assert line.split(":", 1)[1].strip() == check["value"]
        assert set(check) >= {"value", "ok", "fix"} and check["ok"] == (check["fix"] is None)
        assert (check["fix"] is None) or f"fix: {check['fix']}" in text.stdout
    assert report["problems"] == text.stdout.count("fix:")
    assert report["ok"] == (report["problems"] == 0)
    assert result.exit_code == text.exit_code == (0 if report["ok"] else 1)
    missing = json.loads(invoke("doctor", "--model", tiny_checkpoint.parent / "none", "--json")
                         .stdout)
    assert missing["ok"] is False and missing["checks"]["model"]["fix"]


def test_version_names_mlx_and_backend():
    result = invoke("--version")
    assert result.exit_code == 0 and f"mlx {mx.__version__}" in result.stdout


def test_defaults_are_shared_with_the_api():
    """The CLI's defaults are api.EnhanceOptions', which enhance_file's keywords also take;
    its window defaults are the pipeline's constants."""
    import dataclasses
    import inspect

    from speechlens_cli import api, pipeline

    params = {p.name: p.default for p in cli.enhance.enhance.params}
    signature = inspect.signature(api.enhance_file).parameters
    defaults = api.EnhanceOptions()
    cli_names = {"strict": "strict_mode"}
    for field in dataclasses.fields(api.EnhanceOptions):
        value = getattr(defaults, field.name)
        assert params[cli_names.get(field.name, field.name)] == value, field.name
        if field.name in signature:
            assert signature[field.name].default == value, field.name
    assert set(signature) - {"source", "destination", "model", "progress"} <= \
        {field.name for field in dataclasses.fields(api.EnhanceOptions)}
    assert (defaults.chunk_seconds, defaults.overlap) == \
        (pipeline.DEFAULT_CHUNK_SECONDS, pipeline.DEFAULT_OVERLAP)


def _long_run(tmp_path, tiny_checkpoint, prefix: str = ""):
    """A real process on a minute of noise, once its temporary output exists."""
    src = tmp_path / "long.wav"
    sf.write(str(src), 0.1 * np.random.default_rng(0).standard_normal(60 * RATE), RATE,
             subtype="PCM_16")
    out = tmp_path / "out"
    out.mkdir()
    process = subprocess.Popen(
        [sys.executable, "-c", prefix + _CHILD, "enhance", str(src), str(out / "o.wav"),
         "--model", str(tiny_checkpoint)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    deadline = time.monotonic() + 60
    while not leftovers(out):
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "no temporary output appeared"
        time.sleep(0.01)
    return process, out


def test_a_ctrl_c_burst_is_one_interruption(tmp_path, tiny_checkpoint):
    """Twenty Ctrl-Cs 5 ms apart: the first interrupts, the rest are ignored; stderr holds the one
    'interrupted' line (later ones used to print "Exception ignored ... KeyboardInterrupt")."""
    process, out = _long_run(tmp_path, tiny_checkpoint)
    for _ in range(20):
        process.send_signal(signal.SIGINT)
        time.sleep(0.005)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    assert stderr.strip().splitlines() and stderr.strip().splitlines()[-1].startswith("interrupted")
    assert "Exception ignored" not in stderr and "Traceback" not in stderr, stderr
    assert list(out.iterdir()) == []


def test_a_hangup_under_nohup_is_ignored(tmp_path, tiny_checkpoint):
    """Started with SIGHUP ignored (`nohup`), speechlens keeps it ignored and finishes."""
    process, out = _long_run(tmp_path, tiny_checkpoint,
                             "import signal; signal.signal(signal.SIGHUP, signal.SIG_IGN); ")
    process.send_signal(signal.SIGHUP)
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 0, stderr
    assert [p.name for p in out.iterdir()] == ["o.wav"]


# Honest speed (issue 32, build item 3): estimates from measured rates, progress lines in a log,
# a batch's closing summary.

def _sixteen_seconds_in_5_s_windows(tmp_path, tiny_checkpoint, monkeypatch):
    """(input, result) of one 16-s file in 5-s windows, with a cache folder of its own (no
    speed measured here before)."""
    monkeypatch.setenv("SPEECHLENS_CACHE_DIR", str(tmp_path / "cache"))
    src = make_audio(tmp_path / "long.wav", frames=16 * RATE)
    result = invoke("enhance", src, tmp_path / "out.wav", "--model", tiny_checkpoint,
                    "--chunk-seconds", "5")
    assert result.exit_code == 0, result.stderr
    return src, result


def test_a_long_file_without_a_terminal_reports_progress_as_lines(tmp_path, tiny_checkpoint,
                                                                   monkeypatch):
    """A SLURM log saw nothing until the end: now a line as each window finishes, at most every
    PROGRESS_INTERVAL_S (0 here), with the time left."""
    from speechlens_cli.cli import reporting
    monkeypatch.setattr(reporting, "PROGRESS_INTERVAL_S", 0.0)
    src, result = _sixteen_seconds_in_5_s_windows(tmp_path, tiny_checkpoint, monkeypatch)
    lines = [line for line in result.stderr.splitlines()   # "about 9 s", "under a second"
             if " s of audio, " in line and line.endswith(" left")]
    assert len(lines) >= 2, result.stderr  # 16 s in 5-s windows: four windows, three before the end
    assert lines[0].startswith(f"{src}: ") and lines[0].endswith(" left")
    assert "of 16.0 s of audio" in lines[0]
    assert result.stderr.splitlines()[-1].startswith("enhanced ")


def test_the_first_window_gives_the_estimate_when_nothing_was_measured_here(
        tmp_path, tiny_checkpoint, monkeypatch):
    from speechlens_cli.cli import reporting
    monkeypatch.setattr(reporting, "ESTIMATE_NOTE_S", 0.0)
    _, result = _sixteen_seconds_in_5_s_windows(tmp_path, tiny_checkpoint, monkeypatch)
    notes = [line for line in result.stderr.splitlines()   # "about 9 s", "under a second"
             if line.startswith("note: ") and " on this machine (" in line]
    assert len(notes) == 1, result.stderr
    assert notes[0].endswith("left for this file on this machine "
                             "(from the speed of its first window)")


def test_a_rate_measured_here_gives_the_estimate_before_the_file(tmp_path, tiny_checkpoint,
                                                                  monkeypatch):
    """The rate a run measured is kept in the cache folder; the next run states its estimate
    from it before any work (1 million samples at 90 s per million: about 2 min)."""
    from speechlens_cli.cli import speed
    cache = tmp_path / "cache"
    monkeypatch.setenv("SPEECHLENS_CACHE_DIR", str(cache))
    monkeypatch.setattr(speed, "MIN_MEASURED_S", 0.0)
    first = invoke("enhance", make_audio(tmp_path / "a.wav"), tmp_path / "a-out.wav",
                   "--model", tiny_checkpoint)
    assert first.exit_code == 0 and "note:" not in first.stderr, first.stderr
    rates = json.loads((cache / speed.RATES_FILE).read_text())
    (key,) = rates
    device = "gpu" if mx.is_available(mx.gpu) else "cpu"     # what --device auto picks
    assert key.startswith(f"{platform.node()}/{device}/standard/")  # and the model's size
    assert rates[key] > 0
    (cache / speed.RATES_FILE).write_text(json.dumps({key: 90.0}))
    src = make_audio(tmp_path / "b.wav", frames=RATE * 125)  # a million samples
    monkeypatch.setattr(speed, "store_rate", lambda *args: None)  # keep the 90 s for the check
    second = invoke("enhance", src, tmp_path / "b-out.wav", "--model", tiny_checkpoint)
    assert second.exit_code == 0, second.stderr
    assert second.stderr.splitlines()[0] == ("note: about 2 min for this file on this machine "
                                             "(measured here by earlier runs)")


def test_a_batch_without_a_terminal_has_a_line_per_file_and_totals(tmp_path, tiny_checkpoint,
                                                                    monkeypatch):
    monkeypatch.setenv("SPEECHLENS_CACHE_DIR", str(tmp_path / "cache"))
    for name in ("a", "b"):
        make_audio(tmp_path / "in" / f"{name}.wav")
    result = invoke("enhance", tmp_path / "in", tmp_path / "out", "--model", tiny_checkpoint)
    assert result.exit_code == 0, result.stderr
    lines = result.stderr.splitlines()
    folder = re.escape(str(tmp_path / "in"))
    assert any(re.fullmatch(rf"\[1/2\] {folder}/a\.wav: 0\.05 s of audio in \d+\.\d\d s; "
                            r"(about \d+ s|under a second) left", line)
               for line in lines), result.stderr
    assert any(re.fullmatch(rf"\[2/2\] {folder}/b\.wav: 0\.05 s of audio in \d+\.\d\d s", line)
               for line in lines), result.stderr
    assert re.fullmatch(r"2 done; 0\.1 s of audio enhanced in \d+\.\d s "
                        r"\(\d+\.\d\d s of audio per s\)", lines[-1]), result.stderr


def test_a_large_batch_closes_with_totals_and_its_failures_not_a_row_per_file(
        tmp_path, tiny_checkpoint, monkeypatch):
    """1,000 files printed 1,000 rows; above SUMMARY_TABLE_MAX_FILES (2 here) the summary is the
    failures, named again (their lines have scrolled away), and the totals."""
    from speechlens_cli.cli import reporting
    monkeypatch.setattr(reporting, "SUMMARY_TABLE_MAX_FILES", 2)
    monkeypatch.setenv("SPEECHLENS_CACHE_DIR", str(tmp_path / "cache"))
    for name in ("a", "b"):
        make_audio(tmp_path / "in" / f"{name}.wav")
    (tmp_path / "in" / "c.wav").write_bytes(b"RIFF\x00\x00\x00\x00WAVEjunk")
    result = invoke("enhance", tmp_path / "in", tmp_path / "out", "--model", tiny_checkpoint)
    assert result.exit_code == 3, result.stderr
    assert "speechlens enhance" not in result.stderr and "│" not in result.stderr
    lines = result.stderr.splitlines()
    assert lines[-3] == f"failed: {tmp_path / 'in' / 'c.wav'}", result.stderr
    assert lines[-2].startswith("2 done, 1 failed; 0.1 s of audio enhanced in "), result.stderr


# Trying speechlens offline (issue 32, build item 6).

@pytest.fixture
def tiny_demo(monkeypatch):
    """`speechlens demo` with the tiny architecture (the full one takes ~10 s a run here)."""
    from speechlens_cli.synthetic import demo as material
    monkeypatch.setattr(material, "CONFIG", TINY_CONFIG)
    return material


def test_demo_makes_speech_and_a_random_checkpoint_and_enhances_it(tmp_path, tiny_demo):
    folder = tmp_path / "try" / "demo"
    result = invoke("demo", folder)
    assert result.exit_code == 0, result.output
    noisy, enhanced = sf.info(str(folder / "noisy.wav")), sf.info(str(folder / "enhanced.wav"))
    assert (noisy.frames, noisy.samplerate) == (enhanced.frames, enhanced.samplerate) == \
        (48000, 16000)
    config = json.loads((folder / "random-checkpoint" / "config.json").read_text())
    assert config == TINY_CONFIG and (folder / "random-checkpoint" / "model.safetensors").is_file()
    assert sorted(p.name for p in folder.iterdir() if p.name != "report.html") == [
        "enhanced.wav", "noisy.wav", "random-checkpoint"]  # nothing else (the report: below)
    lines = result.stdout.splitlines()
    assert "RANDOM weights" in lines[1]  # said before the run
    assert "it will not sound cleaner" in lines[3]  # and after


@needs_extra
def test_demo_reports_its_run_and_says_random_weights_drop_the_scores(tmp_path, tiny_demo):
    folder = tmp_path / "demo"
    result = invoke("demo", folder)
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in folder.iterdir()) == ["enhanced.wav", "noisy.wav",
                                                         "random-checkpoint", "report.html"]
    lines = result.stdout.splitlines()
    assert lines[4].startswith(f"wrote {folder / 'report.html'}: listen to both, see their "
                               "spectrograms; DNSMOS OVRL ")
    assert lines[5] == ("A random checkpoint makes the scores DROP: its weights damage the speech "
                        "instead of cleaning it; NVIDIA's checkpoint (speechlens models pull) is "
                        "what raises them.")
    assert (folder / "report.html").read_text().count("<audio controls") == 3


@needs_extra
def test_demo_without_the_report_extra_says_how_to_get_its_report(tmp_path, tiny_demo,
                                                                   monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)   # as if not installed
    result = invoke("demo", tmp_path / "demo")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[-1] == (
        "no report of the run: scoring needs matplotlib, which is not installed: "
        "pip install 'speechlens[report]'")
    assert not (tmp_path / "demo" / "report.html").exists()


def test_demo_replaces_an_earlier_demo_only_when_asked(tmp_path, tiny_demo):
    folder = tmp_path / "demo"
    assert invoke("demo", folder).exit_code == 0
    before = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    again = invoke("demo", folder)
    assert again.exit_code == 1
    assert one_error_line(again) == \
        f"error: {folder / 'noisy.wav'}: exists (--overwrite replaces the demo's files)"
    assert {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()} == before
    replaced = invoke("demo", folder, "--overwrite")
    assert replaced.exit_code == 0, replaced.output
    assert {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()} == before  # same bytes


def test_demo_into_a_file_is_a_usage_error(tmp_path, tiny_demo):
    target = tmp_path / "demo"
    target.write_bytes(b"mine")
    result = invoke("demo", target)
    assert result.exit_code == 2
    assert one_error_line(result) == f"error: {target}: is not a folder"
    assert target.read_bytes() == b"mine"


def test_make_demo_installs_the_package_without_the_dev_extra(tmp_path):
    """The dev extra brings 142 MB of NVRTC a CPU-only user's demo never uses; the report extra
    makes the demo's report."""
    root = Path(__file__).resolve().parents[1]
    plan = subprocess.run(["make", "-n", "--no-print-directory", "-C", str(root), "demo",
                           f"VENV={tmp_path / 'venv'}"],
                          capture_output=True, text=True, check=True).stdout
    installs = [line for line in plan.splitlines() if "pip install" in line
                and "--upgrade pip" not in line]
    assert installs and all(line.endswith("pip install -q -e '.[report]'")
                            for line in installs), plan
    assert plan.splitlines()[-1].endswith("-m fixtures.demo")


def test_make_test_installs_torch_so_the_peer_tests_run(tmp_path):
    """The suite's environment has the bench extra (torch, the CPU wheel on Linux x86_64):
    without it tests/test_torch_peer.py skips, in CI too."""
    root = Path(__file__).resolve().parents[1]
    plan = subprocess.run(["make", "-n", "--no-print-directory", "-C", str(root), "test",
                           f"VENV={tmp_path / 'venv'}"],
                          capture_output=True, text=True, check=True).stdout
    extras = [set(line.split("'.[")[1].split("]'")[0].split(","))
              for line in plan.splitlines() if "pip install -q -e '.[" in line]
    assert extras and all({"dev", "report", "bench"} <= each for each in extras), plan


def test_an_interrupted_demo_leaves_no_half_written_checkpoint(tmp_path, tiny_demo, monkeypatch):
    def interrupted(folder):
        (folder / "model.safetensors").write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(tiny_demo, "write_random_checkpoint", interrupted)
    folder = tmp_path / "demo"
    result = invoke("demo", folder)
    assert result.exit_code == 130, result.output
    assert sorted(p.name for p in folder.iterdir()) == ["noisy.wav"]  # complete, kept
    assert sf.info(str(folder / "noisy.wav")).frames == 48000


def test_a_batch_is_estimated_whole_from_a_stored_rate_or_its_first_window(
        tmp_path, tiny_checkpoint, monkeypatch):
    from speechlens_cli.cli import reporting, speed
    monkeypatch.setattr(reporting, "ESTIMATE_NOTE_S", 0.0)
    monkeypatch.setattr(speed, "store_rate", lambda *args: None)
    monkeypatch.setenv("SPEECHLENS_CACHE_DIR", str(tmp_path / "cache"))
    for name in ("a", "b"):
        make_audio(tmp_path / "in" / f"{name}.wav", frames=RATE * 5)  # 40,000 samples each

    def notes(out: str) -> list[str]:
        result = invoke("enhance", tmp_path / "in", tmp_path / out, "--model", tiny_checkpoint)
        assert result.exit_code == 0, result.stderr
        return [line for line in result.stderr.splitlines()  # "about 2 min", "under a second"
                if line.startswith("note: ") and " on this machine (" in line]

    (first,) = notes("out1")
    assert first.endswith(" left for this batch on this machine "
                          "(from the speed of its first window)"), first
    monkeypatch.setattr(speed, "stored_rate", lambda key: 1500.0)  # 0.08 M samples: 120 s
    assert notes("out2") == ["note: about 2 min for this batch's 2 files (10.0 s of audio) on "
                             "this machine (measured here by earlier runs)"]
