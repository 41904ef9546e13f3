"""Strict output formats, `speechlens formats`, the help users read, and outputs beside the
inputs (--suffix)."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf

from speechlens_cli.audio import read_info
from tests.reliability import invoke, leftovers, one_error_line

RATE = 16000


@pytest.fixture
def float_wav(tmp_path):
    path = tmp_path / "in.wav"
    noise = np.random.default_rng(0).normal(0, 0.1, RATE).astype(np.float32)
    sf.write(path, noise, RATE, subtype="FLOAT")
    return path


@pytest.mark.parametrize("name", ["out.txt", "out"])
def test_an_output_name_nothing_writes_is_a_usage_error(tmp_path, float_wav, tiny_checkpoint,
                                                        name):
    result = invoke("enhance", float_wav, tmp_path / name, "--model", tiny_checkpoint)
    assert result.exit_code == 2
    line = one_error_line(result.stderr)
    assert "names no format speechlens writes; writable: " in line
    assert " .wav" in line and " .m4a" in line and " .mp4" in line
    assert not (tmp_path / name).exists() and not leftovers(tmp_path)


def test_float_into_flac_becomes_pcm24_and_says_so_once(tmp_path, float_wav, tiny_checkpoint):
    result = invoke("enhance", float_wav, tmp_path / "o.flac", "--model", tiny_checkpoint)
    assert result.exit_code == 0, result.output
    assert result.stderr.count("note: FLOAT cannot be written in a FLAC file: PCM_24 instead") \
        == 1
    assert read_info(tmp_path / "o.flac").subtype == "PCM_24"


def test_a_subtype_the_container_cannot_hold_lists_the_valid_ones(tmp_path, float_wav,
                                                                  tiny_checkpoint):
    result = invoke("enhance", float_wav, tmp_path / "o.m4a", "--model", tiny_checkpoint,
                    "--subtype", "OPUS")
    assert result.exit_code == 2
    assert one_error_line(result.stderr).endswith(
        "subtype OPUS cannot be written in a M4A file; valid here: ALAC, AAC")


def test_format_option_renames_the_outputs_of_a_folder(tmp_path, float_wav, tiny_checkpoint):
    result = invoke("enhance", tmp_path, tmp_path / "out", "--format", "flac",
                    "--model", tiny_checkpoint, "-q")
    assert result.exit_code == 0, result.output
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["in.flac"]
    assert read_info(tmp_path / "out" / "in.flac").format == "FLAC"


def test_formats_command_lists_what_is_written(tmp_path):
    result = invoke("formats")
    assert result.exit_code == 0
    rows = {line.split()[0]: line.split()[1:] for line in result.stdout.splitlines()
            if line.startswith(".")}
    assert rows[".flac"] == ["FLAC", "PCM_S8", "PCM_16", "PCM_24"]
    assert rows[".m4a"] == ["M4A", "ALAC", "AAC"]
    assert rows[".webm"] == ["WEBM", "OPUS"]


def test_bare_command_shows_help_and_succeeds():
    result = invoke()
    assert result.exit_code == 0
    assert result.stdout.startswith("Usage: ")  # the program name: CliRunner says "main"
    assert "Clean up recorded speech" in result.stdout
    summaries = result.stdout.split("Commands:")[1]
    assert "..." not in summaries
    assert "List the file formats speechlens reads and writes here, with their" in summaries


def test_enhance_help_has_examples_formats_and_exit_codes():
    text = invoke("enhance", "--help").stdout
    for part in ("Examples:", "speechlens enhance memo.m4a clean.m4a", "Formats:",
                 "Exit codes: 0 all done", "SOURCE DESTINATION | SOURCE... -o DIR"):
        assert part in text


def test_suffix_writes_beside_each_input(tmp_path, float_wav, tiny_checkpoint):
    second = tmp_path / "b.wav"
    second.write_bytes(float_wav.read_bytes())
    result = invoke("enhance", float_wav, second, "--suffix", "_clean", "--model",
                    tiny_checkpoint, "-q")
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.wav", "b_clean.wav", "in.wav",
                                                          "in_clean.wav"]
