"""Reliability, the file system fails under us (docs/reliability.md, section 3).

Faults are injected in two ways: in-process (monkeypatched soundfile writes, an os layer that
refuses writes as a read-only mount or missing permission would, a folder removed mid-run) and
for real in child processes (RLIMIT_FSIZE makes the kernel refuse writes past a size, as a full
disk does; /dev/full answers ENOSPC; a closed pipe answers EPIPE). After each: one error line
naming the file, a non-zero exit, no temporary file, every existing output intact.
tests/test_cli.py already proves an output equal to the input (same path, via "..", via a
symlink) is refused and an unwritable folder (/sys) fails before the model runs.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import soundfile as sf

from speechlens_cli import conveyor
from tests.reliability import (
    CHILD,
    REPO,
    audit_outputs,
    cases,
    invoke,
    leftovers,
    make_audio,
    one_error_line,
    refuse_writes,
    tree_bytes,
)


def _records(result) -> dict[str, dict]:
    return {Path(r["input"]).name: r for r in map(json.loads, result.stdout.splitlines())}


@pytest.fixture
def batch(tmp_path) -> Path:
    """in/ with three short files (a, b, c)."""
    for index, name in enumerate("abc"):
        make_audio(tmp_path / "in" / f"{name}.wav", 400 + 40 * index, seed=index)
    return tmp_path / "in"


# ------------------------------------------------------------------------------ unwritable

@pytest.mark.parametrize("code", [errno.EROFS, errno.EACCES], ids=["read-only", "no-permission"])
def test_unwritable_destination_stops_the_batch_before_the_model(tmp_path, batch, monkeypatch,
                                                                 code):
    """One line for the whole batch, not one per file; the model (missing here) is never
    needed and nothing is written."""
    out = tmp_path / "out"
    out.mkdir()
    refused = refuse_writes(monkeypatch, out, code)
    result = invoke("enhance", batch, out, "--model", tmp_path / "no-such-model", "--json")
    assert result.exit_code == 1, result.output
    assert one_error_line(result.stderr) == f"error: {out}: not writable ({os.strerror(code)})"
    assert result.stdout == ""
    assert refused and list(out.iterdir()) == []


def _full_device(monkeypatch, root: Path) -> None:
    """os.statvfs reports no free blocks for `root` (an empty file still fits on a full disk)."""
    real = os.statvfs

    def statvfs(path):
        found = real(path)
        if Path(path).absolute() != root.absolute():
            return found
        return os.statvfs_result((*found[:3], 0, 0, *found[5:]))
    monkeypatch.setattr(os, "statvfs", statvfs)


@cases(3)
def test_every_shared_destination_problem_is_one_line(tmp_path, batch, monkeypatch):
    """A full device, a file where the output folder would go, and --suffix beside inputs in a
    read-only folder: each stops the batch in one line before the model."""
    missing_model = ("--model", tmp_path / "no-such-model")
    full = tmp_path / "full"
    full.mkdir()
    _full_device(monkeypatch, full)
    result = invoke("enhance", batch, full / "out", *missing_model)
    assert one_error_line(result.stderr) == \
        f"error: {full}: not writable ({os.strerror(errno.ENOSPC)})"
    assert result.exit_code == 1 and list(full.iterdir()) == []

    (tmp_path / "file").write_bytes(b"not a folder")
    result = invoke("enhance", batch, tmp_path / "file" / "out", *missing_model)
    assert one_error_line(result.stderr) == f"error: {tmp_path / 'file'}: is a file, not a folder"
    assert result.exit_code == 1

    refuse_writes(monkeypatch, batch)
    before = tree_bytes(batch)
    result = invoke("enhance", *sorted(batch.iterdir()), "--suffix", "_clean", *missing_model)
    assert one_error_line(result.stderr) == \
        f"error: {batch}: not writable ({os.strerror(errno.EROFS)})"
    assert result.exit_code == 1 and tree_bytes(batch) == before


def test_a_problem_of_one_output_folder_fails_only_its_files(tmp_path, batch, tiny_checkpoint,
                                                            monkeypatch):
    """Not shared: with --suffix, a.wav is written beside itself; x.wav's folder is read-only, so
    x alone fails, in one line printed once (not again in the summary)."""
    stuck = make_audio(tmp_path / "ro" / "x.wav")
    refuse_writes(monkeypatch, stuck.parent)
    result = invoke("enhance", batch / "a.wav", stuck, "--suffix", "_clean",
                    "--model", tiny_checkpoint)
    assert result.exit_code == 3, result.output
    line = f"error: {stuck.parent}: not writable ({os.strerror(errno.EROFS)})"
    assert result.stderr.count(f"{stuck.parent}: not writable") == 1
    assert line in result.stderr.splitlines()
    assert (batch / "a_clean.wav").is_file() and sorted(stuck.parent.iterdir()) == [stuck]


def test_unwritable_single_file_is_one_line(tmp_path, monkeypatch, tiny_checkpoint):
    src = make_audio(tmp_path / "a.wav")
    (tmp_path / "out").mkdir()
    refuse_writes(monkeypatch, tmp_path / "out", errno.EACCES)
    result = invoke("enhance", src, tmp_path / "out" / "a.wav", "--model", tiny_checkpoint)
    assert result.exit_code == 1
    assert "out: not writable (Permission denied)" in one_error_line(result.stderr)


# ------------------------------------------------------------------------------ disappearing

def _while_writing(monkeypatch, action) -> None:
    """`action(n)` just before the n-th enhanced window (from 1) is written: while a file's
    output is open, as the writer runs beside the model."""
    real, calls = conveyor.WindowJoiner.add, []

    def add(self, *args):
        calls.append(None)
        action(len(calls))
        return real(self, *args)

    monkeypatch.setattr(conveyor.WindowJoiner, "add", add)


def test_output_folder_removed_mid_batch(tmp_path, batch, tiny_checkpoint, monkeypatch):
    """The whole output tree is deleted while b.wav is being written: b fails in one line
    (its temporary file went with the folder), c is written into a recreated folder."""
    out = tmp_path / "out"
    _while_writing(monkeypatch, lambda n: n == 2 and shutil.rmtree(out))
    result = invoke("enhance", batch, out, "--model", tiny_checkpoint, "--json")
    assert result.exit_code == 3, result.output
    records = _records(result)
    assert [records[n]["status"] for n in ("a.wav", "b.wav", "c.wav")] == \
        ["done", "failed", "done"]
    assert "b.wav: its folder was removed while the file was being written" in \
        records["b.wav"]["error"]
    audit_outputs(out, {"c.wav": 480})
    assert sorted(p.name for p in out.iterdir()) == ["c.wav"]


def test_output_folder_removed_mid_file(tmp_path, tiny_checkpoint, monkeypatch):
    src = make_audio(tmp_path / "a.wav")
    out = tmp_path / "out"
    out.mkdir()
    _while_writing(monkeypatch, lambda n: shutil.rmtree(out))
    result = invoke("enhance", src, out / "a.wav", "--model", tiny_checkpoint)
    assert result.exit_code == 1
    assert "its folder was removed" in one_error_line(result.stderr)
    assert not out.exists() and not leftovers(tmp_path)


# ------------------------------------------------------------------------------ disk full

def _failing_writes(monkeypatch, after: int, error: Exception, method: str = "write") -> None:
    """soundfile's `method` on an output being written (the temporary file) succeeds `after`
    times, then raises `error` once (a failing close still closes, so nothing fails again at
    garbage collection). Only open files count: the garbage collector may close again, at any
    moment, a file an earlier test finished."""
    real, calls = getattr(sf.SoundFile, method), []

    def fail(self, *args, **kwargs):
        name = os.fsdecode(self.name) if isinstance(self.name, (str, bytes)) else ""
        if self.mode == "w" and not self.closed and name.endswith(".partial"):
            calls.append(1)
            if len(calls) == after + 1:
                if method == "close":
                    real(self)
                raise error
        return real(self, *args, **kwargs)

    monkeypatch.setattr(sf.SoundFile, method, fail)


@pytest.mark.parametrize("after", [0, 1])
def test_disk_full_during_write_keeps_the_old_output(tmp_path, tiny_checkpoint, monkeypatch,
                                                     after):
    """ENOSPC on the first or a later block, with --overwrite: the previous output survives
    byte for byte, the temporary file is gone, the line names the output and the reason."""
    src = make_audio(tmp_path / "a.wav", 42_000)   # two 5-s windows: three writes
    dst = tmp_path / "out.wav"
    dst.write_bytes(b"the previous output")
    _failing_writes(monkeypatch, after, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
    result = invoke("enhance", src, dst, "--model", tiny_checkpoint, "--overwrite",
                    "--chunk-seconds", "5")
    assert result.exit_code == 1
    assert f"{dst}: write failed (No space left on device)" in one_error_line(result.stderr)
    assert dst.read_bytes() == b"the previous output" and not leftovers(tmp_path)


def test_short_write_assertion_is_a_write_failure(tmp_path, tiny_checkpoint, monkeypatch):
    """soundfile asserts every frame was written; a short write must not escape as a
    traceback (nor vanish under python -O)."""
    src = make_audio(tmp_path / "a.wav")
    _failing_writes(monkeypatch, 0, AssertionError())
    result = invoke("enhance", src, tmp_path / "out.wav", "--model", tiny_checkpoint)
    assert result.exit_code == 1 and "out.wav: write failed" in one_error_line(result.stderr)
    assert not leftovers(tmp_path) and not (tmp_path / "out.wav").exists()


def test_failure_when_closing_the_output_is_caught(tmp_path, tiny_checkpoint, monkeypatch):
    """The encoder's final flush fails (close): no output, one line."""
    src = make_audio(tmp_path / "a.wav")
    _failing_writes(monkeypatch, 0, sf.LibsndfileError(2, "flush failed: "), method="close")
    result = invoke("enhance", src, tmp_path / "out.wav", "--model", tiny_checkpoint)
    assert result.exit_code == 1 and "out.wav: write failed" in one_error_line(result.stderr)
    assert not leftovers(tmp_path) and not (tmp_path / "out.wav").exists()


_KERNEL_FAULTS = textwrap.dedent("""
    # Real refusals from the kernel, one CLI run each, in this one process: RLIMIT_FSIZE
    # (soft) makes write() fail with EFBIG past a size, as a full disk fails with ENOSPC.
    import contextlib, io, json, os, resource, signal, sys
    from speechlens_cli.__main__ import main
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
    report = []
    for case in json.loads(sys.argv[1]):
        if case.get("stdin"):
            sys.stdin = io.TextIOWrapper(open(case["stdin"], "rb"))
        err = io.StringIO()
        resource.setrlimit(resource.RLIMIT_FSIZE, (case.get("limit", hard), hard))
        try:
            with contextlib.redirect_stderr(err):
                main(case["args"], prog_name="speechlens")
            code = 0
        except SystemExit as done:
            code = done.code if isinstance(done.code, int) else 1
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
        report.append({"code": code, "stderr": err.getvalue()})
    print(json.dumps(report), file=sys.__stderr__)
""")


@cases(4)
def test_kernel_refused_writes(tmp_path, tiny_checkpoint):
    """Past a file-size limit: a WAV's header, a WAV's data, a FLAC encoder's last block
    (libsndfile reports success there: the output used to be truncated and exit 0) and stdin's
    buffer. Each is one line, exit 1, no output file, no temporary file."""
    src = make_audio(tmp_path / "in.wav", 16_000)
    out = tmp_path / "out"
    out.mkdir()
    model = ["--model", str(tiny_checkpoint)]
    cases = [
        {"limit": 0, "args": ["enhance", str(src), str(out / "zero.wav"), *model]},
        {"limit": 20_000, "args": ["enhance", str(src), str(out / "data.wav"), *model]},
        {"limit": 20_000, "args": ["enhance", str(src), str(out / "tail.flac"), *model]},
        {"limit": 1_000, "stdin": str(src), "args": ["enhance", "-", str(out / "s.wav"), *model]},
    ]
    expected = ["zero.wav: cannot write WAV/PCM_16 there (File too large)",
                "data.wav: write failed (File too large)",
                "tail.flac: the written file does not read back complete",
                "<stdin>: could not be buffered in"]
    done = subprocess.run([sys.executable, "-c", _KERNEL_FAULTS, json.dumps(cases)],
                          capture_output=True, text=True, cwd=REPO, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stderr.strip().splitlines()[-1])
    for case, outcome, fragment in zip(cases, report, expected, strict=True):
        assert outcome["code"] == 1, (case, outcome)
        assert fragment in one_error_line(outcome["stderr"]), (case, outcome)
    assert list(out.iterdir()) == [] and not leftovers(tmp_path)
    assert not list(Path(os.environ.get("TMPDIR", "/tmp")).glob("speechlens-stdin.*"))


@pytest.mark.parametrize("reader", ["dev-full", "closed-pipe"])
def test_stdout_that_cannot_take_the_audio(tmp_path, tiny_checkpoint, reader):
    """`speechlens enhance in.wav - > /dev/full` (ENOSPC) and `... - | true` (EPIPE): one line,
    exit 1 (never 0: nothing was delivered), and no second failure when Python exits."""
    src = make_audio(tmp_path / "in.wav", 16_000)
    args = [sys.executable, "-c", CHILD, "enhance", str(src), "-", "--model", str(tiny_checkpoint)]
    if reader == "dev-full":
        with open("/dev/full", "wb") as full:
            done = subprocess.run(args, stdout=full, stderr=subprocess.PIPE, text=True, cwd=REPO,
                                  timeout=120, check=False)
        code, stderr = done.returncode, done.stderr
    else:
        process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, cwd=REPO)
        process.stdout.close()       # the reader is gone before a byte is written
        stderr = process.stderr.read()
        code = process.wait(timeout=120)
    assert code == 1, stderr
    fragment = ("<stdout>: write failed (No space left on device)" if reader == "dev-full"
                else "<stdout>: the reader closed the pipe")
    assert fragment in one_error_line(stderr)
    assert not leftovers(tmp_path)


# ------------------------------------------------------------------------------ same file

@cases(3)
def test_output_that_is_the_input_in_a_batch(tmp_path, tiny_checkpoint):
    """-o pointing at the input's own folder through a symlink, and a hard link as output:
    refused per file (exit 3), the input never touched. Folder onto itself: usage error."""
    src = make_audio(tmp_path / "in" / "a.wav")
    before = src.read_bytes()
    (tmp_path / "alias").symlink_to(tmp_path / "in")
    result = invoke("enhance", src, "-o", tmp_path / "alias", "--model", tiny_checkpoint,
                    "--overwrite", "--json")
    assert result.exit_code == 3
    assert "is the input itself" in _records(result)["a.wav"]["error"]
    os.link(src, tmp_path / "hard.wav")
    single = invoke("enhance", src, tmp_path / "hard.wav", "--model", tiny_checkpoint,
                    "--overwrite")
    assert single.exit_code == 2 and "is the input itself" in one_error_line(single.stderr)
    folder = invoke("enhance", tmp_path / "in", tmp_path / "alias", "--model", tiny_checkpoint)
    assert folder.exit_code == 2 and "is the input folder" in one_error_line(folder.stderr)
    assert src.read_bytes() == before and not leftovers(tmp_path)


def _error_lines(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("error: ")]


def _suffix_chain(tmp_path: Path) -> tuple[list, Path, list[str], list[Path]]:
    """a.wav's output a_c.wav is the second input (left alone itself, its name ending in _c)."""
    a, a_c = make_audio(tmp_path / "a.wav", seed=1), make_audio(tmp_path / "a_c.wav", seed=2)
    b = make_audio(tmp_path / "b.wav", seed=3)
    return [a, a_c, b, "--suffix", "_c"], a_c, [f"{a_c}: is also an input"], [tmp_path / "b_c.wav"]


def _input_in_the_output_folder(tmp_path: Path) -> tuple[list, Path, list[str], list[Path]]:
    """in/a.wav's output out/a.wav is the second input (whose output it is too)."""
    out = tmp_path / "out"
    a, b = make_audio(tmp_path / "in" / "a.wav", seed=1), make_audio(tmp_path / "in" / "b.wav")
    victim = make_audio(out / "a.wav", seed=2)
    return ([a, victim, b, "-o", out], victim,
            [f"{victim}: is also an input", f"{victim}: is also the output of another input"],
            [out / "b.wav"])


def _folder_into_its_parent(tmp_path: Path) -> tuple[list, Path, list[str], list[Path]]:
    """`enhance d/sub/ d/`: d/sub/sub/a.wav is mirrored onto the input d/sub/a.wav."""
    victim = make_audio(tmp_path / "d" / "sub" / "a.wav", seed=1)
    make_audio(tmp_path / "d" / "sub" / "sub" / "a.wav", seed=2)
    return ([victim.parent, tmp_path / "d"], victim, [f"{victim}: is also an input"],
            [tmp_path / "d" / "a.wav"])


@pytest.mark.parametrize("setup", [_suffix_chain, _input_in_the_output_folder,
                                   _folder_into_its_parent],
                         ids=["suffix-chain", "input-in-output-folder", "folder-into-its-parent"])
def test_overwrite_never_replaces_another_input(tmp_path, tiny_checkpoint, setup):
    """An output that is another input of the run (not its own) used to be replaced under
    --overwrite: that job alone fails, in one line, exit 3; the input keeps its bytes and the
    other jobs are written. Under --skip-existing the existing output is kept, as before."""
    args, victim, lines, written = setup(tmp_path)
    before = victim.read_bytes()
    result = invoke("enhance", *args, "--model", tiny_checkpoint, "--overwrite")
    assert result.exit_code == 3, result.output
    assert "Traceback" not in result.output
    *errors, summary = _error_lines(result)
    assert len(errors) == len(lines) and summary.endswith(" files failed (listed above)"), \
        result.stderr
    for line, fragment in zip(errors, lines, strict=True):
        assert line.startswith(f"error: {fragment}"), line
    assert errors[0].endswith("choose another output")
    assert victim.read_bytes() == before
    assert all(sf.info(str(path)).frames > 0 for path in written)
    assert not leftovers(tmp_path)
    again = invoke("enhance", *args, "--model", tiny_checkpoint, "--skip-existing", "--json")
    assert "is also an input" not in again.output and victim.read_bytes() == before


# ------------------------------------------------------------------------------ symlinks

@cases(6)   # the hostile links; the link inside the tree is followed
def test_symlinks_never_lead_the_batch_out_of_its_tree(tmp_path, tiny_checkpoint):
    """in/ holds a real file, a link to it (followed: inside the tree), a link to a file outside,
    a link loop, a dangling link, a link to the parent folder and one to an outside folder.
    Only the inside ones are enhanced; the rest are listed as skipped; exit 0."""
    root = tmp_path / "in"
    make_audio(root / "a.wav", seed=1)
    make_audio(tmp_path / "outside" / "secret.wav", seed=2)
    (root / "sub").mkdir()
    links = {
        "sub/inside.wav": Path("../a.wav"),
        "sub/escape.wav": tmp_path / "outside" / "secret.wav",
        "loop1.wav": Path("loop2.wav"), "loop2.wav": Path("loop1.wav"),
        "dangling.wav": tmp_path / "nowhere.wav",
        "sub/up": Path(".."), "outdir": tmp_path / "outside",
    }
    for name, target in links.items():
        (root / name).symlink_to(target)
    result = invoke("enhance", root, tmp_path / "out", "--model", tiny_checkpoint, "--json")
    assert result.exit_code == 0, result.output
    status = {Path(r["input"]).relative_to(root).as_posix(): (r["status"], r.get("reason", ""))
              for r in map(json.loads, result.stdout.splitlines())}
    assert status["a.wav"][0] == status["sub/inside.wav"][0] == "done"
    assert status["sub/escape.wav"][0] == "skipped" and "outside the input folder" in \
        status["sub/escape.wav"][1]
    for name in ("loop1.wav", "loop2.wav", "dangling.wav"):
        assert status[name] == ("skipped", ("broken symlink (its target is missing or a loop),"
                                            " not followed"))
    for name in ("sub/up", "outdir"):
        assert status[name] == ("skipped", "symlinked folder, not followed")
    assert sorted(tree_bytes(tmp_path / "out")) == ["a.wav", "sub/inside.wav"]
    audit_outputs(tmp_path / "out")


def _mirrored_tree(tmp_path: Path) -> Path:
    """in/a.wav, in/sub/b.wav, in/sub/deep/c.wav."""
    for index, name in enumerate(("a.wav", "sub/b.wav", "sub/deep/c.wav")):
        make_audio(tmp_path / "in" / name, seed=index)
    return tmp_path / "in"


def _link_line(link: Path) -> str:
    return (f"error: {link}: is a symbolic link; speechlens does not write through links inside "
            "the output folder")


@pytest.mark.parametrize("target", ["folder", "dangling"])
def test_a_symlinked_folder_in_the_output_tree_is_never_followed(tmp_path, tiny_checkpoint,
                                                                 target):
    """out/sub is already a link, to a folder elsewhere or to nothing: the files mirrored below
    it used to be written there (with --overwrite, replacing what was there), or the batch
    stopped with a FileExistsError traceback. Each now fails in one line naming the link, at
    planning (--dry-run says so); a.wav is written, exit 3, the link and what it points to are
    untouched. The output folder named, itself a link here, is the user's choice: followed."""
    root = _mirrored_tree(tmp_path)
    real_out, elsewhere = tmp_path / "real-out", tmp_path / "elsewhere"
    real_out.mkdir()
    named = tmp_path / "out"
    named.symlink_to(real_out)
    if target == "folder":
        make_audio(elsewhere / "b.wav", seed=9)
        make_audio(elsewhere / "deep" / "c.wav", seed=9)
    (named / "sub").symlink_to(elsewhere)
    before = tree_bytes(elsewhere)
    for flags in (["--dry-run"], []):
        result = invoke("enhance", root, named, "--model", tiny_checkpoint, "--overwrite", "-q",
                        *flags)
        assert result.exit_code == 3, result.output
        assert "Traceback" not in result.output
        assert _error_lines(result) == [_link_line(named / "sub")] * 2 + \
            ["error: 2 of 3 files failed (listed above)"], result.stderr
    assert (named / "sub").is_symlink()
    if target == "folder":
        assert tree_bytes(elsewhere) == before
    else:
        assert not elsewhere.exists()
    assert sorted(p.relative_to(real_out).as_posix() for p in real_out.rglob("*")) == \
        ["a.wav", "sub"]
    audit_outputs(real_out, {"a.wav": 400})
    assert not leftovers(tmp_path)


def test_a_link_made_in_the_output_tree_after_planning_is_refused(tmp_path, tiny_checkpoint,
                                                                 monkeypatch):
    """Another process makes out/sub a link to a folder elsewhere while a.wav is written, after
    planning found none: the output folders are made one level at a time and the link is
    refused, never followed (b.wav and c.wav used to be written elsewhere). Each fails in one
    line; exit 3; nothing is written elsewhere."""
    root = _mirrored_tree(tmp_path)
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    elsewhere.mkdir()
    _while_writing(monkeypatch, lambda n: n == 1 and (out / "sub").symlink_to(elsewhere))
    result = invoke("enhance", root, out, "--model", tiny_checkpoint, "-q")
    assert result.exit_code == 3, result.output
    assert _error_lines(result) == [_link_line(out / "sub")] * 2 + \
        ["error: 2 of 3 files failed (listed above)"], result.stderr
    assert list(elsewhere.iterdir()) == []
    audit_outputs(out, {"a.wav": 400})
    assert not leftovers(tmp_path)


# ------------------------------------------------------------------------------ two writers

@pytest.mark.parametrize("flags", [[], ["--skip-existing"]], ids=["plain", "skip-existing"])
def test_two_processes_into_one_output_folder(tmp_path, tiny_checkpoint, flags):
    """Two speechlens processes, started together on the same 6-file tree and the same output
    folder. Every file is written by exactly one of them (the other sees it exists, or loses the
    race at the rename: no-clobber, never a replace, and reports it skipped), every output
    equals a one-process run byte for byte, and no temporary file is left."""
    root = tmp_path / "in"
    for index in range(6):
        make_audio(root / f"d{index % 2}" / f"f{index}.wav", 800 + 8 * index, seed=index)
    reference = tmp_path / "reference"
    assert invoke("enhance", root, reference, "--model", tiny_checkpoint, "-q").exit_code == 0
    out = tmp_path / "out"
    args = [sys.executable, "-c", CHILD, "enhance", str(root), str(out), "--model",
            str(tiny_checkpoint), "--json", "-q", *flags]
    processes = [subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, cwd=REPO) for _ in range(2)]
    outputs = [p.communicate(timeout=180) for p in processes]
    done: dict[str, int] = {}
    for process, (stdout, stderr) in zip(processes, outputs, strict=True):
        records = [json.loads(line) for line in stdout.splitlines()]
        assert len(records) == 6, (stdout, stderr)
        for record in records:
            name = Path(record["input"]).name
            if record["status"] == "done":
                done[name] = done.get(name, 0) + 1
            else:   # the other process wrote it first: kept, as a batch run again keeps it
                assert record["status"] == "skipped", record
                assert record["reason"] == ("output exists" if flags
                                            else "exists (--overwrite replaces it)"), record
        failures = sum(r["status"] == "failed" for r in records)
        assert process.returncode == (3 if failures else 0), stderr
    assert done == {f"f{index}.wav": 1 for index in range(6)}
    assert tree_bytes(out) == tree_bytes(reference)
    assert not leftovers(tmp_path)


def _fifo(path: Path) -> str:
    os.mkfifo(path)
    return "a named pipe"


def _device(path: Path) -> str:
    try:  # a copy of /dev/null's node: needs CAP_MKNOD (root outside most containers)
        os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    except (PermissionError, OSError) as error:
        pytest.skip(f"cannot make a device node here ({error.strerror or error})")
    return "a device"


@pytest.mark.parametrize("make", [_fifo, _device], ids=["fifo", "device"])
def test_overwrite_never_replaces_a_pipe_or_device(tmp_path, tiny_checkpoint, make):
    """--overwrite replaces files only: a FIFO or a device node at the destination is left as it
    is (it used to be swapped for a regular file), with one line saying what it is."""
    target = tmp_path / "out.wav"
    kind = make(target)
    result = invoke("enhance", make_audio(tmp_path / "a.wav"), target, "--model",
                    tiny_checkpoint, "--overwrite")
    assert result.exit_code == 1
    assert f"{target}: is {kind}, not a file" in one_error_line(result.stderr)
    assert not stat.S_ISREG(os.lstat(target).st_mode) and not leftovers(tmp_path)


def test_a_dangling_link_at_the_destination_is_named_as_such(tmp_path, tiny_checkpoint):
    """Without --overwrite the line says what is there (it used to say "created by another
    process meanwhile"); with it, the link is replaced by the output."""
    target = tmp_path / "out.wav"
    target.symlink_to(tmp_path / "missing.wav")
    source = make_audio(tmp_path / "a.wav")
    result = invoke("enhance", source, target, "--model", tiny_checkpoint)
    assert result.exit_code == 1
    assert "is a symbolic link to a missing file" in one_error_line(result.stderr)
    assert target.is_symlink()
    result = invoke("enhance", source, target, "--model", tiny_checkpoint, "--overwrite")
    assert result.exit_code == 0, result.output
    assert not target.is_symlink() and sf.info(str(target)).frames == sf.info(str(source)).frames
    assert not leftovers(tmp_path)


@pytest.mark.parametrize("stem", ["a" * 250, "é" * 125, "語" * 83],
                         ids=["ascii", "2-byte", "3-byte"])
def test_an_output_name_at_the_length_limit_is_written(tmp_path, tiny_checkpoint, stem):
    """Names of 251-254 bytes (the limit is 255): the hidden temporary name, up to 32 bytes
    longer (its owner's pid and machine tag included), is cut to fit (it used to fail as
    "not writable (File name too long)")."""
    target = tmp_path / f"{stem}.wav"
    assert len(os.fsencode(target.name)) <= 255
    source = make_audio(tmp_path / "a.wav")
    result = invoke("enhance", source, target, "--model", tiny_checkpoint)
    assert result.exit_code == 0, result.output
    assert sf.info(str(target)).frames == sf.info(str(source)).frames
    assert not leftovers(tmp_path)


#: output suffix -> (input rate, exit code, text of the one error line; None: written)
OUTPUT_CONTAINERS = {
    "sd2": (8000, 2, "out.sd2: SD2 is not written (it keeps its header in a second file"),
    "raw": (8000, 0, None),
    "xi": (8000, 1, "a XI file cannot hold 1 channel(s) at 8000 Hz"),
    "wve-16kHz": (16000, 1, "a WVE file cannot hold 1 channel(s) at 16000 Hz"),
    "htk-48kHz": (48000, 1, "a HTK file cannot hold 1 channel(s) at 48000 Hz"),
}


@pytest.mark.parametrize("case", sorted(OUTPUT_CONTAINERS))
def test_every_output_container_is_written_whole_or_refused(tmp_path, tiny_checkpoint, case,
                                                           monkeypatch):
    """Containers that cannot hold the output as one file with the input's rate are refused in
    one line before anything is written: SD2 (a usage error listing what is written), XI
    (always 44.1 kHz), WVE (always 8 kHz), HTK (48 kHz read back as 48,076 Hz). RAW is written,
    headerless: exactly the input's frames as PCM_16. Nothing appears in the working folder
    (SD2's in-memory probe used to leave a `._` file there)."""
    rate, code, text = OUTPUT_CONTAINERS[case]
    monkeypatch.chdir(tmp_path)
    source = make_audio(tmp_path / "in" / "a.wav", frames=rate // 2, rate=rate)
    target = tmp_path / "out" / f"out.{case.split('-')[0]}"
    target.parent.mkdir()
    result = invoke("enhance", source, target, "--model", tiny_checkpoint)
    assert result.exit_code == code, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "out"]
    assert not leftovers(tmp_path)
    if text is not None:
        line = one_error_line(result.stderr)
        assert text in line, line
        if code == 2:
            written = line.partition("write one of ")[2].split(", ")
            assert {".wav", ".flac", ".raw"} <= set(written) and ".sd2" not in written, line
        assert list(target.parent.iterdir()) == []
        return
    assert [p.name for p in target.parent.iterdir()] == [target.name]
    frames = len(sf.read(str(source))[0])
    assert target.stat().st_size == 2 * frames
    written = sf.read(str(target), samplerate=rate, channels=1, subtype="PCM_16",
                      format="RAW")[0]
    assert len(written) == frames and abs(written).max() > 0


_SHORT_WRITES = textwrap.dedent("""
    # The copy to stdout, in a child process: a copy that fails points the process's stdout at
    # /dev/null (audio.detach_stdout), which in the test process would be the test runner's own
    # (its output capture broke, and every later test errored).
    import io, json, sys
    from pathlib import Path
    from speechlens_cli.audio import copy_to_stream
    from speechlens_cli.errors import OutputError

    class Trickle(io.RawIOBase):
        # Takes at most `most` bytes per write, as a nearly full disk or a busy pipe does for
        # stdout under PYTHONUNBUFFERED=1 (the count is in write's return value).
        def __init__(self, most):
            self.most, self.taken = most, bytearray()

        def writable(self):
            return True

        def write(self, data):
            piece = bytes(data[:self.most])
            self.taken += piece
            return len(piece)

    source, delivered, report = map(Path, sys.argv[1:4])
    trickle = Trickle(1000)
    copy_to_stream(source, trickle)
    delivered.write_bytes(bytes(trickle.taken))
    try:
        copy_to_stream(source, Trickle(0))
        error = None
    except OutputError as failure:
        error = str(failure)
    report.write_text(json.dumps({"error": error}))
""")


@cases(2)
def test_short_writes_to_stdout_deliver_every_byte_or_fail(tmp_path):
    """The audio copied to a stream that takes 1,000 bytes per call arrives whole (the copy
    used to drop the rest of each block and report success); a stream that takes nothing is a
    write failure (OutputError), never a success. In a child process: the failure detaches the
    process's stdout."""
    src = make_audio(tmp_path / "in.wav", 16_000)
    delivered, report = tmp_path / "delivered.bin", tmp_path / "report.json"
    done = subprocess.run([sys.executable, "-c", _SHORT_WRITES, str(src), str(delivered),
                           str(report)], capture_output=True, text=True, cwd=REPO, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert delivered.read_bytes() == src.read_bytes()
    error = json.loads(report.read_text())["error"]
    assert error is not None and re.search(r"<stdout>: write failed \(the stream accepted no",
                                           error), error


def test_json_report_to_a_full_device_finishes_the_batch(tmp_path, tiny_checkpoint):
    """`--json > /dev/full`: every file is still enhanced, then one line says the report was
    lost, exit 1 (it used to be a traceback after the first file, the rest not done)."""
    for name in ("a", "b", "c"):
        make_audio(tmp_path / "in" / f"{name}.wav", seed=ord(name))
    with open("/dev/full", "wb") as full:
        done = subprocess.run([sys.executable, "-c", CHILD, "enhance", str(tmp_path / "in"),
                               str(tmp_path / "out"), "--model", str(tiny_checkpoint), "--json",
                               "-q"], stdout=full, stderr=subprocess.PIPE, text=True, cwd=REPO,
                              timeout=300, check=False)
    assert done.returncode == 1, done.stderr
    assert "<stdout>: the --json report could not be written (No space left on device)" in \
        one_error_line(done.stderr)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["a.wav", "b.wav", "c.wav"]
    assert not leftovers(tmp_path)
