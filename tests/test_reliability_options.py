"""Reliability, command-line options, names and environment values that used to raise a
traceback (docs/reliability.md)."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import numpy as np
import pytest

import speechlens_cli
from speechlens_cli import checkpoint
from speechlens_cli.api import plan_file
from speechlens_cli.errors import OutputError, UsageError
from speechlens_cli.synthetic.checkpoints import TINY_CONFIG, write_checkpoint
from tests.reliability import (
    audit_outputs,
    cases,
    invoke,
    leftovers,
    make_audio,
    one_error_line,
    run_child,
    tree_bytes,
)

#: A part of a name no Linux file system takes (NAME_MAX is 255 bytes).
TOO_LONG = "n" * 300


def _deep_folder(top: Path, length: int) -> Path:
    """Folders of 250-byte names below `top` until the path is `length` bytes or more."""
    folder = top
    while len(os.fsencode(folder)) < length - 251:
        folder = folder / ("d" * 250)
    rest = length - len(os.fsencode(folder)) - 1
    return folder / ("e" * rest) if rest > 0 else folder


# ------------------------------------------------------------------------------ class 11: names

#: case -> the command line (after `speechlens`), `{long}` standing for a name with a 300-byte
#: part, `{model}` for the tiny checkpoint, `{source}` for a readable input.
LONG_NAMES = {
    "input": ["enhance", "{long}.wav", "out.wav", "--model", "{model}"],
    "output": ["enhance", "{source}", "{long}.wav", "--model", "{model}"],
    "output-folder": ["enhance", "{source}", "-o", "{long}", "--model", "{model}"],
    "output-path-over-path-max": ["enhance", "{source}", "{deep}/out.wav", "--model", "{model}"],
    "model": ["enhance", "{source}", "out.wav", "--model", "{long}"],
    "models-verify": ["models", "verify", "{long}"],
    "models-path": ["models", "path", "./{long}/model.safetensors"],
}


@pytest.mark.parametrize("case", sorted(LONG_NAMES))
def test_a_name_longer_than_the_system_takes_is_one_line(tmp_path, tiny_checkpoint, case,
                                                         monkeypatch):
    """A name with a part over NAME_MAX, or a path over PATH_MAX (folders not made yet): exit 2
    and one line naming it; Python's own checks (Path.is_dir, exists) raised OSError before."""
    monkeypatch.chdir(tmp_path)
    source = make_audio(tmp_path / "a.wav")
    before = tree_bytes(tmp_path)
    deep = _deep_folder(tmp_path / "missing", 4200)
    args = [a.format(long=TOO_LONG, model=tiny_checkpoint, source=source, deep=deep)
            for a in LONG_NAMES[case]]
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    line = one_error_line(result.stderr)
    assert TOO_LONG in line or "4,096" in line or "4,095" in line, line
    assert tree_bytes(tmp_path) == before and not leftovers(tmp_path)


@cases(2)   # a folder past PATH_MAX in the input tree; an output past it in the mirror
def test_a_path_too_long_in_a_batch_stops_only_its_file(tmp_path, tiny_checkpoint):
    """A folder tree deeper than PATH_MAX: the scan skips what cannot be named, with the
    reason, and enhances the rest (the first such path aborted the batch with an OSError).
    An output mirrored past PATH_MAX is refused in its file's plan, a typed error that fails
    that file alone (it was an OSError, which ended the batch)."""
    tree = tmp_path / "in"
    source = make_audio(tree / "a.wav")
    handle = os.open(tree, os.O_RDONLY)
    for _ in range(20):   # 5,000 bytes of folders: each made relative to an open folder
        os.mkdir("d" * 250, dir_fd=handle)
        below = os.open("d" * 250, os.O_RDONLY, dir_fd=handle)
        os.close(handle)
        handle = below
    os.close(handle)
    result = invoke("enhance", tree, tmp_path / "out", "--model", tiny_checkpoint, "--json")
    assert result.exit_code == 0, result.output
    assert '"status": "skipped"' in result.stdout and "File name too long" in result.stdout
    audit_outputs(tmp_path / "out", {"a.wav": 400})

    mirrored = _deep_folder(tmp_path / "out2", 4200) / "a.wav"
    with pytest.raises(OutputError) as refused:
        plan_file(source, mirrored, create_folders=True, root=tmp_path / "out2")
    assert "bytes long; the system takes at most" in str(refused.value)
    assert not (tmp_path / "out2").exists()


# ------------------------------------------------------------------------------ class 12: --suffix

@pytest.mark.parametrize("suffix", ["/x", "/../../evil", "", "_a\0b"],
                         ids=["separator", "climbing-out", "empty", "nul"])
def test_a_suffix_that_is_not_part_of_a_name_is_a_usage_error(tmp_path, tiny_checkpoint,
                                                             suffix):
    """--suffix is part of a file name: a separator would write elsewhere (a ValueError
    traceback before), an empty one names the input itself. Exit 2, one line, nothing written."""
    source = make_audio(tmp_path / "a.wav")
    before = tree_bytes(tmp_path)
    result = invoke("enhance", source, "--suffix", suffix, "--model", tiny_checkpoint)
    assert result.exit_code == 2, result.output
    assert one_error_line(result.stderr).startswith("error: --suffix: ")
    assert tree_bytes(tmp_path) == before


# ------------------------------------------------------------------------------ class 13: streams

#: case -> (the file descriptor closed, the command line after `enhance`, the stream named)
CLOSED_STREAMS = {
    "stdin-as-input": (0, ["-", "{out}"], "<stdin>"),
    "stdout-as-output": (1, ["{source}", "-"], "<stdout>"),
    "stdout-for-json": (1, ["{source}", "{out}", "--json"], "<stdout>"),
}


@pytest.mark.parametrize("case", sorted(CLOSED_STREAMS))
def test_a_closed_standard_stream_is_refused_before_any_work(tmp_path, tiny_checkpoint, case):
    """`<&-` or `>&-` where '-' or --json needs the stream: exit 2, one line naming it, before
    the model runs (stdout's AttributeError came only after the model ran), nothing written."""
    closed, args, stream = CLOSED_STREAMS[case]
    source, out = make_audio(tmp_path / "a.wav"), tmp_path / "out.wav"
    args = [a.format(source=source, out=out) for a in args]
    result = run_child(["enhance", *args, "--model", tiny_checkpoint],
                       preexec=lambda: os.close(closed))
    assert result.returncode == 2, result.stderr
    assert one_error_line(result.stderr).startswith(f"error: {stream}: is closed")
    assert not out.exists() and not leftovers(tmp_path)


# ------------------------------------------------------------------------------ class 14: the cache

def _link_loop(path: Path) -> Path:
    """`path` and a sibling, each a symbolic link to the other."""
    path.parent.mkdir(parents=True, exist_ok=True)
    other = path.with_name(path.name + ".loop")
    os.symlink(other.name, path)
    os.symlink(path.name, other)
    return path


def _revision(cache: Path, repo: str, commit: str) -> Path:
    """The tiny checkpoint as `repo` at `commit` in the cache; returns the revision's folder."""
    return write_checkpoint(cache / f"models--{repo.replace('/', '--')}" / "snapshots" / commit,
                            TINY_CONFIG)


def _a_file(cache: Path) -> tuple[Path, Path]:
    cache.write_bytes(b"x")
    return cache, cache


def _weights_a_loop(cache: Path) -> tuple[Path, Path]:
    folder = _revision(cache, checkpoint.DEFAULT_REPO, checkpoint.PINNED_REVISION)
    (folder / checkpoint.WEIGHTS_FILE).unlink()
    return cache, _link_loop(folder / checkpoint.WEIGHTS_FILE)


#: case -> how HF_HUB_CACHE is broken, given a path for it -> (its value, the path the line names)
BROKEN_CACHES = {
    "a-file": _a_file,
    "dev-null": lambda cache: (Path(os.devnull), Path(os.devnull)),
    "a-link-loop": lambda cache: (_link_loop(cache), cache),
    "weights-a-link-loop": _weights_a_loop,
    "snapshots-a-link-loop": lambda cache: (
        cache, _link_loop(cache / "models--someone--else" / "snapshots")),
}


@pytest.mark.parametrize("case", sorted(BROKEN_CACHES))
def test_a_broken_cache_is_one_line_naming_what_cannot_be_read(tmp_path, monkeypatch, case):
    """`models list` where the Hugging Face cache is a file, /dev/null or a link loop, or holds
    an entry that cannot be read: exit 1, one line naming it (tracebacks before, or "no
    checkpoints" where the weights were there but unreadable); a readable checkpoint beside a
    broken one is still listed. `models path` says the same, never "not in the cache"."""
    value, named = BROKEN_CACHES[case](tmp_path / "hf-cache")
    monkeypatch.setenv("HF_HUB_CACHE", str(value))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv(checkpoint.MODEL_ENV, raising=False)
    readable = value.is_dir() and not value.is_symlink()
    if readable:
        good = _revision(value, "someone/model", "c" * 40)
    listed = invoke("models", "list")
    assert listed.exit_code == 1, listed.output
    assert one_error_line(listed.stderr).startswith(f"error: {named}: "), listed.stderr
    if readable:
        assert f"someone/model@{'c' * 12}" in listed.stdout and str(good) in listed.stdout
    located = invoke("models", "path")
    assert located.exit_code == 1, located.output
    line = one_error_line(located.stderr)
    assert "not in the Hugging Face cache" not in line or case == "snapshots-a-link-loop", line


# --------------------------------------------------------------------- class 15: HF_ENDPOINT

@pytest.mark.parametrize("endpoint", ["http://[::1", "http://localhost:99999", "localhost:8080"],
                         ids=["stray-bracket", "port-out-of-range", "no-scheme"])
def test_an_hf_endpoint_that_does_not_parse_is_a_usage_error(tmp_path, endpoint):
    """HF_ENDPOINT that is no http(s) URL: huggingface_hub raised from its own import (it
    parses the variable there) or from speechlens's reachability check. Now: exit 2, one line
    naming the variable, before any request and any output."""
    source = make_audio(tmp_path / "a.wav")
    environment = {"HF_ENDPOINT": endpoint, "HF_HUB_CACHE": str(tmp_path / "hf-cache"),
                   "HF_HUB_OFFLINE": "0", checkpoint.LICENSE_ENV: "1", checkpoint.MODEL_ENV: ""}
    for command in (["enhance", source, tmp_path / "out.wav"], ["models", "list"]):
        result = run_child(command, env=environment)
        assert result.returncode == 2, result.stderr
        assert one_error_line(result.stderr).startswith(f"error: HF_ENDPOINT: {endpoint!r}")
    assert not (tmp_path / "out.wav").exists() and not (tmp_path / "hf-cache").exists()


# ------------------------------------------------------------------------------ class 16: ~user

@pytest.mark.parametrize("command", [["enhance", "{source}", "{out}", "--model", "{model}"],
                                     ["models", "verify", "{model}"],
                                     ["models", "path", "{model}"]],
                         ids=["enhance", "models-verify", "models-path"])
def test_a_model_in_the_home_of_no_user_is_one_line(tmp_path, command):
    """`--model ~nosuchuser/x`: Path.expanduser raised RuntimeError. Now: exit 2, one line."""
    source, out = make_audio(tmp_path / "a.wav"), tmp_path / "out.wav"
    args = [a.format(source=source, out=out, model="~nosuchuser-speechlens/x") for a in command]
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert "there is no user 'nosuchuser-speechlens'" in one_error_line(result.stderr)
    assert not out.exists()


# ------------------------------------------------------------------------------ class 19: bench

#: case -> the bench options, the option the one line names, the exit code
BENCH_OPTIONS = {
    "profile-seconds-1e9": (["--profile", "--profile-seconds", "1e9"], "--profile-seconds", 2),
    "profile-seconds-nan": (["--profile", "--profile-seconds", "nan"], "--profile-seconds", 2),
    "profile-seconds-0": (["--profile", "--profile-seconds", "0"], "--profile-seconds", 2),
    "profile-rate-0": (["--profile", "--profile-rate", "0"], "--profile-rate", 2),
    "startup-seconds-inf": (["--startup", "--startup-seconds", "inf"], "--startup-seconds", 2),
    "startup-rate-100": (["--startup", "--startup-rate", "100"], "--startup-rate", 2),
    "overlap-nan": (["--overlap", "nan"], "--overlap", 2),
    "budget-nan": (["--budget-s", "nan"], "--budget-s", 2),
    "peer-device": (["--peer-device", "tpu"], "--peer-device", 2),
    "name-climbing-out": (["--name", "../escaped"], "--name", 2),
    "name-empty": (["--name", ""], "--name", 2),
    "out-below-a-file": (["--out", "{file}/reports"], "{file}", 1),
}


@pytest.mark.parametrize("case", sorted(BENCH_OPTIONS))
def test_bench_options_are_checked_before_any_work(tmp_path, tiny_checkpoint, case):
    """Every `speechlens bench` option is checked before a model loads or a report is
    written: one line naming it (tracebacks before, a 1e9-s profile asked for terabytes, and
    `--name ../x` wrote its reports outside --out). No case matches `--cases none`, so the
    old code stopped on that instead: the line must name the option under test."""
    options, named, code = BENCH_OPTIONS[case]
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"x")
    options = [o.format(file=blocker) for o in options]
    out = ["--out", tmp_path / "reports"] if "--out" not in options else []
    result = invoke("bench", "--model", tiny_checkpoint, "--device", "cpu", "--cases", "none",
                    *out, *options)
    assert result.exit_code == code, result.output
    assert named.format(file=blocker) in one_error_line(result.stderr)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


# ------------------------------------------------------------------------------ class 20: --track,
# --format, the Python API

@cases(2)
def test_track_on_a_file_without_tracks_is_a_usage_error(tmp_path, tiny_checkpoint,
                                                         media_files):
    """--track on a WAV was ignored (exit 0). Now one line naming the file, exit 2, nothing
    written; in a batch that file alone fails (exit 3) and the media file gets its track."""
    source = make_audio(tmp_path / "a.wav")
    result = invoke("enhance", source, tmp_path / "out.wav", "--track", "0", "--model",
                    tiny_checkpoint)
    assert result.exit_code == 2, result.output
    line = one_error_line(result.stderr)
    assert line.startswith(f"error: {source}: ") and "--track" in line, line
    assert not (tmp_path / "out.wav").exists()

    batch = invoke("enhance", source, media_files["m4a"], "-o", tmp_path / "out", "--track", "0",
                   "--model", tiny_checkpoint)
    assert batch.exit_code == 3, batch.output
    assert f"error: {source}: is a WAV file, not a media container" in batch.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["memo.m4a"]


def test_format_sd2_in_a_batch_is_one_usage_error(tmp_path, tiny_checkpoint):
    """--format sd2 (a container never written) was refused file by file (exit 3); it is one
    usage error before the batch starts, as for a single file."""
    sources = [make_audio(tmp_path / name) for name in ("a.wav", "b.wav")]
    result = invoke("enhance", *sources, "-o", tmp_path / "out", "--format", "sd2", "--model",
                    tiny_checkpoint)
    assert result.exit_code == 2, result.output
    assert one_error_line(result.stderr).startswith("error: --format sd2 names no format")
    assert not (tmp_path / "out").exists()


#: case -> (API function, its arguments beyond the model, the argument the error names)
API_ARGUMENTS = {
    "complex-audio": ("enhance", {"audio": np.ones(800, np.complex64)}, "audio"),
    "timedelta-audio": ("enhance", {"audio": np.ones(800, "m8[ms]")}, "audio"),
    "ragged-audio": ("enhance", {"audio": [[0.1, 0.2], [0.3]]}, "audio"),
    "atten-as-text": ("enhance", {"atten_lim_db": "12"}, "atten_lim_db"),
    "strict-as-text": ("enhance", {"strict": "no"}, "strict"),
    "chunk-as-text": ("enhance_file", {"chunk_seconds": "10"}, "chunk_seconds"),
    "overlap-none": ("enhance_file", {"overlap": None}, "overlap"),
    "source-none": ("enhance_file", {"source": None}, "source"),
    "destination-a-number": ("enhance_file", {"destination": 5}, "destination"),
    "subtype-a-number": ("enhance_file", {"subtype": 16}, "subtype"),
    "progress-not-callable": ("enhance_file", {"progress": 5}, "progress"),
}


@pytest.mark.parametrize("case", sorted(API_ARGUMENTS))
def test_the_python_api_refuses_a_wrong_argument_with_a_usage_error(tmp_path, tiny_checkpoint,
                                                                    case):
    """api.enhance / enhance_file with an argument of the wrong kind: a UsageError naming it
    (raw TypeError or AttributeError before), and complex or timedelta samples refused (they
    were enhanced: a complex array lost its imaginary part with only a warning)."""
    function, changed, named = API_ARGUMENTS[case]
    source = make_audio(tmp_path / "a.wav")
    arguments = ({"audio": np.zeros(800, np.float32) + 0.1, "sample_rate": 8000}
                 if function == "enhance" else
                 {"source": source, "destination": tmp_path / "out.wav"})
    with pytest.raises(UsageError) as refused:
        getattr(speechlens_cli, function)(**{**arguments, **changed}, model=tiny_checkpoint)
    assert str(refused.value).startswith(named), refused.value
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.wav"]


@pytest.mark.parametrize(("changed", "named"), [
    ({"strict": 1}, "strict must be True or False"),
    ({"chunk_seconds": "10"}, "chunk_seconds must be"),
    ({"overlap": 0.9}, "overlap 0.9 is outside"),
    ({"chunk_seconds": 0.01}, "chunk length 0.01 s is outside"),
    ({"atten_lim_db": -3.0}, "attenuation limit -3 dB"),
    ({"bit_rate": 3000}, "bit_rate 3000: give bits per second"),
    ({"track": -1}, "track must be"),
    ({"track": True}, "track must be"),
])
def test_enhance_options_are_checked_when_made(changed, named):
    """api.EnhanceOptions, which run_plan, run_plans, plan_file and the CLI take: keyword-only,
    frozen, and a wrong value is a UsageError naming it, as enhance_file's keywords are."""
    from dataclasses import FrozenInstanceError

    from speechlens_cli import api

    with pytest.raises(UsageError) as refused:
        api.EnhanceOptions(**changed)
    assert str(refused.value).startswith(named), refused.value
    with pytest.raises(TypeError):
        api.EnhanceOptions(True)   # keywords only
    with pytest.raises(FrozenInstanceError):
        api.EnhanceOptions().strict = True


# ------------------------------------------------------------------------------ build item 3: fsync

@pytest.mark.parametrize("overwrite", [False, True], ids=["linked", "renamed"])
def test_an_output_reaches_the_disk_before_its_name_and_its_folder_after(
        tmp_path, tiny_checkpoint, monkeypatch, overwrite):
    """The published file is fsynced before it gets its name (hard link, or rename under
    --overwrite), and its folder after: a power cut then never leaves the name on lost data.
    Each fsync is recorded with the inode it flushed and whether the output existed then."""
    real_fsync = os.fsync
    synced = []

    def recording(descriptor):
        status = os.fstat(descriptor)
        synced.append((status.st_ino, stat.S_ISDIR(status.st_mode),
                       (tmp_path / "out.wav").exists()))
        real_fsync(descriptor)
    monkeypatch.setattr(os, "fsync", recording)
    source = make_audio(tmp_path / "a.wav")
    if overwrite:
        (tmp_path / "out.wav").write_bytes(b"old")
    result = invoke("enhance", source, tmp_path / "out.wav", "--model", tiny_checkpoint,
                    *(["--overwrite"] if overwrite else []))
    assert result.exit_code == 0, result.output
    output, folder = (tmp_path / "out.wav").stat().st_ino, tmp_path.stat().st_ino
    file_at = synced.index((output, False, overwrite))   # before its name was the output's
    folder_at = synced.index((folder, True, True))
    assert file_at < folder_at, synced
    audit_outputs(tmp_path, {"out.wav": 400})


@pytest.mark.parametrize("fault", ["folder-EINVAL", "file-EIO"])
def test_a_refused_fsync(tmp_path, tiny_checkpoint, monkeypatch, fault):
    """A file system that cannot fsync a folder (EINVAL) still gets its output; a file whose
    fsync fails (EIO: the data did not reach the disk) is one line, exit 1, and nothing of it
    is left, neither the name nor the temporary."""
    real_fsync, folders = os.fsync, []

    def failing(descriptor):
        folder = stat.S_ISDIR(os.fstat(descriptor).st_mode)
        folders.append(folder)
        if fault == "folder-EINVAL" and folder:
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        if fault == "file-EIO" and not folder:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real_fsync(descriptor)
    monkeypatch.setattr(os, "fsync", failing)
    source = make_audio(tmp_path / "a.wav")
    result = invoke("enhance", source, tmp_path / "out.wav", "--model", tiny_checkpoint)
    if fault == "folder-EINVAL":
        assert result.exit_code == 0 and any(folders), result.output
        audit_outputs(tmp_path, {"out.wav": 400})
        return
    assert result.exit_code == 1, result.output
    assert "could not be written (Input/output error)" in one_error_line(result.stderr)
    assert not (tmp_path / "out.wav").exists() and not leftovers(tmp_path)
