"""The benchmark matrix, its per-backend defaults and case selection."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

MODES = ("standard", "strict")
#: (file seconds, sample rate) of the synthetic fixtures.
FILES = ((5.0, 16000), (5.0, 44100), (5.0, 48000), (120.0, 16000), (120.0, 44100))
WINDOWS = (5.0, 30.0)
#: Peak memory at 30-s windows at 48 kHz (a target) needs a 48 kHz file of at least 30 s.
MEMORY_FILE = (30.0, 48000)

#: What `speechlens bench` runs without --cases, per backend.
DEFAULT_CASES = {
    # GPU: the whole matrix.
    "gpu": "*",
    # CPU (2 slow cores measured ~30 s per second of 16 kHz audio): 5 s at 16 kHz, both modes.
    "cpu": "5s-16k-w5-*",
}
QUICK_CASES = "5s-16k-w5-standard"
#: The peers run on these, per backend. On a GPU the 30-s 48 kHz file too, for NVIDIA's stack:
#: the plain-loop peer (a Python loop over time steps) stays on files of at most
#: PLAIN_PEER_MAX_SECONDS wherever NVIDIA's stack runs (it took minutes per 30-s run).
DEFAULT_PEER_CASES = {"gpu": "5s-*,30s-*", "cpu": "5s-*"}
PLAIN_PEER_MAX_SECONDS = 5.0
#: The two peers, named as every report names them. The plain-loop one runs everywhere torch does;
#: NVIDIA's own stack (mamba_ssm's fused CUDA kernels) only with MLX's CUDA backend.
PLAIN_PEER = "PyTorch, plain-loop scan"
NVIDIA_PEER = "NVIDIA stack (PyTorch + mamba_ssm)"
#: The NVIDIA stack runs once per TF32 setting: torch's defaults (cuDNN convolutions in TF32)
#: and off (float32 throughout, speechlens's arithmetic).
NVIDIA_TF32_MODES = ("default", "off")


def rate_label(rate: int) -> str:
    return f"{rate / 1000:g}k"


@dataclass(frozen=True)
class Case:
    seconds: float
    rate: int
    window: float
    mode: str

    @property
    def name(self) -> str:
        return f"{self.seconds:g}s-{rate_label(self.rate)}-w{self.window:g}-{self.mode}"

    @property
    def group(self) -> tuple[float, int, float]:
        """Cases sharing an input and a window geometry (the peer runs once per group)."""
        return (self.seconds, self.rate, self.window)

    @property
    def group_name(self) -> str:
        return f"{self.seconds:g}s-{rate_label(self.rate)}-w{self.window:g}"

    @property
    def long(self) -> bool:
        return self.seconds > 5.0


def all_cases() -> list[Case]:
    """Every case. A file no longer than a window is one window whatever the window length, so
    5-s files run with 5-s windows only; the 30-s 48 kHz file exists for the memory target."""
    cases = []
    short = [f for f in FILES if f[0] <= WINDOWS[0]]
    long = [f for f in FILES if f[0] > WINDOWS[0]]
    for seconds, rate in (*short, MEMORY_FILE, *long):
        for window in WINDOWS:
            if seconds <= WINDOWS[0] and window != WINDOWS[0]:
                continue
            if (seconds, rate) == MEMORY_FILE and window != 30.0:
                continue
            cases.extend(Case(seconds, rate, window, mode) for mode in MODES)
    return cases


def select(patterns: str) -> list[Case]:
    """Cases whose name matches any comma-separated shell pattern ("all" = "*")."""
    wanted = [p.strip() for p in patterns.split(",") if p.strip()]
    wanted = ["*" if p == "all" else p for p in wanted]
    return [c for c in all_cases() if any(fnmatch.fnmatchcase(c.name, p) for p in wanted)]


@dataclass(frozen=True)
class Repeats:
    warmup: int
    trials: int


def default_repeats(case: Case, gpu: bool) -> Repeats:
    """5 warm-ups and 20 trials for 5-s files on a GPU; fewer for long files and on the CPU."""
    if gpu:
        return Repeats(1, 2) if case.long else Repeats(5, 20)
    return Repeats(0, 1) if case.long else Repeats(1, 3)


def default_peer_repeats(gpu: bool) -> Repeats:
    return Repeats(1, 3) if gpu else Repeats(0, 2)
