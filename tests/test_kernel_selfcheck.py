"""The GPU kernels' self-check (speechlens_cli/kernels/selfcheck.py), run here on the CPU.

Metal cannot run on Linux, so the backend is injected (dispatch.backend returns "metal", or
"cuda" for the JIT path) and the gpu.py launchers are replaced by stand-ins computed on the CPU:
a correct one (the float64 reference of tests/reference.py), a wrong one (its output scaled or
shifted by one step) and one that raises as a Metal compile error does. Everything runs on MLX's
CPU device (on any machine), with the verdicts file in a temporary cache folder.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference as ref

from speechlens_cli import checkpoint, kernels
from speechlens_cli.kernels import dispatch, gpu, notices, selfcheck
from speechlens_cli.kernels.contract import in_time_order
from speechlens_cli.kernels.fallback import two_direction_delta_raw
from speechlens_cli.synthetic.speech import noisy_speech
from tests.reliability import REPO, invoke, refuse_writes

pytestmark = pytest.mark.usefixtures("on_cpu")

LAUNCHERS = ("gpu_conv", "gpu_bimamba_conv", "gpu_scan", "metal_bimamba_scan")
#: The launcher behind each kernel the dispatch checks.
LAUNCHER_OF = {"causal_conv1d": "gpu_conv", "bimamba_conv": "gpu_bimamba_conv",
               "selective_scan": "gpu_scan", "bimamba_scan": "metal_bimamba_scan"}
COMPILE_ERROR = "[metal::Device] Unable to build metal library from source"
TINY_CHANNELS, TINY_RANK = 64, 1  # the tiny test model's d_inner and dt rank


def _f32(a: np.ndarray) -> mx.array:
    return mx.array(np.asarray(a, dtype=np.float32))


def _conv64(x, weight, bias, silu: bool) -> np.ndarray:
    y = ref.reference_causal_conv1d(np.array(x), np.array(weight).transpose(0, 2, 1),
                                    np.array(bias))
    return y / (1.0 + np.exp(-y)) if silu else y


def _scan64(u, delta_raw, A_log, B, C, D, z, dt_proj=None) -> np.ndarray:
    if dt_proj is not None:
        weight, bias = (np.array(a, dtype=np.float64) for a in dt_proj)
        delta_raw = np.array(delta_raw, dtype=np.float64) @ weight.T + bias
    return ref.reference_selective_scan(*(np.array(a) for a in (u, delta_raw, A_log, B, C, D,
                                                                  z)))


def _halves(a, k: int, channels: int):
    """Direction k's columns of a [..., 2D] array, in the order that direction walks time."""
    return in_time_order(a, k)[..., k * channels:(k + 1) * channels]


def _walked(a, k: int):
    """Direction k's [B, L, ...] slice of a [2, B, L, ...] array, as that direction walks it."""
    return in_time_order(a[k], k)


def _correct_conv(x, weight, bias, which, silu=False):
    return _f32(_conv64(x, weight, bias, silu))


def _correct_bimamba_conv(x, weight, bias, which, silu=False):
    d = weight.shape[1]
    return _f32(np.stack([in_time_order(_conv64(_halves(x, k, d), weight[k], bias[k], silu), k)
                          for k in (0, 1)]))


def _correct_scan(u, delta_raw, A_log, B, C, D, z, strict, which, dt_proj=None):
    return _f32(_scan64(u, delta_raw, A_log, B, C, D, z, dt_proj))


def _correct_bimamba_scan(u, delta_raw, z, B, C, A_log, D, strict):
    d = u.shape[-1]
    return _f32(np.concatenate([in_time_order(_scan64(
        _walked(u, k), _walked(delta_raw, k), A_log[k], _walked(B, k), _walked(C, k), D[k],
        _halves(z, k, d)), k) for k in (0, 1)], axis=-1))


CORRECT = {"gpu_conv": _correct_conv, "gpu_bimamba_conv": _correct_bimamba_conv,
           "gpu_scan": _correct_scan, "metal_bimamba_scan": _correct_bimamba_scan}

#: Wrong kernels: every output [..., L, D] changed along time or in scale.
FAULTS = {
    "scaled": lambda y: y * 1.01,
    "shifted": lambda y: mx.concatenate([y[..., :1, :], y[..., :-1, :]], axis=-2),
    "raises": None,
}


def _exact_conv(x, weight, bias, which, silu=False):
    y = kernels.conv1d_fallback(x, weight, bias)
    return y * mx.sigmoid(y) if silu else y


def _exact_scan(u, delta_raw, A_log, B, C, D, z, strict, which, dt_proj=None):
    if dt_proj is not None:
        delta_raw = mx.addmm(dt_proj[1], delta_raw, dt_proj[0].T)
    return kernels.selective_scan_ops(u, delta_raw, A_log, B, C, D, z, strict)


def _exact_bimamba_conv(x, weight, bias, which, silu=False):
    d = weight.shape[1]
    return mx.stack([in_time_order(_exact_conv(_halves(x, k, d), weight[k], bias[k], which,
                                               silu), k) for k in (0, 1)])


def _exact_bimamba_scan(u, delta_raw, z, B, C, A_log, D, strict):
    d = u.shape[-1]
    return mx.concatenate([in_time_order(kernels.selective_scan_ops(
        _walked(u, k), _walked(delta_raw, k), A_log[k], _walked(B, k), _walked(C, k), D[k],
        _halves(z, k, d), strict), k) for k in (0, 1)], axis=-1)


EXACT_OPS = {"gpu_conv": _exact_conv, "gpu_bimamba_conv": _exact_bimamba_conv,
             "gpu_scan": _exact_scan, "metal_bimamba_scan": _exact_bimamba_scan}


class StandIns:
    """The gpu.py launchers replaced, each call counted: by the kernels' results computed in
    float64 (`correct`), or by the very MLX ops of their fallbacks (`exact_ops`: the kernels a
    test does not fault, so that the model's output can be compared with the MLX-ops path's
    to rounding); `fault` then makes one kernel wrong or fail to compile."""

    def __init__(self, monkeypatch, base: str = "correct"):
        self.monkeypatch = monkeypatch
        self.calls = {name: 0 for name in LAUNCHERS}
        for name in LAUNCHERS:
            self.set(name, (CORRECT if base == "correct" else EXACT_OPS)[name])

    def set(self, name: str, launch) -> None:
        def counted(*args, **kwargs):
            self.calls[name] += 1
            return launch(*args, **kwargs)
        self.monkeypatch.setattr(gpu, name, counted)

    def fault(self, kernel: str, fault: str, scale: float | None = None) -> None:
        name = LAUNCHER_OF[kernel]
        if fault == "raises":
            def launch(*args, **kwargs):
                raise RuntimeError(f"{COMPILE_ERROR}\nprogram_source:12:3: error: use of "
                                   "undeclared identifier 'sl_exp2'")
        else:
            change = FAULTS[fault] if scale is None else (lambda y: y * scale)

            def launch(*args, **kwargs):
                return change(CORRECT[name](*args, **kwargs))
        self.set(name, launch)



@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """A fresh process as far as the self-check knows: an empty cache folder, no verdicts in
    memory, no warnings logged, the kernels dispatched as on Metal."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("SPEECHLENS_CACHE_DIR", str(folder))
    monkeypatch.delenv(kernels.DISABLE_CONV_ENV, raising=False)
    monkeypatch.delenv(kernels.DISABLE_CONV_ENV_ALIAS, raising=False)
    monkeypatch.delenv(gpu.THREADGROUP_ENV, raising=False)
    monkeypatch.setattr(dispatch, "backend", lambda: "metal")
    selfcheck.forget()
    notices.reset_warnings()
    yield folder
    selfcheck.forget()
    notices.reset_warnings()


def _new_process() -> None:
    """What a new process starts with: no verdicts in memory and no warnings logged yet."""
    selfcheck.forget()
    notices.reset_warnings()


@pytest.fixture(scope="module")
def tiny_model(tiny_checkpoint):
    return checkpoint.load_model(tiny_checkpoint)


def _enhance(model, strict: bool = False) -> np.ndarray:
    audio = noisy_speech(8000, 0.06, seed=3)[:400].astype(np.float32)
    return np.array(model.enhance(mx.array(audio)[None], 8000, strict=strict))


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and "self-check" in r.getMessage()]


@pytest.fixture
def ops_output(tiny_model, tmp_path, on_cpu) -> dict[bool, np.ndarray]:
    """The model's output on the MLX-ops path, standard and strict: every GPU kernel fails its
    check (the verdicts go to a folder of their own)."""
    outputs = {}
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setenv("SPEECHLENS_CACHE_DIR", str(tmp_path / "ops-cache"))
        monkeypatch.setattr(dispatch, "backend", lambda: "metal")
        stand_ins = StandIns(monkeypatch)
        for kernel in LAUNCHER_OF:
            stand_ins.fault(kernel, "raises")
        for strict in (False, True):
            _new_process()
            outputs[strict] = _enhance(tiny_model, strict)
    _new_process()
    return outputs


def _rel_rms(out: np.ndarray, want: np.ndarray) -> float:
    return float(np.sqrt(np.mean((out - want) ** 2) / np.mean(want ** 2)))


def _variant(kernel: str, channels: int = 8, **kw) -> selfcheck.Variant:
    return selfcheck.Variant(kernel, "metal", channels, **kw)


# ------------------------------------------------------------------- verdicts and dispatch ----

def test_correct_kernels_pass_and_the_model_takes_them(cache, tiny_model, ops_output,
                                                       monkeypatch, caplog):
    """Every kernel the model takes on Metal is checked once, passes, and then runs each call;
    no warning; the model's output agrees with the MLX-ops path to float32 rounding."""
    stand_ins = StandIns(monkeypatch)
    with caplog.at_level(logging.WARNING, logger=kernels.__name__):
        out = _enhance(tiny_model)
    assert _warnings(caplog) == []
    # 2 TF blocks x 2 BiMambas: 4 launches each, plus the check's one
    assert stand_ins.calls["gpu_bimamba_conv"] == 5
    assert stand_ins.calls["metal_bimamba_scan"] == 5
    assert stand_ins.calls["gpu_conv"] == stand_ins.calls["gpu_scan"] == 0
    verdicts = kernels.self_check(TINY_CHANNELS, TINY_RANK)
    assert verdicts == {"bimamba_conv": "ok", "causal_conv1d": "ok",
                        "bimamba_scan standard": "ok", "selective_scan standard": "ok",
                        "bimamba_scan strict": "ok", "selective_scan strict": "ok"}
    assert _rel_rms(out, ops_output[False]) < 1e-5


@pytest.mark.parametrize("fault", sorted(FAULTS))
@pytest.mark.parametrize("kernel", ["bimamba_conv", "bimamba_scan"])
def test_a_wrong_or_failing_model_kernel_gives_the_mlx_ops_output(
        cache, tiny_model, ops_output, kernel, fault, monkeypatch, caplog):
    """A kernel the model takes that computes wrong values or does not compile is not used:
    the model's output is the MLX-ops path's (to the rounding of the dt projection, a batched
    matmul before the two-direction scan, per direction after the conv's fallback; a faulty
    kernel used would be off by 1e-3 and more), its verdict says why, and one warning is logged
    however many times the model calls it."""
    stand_ins = StandIns(monkeypatch, base="exact_ops")
    stand_ins.fault(kernel, fault)
    with caplog.at_level(logging.WARNING, logger=kernels.__name__):
        out = _enhance(tiny_model, strict=True)
    assert _rel_rms(out, ops_output[True]) < 1e-6
    assert stand_ins.calls[LAUNCHER_OF[kernel]] == 1  # the check's launch only
    warnings = _warnings(caplog)
    assert len(warnings) == 1 and f"metal {kernel}" in warnings[0]
    assert "this run uses each direction's" in warnings[0]
    verdict = selfcheck.verdict(_variant(kernel, TINY_CHANNELS, strict=kernel.endswith("scan")))
    expected = COMPILE_ERROR if fault == "raises" else "relative RMS error"
    assert verdict.startswith("failed: ") and expected in verdict


@pytest.mark.parametrize("fault", sorted(FAULTS))
@pytest.mark.parametrize("kernel", ["causal_conv1d", "selective_scan"])
def test_a_wrong_or_failing_single_direction_kernel_gives_the_mlx_ops_result(
        cache, kernel, fault, monkeypatch, caplog):
    """The single-direction kernels (the two-direction ones' fallback, the public API): a
    faulty one is replaced by mx.conv1d / the scan in MLX ops, with one warning in 3 calls."""
    StandIns(monkeypatch).fault(kernel, fault)
    rng = np.random.default_rng(5)
    x, u, delta_raw, z = (mx.array(rng.standard_normal((2, 9, 8)).astype(np.float32))
                          for _ in range(4))
    weight, bias = (mx.array(rng.standard_normal(s).astype(np.float32)) for s in ((8, 4, 1), 8))
    B, C = (mx.array(rng.standard_normal((2, 9, 16)).astype(np.float32)) for _ in range(2))
    A_log = mx.array(np.log(rng.uniform(0.5, 16, (8, 16))).astype(np.float32))
    if kernel == "causal_conv1d":
        def run(f):
            return np.array(f(x, weight, bias))
        dispatched, ops = kernels.causal_conv1d, kernels.conv1d_fallback
    else:
        def run(f):
            return np.array(f(u, delta_raw, A_log, B, C, bias, z))
        dispatched, ops = kernels.selective_scan, kernels.selective_scan_ops
    with caplog.at_level(logging.WARNING, logger=kernels.__name__):
        results = [run(dispatched) for _ in range(3)]
    for result in results:
        np.testing.assert_array_equal(result, run(ops))
    assert len(_warnings(caplog)) == 1
    assert selfcheck.verdict(_variant(kernel)).startswith("failed: ")


def test_cuda_jit_kernels_go_through_the_same_check(cache, monkeypatch, caplog):
    """On CUDA without the precompiled kernels, the two-direction scan runs each direction's
    JIT scan with the dt projection fused (rank R): a wrong one is checked out and the scan
    runs in MLX ops, the projection applied first."""
    monkeypatch.setattr(dispatch, "backend", lambda: "cuda")
    monkeypatch.setattr(dispatch, "_packed_works", lambda channels: False)
    stand_ins = StandIns(monkeypatch)
    stand_ins.fault("selective_scan", "shifted")
    rng = np.random.default_rng(8)
    d, rank = 8, 4

    def normal(*shape):
        return mx.array(rng.standard_normal(shape).astype(np.float32))
    u, x_dbl, z = normal(2, 2, 11, d), normal(2, 2, 11, rank + 32), normal(2, 11, 2 * d)
    A_log = mx.array(np.log(rng.uniform(0.5, 16, (2, d, 16))).astype(np.float32))
    D, dt_proj = normal(2, d), (normal(2, d, rank), normal(2, d))
    with caplog.at_level(logging.WARNING, logger=kernels.__name__):
        out = kernels.bimamba_scan(u, x_dbl, z, A_log, D, dt_proj)
    ops = _exact_bimamba_scan(u, two_direction_delta_raw(x_dbl, dt_proj), z,
                              x_dbl[..., rank:rank + 16], x_dbl[..., rank + 16:], A_log, D, False)
    assert _rel_rms(np.array(out), np.array(ops)) < 1e-6
    assert stand_ins.calls["gpu_scan"] == 2  # the check's two directions only
    warnings = _warnings(caplog)
    assert len(warnings) == 1 and "cuda selective_scan standard R=4 DI=8" in warnings[0]


def test_the_tolerance_separates_rounding_from_a_wrong_result(cache, monkeypatch):
    """A kernel 2e-6 off (float32 rounding of another order) passes; one 5e-5 off fails."""
    stand_ins = StandIns(monkeypatch)
    stand_ins.fault("bimamba_scan", "scaled", scale=1 + 2e-6)
    assert selfcheck.verdict(_variant("bimamba_scan")) == "ok"
    stand_ins.fault("bimamba_scan", "scaled", scale=1 + 5e-5)
    failed = selfcheck.verdict(_variant("bimamba_scan", strict=True))
    assert failed.startswith("failed: relative RMS error ")
    assert 4.5e-5 < float(failed.split()[4]) < 5.5e-5


def test_the_cpu_path_runs_no_check(cache, tiny_model, monkeypatch):
    """On the CPU backend no GPU kernel is launched or checked and no verdict is written."""
    monkeypatch.setattr(dispatch, "backend", lambda: "cpu")
    stand_ins = StandIns(monkeypatch)
    _enhance(tiny_model)
    assert stand_ins.calls == {name: 0 for name in LAUNCHERS}
    assert kernels.self_check(TINY_CHANNELS, TINY_RANK) == {}
    assert not (cache / selfcheck.VERDICTS_FILE).exists()


# ----------------------------------------------------------------------------- doctor ----------

@pytest.mark.parametrize("faulty", [None, "bimamba_scan"])
def test_doctor_reports_each_kernels_verdict(cache, tiny_checkpoint, monkeypatch, faulty):
    """doctor lists every GPU kernel's verdict at RE-USE's channel counts, in text and JSON;
    a failed one is a problem with a fix."""
    stand_ins = StandIns(monkeypatch)
    if faulty:
        stand_ins.fault(faulty, "scaled")
    report = json.loads(invoke("doctor", "--model", tiny_checkpoint, "--json").stdout)
    _new_process()
    text = invoke("doctor", "--model", tiny_checkpoint)
    check = report["checks"]["selfcheck"]
    assert list(check["verdicts"]) == ["bimamba_conv", "causal_conv1d", "bimamba_scan standard",
                                       "selective_scan standard", "bimamba_scan strict",
                                       "selective_scan strict"]
    failed = {name for name, verdict in check["verdicts"].items() if verdict != "ok"}
    assert failed == ({"bimamba_scan standard", "bimamba_scan strict"} if faulty else set())
    assert all(check["verdicts"][name].startswith("failed: relative RMS error 1.0")
               for name in failed)
    assert check["file"] == str(cache / selfcheck.VERDICTS_FILE)
    line = next(line for line in text.stdout.splitlines() if line.startswith("selfcheck:"))
    assert line.split(":", 1)[1].strip() == check["value"]
    assert "DI=256: bimamba_conv ok" in line
    assert check["ok"] == (not faulty) == ("fix: the failed kernels run as MLX ops"
                                           not in text.stdout)
    if faulty:
        assert text.exit_code == 1 and "bimamba_scan strict failed: " in line


# --------------------------------------------------------------------- the verdicts file ------

def _stored(cache: Path) -> dict:
    return json.loads((cache / selfcheck.VERDICTS_FILE).read_text())


def test_verdicts_are_kept_and_read_by_the_next_process(cache, monkeypatch, caplog):
    """Checked once per machine: the next process takes both verdicts from the file without
    launching anything, and still warns once that a failed kernel is replaced."""
    stand_ins = StandIns(monkeypatch)
    stand_ins.fault("selective_scan", "raises")
    assert selfcheck.verdict(_variant("bimamba_conv")) == "ok"
    assert selfcheck.verdict(_variant("selective_scan")).startswith("failed: RuntimeError")
    stored = _stored(cache)
    assert stored["mlx"] == mx.__version__ and set(stored["verdicts"]) == {
        "metal bimamba_conv DI=8 threads=256", "metal selective_scan standard DI=8 threads=256"}
    assert [p.name for p in cache.iterdir()] == [selfcheck.VERDICTS_FILE]  # no temporary left

    _new_process()
    stand_ins.calls.update(dict.fromkeys(LAUNCHERS, 0))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=kernels.__name__):
        for _ in range(2):
            assert selfcheck.verdict(_variant("bimamba_conv")) == "ok"
            assert selfcheck.verdict(_variant("selective_scan")).startswith(
                "failed: RuntimeError")
    assert stand_ins.calls == dict.fromkeys(LAUNCHERS, 0)  # nothing checked again
    warnings = _warnings(caplog)
    assert len(warnings) == 1 and "this run uses the scan in MLX ops" in warnings[0]


@pytest.mark.parametrize("change", ["mlx", "sources", "device", "threads"])
def test_a_new_mlx_source_device_or_launch_is_checked_again(cache, monkeypatch, change):
    """A verdict holds for one MLX version, kernel source, GPU and OS, and launch width; the
    file keeps only the current MLX's and device's verdicts."""
    stand_ins = StandIns(monkeypatch)
    assert selfcheck.verdict(_variant("bimamba_conv")) == "ok"
    _new_process()
    if change == "mlx":
        monkeypatch.setattr(mx, "__version__", mx.__version__ + ".dev1")
    elif change == "sources":
        real = gpu.kernel_sources
        monkeypatch.setattr(gpu, "kernel_sources", lambda name, which: (
            real(name, which)[0] + "\n// changed", real(name, which)[1]))
    elif change == "device":
        monkeypatch.setattr(selfcheck, "device_name", lambda which: "metal Apple M9 (g99)")
    else:
        monkeypatch.setenv(gpu.THREADGROUP_ENV, "128")
    assert selfcheck.verdict(_variant("bimamba_conv")) == "ok"
    assert stand_ins.calls["gpu_bimamba_conv"] == 2
    stored = _stored(cache)
    assert (stored["mlx"], stored["device"]) == (mx.__version__, selfcheck.device_name("metal"))
    assert len(stored["verdicts"]) == (2 if change == "threads" else 1)
    entry = stored["verdicts"][_variant("bimamba_conv").key]
    assert entry == {"sources": selfcheck.sources_hash("bimamba_conv", "metal"), "verdict": "ok"}


@pytest.mark.parametrize("content", [
    b"", b"\x00\xff garbage", b'{"mlx": ', b"[1, 2]", b"[" * 100_000,
    b'{"mlx": "x", "device": "y"}',
    "identity:not-a-dict", "identity:verdict-42", "identity:verdict-maybe", "folder"])
def test_an_unreadable_or_corrupt_verdicts_file_is_checked_again(cache, monkeypatch, content):
    """Empty, binary, cut short, not an object, nested past the parser, another identity,
    entries of the wrong shape, a folder in its place: all read as no verdicts, the kernel is
    checked again and the file rewritten whole (where a folder blocks it, nothing is left)."""
    stand_ins = StandIns(monkeypatch)
    assert selfcheck.verdict(_variant("bimamba_conv")) == "ok"
    path = cache / selfcheck.VERDICTS_FILE
    key = _variant("bimamba_conv").key
    good = _stored(cache)
    path.unlink()
    if content == "folder":
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        broken = {"not-a-dict": "ok", "verdict-42": {**good["verdicts"][key], "verdict": 42},
                  "verdict-maybe": {**good["verdicts"][key], "verdict": "maybe"}}
        path.write_text(json.dumps({**good, "verdicts": {key: broken[content.split(":")[1]]}}))
    _new_process()
    assert selfcheck.verdict(_variant("bimamba_conv")) == "ok"
    assert stand_ins.calls["gpu_bimamba_conv"] == 2
    if content == "folder":
        assert [p.name for p in cache.iterdir()] == [selfcheck.VERDICTS_FILE]
    else:
        assert _stored(cache) == good


def test_the_file_is_read_once_per_process(cache, monkeypatch):
    """A process reads the verdicts file at its first check only (not once per kernel)."""
    stand_ins = StandIns(monkeypatch)
    for kernel in ("bimamba_conv", "causal_conv1d"):
        selfcheck.verdict(_variant(kernel))
    _new_process()
    assert selfcheck.verdict(_variant("bimamba_conv")) == "ok"   # reads the file
    (cache / selfcheck.VERDICTS_FILE).write_bytes(b"damaged later")
    assert selfcheck.verdict(_variant("causal_conv1d")) == "ok"   # from the copy read
    assert stand_ins.calls["gpu_bimamba_conv"] == 1 and stand_ins.calls["gpu_conv"] == 2


def test_another_processs_verdicts_are_kept_when_storing(cache, monkeypatch):
    """A verdict another process stored after this one read the file survives this one's
    write: the file is read again just before it is replaced."""
    StandIns(monkeypatch)
    selfcheck.verdict(_variant("bimamba_conv"))
    stored = _stored(cache)
    other = _variant("causal_conv1d")
    stored["verdicts"][other.key] = {"sources": selfcheck.sources_hash(other.kernel, "metal"),
                                     "verdict": "ok"}
    (cache / selfcheck.VERDICTS_FILE).write_text(json.dumps(stored))
    selfcheck.verdict(_variant("selective_scan"))
    assert set(_stored(cache)["verdicts"]) == {_variant(k).key for k in (
        "bimamba_conv", "causal_conv1d", "selective_scan")}


@pytest.mark.parametrize("how", ["read-only", "a-file-in-the-way"])
def test_an_unwritable_cache_folder_still_checks_and_runs(cache, tiny_model, monkeypatch, how):
    """Nothing can be stored: the kernels are still checked and taken, nothing is left in the
    folder, and the next process checks again."""
    if how == "read-only":
        cache.mkdir()
        refused = refuse_writes(monkeypatch, cache)
    else:
        cache.parent.mkdir(exist_ok=True)
        cache.write_text("a file where the cache folder should be")
    stand_ins = StandIns(monkeypatch)
    _enhance(tiny_model)
    assert stand_ins.calls["metal_bimamba_scan"] == 5
    assert selfcheck.verdict(_variant("bimamba_scan", TINY_CHANNELS)) == "ok"
    if how == "read-only":
        assert refused and list(cache.iterdir()) == []
    _new_process()
    selfcheck.verdict(_variant("bimamba_scan", TINY_CHANNELS))
    assert stand_ins.calls["metal_bimamba_scan"] == 6


CHILD = textwrap.dedent("""
    import json, sys
    from speechlens_cli.kernels import fallback, gpu, selfcheck
    gpu.gpu_conv = lambda x, w, b, which, silu=False: fallback.conv1d_fallback(x, w, b)
    for channels in range(int(sys.argv[1]), int(sys.argv[1]) + 25):
        assert selfcheck.verdict(selfcheck.Variant("causal_conv1d", "metal", channels)) == "ok"
""")


def test_processes_writing_at_once_never_leave_a_partial_file(cache):
    """Three processes store 25 verdicts each at the same time while this one reads the file:
    every read is a whole JSON file, and no temporary is left."""
    env = {**os.environ, "SPEECHLENS_CACHE_DIR": str(cache)}
    children = [subprocess.Popen([sys.executable, "-c", CHILD, str(start)], env=env, cwd=REPO,
                                 stderr=subprocess.PIPE, text=True)
                for start in (1, 101, 201)]
    reads = 0
    while any(child.poll() is None for child in children):
        try:
            text = (cache / selfcheck.VERDICTS_FILE).read_text()
        except FileNotFoundError:
            time.sleep(0.01)
            continue
        json.loads(text)
        reads += 1
        time.sleep(0.002)
    assert [child.wait() for child in children] == [0, 0, 0], [c.stderr.read() for c in children]
    assert reads > 0 and 25 <= len(_stored(cache)["verdicts"]) <= 75
    assert [p.name for p in cache.iterdir()] == [selfcheck.VERDICTS_FILE]
