"""Reliability, interruptions (docs/reliability.md, section 4).

One chain of real processes over a 12-file batch (0.25-s files, tiny model): each run is
interrupted (SIGINT and SIGTERM in turn) at a seeded random moment after its first temporary file
appears, and resumed by the next run with --skip-existing; a last run finishes uninterrupted.
After every interruption: exit 130, no temporary file, each finished output byte-identical to an
uninterrupted run's. At the end the whole tree is byte-identical to that run's.
tests/test_cli.py already proves a single file interrupted once (both signals) leaves nothing
behind.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import soundfile as sf

from tests.reliability import CHILD, REPO, cases, invoke, leftovers, make_audio, tree_bytes

#: Signals delivered to a running batch, in this order (docs/reliability.md counts them).
SIGNALS = (signal.SIGINT, signal.SIGTERM) * 3
SEED = 6


def _batch(root: Path) -> None:
    """12 files of 0.25 s at 8 kHz in two folders: mono PCM16, one float, one stereo. (A signal
    between two windows of one file is test_cli's single-file case: a 60-s file.)"""
    for index in range(12):
        make_audio(root / f"part{index % 2}" / f"take{index:02d}.wav", 2000 + index,
                   channels=2 if index == 5 else 1, subtype="FLOAT" if index == 7 else "PCM_16",
                   seed=index)


def _start(root: Path, out: Path, checkpoint: Path, resume: bool) -> subprocess.Popen:
    args = [sys.executable, "-c", CHILD, "enhance", str(root), str(out), "--model",
            str(checkpoint), "-q"] + (["--skip-existing"] if resume else [])
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=REPO)


def _check_finished_outputs(out: Path, reference: dict[str, bytes]) -> int:
    """Every output present is complete and identical to the uninterrupted run's; no temporary
    file anywhere. Returns how many outputs there are."""
    assert not leftovers(out), leftovers(out)
    present = tree_bytes(out)
    for name, data in present.items():
        assert data == reference[name], f"{name} differs from the uninterrupted run"
    return len(present)


@cases(len(SIGNALS))
def test_interrupted_batch_resumes_to_the_same_result(tmp_path, tiny_checkpoint):
    root, out, reference_dir = tmp_path / "in", tmp_path / "out", tmp_path / "reference"
    _batch(root)
    started = time.perf_counter()
    assert invoke("enhance", root, reference_dir, "--model", tiny_checkpoint, "-q").exit_code == 0
    per_file = (time.perf_counter() - started) / 12   # this machine, now (model load included)
    reference = tree_bytes(reference_dir)
    assert len(reference) == 12

    rng = random.Random(SEED)
    finished = []
    for index, sig in enumerate(SIGNALS):
        process = _start(root, out, tiny_checkpoint, resume=index > 0)
        deadline = time.monotonic() + 120
        while not leftovers(out):          # the batch has begun its next file
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "no temporary output appeared"
            time.sleep(0.005)
        time.sleep(rng.uniform(0.05, 1.5) * per_file)
        assert process.poll() is None, "the batch finished before the signal"
        process.send_signal(sig)
        _, stderr = process.communicate(timeout=60)
        assert process.returncode == 130, (sig, stderr)
        assert stderr.strip().splitlines()[-1] == "interrupted (no partial output left behind)"
        assert "Traceback" not in stderr
        finished.append(_check_finished_outputs(out, reference))
    assert finished == sorted(finished) and finished[-1] < 12, finished

    final = _start(root, out, tiny_checkpoint, resume=True)
    _, stderr = final.communicate(timeout=180)
    assert final.returncode == 0, stderr
    assert _check_finished_outputs(out, reference) == 12
    assert tree_bytes(out) == reference
    for name in reference:
        assert sf.info(str(out / name)).frames == sf.info(str(root / name)).frames
