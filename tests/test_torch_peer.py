"""The PyTorch peers of `speechlens bench` (speechlens_cli/bench/torch_peer.py, and the
processes runner.py starts them in).

torch is the `bench` extra, which `make install` installs with the suite's others, so CI runs
these; where torch is missing they are skipped and say so.

Tolerances (waveform relative RMSE): the peer against the float64 reference <= 2e-5 on the tiny
checkpoint (measured ~2.4-3.6e-6, float32 rounding); the peer against speechlens (MLX) <= 5e-5
on the tiny checkpoint and <= 1e-4 on the full-size one (speechlens's accuracy bound; ~1e-5
measured).
"""

from __future__ import annotations

import json
import subprocess

import mlx.core as mx
import numpy as np
import pytest
import soundfile as sf

torch = pytest.importorskip(
    "torch", reason="no torch here: CI runs these (`make install` installs the `bench` extra); "
    "the GPU suite's environment (tools/gpu_suite.py) has no torch")

import reference as ref  # noqa: E402

from speechlens_cli import checkpoint  # noqa: E402
from speechlens_cli.bench import runner, torch_peer  # noqa: E402
from speechlens_cli.synthetic.checkpoints import TINY_CONFIG, make_weights  # noqa: E402
from speechlens_cli.synthetic.speech import noisy_speech  # noqa: E402

REFERENCE_BOUND = 2e-5
TINY_MLX_BOUND = 5e-5
FULL_MLX_BOUND = 1e-4


def rel_rmse(actual, expected) -> float:
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    return float(np.sqrt(np.mean((actual - expected) ** 2) / np.mean(expected**2)))


def _signal(sample_rate: int, num_samples: int, seed: int = 0) -> np.ndarray:
    return noisy_speech(sample_rate, num_samples / sample_rate + 0.01,
                        seed=seed)[:num_samples].astype(np.float32)


@pytest.fixture(scope="module")
def tiny_peer(tiny_checkpoint):
    return torch_peer.load_peer(tiny_checkpoint)


@pytest.mark.parametrize("sample_rate, num_samples", [
    (8000, 2007), (16000, 4001), (44100, 11032),
    (48000, 12001),  # 12001 mod 240 == 1: the last frame is mirror-symmetric too
])
def test_peer_matches_float64_reference(tiny_peer, sample_rate, num_samples):
    x = _signal(sample_rate, num_samples)
    y = tiny_peer.enhance(torch.from_numpy(x)[None], sample_rate)[0].numpy()
    expected = ref.reference_enhance(make_weights(TINY_CONFIG, seed=0), TINY_CONFIG,
                                     x.astype(np.float64), sample_rate)
    assert y.shape == x.shape
    assert rel_rmse(y, expected) <= REFERENCE_BOUND


def test_peer_scan_loop_matches_reference_scan():
    rng = np.random.default_rng(3)
    n, length, di = 3, 37, 24
    u, delta_raw, z = (rng.standard_normal((n, length, di)).astype(np.float32) for _ in range(3))
    B, C = (rng.standard_normal((n, length, 16)).astype(np.float32) for _ in range(2))
    A_log = np.log(rng.uniform(0.5, 16.0, (di, 16))).astype(np.float32)
    D = rng.standard_normal(di).astype(np.float32)
    arrays = {"u": u, "d": delta_raw, "z": z, "B": B, "C": C, "A": A_log, "D": D}
    t = {k: torch.from_numpy(v) for k, v in arrays.items()}
    delta = torch.nn.functional.softplus(t["d"])
    y = torch_peer.selective_scan_loop(t["u"], delta, -torch.exp(t["A"]), t["B"], t["C"], t["D"])
    y = (y * torch.nn.functional.silu(t["z"])).numpy()
    expected = ref.reference_selective_scan(u, delta_raw, A_log, B, C, D, z)
    assert rel_rmse(y, expected) <= 1e-6


def test_peer_stft_reads_exactly_real_bins_as_phase_zero_or_pi(tiny_peer):
    sample_rate = 16000
    x = _signal(sample_rate, 4001)  # 4001 mod 80 == 1: first and last frames are symmetric
    magnitude, phase = (a[0].numpy() for a in tiny_peer.stft(torch.from_numpy(x)[None],
                                                            sample_rate))
    ref_magnitude, ref_phase = ref.reference_stft(x.astype(np.float64), sample_rate, TINY_CONFIG)
    np.testing.assert_allclose(magnitude, ref_magnitude, rtol=1e-5, atol=1e-5)
    for frame in (0, -1):
        assert set(np.unique(phase[:, frame])) <= {0.0, np.float32(np.pi)}
        clear = np.expm1(ref_magnitude[:, frame]) > 1e-4   # real part far from zero
        np.testing.assert_array_equal(phase[clear, frame] != 0, ref_phase[clear, frame] != 0)
    assert set(np.unique(phase[[0, -1], :])) <= {0.0, np.float32(np.pi)}   # DC and Nyquist
    wrapped = np.angle(np.exp(1j * (phase - ref_phase)))
    assert (np.abs(wrapped) * np.expm1(ref_magnitude)).max() < 1e-5


def test_peer_matches_speechlens_on_the_tiny_checkpoint(tiny_peer, tiny_checkpoint):
    model = checkpoint.load_model(tiny_checkpoint)
    x = _signal(44100, 22051, seed=2)
    y = tiny_peer.enhance(torch.from_numpy(x)[None], 44100)[0].numpy()
    for strict in (False, True):
        ours = np.array(model.enhance(mx.array(x)[None], 44100, strict=strict))[0]
        assert rel_rmse(y, ours) <= TINY_MLX_BOUND


def test_peer_rejects_non_float32_checkpoints(tmp_path):
    mx.save_safetensors(str(tmp_path / "model.safetensors"),
                        {"x": mx.zeros((2,), dtype=mx.float16)})
    with pytest.raises(ValueError, match="F16"):
        torch_peer.read_safetensors(tmp_path / "model.safetensors")


def _peer_result(module: str, args: dict) -> dict:
    """Run a peer module from runner.peer_argv's command line, as the bench does: its JSON
    result line."""
    run = subprocess.run(runner.peer_argv(module, args), capture_output=True, text=True,
                         check=False)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.splitlines()[-1])


def test_peer_process_gives_the_peers_output(tiny_peer, tiny_checkpoint, tmp_path):
    """peer_process in a process of its own, one window holding the whole file: its output file
    is the peer's output in this process, to float32 rounding (<= 1e-6; the same operations)."""
    x = _signal(8000, 2007, seed=5)
    sf.write(tmp_path / "in.wav", x, 8000, subtype="FLOAT")
    result = _peer_result("peer_process", {
        "weights": str(tiny_checkpoint), "config": None, "device": "cpu",
        "src": str(tmp_path / "in.wav"), "dst": str(tmp_path / "out.wav"), "rate": 8000,
        "window": 1.0, "overlap": 0.25, "warmup": 0, "trials": 1, "budget_s": None,
        "label": "test"})
    assert result["device"] == "cpu" and len(result["times_s"]) == 1
    out = sf.read(tmp_path / "out.wav", dtype="float32")[0]
    expected = tiny_peer.enhance(torch.from_numpy(x)[None], 8000)[0].numpy()
    assert rel_rmse(out, expected) <= 1e-6


def test_nvidia_peer_process_runs_with_a_stand_in_mamba_on_the_cpu(tiny_peer, tiny_checkpoint,
                                                                   tmp_path):
    """nvidia_peer (CUDA and mamba_ssm where the bench runs it) with the plain Mamba in every
    Mamba position (its `factory`) on the CPU: the plain peer's output (<= 1e-6), the fused
    path reported off."""
    x = _signal(8000, 2007, seed=6)
    np.save(tmp_path / "in.npy", x)
    result = _peer_result("nvidia_peer", {
        "weights": str(tiny_checkpoint), "device": "cpu",
        "factory": "speechlens_cli.bench.torch_peer:Mamba", "warmup": 0, "trials": 1,
        "cases": [{"src": str(tmp_path / "in.npy"), "rate": 8000,
                   "dst": str(tmp_path / "out.npy")}]})
    assert result["info"]["fused_path"] is False
    # per block, the time and the frequency BiMamba: two directions each
    assert result["info"]["mamba_modules"] == 4 * TINY_CONFIG["model_cfg"]["num_tfmamba"]
    expected = tiny_peer.enhance(torch.from_numpy(x)[None], 8000)[0].numpy()
    assert rel_rmse(np.load(tmp_path / "out.npy"), expected) <= 1e-6


@pytest.mark.slow
def test_full_size_peer_matches_speechlens(full_checkpoint):
    """The bench's parity check on the full-size random checkpoint (phase path at full strength)."""
    model = checkpoint.load_model(full_checkpoint)
    peer = torch_peer.load_peer(full_checkpoint)
    x = _signal(16000, 8001, seed=4)
    y = peer.enhance(torch.from_numpy(x)[None], 16000)[0].numpy()
    ours = np.array(model.enhance(mx.array(x)[None], 16000))[0]
    assert rel_rmse(y, ours) <= FULL_MLX_BOUND
