"""Per-component profile of one enhancement (`speechlens bench --profile`).

The profiler runs the model's own ``SEMamba.enhance`` with every module of the model (found by
walking ``model.named_modules()``) and every kernel / waveform function it calls
(``kernels.bimamba_conv``, ``kernels.bimamba_scan``, the BiMamba projections, the STFT, the
iSTFT, the sweep filter)
wrapped for the duration of the run:

* before a component runs, its array inputs are evaluated (that time belongs to the caller);
* after it, its output is evaluated (``mx.eval``, plus ``mx.synchronize`` on a GPU) and the time
  is recorded, minus the time of the wrapped components nested inside it.

So each component's time is its own work, and a container module's own time is the glue between
its children (slices, residual adds, concatenations, transposes). The per-component
barriers exist only here (the model's own bound on pending work, scheduling.Pending, stays as
it is): the model code is untouched (wrapping swaps each module's class for a timed subclass and
puts it back afterwards), so the profile follows whatever the model does now, including kernel
fusions. Barriers cost something (no cross-op scheduling, one synchronisation per component,
about 2,000 per run), so the sum exceeds the unprofiled end-to-end time; the report shows both and
reads the components as a within-run ranking.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from contextlib import ExitStack, contextmanager

import mlx.core as mx
from mlx import nn

from .. import kernels
from ..kernels import dispatch
from ..model import mamba, semamba

# Groups for the report.
MAMBA = "Mamba (inner, both directions)"
BIMAMBA = "BiMamba merge"
TFBLOCK = "TF-block layout"
ENCODER = "Encoder"
DECODERS = "Decoders (magnitude + phase)"
WAVE = "Waveform side"
MODEL = "Model glue"
OTHER = "Other"


def _arrays(value) -> list[mx.array]:
    if isinstance(value, mx.array):
        return [value]
    if isinstance(value, (list, tuple)):
        return [a for v in value for a in _arrays(v)]
    if isinstance(value, dict):
        return [a for v in value.values() for a in _arrays(v)]
    return []


class Profiler:
    """Accumulates exclusive time per component label."""

    def __init__(self, sync: bool):
        self.sync = sync
        self.total: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.group: dict[str, str] = {}
        self._children = [0.0]

    def _barrier(self, arrays: list[mx.array]) -> None:
        if arrays:
            mx.eval(arrays)
        if self.sync:
            mx.synchronize()

    def run(self, label: str, group: str, fn, args, kwargs):
        self._barrier(_arrays((args, kwargs)))       # inputs: the caller's work
        self._children.append(0.0)
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        self._barrier(_arrays(out))
        elapsed = time.perf_counter() - t0
        nested = self._children.pop()
        self.total[label] += elapsed - nested
        self.calls[label] += out is not None  # a method that declines (None) is no call
        self.group[label] = group
        self._children[-1] += elapsed
        return out


def _matmul(name: str, weight_arg: int, weights_field: str):
    """A label function for a projection of both directions: its matmul's K -> N."""
    def label(args, kwargs) -> str:
        weight = getattr(args[weight_arg], weights_field)
        return f"{name} ({weight.shape[-2]}->{weight.shape[-1]})"
    return label


def module_label(path: str, module) -> tuple[str, str]:
    """(component, group) of a module from its path in the model and its class."""
    cls = type(module).__name__
    parts = [p for p in path.split(".") if p and not p.isdigit()]
    leaf = parts[-1] if parts else ""
    if not parts:
        return "model glue (input stack + pad, output crops)", MODEL
    if parts[0] == "dense_encoder":
        if cls == "Conv2d":
            kh, kw = module.weight.shape[1:3]
            where = "dense block, dilated" if "dense_block" in parts else parts[1]
            return f"encoder conv {kh}x{kw} ({where})", ENCODER
        if cls in ("InstanceNorm", "PReLU"):
            return f"encoder {cls}", ENCODER
        if cls == "DenseBlock":
            return "encoder dense-block glue (tile concat)", ENCODER
        return "encoder glue", ENCODER
    if parts[0] in ("mask_decoder", "phase_decoder"):
        if cls == "Conv2d" and "dense_block" in parts:
            return "decoder conv 3x3 (dense block, dilated)", DECODERS
        if cls == "Conv2d" and leaf == "conv":
            return "decoder sub-pixel conv (1,3)", DECODERS
        if cls == "Conv2d":
            return "decoder heads (1x1 conv)", DECODERS
        if cls == "SubPixelConv":
            return "decoder sub-pixel shuffle", DECODERS
        if cls in ("InstanceNorm", "PReLU"):
            return f"decoder {cls}", DECODERS
        if cls == "DenseBlock":
            return "decoder dense-block glue (tile concat)", DECODERS
        return "decoder glue (T/F swaps, atan2, crop)", DECODERS
    if parts[0] == "TSMamba":
        if len(parts) == 1:
            return "TF-block glue (rearranges)", TFBLOCK
        if len(parts) == 2:
            return "BiMamba glue (weight lookup)", BIMAMBA
        # the per-direction parameter modules and the LayerNorm (the merge applies it) are not
        # called: the functions below run both
        return f"Mamba {leaf} ({cls})", MAMBA
    return f"{'.'.join(parts)} ({cls})", OTHER


#: (module, attribute, label or label function, group) of the functions the model calls.
FUNCTIONS = (
    # the conv is called by kernels.project_conv, where it is not inside the in_proj's kernel
    (dispatch, "bimamba_conv", "Mamba causal conv1d kernel + SiLU (both directions)", MAMBA),
    (kernels, "bimamba_scan",
     "Mamba selective scan kernel (both directions; softplus, SiLU(z) gate + dt_proj)", MAMBA),
    (mamba, "project_in",
     _matmul("Mamba in_proj, both directions (x2; on CUDA the conv + SiLU too)", 1, "in_x"),
     MAMBA),
    (mamba, "project_x", _matmul("Mamba x_proj, both directions (batched)", 1, "x_proj"),
     MAMBA),
    (mamba, "merge",
     _matmul("BiMamba merge: out_projs folded into output_proj, then LayerNorm, + residual", 2,
             "merge_y"),
     BIMAMBA),
    (nn, "silu", "SiLU (unfused, MLX ops)", MAMBA),
    (semamba, "stft", "STFT (frames, rfft, log1p |X|, atan2)", WAVE),
    (semamba, "istft", "iSTFT (irfft, overlap-add, envelope)", WAVE),
    (semamba, "suppress_sweeps", "sweep-artifact filter", WAVE),
)


#: The module methods the model calls: __call__; Conv2d.direct (a conv read straight from its
#: input planes, which the dense blocks try first; where it returns None, the backend has no
#: such kernel and the call is not counted); Conv2d.of_padded (a dense layer's time tile).
TIMED_METHODS = ("__call__", "direct", "of_padded")


@contextmanager
def instrumented(model, profiler: Profiler):
    """Wrap every module of `model` and the functions in FUNCTIONS; restore them on exit."""
    timed_classes: dict[type, type] = {}
    labels: dict[int, tuple[str, str]] = {}
    swapped = []

    def timed(cls: type, method: str):
        def run(self, *args, **kwargs):
            label, group = labels[id(self)]
            return profiler.run(label, group,
                                lambda *a, **k: getattr(cls, method)(self, *a, **k), args, kwargs)
        return run

    def timed_class(cls: type) -> type:
        if cls not in timed_classes:
            methods = {m: timed(cls, m) for m in TIMED_METHODS if hasattr(cls, m)}
            timed_classes[cls] = type(f"Profiled{cls.__name__}", (cls,), methods)
        return timed_classes[cls]

    with ExitStack() as stack:
        for path, module in model.named_modules():
            cls = type(module)
            labels[id(module)] = module_label(path, module)
            module.__class__ = timed_class(cls)
            swapped.append((module, cls))
        stack.callback(lambda: [setattr(m, "__class__", c) for m, c in swapped])
        for owner, name, label, group in FUNCTIONS:
            original = getattr(owner, name, None)
            if original is None:
                continue

            def wrapper(*args, _fn=original, _label=label, _group=group, **kwargs):
                text = _label(args, kwargs) if callable(_label) else _label
                return profiler.run(text, _group, _fn, args, kwargs)

            setattr(owner, name, wrapper)
            stack.callback(setattr, owner, name, original)
        yield


def run_profile(model, audio, sample_rate: int, *, strict: bool = False, runs: int = 1,
                warmup: int = 0, log=print) -> dict:
    """Profile `runs` enhancements (after `warmup` profiled ones); also time unprofiled runs."""
    gpu = kernels.backend() != "cpu"
    x = mx.array(audio[None])
    mx.eval(x)

    def profiled() -> tuple[Profiler, float, mx.array]:
        profiler = Profiler(gpu)
        t0 = time.perf_counter()
        with instrumented(model, profiler):
            y = profiler.run("waveform glue", WAVE, model.enhance, (x, sample_rate),
                             {"strict": strict})
        return profiler, time.perf_counter() - t0, y

    for i in range(warmup):
        profiled()
        log(f"profile warm-up {i + 1}/{warmup} done")
    mx.reset_peak_memory()
    results = []
    for i in range(runs):
        results.append(profiled())
        log(f"profiled run {i + 1}/{runs}: {results[-1][1]:.3f} s")
    plain = []
    for i in range(runs):
        t0 = time.perf_counter()
        y = model.enhance(x, sample_rate, strict=strict)
        mx.eval(y)
        if gpu:
            mx.synchronize()
        plain.append(time.perf_counter() - t0)
        log(f"unprofiled run {i + 1}/{runs}: {plain[-1]:.3f} s")
    y_profiled = results[-1][2]
    difference = float(mx.max(mx.abs(y - y_profiled)).item())
    scale = float(mx.max(mx.abs(y)).item())
    first = results[0][0]
    rows = []
    for name in first.total:
        times = [p.total.get(name, 0.0) for p, _, _ in results]
        rows.append({"group": first.group[name], "component": name, "calls": first.calls[name],
                     "total_s": statistics.median(times), "runs_s": times})
    measured = sum(r["total_s"] for r in rows)
    groups: dict[str, float] = defaultdict(float)
    for r in rows:
        r["share"] = r["total_s"] / measured
        groups[r["group"]] += r["total_s"]
    for r in rows:
        r["share_of_mamba"] = r["total_s"] / groups[MAMBA] if r["group"] == MAMBA else None
    rows.sort(key=lambda r: r["total_s"], reverse=True)
    return {
        "seconds": len(audio) / sample_rate, "rate": sample_rate,
        "mode": "strict" if strict else "standard", "runs": runs, "warmup": warmup,
        "components": rows,
        "groups": dict(sorted(groups.items(), key=lambda kv: -kv[1])),
        "sum_of_components_s": measured,
        "profiled_wall_s": statistics.median(w for _, w, _ in results),
        "unprofiled_wall_s": statistics.median(plain), "unprofiled_runs_s": plain,
        "profiled_vs_plain_max_abs": difference, "output_max_abs": scale,
        "mlx_peak_bytes": int(mx.get_peak_memory()),
    }

