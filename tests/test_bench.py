"""`speechlens bench` smoke tests on the tiny checkpoint (keeps `make bench` from rotting), the
case matrix, the target evaluation and the component profiler's walk of the model."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from click.testing import CliRunner

from speechlens_cli import checkpoint, kernels
from speechlens_cli.bench import cases as matrix
from speechlens_cli.bench import report as rep
from speechlens_cli.bench import runner
from speechlens_cli.bench.profiling import run_profile
from speechlens_cli.cli import main
from speechlens_cli.kernels import cuda_projection
from speechlens_cli.model import scheduling
from speechlens_cli.synthetic.speech import noisy_speech


def test_bench_command_runs_and_writes_reports(tiny_checkpoint, tmp_path, on_cpu):
    result = CliRunner().invoke(main, [
        "bench", "--model", str(tiny_checkpoint), "--cases", "5s-16k-w5-*", "--warmup", "0",
        "--trials", "1", "--no-peer", "--device", "cpu", "--out", str(tmp_path),
        "--name", "smoke"])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "smoke.json").read_text())
    # each case, then the same on every other CPU library build this CPU runs (an AVX-512 CPU
    # also times the AVX2 build), as the bench's own rule says
    builds = [""] + [f"-{choice}" for choice, _ in runner.other_cpu_builds()]
    assert [r["case"] for r in report["cases"]] == [
        f"5s-16k-w5-{mode}{build}" for mode in ("standard", "strict") for build in builds]
    for row in report["cases"]:
        assert "error" not in row
        assert row["trials"] == len(row["times_s"]) == 1 and row["windows"] == 1
        assert row["median_s"] > 0 and row["rtf_median"] == pytest.approx(row["median_s"] / 5.0)
        assert row["mlx_peak_bytes"] > 0 and row["rss_peak_bytes"] > 0
    env = report["environment"]
    for key in ("cpu", "os", "python", "mlx", "mlx backend", "blas", "heap"):
        assert env[key]
    assert report["architecture"]["hid_feature"] == 16
    # targets are about the full-size model only
    assert report["targets"][0]["met"] == "n/a"
    markdown = (tmp_path / "smoke.md").read_text()
    assert "| 5s-16k-w5-strict | 5 s | 16000 | 5 s | strict | 1 | 0 + 1 |" in markdown


class _Library:
    """A CPU library whose best build is `best` (2 AVX-512, 1 AVX2, 0 generic)."""

    def __init__(self, best: int):
        self.best = best

    def isa(self, requested: int = -1) -> int:
        return self.best if requested < 0 or requested > self.best else requested

    def isa_name(self, requested: int = -1) -> str:
        return {0: "generic", 1: "AVX2", 2: "AVX-512"}[self.isa(requested)]


@pytest.mark.parametrize("best,chosen,builds", [
    (2, "", [("avx2", "AVX2")]),  # an AVX-512 CPU: the AVX2 build's numbers too
    (1, "", []),  # AVX2 is the best here: one build
    (0, "", []),
    (2, "avx512", []),  # the user chose a build
])
def test_the_bench_times_both_builds_where_the_cpu_has_both(best, chosen, builds, monkeypatch):
    monkeypatch.setattr(kernels, "backend", lambda: "cpu")
    monkeypatch.setattr(kernels, "cpu_library", lambda: _Library(best))
    monkeypatch.setenv(kernels.CPU_ISA_ENV, chosen)
    assert runner.other_cpu_builds() == builds


def test_a_case_on_another_build_is_named_and_run_on_it(tiny_checkpoint, tmp_path, monkeypatch):
    """The extra rows: the case's name with the build's suffix, a note naming the build, and
    the kernels run on it while (and only while) its trials run."""
    model = checkpoint.load_model(str(tiny_checkpoint), download=False)
    case = next(c for c in matrix.all_cases() if c.name == "5s-16k-w5-standard")
    src = tmp_path / "in.wav"
    sf.write(str(src), noisy_speech(16000, 5.0), 16000, subtype="FLOAT")
    seen = []
    real = kernels.cpu_isa
    monkeypatch.setattr(runner.api, "enhance_channels",
                        lambda *a, **k: (seen.append(real()), a[1])[1])
    monkeypatch.delenv(kernels.CPU_ISA_ENV, raising=False)
    options = runner.Options(cases=[case], peer_patterns=None, warmup=0, trials=1)
    row = runner._run_case(case, model, src, tmp_path, options, False, lambda line: None,
                           ("generic", "generic (4 lanes)"))
    assert row["case"] == "5s-16k-w5-standard-generic" and "error" not in row
    assert "generic (4 lanes) build" in row["note"] and seen == [0]
    assert kernels.CPU_ISA_ENV not in os.environ


def test_bench_rejects_patterns_matching_nothing(tiny_checkpoint, tmp_path):
    result = CliRunner().invoke(main, ["bench", "--model", str(tiny_checkpoint), "--cases",
                                       "nope-*", "--out", str(tmp_path)])
    assert result.exit_code != 0 and "matches no case" in result.output


def test_case_matrix_and_selection():
    names = [c.name for c in matrix.all_cases()]
    assert len(names) == len(set(names))
    # 5-s files: one window whatever the window length, so only w5; long files: both windows
    assert "5s-44.1k-w5-strict" in names and "5s-44.1k-w30-strict" not in names
    assert {"120s-16k-w5-standard", "120s-44.1k-w30-strict", "30s-48k-w30-standard"} <= set(names)
    assert [c.name for c in matrix.select("5s-48k-*")] == ["5s-48k-w5-standard",
                                                            "5s-48k-w5-strict"]
    assert len(matrix.select("all")) == len(names)
    long_gpu = matrix.default_repeats(matrix.select("120s-16k-w5-strict")[0], gpu=True)
    short_gpu = matrix.default_repeats(matrix.select("5s-16k-w5-strict")[0], gpu=True)
    assert (short_gpu.warmup, short_gpu.trials) == (5, 20) and long_gpu.trials < 20


def _fake_report(backend: str, cases: list[dict], peer: list[dict]) -> dict:
    return {"environment": {"mlx backend": backend}, "architecture": dict(rep.FULL_SIZE),
            "cases": cases, "peer": peer}


def _case(name: str, median: float, rate: int = 44100, seconds: float = 5.0,
          window: float = 5.0, peak: int = 0) -> dict:
    return {"case": name, "median_s": median, "times_s": [median], "rtf_median": median / seconds,
            "rate": rate,
            "seconds": seconds, "window_s": window, "mlx_peak_bytes": peak,
            "rss_peak_bytes": peak}


def test_targets_are_judged_against_the_issue_thresholds():
    nvidia = f"{rep.NVIDIA_DEFAULTS}"
    gpu = rep.targets(_fake_report("cuda", [
        _case("5s-44.1k-w5-standard", 0.2, peak=2 * 2**30),
        _case("5s-44.1k-w5-strict", 0.25),
        _case("30s-48k-w30-standard", 1.0, 48000, 30.0, 30.0, peak=int(3.5e9)),
    ], [{"group": "5s-44.1k-w5", "median_s": 0.45, "times_s": [0.45], "peer": nvidia,
         "torch_peak_bytes": 3 * 2**30}]))
    verdicts = {t["target"].split(" (")[0]: t["met"] for t in gpu}
    assert verdicts["5 s at 44.1 kHz end to end <= 0.12 s"] == "NO"
    by_target = {t["target"]: t["met"] for t in gpu}
    standard = ">= 2x faster than the NVIDIA stack (torch defaults) (5s-44.1k-w5, standard)"
    strict = ">= 1.7x faster than the NVIDIA stack (torch defaults) (5s-44.1k-w5, strict)"
    assert by_target[standard] == "yes" and by_target[strict] == "yes"   # 2.25x, 1.8x
    assert by_target["peak memory <= the NVIDIA stack's (torch defaults) (5s-44.1k-w5, "
                     "standard)"] == "yes"                                # 2 vs 3 GiB
    assert verdicts["peak memory <= 4 GB at 30-s windows, 48 kHz"] == "yes"  # 3.5 GB
    cpu = rep.targets(_fake_report("cpu", [_case("5s-16k-w5-standard", 15.0, 16000)],
                                   [{"group": "5s-16k-w5", "median_s": 30.0, "times_s": [30.0]}]))
    verdicts = {t["target"].split(" (")[0]: t["met"] for t in cpu}
    assert verdicts[">= 3x faster than the plain-loop PyTorch peer on this CPU"] == "NO"  # 2x
    assert verdicts["RTF <= 5 at 5 s, 16 kHz"] == "yes"                                 # RTF 3
    assert verdicts["RTF <= 15 at 5 s, 44.1 kHz"] == "not run"
    assert verdicts["peak memory <= 24 GB at 30-s windows, 48 kHz"] == "not run"


def test_profile_times_every_component_and_restores_the_model(tiny_checkpoint):
    model = checkpoint.load_model(tiny_checkpoint)
    classes = {path: type(m) for path, m in model.named_modules()}
    audio = noisy_speech(16000, 0.5, seed=1).astype(np.float32)
    result = run_profile(model, audio, 16000, runs=1, log=lambda _line: None)
    # the profiled run is the model's own run: same result up to float32 rounding
    assert result["profiled_vs_plain_max_abs"] <= 1e-5 * result["output_max_abs"]
    assert {path: type(m) for path, m in model.named_modules()} == classes
    calls = {r["component"]: r["calls"] for r in result["components"]}
    blocks, width = model.config.num_tfmamba, model.config.hid_feature
    scans = [name for name in calls if name.startswith("Mamba selective scan kernel")]
    convs = [name for name in calls if name.startswith("Mamba causal conv1d kernel")]
    assert len(scans) == 1 and calls[scans[0]] == 2 * blocks
    if kernels.backend() == "cuda" and cuda_projection.project_conv_enabled():
        assert not convs  # inside the in_proj's kernel
    else:
        assert len(convs) == 1 and calls[convs[0]] == 2 * blocks
    # both directions per call: two BiMambas per TF block, one in_proj / merge each
    inner = model.config.d_inner
    assert calls[f"Mamba in_proj, both directions (x2; on CUDA the conv + SiLU too) "
                 f"({width}->{2 * inner})"] == 2 * blocks
    assert calls[f"BiMamba merge: out_projs folded into output_proj, then LayerNorm, + residual "
                 f"({2 * inner}->{width})"] == 2 * blocks
    assert not any("LayerNorm" in name and "merge" not in name for name in calls)  # in the merge
    assert calls["STFT (frames, rfft, log1p |X|, atan2)"] == 1
    # one call per dense layer where the conv reads its planes directly (the CPU library),
    # else one per time tile of each of the four layers (scheduling.time_tiles)
    params = model.config.stft_params(16000)
    frames, bins = 1 + len(audio) // params.hop + 2, params.n_bins + 2  # + the 2-sample pad
    tiles = sum(len(scheduling.time_tiles(frames, bins, width * (i + 1), 3))
                for i in range(4))
    direct = kernels.backend() == "cpu" and kernels.cpu_library() is not None
    assert calls["encoder conv 3x3 (dense block, dilated)"] == (4 if direct else tiles)
    assert sum(r["share"] for r in result["components"]) == pytest.approx(1.0)
    assert all(r["total_s"] >= 0 for r in result["components"])
    assert result["unprofiled_wall_s"] > 0


def test_nvidia_peer_is_skipped_off_cuda_with_the_reason():
    """Where mamba_ssm cannot run (CPU, Apple) the bench keeps the plain-loop peer and says why
    NVIDIA's stack did not run; it also does not run for windows shorter than the file."""
    from speechlens_cli.bench import runner

    for backend in ("cpu", "metal"):
        reason = runner.nvidia_peer_missing(backend)
        assert reason and "CUDA" in reason and backend in reason
    body = {"peer": [], "peer_info": {}}
    case = matrix.select("5s-16k-w5-standard")[0]
    runner._nvidia_peers(case, None, None, None, {}, None, runner.nvidia_peer_missing("cpu"),
                         body, log=lambda _line: None)
    runner._nvidia_peers(case, None, None, None, {}, None, runner.nvidia_peer_missing("cpu"),
                         body, log=lambda _line: None)  # a second group: stated once
    assert body["peer"] == []
    note = body["peer_info"][matrix.NVIDIA_PEER]
    assert note.startswith("not run: mamba_ssm") and note.count("not run") == 1
    long_case = next(c for c in matrix.select("*") if c.window < c.seconds)
    body = {"peer": [], "peer_info": {}}
    runner._nvidia_peers(long_case, None, None, None, {}, None, None, body,
                         log=lambda _line: None)
    assert body["peer"] == [] and "one window" in body["peer_info"][matrix.NVIDIA_PEER]


def test_report_names_both_peers_and_judges_the_nvidia_target():
    nvidia = f"{matrix.NVIDIA_PEER}, TF32 torch defaults"
    peers = [{"group": "5s-44.1k-w5", "peer": matrix.PLAIN_PEER, "median_s": 4.0,
              "times_s": [4.0]},
             {"group": "5s-44.1k-w5", "peer": nvidia, "median_s": 0.3, "times_s": [0.3]}]
    report = _fake_report("cuda", [_case("5s-44.1k-w5-standard", 0.2)], peers)
    assert [s["speedup"] for s in rep.speedups(report)] == [20.0]  # the plain-loop peer's
    verdicts = {t["target"]: t["met"] for t in rep.targets(report)}
    assert verdicts[">= 2x faster than the NVIDIA stack (torch defaults) (5s-44.1k-w5, "
                    "standard)"] == "NO"  # 1.5x
    # on a GPU the plain-loop peer is reported but judged against no target
    assert not any("plain-loop" in target for target in verdicts)


def test_the_plain_loop_peer_stays_on_short_files_where_nvidias_stack_runs():
    assert runner.plain_peer_skipped(30.0, None) is not None
    assert runner.plain_peer_skipped(5.0, None) is None
    assert runner.plain_peer_skipped(30.0, "mamba_ssm is not installed") is None


def test_reports_show_paths_without_the_machine(tmp_path, monkeypatch):
    """The checkout's files relative to it, the home folder as ~, anything else as it is."""
    from speechlens_cli.bench import environment

    package_file = Path(environment.__file__)
    assert environment.shown_path(str(package_file)) == os.path.join(
        "speechlens_cli", "bench", "environment.py")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert environment.shown_path(str(tmp_path / ".cache" / "lib.so")) == os.path.join(
        "~", ".cache", "lib.so")
    assert environment.shown_path("/opt/elsewhere/lib.so") == "/opt/elsewhere/lib.so"


def test_startup_times_whole_processes_against_the_peer(tiny_checkpoint, tmp_path, monkeypatch):
    """`bench --startup` runs `speechlens enhance` as new processes, alternating with the peer's
    (here a stand-in that copies its input, so torch is not needed), and compares the outputs."""
    from speechlens_cli.bench import startup

    def stand_in(_ckpt, src, out, _rate, _seconds, _backend, _device):
        dst = out / "copy.wav"
        copy = f"import shutil; shutil.copy({str(src)!r}, {str(dst)!r})"
        return "stand-in peer", [sys.executable, "-c", copy], dst

    monkeypatch.setattr(startup, "_peer", stand_in)
    result = CliRunner().invoke(main, [
        "bench", "--startup", "--model", str(tiny_checkpoint), "--trials", "2", "--device", "cpu",
        "--out", str(tmp_path), "--name", "startup"])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "startup.json").read_text())
    s = report["startup"]
    assert (s["seconds"], s["rate"]) == (1.0, 16000)  # the CPU's default file
    assert len(s["speechlens_times_s"]) == len(s["peer_times_s"]) == 2
    assert s["speechlens_median_s"] > 0.1  # a whole Python process with MLX, not a stub
    assert s["speedup"] == pytest.approx(s["peer_median_s"] / s["speechlens_median_s"])
    # the copy is the noisy input: the enhanced output differs from it, but not wildly
    assert 0 < s["parity_rel_rmse"] < 10
    assert report["targets"][0]["met"] == "n/a"  # tiny model
    assert "| stand-in peer |" in (tmp_path / "startup.md").read_text()


def test_a_timed_process_fails_with_its_own_error():
    from speechlens_cli.bench import runner

    failing = [sys.executable, "-c", "import sys; print('boom', file=sys.stderr); sys.exit(3)"]
    with pytest.raises(RuntimeError, match="x exited with 3: boom"):
        runner.timed_process(failing, "x", lambda _line: None)


def test_a_failed_batch_keeps_its_failed_files_lines():
    from speechlens_cli.bench import runner

    lines = ["[1/14] a.wav: 1.00 s of audio in 0.10 s"]
    lines += [f"error: f{i}.wav: the model failed on {i} samples" for i in range(13)]
    lines += ["failed: f0.wav", "error: 13 of 14 files failed (listed above)"]
    script = f"import sys; sys.stderr.write({chr(10).join(lines)!r}); sys.exit(3)"
    with pytest.raises(RuntimeError) as caught:
        runner.timed_process([sys.executable, "-c", script], "cold", lambda _line: None)
    message = str(caught.value)
    first = "cold exited with 3: error: 13 of 14 files failed (listed above)"
    assert message.splitlines()[0] == first
    assert "error: f0.wav: the model failed on 0 samples" in message
    assert "error: f9.wav: the model failed on 9 samples" in message
    assert "f10.wav" not in message and "... and 3 more" in message
    assert "[1/14]" not in message and "failed: f0.wav" not in message


def test_startup_targets_follow_the_backend_and_file():
    def judged(backend: str, seconds: float, rate: int, mine: float, peer: float | None):
        s = {"seconds": seconds, "rate": rate, "speechlens_median_s": mine}
        if peer is not None:
            s.update(peer_median_s=peer, speedup=peer / mine)
        report = {"environment": {"mlx backend": backend}, "architecture": dict(rep.FULL_SIZE),
                  "startup": s}
        return [(t["target"], t["met"]) for t in rep.startup_targets(report)]

    assert judged("cuda", 5.0, 44100, 1.9, None) == [
        ("one 5-s 44.1 kHz `speechlens enhance`, whole process, <= 2 s", "yes")]
    assert judged("cuda", 5.0, 44100, 2.4, 9.0)[0][1] == "NO"
    assert judged("cpu", 1.0, 16000, 8.0, 26.0) == [
        (">= 3x the peer's whole process at 1 s, 16 kHz", "yes")]
    assert judged("cpu", 1.0, 16000, 10.0, 26.0)[0][1] == "NO"
    assert judged("cpu", 1.0, 16000, 10.0, None)[0][1] == "not run"
    assert judged("cpu", 2.0, 16000, 10.0, 26.0) == []  # no target names that file


def test_corpus_times_whole_processes_over_a_generated_folder(tiny_checkpoint, tmp_path,
                                                              monkeypatch):
    """`bench --corpus` writes a corpus of varied lengths and times whole processes over it:
    speechlens cold (an empty cache folder) and warm, speechlens on one file of the same audio,
    and the peer's per-file loop (a stand-in that copies the folder, so torch is not needed)."""
    from speechlens_cli.bench import corpus

    def stand_in(_ckpt, folder, out, _rate, _backend, _device):
        copy = f"import shutil; shutil.copytree({str(folder)!r}, {str(out)!r})"
        return "stand-in peer", [sys.executable, "-c", copy]

    monkeypatch.setattr(corpus, "_peer", stand_in)
    result = CliRunner().invoke(main, [
        "bench", "--corpus", "8000:3:0.3-0.6", "--model", str(tiny_checkpoint), "--device",
        "cpu", "--out", str(tmp_path), "--name", "corpus"])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "corpus.json").read_text())
    (c,) = report["corpora"]
    assert c["files"] == 3 and 0.9 <= c["audio_seconds"] <= 1.8
    assert list(c["sides"]) == ["cold", "warm", "one file", "stand-in peer"]
    for name in ("cold", "warm", "one file"):  # whole Python processes with MLX, not stubs
        side = c["sides"][name]
        assert len(side["times_s"]) == 1 and side["median_s"] > 0.1
        assert side["rss_peak_bytes"] > 50 * 2**20
        assert side["audio_s_per_s"] == pytest.approx(c["audio_seconds"] / side["median_s"])
    warm, one = c["sides"]["warm"]["median_s"], c["sides"]["one file"]["median_s"]
    assert c["per_file_overhead_s"] == pytest.approx((warm - one) / 3)
    assert c["speedup_cold"] == pytest.approx(
        c["sides"]["stand-in peer"]["median_s"] / c["sides"]["cold"]["median_s"])
    (target,) = report["targets"]
    assert target["target"] == "3 files of 0.3-0.6 s at 8000 Hz: <= 1.2x one file of the same " \
        "audio (warm)"
    assert "| stand-in peer |" in (tmp_path / "corpus.md").read_text()


@pytest.mark.parametrize("spec", ["16000", "16000:x:1-2", "16000:3:2-1", "16000:0:1-2",
                                  "4000:3:1-2"])
def test_a_bad_corpus_is_one_usage_line(tmp_path, spec):
    result = CliRunner().invoke(main, ["bench", "--corpus", spec, "--device", "cpu", "--out",
                                       str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().count("\n") == 0 and "error:" in result.stderr, result.stderr


BENCH_DOCS = Path(__file__).resolve().parents[1] / "docs" / "bench"


def _markdown_tables(text: str) -> list[list[list[str]]]:
    """Each table of a Markdown text as its rows of cells (header, separator, body), a row's
    outer pipes optional and an escaped pipe part of its cell, as GitHub's renderer takes them."""
    tables, rows = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            inner = line.strip()[1:]
            inner = inner[:-1] if inner.endswith("|") else inner
            rows.append([cell.strip() for cell in re.split(r"(?<!\\)\|", inner)])
        elif rows:
            tables.append(rows)
            rows = []
    return tables


def _misshapen_rows(text: str) -> list[str]:
    """Rows whose cell count is not their header's."""
    return [f"{len(row)} cells under {len(table[0])}: {' | '.join(row)[:120]}"
            for table in _markdown_tables(text) for row in table[1:] if len(row) != len(table[0])]


def _rendered_reports() -> list[Path]:
    """The committed JSON reports `speechlens bench` wrote (the others were written by hand)."""
    return [p for p in sorted(BENCH_DOCS.glob("*.json"))
            if "started" in json.loads(p.read_text(encoding="utf-8"))]


@pytest.mark.parametrize("md_path", sorted(BENCH_DOCS.glob("*.md")), ids=lambda p: p.name)
def test_every_committed_report_table_has_its_header_cells(md_path):
    """A row with more cells than its header shifts every value after the extra one under the
    wrong heading (RTF showed the fastest trial's seconds)."""
    assert _misshapen_rows(md_path.read_text(encoding="utf-8")) == []


def _cells_by_case(markdown: str) -> dict[str, dict[str, str]]:
    """The speechlens table's rows, each as heading -> cell."""
    (table,) = [t for t in _markdown_tables(markdown) if t[0][:2] == ["case", "audio"]]
    return {row[0]: dict(zip(table[0], row, strict=True)) for row in table[2:]}


@pytest.mark.parametrize("json_path", _rendered_reports(), ids=lambda p: p.name)
def test_committed_and_freshly_rendered_reports_put_each_value_under_its_heading(json_path):
    report = json.loads(json_path.read_text(encoding="utf-8"))
    fresh = rep.markdown(report)
    assert _misshapen_rows(fresh) == []
    if report.get("kind"):
        return  # profile, start-up and corpus reports have no case table
    for markdown in (fresh, json_path.with_suffix(".md").read_text(encoding="utf-8")):
        cells = _cells_by_case(markdown)
        for row in report["cases"]:
            if "error" not in row:
                assert cells[row["case"]]["RTF"] == f"{row['rtf_median']:.3f}"
                assert cells[row["case"]]["min s"] == f"{min(row['times_s']):.3f}"


def test_a_report_with_failed_cases_and_peers_keeps_its_tables_square():
    report = json.loads((BENCH_DOCS / "cpu-intel-xeon-2cores.json").read_text(encoding="utf-8"))
    report["cases"].append({"case": "5s-16k-w5-broken", "seconds": 5.0, "rate": 16000,
                            "window_s": 5.0, "mode": "standard", "error": "out of memory"})
    report["peer"].append({"group": "5s-16k-w5", "device": "cpu", "error": "torch missing"})
    markdown = rep.markdown(report)
    assert "FAILED: out of memory" in markdown and "FAILED: torch missing" in markdown
    assert _misshapen_rows(markdown) == []
