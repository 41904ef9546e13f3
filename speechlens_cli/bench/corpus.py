"""`speechlens bench --corpus`: a folder of many files of varied lengths, run as users run it.

A corpus of synthetic noisy speech (COUNT files whose lengths a fixed seed draws uniformly from
[MIN, MAX] seconds, at one rate, float WAV) is enhanced by whole processes, each timed from its
start to its exit, with its peak RSS:

* speechlens, cold: `speechlens enhance CORPUS OUT` with an empty cache folder (XDG_CACHE_HOME a
  new folder: no kernel compiled by an earlier run), as a user's first run;
* speechlens, warm: the same command again, that cache kept;
* speechlens, one file: all of the corpus's audio joined into one file, the same work with no
  per-file costs;
* the peer: one process looping over the files, each enhanced as one window, as NVIDIA's scripts
  do: NVIDIA's stack on CUDA, elsewhere the plain-loop PyTorch peer.

The sides alternate within each of `trials` rounds (the cold run's cache is new each round); the
report gives each side's median, audio seconds per second, the peer's time over speechlens's,
and the per-file overhead: (warm corpus - one file) / COUNT, what a file costs beyond its audio's
model time, start-up excluded (both processes start once).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf

from ..errors import UsageError
from ..model.config import MAX_SAMPLE_RATE, MIN_SAMPLE_RATE
from ..synthetic.speech import noisy_speech
from . import cases as matrix
from .environment import load_average
from .inputs import BenchCheckpoint
from .runner import Log, nvidia_peer_missing, peer_argv, timed_process

FIXTURE = ("speechlens_cli.synthetic.speech.noisy_speech(seed=i): synthetic voiced syllables + "
           "coloured noise at 5 dB SNR, file i")


@dataclass(frozen=True)
class CorpusSpec:
    """COUNT files of MIN-MAX seconds at RATE Hz."""

    rate: int
    count: int
    shortest: float
    longest: float

    @classmethod
    def parse(cls, text: str) -> CorpusSpec:
        """RATE:COUNT:MIN-MAX, e.g. 16000:200:1-20."""
        try:
            rate, count, span = text.split(":")
            shortest, longest = span.split("-")
            spec = cls(int(rate), int(count), float(shortest), float(longest))
        except ValueError:
            raise UsageError(f"--corpus {text!r}: expected RATE:COUNT:MIN-MAX seconds, "
                             "e.g. 16000:200:1-20") from None
        if not (spec.count >= 1 and 0 < spec.shortest <= spec.longest <= 600
                and MIN_SAMPLE_RATE <= spec.rate <= MAX_SAMPLE_RATE):
            raise UsageError(f"--corpus {text!r}: at least one file, 0 < MIN <= MAX <= 600 s, "
                             f"a rate of {MIN_SAMPLE_RATE}-{MAX_SAMPLE_RATE} Hz")
        return spec

    def __str__(self) -> str:
        return f"{self.count} files of {self.shortest:g}-{self.longest:g} s at {self.rate} Hz"

    def lengths(self) -> list[int]:
        """Each file's length in samples (seed 0: the same corpus every run)."""
        seconds = np.random.default_rng(0).uniform(self.shortest, self.longest, self.count)
        return [round(s * self.rate) for s in seconds]


#: The corpora a bare --corpus runs, by backend: the two the GPU targets name (most speech
#: corpora are 16 kHz; podcasts and music 44.1 kHz), and on the CPU the short-files one.
DEFAULT_CORPORA = {"gpu": ("16000:200:1-20", "44100:60:2-30"), "cpu": ("16000:60:0.5-2",)}


def write_corpus(spec: CorpusSpec, folder: Path) -> tuple[Path, Path, float]:
    """(corpus folder, the one file of all its audio, audio seconds)."""
    corpus = folder / "corpus"
    corpus.mkdir()
    parts = []
    for index, frames in enumerate(spec.lengths()):
        audio = noisy_speech(spec.rate, frames / spec.rate + 0.01, seed=index)[:frames]
        sf.write(str(corpus / f"{index:05d}.wav"), audio.astype(np.float32), spec.rate,
                 subtype="FLOAT")
        parts.append(audio)
    joined = np.concatenate(parts).astype(np.float32)
    whole = folder / "one-file.wav"
    sf.write(str(whole), joined, spec.rate, subtype="FLOAT")
    return corpus, whole, len(joined) / spec.rate


def _peer(ckpt: BenchCheckpoint, corpus: Path, out: Path, rate: int, backend: str,
          peer_device: str) -> tuple[str, list[str]]:
    """(peer name, command line): one process over every file of the corpus."""
    files = sorted(corpus.iterdir())
    common = {"weights": str(ckpt.weights), "config": str(ckpt.config) if ckpt.config else None}
    out.mkdir()
    if nvidia_peer_missing(backend) is None:
        args = {**common, "device": "cuda", "tf32": "default", "warmup": 0, "trials": 1,
                "cases": [{"src": str(f), "rate": rate, "label": f.stem,
                           "dst": str(out / f"{f.stem}.npy")} for f in files]}
        return (f"{matrix.NVIDIA_PEER}, TF32 torch defaults, each file as one window",
                peer_argv("nvidia_peer", args))
    args = {**common, "device": peer_device, "rate": rate, "overlap": 0.0, "warmup": 0,
            "trials": 1, "budget_s": None, "label": "corpus peer",
            "files": [{"src": str(f), "dst": str(out / f.name)} for f in files]}
    return f"{matrix.PLAIN_PEER}, each file as one window", peer_argv("peer_process", args)


def run_corpus(ckpt: BenchCheckpoint, backend: str, spec: CorpusSpec, trials: int, peer: bool,
               peer_device: str, log: Log) -> dict:
    """One corpus, every side `trials` times; a report's "corpora" entry."""
    body: dict = {"corpus": str(spec), "rate": spec.rate, "files": spec.count,
                  "trials": trials, "load_at_start": load_average(), "fixture": FIXTURE}
    with tempfile.TemporaryDirectory(prefix="speechlens-bench-corpus-") as tmp:
        folder = Path(tmp)
        corpus, whole, seconds = write_corpus(spec, folder)
        body["audio_seconds"] = seconds
        cache = folder / "cache"
        speechlens = [sys.executable, "-m", "speechlens_cli", "enhance", "--model", ckpt.spec,
                      "-q"]
        body["command"] = "speechlens enhance --model CHECKPOINT -q CORPUS/ OUT/"
        sides = {"cold": lambda out: speechlens + [str(corpus), str(out)],
                 "warm": lambda out: speechlens + [str(corpus), str(out)],
                 "one file": lambda out: speechlens + [str(whole), str(out / "one-file.wav")]}
        if peer:
            body["peer"], peer_command = _peer(ckpt, corpus, folder / "peer-out", spec.rate,
                                               backend, peer_device)
            sides[body["peer"]] = lambda _out: peer_command
        results: dict[str, list[tuple[float, int]]] = {side: [] for side in sides}
        for trial in range(trials):
            cold_cache = cache / f"round-{trial}"
            for side, command in sides.items():
                out = folder / "out" / f"{side}-{trial}"
                out.mkdir(parents=True)
                env = {**os.environ, "XDG_CACHE_HOME": str(cold_cache)}
                env.pop("SPEECHLENS_CACHE_DIR", None)
                results[side].append(timed_process(
                    command(out), f"{side}: round {trial + 1}/{trials}", log,
                    None if side == body.get("peer") else env))
    body["sides"] = {side: _summary(runs, seconds) for side, runs in results.items()}
    warm, one = body["sides"]["warm"]["median_s"], body["sides"]["one file"]["median_s"]
    body["per_file_overhead_s"] = (warm - one) / spec.count
    if peer:
        peer_median = body["sides"][body["peer"]]["median_s"]
        body["speedup_cold"] = peer_median / body["sides"]["cold"]["median_s"]
        body["speedup_warm"] = peer_median / warm
    body["corpus_over_one_file"] = warm / one
    body["load_at_end"] = load_average()
    return body


def _summary(runs: list[tuple[float, int]], audio_seconds: float) -> dict:
    times = [t for t, _ in runs]
    median = statistics.median(times)
    return {"times_s": times, "median_s": median, "audio_s_per_s": audio_seconds / median,
            "rss_peak_bytes": max(peak for _, peak in runs)}
