"""Checkpoint validation: every damaged or incompatible file gets its own typed, clear error."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from click.testing import CliRunner

from speechlens_cli import checkpoint, hub
from speechlens_cli.cli import main
from speechlens_cli.errors import (
    CheckpointFormatError,
    ChecksumMismatchError,
    IncompatibleModelError,
    ModelNotFoundError,
)
from speechlens_cli.model import layout
from speechlens_cli.model.semamba import SEMamba
from speechlens_cli.synthetic.checkpoints import FULL_CONFIG, TINY_CONFIG, make_weights


def _write(directory: Path, weights: dict[str, np.ndarray], config: dict) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(directory / "model.safetensors"),
                        {k: mx.array(v) for k, v in weights.items()}, metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def _verify(path) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["models", "verify", str(path)])
    return result.exit_code, result.output


def test_full_fixture_has_official_counts_and_loads(full_checkpoint):
    report = checkpoint.inspect(full_checkpoint)
    assert report.tensor_count == 1416
    assert report.parameter_count == 9_607_747
    model = checkpoint.load_model(full_checkpoint)
    assert isinstance(model, SEMamba)
    assert len(model.TSMamba) == 30
    # Conversion to MLX layout happened: Conv2d [O,kh,kw,I], depthwise Conv1d [C,K,1].
    assert model.dense_encoder.dense_conv_2[0].weight.shape == (64, 1, 3, 64)
    assert model.TSMamba[0].time_mamba.forward_blocks.conv1d.weight.shape == (256, 4, 1)


def test_sanitize_moves_torch_axes_to_mlx_layout():
    conv2d = np.arange(2 * 3 * 1 * 3, dtype=np.float32).reshape(2, 3, 1, 3)
    conv1d = np.arange(4 * 1 * 4, dtype=np.float32).reshape(4, 1, 4)
    out = checkpoint.sanitize({"model.a": conv2d, "b": conv1d, "c": np.ones(5, np.float32)})
    assert set(out) == {"a", "b", "c"}  # optional "model." prefix stripped
    assert out["a"][1, 0, 2, 0] == conv2d[1, 0, 0, 2] and out["a"].shape == (2, 1, 3, 3)
    assert out["b"][3, 2, 0] == conv1d[3, 0, 2] and out["b"].shape == (4, 4, 1)


def test_verify_accepts_good_fixture(tiny_checkpoint):
    code, output = _verify(tiny_checkpoint)
    assert code == 0, output
    assert "tensors:    184" in output and "ok: compatible" in output
    assert hub.file_sha256(tiny_checkpoint / "model.safetensors") in output


@pytest.fixture(scope="module")
def tiny_weights():
    return make_weights(TINY_CONFIG, seed=0)


def _expect_rejected(path, error_type, fragment):
    """Refused alike by `inspect`, `models verify` and `load_model` (which loads into the
    model it checked the layout against, without MLX's own second check)."""
    for check in (checkpoint.inspect, checkpoint.load_model):
        with pytest.raises(error_type) as caught:
            check(path)
        assert fragment in str(caught.value)
    code, output = _verify(path)
    assert code != 0
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0], output


def test_verify_rejects_missing_key(tmp_path, tiny_weights):
    weights = dict(tiny_weights)
    del weights["TSMamba.1.freq_mamba.backward_blocks.D"]
    _write(tmp_path, weights, TINY_CONFIG)
    _expect_rejected(tmp_path, IncompatibleModelError,
                     "missing tensor TSMamba.1.freq_mamba.backward_blocks.D")


def test_verify_rejects_extra_key(tmp_path, tiny_weights):
    weights = dict(tiny_weights) | {"mask_decoder.lsigmoid.beta": np.ones(3, np.float32)}
    _write(tmp_path, weights, TINY_CONFIG)
    _expect_rejected(tmp_path, IncompatibleModelError,
                     "unexpected tensor mask_decoder.lsigmoid.beta")


def test_verify_rejects_wrong_shape_naming_both_shapes(tmp_path):
    weights = make_weights(FULL_CONFIG, seed=0)
    weights["TSMamba.3.time_mamba.forward_blocks.A_log"] = np.zeros((256, 8), np.float32)
    _write(tmp_path, weights, FULL_CONFIG)
    _expect_rejected(tmp_path, IncompatibleModelError,
                     "TSMamba.3.time_mamba.forward_blocks.A_log has shape [256, 8], "
                     "expected [256, 16]")


def test_verify_rejects_wrong_dtype(tmp_path, tiny_weights):
    weights = dict(tiny_weights)
    bias = "mask_decoder.final_conv.bias"
    weights[bias] = weights[bias].astype(np.float16)
    _write(tmp_path, weights, TINY_CONFIG)
    _expect_rejected(tmp_path, IncompatibleModelError, "is F16, expected F32")


def test_verify_rejects_truncated_file(tmp_path, tiny_checkpoint):
    shutil.copytree(tiny_checkpoint, tmp_path / "ck")
    weights = tmp_path / "ck" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])
    _expect_rejected(tmp_path / "ck", CheckpointFormatError, "truncated")


def test_verify_rejects_non_safetensors_file(tmp_path):
    bogus = tmp_path / "model.safetensors"
    bogus.write_bytes(b"RIFF\x24\x00\x00\x00WAVEfmt " + bytes(200))
    _expect_rejected(bogus, CheckpointFormatError, "not a safetensors file")


def test_header_claiming_huge_length_is_rejected_without_reading_it(tmp_path):
    bogus = tmp_path / "model.safetensors"
    bogus.write_bytes((2**62).to_bytes(8, "little") + b"{}")
    with pytest.raises(CheckpointFormatError, match="header claims"):
        checkpoint.read_header(bogus)


def test_verify_rejects_absurd_config(tmp_path, tiny_weights):
    config = json.loads(json.dumps(TINY_CONFIG))
    config["model_cfg"]["num_tfmamba"] = 10**9
    _write(tmp_path, tiny_weights, config)
    _expect_rejected(tmp_path, IncompatibleModelError, "num_tfmamba=1000000000")


def test_a_load_builds_one_model(tiny_checkpoint, monkeypatch):
    """The layout is read off the model the weights go into: building RE-USE's (540 Linear
    layers) takes tens of milliseconds of every start, and was done twice."""
    layout._expected_shapes.cache_clear()   # shapes cached by an earlier test built none
    built = []
    build = SEMamba.__init__
    monkeypatch.setattr(SEMamba, "__init__", lambda model, *args: built.append(build(model, *args)))
    checkpoint.load_model(tiny_checkpoint)
    assert len(built) == 1


def test_a_loaded_model_is_built_with_its_source(tiny_checkpoint, monkeypatch):
    """The model knows where its weights came from from its construction on (the reports name
    it), rather than being given an attribute once loaded."""
    sources = []
    build = SEMamba.__init__

    def recording(model, cfg, source=None):
        build(model, cfg, source)
        sources.append(model.source)

    monkeypatch.setattr(SEMamba, "__init__", recording)
    model = checkpoint.load_model(tiny_checkpoint)
    assert sources == [model.source] and model.source == checkpoint.resolve(tiny_checkpoint).source
    assert SEMamba(model.config).source is None


def test_nan_weights_are_rejected_at_load(tmp_path, tiny_weights):
    weights = dict(tiny_weights)
    weights["TSMamba.0.time_mamba.norm.bias"] = np.full(16, np.nan, np.float32)
    _write(tmp_path, weights, TINY_CONFIG)
    with pytest.raises(IncompatibleModelError, match="NaN or Inf"):
        checkpoint.load_model(tmp_path)


def test_missing_path_is_model_not_found(tmp_path):
    _expect_rejected(tmp_path / "nowhere", ModelNotFoundError, "no such checkpoint")


def _fake_hub_cache(cache: Path, source: Path) -> Path:
    """The Hugging Face cache layout for the pinned revision of nvidia/RE-USE."""
    snapshot = cache / "models--nvidia--RE-USE" / "snapshots" / checkpoint.PINNED_REVISION
    snapshot.mkdir(parents=True)
    for name in ("model.safetensors", "config.json"):
        shutil.copy(source / name, snapshot / name)
    (cache / "models--nvidia--RE-USE" / "refs").mkdir()
    return snapshot


def test_cached_default_model_is_used_offline_and_checksummed(tmp_path, monkeypatch,
                                                              tiny_checkpoint):
    """A cached pinned model resolves without network; a file that is not NVIDIA's fails sha256."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv(checkpoint.MODEL_ENV, raising=False)
    snapshot = _fake_hub_cache(tmp_path, tiny_checkpoint)
    files = checkpoint.resolve(None)
    assert files.weights == snapshot / "model.safetensors"
    assert files.expected_sha256 == checkpoint.PINNED_SHA256
    # The fixture is not NVIDIA's file, exactly like a partial or altered download.
    with pytest.raises(ChecksumMismatchError, match="models pull"):
        checkpoint.inspect(None)


def test_uncached_model_offline_says_what_to_fetch(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv(checkpoint.MODEL_ENV, raising=False)
    with pytest.raises(ModelNotFoundError) as caught:
        checkpoint.resolve(None)
    message = str(caught.value)
    assert "speechlens models pull nvidia/RE-USE" in message and "--model PATH" in message


def test_model_env_var_selects_checkpoint(monkeypatch, tiny_checkpoint):
    monkeypatch.setenv(checkpoint.MODEL_ENV, str(tiny_checkpoint))
    assert checkpoint.resolve(None).weights == tiny_checkpoint / "model.safetensors"
