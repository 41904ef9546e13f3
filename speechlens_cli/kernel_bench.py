"""Kernel benchmark: the conv1d / selective-scan kernels against MLX-op alternatives.

Run ``python -m speechlens_cli.kernel_bench`` (``--help`` for options). For each production shape
(B, L, D) -- the time pass and the frequency pass of a 44.1 kHz window: B=442, L=251 and B=251,
L=442, D=256 -- it times, after warm-up, the median (and min) of several repeats of:

* conv1d: the speechlens kernel, ``mx.conv1d(groups=D)`` (the fallback), and four shifted taps in
  MLX ops under ``mx.compile``;
* selective scan, standard and strict mode: the speechlens kernel and the scan in MLX ops
  (``kernels.selective_scan_ops``, one step at a time, evaluated every 32 steps).

Inputs are random float32 laid out as the model produces them (u and z are column slices of
one [B, L, 512] tensor; B and C of one [B, L, 36] tensor). Each timed region ends with
``mx.eval`` (and ``mx.synchronize``), so GPU work is included. Peak memory is what MLX's
``mx.get_peak_memory()`` reaches during that implementation's timed runs above the memory already
held (the inputs), i.e. the output plus any intermediates; the process's peak RSS is printed at
the end. The output is a Markdown table headed by hardware, OS, Python, MLX and backend.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import time
from functools import partial

import mlx.core as mx
import numpy as np

from . import kernels, runtime
from .bench.environment import cpu_model, gpu_name

PRODUCTION_SHAPES = ((442, 251, 256), (251, 442, 256))
CONV_TAPS = kernels.CONV_WIDTH


def environment() -> dict[str, str]:
    info = kernels.kernel_info()
    env = {
        "hardware": f"{cpu_model()}, {os.cpu_count()} logical CPUs",
        "gpu": gpu_name() or "-",
        "os": platform.platform(),
        "python": platform.python_version(),
        "mlx": mx.__version__,
        "backend": info["backend"],
        "default device": str(mx.default_device()),
    }
    if info["backend"] == "cpu":
        env["cpu kernels"] = (f"{info.get('cpu_isa', '-')}, {info.get('cpu_threads', '-')} "
                              f"threads, {os.path.basename(info['cpu_library'])}")
    try:
        load = os.getloadavg()
        env["load average at start"] = f"{load[0]:.2f}"
    except OSError:
        pass
    return env


def inputs(batch: int, length: int, channels: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    xz = mx.array(rng.standard_normal((batch, length, 2 * channels), dtype=np.float32))
    dbl = mx.array(rng.standard_normal((batch, length, 36), dtype=np.float32))
    delta_raw = mx.array(rng.standard_normal((batch, length, channels), dtype=np.float32) - 1.0)
    A_log = mx.array(np.log(rng.uniform(0.5, 16.0, (channels, 16))).astype(np.float32))
    D = mx.array(rng.standard_normal(channels, dtype=np.float32))
    weight = mx.array(rng.standard_normal((channels, CONV_TAPS, 1), dtype=np.float32))
    bias = mx.array(rng.standard_normal(channels, dtype=np.float32))
    mx.eval(xz, dbl, delta_raw, A_log, D, weight, bias)
    u, z = xz[..., :channels], xz[..., channels:]
    return {"x": u, "weight": weight, "bias": bias,
            "scan": (u, delta_raw, A_log, dbl[..., 4:20], dbl[..., 20:36], D, z)}


@mx.compile
def conv_taps(x, weight, bias):
    """Four shifted taps in MLX ops, fused by mx.compile (the best MLX-op conv measured)."""
    length = x.shape[1]
    xp = mx.pad(x, [(0, 0), (CONV_TAPS - 1, 0), (0, 0)])
    out = bias + weight[:, 0, 0] * xp[:, 0:length]
    for k in range(1, CONV_TAPS):
        out = out + weight[:, k, 0] * xp[:, k:k + length]
    return out


def _time(fn, repeats: int, warmup: int) -> dict[str, float]:
    for _ in range(warmup):
        mx.eval(fn())
        mx.synchronize()
    mx.synchronize()
    base = mx.get_active_memory()  # the inputs, alive throughout
    mx.reset_peak_memory()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        mx.eval(out)
        mx.synchronize()
        times.append(time.perf_counter() - t0)
        del out
    return {"median_ms": 1e3 * statistics.median(times), "min_ms": 1e3 * min(times),
            "peak_mib": (mx.get_peak_memory() - base) / 2**20, "repeats": repeats}


def run(shapes, repeats: int, warmup: int, ops_repeats: int, skip_ops: bool,
        modes=("standard", "strict")) -> list[dict]:
    rows = []
    for batch, length, channels in shapes:
        data = inputs(batch, length, channels)
        conv_args = (data["x"], data["weight"], data["bias"])
        shape = f"{batch}x{length}x{channels}"
        conv = [("kernel", partial(kernels.causal_conv1d, *conv_args)),
                ("mx.conv1d groups=D (fallback)", partial(kernels.conv1d_fallback, *conv_args)),
                ("4 shifted taps, mx.compile", partial(conv_taps, *conv_args))]
        for impl, fn in conv:
            rows.append({"op": "causal_conv1d", "shape": shape, "mode": "-", "impl": impl,
                         **_time(fn, repeats, warmup)})
        for mode in modes:
            strict = mode == "strict"
            rows.append({"op": "selective_scan", "shape": shape, "mode": mode, "impl": "kernel",
                         **_time(partial(kernels.selective_scan, *data["scan"], strict=strict),
                                 repeats, warmup)})
            if not skip_ops:
                fn = partial(kernels.selective_scan_ops, *data["scan"], strict=strict)
                rows.append({"op": "selective_scan", "shape": shape, "mode": mode,
                             "impl": "MLX ops, step loop",
                             **_time(fn, ops_repeats, min(warmup, 1))})
        del data, conv_args
    return rows


def markdown(env: dict[str, str], rows: list[dict]) -> str:
    lines = ["| | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in env.items()]
    lines += ["", ("| op | B x L x D | mode | implementation | median ms | min ms | repeats | "
                   "extra peak MLX MiB | vs kernel |"),
              "|---|---|---|---|---:|---:|---:|---:|---:|"]
    kernel_ms = {(r["op"], r["shape"], r["mode"]): r["median_ms"] for r in rows
                 if r["impl"] == "kernel"}
    for r in rows:
        ratio = r["median_ms"] / kernel_ms[(r["op"], r["shape"], r["mode"])]
        lines.append(f"| {r['op']} | {r['shape']} | {r['mode']} | {r['impl']} | "
                     f"{r['median_ms']:.2f} | {r['min_ms']:.2f} | {r['repeats']} | "
                     f"{r['peak_mib']:.0f} | {ratio:.2f}x |")
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    peak_rss_mib = peak_rss / 2**20 if sys.platform == "darwin" else peak_rss / 2**10
    lines += ["", f"Process peak RSS: {peak_rss_mib:.0f} MiB."]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m speechlens_cli.kernel_bench",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default=",".join("x".join(map(str, s))
                                                 for s in PRODUCTION_SHAPES),
                   help="comma-separated BxLxD list (default: the two production shapes)")
    p.add_argument("--repeats", type=int, default=10, help="timed runs per kernel (median)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--ops-repeats", type=int, default=3,
                   help="timed runs of the (slow) MLX-op scan")
    p.add_argument("--skip-ops", action="store_true", help="do not time the MLX-op scan")
    p.add_argument("--modes", default="standard,strict")
    p.add_argument("--json", help="also write the rows and environment to this JSON file")
    args = p.parse_args(argv)
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s]
    # As the CLI, but with MLX already imported: its own BLAS (the kernels here use none), the
    # heap and full float32 before the first GPU operation.
    runtime.prepare()
    env = environment()
    rows = run(shapes, args.repeats, args.warmup, args.ops_repeats, args.skip_ops,
               tuple(m for m in args.modes.split(",") if m))
    text = markdown(env, rows)
    print(text)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"environment": env, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
