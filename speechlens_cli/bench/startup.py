"""`speechlens bench --startup`: whole processes, start-up included, as a user runs them.

Each trial starts `speechlens enhance FILE OUT` as a new process (Python start, imports, model
load, kernels' first launches, the file, the write) and, alternating with it, a new process of the
peer doing the same file (torch import, model load, enhance, write): NVIDIA's stack where it runs
(whole file as one window, torch's defaults), else the plain-loop PyTorch peer through
speechlens's pipeline. Both are timed from outside, from start to exit. One untimed run of each
comes first, so that both find the file cache (and speechlens its compiled kernels) as a user's
second run does. The outputs of the last runs are compared (waveform relative RMSE).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import soundfile as sf

from . import cases as matrix
from . import report
from .environment import load_average
from .inputs import BenchCheckpoint, bench_speech
from .runner import Log, nvidia_peer_missing, peer_argv, rel_rmse, timed_process

#: (seconds, rate) of the file, per backend: the files the start-up targets name.
DEFAULT_FILE = {"gpu": report.GPU_STARTUP_FILE, "cpu": report.CPU_STARTUP_FILE}
DEFAULT_TRIALS = 3


def _peer(ckpt: BenchCheckpoint, src: Path, out: Path, rate: int, seconds: float,
          backend: str, peer_device: str) -> tuple[str, list[str], Path]:
    """(peer name, command line, where its output goes)."""
    common = {"weights": str(ckpt.weights), "config": str(ckpt.config) if ckpt.config else None}
    if nvidia_peer_missing(backend) is None:
        dst = out / "nvidia.npy"
        args = {**common, "device": "cuda", "tf32": "default", "warmup": 0, "trials": 1,
                "cases": [{"src": str(src), "rate": rate, "label": "startup", "dst": str(dst)}]}
        return (f"{matrix.NVIDIA_PEER}, TF32 torch defaults, whole file as one window",
                peer_argv("nvidia_peer", args), dst)
    dst = out / "peer.wav"
    args = {**common, "device": peer_device, "src": str(src), "dst": str(dst), "rate": rate,
            "window": max(seconds, matrix.WINDOWS[0]), "overlap": 0.0, "warmup": 0, "trials": 1,
            "budget_s": None, "label": "startup peer"}
    return f"{matrix.PLAIN_PEER}, file as one window", peer_argv("peer_process", args), dst


def _read(path: Path) -> np.ndarray:
    if path.suffix == ".npy":
        return np.load(path).reshape(-1)
    return sf.read(str(path), dtype="float32", always_2d=True)[0][:, 0]


def run_startup(ckpt: BenchCheckpoint, backend: str, seconds: float, rate: int, trials: int,
                peer: bool, peer_device: str, log: Log) -> dict:
    """Time `trials` whole processes of each side, alternating; the report's "startup" body."""
    body: dict = {"seconds": seconds, "rate": rate, "trials": trials,
                  "load_at_start": load_average()}
    with tempfile.TemporaryDirectory(prefix="speechlens-bench-startup-") as tmp:
        out = Path(tmp)
        audio, how = bench_speech(rate, seconds)
        src = out / f"in-{seconds:g}s-{rate}.wav"
        sf.write(str(src), audio, rate, subtype="FLOAT")
        body["fixture"] = f"{how}; {len(audio)} samples, mono float32 WAV"
        dst = out / "speechlens.wav"
        mine = [sys.executable, "-m", "speechlens_cli", "enhance", "--model", ckpt.spec,
                "--overwrite", "-q", str(src), str(dst)]
        body["command"] = "speechlens enhance --model CHECKPOINT --overwrite -q IN.wav OUT.wav"
        sides = {"speechlens": mine}
        if peer:
            name, argv, peer_dst = _peer(ckpt, src, out, rate, seconds, backend, peer_device)
            body["peer"] = name
            sides[name] = argv
        times: dict[str, list[float]] = {side: [] for side in sides}
        for side, argv in sides.items():
            timed_process(argv, f"{side}: untimed first run", log)
        for trial in range(trials):
            for side, argv in sides.items():
                times[side].append(timed_process(
                    argv, f"{side}: trial {trial + 1}/{trials}", log)[0])
        body["speechlens_times_s"] = times.pop("speechlens")
        body["speechlens_median_s"] = statistics.median(body["speechlens_times_s"])
        if peer:
            body["peer_times_s"] = times[body["peer"]]
            body["peer_median_s"] = statistics.median(body["peer_times_s"])
            body["speedup"] = body["peer_median_s"] / body["speechlens_median_s"]
            body["parity_rel_rmse"] = rel_rmse(_read(peer_dst), _read(dst))
    body["load_at_end"] = load_average()
    return body
