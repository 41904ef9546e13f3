"""Print the conv1d / selective-scan kernels' parity with the float64 reference, for the record.

Run from the repository root: `python tests/kernel_parity.py [--shapes BxLxD,...]` (default: the
production shapes of `python -m speechlens_cli.kernel_bench`, on the same random inputs).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]

from speechlens_cli import runtime  # noqa: E402

runtime.prepare()  # before MLX is imported: the fast BLAS on Linux CPUs, full float32
import mlx.core as mx  # noqa: E402,I001
import numpy as np  # noqa: E402
import reference as ref  # noqa: E402
from speechlens_cli import kernels  # noqa: E402
from speechlens_cli.kernel_bench import PRODUCTION_SHAPES, inputs  # noqa: E402


def parity(shapes, seed: int = 1) -> list[dict]:
    """Kernel outputs against the float64 NumPy reference: relative RMS and max abs error, conv
    also against the mx.conv1d fallback."""
    def err(got, want):
        got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
        return (float(np.sqrt(np.mean((got - want) ** 2) / np.mean(want ** 2))),
                float(np.max(np.abs(got - want))), bool(np.all(np.isfinite(got))))

    rows = []
    for batch, length, channels in shapes:
        data = inputs(batch, length, channels, seed)
        x, w, b = data["x"], data["weight"], data["bias"]
        shape = f"{batch}x{length}x{channels}"
        out = np.array(kernels.causal_conv1d(x, w, b))
        want = ref.reference_causal_conv1d(np.array(x), np.array(w).transpose(0, 2, 1),
                                           np.array(b))
        rows.append({"op": "causal_conv1d", "shape": shape, "mode": "-",
                     "against": "float64 reference", **dict(zip(
                         ("rel_rms", "max_abs", "finite"), err(out, want), strict=True))})
        fb = np.array(kernels.conv1d_fallback(x, w, b))
        rows.append({"op": "causal_conv1d", "shape": shape, "mode": "-",
                     "against": "mx.conv1d fallback", **dict(zip(
                         ("rel_rms", "max_abs", "finite"), err(out, fb), strict=True))})
        args = data["scan"]
        want = ref.reference_selective_scan(*(np.array(a) for a in args))
        for mode in ("standard", "strict"):
            outs = [np.array(kernels.selective_scan(*args, strict=mode == "strict"))
                    for _ in range(2)]
            rel, mab, fin = err(outs[0], want)
            rows.append({"op": "selective_scan", "shape": shape, "mode": mode,
                         "against": "float64 reference", "rel_rms": rel, "max_abs": mab,
                         "finite": fin, "bit_identical_rerun": bool(np.array_equal(
                             outs[0].view(np.uint32), outs[1].view(np.uint32)))})
        big = list(args)
        big[1] = mx.full(args[1].shape, 1000.0, mx.float32)
        out = np.array(kernels.selective_scan(*big, strict=True))
        rows.append({"op": "selective_scan", "shape": shape, "mode": "strict, dt=1000",
                     "against": "float64 reference", **dict(zip(
                         ("rel_rms", "max_abs", "finite"),
                         err(out, ref.reference_selective_scan(*(np.array(a) for a in big))),
                         strict=True))})
    return rows


def parity_markdown(rows: list[dict]) -> str:
    lines = ["| op | B x L x D | mode | against | rel RMS | max abs | finite | rerun identical |",
             "|---|---|---|---|---:|---:|---|---|"]
    for r in rows:
        lines.append(f"| {r['op']} | {r['shape']} | {r['mode']} | {r['against']} | "
                     f"{r['rel_rms']:.2e} | {r['max_abs']:.2e} | {r['finite']} | "
                     f"{r.get('bit_identical_rerun', '-')} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python tests/kernel_parity.py",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default=",".join("x".join(map(str, s))
                                                      for s in PRODUCTION_SHAPES))
    args = parser.parse_args(argv)
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s]
    print(parity_markdown(parity(shapes)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
