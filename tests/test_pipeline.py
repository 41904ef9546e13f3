"""The streaming pipeline: window geometry, cross-fade, exact lengths, formats, bounded memory.

Real-model tests use the tiny fixture checkpoint at 8 kHz with 0.1-s windows (800 samples,
200 cross-faded) - a geometry below the CLI's 5-30 s range, which only the CLI and the API check.
Pure geometry tests use stand-in window functions, so they cover many lengths in milliseconds.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from speechlens_cli import checkpoint
from speechlens_cli.api import enhance_channels, enhance_file
from speechlens_cli.audio import OutputFormat
from speechlens_cli.errors import AudioInputError, EnhancementError, UsageError
from speechlens_cli.pipeline import (
    DEFAULT_OVERLAP,
    Geometry,
    check_atten_lim,
    check_settings,
    crossfade_weights,
    enhance_stream,
)
from speechlens_cli.synthetic.speech import noisy_speech

REPO = Path(__file__).resolve().parents[1]
RATE = 8000
GEOMETRY = Geometry(chunk=800, overlap=200)
FLOAT_WAV = OutputFormat("WAV", "FLOAT")
#: Float32 WAV stores the model's float32 output exactly; the same window run twice is identical
#: up to float32 rounding of the cross-fade arithmetic.
EXACT = 1e-6


@pytest.fixture(scope="module")
def model(tiny_checkpoint):
    return checkpoint.load_model(tiny_checkpoint)


def model_window(model, rate=RATE):
    return lambda window: enhance_channels(model, window, rate, False)


def write_input(path: Path, data: np.ndarray, rate=RATE, subtype="FLOAT", fmt="WAV") -> np.ndarray:
    """Write `data` and return what a reader gets back (quantised to the subtype), [N, C]."""
    sf.write(str(path), data, rate, subtype=subtype, format=fmt)
    return sf.read(str(path), dtype="float32", always_2d=True)[0]


def read_output(path: Path) -> np.ndarray:
    return sf.read(str(path), dtype="float32", always_2d=True)[0]


# ------------------------------------------------------------------------------ geometry

@pytest.mark.parametrize("frames, geometry, starts", [
    (2600, Geometry(800, 200), [0, 600, 1200, 1800]),
    (2400, Geometry(800, 0), [0, 800, 1600]),
    (2000, Geometry(800, 0), [0, 800, 1200]),   # the last window ends at the end of the file
    (801, Geometry(800, 200), [0, 1]),
    (800, Geometry(800, 200), [0]),
    (799, Geometry(800, 200), [0]),
    (1, Geometry(800, 200), [0]),
])
def test_window_starts(frames, geometry, starts):
    assert geometry.starts(frames) == starts


def test_geometry_from_seconds_and_limits():
    assert Geometry.from_seconds(5.0, DEFAULT_OVERLAP, 16000) == Geometry(80000, 4000)
    assert Geometry.from_seconds(5.0, 0.5, 44100) == Geometry(220500, 110250)
    with pytest.raises(UsageError):
        Geometry(800, 401)   # a fade longer than half a window would overlap the next fade
    for chunk_seconds, overlap in ((4.99, 0.05), (30.01, 0.05), (5, -0.01), (5, 0.51),
                                   (math.nan, 0.05), (5, math.nan)):
        with pytest.raises(UsageError):
            check_settings(chunk_seconds, overlap)
    check_settings(5, 0)
    check_settings(30, 0.5)


def test_crossfade_weights_are_sin2_cos2_and_sum_to_one():
    fade_in, fade_out = crossfade_weights(4)
    t = (np.arange(4) + 0.5) / 4
    np.testing.assert_allclose(fade_in[:, 0], np.sin(np.pi / 2 * t) ** 2, atol=1e-15)
    np.testing.assert_allclose(fade_out[:, 0], np.cos(np.pi / 2 * t) ** 2, atol=1e-15)
    np.testing.assert_allclose(fade_in + fade_out, 1.0, atol=1e-15)


@pytest.mark.parametrize("chunk", [1, 2, 5, 8])
def test_identity_windows_reproduce_input_for_every_length(tmp_path, chunk):
    """With an identity 'model' the output equals the input: every sample is covered, the
    weights sum to one, and the length is exact (1 frame up to several windows)."""
    rng = np.random.default_rng(chunk)
    for overlap in range(chunk // 2 + 1):
        geometry = Geometry(chunk, overlap)
        for frames in range(1, 4 * chunk + 3):
            data = rng.uniform(-0.9, 0.9, (frames, 2)).astype(np.float32)
            src, dst = tmp_path / "in.wav", tmp_path / "out.wav"
            expected = write_input(src, data)
            seen = []
            result = enhance_stream(src, dst, lambda w, seen=seen: seen.append(len(w)) or w.copy(),
                                    geometry, FLOAT_WAV)
            out = read_output(dst)
            assert result.frames == frames and out.shape == (frames, 2)
            np.testing.assert_allclose(out, expected, atol=1e-7)
            assert seen == [min(chunk, frames)] * len(geometry.starts(frames))


def test_crossfade_is_continuous(tmp_path):
    """Windows returning constant levels 1, 2, 3: across a seam the output moves at most
    pi/(2*overlap) of the level difference per sample (the largest slope of sin^2); a hard cut
    (overlap 0) jumps by the whole difference."""
    src = tmp_path / "in.wav"
    write_input(src, np.zeros((2600, 1), np.float32))
    for overlap, bound in ((200, math.pi / 400 + 1e-6), (0, 1.0)):
        levels = iter([1.0, 2.0, 3.0, 4.0])
        dst = tmp_path / f"out{overlap}.wav"
        enhance_stream(src, dst, lambda w, levels=levels: np.full_like(w, next(levels)),
                       Geometry(800, overlap), FLOAT_WAV)
        out = read_output(dst)[:, 0]
        steps = np.abs(np.diff(out))
        assert out[0] == 1.0 and out[-1] == 4.0 and np.all(np.diff(out) >= 0)
        assert steps.max() <= bound
        if overlap == 0:
            assert steps.max() == 1.0


def test_reads_in_blocks_never_the_whole_file(tmp_path, monkeypatch):
    """Every read asks for at most one window, and each frame is read exactly once."""
    src, dst = tmp_path / "in.wav", tmp_path / "out.wav"
    write_input(src, np.zeros((100_003, 1), np.float32))
    reads = []
    original = sf.SoundFile.read

    def spy(self, frames=-1, *args, **kwargs):
        reads.append(frames)
        return original(self, frames, *args, **kwargs)

    monkeypatch.setattr(sf.SoundFile, "read", spy)
    enhance_stream(src, dst, lambda w: w.copy(), Geometry(1000, 250), FLOAT_WAV)
    assert reads and max(reads) <= 1000 and min(reads) > 0
    assert sum(reads) == 100_003


def test_integer_output_clamps_and_counts_float_keeps_peaks(tmp_path):
    src = tmp_path / "in.wav"
    data = write_input(src, np.linspace(-0.5, 0.5, 1001, dtype=np.float32)[:, None])
    loud = np.count_nonzero(np.abs(4 * data) > 1.0)
    for fmt, expected_clamped in ((OutputFormat("WAV", "PCM_16"), loud), (FLOAT_WAV, 0)):
        dst = tmp_path / f"out_{fmt.subtype}.wav"
        result = enhance_stream(src, dst, lambda w: 4 * w, Geometry(300, 50), fmt)
        out = read_output(dst)
        assert result.clamped == expected_clamped
        if fmt.is_integer:
            assert np.abs(out).max() == 1.0 and loud > 0
        else:
            np.testing.assert_allclose(out, 4 * data, atol=EXACT)   # peaks of 2.0 kept


@pytest.mark.parametrize("bad, message", [(np.nan, "NaN or Inf"), (np.inf, "NaN or Inf")])
def test_non_finite_samples_are_rejected(tmp_path, bad, message):
    src, dst = tmp_path / "in.wav", tmp_path / "out.wav"
    data = np.zeros((900, 1), np.float32)
    data[850] = bad
    write_input(src, data)
    with pytest.raises(AudioInputError, match=message):
        enhance_stream(src, dst, lambda w: w.copy(), Geometry(400, 100), FLOAT_WAV)


# ------------------------------------------------------------------------------ real model

def test_each_window_equals_the_model_on_that_window_alone(tmp_path, model):
    """2600 samples, windows at 0/600/1200/1800 (800 long, 200 cross-faded): outside the seams
    the output is exactly the model's output for that window alone, inside them the sin^2/cos^2
    blend of the two neighbours."""
    src, dst = tmp_path / "in.wav", tmp_path / "out.wav"
    x = write_input(src, noisy_speech(RATE, 2600 / RATE, seed=3)[:, None])
    enhance_stream(src, dst, model_window(model), GEOMETRY, FLOAT_WAV)
    out = read_output(dst)
    assert out.shape == x.shape
    starts, chunk, fade = [0, 600, 1200, 1800], 800, 200
    alone = [enhance_channels(model, x[s:s + chunk], RATE, False) for s in starts]
    t = (np.arange(fade) + 0.5) / fade
    w_in, w_out = np.sin(np.pi / 2 * t)[:, None] ** 2, np.cos(np.pi / 2 * t)[:, None] ** 2
    for k, s in enumerate(starts):
        body_from = s + fade if k else 0
        body_to = s + chunk - fade if k < len(starts) - 1 else s + chunk
        np.testing.assert_allclose(out[body_from:body_to], alone[k][body_from - s:body_to - s],
                                   atol=EXACT)
        if k:
            seam = slice(s, s + fade)
            blended = alone[k - 1][chunk - fade:] * w_out + alone[k][:fade] * w_in
            np.testing.assert_allclose(out[seam], blended, atol=EXACT)


def test_no_overlap_is_the_exact_concatenation(tmp_path, model):
    src, dst = tmp_path / "in.wav", tmp_path / "out.wav"
    x = write_input(src, noisy_speech(RATE, 2400 / RATE, seed=4)[:, None])
    result = enhance_stream(src, dst, model_window(model), Geometry(800, 0), FLOAT_WAV)
    expected = np.concatenate([enhance_channels(model, x[s:s + 800], RATE, False)
                               for s in (0, 800, 1600)])
    assert result.windows == 3
    np.testing.assert_array_equal(read_output(dst), expected)


@pytest.mark.parametrize("frames", [320, 1001, 799, 801, 2600],
                         ids=["one-stft-frame", "odd", "chunk-1", "chunk+1", "several-chunks"])
def test_output_length_equals_input_length(tmp_path, model, frames):
    src, dst = tmp_path / "in.wav", tmp_path / "out.wav"
    write_input(src, noisy_speech(RATE, frames / RATE, seed=5)[:, None])
    result = enhance_stream(src, dst, model_window(model), GEOMETRY, FLOAT_WAV)
    assert result.frames == frames
    assert sf.info(str(dst)).frames == frames
    assert np.isfinite(read_output(dst)).all()


# ------------------------------------------------------------------------------ attenuation limit

@pytest.mark.parametrize("subtype", ["FLOAT", "PCM_16"])
def test_a_0_db_limit_returns_the_input_unchanged(tmp_path, model, subtype):
    """Model windows, cross-faded seams and all: every sample comes back as it was read."""
    src, dst = tmp_path / "in.wav", tmp_path / "out.wav"
    x = write_input(src, noisy_speech(RATE, 2600 / RATE, channels=2, seed=6), subtype=subtype)
    result = enhance_stream(src, dst, model_window(model), GEOMETRY,
                            OutputFormat("WAV", subtype), atten_lim_db=0.0)
    assert result.windows == 4
    np.testing.assert_array_equal(read_output(dst), x)
    if subtype == "PCM_16":
        assert sf.read(str(dst), dtype="int16")[0].tobytes() == \
            sf.read(str(src), dtype="int16")[0].tobytes()


def test_no_limit_is_the_enhanced_output_bit_for_bit(tmp_path, model):
    """No limit and an infinite one are both the plain enhanced stream; a finite one is not."""
    src = tmp_path / "in.wav"
    write_input(src, noisy_speech(RATE, 2600 / RATE, seed=7)[:, None])
    outputs = {}
    for limit in (None, math.inf, 12.0):
        dst = tmp_path / f"out-{limit}.wav"
        enhance_stream(src, dst, model_window(model), GEOMETRY, FLOAT_WAV, atten_lim_db=limit)
        outputs[limit] = dst.read_bytes()
    plain = tmp_path / "plain.wav"
    enhance_stream(src, plain, model_window(model), GEOMETRY, FLOAT_WAV)
    assert outputs[None] == outputs[math.inf] == plain.read_bytes()
    assert outputs[12.0] != outputs[None]


@pytest.mark.parametrize("limit", [6.0, 20.0])
def test_a_finite_limit_bounds_the_attenuation_of_every_sample(tmp_path, limit):
    """A model that only attenuates (a per-sample gain in [0, 1], different in every window, so
    the seams blend two gains) brings no sample more than `limit` dB down; one that removes
    everything (gain 0) leaves the input exactly `limit` dB down. Length exact, 4 windows."""
    src = tmp_path / "in.wav"
    x = write_input(src, noisy_speech(RATE, 2600 / RATE, seed=8)[:, None])
    floor = 10 ** (-limit / 20)
    rng = np.random.default_rng(0)
    masks = {"random": lambda w: (rng.uniform(0, 1, w.shape) * w).astype(np.float32),
             "silence": np.zeros_like}
    for kind, window_fn in masks.items():
        dst = tmp_path / f"{kind}.wav"
        result = enhance_stream(src, dst, window_fn, GEOMETRY, FLOAT_WAV, atten_lim_db=limit)
        out = read_output(dst)
        assert (result.windows, len(out)) == (4, len(x))
        loud = np.abs(x) > 1e-4
        gain = out[loud] / x[loud]
        assert gain.min() >= floor * (1 - 1e-5) and gain.max() <= 1 + 1e-5
        if kind == "silence":
            np.testing.assert_allclose(gain, floor, rtol=1e-5)
        else:
            assert gain.min() < floor * 1.1   # the bound is reached, not merely respected


@pytest.mark.parametrize("bad", [-3.0, math.nan])
def test_a_negative_or_nan_limit_is_refused(bad):
    with pytest.raises(UsageError, match="attenuation limit"):
        check_atten_lim(bad)


def test_stereo_channels_equal_their_mono_runs(tmp_path, model):
    """Each channel of a stereo file, enhanced in windows, matches that channel run alone
    within 1e-5 (float32 rounding; the model sees the same samples either way)."""
    stereo = write_input(tmp_path / "stereo.wav", noisy_speech(RATE, 1000 / RATE, channels=2,
                                                                seed=6))
    enhance_stream(tmp_path / "stereo.wav", tmp_path / "stereo_out.wav", model_window(model),
                   GEOMETRY, FLOAT_WAV)
    both = read_output(tmp_path / "stereo_out.wav")
    assert both.shape == (1000, 2)
    assert not np.allclose(stereo[:, 0], stereo[:, 1])  # the channels really differ
    for channel in range(2):
        mono_in, mono_out = tmp_path / f"mono{channel}.wav", tmp_path / f"mono{channel}_out.wav"
        write_input(mono_in, stereo[:, channel])
        enhance_stream(mono_in, mono_out, model_window(model), GEOMETRY, FLOAT_WAV)
        np.testing.assert_allclose(both[:, channel], read_output(mono_out)[:, 0], atol=1e-5)


@pytest.mark.parametrize("name, rate, frames, subtype, fmt, tolerance", [
    ("pcm16.wav", 8000, 500, "PCM_16", "WAV", 1 / 2 ** 15),
    ("pcm24.wav", 16000, 700, "PCM_24", "WAV", 1 / 2 ** 23),
    ("float.wav", 22050, 900, "FLOAT", "WAV", EXACT),
    ("pcm16.flac", 8000, 500, "PCM_16", "FLAC", 1 / 2 ** 15),
])
def test_formats_keep_subtype_rate_and_samples(tmp_path, tiny_checkpoint, model, name, rate,
                                               frames, subtype, fmt, tolerance):
    """Through the public API: same container, subtype, rate and length; the samples are the
    model's output written through the same subtype (tolerance: one least significant bit, for
    a float32 difference that lands on the other side of a rounding step)."""
    src, dst = tmp_path / name, tmp_path / f"out_{name}"
    x = write_input(src, noisy_speech(rate, frames / rate, seed=7), rate, subtype, fmt)
    result = enhance_file(src, dst, model=model)
    info = sf.info(str(dst))
    assert (info.format, info.subtype, info.samplerate, info.frames, info.channels) == \
        (fmt, subtype, rate, frames, 1)
    assert result["subtype"] == subtype and result["frames"] == frames
    expected = write_input(tmp_path / f"expected_{name}", enhance_channels(model, x, rate, False),
                           rate, subtype, fmt)
    np.testing.assert_allclose(read_output(dst), expected, atol=tolerance)


def test_api_checks_the_window_settings(tmp_path, model):
    with pytest.raises(UsageError, match="chunk length"):
        enhance_file(tmp_path / "a.wav", tmp_path / "b.wav", model=model, chunk_seconds=1.0)


# ------------------------------------------------------------------------------ window policy

def test_a_file_up_to_30_s_runs_as_one_window_longer_ones_in_30_s_windows(model, on_cpu,
                                                                        monkeypatch):
    """The default (no --chunk-seconds): the whole file as one window, no cross-fade, up to
    30 s; beyond, 30-s windows with the default overlap; a forced length as before."""
    from speechlens_cli import pipeline

    monkeypatch.setattr(pipeline, "available_bytes", lambda: None)  # nothing to bound it here
    cfg = model.config

    def plan(frames: int, chunk_seconds: float | None = None) -> Geometry:
        return pipeline.plan_windows(cfg, frames, RATE, chunk_seconds, DEFAULT_OVERLAP, "a.wav")

    assert plan(400) == Geometry(400, 0)
    assert plan(7 * RATE) == Geometry(7 * RATE, 0)
    assert plan(30 * RATE) == Geometry(30 * RATE, 0)
    assert plan(30 * RATE + 1) == Geometry(30 * RATE, int(DEFAULT_OVERLAP * 30 * RATE))
    assert plan(7 * RATE, 5.0) == Geometry.from_seconds(5.0, DEFAULT_OVERLAP, RATE)


def test_without_room_for_a_whole_file_the_windows_are_the_longest_that_fit(model, on_cpu,
                                                                          monkeypatch):
    """Where the memory budget holds less than the file (host memory: the CPU, a Mac), the
    windows are the longest that fit, never below 5 s; below that, the window is refused in
    one line before MLX allocates, as a forced length is."""
    from speechlens_cli import pipeline

    cfg = model.config
    room = pipeline.window_bytes(cfg, 12 * RATE, RATE)
    monkeypatch.setattr(pipeline, "available_bytes", lambda: room)
    geometry = pipeline.plan_windows(cfg, 20 * RATE, RATE, None, DEFAULT_OVERLAP, "a.wav")
    assert pipeline.window_bytes(cfg, geometry.chunk, RATE) <= room
    assert pipeline.window_bytes(cfg, geometry.chunk + 1000, RATE) > room
    assert 11 * RATE < geometry.chunk <= 12 * RATE + 1000
    assert geometry.overlap == int(DEFAULT_OVERLAP * geometry.chunk)
    monkeypatch.setattr(pipeline, "available_bytes",
                        lambda: pipeline.window_bytes(cfg, 4 * RATE, RATE))
    with pytest.raises(EnhancementError, match="a.wav: a window of 5 s at 8000 Hz needs"):
        pipeline.plan_windows(cfg, 20 * RATE, RATE, None, DEFAULT_OVERLAP, "a.wav")


def test_a_file_alone_is_the_whole_file_result(tmp_path, model):
    """enhance_file's default on a 7-s file is the model on the whole signal, bit for bit, as
    NVIDIA's scripts compute it (5-s windows made it two windows and a cross-fade)."""
    src, dst = tmp_path / "in.wav", tmp_path / "out.wav"
    x = write_input(src, noisy_speech(RATE, 7.0, seed=8)[:, None])
    result = enhance_file(src, dst, model=model)
    assert result["windows"] == 1
    np.testing.assert_array_equal(read_output(dst), enhance_channels(model, x, RATE, False))


# ------------------------------------------------------------------------------ memory

_MEASURE = textwrap.dedent("""
    import json, resource, sys
    import mlx.core as mx, numpy as np, soundfile as sf
    from speechlens_cli import checkpoint, runtime
    runtime.prepare()   # as the CLI, but after MLX (its own BLAS)
    from speechlens_cli.api import enhance_channels
    from speechlens_cli.audio import OutputFormat
    from speechlens_cli.pipeline import Geometry, enhance_stream
    ckpt, frames, folder = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    model = checkpoint.load_model(ckpt)
    rng = np.random.default_rng(0)
    sf.write(folder + "/in.wav", (0.1 * rng.standard_normal(frames)).astype(np.float32), 8000,
             subtype="FLOAT")
    mx.reset_peak_memory()
    enhance_stream(folder + "/in.wav", folder + "/out.wav",
                   lambda w: enhance_channels(model, w, 8000, False), Geometry(400, 100),
                   OutputFormat("WAV", "FLOAT"))
    print(json.dumps({"mlx_peak": mx.get_peak_memory(),
                      "rss_peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
""")


def _peak(tiny_checkpoint, frames: int, folder: Path) -> dict:
    folder.mkdir()
    done = subprocess.run([sys.executable, "-c", _MEASURE, str(tiny_checkpoint), str(frames),
                           str(folder)], capture_output=True, text=True, cwd=REPO, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.slow
def test_peak_memory_does_not_grow_with_file_length(tmp_path, tiny_checkpoint):
    """Two fresh processes enhance 1,000 and 10,000 samples (3 vs 33 windows of 400 at 8 kHz).
    Compared: MLX's peak allocation during enhancement plus the process's peak RSS (which holds
    the interpreter, libraries and model); the long run must stay within 10% of the short one.
    A pipeline that ran the model on the whole file at once would multiply the MLX peak ~10x."""
    short = _peak(tiny_checkpoint, 1_000, tmp_path / "short")
    long = _peak(tiny_checkpoint, 10_000, tmp_path / "long")
    def total(peak: dict) -> int:
        return peak["mlx_peak"] + peak["rss_peak"]

    assert total(long) <= 1.10 * total(short), (short, long)
    assert long["mlx_peak"] <= 1.10 * short["mlx_peak"], (short, long)


def test_soundfile_still_has_what_audio_libsndfile_needs(tmp_path):
    """soundfile has no public call for leaving out the PEAK chunk or for the errno behind
    libsndfile's "System error."; audio/libsndfile.py uses its cffi handles for both. A soundfile
    release without them must fail here, loudly, instead of quietly losing the disk-full reason
    (the PEAK stamp would also fail the determinism tests)."""
    from speechlens_cli.audio import libsndfile

    api = libsndfile._private_api()
    assert api is not None and hasattr(api[1], "errno")
    path = tmp_path / "float.wav"
    with sf.SoundFile(str(path), "w", 8000, 1, "FLOAT") as sink:
        libsndfile.leave_out_peak_chunk(sink)
        sink.write(np.zeros(16, np.float32))
    assert b"PEAK" not in path.read_bytes()
