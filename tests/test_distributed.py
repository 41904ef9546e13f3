"""Scale-out (docs/scale-out.md): the duration-balanced plan, --shard, and real 2-process runs
under `mlx.launch --backend ring` on the CPU: every file once, outputs byte-identical to one
process, one merged report, the combined exit code on every rank, and a killed rank finished by
running the same command again with --skip-existing.

Audio is 8 kHz and short and the model is the tiny fixture checkpoint, so a launched run costs a
few seconds (two interpreters starting, mostly).
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from click.testing import CliRunner

from speechlens_cli import distributed
from speechlens_cli.cli import main
from speechlens_cli.synthetic.speech import noisy_speech

RATE = 8000
BIN = Path(sys.executable).parent
LAUNCH = BIN / "mlx.launch"
SPEECHLENS = BIN / "speechlens"
RANK_EXIT = re.compile(r"Node with rank (\d+) exited with code (-?\d+)")


def invoke(*args, **kwargs):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False, **kwargs)


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def make_audio(path: Path, seconds: float, channels: int = 1, seed: int = 0,
               subtype: str = "PCM_16", fmt: str = "WAV") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(str(path), noisy_speech(RATE, seconds, channels=channels, seed=seed), RATE,
             subtype=subtype, format=fmt)
    return path


def outputs(root: Path) -> dict[str, bytes]:
    """Every visible file under `root` (temporary outputs are hidden), by relative path."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.name.startswith(".")}


def partials(root: Path) -> list[Path]:
    return sorted(root.rglob(".*.partial"))


#: name -> seconds (None: a damaged .wav); plus a text file. Durations differ so the plan is
#: not trivially round-robin, and there are more files than ranks.
CORPUS = {"a.wav": 0.1, "b.wav": 0.05, "sub/c.flac": 0.09, "sub/d.wav": 0.07,
          "sub/deeper/e.wav": 0.12, "f.wav": 0.06, "sub/corrupt.wav": None}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("corpus") / "in"
    for seed, (name, seconds) in enumerate(CORPUS.items()):
        if seconds is None:
            (root / name).write_bytes(b"RIFF\x24\x00\x00\x00WAVEfmt damaged")
        elif name.endswith(".flac"):
            make_audio(root / name, seconds, channels=2, seed=seed, subtype="PCM_24", fmt="FLAC")
        else:
            make_audio(root / name, seconds, seed=seed)
    (root / "notes.txt").write_text("not audio\n")
    return root


@pytest.fixture(scope="module")
def reference(corpus, tiny_checkpoint, tmp_path_factory) -> tuple[Path, list[dict]]:
    """One process over the whole corpus: its outputs and its --json records."""
    out = tmp_path_factory.mktemp("reference") / "out"
    result = invoke("enhance", corpus, out, "--model", tiny_checkpoint, "--json")
    assert result.exit_code == 3, result.output  # the damaged file
    return out, json_lines(result.stdout)


def free_ports(count: int = 2) -> int:
    """A base port with `count` free ports after it (mlx.launch's ring uses one per rank)."""
    for _ in range(100):
        base = random.randint(20000, 60000)
        sockets = []
        try:
            for port in range(base, base + count):
                sock = socket.socket()
                sockets.append(sock)
                sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
    raise AssertionError("no free ports")


def launch(*args, cwd: Path, ranks: int = 2, command: list[str] | None = None
           ) -> subprocess.Popen:
    """`mlx.launch -n RANKS --backend ring -- speechlens enhance ARGS` on this machine."""
    command = command or [str(SPEECHLENS), "enhance", *map(str, args)]
    return subprocess.Popen(
        [str(LAUNCH), "-n", str(ranks), "--backend", "ring",
         "--starting-port", str(free_ports(ranks)), "--", *command],
        cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)


def finish(process: subprocess.Popen) -> tuple[str, str, dict[int, int]]:
    """stdout, stderr, and the exit code of every rank that mlx.launch reports (it logs only
    the non-zero ones, and itself exits 0 whatever they were)."""
    stdout, stderr = process.communicate(timeout=180)
    assert process.returncode == 0, stderr
    codes = {int(rank): int(code) for rank, code in RANK_EXIT.findall(stderr)}
    return stdout, stderr, codes


def rank_pid(launcher: subprocess.Popen, rank: int, timeout: float = 60) -> int:
    """The process mlx.launch started for `rank` (its child, with MLX_RANK in its environment)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for status in Path("/proc").glob("[0-9]*/status"):
            try:
                ppid = int(re.search(r"^PPid:\s*(\d+)", status.read_text(), re.MULTILINE)[1])
                if ppid != launcher.pid:
                    continue
                environ = (status.parent / "environ").read_bytes().split(b"\0")
            except (OSError, TypeError):
                continue
            if f"MLX_RANK={rank}".encode() in environ:
                return int(status.parent.name)
        time.sleep(0.01)
    raise AssertionError(f"mlx.launch started no rank {rank}")


# ------------------------------------------------------------------------------ the plan

def test_plan_balances_duration_within_the_largest_file():
    rng = np.random.default_rng(7)
    for case in range(300):
        count = int(rng.integers(0, 40))
        parts = int(rng.integers(1, 9))
        seconds = [float(s) for s in rng.exponential(30.0, count)]
        if case % 3 == 0:  # many equal durations: the tie-break decides
            seconds = [float(round(s / 20)) * 20 for s in seconds]
        keys = [f"f{i:03d}.wav" for i in range(count)]
        owner = distributed.assign(seconds, keys, parts)
        assert len(owner) == count and all(0 <= part < parts for part in owner)
        loads = [sum(s for s, o in zip(seconds, owner, strict=True) if o == part)
                 for part in range(parts)]
        assert max(loads) - min(loads) <= max(seconds, default=0.0) + 1e-9, (seconds, owner)
        # Every process computes the same plan whatever order it listed the files in.
        order = list(rng.permutation(count))
        shuffled = distributed.assign([seconds[i] for i in order], [keys[i] for i in order],
                                      parts)
        assert {keys[i]: part for i, part in zip(order, shuffled, strict=True)} == \
            dict(zip(keys, owner, strict=True))


def test_plan_is_largest_first_onto_the_least_loaded_ties_by_path():
    # 5 -> 0; 4 -> 1; 3 (a) -> 1 (4 < 5); 3 (b) -> 0; 2 -> 1 (7 < 8); 1 -> 0 (8 < 9)
    assert distributed.assign([3, 5, 1, 4, 3, 2], ["b", "x", "y", "w", "a", "z"], 2) == \
        [0, 0, 0, 1, 1, 1]
    # Equal durations and loads: path order, lower part first.
    assert distributed.assign([1.0] * 4, ["d", "c", "b", "a"], 2) == [1, 0, 1, 0]
    # More parts than files: the rest get nothing.
    assert distributed.assign([2.0, 1.0], ["a", "b"], 4) == [0, 1]
    with pytest.raises(ValueError):
        distributed.assign([1.0], ["a"], 0)


@pytest.mark.parametrize("env, expected", [
    ({}, None),
    ({"MLX_RANK": "1", "MLX_HOSTFILE": "HOSTFILE"}, "ring"),
    ({"MLX_RANK": "0", "MLX_HOSTFILE": "BLANK"}, None),   # mlx.launch -n 1
    ({"MLX_RANK": "0", "NCCL_HOST_IP": "10.0.0.1", "NCCL_PORT": "1", "MLX_WORLD_SIZE": "2"},
     "nccl"),
    ({"MLX_RANK": "0", "MLX_IBV_DEVICES": "x.json"}, "jaccl"),
    ({"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "3"}, "mpi"),
    ({"PMI_SIZE": "2", "PMI_RANK": "0"}, "mpi"),
    ({"OMPI_COMM_WORLD_SIZE": "1", "OMPI_COMM_WORLD_RANK": "0"}, None),
    # a launcher's variable without the rest of its set: left over, not a group
    ({"OMPI_COMM_WORLD_SIZE": "4"}, None),
    ({"PMI_SIZE": "4"}, None),
    ({"PMI_SIZE": "4", "PMI_RANK": "4"}, None),
    ({"MLX_RANK": "2", "MLX_HOSTFILE": "HOSTFILE"}, None),
    ({"MLX_RANK": "0", "MLX_HOSTFILE": "MISSING"}, None),
    ({"MLX_RANK": "x", "NCCL_HOST_IP": "10.0.0.1", "MLX_WORLD_SIZE": "2"},
     None),
])
def test_launcher_environment_names_the_backend(tmp_path, env, expected):
    (tmp_path / "hosts.json").write_text('[["127.0.0.1:5000"], ["127.0.0.1:5001"]]')
    (tmp_path / "blank.json").write_text("\n")
    paths = {"HOSTFILE": str(tmp_path / "hosts.json"), "BLANK": str(tmp_path / "blank.json"),
             "MISSING": str(tmp_path / "missing.json")}
    assert distributed.launched_backend({k: paths.get(v, v) for k, v in env.items()}) == expected


# ------------------------------------------------------------------------------ --shard

@pytest.mark.parametrize("value, fragment", [
    ("1", "expected I/N"), ("a/b", "expected I/N"), ("-1/2", "expected I/N"),
    ("1/2/3", "expected I/N"), ("2/2", "part 2 does not exist in 2 parts (0 to 1)"),
    ("0/0", "N must be at least 1"),
])
def test_bad_shard_is_a_usage_error(tmp_path, value, fragment):
    result = invoke("enhance", tmp_path, tmp_path / "out", "--shard", value)
    assert result.exit_code == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: Invalid value for '--shard'") and fragment in line, line


def test_shard_refuses_stdio_and_a_launcher(tmp_path):
    piped = invoke("enhance", "-", tmp_path / "o.wav", "--shard", "0/2", input=b"")
    assert piped.exit_code == 2 and "cannot be split across processes" in piped.stderr
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text('[["127.0.0.1:5000"], ["127.0.0.1:5001"]]')
    launched = invoke("enhance", tmp_path, tmp_path / "out", "--shard", "0/2",
                      env={"MLX_RANK": "0", "MLX_HOSTFILE": str(hostfile)})
    assert launched.exit_code == 2 and "do not also start it with mlx.launch" in launched.stderr


def test_shards_do_every_file_once_as_one_process_would(corpus, reference, tiny_checkpoint,
                                                        tmp_path):
    ref_out, ref_records = reference
    out = tmp_path / "out"
    done: dict[int, list[str]] = {}
    for index in range(2):
        result = invoke("enhance", corpus, out, "--model", tiny_checkpoint, "--json",
                        "--shard", f"{index}/2", "-v")
        records = json_lines(result.stdout)
        assert f"shard {index}/2: " in result.stderr
        failed = [r for r in records if r["status"] == "failed"]
        assert result.exit_code == (3 if failed else 0), result.output
        done[index] = [r["input"] for r in records if r["status"] in ("done", "failed")]
        # The non-audio file is listed once, by shard 0.
        assert any(r["status"] == "not-audio" for r in records) == (index == 0)
    audio = [r["input"] for r in ref_records if r["status"] != "not-audio"]
    assert sorted(done[0] + done[1]) == sorted(audio) and not set(done[0]) & set(done[1])
    seconds = [distributed.file_seconds(Path(name)) for name in audio]
    plan = distributed.assign(seconds, audio, 2)
    assert done == {part: [n for n, p in zip(audio, plan, strict=True) if p == part]
                    for part in range(2)}
    assert done[0] and done[1]
    assert outputs(out) == outputs(ref_out)


def test_a_one_process_launch_is_not_a_group(tmp_path, corpus):
    """`mlx.launch -n 1` hands its rank an empty hostfile: run alone, as without the launcher."""
    blank = tmp_path / "blank.json"
    blank.write_text("\n")
    result = invoke("enhance", corpus, tmp_path / "out", "--dry-run", "--json", "--model", "x",
                    env={"MLX_RANK": "0", "MLX_HOSTFILE": str(blank)})
    assert result.exit_code == 3, result.output  # the damaged file, as without the launcher
    records = json_lines(result.stdout)
    assert len(records) == len(CORPUS) + 1 and not any("rank" in r for r in records)


# ------------------------------------------------------------------------------ mlx.launch

def test_two_ranks_share_the_batch_and_rank_0_reports_it(corpus, reference, tiny_checkpoint,
                                                         tmp_path):
    ref_out, ref_records = reference
    out = tmp_path / "out"
    stdout, stderr, codes = finish(launch(corpus, out, "--model", tiny_checkpoint, "--json",
                                          cwd=tmp_path))
    # One merged report: rank 0 prints one record per file, in the order one process would.
    records = json_lines(stdout)
    assert [r["input"] for r in records] == [r["input"] for r in ref_records]
    assert [r["status"] for r in records] == [r["status"] for r in ref_records]
    assert len(stdout.splitlines()) == len(records)
    assert stderr.count("speechlens enhance") == 1  # the summary table's title
    assert stderr.count("error: 1 of 7 files failed (listed above)") == 1
    # The damaged file failed on one rank; every rank exits with the combined code.
    assert codes == {0: 3, 1: 3}, stderr
    # Each file was enhanced once, by the rank the plan gives it, and both ranks worked.
    audio = [r for r in records if r["status"] != "not-audio"]
    plan = distributed.assign([distributed.file_seconds(Path(r["input"])) for r in audio],
                              [r["input"] for r in audio], 2)
    assert [r["rank"] for r in audio] == plan and set(plan) == {0, 1}
    loads = [sum(r.get("seconds", 0) for r in audio if r["rank"] == rank) for rank in (0, 1)]
    assert abs(loads[0] - loads[1]) <= max(r.get("seconds", 0) for r in audio)
    assert "2 ranks (ring backend): rank 0 " in stderr
    # Byte-identical to one process, and nothing left behind.
    assert outputs(out) == outputs(ref_out)
    assert not partials(out)


def test_a_killed_rank_is_finished_by_running_again_with_skip_existing(tiny_checkpoint,
                                                                       tmp_path):
    # The plan: m.wav (1.0 s) -> rank 0; z.wav (0.6 s) -> rank 1; b.wav (0.3 s) -> rank 1,
    # which does b then z: rank 1 is killed once b is written, in the middle of z.
    src = tmp_path / "in"
    for seed, (name, seconds) in enumerate({"b.wav": 0.3, "m.wav": 1.0, "z.wav": 0.6}.items()):
        make_audio(src / name, seconds, seed=seed)
    assert distributed.assign([0.3, 1.0, 0.6], ["b", "m", "z"], 2) == [1, 0, 1]
    out = tmp_path / "out"
    args = (src, out, "--model", tiny_checkpoint, "--json")

    launcher = launch(*args, cwd=tmp_path)
    victim = rank_pid(launcher, 1)
    deadline = time.monotonic() + 120
    while not (out / "b.wav").exists():
        assert launcher.poll() is None, launcher.communicate()
        assert time.monotonic() < deadline, "rank 1 wrote nothing"
        time.sleep(0.01)
    os.kill(victim, signal.SIGKILL)
    _, stderr, codes = finish(launcher)
    assert codes.get(1) == -9, stderr
    # mlx.launch stopped rank 0 too (Ctrl-C-like: it removes its temporary output).
    assert codes.get(0) not in (None, 0), stderr
    finished = outputs(out)
    assert "b.wav" in finished and "z.wav" not in finished, sorted(finished)
    # Only a SIGKILLed process can leave its hidden temporary file behind.
    assert all(p.name.startswith(".z.wav.") for p in partials(out)), partials(out)
    stamps = {p: p.stat().st_mtime_ns for p in out.rglob("*.wav")}

    stdout, stderr, codes = finish(launch(*args, "--skip-existing", cwd=tmp_path))
    assert codes == {}, stderr  # every rank exited 0
    statuses = {Path(r["input"]).name: r["status"] for r in json_lines(stdout)}
    assert statuses == {name: "skipped" if name in finished else "done"
                        for name in ("b.wav", "m.wav", "z.wav")}
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps  # finished files untouched

    alone = tmp_path / "alone"
    assert invoke("enhance", src, alone, "--model", tiny_checkpoint, "-q").exit_code == 0
    assert outputs(out) == outputs(alone)


def test_a_rank_that_cannot_start_stops_the_batch_with_one_error(corpus, tmp_path):
    stdout, stderr, codes = finish(launch(corpus, tmp_path / "out", "--model",
                                          tmp_path / "no-such-model", cwd=tmp_path))
    assert codes == {0: 1, 1: 1}, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, stderr
    assert re.fullmatch(r"error: ranks 0, 1 of 2: .*no-such-model: no such checkpoint.* "
                        r"\(7 files not run; run the same command again with --skip-existing "
                        r"to finish\)", errors[0]), errors[0]
    assert stdout == "" and not (tmp_path / "out").exists()


def test_dry_run_in_a_group_prints_the_whole_plan_once(corpus, reference, tmp_path):
    _, ref_records = reference
    out = tmp_path / "out"
    stdout, stderr, codes = finish(launch(corpus, out, "--dry-run", "--model",
                                          tmp_path / "unused", cwd=tmp_path))
    assert [line.split(" -> ")[0] for line in stdout.splitlines()] == \
        [r["input"] for r in ref_records if r["status"] == "done"]
    assert codes == {0: 3, 1: 3}, stderr  # the damaged file
    assert not out.exists()


def test_ranks_that_see_different_inputs_refuse_to_start(tmp_path):
    """Each rank lists its own folder here (in_0, in_1): a plan over different lists would lose
    or repeat files, so every rank stops before any work."""
    make_audio(tmp_path / "in_0" / "a.wav", 0.05)
    make_audio(tmp_path / "in_1" / "a.wav", 0.05)
    make_audio(tmp_path / "in_1" / "b.wav", 0.05, seed=1)
    script = f'exec {SPEECHLENS} enhance "in_$MLX_RANK" out --model unused'
    stdout, stderr, codes = finish(launch(cwd=tmp_path, command=["bash", "-c", script]))
    assert codes == {0: 1, 1: 1}, (stdout, stderr)
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, (stdout, stderr)
    error = errors[0]
    assert error.startswith("error: the ranks see different inputs (rank 0: 1 files, 0.05 s; "
                            "rank 1: 2 files, 0.1 s)"), error
    assert not (tmp_path / "out").exists()


class _TwoViews:
    """A group of two ranks whose input lists differ (1 file on rank 0, 2 on rank 1)."""

    size = 2

    def __init__(self, rank: int):
        self.rank, self.met = rank, 0

    def all_gather_bytes(self, data: bytes, doing: str) -> list[bytes]:
        return [json.dumps({"digest": str(files), "files": files, "seconds": 0.05 * files})
                .encode() for files in (1, 2)]

    def barrier(self) -> None:
        self.met += 1


@pytest.mark.parametrize("rank", [0, 1])
def test_the_package_raises_and_the_cli_prints_and_exits(rank, monkeypatch, capsys):
    """distributed leaves the process alone: it raises GroupExit, and the CLI (cli/app.py, the
    one place errors become lines and codes) prints the line on rank 0 only, meets the others at
    the barrier, and only then exits with the group's code (as the launched runs above see)."""
    from speechlens_cli.cli import app
    from speechlens_cli.errors import GroupExit

    group = _TwoViews(rank)
    with pytest.raises(GroupExit) as raised:
        distributed.Share(rank, 2, group)._check_same_input(group, {})
    assert (raised.value.exit_code, group.met) == (1, 0)
    exits, handlers = [], {}
    monkeypatch.setattr(app.os, "_exit", lambda code: exits.append((code, group.met)))
    monkeypatch.setattr(app.signal, "signal", handlers.__setitem__)
    app._leave_group(raised.value)
    assert exits == [(1, 1)] and signal.SIGTERM in handlers
    said = capsys.readouterr().err
    if rank == 0:
        assert said.startswith("error: the ranks see different inputs (rank 0: 1 files, 0.05 s; "
                               "rank 1: 2 files, 0.1 s): every rank needs the same input "), said
    else:
        assert said == ""
