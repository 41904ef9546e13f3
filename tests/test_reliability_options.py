"""Reliability, command-line options, names and environment values that used to raise a
traceback (docs/reliability.md)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from speechlens_cli import checkpoint
from speechlens_cli.api import plan_file
from speechlens_cli.errors import OutputError
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


