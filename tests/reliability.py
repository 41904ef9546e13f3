"""Helpers shared by tests/test_reliability_*.py (docs/reliability.md: hostile inputs, faults,
interruptions).

Every reliability test ends with the same audit: no temporary output anywhere, and every output
that exists is complete. `audit_outputs` is that check; "files lost" in docs/reliability.md is the
number of finished files found missing or damaged (0: any such file fails its test).

The counts in docs/reliability.md are computed, never recorded: `count_cases()` lists every
reliability test with the number of cases it runs (parameter sets, hypothesis examples, or what
its `@cases(n)` says for a test that walks a table of its own). `python -m tests.reliability`
prints them; tests/test_reliability_docs.py checks the document against them. Nothing is written.
"""

from __future__ import annotations

import builtins
import errno as errnos
import hashlib
import importlib
import io
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import soundfile as sf
from click.testing import CliRunner

from speechlens_cli.cli import main
from speechlens_cli.synthetic.speech import noisy_speech

RATE = 8000
REPO = Path(__file__).resolve().parents[1]

#: The CLI in a child process, with Ctrl-C handling on even when pytest runs in a background job
#: (which starts children with SIGINT ignored, as a terminal never would).
CHILD = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
         "from speechlens_cli.__main__ import main; sys.argv[0] = 'speechlens'; main()")


def invoke(*args, **kwargs):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False, **kwargs)


def one_error_line(text: str) -> str:
    """The only line of `text` (stderr), which must be an 'error: ' line."""
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    assert lines[0].startswith("error: "), text
    assert "Traceback" not in text
    return lines[0]


def wav_bytes(data: np.ndarray, rate: int = RATE, subtype: str = "PCM_16",
              fmt: str = "WAV") -> bytes:
    buffer = io.BytesIO()
    sf.write(buffer, data, rate, subtype=subtype, format=fmt)
    return buffer.getvalue()


def make_audio(path: Path, frames: int = 400, channels: int = 1, subtype: str = "PCM_16",
               fmt: str = "WAV", rate: int = RATE, seed: int = 0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(str(path), noisy_speech(rate, frames / rate, channels=channels, seed=seed), rate,
             subtype=subtype, format=fmt)
    return path


def leftovers(root: Path) -> list[Path]:
    """Temporary outputs (ours: .NAME.RANDOM.partial) anywhere under `root`."""
    return [p for p in root.rglob("*") if p.name.endswith(".partial")]


def tree_bytes(root: Path, pattern: str = "*") -> dict[str, bytes]:
    """{relative path: content} of the files under `root` (symlinks not followed)."""
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob(pattern)) if p.is_file() and not p.is_symlink()}


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def audit_outputs(root: Path, expected: dict[str, int] | None = None) -> None:
    """No temporary file under `root`; every audio file there decodes completely; with
    `expected` ({relative path: frames}), each of those exists with exactly that many frames."""
    assert not leftovers(root), leftovers(root)
    for path in root.rglob("*"):
        if path.is_file() and path.suffix in (".wav", ".flac"):
            info = sf.info(str(path))
            data, _ = sf.read(str(path), dtype="float32", always_2d=True)
            assert len(data) == info.frames > 0, path
            assert np.isfinite(data).all(), path
    for name, frames in (expected or {}).items():
        assert sf.info(str(root / name)).frames == frames, name


def run_child(args: list, *, env: dict | None = None, timeout: float = 120,
              preexec=None) -> subprocess.CompletedProcess:
    """The CLI in a fresh process (text output)."""
    return subprocess.run([sys.executable, "-c", CHILD, *map(str, args)], capture_output=True,
                          text=True, cwd=REPO, timeout=timeout, check=False,
                          env={**os.environ, **(env or {})}, preexec_fn=preexec)


def refuse_writes(monkeypatch, root: Path, errno: int = errnos.EROFS) -> list[str]:
    """From now on every attempt to create, change or remove anything under `root` fails with
    `errno` (EROFS: a read-only mount; EACCES: no permission). Running as root ignores chmod, so
    the refusal is injected where Python reaches the OS: os.open with write flags, mkdir, rmdir,
    unlink, symlink, chmod, utime, replace/rename/link with either end inside, and open()/io.open
    for writing. Returns the list the refused attempts are recorded in."""
    root = root.absolute()
    refused: list[str] = []

    def guarded(path) -> bool:
        try:
            target = Path(os.fsdecode(path)).absolute()
        except TypeError:      # a file descriptor
            return False
        return target == root or root in target.parents

    def refuse(what: str, path) -> None:
        refused.append(f"{what} {path}")
        raise OSError(errno, os.strerror(errno), str(path))

    def wrap(module, name: str, writes: Callable[..., bool] = lambda *a, **k: True) -> None:
        real = getattr(module, name)

        def check(path, *args, **kwargs):
            if guarded(path) and writes(*args, **kwargs):
                refuse(name, path)
            return real(path, *args, **kwargs)
        monkeypatch.setattr(module, name, check)

    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    wrap(os, "open", lambda flags, *a, **k: bool(flags & write_flags))
    for name in ("mkdir", "rmdir", "unlink", "remove", "symlink", "chmod", "utime"):
        wrap(os, name)
    for name in ("replace", "rename", "link"):
        real = getattr(os, name)

        def moved(src, dst, *args, _real=real, _name=name, **kwargs):
            if guarded(src) or guarded(dst):
                refuse(_name, f"{src} -> {dst}")
            return _real(src, dst, *args, **kwargs)
        monkeypatch.setattr(os, name, moved)
    for module in (builtins, io):
        wrap(module, "open", lambda mode="r", *a, **k: any(c in mode for c in "wax+"))
    return refused


# ------------------------------------------------------------------------------ counting cases

#: Test module -> the headline count its cases add to.
KINDS = {
    "test_reliability_inputs": "inputs tried",
    "test_reliability_limits": "inputs tried",
    "test_reliability_media": "inputs tried",
    "test_reliability_options": "inputs tried",
    "test_reliability_checkpoints": "faults injected",
    "test_reliability_filesystem": "faults injected",
    "test_reliability_download": "faults injected",
    "test_reliability_interrupts": "interruptions survived",
    "test_reliability_determinism": "determinism runs",
}


def cases(count: int) -> Callable:
    """Declare how many cases a test runs when it walks its own table (default 1)."""
    def mark(test):
        test.reliability_cases = count
        return test
    return mark


def case_count(test) -> int:
    """Cases one test function runs: hypothesis max_examples (derandomized, no filters: each
    run draws exactly that many), else @cases(n) times every parametrize list's length."""
    if getattr(test, "is_hypothesis_test", False):
        return test._hypothesis_internal_use_settings.max_examples
    count = getattr(test, "reliability_cases", 1)
    for mark in getattr(test, "pytestmark", []):
        if mark.name == "parametrize":
            count *= len(mark.args[1])
    return count


def count_cases() -> list[tuple[str, str, str, int]]:
    """(module, test, kind, cases) for every reliability test, in source order."""
    rows = []
    for module_name, kind in KINDS.items():
        module = importlib.import_module(f"tests.{module_name}")
        for name, test in vars(module).items():
            if name.startswith("test_") and callable(test):
                rows.append((module_name, name, kind, case_count(test)))
    return rows


def totals() -> dict[str, int]:
    sums = dict.fromkeys(KINDS.values(), 0)
    for _module, _test, kind, count in count_cases():
        sums[kind] += count
    return sums


if __name__ == "__main__":
    for module_name, name, kind, count in count_cases():
        print(f"{module_name}::{name:70} {kind:24} {count}")
    print(totals())
