"""Reliability, interruptions (docs/reliability.md, section 4).

One chain of real processes over a 24-file batch (0.25-s files, tiny model): each run is
interrupted (SIGINT and SIGTERM in turn) at a seeded random moment after its first temporary file
appears, and resumed by the next run with --skip-existing; a last run finishes uninterrupted.
After every interruption: exit 128 + the signal (130, 143), one last line saying how many files
are done and how to resume, no temporary file, each finished output byte-identical to an
uninterrupted run's. At the end the whole tree is byte-identical to that run's.
tests/test_cli.py already proves a single file interrupted once (both signals) leaves nothing
behind.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import soundfile as sf

from speechlens_cli.audio.write import owners
from tests.reliability import (
    CHILD,
    RATE,
    REPO,
    audit_outputs,
    cases,
    invoke,
    leftovers,
    make_audio,
    tree_bytes,
    wav_bytes,
)

#: Signals delivered to a running batch, in this order (docs/reliability.md counts them).
SIGNALS = (signal.SIGINT, signal.SIGTERM) * 3
SEED = 6


#: Enough files that each signal finds the batch with files left to do: a run resumed after
#: the fifth signal still has 14 or more, since a batch can publish a few files between a
#: signal's arrival and its handling (4 seen on a loaded 2-core machine).
FILES = 36


def _batch(root: Path) -> None:
    """FILES files of 0.25 s at 8 kHz in two folders: mono PCM16, one float, one stereo. (A
    signal between two windows of one file is test_cli's single-file case: a 60-s file.)"""
    for index in range(FILES):
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
    one = make_audio(tmp_path / "one" / "take.wav", 2000)
    started = time.perf_counter()
    assert invoke("enhance", one.parent, tmp_path / "one_out", "--model", tiny_checkpoint,
                  "-q").exit_code == 0
    alone = time.perf_counter() - started
    started = time.perf_counter()
    assert invoke("enhance", root, reference_dir, "--model", tiny_checkpoint, "-q").exit_code == 0
    # What one more file adds on this machine now: the model's load and a run's fixed costs
    # left out, so that the signal lands within the batch, not after it.
    per_file = max(time.perf_counter() - started - alone, 0.0) / (FILES - 1)
    reference = tree_bytes(reference_dir)
    assert len(reference) == FILES

    rng = random.Random(SEED)
    finished = []
    for index, sig in enumerate(SIGNALS):
        process = _start(root, out, tiny_checkpoint, resume=index > 0)
        deadline = time.monotonic() + 120
        while not leftovers(out):          # the batch has begun its next file
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "no temporary output appeared"
            time.sleep(0.005)
        # The seeded moment, but never so late that the run has ended (its handlers put back,
        # the process exiting) or that the later signals find nothing left to interrupt: at
        # most 12 outputs in place at the first signal, 2 more at each later one (22 at the last).
        moment = time.monotonic() + rng.uniform(0.05, 1.5) * per_file
        cap = FILES - 14 - 2 * (len(SIGNALS) - 1 - index)
        while time.monotonic() < moment and len(list(out.rglob("*.wav"))) < cap:
            time.sleep(0.002)
        assert process.poll() is None, "the batch finished before the signal"
        process.send_signal(sig)
        _, stderr = process.communicate(timeout=60)
        assert process.returncode == 128 + sig, (sig, stderr)
        said = re.fullmatch(rf"interrupted \(no partial output left behind\): (\d+) of {FILES} "
                            r"done; resume with --skip-existing", stderr.strip().splitlines()[-1])
        assert said, stderr
        assert "Traceback" not in stderr
        finished.append(_check_finished_outputs(out, reference))
        # done: the files reported finished; one more may have been renamed into place as the
        # signal landed, before its report
        assert int(said[1]) <= finished[-1] <= int(said[1]) + 1, (said[0], finished[-1])
    assert finished == sorted(finished) and finished[-1] < FILES, finished

    final = _start(root, out, tiny_checkpoint, resume=True)
    _, stderr = final.communicate(timeout=180)
    assert final.returncode == 0, stderr
    assert _check_finished_outputs(out, reference) == FILES
    assert tree_bytes(out) == reference
    for name in reference:
        assert sf.info(str(out / name)).frames == sf.info(str(root / name)).frames


# ------------------------------------------------------------------------------ kill -9

def _wait_until(found, process: subprocess.Popen, what: str, timeout: float = 60):
    """Poll `found()` until it returns something, while `process` still runs."""
    deadline = time.monotonic() + timeout
    while not (result := found()):
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, f"no {what} appeared"
        time.sleep(0.01)
    return result


def _killed(process: subprocess.Popen) -> None:
    process.kill()
    assert process.wait(timeout=60) == -signal.SIGKILL
    for stream in (process.stdout, process.stderr):
        if stream is not None:
            stream.close()


def _dead_pid() -> int:
    """The id of a process of this machine that has just ended."""
    child = subprocess.Popen([sys.executable, "-c", ""])
    child.wait(timeout=60)
    return child.pid


@cases(2)   # the kill, then the next run into that folder
def test_a_killed_run_leaves_a_temporary_the_next_run_removes(tmp_path, tiny_checkpoint):
    """SIGKILL cannot be caught: the hidden temporary of the file being written stays, its owner
    in its name. The next run writing into that folder finds the owner dead and removes it."""
    long = tmp_path / "long.wav"  # a minute of noise: the kill lands mid-file on any machine
    sf.write(str(long), 0.1 * np.random.default_rng(0).standard_normal(60 * RATE), RATE,
             subtype="PCM_16")
    out = tmp_path / "out"
    out.mkdir()
    process = subprocess.Popen([sys.executable, "-c", CHILD, "enhance", str(long),
                                str(out / "long.wav"), "--model", str(tiny_checkpoint)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO)
    _wait_until(lambda: leftovers(out), process, "temporary output")
    _killed(process)
    (left,) = leftovers(out)
    assert f".long.wav.{process.pid}-" in left.name, left.name

    result = invoke("enhance", make_audio(tmp_path / "short.wav"), out / "short.wav",
                    "--model", tiny_checkpoint)
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == ["short.wav"]
    audit_outputs(out, {"short.wav": 400})


@cases(7)
def test_only_the_temporaries_of_provably_dead_owners_are_removed(tmp_path, tiny_checkpoint):
    """Of seven things named like temporaries, a run removes only the one whose owner was a
    process of this machine and is gone: a live owner's (another process, this one), a dead
    owner's from another machine tag, the older names without an owner, a user's `.partial`
    and a folder named like a temporary all stay."""
    out = tmp_path / "out"
    out.mkdir()
    here = owners.owner().split("-")[1]
    elsewhere = f"{int(here, 16) ^ 1:06x}"
    dead = _dead_pid()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        names = {
            "dead-owner-here": f".a.wav.{dead}-{here}-0123abcd.partial",
            "live-owner-here": f".b.wav.{live.pid}-{here}-0123abcd.partial",
            "this-process": f".c.wav.{os.getpid()}-{here}-0123abcd.partial",
            "dead-owner-elsewhere": f".d.wav.{dead}-{elsewhere}-0123abcd.partial",
            "no-owner-in-the-name": ".e.wav.0123456789ab.partial",
            "a-users-file": "notes.partial",
        }
        for name in names.values():
            (out / name).write_bytes(b"partial")
        (out / f".f.wav.{dead}-{here}-0123abcd.partial").mkdir()
        result = invoke("enhance", make_audio(tmp_path / "g.wav"), out / "g.wav",
                        "--model", tiny_checkpoint)
        assert result.exit_code == 0, result.output
    finally:
        live.kill()
        live.wait(timeout=60)
    kept = {p.name for p in out.iterdir()}
    assert names["dead-owner-here"] not in kept
    assert kept == {*names.values(), f".f.wav.{dead}-{here}-0123abcd.partial", "g.wav"} - \
        {names["dead-owner-here"]}


@cases(2)   # the kill, then the next run from stdin
def test_a_killed_stdin_run_leaves_copies_the_next_run_removes(tmp_path, tiny_checkpoint,
                                                               monkeypatch):
    """`enhance - -` killed with SIGKILL mid-file: its copy of stdin and its folder for the
    stdout output stay in TMPDIR, owned by the dead process; the next run from stdin removes
    both, and touches nothing else there."""
    spool = tmp_path / "tmp"
    spool.mkdir()
    (spool / "speechlens-stdin.someone-elses.wav").write_bytes(b"x")
    process = subprocess.Popen([sys.executable, "-c", CHILD, "enhance", "-", "-", "--model",
                                str(tiny_checkpoint)], stdin=subprocess.PIPE,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=REPO,
                               env={**os.environ, "TMPDIR": str(spool)})
    noise = 0.1 * np.random.default_rng(0).standard_normal(60 * RATE)   # a minute: mid-file
    process.stdin.write(wav_bytes(noise))
    process.stdin.close()
    theirs = _wait_until(lambda: [p for p in spool.iterdir() if f".{process.pid}-" in p.name]
                         if leftovers(spool) else [], process, "stdout temporary")
    _killed(process)
    assert sorted(p.is_dir() for p in theirs) == [False, True], theirs  # the copy, the folder

    monkeypatch.setattr(tempfile, "tempdir", str(spool))
    result = invoke("enhance", "-", tmp_path / "o.wav", "--model", tiny_checkpoint,
                    input=make_audio(tmp_path / "speech.wav").read_bytes())
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in spool.iterdir()) == ["speechlens-stdin.someone-elses.wav"]
