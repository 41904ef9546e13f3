"""Reliability, damaged checkpoints and caches through `speechlens enhance --model`
(docs/reliability.md, section 2).

tests/test_checkpoint.py proves the checks themselves through `models verify` and the API
(truncated file, huge header length, wrong dtype and shape, missing/extra keys, NaN weights,
absurd config, checksum of the pinned download). Here every fault reaches the command users run:
one "error:" line, exit 1, no output and no temporary file, the input untouched.
"""

from __future__ import annotations

import builtins
import errno
import io
import json
import os
import shutil
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from speechlens_cli import checkpoint, hub
from speechlens_cli.errors import CheckpointFormatError
from speechlens_cli.synthetic.checkpoints import TINY_CONFIG, make_weights
from tests.reliability import (
    audit_outputs,
    cases,
    invoke,
    make_audio,
    one_error_line,
    refuse_writes,
)

REVISION = "0123456789abcdef0123456789abcdef01234567"


def _save(folder: Path, weights: dict[str, np.ndarray], config) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(folder / "model.safetensors"),
                        {k: mx.array(v) for k, v in weights.items()}, metadata={"format": "pt"})
    text = config if isinstance(config, str) else json.dumps(config)
    (folder / "config.json").write_text(text)
    return folder


def _weights(**changes: np.ndarray) -> dict[str, np.ndarray]:
    weights = dict(make_weights(TINY_CONFIG, seed=0))
    weights.update(changes)
    return weights


def _config(**model_cfg) -> dict:
    config = json.loads(json.dumps(TINY_CONFIG))
    config["model_cfg"].update(model_cfg)
    return config


def _stft(**stft_cfg) -> dict:
    config = json.loads(json.dumps(TINY_CONFIG))
    config["stft_cfg"].update(stft_cfg)
    return config


def _copy_then(edit: Callable[[Path], None]) -> Callable[[Path, Path], Path]:
    def build(folder: Path, good: Path) -> Path:
        shutil.copytree(good, folder)
        edit(folder / "model.safetensors")
        return folder
    return build


def _cut(keep: Callable[[int], int]) -> Callable[[Path], None]:
    def edit(weights: Path) -> None:
        data = weights.read_bytes()
        weights.write_bytes(data[:keep(len(data))])
    return edit


def _header(length: int, body: bytes) -> Callable[[Path], None]:
    return lambda weights: weights.write_bytes(length.to_bytes(8, "little") + body)


def _saved(weights=None, config=None) -> Callable[[Path, Path], Path]:
    return lambda folder, _good: _save(folder, weights or _weights(), config or TINY_CONFIG)


def _header_json(entries: dict) -> Callable[[Path], None]:
    body = json.dumps(entries).encode()
    return _header(len(body), body)


def _retyped(key: str, dtype) -> dict[str, np.ndarray]:
    return _weights(**{key: make_weights(TINY_CONFIG, seed=0)[key].astype(dtype)})


def _filled(key: str, value: float) -> dict[str, np.ndarray]:
    return _weights(**{key: np.full_like(make_weights(TINY_CONFIG, seed=0)[key], value)})


_DEEP = b"[" * 100_000 + b"]" * 100_000


def _config_replaced(make: Callable[[Path], None]) -> Callable[[Path, Path], Path]:
    """The good checkpoint with something else where config.json was."""
    def build(folder: Path, good: Path) -> Path:
        shutil.copytree(good, folder)
        (folder / "config.json").unlink()
        make(folder / "config.json")
        return folder
    return build

#: name -> (build(folder, good checkpoint) -> --model argument, text the error line contains)
CHECKPOINT_FAULTS: dict[str, tuple[Callable[[Path, Path], Path], str]] = {
    "truncated-1000-bytes": (_copy_then(_cut(lambda n: n - 1000)), "truncated"),
    "truncated-to-half": (_copy_then(_cut(lambda n: n // 2)), "truncated"),
    "truncated-inside-header": (_copy_then(_cut(lambda n: 100)), "header claims"),
    "empty-weights": (_copy_then(_cut(lambda n: 0)), "not a safetensors file (only 0 bytes)"),
    "header-claims-2^62-bytes": (_copy_then(_header(2**62, b"{}")),
                                 "header claims 4611686018427387904"),
    "header-claims-99MB": (_copy_then(_header(99 * 2**20, b"{}")), "header claims 103809024"),
    "header-8MB-of-padding": (_copy_then(_header(8 * 2**20, b"{}" + b" " * (8 * 2**20 - 2))),
                              "header claims 8388608 bytes, over the 4 MB"),
    "header-not-json": (_copy_then(_header(16, b"\xff" * 16)), "header is not JSON"),
    "header-nested-100000-deep": (_copy_then(_header(len(_DEEP), _DEEP)), "header JSON is absurd"),
    "header-5000-digit-number": (_copy_then(_header(5002, b"[" + b"9" * 5000 + b"]")),
                                 "header JSON is absurd"),
    "header-tensor-past-the-end": (_copy_then(_header_json(
        {"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})), "truncated"),
    "header-size-disagrees-with-shape": (_copy_then(_header_json(
        {"x": {"dtype": "F32", "shape": [9], "data_offsets": [0, 16]}})), "inconsistent size"),
    "header-negative-shape": (_copy_then(_header_json(
        {"x": {"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]}})), "malformed header"),
    "wrong-dtype-f16": (_saved(_retyped("mask_decoder.final_conv.bias", np.float16)),
                        "is F16, expected F32"),
    "wrong-dtype-i32": (_saved(_retyped("mask_decoder.final_conv.bias", np.int32)),
                        "is I32, expected F32"),
    "nan-weights": (_saved(_filled("TSMamba.0.time_mamba.norm.bias", np.nan)),
                    "NaN or Inf values"),
    "inf-weights": (_saved(_filled("dense_encoder.dense_conv_1.0.weight", np.inf)),
                    "NaN or Inf values"),
    "config-10^9-blocks": (_saved(config=_config(num_tfmamba=10**9)),
                           "num_tfmamba=1000000000 is outside the supported range"),
    "config-10^12-channels": (_saved(config=_config(hid_feature=10**12)),
                              "hid_feature=1000000000000 is outside"),
    "config-3.6e9-parameters": (_saved(config=_config(num_tfmamba=64, hid_feature=512,
                                                      expand=16)),
                                "describes 3,619,138,051 parameters; speechlens loads at most"),
    "config-negative-state": (_saved(config=_config(d_state=-16)), "d_state=-16"),
    "config-epsilon-a-string": (_saved(config=_config(norm_epsilon="tiny")),
                                "norm_epsilon must be a number in (0, 1], got 'tiny'"),
    "config-epsilon-1e999": (_saved(config=json.dumps(_config()).replace(
        '"norm_epsilon": 1e-05', '"norm_epsilon": 1e999')), "norm_epsilon must be a number"),
    "config-hop-1": (_saved(config=_stft(hop_size=1)), "hop_size=1 must be between n_fft/32"),
    "config-hop-above-half-n_fft": (_saved(config=_stft(hop_size=200)),
                                    "hop_size=200 must be between n_fft/32 and n_fft/2"),
    "config-n_fft-65536": (_saved(config=_stft(n_fft=65536, win_size=65536, hop_size=8192)),
                           "n_fft=65536 is outside the supported range 16..4096"),
    "config-sfi-a-string": (_saved(config=_stft(sfi="false")),
                            "sfi must be true or false, got 'false'"),
    "config-a-folder": (_config_replaced(lambda p: p.mkdir()),
                        "config.json: is not a regular file"),
    "config-a-fifo": (_config_replaced(os.mkfifo), "config.json: is not a regular file"),
    "config-a-dangling-link": (_config_replaced(lambda p: p.symlink_to(p.with_name("gone"))),
                               "config.json: is not a regular file"),
    "config-2MB": (_config_replaced(lambda p: p.write_text(json.dumps(
        {**TINY_CONFIG, "padding": "x" * 2_000_000}))), "config.json is over 1024 KB"),
    "config-5000-digit-number": (_saved(config='{"model_cfg": {"num_tfmamba": ' + "9" * 5000
                                        + "}}"), "unreadable config.json (absurd JSON)"),
    "config-not-json": (_saved(config="{model_cfg: 2"), "unreadable config.json"),
    "config-a-list": (_saved(config="[1, 2]"), "config.json has no 'model_cfg' object"),
    "folder-without-weights": (lambda folder, _good: folder.mkdir() or folder,
                               "no model.safetensors in this folder"),
}


@pytest.mark.parametrize("name", sorted(CHECKPOINT_FAULTS))
def test_damaged_checkpoint_stops_enhance_in_one_line(tmp_path, tiny_checkpoint, name):
    build, fragment = CHECKPOINT_FAULTS[name]
    model = build(tmp_path / "model", tiny_checkpoint)
    source = make_audio(tmp_path / "in" / "a.wav")
    before = source.read_bytes()
    (tmp_path / "out").mkdir()
    result = invoke("enhance", source, tmp_path / "out" / "a.wav", "--model", model)
    assert result.exit_code == 1, result.output
    line = one_error_line(result.stderr)
    assert fragment in line, line
    assert str(model) in line or "config.json" in line, "the line names the checkpoint"
    assert list((tmp_path / "out").iterdir()) == [] and source.read_bytes() == before


def test_a_header_claiming_99MB_is_refused_before_allocating(tmp_path):
    bogus = tmp_path / "model.safetensors"
    bogus.write_bytes((99 * 2**20).to_bytes(8, "little") + b"{}")
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointFormatError, match="header claims"):
            checkpoint.read_header(bogus)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2**20, peak


class _FailingDisk(io.FileIO):
    """A file whose reads fail with EIO from byte `fails_at` on, as a failing disk's do."""

    fails_at = 0

    def _check(self, wanted: int) -> None:
        if self.tell() + max(wanted, 1) > self.fails_at:
            raise OSError(errno.EIO, os.strerror(errno.EIO))

    def read(self, size=-1):
        self._check(size if size and size > 0 else 1)
        return super().read(size)

    def readinto(self, buffer):
        self._check(len(buffer))
        return super().readinto(buffer)


@pytest.mark.parametrize("where", ["header", "tensors"])
def test_a_checkpoint_the_disk_fails_to_read_is_one_line(tmp_path, tiny_checkpoint, where,
                                                         monkeypatch):
    """EIO reading the weights, in the header or in the tensor data: one line naming the file
    and the reason, exit 1 (a traceback before; a mapped read would have been SIGBUS)."""
    model = tmp_path / "model"
    shutil.copytree(tiny_checkpoint, model)
    weights = model / "model.safetensors"
    header = 8 + int.from_bytes(weights.read_bytes()[:8], "little")
    failing = type("Failing", (_FailingDisk,), {"fails_at": 0 if where == "header" else header})
    real_open = builtins.open

    def open_failing(file, mode="r", *args, **kwargs):
        if str(file) == str(weights) and "b" in mode and "r" in mode:
            return io.BufferedReader(failing(file, "rb"))
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", open_failing)
    result = invoke("enhance", make_audio(tmp_path / "a.wav"), tmp_path / "out.wav",
                    "--model", model)
    assert result.exit_code == 1, result.output
    line = one_error_line(result.stderr)
    assert f"{weights}: cannot be read (Input/output error)" in line, line
    assert not (tmp_path / "out.wav").exists()


# ------------------------------------------------------------------------------ the cache

def _cache_copy(cache: Path, source: Path, repo: str, revision: str) -> Path:
    """`source` laid out in a Hugging Face cache as `repo` at `revision` (refs/main too)."""
    folder = cache / f"models--{repo.replace('/', '--')}"
    snapshot = folder / "snapshots" / revision
    snapshot.mkdir(parents=True)
    for name in ("model.safetensors", "config.json"):
        shutil.copy(source / name, snapshot / name)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(revision)
    return snapshot


#: Names shaped like "owner/name" that the hub itself refuses (they used to escape as an
#: HFValidationError traceback from every command that takes a model).
BAD_REPO_IDS = ("a/b--c", "x/y.", "owner/" + "n" * 97)
MODEL_COMMANDS = {
    "enhance": lambda tmp, spec: ["enhance", make_audio(tmp / "a.wav"), tmp / "o.wav",
                                  "--model", spec],
    "models-verify": lambda tmp, spec: ["models", "verify", spec],
    "models-pull": lambda tmp, spec: ["models", "pull", spec, "--accept-license"],
    "models-path": lambda tmp, spec: ["models", "path", spec],
}


@pytest.mark.parametrize("command", sorted(MODEL_COMMANDS))
@pytest.mark.parametrize("spec", BAD_REPO_IDS)
def test_an_id_the_hub_refuses_is_one_line(tmp_path, command, spec, monkeypatch):
    """Refused before anything is looked up or downloaded: a usage error naming the id and the
    hub's reason; nothing is written."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    result = invoke(*MODEL_COMMANDS[command](tmp_path, spec))
    assert result.exit_code == 2, result.output
    line = one_error_line(result.stderr)
    assert f"{spec}: no such checkpoint file or folder, and not a valid Hugging Face repo id" \
        in line, line
    assert not (tmp_path / "o.wav").exists() and not (tmp_path / "hf-cache").exists()


def test_doctor_explains_an_id_the_hub_refuses(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    result = invoke("doctor", "--model", "a/b--c")
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "not a valid Hugging Face repo id" in result.output
    assert "fix: pass --model a checkpoint path or a valid repo id" in result.output


@pytest.fixture
def offline_cache(tmp_path, monkeypatch) -> Path:
    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv(checkpoint.MODEL_ENV, raising=False)
    return cache


def test_partial_download_in_the_cache_is_caught_by_checksum(tmp_path, offline_cache,
                                                             tiny_checkpoint):
    """A pinned file cut short (an interrupted download copied into place): the sha256 check
    comes first, so the line says what happened and how to fix it, not just 'truncated'."""
    snapshot = _cache_copy(offline_cache, tiny_checkpoint, checkpoint.DEFAULT_REPO,
                           checkpoint.PINNED_REVISION)
    weights = snapshot / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:50_000])
    source = make_audio(tmp_path / "a.wav")
    result = invoke("enhance", source, tmp_path / "out.wav", "--model", checkpoint.DEFAULT_REPO)
    assert result.exit_code == 1
    line = one_error_line(result.stderr)
    assert "partial or altered download" in line and "speechlens models pull" in line, line
    assert not (tmp_path / "out.wav").exists()


def test_interrupted_hub_download_leaves_nothing_usable_and_says_pull(tmp_path, offline_cache):
    """huggingface_hub downloads into blobs/*.incomplete and links the snapshot only when done:
    such a leftover is not a model, and the line says how to fetch one."""
    blobs = offline_cache / "models--nvidia--RE-USE" / "blobs"
    blobs.mkdir(parents=True)
    (blobs / "87a4a970ce9aa79d5d92e71899ab034defcf13d93e5e4393ec0dc7db6d4ec048.incomplete") \
        .write_bytes(b"\x00" * 4096)
    result = invoke("enhance", make_audio(tmp_path / "a.wav"), tmp_path / "out.wav")
    assert result.exit_code == 1
    assert "speechlens models pull nvidia/RE-USE" in one_error_line(result.stderr)


@pytest.fixture
def read_only(monkeypatch) -> Callable[[Path], list[str]]:
    return lambda root: refuse_writes(monkeypatch, root, errno.EROFS)


def test_a_read_only_cache_still_serves_its_model(tmp_path, offline_cache, tiny_checkpoint,
                                                  read_only):
    """A cached (unpinned) model loads and runs from a cache nothing may be written to."""
    _cache_copy(offline_cache, tiny_checkpoint, "someone/tiny-reuse", REVISION)
    refused = read_only(offline_cache)
    source = make_audio(tmp_path / "a.wav")
    result = invoke("enhance", source, tmp_path / "out.wav", "--model", "someone/tiny-reuse")
    assert result.exit_code == 0, result.output
    assert refused == []
    audit_outputs(tmp_path, {"out.wav": 400})


def test_a_read_only_cache_without_the_model_fails_in_one_line(tmp_path, offline_cache,
                                                               read_only):
    read_only(offline_cache)
    result = invoke("enhance", make_audio(tmp_path / "a.wav"), tmp_path / "out.wav", "--model",
                    "someone/not-cached")
    assert result.exit_code == 1
    assert "someone/not-cached is not in the Hugging Face cache" in \
        one_error_line(result.stderr)
    assert not (tmp_path / "out.wav").exists()


@cases(0)   # checks the fault injector itself
def test_read_only_guard_refuses_writes(tmp_path, read_only):
    """The fault injection itself: writes under the root fail, reads and writes elsewhere pass."""
    root = tmp_path / "ro"
    root.mkdir()
    (root / "kept").write_text("x")
    refused = read_only(root)
    for attempt in (lambda: (root / "new").write_text("y"), lambda: (root / "dir").mkdir(),
                    lambda: os.replace(root / "kept", tmp_path / "moved"),
                    lambda: (root / "kept").unlink(),
                    lambda: open(root / "kept", "a")):  # noqa: SIM115
        with pytest.raises(OSError) as caught:
            attempt()
        assert caught.value.errno == errno.EROFS
    assert (root / "kept").read_text() == "x" and len(refused) == 5
    (tmp_path / "elsewhere").write_text("fine")


@cases(2)
def test_the_license_comes_before_any_download_and_an_unreachable_hub_fails_fast(
        tmp_path, monkeypatch):
    """The Python API, with nothing cached and the hub a closed local port: without the license
    accepted nothing is fetched (the error carries the terms); accepted, the unreachable hub is
    one line within seconds (the hub client alone retried for ~25 s)."""
    import time

    from huggingface_hub import constants

    from speechlens_cli.errors import LicenseRequiredError, ModelNotFoundError

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv(checkpoint.LICENSE_ENV, raising=False)
    monkeypatch.delenv(checkpoint.MODEL_ENV, raising=False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(checkpoint.locate, "_license_accepted", False)
    with pytest.raises(LicenseRequiredError) as refused:
        checkpoint.resolve()
    assert checkpoint.LICENSE_NOTE in str(refused.value)
    monkeypatch.setenv(checkpoint.LICENSE_ENV, "1")
    started = time.monotonic()
    with pytest.raises(ModelNotFoundError) as unreachable:
        checkpoint.resolve()
    assert time.monotonic() - started < 3 * hub.HUB_TIMEOUT_S
    assert "hub (127.0.0.1) cannot be reached" in str(unreachable.value)
    assert "speechlens models pull" in str(unreachable.value)
