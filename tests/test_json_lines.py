"""`enhance --json`: each status's line, byte for byte, keys in their order (a script reading
the lines, or diffing two runs' lines, sees the same text from one version to the next).

Only `elapsed_seconds` (wall time) and the temporary folder are put in words before comparing.
"""

from __future__ import annotations

import json
import re

import pytest

from speechlens_cli import distributed
from speechlens_cli.results import FileResult
from tests.reliability import invoke, make_audio
from tests.test_score import needs_extra

RATE = 8000
ELAPSED = re.compile(r'"elapsed_seconds": [0-9.e+-]+')


def _lines(result, tmp_path) -> list[str]:
    assert result.exit_code in (0, 3), result.output
    text = ELAPSED.sub('"elapsed_seconds": T', result.stdout).replace(str(tmp_path), "TMP")
    return text.splitlines()


@pytest.fixture
def tree(tmp_path):
    """in/: two good files (mono PCM 16, stereo FLAC 24), a damaged .wav and a text file."""
    root = tmp_path / "in"
    make_audio(root / "a.wav", 400, seed=1)
    make_audio(root / "sub" / "b.flac", 450, channels=2, subtype="PCM_24", fmt="FLAC", seed=2)
    (root / "sub" / "corrupt.wav").write_bytes(b"RIFF\x24\x00\x00\x00WAVEfmt not really")
    (root / "notes.txt").write_text("not audio\n")
    return root


DONE_A = ('{"input": "TMP/in/a.wav", "output": "TMP/out/a.wav", "status": "done", '
          '"sample_rate": 8000, "channels": 1, "frames": 400, "seconds": 0.05, "format": "WAV", '
          '"subtype": "PCM_16", "windows": 1, "clamped": 0, "elapsed_seconds": T')
DONE_B = ('{"input": "TMP/in/sub/b.flac", "output": "TMP/out/sub/b.flac", "status": "done", '
          '"sample_rate": 8000, "channels": 2, "frames": 450, "seconds": 0.05625, '
          '"format": "FLAC", "subtype": "PCM_24", "windows": 1, "clamped": 0, '
          '"elapsed_seconds": T')
FAILED = ('{"input": "TMP/in/sub/corrupt.wav", "output": "TMP/out/sub/corrupt.wav", '
          '"status": "failed", "error": ERROR}')
NOT_AUDIO = ('{"input": "TMP/in/notes.txt", "output": null, "status": "not-audio", '
             '"reason": "not an audio file"}')


def _failed(lines: list[str]) -> str:
    """The damaged file's line, its error (the audio library's words) put in words."""
    (line,) = [line for line in lines if '"status": "failed"' in line]
    return re.sub(r'"error": "(?:[^"\\]|\\.)*"', '"error": ERROR', line)


def test_a_batch_s_lines_are_the_same_text_status_by_status(tmp_path, tree, tiny_checkpoint):
    out = tmp_path / "out"
    first = _lines(invoke("enhance", tree, out, "--model", tiny_checkpoint, "--json",
                          "--residual", "_removed"), tmp_path)
    assert [line for line in first if '"failed"' not in line] == [
        DONE_A + ', "residual": "TMP/out/a_removed.wav"}',
        DONE_B + ', "residual": "TMP/out/sub/b_removed.flac"}',
        NOT_AUDIO,
    ]
    assert _failed(first) == FAILED and len(first) == 4

    again = _lines(invoke("enhance", tree, out, "--model", tiny_checkpoint, "--json"), tmp_path)
    assert [line for line in again if '"failed"' not in line] == [
        '{"input": "TMP/in/a.wav", "output": "TMP/out/a.wav", "status": "skipped", '
        '"reason": "exists (--overwrite replaces it)"}',
        '{"input": "TMP/in/sub/b.flac", "output": "TMP/out/sub/b.flac", "status": "skipped", '
        '"reason": "exists (--overwrite replaces it)"}',
        NOT_AUDIO,
    ]
    kept = _lines(invoke("enhance", tree, out, "--model", tiny_checkpoint, "--json",
                         "--skip-existing"), tmp_path)
    assert kept[0] == ('{"input": "TMP/in/a.wav", "output": "TMP/out/a.wav", '
                       '"status": "skipped", "reason": "output exists"}')

    planned = _lines(invoke("enhance", tree, tmp_path / "plan", "--dry-run", "--json",
                            "--model", tiny_checkpoint), tmp_path)
    assert [line for line in planned if '"failed"' not in line] == [
        '{"input": "TMP/in/a.wav", "output": "TMP/plan/a.wav", "status": "planned", '
        '"sample_rate": 8000, "channels": 1, "frames": 400, "seconds": 0.05, "format": "WAV", '
        '"subtype": "PCM_16"}',
        '{"input": "TMP/in/sub/b.flac", "output": "TMP/plan/sub/b.flac", "status": "planned", '
        '"sample_rate": 8000, "channels": 2, "frames": 450, "seconds": 0.05625, '
        '"format": "FLAC", "subtype": "PCM_24"}',
        NOT_AUDIO,
    ]


def test_one_file_s_line_and_the_api_s_dict_are_the_same(tmp_path, tiny_checkpoint):
    from speechlens_cli import api

    source = make_audio(tmp_path / "in" / "a.wav", 400, seed=1)
    missing = invoke("enhance", source, tmp_path / "out" / "a.wav", "--model", tiny_checkpoint,
                     "--json")
    assert missing.exit_code == 1
    assert missing.stdout.replace(str(tmp_path), "TMP") == (
        '{"input": "TMP/in/a.wav", "output": "TMP/out/a.wav", "status": "failed", '
        '"error": "TMP/out: output folder does not exist"}\n')
    (tmp_path / "out").mkdir()
    (line,) = _lines(invoke("enhance", source, tmp_path / "out" / "a.wav", "--model",
                            tiny_checkpoint, "--json"), tmp_path)
    assert line == DONE_A + "}"
    record = api.enhance_file(source, tmp_path / "out" / "b.wav", model=tiny_checkpoint)
    text = ELAPSED.sub('"elapsed_seconds": T', json.dumps(record)).replace(str(tmp_path), "TMP")
    assert text == DONE_A.replace("out/a.wav", "out/b.wav") + "}"


class _Reporter:
    """What rank 0's report is given: each result's JSON line."""

    def __init__(self):
        self.lines: list[str] = []

    def record(self, result: FileResult) -> None:
        self.lines.append(json.dumps(result.as_dict()))

    def plan_line(self, result) -> None:
        pass

    def summary(self) -> None:
        pass

    def note(self, message: str, verbose: bool = False) -> None:
        pass


class _Group:
    backend = "test"


def test_a_group_s_lines_add_the_rank_last(tmp_path, tree, tiny_checkpoint):
    """Rank 0 reports every rank's results from their JSON form: the same lines, "rank" last."""
    out = tmp_path / "out"
    first = invoke("enhance", tree, out, "--model", tiny_checkpoint, "--json", "--residual",
                   "_removed").stdout.splitlines()
    planned = invoke("enhance", tree, tmp_path / "plan", "--dry-run", "--json", "--model",
                     tiny_checkpoint).stdout.splitlines()
    records = [json.loads(line) for line in first + planned]
    share = distributed.Share(0, 2, _Group())
    share.jobs_total = len(records)
    parts = [{"results": records[::2], "indices": list(range(0, len(records), 2)),
              "seconds": 0.0, "elapsed": 0.0},
             {"results": records[1::2], "indices": list(range(1, len(records), 2)),
              "seconds": 0.0, "elapsed": 0.0}]
    reporter = _Reporter()
    share._report(parts, reporter)
    assert reporter.lines == [line[:-1] + f', "rank": {i % 2}}}'
                              for i, line in enumerate(first + planned)]


@needs_extra
def test_scores_and_the_page_come_last_in_a_done_line(tmp_path, tiny_checkpoint, on_cpu):
    source = make_audio(tmp_path / "in.wav", 5 * 16000, rate=16000)
    result = invoke("enhance", source, tmp_path / "out.wav", "--model", tiny_checkpoint,
                    "--device", "cpu", "--json", "--report", tmp_path / "page.html",
                    "--residual", "_removed")
    assert result.exit_code == 0, result.output
    line = json.loads(result.stdout)
    assert list(line) == ["input", "output", "status", "sample_rate", "channels", "frames",
                          "seconds", "format", "subtype", "windows", "clamped",
                          "elapsed_seconds", "residual", "scores", "report"]
    assert list(line["scores"]) == ["input", "output", "change", "converted"]
    assert line["report"] == str(tmp_path / "page.html")
