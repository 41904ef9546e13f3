"""The MLX model against the independent float64 reference (tests/reference.py).

Tolerances (waveform relative RMSE), the accuracy speechlens promises: <= 5e-5 on the tiny
checkpoint, <= 1e-4 on the full-size one. float32 rounding alone measures ~2-6e-6 here.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
import reference as ref

from speechlens_cli import checkpoint, enhance
from speechlens_cli.errors import AudioInputError
from speechlens_cli.model.stft import istft, stft
from speechlens_cli.synthetic.checkpoints import FULL_CONFIG, TINY_CONFIG, make_weights
from speechlens_cli.synthetic.speech import noisy_speech

TINY_BOUND = 5e-5
FULL_BOUND = 1e-4


def rel_rmse(actual: np.ndarray, expected: np.ndarray) -> float:
    return float(np.sqrt(np.mean((actual - expected) ** 2) / np.mean(expected**2)))


@pytest.fixture(scope="module")
def tiny_model(tiny_checkpoint):
    return checkpoint.load_model(tiny_checkpoint)


@pytest.fixture(scope="module")
def tiny_weights():
    return make_weights(TINY_CONFIG, seed=0, phase_gain=1.0)


def _signal(sample_rate: int, num_samples: int, seed: int = 0) -> np.ndarray:
    seconds = num_samples / sample_rate + 0.01
    return noisy_speech(sample_rate, seconds, seed=seed)[:num_samples].astype(np.float32)


@pytest.mark.parametrize("sample_rate", [8000, 16000, 22050, 44100, 48000])
@pytest.mark.parametrize("num_samples", [1, 7, 300, 1001, 4001])
def test_stft_matches_reference(tiny_model, sample_rate, num_samples):
    x = _signal(sample_rate, num_samples)
    params = tiny_model.config.stft_params(sample_rate)
    magnitude, phase = (np.array(a)[0].T for a in stft(mx.array(x)[None], params))
    ref_magnitude, ref_phase = ref.reference_stft(x.astype(np.float64), sample_rate, TINY_CONFIG)
    assert magnitude.shape == ref_magnitude.shape == (params.n_bins, 1 + num_samples // params.hop)
    # float32 FFT rounding: ~1e-6 absolute on bins near zero, ~1e-6 relative elsewhere.
    np.testing.assert_allclose(magnitude, ref_magnitude, rtol=1e-5, atol=1e-5)
    # Phase is compared modulo 2*pi, weighted by |X|: float32 FFT noise (~1e-6 absolute) moves
    # a bin's phase by about noise / |X|, so the displacement |X| * dphi is what must be small.
    wrapped = np.angle(np.exp(1j * (phase - ref_phase)))
    assert (np.abs(wrapped) * np.expm1(ref_magnitude)).max() < 1e-5


@pytest.mark.parametrize("num_samples", [1, 39, 40, 41, 161, 1003])
def test_istft_of_stft_keeps_length_and_signal(tiny_model, num_samples):
    x = _signal(8000, num_samples)
    params = tiny_model.config.stft_params(8000)
    magnitude, phase = stft(mx.array(x)[None], params)
    y = np.array(istft(magnitude, phase, params, num_samples))[0]
    assert y.shape == (num_samples,)
    reconstructed = params.hop * (num_samples // params.hop)  # the rest is the 1e-8 tail
    np.testing.assert_allclose(y[:reconstructed], x[:reconstructed], atol=1e-5)
    assert np.all(y[reconstructed:] == np.float32(1e-8))


@pytest.mark.parametrize("strict", [False, True], ids=["standard", "strict"])
@pytest.mark.parametrize("sample_rate", [8000, 16000, 44100, 48000])
def test_tiny_model_matches_float64_reference(tiny_model, tiny_weights, sample_rate, strict):
    x = _signal(sample_rate, sample_rate // 4 + 7)  # odd length, not a multiple of hop
    y = np.array(tiny_model.enhance(mx.array(x)[None], sample_rate, strict=strict))[0]
    expected = ref.reference_enhance(tiny_weights, TINY_CONFIG, x.astype(np.float64), sample_rate)
    assert y.shape == x.shape
    assert rel_rmse(y, expected) <= TINY_BOUND


def test_phase_path_at_full_strength_through_shared_stft(tiny_model, tiny_weights):
    """Both implementations read the same spectrum, so the phase input is identical."""
    sample_rate = 16000
    x = _signal(sample_rate, 4000, seed=3)
    params = tiny_model.config.stft_params(sample_rate)
    magnitude, phase = stft(mx.array(x)[None], params)
    y = np.array(tiny_model.enhance(mx.array(x)[None], sample_rate))[0]
    spectrum = (np.array(magnitude)[0].T.astype(np.float64),
                np.array(phase)[0].T.astype(np.float64))
    expected = ref.reference_enhance(tiny_weights, TINY_CONFIG, x.astype(np.float64), sample_rate,
                                     spectrum=spectrum)
    assert rel_rmse(y, expected) <= TINY_BOUND
    # The phase input really matters for these weights: flipping it changes the output a lot.
    flipped = np.array(tiny_model(magnitude, -phase)[0])
    assert np.abs(flipped - np.array(tiny_model(magnitude, phase)[0])).max() > 1e-2


@pytest.fixture(scope="module")
def full_model_and_expected(full_checkpoint):
    """The full-size model and the float64 reference output for one short 16 kHz input."""
    sample_rate = 16000
    x = _signal(sample_rate, 4001, seed=1)
    weights = make_weights(FULL_CONFIG, seed=0, phase_gain=1.0)
    expected = ref.reference_enhance(weights, FULL_CONFIG, x.astype(np.float64), sample_rate)
    return checkpoint.load_model(full_checkpoint), x, sample_rate, expected


@pytest.mark.slow
@pytest.mark.parametrize("strict", [False, True], ids=["standard", "strict"])
def test_full_size_model_matches_float64_reference(full_model_and_expected, strict,
                                                   monkeypatch):
    """Whole, and with its BiMambas' sequences in groups of at least 16 (GROUP_BYTES=1): the
    4,001 samples give 161 sequences one way (10 groups of 16 and one of 1) and 14 the other
    (one group). Each group after the first is a row slice starting inside its array, which the
    backend's kernels take as it is (on CUDA the precompiled projection kernels, which the tiny
    model's channel counts do not reach; a full-size 16 kHz file is split from 16.4 s on). Both
    within the full-size bound of the float64 reference; grouped within float32 rounding of
    whole (5e-6)."""
    from speechlens_cli.model import mamba

    model, x, sample_rate, expected = full_model_and_expected
    y = np.array(model.enhance(mx.array(x)[None], sample_rate, strict=strict))[0]
    assert y.shape == x.shape
    assert rel_rmse(y, expected) <= FULL_BOUND
    monkeypatch.setattr(mamba, "GROUP_BYTES", 1)
    grouped = np.array(model.enhance(mx.array(x)[None], sample_rate, strict=strict))[0]
    assert rel_rmse(grouped, expected) <= FULL_BOUND
    assert rel_rmse(grouped, y) <= 5e-6


@pytest.mark.parametrize("num_samples", [1, 2, 39, 40, 41, 159, 160, 161, 163, 2001])
def test_model_output_length_equals_input_length(tiny_model, num_samples):
    x = _signal(8000, num_samples)
    y = np.array(tiny_model.enhance(mx.array(x)[None], 8000))
    assert y.shape == (1, num_samples) and np.isfinite(y).all()


def test_api_enhances_each_channel_on_its_own(tiny_model):
    stereo = noisy_speech(8000, 0.3, channels=2, seed=5).astype(np.float32)
    both = enhance(stereo, 8000, model=tiny_model)
    assert both.shape == stereo.shape and both.dtype == np.float32
    for channel in range(2):
        np.testing.assert_array_equal(both[:, channel], enhance(stereo[:, channel], 8000,
                                                                model=tiny_model))


def test_api_accepts_model_path_and_keeps_odd_length(tiny_checkpoint):
    x = _signal(16000, 1601)
    assert enhance(x, 16000, model=tiny_checkpoint).shape == (1601,)


@pytest.mark.parametrize(
    "audio, rate, message",
    [
        (np.full(800, np.nan, np.float32), 8000, "NaN or Inf"),
        (_signal(4000, 800), 4000, "4000 Hz is not supported"),
        (_signal(8000, 100), 8000, "too short"),
        (np.zeros((800, 0), np.float32), 8000, "no channels"),
    ],
)
def test_api_rejects_bad_input_with_clear_message(tiny_model, audio, rate, message):
    """Speech where the input has samples: the checks must refuse what the model would
    otherwise run on (an all-zero channel never reaches it)."""
    with pytest.raises(AudioInputError, match=message):
        enhance(audio, rate, model=tiny_model)


@pytest.mark.parametrize("sample_rate", [8000, 48000])
def test_time_tiled_dense_blocks_match_reference_and_one_tile(tiny_model, tiny_weights,
                                                              sample_rate, monkeypatch):
    """Dense layers in 16-frame time tiles (halos of 1-8 frames, InstanceNorm statistics over
    all tiles) agree with the float64 reference within the tiny bound, and with the same
    model run as one tile to float32 rounding of the re-associated sums (5e-6). The tiles are
    the matmul form's (GPUs): the CPU's direct conv, which needs none, is switched off."""
    from speechlens_cli.model import layers, scheduling

    x = mx.array(_signal(sample_rate, sample_rate // 2 + 3))[None]
    whole = np.array(tiny_model.enhance(x, sample_rate))[0]
    frames = 1 + x.shape[1] // tiny_model.config.stft_params(sample_rate).hop
    monkeypatch.setattr(layers.kernels, "conv2d", lambda *args: None)
    monkeypatch.setattr(scheduling, "TILE_BYTES", {"cpu": 1, "gpu": 1})
    assert len(scheduling.time_tiles(frames + 2, 16, 64, 3)) >= frames // 16  # 16-row tiles
    tiled = np.array(tiny_model.enhance(x, sample_rate))[0]
    expected = ref.reference_enhance(tiny_weights, TINY_CONFIG,
                                     np.array(x[0]).astype(np.float64), sample_rate)
    assert rel_rmse(tiled, expected) <= TINY_BOUND
    assert rel_rmse(tiled, whole) <= 5e-6


def test_mamba_sequence_groups_match_reference_and_one_group(tiny_model, tiny_weights,
                                                             monkeypatch):
    """BiMambas over groups of 16 sequences (GROUP_BYTES=1) agree with the float64 reference
    within the tiny bound and with one group to float32 rounding (5e-6)."""
    from speechlens_cli.model import mamba

    x = mx.array(_signal(16000, 8003))[None]
    whole = np.array(tiny_model.enhance(x, 16000))[0]
    monkeypatch.setattr(mamba, "GROUP_BYTES", 1)
    grouped = np.array(tiny_model.enhance(x, 16000))[0]
    expected = ref.reference_enhance(tiny_weights, TINY_CONFIG,
                                     np.array(x[0]).astype(np.float64), 16000)
    assert rel_rmse(grouped, expected) <= TINY_BOUND
    assert rel_rmse(grouped, whole) <= 5e-6


@pytest.mark.parametrize("sample_rate,strict", [(8000, False), (48000, False), (16000, True)])
def test_long_window_tiles_match_reference_and_the_plain_path(tiny_model, tiny_weights,
                                                              sample_rate, strict, monkeypatch):
    """The encoder and the decoders' last stage in tiles (long_windows.py, forced here: every
    window counts as long), 12-row encoder tiles (4 at 48 kHz, fewer rows than the dense
    layers' context) and a partial last tile: within the tiny bound of the float64 reference,
    and within float32 rounding of the plain path (5e-6; the statistics are merged tile by
    tile instead of summed over the plane)."""
    from speechlens_cli.model import encoder_decoders, long_windows

    x = mx.array(_signal(sample_rate, sample_rate // 2 + 3))[None]
    plain = np.array(tiny_model.enhance(x, sample_rate, strict=strict))[0]
    monkeypatch.setattr(long_windows, "LONG_PLANE_BYTES", {"cpu": 0, "gpu": 0})
    monkeypatch.setattr(long_windows, "TILE_PLANE_BYTES", 12 * 4 * 163 * 16)
    calls = []
    for owner, name in ((long_windows.TiledEncoder, "__call__"),
                        (encoder_decoders, "decode_last_stage")):
        original = getattr(owner, name)
        monkeypatch.setattr(owner, name, lambda *a, _f=original, _n=name: (calls.append(_n),
                                                                           _f(*a))[1])
    tiled = np.array(tiny_model.enhance(x, sample_rate, strict=strict))[0]
    assert calls == ["__call__", "decode_last_stage", "decode_last_stage"]  # tiles ran
    expected = ref.reference_enhance(tiny_weights, TINY_CONFIG,
                                     np.array(x[0]).astype(np.float64), sample_rate)
    assert rel_rmse(tiled, expected) <= TINY_BOUND
    assert rel_rmse(tiled, plain) <= 5e-6


@pytest.mark.slow
def test_full_size_model_in_long_window_tiles_matches_float64_reference(
        full_model_and_expected, monkeypatch):
    from speechlens_cli.model import long_windows

    model, x, sample_rate, expected = full_model_and_expected
    monkeypatch.setattr(long_windows, "LONG_PLANE_BYTES", {"cpu": 0, "gpu": 0})
    monkeypatch.setattr(long_windows, "TILE_PLANE_BYTES", 2 * 2**20)  # 8-row encoder tiles
    y = np.array(model.enhance(mx.array(x)[None], sample_rate))[0]
    assert rel_rmse(y, expected) <= FULL_BOUND


def test_plane_statistics_merged_tile_by_tile_match_float64():
    """PlaneStats over unequal tiles (one of a single row) against the whole plane in
    float64, on values with a large mean (where a one-pass sum of squares would cancel)."""
    from speechlens_cli.model.layers import PlaneStats

    plane = (100 + np.random.default_rng(2).standard_normal((2, 37, 29, 8))).astype(np.float32)
    stats = PlaneStats()
    for start, end in ((0, 16), (16, 17), (17, 37)):
        mx.eval(stats.add(mx.array(plane[:, start:end])))
    mean, var = (np.array(a) for a in stats.mean_variance())
    exact = plane.astype(np.float64)
    assert np.abs(mean - exact.mean(axis=(1, 2))).max() <= 1e-6 * 100
    assert np.abs(var / exact.var(axis=(1, 2)) - 1).max() <= 1e-5


def test_rows_with_halo_pads_zeros_outside_the_plane():
    from speechlens_cli.model.scheduling import rows_with_halo

    plane = mx.arange(1, 6, dtype=mx.float32).reshape(1, 5, 1, 1)
    assert np.array(rows_with_halo(plane, 0, 2, 2)).ravel().tolist() == [0, 0, 1, 2, 3, 4]
    assert np.array(rows_with_halo(plane, 3, 5, 2)).ravel().tolist() == [2, 3, 4, 5, 0, 0]
    assert np.array(rows_with_halo(plane, 2, 3, 1)).ravel().tolist() == [2, 3, 4]


def test_digital_silence_inside_speech_runs_through_the_model_like_the_reference(
        tiny_model, tiny_weights):
    """Speech after 0.2 s of exact zeros (a recording's muted lead-in): the channel is not all
    zero, so the model runs on frames whose spectrum is exactly zero (magnitude 0, phase of
    atan2(0, 0)) as well as on the speech. Finite, and within the tiny bound of the float64
    reference both as a whole and over the lead-in alone (where these random weights put out
    about twice the speech's level: ~3e-6 measured, float32 rounding)."""
    x = _signal(8000, 3200, seed=4)
    x[:1600] = 0.0
    y = enhance(x, 8000, model=tiny_model)
    expected = ref.reference_enhance(tiny_weights, TINY_CONFIG, x.astype(np.float64), 8000)
    assert np.isfinite(y).all()
    assert rel_rmse(y, expected) <= TINY_BOUND
    assert rel_rmse(y[:1600], expected[:1600]) <= TINY_BOUND


def test_a_channel_of_digital_silence_stays_silent_without_the_model(tiny_model, monkeypatch):
    """api.enhance_channels leaves an all-zero channel exactly zero and never runs the model on
    it; the other channel of the same call is the model's output for it alone."""
    stereo = np.stack([_signal(8000, 1600, seed=6), np.zeros(1600, np.float32)], axis=1)
    alone = enhance(stereo[:, 0], 8000, model=tiny_model)
    lengths = []
    run = type(tiny_model).enhance
    monkeypatch.setattr(type(tiny_model), "enhance",
                        lambda self, audio, *a, **k: (lengths.append(audio.shape),
                                                      run(self, audio, *a, **k))[1])
    both = enhance(stereo, 8000, model=tiny_model)
    assert lengths == [(1, 1600)]  # one model run: the speech channel's
    np.testing.assert_array_equal(both[:, 0], alone)
    assert not both[:, 1].any()


def test_instance_norm_sums_stay_accurate_on_a_30s_48khz_plane():
    """5.8M elements (one 30-s 48 kHz T x F plane): plain float32 sums drift ~3e-5 here."""
    from speechlens_cli.model.layers import accurate_sum

    values = np.random.default_rng(0).random((1, 5_800_000, 2)).astype(np.float32)
    exact = values.astype(np.float64).sum(axis=1)
    assert np.abs(np.array(accurate_sum(mx.array(values))) / exact - 1).max() < 1e-6


def test_a_failing_model_run_is_one_typed_error(tiny_model, monkeypatch):
    """An MLX failure (e.g. out of memory on a GPU) becomes EnhancementError, not a traceback."""
    from speechlens_cli.errors import EnhancementError

    def out_of_memory(*_args, **_kwargs):
        raise RuntimeError("cudaMallocAsync(&data, size, stream) failed: out of memory")

    monkeypatch.setattr(type(tiny_model), "enhance", out_of_memory)
    with pytest.raises(EnhancementError, match="out of memory.*--chunk-seconds"):
        enhance(_signal(8000, 800), 8000, model=tiny_model)


def test_two_direction_weights_follow_a_replaced_parameter(tiny_model):
    """BiMamba.weights derives the two-direction layout once, and again after any parameter it
    is built from is replaced (a checkpoint loaded into the same model)."""
    bimamba = tiny_model.TSMamba[0].time_mamba
    first = bimamba.weights()
    assert bimamba.weights() is first
    old = bimamba.backward_blocks.out_proj.weight
    bimamba.backward_blocks.out_proj.weight = old * 2.0
    try:
        second = bimamba.weights()
        assert second is not first
        inner = old.shape[1]
        assert np.allclose(np.array(second.merge_y[inner:]), 2 * np.array(first.merge_y[inner:]),
                           rtol=1e-6, atol=1e-7)
    finally:
        bimamba.backward_blocks.out_proj.weight = old



def test_a_loaded_model_has_every_two_direction_layout_ready(tiny_checkpoint, monkeypatch):
    """load_model derives every BiMamba's two-direction weights (SEMamba.prepare), so a first
    window derives none: deriving them inside the first window ran NumPy next to the kernels."""
    from speechlens_cli import checkpoint
    from speechlens_cli.model import mamba

    model = checkpoint.load_model(tiny_checkpoint)

    def derived_again(**_fields):
        pytest.fail("a BiMamba's weights were derived inside the first window")

    monkeypatch.setattr(mamba, "BiMambaWeights", derived_again)
    out = enhance(_signal(8000, 800), 8000, model=model)
    assert out.shape == (800,) and np.isfinite(out).all()


@pytest.mark.parametrize("device,seconds,rate,tiled", [
    ("gpu", 30, 48000, True), ("gpu", 30, 44100, True), ("gpu", 5, 48000, False),
    ("gpu", 30, 16000, False), ("cpu", 30, 48000, False)])
def test_only_long_windows_on_a_gpu_run_in_tiles(device, seconds, rate, tiled, monkeypatch):
    """The encoder's full-resolution plane (64 channels, the STFT's frames and bins + 2)
    decides; the CPU never tiles."""
    from speechlens_cli.model import long_windows
    from speechlens_cli.model.config import ModelConfig

    monkeypatch.setattr(long_windows.mx, "default_device",
                        lambda: mx.cpu if device == "cpu" else mx.gpu)
    stft = ModelConfig.from_dict(FULL_CONFIG).stft_params(rate)
    frames = seconds * rate // stft.hop + 1
    assert long_windows.is_long((1, frames + 2, stft.n_fft // 2 + 3), 64) is tiled
