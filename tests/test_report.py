"""`speechlens enhance --report PATH` and `--score` (cli/before_after.py, speechlens_cli/report/):
each file's DNSMOS before and after in its --json line, a self-contained page per file (players
of an excerpt, spectrograms, the scores), a batch's summary worst first; every refusal one line
before any work. Needs the `report` extra, which `make` installs (else skipped, saying so)."""

from __future__ import annotations

import base64
import errno
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from speechlens_cli import report
from speechlens_cli.errors import AudioInputError
from speechlens_cli.report import excerpt
from tests.reliability import CHILD, REPO, invoke, leftovers, make_audio, one_error_line
from tests.test_score import needs_extra

pytestmark = needs_extra
SECONDS = 5.0   # the cheapest to score: DNSMOS repeats it to 10 s, one 9.01-s segment
RATE = 16000


def _enhance(tiny_checkpoint, *args):
    return invoke("enhance", *args, "--model", tiny_checkpoint, "--device", "cpu")


def _speech(path: Path, rate: int = RATE, **options) -> Path:
    return make_audio(path, int(SECONDS * rate), rate=rate, **options)


def _json_lines(result) -> list[dict]:
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines()]


def _sources(page: str) -> list[str]:
    return re.findall(r'\ssrc="([^"]*)"', page)


def test_one_file_gets_one_self_contained_page_and_its_scores(tmp_path, tiny_checkpoint, on_cpu):
    source = _speech(tmp_path / "in.wav")
    page = tmp_path / "report.html"
    result = _enhance(tiny_checkpoint, source, tmp_path / "out.wav", "--report", page, "--json")
    [line] = _json_lines(result)
    scores = line["scores"]
    assert list(scores) == ["input", "output", "change", "converted"]
    for key in report.KEYS:
        assert 1 <= scores["input"][key] <= 5 and 1 <= scores["output"][key] <= 5
        assert scores["change"][key] == pytest.approx(scores["output"][key] - scores["input"][key])
    assert line["report"] == str(page)
    assert f"{source}: DNSMOS SIG {scores['input']['sig']:.2f} -> " in result.stderr
    html = page.read_text()
    sources = _sources(html)
    assert [s.split(";")[0] for s in sources] == ["data:audio/mpeg"] * 3 + ["data:image/jpeg"]
    assert "http:" not in html and "https:" not in html and "href" not in html
    assert f"{scores['output']['ovrl']:.2f}" in html
    assert f"the whole file ({SECONDS:.1f} s)" in html
    assert not leftovers(tmp_path)


def test_a_batch_report_sums_up_with_the_worst_first(tmp_path, tiny_checkpoint, on_cpu):
    for seed in range(3):
        _speech(tmp_path / "in" / f"take{seed}.wav", seed=seed)
    folder = tmp_path / "report"
    lines = _json_lines(_enhance(tiny_checkpoint, tmp_path / "in", tmp_path / "out",
                                 "--report", folder, "--json"))
    summary = (folder / "index.html").read_text()
    worst_first = sorted(lines, key=lambda line: line["scores"]["change"]["ovrl"])
    links = re.findall(r'<a href="([^"]+)">([^<]+)</a>', summary)
    assert [name for _, name in links] == [line["input"] for line in worst_first]
    assert [folder / link for link, _ in links] == [Path(line["report"]) for line in worst_first]
    assert all((folder / link).is_file() for link, _ in links)
    assert [s.split(";")[0] for s in _sources(summary)] == ["data:image/png"]
    worse = sum(round(line["scores"]["change"]["ovrl"], 2) < 0 for line in lines)
    assert f"OVRL got worse for <strong>{worse}</strong> of 3 files" in summary


def test_score_alone_adds_the_scores_and_writes_no_page(tmp_path, tiny_checkpoint, on_cpu):
    source = _speech(tmp_path / "in.wav")
    [line] = _json_lines(_enhance(tiny_checkpoint, source, tmp_path / "out.wav", "--score",
                                  "--json"))
    assert set(line["scores"]) == {"input", "output", "change", "converted"}
    assert "report" not in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.wav", "out.wav"]


def test_a_long_file_is_heard_and_seen_in_part_and_scored_whole(tmp_path, tiny_checkpoint,
                                                                 on_cpu, monkeypatch):
    """The players and pictures hold the excerpt only (the page says so), at the file's rate."""
    monkeypatch.setattr(excerpt, "EXCERPT_SECONDS", 1.0)
    source = _speech(tmp_path / "in.wav", 24000, channels=2)
    page = tmp_path / "report.html"
    [line] = _json_lines(_enhance(tiny_checkpoint, source, tmp_path / "out.wav", "--report",
                                  page, "--json"))
    html = page.read_text()
    assert f"the first 1 s of {SECONDS:.1f} s, its 2 channels mixed to mono" in html
    assert line["scores"]["converted"] == "2 channels mixed to mono, resampled from 24000 Hz"
    for uri in _sources(html)[:3]:
        decoded, rate = sf.read(io.BytesIO(base64.b64decode(uri.split(",", 1)[1])))
        assert rate == 24000 and decoded.ndim == 1
        assert abs(len(decoded) / rate - 1.0) < 0.1   # MP3 pads up to a frame


@pytest.mark.parametrize("case, args, code, line", [
    ("a page for a batch", ("a.wav", "b.wav", "-o", "out", "--report", "r.html"), 2,
     "error: --report r.html: names one page, and this run enhances several files; give a "
     "folder (its index.html leads to each file's page)"),
    ("a folder for one input", ("a.wav", "out.wav", "--report", "pages"), 2,
     "error: --report pages: for one input the report is one page; give it a name ending in "
     ".html"),
    ("a missing folder", ("a.wav", "out.wav", "--report", "missing/r.html"), 1,
     "error: --report missing/r.html: its folder missing does not exist"),
    ("a batch's missing folder", ("a.wav", "b.wav", "-o", "out", "--report", "missing/r"), 1,
     "error: --report missing/r: its folder missing does not exist"),
    ("an existing page", ("a.wav", "out.wav", "--report", "old.html"), 1,
     "error: old.html: exists (--overwrite replaces the report)"),
    ("an input", ("in.html", "out.wav", "--report", "in.html"), 2,
     "error: --report in.html: is an input or output of this run; name another page or folder"),
    ("a stream", ("a.wav", "out.wav", "--report", "-"), 2,
     "error: --report -: a report is HTML pages, not a stream; name a page (report.html) or, "
     "for a batch, a folder"),
])
def test_a_report_that_cannot_be_is_one_line_before_any_work(tmp_path, tiny_checkpoint,
                                                             monkeypatch, case, args, code, line):
    monkeypatch.chdir(tmp_path)
    make_audio(tmp_path / "a.wav", 8000)
    make_audio(tmp_path / "b.wav", 8000)
    make_audio(tmp_path / "in.html", 8000)   # audio, whatever its name
    (tmp_path / "old.html").write_text("keep")
    before = sorted(p.name for p in tmp_path.iterdir())
    result = _enhance(tiny_checkpoint, *args)
    assert result.exit_code == code, result.output
    assert one_error_line(result.stderr) == line
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert (tmp_path / "old.html").read_text() == "keep"


def test_without_the_extra_a_report_is_one_line_naming_the_install(tmp_path, tiny_checkpoint,
                                                                    monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)   # import fails as for one not installed
    source = make_audio(tmp_path / "in.wav", 8000)
    result = _enhance(tiny_checkpoint, source, tmp_path / "out.wav", "--report",
                      tmp_path / "r.html")
    assert result.exit_code == 1
    assert one_error_line(result.stderr) == (
        "error: scoring needs matplotlib, which is not installed: pip install "
        "'speechlens[report]'")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.wav"]


def test_a_dry_run_says_what_the_report_would_be_and_writes_nothing(tmp_path, tiny_checkpoint):
    make_audio(tmp_path / "in" / "a.wav", 8000)
    result = _enhance(tiny_checkpoint, tmp_path / "in", tmp_path / "out", "--report",
                      tmp_path / "pages", "--dry-run")
    assert result.exit_code == 0, result.output
    assert (f"note: --report: would write each file's page into {tmp_path / 'pages'} and the "
            f"batch's summary {tmp_path / 'pages' / 'index.html'}") in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]


def test_an_interrupted_page_leaves_nothing_behind(tmp_path, monkeypatch):
    """The page is written under a temporary name and renamed: Ctrl-C midway leaves neither."""
    source = _speech(tmp_path / "in.wav")
    change = report.score_change(source, source, "in.wav", "in.wav")

    def interrupted(self, text, **_):
        Path.write_bytes(self, text[:100].encode())
        raise KeyboardInterrupt

    monkeypatch.setattr(Path, "write_text", interrupted)
    with pytest.raises(KeyboardInterrupt):
        report.write_file_page(tmp_path / "r.html", source, source, ("in.wav", "in.wav"), change)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.wav"]


def test_spectrograms_are_in_db_full_scale_on_a_log_frequency_axis():
    """A tone is one bright row at its frequency; the rows are evenly spaced in log frequency."""
    from speechlens_cli.report.pictures import power_db

    tone = np.sin(2 * np.pi * 1000 * np.arange(RATE) / RATE)
    _, hertz, decibels = power_db(tone, RATE)
    assert np.allclose(np.diff(np.log(hertz)), np.log(hertz[1] / hertz[0]))
    assert abs(hertz[decibels.mean(axis=1).argmax()] - 1000) < 40
    assert decibels.max() == pytest.approx(0.0, abs=1.5)   # a full-scale sine: 0 dB, less
    # what falls between two bins (a Hann window loses up to 1.4 dB there)


def test_a_file_whose_scoring_fails_fails_alone_its_output_kept(tmp_path, tiny_checkpoint,
                                                                 on_cpu, monkeypatch):
    for name in ("a", "b"):
        _speech(tmp_path / "in" / f"{name}.wav")
    scored = report.score_change

    def failing(source, destination, name, output_name):
        if Path(name).name == "a.wav":
            raise AudioInputError(f"{name}: cannot be scored")
        return scored(source, destination, name, output_name)

    monkeypatch.setattr(report, "score_change", failing)
    result = _enhance(tiny_checkpoint, tmp_path / "in", tmp_path / "out", "--report",
                      tmp_path / "report")
    assert result.exit_code == 3, result.output
    assert f"error: {tmp_path / 'in' / 'a.wav'}: cannot be scored" in result.stderr.splitlines()
    assert (tmp_path / "out" / "a.wav").is_file() and (tmp_path / "out" / "b.wav").is_file()
    summary = (tmp_path / "report" / "index.html").read_text()
    assert re.findall(r'<a href="[^"]+">([^<]+)</a>', summary) == [str(tmp_path / "in" / "b.wav")]
    assert "1 other file(s) of the batch were not enhanced in this run" in summary


def test_an_interrupted_batch_exits_130_leaving_whole_pages_only(tmp_path, tiny_checkpoint):
    """Ctrl-C once the first page is there: the pages written are whole, none is half-written,
    and no summary is made of a batch that did not finish."""
    for index in range(8):
        _speech(tmp_path / "in" / f"take{index}.wav", seed=index)
    folder = tmp_path / "report"
    process = subprocess.Popen(
        [sys.executable, "-c", CHILD, "enhance", str(tmp_path / "in"), str(tmp_path / "out"),
         "--model", str(tiny_checkpoint), "--report", str(folder), "-q"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    deadline = time.monotonic() + 120
    while not list(folder.glob("take*.html")):
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "no page appeared"
        time.sleep(0.01)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    assert stderr.rstrip().endswith("resume with --skip-existing"), stderr
    pages = sorted(folder.glob("*.html"))
    assert 1 <= len(pages) < 8 and not (folder / "index.html").exists()
    assert all(page.read_text().endswith("</body></html>\n") for page in pages)
    assert not leftovers(tmp_path)


def test_a_report_of_audio_on_stdout_says_so(tmp_path, tiny_checkpoint, on_cpu):
    source = _speech(tmp_path / "in.wav")
    result = _enhance(tiny_checkpoint, source, "-", "--report", tmp_path / "r.html")
    assert result.exit_code == 0, result.output
    assert result.stdout_bytes[:4] == b"RIFF"
    assert "Enhanced by speechlens into its standard output." in (tmp_path / "r.html").read_text()


def test_a_page_the_disk_cannot_take_fails_its_file_in_one_line(tmp_path, tiny_checkpoint,
                                                                 on_cpu, monkeypatch):
    source = _speech(tmp_path / "in.wav")

    def full(self, *_, **__):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Path, "write_text", full)
    result = _enhance(tiny_checkpoint, source, tmp_path / "out.wav", "--report",
                      tmp_path / "r.html")
    assert result.exit_code == 1
    assert one_error_line(result.stderr) == (
        f"error: {tmp_path / 'r.html'}: could not be written (No space left on device)")
    assert not (tmp_path / "r.html").exists() and not leftovers(tmp_path)
