"""The synthetic fixtures match the official checkpoint layout and are deterministic."""

from __future__ import annotations

import itertools
import json
import math
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from fixtures.audio import AUDIO_FIXTURES, write_audio_fixtures
from speechlens_cli.model.config import ModelConfig
from speechlens_cli.model.layout import expected_shapes
from speechlens_cli.synthetic.checkpoints import (
    FULL_CONFIG,
    PHASE_INPUT_KEY,
    TINY_CONFIG,
    make_weights,
    write_checkpoint,
)
from speechlens_cli.synthetic.speech import noisy_speech, speech_like

REPO = Path(__file__).resolve().parents[1]


def read_safetensors(path: Path) -> tuple[dict, dict[str, np.ndarray]]:
    """Parse a safetensors file by hand (format check independent of any loader)."""
    raw = path.read_bytes()
    (header_len,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + header_len].decode("utf-8"))
    data = raw[8 + header_len:]
    metadata = header.pop("__metadata__", None)
    tensors, spans = {}, []
    for key, entry in header.items():
        assert set(entry) == {"dtype", "shape", "data_offsets"}, key
        assert entry["dtype"] == "F32", key
        start, end = entry["data_offsets"]
        assert end - start == 4 * math.prod(entry["shape"]), key
        spans.append((start, end))
        tensors[key] = np.frombuffer(data[start:end], "<f4").reshape(entry["shape"])
    spans.sort()
    assert spans[0][0] == 0 and spans[-1][1] == len(data)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(spans)), "gaps or overlaps in data"
    return metadata, tensors


@pytest.fixture(scope="module")
def full_tensors(full_checkpoint):
    return read_safetensors(full_checkpoint / "model.safetensors")


def test_full_checkpoint_layout(full_checkpoint, full_tensors):
    metadata, tensors = full_tensors
    assert metadata == {"format": "pt"}
    assert len(tensors) == 1416
    assert sum(t.size for t in tensors.values()) == 9_607_747
    shapes = expected_shapes(ModelConfig.from_dict(FULL_CONFIG))
    assert set(tensors) == set(shapes)
    for key, shape in shapes.items():
        assert tensors[key].shape == shape, key
        assert tensors[key].dtype == np.float32, key
        assert np.isfinite(tensors[key]).all(), key
    prefix = "TSMamba.0.time_mamba.forward_blocks"
    assert tensors[f"{prefix}.conv1d.weight"].shape == (256, 1, 4)
    assert tensors[f"{prefix}.A_log"].shape == (256, 16)
    assert tensors[f"{prefix}.in_proj.weight"].shape == (512, 64)
    assert tensors[f"{prefix}.x_proj.weight"].shape == (36, 256)
    assert tensors[f"{prefix}.dt_proj.weight"].shape == (256, 4)
    assert tensors["dense_encoder.dense_conv_1.0.weight"].shape == (64, 2, 1, 1)
    assert tensors["mask_decoder.up_conv2.0.conv.weight"].shape == (256, 64, 1, 3)
    assert tensors["phase_decoder.phase_conv_i.weight"].shape == (1, 64, 1, 1)


def test_config_round_trips(full_checkpoint, tiny_checkpoint):
    for directory, config in ((full_checkpoint, FULL_CONFIG), (tiny_checkpoint, TINY_CONFIG)):
        loaded = json.loads((directory / "config.json").read_text())
        assert loaded == config
        cfg = ModelConfig.from_dict(loaded)
        assert cfg.num_tfmamba == config["model_cfg"]["num_tfmamba"]
        assert cfg.hid_feature == config["model_cfg"]["hid_feature"]
    full, tiny = FULL_CONFIG["model_cfg"], TINY_CONFIG["model_cfg"]
    assert full.keys() == tiny.keys()
    assert {name for name in full if full[name] != tiny[name]} == {"num_tfmamba", "hid_feature"}
    assert TINY_CONFIG["stft_cfg"] == FULL_CONFIG["stft_cfg"]
    assert ModelConfig.from_dict(FULL_CONFIG) == ModelConfig()  # the official defaults


def test_mamba_style_initialisation(full_tensors):
    _, tensors = full_tensors
    prefix = "TSMamba.7.freq_mamba.backward_blocks"
    np.testing.assert_allclose(tensors[f"{prefix}.A_log"],
                               np.broadcast_to(np.log(np.arange(1, 17)), (256, 16)), rtol=1e-6)
    assert (tensors[f"{prefix}.D"] == 1).all()
    dt = np.log1p(np.exp(tensors[f"{prefix}.dt_proj.bias"].astype(np.float64)))
    assert dt.min() >= 1e-3 * 0.999 and dt.max() <= 1e-1 * 1.001
    assert np.abs(tensors[f"{prefix}.dt_proj.weight"]).max() <= 0.5
    assert np.abs(tensors[f"{prefix}.conv1d.weight"]).max() <= 0.5
    assert np.abs(tensors[f"{prefix}.in_proj.weight"]).max() <= 1 / 8
    assert np.abs(tensors[f"{prefix}.out_proj.weight"]).max() <= 1 / 16
    w = tensors["dense_encoder.dense_block.dense_block.3.0.weight"]
    assert np.abs(w).max() <= 1 / math.sqrt(256 * 9)
    for norm in ("dense_encoder.dense_conv_2.1", "TSMamba.3.time_mamba.norm"):
        weight, bias = tensors[f"{norm}.weight"], tensors[f"{norm}.bias"]
        assert np.abs(weight - 1).max() <= 0.1 and np.abs(bias).max() <= 0.1
        assert not np.allclose(weight, 1) and not np.allclose(bias, 0)   # jittered
    prelu = tensors["mask_decoder.up_conv1.2.weight"]
    assert np.abs(prelu - 0.25).max() <= 0.05 and prelu.std() > 0


def test_phase_gain_scales_only_the_phase_input(full_tensors, full_checkpoint_attenuated):
    _, full = full_tensors
    _, attenuated = read_safetensors(full_checkpoint_attenuated / "model.safetensors")
    for key in full:
        if key != PHASE_INPUT_KEY:
            np.testing.assert_array_equal(full[key], attenuated[key], err_msg=key)
    np.testing.assert_array_equal(full[PHASE_INPUT_KEY][:, 0], attenuated[PHASE_INPUT_KEY][:, 0])
    np.testing.assert_allclose(attenuated[PHASE_INPUT_KEY][:, 1],
                               full[PHASE_INPUT_KEY][:, 1] * np.float32(1e-4), rtol=1e-6)


def test_tiny_fixtures(tiny_checkpoint, tiny_checkpoint_attenuated):
    shapes = expected_shapes(ModelConfig.from_dict(TINY_CONFIG))
    for directory in (tiny_checkpoint, tiny_checkpoint_attenuated):
        metadata, tensors = read_safetensors(directory / "model.safetensors")
        assert metadata == {"format": "pt"}
        assert {k: t.shape for k, t in tensors.items()} == shapes


def test_generation_is_deterministic(tmp_path, full_checkpoint):
    a = write_checkpoint(tmp_path / "a", TINY_CONFIG, seed=3)
    b = write_checkpoint(tmp_path / "b", TINY_CONFIG, seed=3)
    c = write_checkpoint(tmp_path / "c", TINY_CONFIG, seed=4)
    for name in ("model.safetensors", "config.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes()
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()
    again = write_checkpoint(tmp_path / "full", FULL_CONFIG, seed=0)
    assert (again / "model.safetensors").read_bytes() == \
        (full_checkpoint / "model.safetensors").read_bytes()


def test_make_weights_matches_file_and_differs_per_seed(tiny_checkpoint):
    _, tensors = read_safetensors(tiny_checkpoint / "model.safetensors")
    weights = make_weights(TINY_CONFIG, seed=0)
    assert list(weights) == list(expected_shapes(ModelConfig.from_dict(TINY_CONFIG)))
    for key, value in weights.items():
        np.testing.assert_array_equal(value, tensors[key], err_msg=key)
    other = make_weights(TINY_CONFIG, seed=1)
    assert not np.array_equal(weights[PHASE_INPUT_KEY], other[PHASE_INPUT_KEY])
    with pytest.raises(ValueError):
        make_weights(TINY_CONFIG, seed=-1)


def test_checkpoint_cli(tmp_path):
    out = tmp_path / "cli"
    result = subprocess.run(
        [sys.executable, "-m", "fixtures.checkpoints", str(out), "--size", "tiny", "--seed", "2",
         "--phase-gain", "0.5"],
        cwd=REPO, capture_output=True, text=True, check=True,
    )
    assert "184 tensors" in result.stdout
    expected = write_checkpoint(tmp_path / "api", TINY_CONFIG, seed=2, phase_gain=0.5)
    assert (out / "model.safetensors").read_bytes() == \
        (expected / "model.safetensors").read_bytes()


def test_audio_fixtures(audio_dir):
    assert len(AUDIO_FIXTURES) == 5
    assert {f.sample_rate for f in AUDIO_FIXTURES if f.channels == 1} == \
        {8000, 16000, 44100, 48000}
    assert {f.subtype for f in AUDIO_FIXTURES} >= {"PCM_16", "PCM_24", "FLOAT"}
    assert sum(f.format == "FLAC" for f in AUDIO_FIXTURES) == 1
    for fixture in AUDIO_FIXTURES:
        path = audio_dir / fixture.name
        info = sf.info(str(path))
        assert info.samplerate == fixture.sample_rate
        assert info.channels == fixture.channels
        assert info.subtype == fixture.subtype
        assert info.format == fixture.format
        assert info.frames == fixture.frames
        assert abs(info.frames / info.samplerate - 1.0) < 0.01
        data, _ = sf.read(str(path), dtype="float32", always_2d=True)
        assert data.shape == (fixture.frames, fixture.channels)
        assert np.isfinite(data).all()
        assert 0.1 < np.abs(data).max() < 1.0
    stereo, _ = sf.read(str(audio_dir / "stereo_16000_pcm16.wav"), always_2d=True)
    assert not np.allclose(stereo[:, 0], stereo[:, 1])


def test_audio_is_deterministic(tmp_path, audio_dir):
    """Same samples and format every time. Bytes are compared too, except that libsndfile
    stamps the write time into the PEAK chunk of float WAV files."""
    paths = write_audio_fixtures(tmp_path / "again")
    assert [p.name for p in paths] == [f.name for f in AUDIO_FIXTURES]
    for path in paths:
        first, again = sf.info(str(audio_dir / path.name)), sf.info(str(path))
        assert (first.format, first.subtype, first.samplerate, first.frames) == \
            (again.format, again.subtype, again.samplerate, again.frames)
        assert np.array_equal(sf.read(str(audio_dir / path.name))[0], sf.read(str(path))[0])
        if first.subtype != "FLOAT":
            assert path.read_bytes() == (audio_dir / path.name).read_bytes(), path.name


def test_speech_and_noise_generators():
    a = speech_like(16000, 1.5, seed=7)
    assert a.dtype == np.float32 and a.shape == (24000,)
    assert np.array_equal(a, speech_like(16000, 1.5, seed=7))
    assert not np.array_equal(a, speech_like(16000, 1.5, seed=8))
    assert abs(np.abs(a).max() - 0.5) < 1e-6
    assert (np.abs(a) < 1e-3).mean() > 0.05          # has pauses
    spectrum = np.abs(np.fft.rfft(a)) ** 2
    freqs = np.fft.rfftfreq(len(a), 1 / 16000)
    assert spectrum[(freqs > 80) & (freqs < 4000)].sum() / spectrum.sum() > 0.9
    mono = noisy_speech(8000, 1.0, seed=1)
    assert mono.shape == (8000,) and mono.dtype == np.float32
    stereo = noisy_speech(8000, 1.0, channels=3, snr_db=0, seed=1)
    assert stereo.shape == (8000, 3) and np.abs(stereo).max() < 1.0
    assert not np.allclose(stereo[:, 0], stereo[:, 1])
    clean = speech_like(8000, 1.0, seed=1).astype(np.float64)
    mixed = noisy_speech(8000, 1.0, snr_db=10, seed=1).astype(np.float64)
    gain = np.dot(mixed, clean) / np.dot(clean, clean)
    noise = mixed - gain * clean
    snr = 10 * np.log10(np.sum((gain * clean) ** 2) / np.sum(noise ** 2))
    assert abs(snr - 10) < 1.0
