"""`speechlens score` (speechlens_cli/scoring/, cli/score.py): DNSMOS as Microsoft's
dnsmos_local.py computes it, checked against an independent float64 implementation written here
(a direct DFT and a filterbank interpolated edge to edge, no FFT, no shared code), and PESQ, STOI,
SI-SDR against a reference. The scoring tests need the `report` extra, which `make` installs;
where it is missing (the offline GPU host's wheels) they are skipped, saying so."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from importlib import resources
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from tests.reliability import CHILD, REPO, invoke, one_error_line, run_child

RECORDING = Path(__file__).resolve().parents[1] / "fixtures" / "recordings" / "arctic_a0009.wav"
EXTRA = ("onnxruntime", "speechmos", "pesq", "pystoi", "soxr")
needs_extra = pytest.mark.skipif(
    any(importlib.util.find_spec(name) is None for name in EXTRA),
    reason="the `report` extra is not installed here (pip install -e '.[dev,report]', as make "
           "does)")


def _clean() -> np.ndarray:
    samples, rate = sf.read(RECORDING, dtype="float64")
    assert rate == 16000
    return samples


def _with_noise(clean: np.ndarray, snr_db: float, seed: int = 0) -> np.ndarray:
    noise = np.random.default_rng(seed).standard_normal(len(clean))
    noise *= np.sqrt(np.mean(clean ** 2) / np.mean(noise ** 2) / 10 ** (snr_db / 10))
    return clean + noise


def _write(path: Path, samples: np.ndarray, rate: int = 16000, subtype: str = "FLOAT") -> Path:
    sf.write(path, samples, rate, subtype=subtype)
    return path


def _scores(*args) -> list[dict]:
    result = invoke("score", *args, "--json")
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines()]


# ---------------------------------------------------------------- the independent implementation

def _independent_mel_filterbank() -> np.ndarray:
    """Slaney's 120 mel bands over 0-8 kHz on the 161 bins of a 321-point DFT, each a triangle
    drawn through its three edges by interpolation, of area-normalising height."""
    def hz_to_mel(hz: float) -> float:
        return 3 * hz / 200 if hz < 1000 else 15 + 27 * np.log(hz / 1000) / np.log(6.4)

    def mel_to_hz(mel: float) -> float:
        return 200 * mel / 3 if mel < 15 else 1000 * 6.4 ** ((mel - 15) / 27)

    top = hz_to_mel(8000.0)
    edges = [mel_to_hz(top * k / 121) for k in range(122)]
    bins_hz = np.array([k * 16000 / 321 for k in range(161)])
    bank = np.zeros((120, 161))
    for band in range(120):
        low, centre, high = edges[band], edges[band + 1], edges[band + 2]
        bank[band] = np.interp(bins_hz, [low, centre, high], [0.0, 2 / (high - low), 0.0],
                               left=0.0, right=0.0)
    return bank


def _independent_log_mel(segment: np.ndarray) -> np.ndarray:
    """[frames, 120]: zero-padded centred frames of 321 every 160, periodic Hann, |DFT|^2 by a
    cosine/sine matrix, the mel bank, dB relative to the loudest cell floored 80 dB below, and
    (dB + 40) / 40."""
    n = np.arange(321)
    window = np.sin(np.pi * n / 321) ** 2            # the periodic Hann window
    padded = np.concatenate([np.zeros(160), segment, np.zeros(160)])
    count = (len(padded) - 321) // 160 + 1
    frames = np.stack([padded[i * 160:i * 160 + 321] for i in range(count)]) * window
    angle = 2 * np.pi * np.outer(n, np.arange(161)) / 321
    power = (frames @ np.cos(angle)) ** 2 + (frames @ np.sin(angle)) ** 2
    mel = power @ _independent_mel_filterbank().T
    db = 10 * np.log10(np.maximum(mel, 1e-10) / max(mel.max(), 1e-10))
    return (np.maximum(db, db.max() - 80) + 40) / 40


def _independent_dnsmos(samples: np.ndarray) -> dict[str, float]:
    """dnsmos_local.py's method: the clip doubled to at least 9.01 s, a 9.01-s segment starting at
    every whole second s with s + 9.01 <= the clip's whole seconds, each model run on its own,
    the non-personalized polynomials, the mean over segments."""
    import onnxruntime as ort

    folder = resources.files("speechmos") / "dnsmos_models"
    p835 = ort.InferenceSession(str(folder / "sig_bak_ovr.onnx"),
                                providers=["CPUExecutionProvider"])
    p808 = ort.InferenceSession(str(folder / "model_v8.onnx"), providers=["CPUExecutionProvider"])
    while len(samples) < 144160:
        samples = np.concatenate([samples, samples])
    whole_seconds = len(samples) // 16000
    starts = [s for s in range(whole_seconds) if 100 * s + 901 <= 100 * whole_seconds]
    fits = {"sig": (-0.08397278, 1.22083953, 0.0052439),
            "bak": (-0.13166888, 1.60915514, -0.39604546),
            "ovrl": (-0.06766283, 1.11546468, 0.04602535)}
    found = {key: [] for key in (*fits, "p808")}
    for start in starts:
        segment = samples[start * 16000:start * 16000 + 144160]
        raw = p835.run(None, {"input_1": segment[None].astype(np.float32)})[0][0]
        for value, key in zip(raw, fits, strict=True):
            a, b, c = fits[key]
            found[key].append(a * float(value) ** 2 + b * float(value) + c)
        mel = _independent_log_mel(segment[:-160])[None].astype(np.float32)
        found["p808"].append(float(p808.run(None, {"input_1": mel})[0][0][0]))
    return {key: float(np.mean(values)) for key, values in found.items()}


# ---------------------------------------------------------------------------------- DNSMOS

@needs_extra
def test_the_log_mel_matches_a_direct_dft_and_filterbank():
    from speechlens_cli.scoring import dnsmos

    segment = _with_noise(np.tile(_clean(), 3), 20)[:144000]
    ours = dnsmos.log_mel(segment)
    theirs = _independent_log_mel(segment)
    assert ours.shape == theirs.shape == (900, 120)
    assert np.abs(ours - theirs).max() < 1e-5


@needs_extra
def test_dnsmos_matches_an_independent_implementation(tmp_path):
    """A short clip (repeated to one segment) and a 12.4-s one (three segments)."""
    long = _with_noise(np.tile(_clean(), 4), 10, seed=1)
    files = [_write(tmp_path / "short.wav", _clean()), _write(tmp_path / "long.wav", long)]
    for file, found in zip(files, _scores(*files), strict=True):
        expected = _independent_dnsmos(sf.read(file, dtype="float64")[0])
        for key, value in expected.items():
            assert found["dnsmos"][key] == pytest.approx(value, abs=0.01), (file.name, key)


@needs_extra
def test_other_rates_and_channels_are_scored_as_16_khz_mono_and_said_so(tmp_path):
    """48 kHz stereo: averaged, resampled with soxr's HQ (as librosa.resample), length fixed to
    ceil(frames / 3) as librosa does; the table and the JSON say what was done."""
    import soxr

    clean = _clean()
    up = soxr.resample(clean, 16000, 48000, quality="HQ")
    stereo = np.stack([0.9 * up, 0.5 * up], axis=1)
    file = _write(tmp_path / "stereo48k.wav", stereo, rate=48000)
    mono = sf.read(file, dtype="float64")[0].mean(axis=1)
    at_16k = soxr.resample(mono, 48000, 16000, quality="HQ")
    wanted = int(np.ceil(len(mono) / 3))
    at_16k = np.pad(at_16k, (0, wanted - len(at_16k)))[:wanted]
    found = _scores(file)[0]
    assert found["converted"] == "2 channels mixed to mono, resampled from 48000 Hz"
    assert found["input"] == {"sample_rate": 48000, "channels": 2,
                              "seconds": pytest.approx(len(up) / 48000)}
    for key, value in _independent_dnsmos(at_16k).items():
        assert found["dnsmos"][key] == pytest.approx(value, abs=0.01), key
    table = invoke("score", file)
    assert table.exit_code == 0, table.output
    header, row = table.stdout.splitlines()
    assert header.split()[:5] == ["file", "SIG", "BAK", "OVRL", "P808"]
    assert row.startswith(str(file)) and row.endswith("resampled from 48000 Hz")


@needs_extra
def test_clean_speech_scores_higher_than_the_same_speech_with_noise_at_5_db(tmp_path):
    clean = _write(tmp_path / "clean.wav", _clean(), subtype="PCM_16")
    noisy = _write(tmp_path / "noisy.wav", _with_noise(_clean(), 5), subtype="PCM_16")
    scored_clean, scored_noisy = _scores(clean, noisy)
    for key in ("bak", "ovrl"):
        assert scored_clean["dnsmos"][key] - scored_noisy["dnsmos"][key] > 0.5, key
    assert scored_clean["dnsmos"]["p808"] > scored_noisy["dnsmos"]["p808"]


# ------------------------------------------------------------------- against a reference

@needs_extra
def test_a_file_against_itself_scores_pesq_4_64_stoi_1():
    found = _scores(RECORDING, "--reference", RECORDING)[0]
    assert set(found) == {"file", "dnsmos", "reference", "input", "converted"}
    assert set(found["dnsmos"]) == {"sig", "bak", "ovrl", "p808"}
    assert found["reference"]["pesq_wb"] == pytest.approx(4.64, abs=0.01)
    assert found["reference"]["stoi"] == pytest.approx(1.0, abs=1e-6)
    assert found["reference"]["si_sdr_db"] > 100


@needs_extra
def test_noise_at_5_db_lowers_every_reference_score(tmp_path):
    """SI-SDR of white noise added at 5 dB SNR is 5 dB (the noise is nearly orthogonal to the
    speech); PESQ and STOI fall well below an exact copy's."""
    noisy = _write(tmp_path / "noisy.wav", _with_noise(_clean(), 5))
    found = _scores(noisy, "--reference", RECORDING)[0]["reference"]
    assert found["si_sdr_db"] == pytest.approx(5.0, abs=0.3)
    assert found["pesq_wb"] < 2.0
    assert found["stoi"] < 0.95


@needs_extra
def test_si_sdr_of_a_scaled_copy_is_large_and_of_noise_is_low():
    from speechlens_cli.scoring.reference_metrics import si_sdr_db

    clean = _clean()
    noise = np.random.default_rng(2).standard_normal(len(clean))
    assert si_sdr_db(clean, 0.3 * clean) > 100
    assert si_sdr_db(clean, noise) < -20


@needs_extra
def test_a_reference_of_another_length_is_one_line(tmp_path):
    shorter = _write(tmp_path / "short.wav", _clean()[:16000])
    result = invoke("score", RECORDING, "--reference", shorter)
    assert result.exit_code == 1
    assert one_error_line(result.stderr) == (
        f"error: {RECORDING}: is 3.10 s long and the reference {shorter} 1.00 s: not "
        "recordings of the same speech")
    assert result.stdout == ""


@needs_extra
@pytest.mark.parametrize("samples, reason", [
    (np.zeros(32000), "no utterances detected"),
    (_clean()[:3000], "buffer needs to be at least 1/4 of a second long"),
])
def test_what_pesq_cannot_compare_is_one_line(tmp_path, samples, reason):
    """Silence (no speech for PESQ to align) or under a quarter of a second: PESQ's own reason,
    in words, and (in a process of its own, where Python prints warnings) nothing else."""
    file = _write(tmp_path / "x.wav", samples)
    result = run_child(["score", file, "--reference", file])
    assert result.returncode == 1
    assert one_error_line(result.stderr) == (
        f"error: {file}: PESQ cannot compare it with the reference ({reason})")


# ------------------------------------------------------------------------------ bad inputs

def _bad_inputs(root: Path) -> dict[str, Path]:
    root.mkdir()
    (root / "empty.wav").write_bytes(b"")
    (root / "notes.wav").write_text("not audio at all\n")
    (root / "folder").mkdir()   # holding no audio
    cut = (root / "cut.wav")
    cut.write_bytes(RECORDING.read_bytes()[:5000])
    return {"missing": root / "nothing.wav", "empty": root / "empty.wav",
            "text": root / "notes.wav", "folder": root / "folder", "truncated": cut}


@needs_extra
@pytest.mark.parametrize("case", ["missing", "empty", "text", "folder", "truncated"])
def test_a_bad_input_is_the_line_enhance_gives(tmp_path, case, tiny_checkpoint):
    bad = _bad_inputs(tmp_path / "in")[case]
    scored = invoke("score", bad)
    output = tmp_path / ("out" if case == "folder" else "out.wav")
    enhanced = invoke("enhance", bad, output, "--model", tiny_checkpoint, "--dry-run")
    assert scored.exit_code == enhanced.exit_code == (2 if case == "folder" else 1)
    assert one_error_line(scored.stderr) == one_error_line(enhanced.stderr)
    assert scored.stdout == ""


@needs_extra
def test_nan_samples_are_one_line(tmp_path):
    samples = _clean()
    samples[100] = np.nan
    bad = _write(tmp_path / "nan.wav", samples)
    result = invoke("score", bad)
    assert result.exit_code == 1
    assert one_error_line(result.stderr) == f"error: {bad}: contains NaN or Inf samples"


@needs_extra
def test_a_batch_scores_the_good_files_and_exits_3(tmp_path):
    missing = tmp_path / "nothing.wav"
    result = invoke("score", missing, RECORDING)
    assert result.exit_code == 3
    assert result.stderr.splitlines() == [f"error: {missing}: no such file",
                                          "error: 1 of 2 files failed (listed above)"]
    header, row = result.stdout.splitlines()
    assert row.startswith(str(RECORDING))


@needs_extra
def test_a_bad_reference_stops_before_any_file_is_scored(tmp_path):
    result = invoke("score", RECORDING, "--reference", tmp_path / "nothing.wav", "--json")
    assert result.exit_code == 1
    assert one_error_line(result.stderr) == f"error: {tmp_path / 'nothing.wav'}: no such file"
    assert result.stdout == ""


@pytest.mark.parametrize("args, line", [
    (("-", "-"), "error: '-' (stdin) can be scored once"),
    ((str(RECORDING), "--reference", "-"), "error: --reference: must name a file, not '-'"),
])
@pytest.mark.parametrize("extra", ["installed", "missing"])
def test_stdin_twice_or_as_the_reference_is_a_usage_error(args, line, extra, monkeypatch):
    """A command line that cannot work is refused as such, whether or not the extra is there."""
    if extra == "missing":
        from speechlens_cli.errors import MissingExtraError
        from speechlens_cli.scoring import extra as scoring_extra

        def missing(names=()):
            raise MissingExtraError("onnxruntime is not installed")
        monkeypatch.setattr(scoring_extra, "require", missing)
    result = invoke("score", *args, input=b"")
    assert result.exit_code == 2
    assert one_error_line(result.stderr) == line


@needs_extra
@pytest.mark.parametrize("as_json", [False, True])
def test_a_stdout_that_cannot_take_the_scores(as_json):
    """> /dev/full: one line, exit 1, no traceback; stdout closed (>&-): refused before any
    file is read, as --json already was."""
    args = [sys.executable, "-c", CHILD, "score", str(RECORDING), *(["--json"] if as_json else [])]
    with open("/dev/full", "wb") as full:
        done = subprocess.run(args, stdout=full, stderr=subprocess.PIPE, text=True, cwd=REPO,
                              timeout=120, check=False)
    assert done.returncode == 1
    assert one_error_line(done.stderr) == ("error: <stdout>: the scores could not be written "
                                           "(No space left on device)")
    closed = run_child(["score", RECORDING, *(["--json"] if as_json else [])],
                       preexec=lambda: os.close(1))
    assert closed.returncode == 2
    assert one_error_line(closed.stderr) == (
        "error: <stdout>: is closed, so " + ("--json has nowhere to write; leave it out"
                                             if as_json else "the scores have nowhere to go"))


# --------------------------------------------------------------------------- a missing extra

@needs_extra
@pytest.mark.parametrize("package", EXTRA)
def test_a_missing_extra_is_one_line_naming_the_install(monkeypatch, package):
    """PESQ's and STOI's packages are needed (and imported) only with --reference."""
    monkeypatch.setitem(sys.modules, package, None)   # import fails as for one not installed
    reference = ("--reference", RECORDING) if package in ("pesq", "pystoi") else ()
    result = invoke("score", RECORDING, *reference)
    assert result.exit_code == 1
    assert one_error_line(result.stderr) == (
        f"error: scoring needs {package}, which is not installed: "
        "pip install 'speechlens[report]'")
    assert result.stdout == ""


@needs_extra
@pytest.mark.parametrize("package", ["pesq", "pystoi"])
def test_without_a_reference_pesq_and_stoi_are_not_needed(monkeypatch, package):
    monkeypatch.setitem(sys.modules, package, None)
    result = invoke("score", RECORDING)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[1].startswith(str(RECORDING))


@needs_extra
def test_doctor_says_whether_scoring_is_available_never_a_problem(monkeypatch):
    def scoring_check() -> dict:
        result = invoke("doctor", "--json")
        return json.loads(result.stdout)["checks"]["scoring"]

    monkeypatch.setitem(sys.modules, "pystoi", None)
    missing = scoring_check()
    assert missing["available"] is False and missing["ok"] is True
    assert missing["value"] == ("unavailable: scoring needs pystoi, which is not installed: "
                                "pip install 'speechlens[report]'")
    monkeypatch.undo()
    found = scoring_check()
    assert found["available"] is True and found["value"].startswith("available (onnxruntime ")


@needs_extra
def test_a_folder_is_every_audio_file_in_it(tmp_path):
    (tmp_path / "in" / "deeper").mkdir(parents=True)
    copy = tmp_path / "in" / "deeper" / "take.wav"
    copy.write_bytes(RECORDING.read_bytes())
    (tmp_path / "in" / "notes.txt").write_text("not audio\n")
    result = invoke("score", tmp_path / "in")
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines() == [f"skipped, not audio: {tmp_path / 'in' / 'notes.txt'}"]
    header, row = result.stdout.splitlines()
    assert row.startswith(str(copy))
