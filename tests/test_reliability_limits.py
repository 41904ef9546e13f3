"""Reliability: memory limits, launcher variables, settings from the environment
(docs/reliability.md)."""

from __future__ import annotations

import os
import resource
import sys
import time

import pytest

from speechlens_cli import kernels, pipeline
from speechlens_cli.errors import EnhancementError
from speechlens_cli.model.config import ModelConfig
from speechlens_cli.synthetic.checkpoints import TINY_CONFIG
from tests.reliability import (
    RATE,
    audit_outputs,
    invoke,
    leftovers,
    make_audio,
    one_error_line,
    run_child,
)

MIB, GIB = 1 << 20, 1 << 30


# ------------------------------------------------------------------------------ process limits

#: The process limits of `ulimit -v` and `ulimit -d` cannot be tried where CUDA's libraries
#: load: they map more address space (and data) than these limits at start-up.
needs_host_limits = pytest.mark.skipif(
    kernels.gpu_backend() == "cuda", reason="CUDA's libraries map more than these limits")


#: name -> (limit, bytes, seconds of audio at rate, --chunk-seconds, refused). An 8-s window at
#: 192 kHz needs about 2.9 GiB with the tiny model: less than most machines have available, so
#: only the process limit can refuse it (the tester's case, 30 s at 192 kHz under 3 GB, needs
#: 11 GiB, which a loaded machine refuses anyway).
PROCESS_LIMITS = {
    "ulimit-v-2GB-8s-window-at-192kHz": ("RLIMIT_AS", 2 * GIB, 8, 192000, 8, True),
    "ulimit-d-2GB-8s-window-at-192kHz": ("RLIMIT_DATA", 2 * GIB, 8, 192000, 8, True),
    "ulimit-v-2GB-5s-window-at-8kHz": ("RLIMIT_AS", 2 * GIB, 6, RATE, 5, False),
    "ulimit-d-2GB-5s-window-at-8kHz": ("RLIMIT_DATA", 2 * GIB, 6, RATE, 5, False),
}


@needs_host_limits
@pytest.mark.parametrize("name", sorted(PROCESS_LIMITS))
def test_a_window_beyond_the_process_limits_is_refused_before_mlx_allocates(
        tmp_path, tiny_checkpoint, name):
    """Under `ulimit -v` or `-d`, MLX's CPU backend does not fail an allocation past the limit:
    the process died of it (SIGSEGV, exit 139, the temporary output left behind). The room
    under both limits is now part of the memory budget: a window beyond it is one line before
    the model runs, and a window within it is enhanced."""
    limit, size, seconds, rate, chunk, refused = PROCESS_LIMITS[name]

    def limited() -> None:
        resource.setrlimit(getattr(resource, limit), (size, resource.RLIM_INFINITY))

    source = make_audio(tmp_path / "in.wav", frames=seconds * rate, rate=rate)
    result = run_child(["enhance", source, tmp_path / "out.wav", "--model", tiny_checkpoint,
                        "--device", "cpu", "--chunk-seconds", chunk], preexec=limited)
    if not refused:
        assert result.returncode == 0, result.stderr
        audit_outputs(tmp_path, {"out.wav": seconds * rate})
        return
    assert result.returncode == 1, result.stderr
    rate_note, line = result.stderr.strip().splitlines()   # 192 kHz is above the trained range
    assert rate_note.startswith("note: ") and f"{rate} Hz is above" in rate_note, rate_note
    line = one_error_line(line)
    need = pipeline.window_bytes(ModelConfig.from_dict(TINY_CONFIG), chunk * rate, rate)
    assert f"in.wav: a window of {chunk} s at {rate} Hz needs about {need / GIB:.1f} GiB " \
           "with this model" in line, line
    assert "use shorter windows (--chunk-seconds)" in line, line
    assert not (tmp_path / "out.wav").exists() and not leftovers(tmp_path)


# ------------------------------------------------------------------------------ containers

#: name -> (/proc/self/cgroup, {cgroup folder: (limit, usage, reclaimable page cache)}, the
#: room expected). v1 folders are under memory/; a limit of None is v2's "max".
CGROUPS = {
    "v1-nested": ("4:memory:/job/7\n1:cpu:/job/7\n",
                  {"memory/job/7": (512, 400, 100), "memory/job": (300, 250, 0)}, 50),
    "v1-container-seeing-its-own-as-the-root": ("4:memory:/docker/abc\n",
                                                {"memory": (256, 200, 0)}, 56),
    "v2-nested": ("0::/job/7\n", {"job/7": (512, 400, 100), "job": (None, 900, 0)}, 212),
}


@pytest.mark.parametrize("name", sorted(CGROUPS))
def test_a_container_limit_bounds_the_window(tmp_path, monkeypatch, name, on_cpu):
    """A cgroup v1 memory limit (Docker and Kubernetes on older hosts) was never read, nor a v2
    limit set below the mount's root (a systemd unit's MemoryMax): the process ran into the
    limit and was killed. Every level from the process's own cgroup up counts; page cache the
    kernel can drop (inactive files) does not count as used."""
    membership, folders, expected = CGROUPS[name]
    proc, cgroups = tmp_path / "proc", tmp_path / "cgroup"
    (proc / "self").mkdir(parents=True)
    (proc / "meminfo").write_text(f"MemTotal: {64 << 20} kB\nMemAvailable: {60 << 20} kB\n")
    (proc / "self" / "cgroup").write_text(membership)
    for folder, (limit, usage, inactive) in folders.items():
        where = cgroups / folder
        where.mkdir(parents=True, exist_ok=True)
        v1 = folder.startswith("memory")
        (where / ("memory.limit_in_bytes" if v1 else "memory.max")).write_text(
            "max\n" if limit is None else f"{limit * MIB}\n")
        (where / ("memory.usage_in_bytes" if v1 else "memory.current")).write_text(
            f"{usage * MIB}\n")
        (where / "memory.stat").write_text(
            f"cache 1\n{'total_' if v1 else ''}inactive_file {inactive * MIB}\n")
    monkeypatch.setattr(pipeline, "PROC", proc)
    monkeypatch.setattr(pipeline, "CGROUP_ROOT", cgroups)
    assert pipeline.available_bytes() == expected * MIB
    config = ModelConfig.from_dict(TINY_CONFIG)
    with pytest.raises(EnhancementError, match=f"and {expected} MiB is available"):
        pipeline.check_window_memory(config, 30 * RATE, RATE, "a.wav")


#: name -> (sysctl values, the memory expected available). kern.memorystatus_level is the
#: percentage of physical memory macOS counts as available (what `memory_pressure` reports).
MACOS = {
    "16GB-a-quarter-available": ({"hw.memsize": 16 * GIB, "kern.memorystatus_level": 25},
                                 4 * GIB),
    "sysctl-unreadable": ({}, None),
}


@pytest.mark.parametrize("name", sorted(MACOS))
def test_macos_memory_is_read_as_macos_reports_it(monkeypatch, name, on_cpu):
    """On a Mac there is no /proc, no cgroup and no SC_AVPHYS_PAGES: the memory check never ran.
    Now hw.memsize times kern.memorystatus_level (faked here: no macOS call runs on Linux)."""
    values, expected = MACOS[name]
    monkeypatch.setattr(sys, "platform", "darwin")
    monkeypatch.setattr(pipeline, "_sysctl", values.get)
    assert pipeline.available_bytes() == expected
    config = ModelConfig.from_dict(TINY_CONFIG)
    huge = 600 * RATE   # ten minutes in one window: about 9 GiB with the tiny model
    if expected is None:
        pipeline.check_window_memory(config, huge, RATE, "a.wav")   # nothing to compare with
        return
    with pytest.raises(EnhancementError, match="GiB with this model, and 4.0 GiB is available"):
        pipeline.check_window_memory(config, huge, RATE, "a.wav")


# ------------------------------------------------------------------------------ failures in MLX

#: name -> (what the model raised, whether shorter windows are the advice)
MODEL_FAILURES = {
    "mlx-malloc": (RuntimeError("[malloc] Unable to allocate 4294967296 bytes."), True),
    "metal-out-of-memory": (RuntimeError("[METAL] Command buffer execution failed: Insufficient "
                                         "Memory (00000008:kIOGPUCommandBufferCallbackErrorOut"
                                         "OfMemory)"), True),
    "memory-error": (MemoryError(), True),
    "value-error": (ValueError("invalid literal for int() with base 10: '²'"), False),
    "runtime-error": (RuntimeError("[conv] Invalid input shape"), False),
}


@pytest.mark.parametrize("name", sorted(MODEL_FAILURES))
def test_only_a_failed_allocation_suggests_shorter_windows(tmp_path, tiny_checkpoint,
                                                         monkeypatch, name):
    """Every failure in the model said "shorter windows (--chunk-seconds) need less memory":
    a bad SPEECHLENS_CPU_THREADS too. Now only a failed allocation does; any failure is one
    line, exit 1, nothing written."""
    from speechlens_cli.model.semamba import SEMamba

    error, about_memory = MODEL_FAILURES[name]

    def fail(*_args, **_kwargs):
        raise error
    monkeypatch.setattr(SEMamba, "enhance", fail)
    result = invoke("enhance", make_audio(tmp_path / "a.wav"), tmp_path / "out.wav",
                    "--model", tiny_checkpoint)
    assert result.exit_code == 1, result.output
    line = one_error_line(result.stderr)
    assert "a.wav: the model failed on 400 samples at 8000 Hz (" in line, line
    assert ("shorter windows (--chunk-seconds) need less memory" in line) == about_memory, line
    assert not (tmp_path / "out.wav").exists() and not leftovers(tmp_path)


# ------------------------------------------------------------------------------ launcher variables

def _two_hosts(tmp_path) -> str:
    """A valid ring hostfile, nobody at its ports."""
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text('[["127.0.0.1:47221"], ["127.0.0.1:47222"]]')
    return str(hostfile)


#: name -> (SPEECHLENS_JOIN_TIMEOUT_S, started by a launcher: MLX_RANK and a two-host hostfile)
JOIN_TIMEOUTS = {
    "nan": ("nan", True), "negative": ("-5", True), "inf": ("inf", True),
    "beyond-select": ("1e300", True), "arabic-indic-three": ("٣", True),
    "nan-alone": ("nan", False),
}


@pytest.mark.parametrize("name", sorted(JOIN_TIMEOUTS))
def test_a_join_timeout_that_is_not_seconds_is_a_usage_error(tmp_path, tiny_checkpoint, name):
    """nan, a negative or infinite number, or one past what select() takes killed the watcher,
    and the rank waited in mx.distributed.init forever; '٣' passed as 3 s. Now a number above
    0 and at most a day, in ASCII, checked before anything starts, even for a run alone."""
    value, launched = JOIN_TIMEOUTS[name]
    env = {"SPEECHLENS_JOIN_TIMEOUT_S": value}
    if launched:
        env.update(MLX_RANK="0", MLX_HOSTFILE=_two_hosts(tmp_path))
    started = time.monotonic()
    result = run_child(["enhance", make_audio(tmp_path / "a.wav"), tmp_path / "out.wav",
                        "--model", tiny_checkpoint], env=env, timeout=60)
    assert result.returncode == 2, result.stderr
    line = one_error_line(result.stderr)
    assert "SPEECHLENS_JOIN_TIMEOUT_S must be a number of seconds above 0 and at most 86400, " \
           f"got {value!r}" in line, line
    assert time.monotonic() - started < 30
    assert not (tmp_path / "out.wav").exists()


def _limit_data() -> None:
    """A reader that never stops (/dev/zero) fails at 4 GiB instead of taking the machine."""
    resource.setrlimit(resource.RLIMIT_DATA, (4 * GIB, resource.RLIM_INFINITY))


HOSTFILES = ["fifo", "dev-zero", "folder", "2MiB-file"]


@pytest.mark.parametrize("kind", HOSTFILES)
def test_a_hostfile_that_is_not_a_small_file_is_a_usage_error(tmp_path, tiny_checkpoint, kind):
    """MLX_HOSTFILE naming a FIFO waited for a writer forever, /dev/zero was read without end,
    a folder counted as a leftover. Now anything but a regular file of at most 1 MiB is one
    line naming the variable, found without a blocking open."""
    path = {"fifo": tmp_path / "hosts", "dev-zero": "/dev/zero", "folder": tmp_path,
            "2MiB-file": tmp_path / "hosts.json"}[kind]
    if kind == "fifo":
        os.mkfifo(path)
    if kind == "2MiB-file":
        path.write_text(" " * (2 * MIB) + '[["127.0.0.1:1"], ["127.0.0.1:2"]]')
    started = time.monotonic()
    result = run_child(["enhance", make_audio(tmp_path / "a.wav"), tmp_path / "out.wav",
                        "--model", tiny_checkpoint], timeout=60,
                       env={"MLX_RANK": "0", "MLX_HOSTFILE": str(path)},
                       preexec=None if kernels.gpu_backend() == "cuda" else _limit_data)
    assert result.returncode == 2, result.stderr
    line = one_error_line(result.stderr)
    assert f"error: MLX_HOSTFILE={path}: not a hostfile (mlx.launch writes a JSON list of " \
           "hosts, a regular file of at most 1 MiB); unset MLX_RANK and MLX_HOSTFILE" in line
    assert time.monotonic() - started < 30
    assert not (tmp_path / "out.wav").exists()


#: name -> launcher variables whose numbers are in other scripts ("HOSTFILE": two hosts)
OTHER_DIGITS = {
    "MLX_RANK-superscript-two": {"MLX_RANK": "²", "MLX_HOSTFILE": "HOSTFILE"},
    "OMPI-size-arabic-indic-four": {"OMPI_COMM_WORLD_SIZE": "٤", "OMPI_COMM_WORLD_RANK": "0"},
}


@pytest.mark.parametrize("name", sorted(OTHER_DIGITS))
def test_launcher_numbers_in_other_scripts_are_leftovers(tmp_path, tiny_checkpoint, name):
    """A launcher writes its ranks and sizes in ASCII. MLX_RANK='²' raised a ValueError
    traceback (str.isdigit takes it, int() does not); a size of '٤' made an MPI group of four.
    Such a value is not a launcher's set: the run goes ahead alone."""
    env = {key: _two_hosts(tmp_path) if value == "HOSTFILE" else value
           for key, value in OTHER_DIGITS[name].items()}
    result = invoke("enhance", make_audio(tmp_path / "a.wav"), tmp_path / "out.wav",
                    "--model", tiny_checkpoint, env=env)
    assert result.exit_code == 0, result.output
    audit_outputs(tmp_path, {"out.wav": 400})


# ------------------------------------------------------------------------------ CPU threads

@pytest.mark.parametrize("value", ["٣", "３", "²"])
def test_a_thread_count_in_other_digits_is_a_usage_error(tmp_path, tiny_checkpoint, monkeypatch,
                                                         value, on_cpu):
    """SPEECHLENS_CPU_THREADS of Arabic-Indic or fullwidth digits passed (int() reads them), a
    superscript two failed as "the model failed ... shorter windows need less memory" and
    `doctor` raised a traceback. Now ASCII digits only: one line naming the variable, exit 2;
    doctor says how to fix it."""
    monkeypatch.setenv("SPEECHLENS_CPU_THREADS", value)
    result = invoke("enhance", make_audio(tmp_path / "a.wav"), tmp_path / "out.wav",
                    "--model", tiny_checkpoint, "--device", "cpu")
    assert result.exit_code == 2, result.output
    line = one_error_line(result.stderr)
    assert f"SPEECHLENS_CPU_THREADS must be a whole number of threads (1 or more), got " \
           f"{value!r}" in line, line
    assert not (tmp_path / "out.wav").exists() and not leftovers(tmp_path)
    doctor = invoke("doctor", "--model", tiny_checkpoint)
    assert doctor.exit_code == 1, doctor.output
    assert ("fix: unset SPEECHLENS_CPU_THREADS or set it to a whole number of threads (1 or "
            "more)") in doctor.output
    assert "Traceback" not in doctor.output
