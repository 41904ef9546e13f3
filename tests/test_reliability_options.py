"""Reliability, command-line options, names and environment values that used to raise a
traceback (docs/reliability.md)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from speechlens_cli.api import plan_file
from speechlens_cli.errors import OutputError
from tests.reliability import (
    audit_outputs,
    cases,
    invoke,
    leftovers,
    make_audio,
    one_error_line,
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


