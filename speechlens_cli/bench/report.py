"""Benchmark and profile reports: the JSON document, its Markdown rendering, the targets."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..model.config import ModelConfig
from .cases import NVIDIA_PEER, PLAIN_PEER

NVIDIA_DEFAULTS = f"{NVIDIA_PEER}, TF32 torch defaults"

MIB = 2**20
GB = 1e9

#: The performance targets a run is judged against (benchmarks, not unit tests).
GPU_5S_44K_SECONDS = 0.12
#: Against NVIDIA's own stack with torch's defaults, 5-s files: the peer a GPU user would run.
GPU_NVIDIA_SPEEDUP = {"standard": 2.0, "strict": 1.7}
MEMORY_30S_48K_BYTES = {"gpu": 4 * GB, "cpu": 24 * GB}  # the CPU's: the machine's memory
CPU_PEER_SPEEDUP = 3.0
#: CPU real-time factors at 5-s files, by rate.
CPU_RTF_5S = {16000: 5.0, 44100: 15.0}
#: Whole processes (`speechlens bench --startup`): one 5-s 44.1 kHz `speechlens enhance` on a
#: GPU, and against the peer's whole process on a 1-s 16 kHz file on the CPU.
GPU_STARTUP_SECONDS = 2.0
GPU_STARTUP_FILE = (5.0, 44100)
CPU_STARTUP_FILE = (1.0, 16000)
#: The targets are about the full-size architecture (the real checkpoint's).
#: Corpus targets (bench --corpus): on a GPU the peer's per-file loop over speechlens's whole
#: process, cold and warm, and what a file costs beyond its audio's model time; on the CPU the
#: corpus against one file of the same audio.
CORPUS_SPEEDUP = {"cold": 2.5, "warm": 3.0}
CORPUS_OVERHEAD_S = 0.010
CPU_CORPUS_OVER_ONE_FILE = 1.2
FULL_SIZE = ModelConfig().size()


def architecture(cfg: ModelConfig) -> dict:
    """The model's size (ModelConfig.size), as a report states it."""
    return cfg.size()


def _not_full_size(report: dict) -> list[dict] | None:
    """The one "n/a" target row of a report not made with the full-size model, else None."""
    arch = report.get("architecture", FULL_SIZE)
    if any(arch.get(k) != v for k, v in FULL_SIZE.items()):
        return [{"target": "all targets", "measured": f"not the full-size model ({arch})",
                 "met": "n/a"}]
    return None


def _case(report: dict, name: str) -> dict | None:
    for row in report.get("cases", []):
        if row["case"] == name and "error" not in row:
            return row
    return None


def _peer(report: dict, group: str) -> dict | None:
    for row in report.get("peer", []):
        if row["group"] == group and "error" not in row:
            return row
    return None


def speedups(report: dict, peer_name: str = PLAIN_PEER) -> list[dict]:
    """Peer median / speechlens median (and min / min) for every group that has both, for the
    peer named `peer_name` (rows without a name are the plain-loop peer's)."""
    out = []
    for peer in report.get("peer", []):
        if "error" in peer or peer.get("peer", PLAIN_PEER) != peer_name:
            continue
        for mode in ("standard", "strict"):
            row = _case(report, f"{peer['group']}-{mode}")
            if row:
                out.append({"group": peer["group"], "mode": mode,
                            "speedup": peer["median_s"] / row["median_s"],
                            "speedup_min": min(peer["times_s"]) / min(row["times_s"])})
    return out


def targets(report: dict) -> list[dict]:
    """Each target that applies to this backend, with what was measured."""
    backend = report["environment"].get("mlx backend", "cpu")
    rows = []
    if (not_full := _not_full_size(report)) is not None:
        return not_full

    def add(target: str, measured: str, met: bool | None) -> None:
        verdict = "not run" if met is None else ("yes" if met else "NO")
        if "disagree" in measured:
            verdict = "unclear"
        rows.append({"target": target, "measured": measured, "met": verdict})

    speed = {(s["group"], s["mode"]): s["speedup"] for s in speedups(report)}
    fastest = {(s["group"], s["mode"]): s["speedup_min"] for s in speedups(report)}

    def ratio_text(key, goal: float) -> str:
        text = f"{speed[key]:.2f}x (medians); {fastest[key]:.2f}x (fastest trials)"
        if (speed[key] >= goal) != (fastest[key] >= goal):
            text += ": the two disagree, so contention decided it; see the load averages"
        return text

    if backend != "cpu":
        row = _case(report, "5s-44.1k-w5-standard")
        add(f"5 s at 44.1 kHz end to end <= {GPU_5S_44K_SECONDS} s",
            f"{row['median_s']:.3f} s median" if row else "not run",
            None if row is None else row["median_s"] <= GPU_5S_44K_SECONDS)
        nvidia = {(s["group"], s["mode"]): s["speedup"]
                  for s in speedups(report, NVIDIA_DEFAULTS)}
        for (group, mode), value in sorted(nvidia.items()):
            goal = GPU_NVIDIA_SPEEDUP[mode]
            if group.startswith("5s-"):
                add(f">= {goal:g}x faster than the NVIDIA stack (torch defaults) "
                    f"({group}, {mode})", f"{value:.2f}x (medians)", value >= goal)
        if not nvidia:
            add(f">= {GPU_NVIDIA_SPEEDUP['standard']:g}x faster than the NVIDIA stack "
                "(torch defaults)", "not run (see the peers' notes)", None)
        for peer in report.get("peer", []):
            row = _case(report, f"{peer['group']}-standard")
            if (peer.get("peer") != NVIDIA_DEFAULTS or "error" in peer or row is None
                    or not peer["group"].startswith("5s-") or not peer.get("torch_peak_bytes")):
                continue
            add(f"peak memory <= the NVIDIA stack's (torch defaults) ({peer['group']}, standard)",
                f"MLX {row['mlx_peak_bytes'] / MIB:,.0f} MiB vs "
                f"{peer['torch_peak_bytes'] / MIB:,.0f} MiB",
                row["mlx_peak_bytes"] <= peer["torch_peak_bytes"])
    else:
        for (group, mode), ratio in sorted(speed.items()):
            add(f">= {CPU_PEER_SPEEDUP:g}x faster than the plain-loop PyTorch peer on this CPU "
                f"({group}, {mode})",
                ratio_text((group, mode), CPU_PEER_SPEEDUP), ratio >= CPU_PEER_SPEEDUP)
        if not speed:
            add(f">= {CPU_PEER_SPEEDUP:g}x faster than the plain-loop PyTorch peer on this CPU",
                "not run",
                None)
        for rate, goal in CPU_RTF_5S.items():
            rows_at = [r for r in report.get("cases", []) if r["rate"] == rate
                       and r["seconds"] == 5.0 and "error" not in r]
            for row in rows_at:
                add(f"RTF <= {goal:g} at 5 s, {rate / 1000:g} kHz ({row['case']})",
                    f"RTF {row['rtf_median']:.2f}", row["rtf_median"] <= goal)
            if not rows_at:
                add(f"RTF <= {goal:g} at 5 s, {rate / 1000:g} kHz", "not run", None)
    limit = MEMORY_30S_48K_BYTES["cpu" if backend == "cpu" else "gpu"]
    memory = [r for r in report.get("cases", [])
              if r["rate"] == 48000 and r["window_s"] == 30.0 and r["seconds"] >= 30.0]
    for row in memory:
        target = f"peak memory <= {limit / GB:g} GB at 30-s windows, 48 kHz ({row['case']})"
        if "error" in row:
            add(target, f"failed: {row['error']}", False)
            continue
        peak = max(row["mlx_peak_bytes"], row["rss_peak_bytes"])
        add(target, f"MLX {row['mlx_peak_bytes'] / GB:.2f} GB, process RSS "
            f"{row['rss_peak_bytes'] / GB:.2f} GB (GB = 10^9 bytes)", peak <= limit)
    if not memory:
        add(f"peak memory <= {limit / GB:g} GB at 30-s windows, 48 kHz", "not run", None)
    return rows


def startup_targets(report: dict) -> list[dict]:
    """The whole-process targets that apply to this backend and file."""
    backend = report["environment"].get("mlx backend", "cpu")
    s = report["startup"]
    file = (s["seconds"], s["rate"])
    if (not_full := _not_full_size(report)) is not None:
        return not_full
    rows = []
    if backend != "cpu" and file == GPU_STARTUP_FILE:
        rows.append({"target": f"one {file[0]:g}-s {file[1] / 1000:g} kHz `speechlens enhance`, "
                               f"whole process, <= {GPU_STARTUP_SECONDS:g} s",
                     "measured": f"{s['speechlens_median_s']:.3f} s median",
                     "met": "yes" if s["speechlens_median_s"] <= GPU_STARTUP_SECONDS else "NO"})
    if backend == "cpu" and file == CPU_STARTUP_FILE:
        speedup = s.get("speedup")
        rows.append({"target": f">= {CPU_PEER_SPEEDUP:g}x the peer's whole process at "
                               f"{file[0]:g} s, {file[1] / 1000:g} kHz",
                     "measured": "peer not run" if speedup is None else f"{speedup:.2f}x (medians)",
                     "met": "not run" if speedup is None else
                     ("yes" if speedup >= CPU_PEER_SPEEDUP else "NO")})
    return rows


def corpus_targets(report: dict) -> list[dict]:
    """The corpus targets that apply to this backend (the GPU's need the full-size model)."""
    backend = report["environment"].get("mlx backend", "cpu")
    if backend == "cpu":
        return [{"target": f"{c['corpus']}: <= {CPU_CORPUS_OVER_ONE_FILE:g}x one file of the "
                           "same audio (warm)",
                 "measured": f"{c['corpus_over_one_file']:.2f}x",
                 "met": "yes" if c["corpus_over_one_file"] <= CPU_CORPUS_OVER_ONE_FILE else "NO"}
                for c in report["corpora"]]
    if (not_full := _not_full_size(report)) is not None:
        return not_full
    rows = []
    for c in report["corpora"]:
        for when, ratio in CORPUS_SPEEDUP.items():
            measured = c.get(f"speedup_{when}")
            rows.append({"target": f"{c['corpus']}: >= {ratio:g}x the peer's per-file loop, "
                                   f"speechlens {when}",
                         "measured": "peer not run" if measured is None else f"{measured:.2f}x",
                         "met": "not run" if measured is None else
                         ("yes" if measured >= ratio else "NO")})
        overhead = c["per_file_overhead_s"]
        rows.append({"target": f"{c['corpus']}: per-file overhead <= "
                               f"{CORPUS_OVERHEAD_S * 1000:g} ms",
                     "measured": f"{overhead * 1000:.1f} ms",
                     "met": "yes" if overhead <= CORPUS_OVERHEAD_S else "NO"})
    return rows


def write(report: dict, out_dir: Path, name: str) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out_dir / f"{name}.json", out_dir / f"{name}.md"
    for path, text in ((json_path, json.dumps(report, indent=2) + "\n"),
                       (md_path, markdown(report))):
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    return json_path, md_path


def _min(row: dict) -> str:
    value = row.get("min_s", min(row["times_s"]) if row.get("times_s") else None)
    return "-" if value is None else f"{value:.3f}"


def _mib(value) -> str:
    return "-" if value is None else f"{value / MIB:,.0f}"


def _cell(text) -> str:
    """A value as one Markdown table cell: a pipe in it (a component's "log1p |X|") escaped, so
    it does not end the cell and shift every column after it."""
    return str(text).replace("|", "\\|")


def _kv_table(items: dict) -> list[str]:
    lines = ["| | |", "|---|---|"]
    for key, value in items.items():
        lines.append(f"| {key} | {str(value).replace('|', '/')} |")
    return lines


def _notes(report: dict) -> list[str]:
    """Notes added to a report after the run (e.g. why it is incomplete), shown as written."""
    notes = report.get("notes") or []
    return (["", "## Notes", ""] + [f"- {n}" for n in notes]) if notes else []


def _targets_table(report: dict) -> list[str]:
    lines = ["", "## Targets", "", "| target | measured | met |", "|---|---|---|"]
    for t in report.get("targets", []):
        lines.append(f"| {_cell(t['target'])} | {_cell(t['measured'])} | {t['met']} |")
    return lines


def render(json_path: Path) -> Path:
    """Rewrite the Markdown of a saved JSON report (after notes were added to it)."""
    report = json.loads(Path(json_path).read_text(encoding="utf-8"))
    md_path = Path(json_path).with_suffix(".md")
    md_path.write_text(markdown(report), encoding="utf-8")
    return md_path


def _header(report: dict, title: str) -> list[str]:
    """Title, run times and command line, environment table and notes of a report."""
    lines = [f"# {title}: {report['machine']}", "",
             (f"Run {report['started']} to {report.get('finished', '(unfinished)')}; "
             f"`speechlens {report['environment'].get('argv', '')}`."), "",
             "## Environment", ""]
    return lines + _kv_table(report["environment"]) + _notes(report)


def markdown(report: dict) -> str:
    if report.get("kind") == "profile":
        return profile_markdown(report)
    if report.get("kind") == "startup":
        return startup_markdown(report)
    if report.get("kind") == "corpus":
        return corpus_markdown(report)
    lines = _header(report, "speechlens benchmark")
    settings = report["settings"]
    lines += ["", "## Settings", ""]
    lines += _kv_table({
        "checkpoint": report["checkpoint"],
        "model load": f"{report.get('model_load_s', 0):.2f} s (not in the timings)",
        **{f"fixture {k}": v for k, v in report.get("fixtures", {}).items()},
        "windowing": settings["windowing"],
        "timing": settings["timing"],
        "repeats": settings["repeats"],
        "p90": settings["p90"],
        "RTF": settings["rtf"],
        "memory": settings["memory"],
    })
    lines += ["", "## speechlens (MLX)", "",
              ("| case | audio | rate | window | mode | windows | warm-up + trials | median s | "
              "p90 s | min s | RTF | MLX peak MiB | RSS peak MiB | load avg | note |"),
              "|---|---:|---:|---:|---|---:|---|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in report.get("cases", []):
        if "error" in r:
            lines.append(f"| {r['case']} | {r['seconds']:g} s | {r['rate']} | {r['window_s']:g} s "
                         f"| {r['mode']} | - | - | - | - | - | - | - | - | - | "
                         f"FAILED: {_cell(r['error'])} |")
            continue
        lines.append(
            f"| {r['case']} | {r['seconds']:g} s | {r['rate']} | {r['window_s']:g} s | {r['mode']} "
            f"| {r['windows']} | {r['warmup']} + {r['trials']} | {r['median_s']:.3f} | "
            f"{r['p90_s']:.3f} | {_min(r)} | {r['rtf_median']:.3f} | {_mib(r['mlx_peak_bytes'])} | "
            f"{_mib(r['rss_peak_bytes'])} | {r['load_at_start'].split()[0]}-"
            f"{r['load_at_end'].split()[0]} | {_cell(r.get('note', ''))} |")
    peers = report.get("peer", [])
    lines += ["", "## Peers, same input, same run", "",
              (f"{PLAIN_PEER}: speechlens's windows through the same pipeline. NVIDIA stack: the "
               "whole file as one window, as NVIDIA's scripts run it."), ""]
    for key, value in report.get("peer_info", {}).items():
        lines.append(f"- {key}: {value}")
    if peers:
        lines += ["", ("| peer | input, window | device | warm-up + trials | peer median s | "
                       "peer p90 s | "
                       "peer min s | "
                      "speechlens median s (standard / strict) | speedup (standard / strict) | "
                      "parity rel-RMSE (standard / strict) | peer GPU peak MiB | RSS peak MiB |"),
                  "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for p in peers:
            who = p.get("peer", PLAIN_PEER)
            if "error" in p:
                lines.append(f"| {who} | {p['group']} | {p['device']} "
                             "| - | - | - | - | - | - | - | - "
                             f"| FAILED: {_cell(p['error'])} |")
                continue
            sl = [_case(report, f"{p['group']}-{m}") for m in ("standard", "strict")]
            medians = " / ".join(f"{r['median_s']:.3f}" if r else "-" for r in sl)
            ratios = " / ".join(f"{p['median_s'] / r['median_s']:.2f}x" if r else "-" for r in sl)
            parity = " / ".join(f"{p['parity_rel_rmse'][m]:.1e}" if m in p["parity_rel_rmse"]
                                else "-" for m in ("standard", "strict"))
            lines.append(f"| {who} | {p['group']} | {p['device']} | "
                         f"{p['warmup']} + {p['trials']} | "
                         f"{p['median_s']:.3f} | {p['p90_s']:.3f} | {_min(p)} | {medians} | "
                         f"{ratios} | "
                         f"{parity} | {_mib(p.get('torch_peak_bytes'))} | "
                         f"{_mib(p['rss_peak_bytes'])} |")
        lines += ["", ("Speedup = peer median / speechlens median. Parity: waveform relative RMSE "
                      "of the peer's output against speechlens's (expected <= 1e-4).")]
    lines += _targets_table(report)
    return "\n".join(lines) + "\n"


def profile_markdown(report: dict) -> str:
    p = report["profile"]
    lines = _header(report, "speechlens component profile")
    lines += ["", "## Method", "",
              (f"{p['seconds']:g} s of synthetic noisy speech at {p['rate']} Hz, one window "
               f"(the whole input), {p['mode']} mode; checkpoint: "
               f"{report['checkpoint'].rstrip('.')}. "
               "The profiler runs the model's own `enhance` with every module and kernel "
               "wrapped (speechlens_cli/bench/profiling.py): inputs are evaluated first, then the "
               "component runs and its output is evaluated (`mx.eval`, plus `mx.synchronize` "
               "on a GPU); a component's time excludes the wrapped components inside it, so a "
               "container's time is its glue. These per-component barriers exist in the "
               "profiler only (the model keeps just its own bound on pending work). "
               f"{p['warmup']} profiled warm-up run(s), then {p['runs']} "
               "profiled run(s); a component's time is the median over runs of its summed "
               "time in a run."), "",
              (f"- sum of components: {p['sum_of_components_s']:.3f} s; profiled wall time "
               f"{p['profiled_wall_s']:.3f} s"),
              (f"- the same input without barriers (`model.enhance`, one `mx.eval`): "
               f"{p['unprofiled_wall_s']:.3f} s median of {len(p['unprofiled_runs_s'])}"),
              (f"- profiled vs unprofiled output: max abs difference "
               f"{p['profiled_vs_plain_max_abs']:.2e} (output max abs {p['output_max_abs']:.2e})"),
              f"- MLX peak memory during the profiled runs: {_mib(p['mlx_peak_bytes'])} MiB", "",
              "## By group", "", "| group | time s | share |", "|---|---:|---:|"]
    total = p["sum_of_components_s"]
    for group, seconds in p["groups"].items():
        lines.append(f"| {group} | {seconds:.3f} | {100 * seconds / total:.1f}% |")
    lines += ["", "## By component (largest first)", "",
              "| component | group | calls | time s | share of all | share of Mamba |",
              "|---|---|---:|---:|---:|---:|"]
    for r in p["components"]:
        mamba = "-" if r["share_of_mamba"] is None else f"{100 * r['share_of_mamba']:.1f}%"
        lines.append(f"| {_cell(r['component'])} | {r['group']} | {r['calls']} | "
                     f"{r['total_s']:.3f} | {100 * r['share']:.1f}% | {mamba} |")
    return "\n".join(lines) + "\n"


def startup_markdown(report: dict) -> str:
    s = report["startup"]
    lines = _header(report, "speechlens whole-process benchmark")

    def times(values: list[float]) -> str:
        return ", ".join(f"{v:.3f}" for v in values)

    lines += ["", "## Method", "",
              (f"{s['seconds']:g} s of audio at {s['rate']} Hz ({s['fixture']}); checkpoint: "
               f"{report['checkpoint'].rstrip('.')}. Each trial is a new process, timed from its "
               f"start to its exit: `{s['command']}`"
               + (", and alternating with it a new process of the peer (torch import, model "
                  "load, the file, the write)" if "peer" in s else "; no peer")
               + ". One untimed run of each came first (file cache, compiled kernels). "
               f"{s['trials']} trials each; load average {s['load_at_start'].split()[0]} at the "
               f"start, {s['load_at_end'].split()[0]} at the end."), "",
              "| process | trials s | median s |", "|---|---|---:|",
              f"| speechlens | {times(s['speechlens_times_s'])} | {s['speechlens_median_s']:.3f} |"]
    if "peer" in s:
        lines += [f"| {s['peer']} | {times(s['peer_times_s'])} | {s['peer_median_s']:.3f} |", "",
                  (f"Speedup (peer median / speechlens median): {s['speedup']:.2f}x. Parity: "
                   f"waveform relative RMSE of the peer's output against speechlens's "
                   f"{s['parity_rel_rmse']:.1e}.")]
    lines += _targets_table(report)
    return "\n".join(lines) + "\n"


def corpus_markdown(report: dict) -> str:
    lines = _header(report, "speechlens corpus benchmark")
    lines += ["", "## Method", "",
              (f"Checkpoint: {report['checkpoint'].rstrip('.')}. Each side is a whole process, "
               "timed from its start to its exit, with its peak RSS: speechlens cold (an empty "
               "cache folder, XDG_CACHE_HOME), warm (that cache again), on one file holding all "
               "of the corpus's audio, and the peer as one process looping over the files, "
               "each as one window. The sides alternate in each round. Per-file overhead = "
               "(warm corpus - one file) / files.")]
    for c in report["corpora"]:
        lines += ["", f"## {c['corpus']}", "",
                  (f"{c['audio_seconds']:.1f} s of audio ({c['fixture']}); `{c['command']}`; "
                   f"{c['trials']} round(s); load average {c['load_at_start'].split()[0]} at the "
                   f"start, {c['load_at_end'].split()[0]} at the end."), "",
                  "| side | rounds s | median s | audio s per s | peak RSS MiB |",
                  "|---|---|---:|---:|---:|"]
        for side, r in c["sides"].items():
            rounds = ", ".join(f"{t:.2f}" for t in r["times_s"])
            lines.append(f"| {side} | {rounds} | {r['median_s']:.2f} | "
                         f"{r['audio_s_per_s']:.1f} | {_mib(r['rss_peak_bytes'])} |")
        lines += ["", (f"Per-file overhead {c['per_file_overhead_s'] * 1000:.1f} ms; warm corpus "
                       f"over one file {c['corpus_over_one_file']:.2f}x"
                       + (f"; the peer over speechlens {c['speedup_cold']:.2f}x cold, "
                          f"{c['speedup_warm']:.2f}x warm" if "peer" in c else "; no peer")
                       + ".")]
    lines += _targets_table(report)
    return "\n".join(lines) + "\n"
