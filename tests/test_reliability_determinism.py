"""Reliability, determinism.

The same input, model and options give byte-identical output: twice in one process, and in
separate processes. Measured here, not assumed, is which settings change the result (the values
docs/reliability.md reports): the window geometry and --strict-mode do; so do SPEECHLENS_BLAS=off
(MLX's reference BLAS instead of OpenBLAS) and the MLX-op fallback for the causal conv; thread
counts (OPENBLAS_NUM_THREADS, SPEECHLENS_CPU_THREADS) do not, on any CPU: the BLAS shim splits
products by shape, not by thread (tests/test_blas.py checks that product by product).
Differences stay at float32 rounding (< 1e-5 of full scale).
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from speechlens_cli import checkpoint, kernels
from speechlens_cli.api import enhance_channels
from speechlens_cli.audio import OutputFormat
from speechlens_cli.pipeline import Geometry, enhance_stream
from speechlens_cli.synthetic.speech import noisy_speech
from tests.reliability import RATE, REPO, cases, invoke, make_audio, tree_bytes

#: Largest difference a setting that "changes the result" may make (float32 rounding).
ROUNDING = 1e-5
FLOAT_WAV = OutputFormat("WAV", "FLOAT")


@pytest.fixture(scope="module")
def model(tiny_checkpoint):
    return checkpoint.load_model(tiny_checkpoint)


@cases(4)
def test_the_same_batch_twice_is_byte_identical(tmp_path, tiny_checkpoint):
    """PCM16, PCM24 FLAC, float and stereo through the CLI, twice. Float WAV carries no PEAK
    chunk (libsndfile would stamp the time of writing into it)."""
    make_audio(tmp_path / "in" / "pcm16.wav", 2000, seed=1)
    make_audio(tmp_path / "in" / "pcm24.flac", 2001, subtype="PCM_24", fmt="FLAC", seed=2)
    make_audio(tmp_path / "in" / "float.wav", 2002, subtype="FLOAT", seed=3)
    make_audio(tmp_path / "in" / "stereo.wav", 2003, channels=2, seed=4)
    for run in ("first", "second"):
        assert invoke("enhance", tmp_path / "in", tmp_path / run, "--model", tiny_checkpoint,
                      "-q").exit_code == 0
    first = tree_bytes(tmp_path / "first")
    assert len(first) == 4 and first == tree_bytes(tmp_path / "second")
    assert b"PEAK" not in first["float.wav"]


def _stream(model, source: Path, destination: Path, geometry: Geometry, strict=False) -> bytes:
    enhance_stream(source, destination, lambda w: enhance_channels(model, w, RATE, strict),
                   geometry, FLOAT_WAV)
    return destination.read_bytes()


def _samples(data: bytes) -> np.ndarray:
    return sf.read(io.BytesIO(data), dtype="float32")[0]


@cases(4)
def test_window_geometry_and_strict_mode_change_the_result(tmp_path, model):
    """2,000 samples (three windows of 800, or two of 1,000): the base geometry is deterministic,
    and each other geometry or mode gives its own output. Geometry changes which samples the
    model sees together (small, but far above rounding); strict mode changes the scan's
    arithmetic (rounding)."""
    source = tmp_path / "in.wav"
    sf.write(str(source), noisy_speech(RATE, 2000 / RATE, seed=8), RATE, subtype="FLOAT")
    runs = {}
    for name, geometry, strict in (("800/200", Geometry(800, 200), False),
                                   ("1000/250", Geometry(1000, 250), False),
                                   ("800/0", Geometry(800, 0), False),
                                   ("800/200 strict", Geometry(800, 200), True)):
        runs[name] = _samples(_stream(model, source, tmp_path / f"{len(runs)}.wav", geometry,
                                      strict))
    again = _stream(model, source, tmp_path / "again.wav", Geometry(800, 200))
    assert again == (tmp_path / "0.wav").read_bytes()
    base = runs["800/200"]
    for name in ("1000/250", "800/0"):
        assert np.abs(runs[name] - base).max() > 1e-3, name
    strict = np.abs(runs["800/200 strict"] - base).max()
    assert 0 < strict <= ROUNDING, strict


_CHILD = textwrap.dedent("""
    import hashlib, json, sys
    from speechlens_cli import runtime
    runtime.prepare()   # as the CLI: the BLAS loaded before MLX is imported
    from speechlens_cli import api, blas, checkpoint
    from speechlens_cli.audio import OutputFormat
    from speechlens_cli.pipeline import Geometry, enhance_stream
    ckpt, source, folder = sys.argv[1:4]
    api.select_device("cpu")   # the settings are the CPU backend's: a GPU uses neither
    model = checkpoint.load_model(ckpt)
    report = {"blas": blas.loaded}
    for strict in (False, True):
        out = f"{folder}/{'strict' if strict else 'standard'}.wav"
        enhance_stream(source, out, lambda w: api.enhance_channels(model, w, 8000, strict),
                       Geometry(4000, 200), OutputFormat("WAV", "FLOAT"))
        report[out] = hashlib.sha256(open(out, "rb").read()).hexdigest()
    print(json.dumps(report))
""")

#: Each setting runs in its own process (BLAS is chosen before MLX is imported).
SETTINGS = {
    "default": {},
    "default-again": {},
    "one-thread": {"OPENBLAS_NUM_THREADS": "1", "SPEECHLENS_CPU_THREADS": "1"},
    "reference-blas": {"SPEECHLENS_BLAS": "off"},
    "conv-fallback": {kernels.DISABLE_CONV_ENV: "1"},
}


@cases(len(SETTINGS))
def test_settings_across_processes(tmp_path, tiny_checkpoint):
    """8,000 samples in 0.5-s windows (3 windows, 2 cross-fades), standard and strict, in five
    fresh processes, on MLX's CPU device on any machine (the BLAS and the CPU threads are the
    CPU backend's). Byte-identical: the same settings twice, and one thread instead of all.
    Different, within float32 rounding: the reference BLAS (when an optimized one is loaded by
    default) and the conv fallback."""
    source = tmp_path / "in.wav"
    sf.write(str(source), noisy_speech(RATE, 1.0, seed=9), RATE, subtype="FLOAT")
    outputs: dict[str, dict[str, np.ndarray]] = {}
    digests: dict[str, dict[str, str]] = {}
    blas_loaded = None
    for name, env in SETTINGS.items():
        folder = tmp_path / name
        folder.mkdir()
        done = subprocess.run([sys.executable, "-c", _CHILD, str(tiny_checkpoint), str(source),
                               str(folder)], capture_output=True, text=True, cwd=REPO,
                              timeout=300, check=False,
                              env={**_clean_env(), **env})
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        if name == "default":
            blas_loaded = report.pop("blas")
        report.pop("blas", None)
        digests[name] = {Path(k).stem: v for k, v in report.items()}
        outputs[name] = {mode: sf.read(str(folder / f"{mode}.wav"), dtype="float32")[0]
                         for mode in ("standard", "strict")}
    for name in ("default-again", "one-thread"):
        assert digests[name] == digests["default"], f"{name} is not byte-identical"
    changed = ["conv-fallback"] + (["reference-blas"] if blas_loaded else [])
    for name in changed:
        for mode in ("standard", "strict"):
            difference = np.abs(outputs[name][mode] - outputs["default"][mode]).max()
            assert 0 < difference <= ROUNDING, (name, mode, difference)
    if not blas_loaded:   # no optimized BLAS found: "off" is what the default already was
        assert digests["reference-blas"] == digests["default"]


def _clean_env() -> dict[str, str]:
    """This environment without the settings under test (a developer may have set them)."""
    drop = {"OPENBLAS_NUM_THREADS", "SPEECHLENS_CPU_THREADS", "SPEECHLENS_BLAS",
            kernels.DISABLE_CONV_ENV, kernels.DISABLE_CONV_ENV_ALIAS, "OMP_NUM_THREADS"}
    return {k: v for k, v in os.environ.items() if k not in drop}
