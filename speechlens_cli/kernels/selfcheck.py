"""Each GPU kernel variant checked against the MLX-ops path before its first use.

The Metal kernels (and CUDA's JIT ones, ``mx.fast.cuda_kernel``, where the precompiled path is
unavailable) are compiled by the machine's own GPU compiler, which MLX reaches only when a
kernel is evaluated; one that compiles may still compute wrong values on a GPU or compiler it
was never run on. So before a dispatch first takes a variant (kernel, backend, template values:
DI, SILU, STRICT, the fused dt rank, the launch's threads), it is run once on a small random
input and compared with the MLX-ops path (fallback.py; for the two-direction kernels the
single-direction ops composed per direction). A compile error, a run error or a mismatch gives
the verdict ``failed: <reason>``: the dispatch then takes the variant's fallback for the rest of
the run, after one warning. The CPU path is never checked (its library is built and tested
with the package).

Verdicts are kept in ``cache_dir()/kernel-checks.json``: the file names the MLX version, the
GPU and the operating system it holds verdicts for (any other is ignored and replaced), and
each verdict the hash of its kernel's sources, so a new MLX, a new GPU, an OS update (a new
Metal compiler) or changed sources check again. The file is read once per process and written
atomically; deleting it forces a re-check.
"""

from __future__ import annotations

import functools
import hashlib
import json
import platform
import threading
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import numpy as np

from . import gpu
from .contract import CONV_WIDTH, D_STATE, in_time_order
from .fallback import conv1d_fallback, selective_scan_ops, two_direction_delta_raw
from .notices import warn_once
from .sources import cache_dir, store_in_cache

#: Largest relative RMS error (||kernel - ops|| / ||ops||) a kernel may show against the
#: MLX-ops path. Both are float32 and differ only by rounding order, FMA contraction and (the
#: standard scan) the GPU's fast exp/exp2: ~1e-7 (docs/kernels.md: 5.0e-8 to 1.8e-7 relative
#: RMS against float64). 1e-5 is the bound tests/test_kernels.py holds every
#: backend's kernels to against float64, 100x that rounding, while a wrong tap, step, channel,
#: stride or template value gives errors of 1e-2 and more.
TOLERANCE = 1e-5
OK = "ok"
FAILED = "failed: "
VERDICTS_FILE = "kernel-checks.json"
#: The check's input: 2 sequences (batch indexing) of 37 steps: more than the CUDA scan's chunk
#: of 32 steps (strict) and not a multiple of 16 (standard), so a partial chunk runs too.
CHECK_BATCH, CHECK_LENGTH = 2, 37
_SEED = 20261205
_REASON_CHARS = 400

_lock = threading.Lock()
_verdicts: dict[str, str] = {}  # this process's verdicts, by Variant.key
_stored: dict[str, dict[str, dict[str, str]]] = {}  # the file's entries, by identity


@dataclass(frozen=True)
class Variant:
    """One compiled kernel: `kernel` (causal_conv1d, bimamba_conv, selective_scan,
    bimamba_scan) on `which` (metal, cuda) with its template values."""

    kernel: str
    which: str
    channels: int  # DI
    silu: bool = False  # the convs: SiLU fused in the kernel (CUDA)
    strict: bool = False  # the scans
    rank: int = 0  # CUDA's single-direction scan: rank of the dt projection it applies, or 0

    @property
    def is_conv(self) -> bool:
        return self.kernel in ("causal_conv1d", "bimamba_conv")

    @property
    def name(self) -> str:
        """The kernel and its mode, as doctor lists it beside the backend and DI."""
        if self.is_conv:
            return self.kernel + (" SiLU" if self.silu else "")
        return (f"{self.kernel} {'strict' if self.strict else 'standard'}"
                + (f" R={self.rank}" if self.rank else ""))

    @property
    def key(self) -> str:
        """Everything that makes it another compiled kernel or launch, the threads included
        (SPEECHLENS_GPU_THREADGROUP changes them)."""
        cuda_scan = self.which == "cuda" and self.kernel == "selective_scan"
        threads = gpu.cuda_scan_threads() if cuda_scan else gpu.threadgroup()
        return f"{self.which} {self.name} DI={self.channels} threads={threads}"


def works(variant: Variant) -> bool:
    """Whether the dispatch may launch `variant`: its verdict is ``ok``."""
    return verdict(variant) == OK


def verdict(variant: Variant) -> str:
    """``ok`` or ``failed: <reason>``: from this process's memory, else the verdicts file (read
    once), else checked now and stored. A failed verdict is logged once per process."""
    key = variant.key
    with _lock:
        result = _verdicts.get(key)
        if result is None:
            identity = _identity(variant.which)
            sources = sources_hash(variant.kernel, variant.which)
            entry = _entries(identity).get(key)
            if entry is not None and entry["sources"] == sources:
                result = entry["verdict"]
            else:
                result = _check(variant)
                _store(identity, key, {"sources": sources, "verdict": result})
            _verdicts[key] = result
    if result != OK:
        warn_once(f"selfcheck {key}",
                  f"kernel self-check: {key}: {result}; this run uses {_replacement(variant)} "
                  f"instead")
    return result


def _replacement(variant: Variant) -> str:
    return {"causal_conv1d": "mx.conv1d", "selective_scan": "the scan in MLX ops",
            "bimamba_conv": "each direction's causal_conv1d",
            "bimamba_scan": "each direction's selective_scan"}[variant.kernel]


def verdicts_file() -> Path:
    return cache_dir() / VERDICTS_FILE


def forget() -> None:
    """Drop this process's verdicts and its copy of the file (tests: a new process)."""
    with _lock:
        _verdicts.clear()
        _stored.clear()
    sources_hash.cache_clear()


@functools.cache
def sources_hash(kernel: str, which: str) -> str:
    """sha256 of what `kernel` is compiled from on `which` (gpu.kernel_sources)."""
    body, header = gpu.kernel_sources(kernel, which)
    return hashlib.sha256(f"{header}\0{body}".encode()).hexdigest()


def device_name(which: str) -> str:
    """The GPU and the operating system (whose update brings a new Metal compiler)."""
    try:
        info = mx.device_info(mx.gpu)
    except Exception:  # noqa: BLE001 - an MLX without a GPU device: the backend names it
        info = {}
    gpu_name = " ".join(str(info[k]) for k in ("device_name", "architecture") if k in info)
    return f"{which} {gpu_name or 'unknown GPU'}; {platform.platform()}"


def _identity(which: str) -> dict[str, str]:
    return {"mlx": mx.__version__, "device": device_name(which)}


# ----------------------------------------------------------------------------- the file ------

def _entries(identity: dict[str, str]) -> dict[str, dict[str, str]]:
    """The file's verdicts for this identity, read once per process."""
    tag = json.dumps(identity, sort_keys=True)
    if tag not in _stored:
        _stored[tag] = _read(verdicts_file(), identity)
    return _stored[tag]


def _read(path: Path, identity: dict[str, str]) -> dict[str, dict[str, str]]:
    """The valid entries of the file at `path` if it holds verdicts for `identity`, else none
    (missing, unreadable, not JSON, another MLX, GPU or OS: all read as no verdicts)."""
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):  # RecursionError: JSON nested too deep
        return {}
    if not isinstance(data, dict) or any(data.get(k) != v for k, v in identity.items()):
        return {}
    verdicts = data.get("verdicts")
    if not isinstance(verdicts, dict):
        return {}
    return {key: entry for key, entry in verdicts.items()
            if isinstance(entry, dict) and isinstance(entry.get("sources"), str)
            and isinstance(entry.get("verdict"), str)
            and (entry["verdict"] == OK or entry["verdict"].startswith(FAILED))}


def _store(identity: dict[str, str], key: str, entry: dict[str, str]) -> None:
    """Add one verdict to the file: the file as it is now (other processes may have added
    verdicts since it was read) plus this one, written atomically. Two processes writing at
    once may lose one of their verdicts, which is then checked again by a later process."""
    path = verdicts_file()
    entries = {**_read(path, identity), key: entry}
    text = json.dumps({**identity, "verdicts": entries}, indent=1, sort_keys=True)
    store_in_cache(path, text.encode())


# ----------------------------------------------------------------------------- the check -----

def _check(variant: Variant) -> str:
    """Run the variant on a small random input and compare it with the MLX-ops path."""
    try:
        candidate, expected = (_conv_pair if variant.is_conv else _scan_pair)(variant)
        mx.eval(candidate, expected)
        got = np.asarray(candidate, dtype=np.float64)
        want = np.asarray(expected, dtype=np.float64)
        if got.shape != want.shape:
            return f"{FAILED}output shape {got.shape}, expected {want.shape}"
        error = float(np.sqrt(np.sum((got - want) ** 2) / max(np.sum(want ** 2), 1e-30)))
    except Exception as exc:  # noqa: BLE001 - a compile or run error is the verdict
        reason = " ".join(f"{type(exc).__name__}: {exc}".split())
        return FAILED + reason[:_REASON_CHARS]
    if not error <= TOLERANCE:  # NaN fails too
        return (f"{FAILED}relative RMS error {error:.2e} against the MLX-ops path, above the "
                f"tolerance {TOLERANCE:.0e}")
    return OK


def _random(count: int) -> list[mx.array]:
    """Keys for the check's inputs: its own, so MLX's global random state is left as it was."""
    return list(mx.random.split(mx.random.key(_SEED), count))


def _conv_pair(v: Variant) -> tuple[mx.array, mx.array]:
    """The conv over both directions' inputs side by side, x [B, L, 2D], as the model has
    them: the single-direction kernel once per direction (the backward one on a time-reversed
    strided view, as the dispatch's fallback passes it), the two-direction kernel in one
    launch; against mx.conv1d per direction."""
    k_x, k_w, k_b = _random(3)
    d = v.channels
    x = mx.random.normal((CHECK_BATCH, CHECK_LENGTH, 2 * d), key=k_x)
    weight = mx.random.normal((2, d, CONV_WIDTH, 1), key=k_w)
    bias = mx.random.normal((2, d), key=k_b)

    def per_direction(conv) -> mx.array:
        return mx.stack([in_time_order(conv(in_time_order(x, k)[..., k * d:(k + 1) * d],
                                            weight[k], bias[k]), k) for k in (0, 1)])

    expected = per_direction(conv1d_fallback)
    if v.silu:
        expected = expected * mx.sigmoid(expected)
    if v.kernel == "bimamba_conv":
        return gpu.gpu_bimamba_conv(x, weight, bias, v.which, silu=v.silu), expected
    return per_direction(lambda *a: gpu.gpu_conv(*a, v.which, silu=v.silu)), expected


def _scan_pair(v: Variant) -> tuple[mx.array, mx.array]:
    """Both directions' scans from the model's layout (u [2, B, L, D], z [B, L, 2D], B, C and
    dt's rank-R input column slices of x_proj's output): the two-direction kernel in one
    launch, the single-direction one per direction (the backward one on time-reversed strided
    views, as the dispatch's fallback passes them; the dt projection applied by the kernel
    where the variant has a rank); against selective_scan_ops per direction."""
    k_u, k_z, k_dbl, k_w, k_b, k_a, k_d = _random(7)
    d, rank, n = v.channels, max(v.rank, 1), D_STATE
    u = mx.random.normal((2, CHECK_BATCH, CHECK_LENGTH, d), key=k_u)
    z = mx.random.normal((CHECK_BATCH, CHECK_LENGTH, 2 * d), key=k_z)
    x_dbl = mx.random.normal((2, CHECK_BATCH, CHECK_LENGTH, rank + 2 * n), key=k_dbl)
    dt_proj = (mx.random.normal((2, d, rank), scale=0.5, key=k_w),
               mx.random.normal((2, d), loc=-1.0, scale=0.5, key=k_b))
    A_log = mx.log(mx.random.uniform(0.5, 16.0, (2, d, n), key=k_a))
    D = mx.random.normal((2, d), key=k_d)
    Bs, Cs = x_dbl[..., rank:rank + n], x_dbl[..., rank + n:]
    delta_raw = two_direction_delta_raw(x_dbl, dt_proj)

    def per_direction(scan, delta) -> mx.array:
        return mx.concatenate([in_time_order(scan(
            k, in_time_order(u[k], k), in_time_order(delta[k], k), A_log[k],
            in_time_order(Bs[k], k), in_time_order(Cs[k], k), D[k],
            in_time_order(z, k)[..., k * d:(k + 1) * d]), k) for k in (0, 1)], axis=-1)

    expected = per_direction(lambda _, *a: selective_scan_ops(*a, strict=v.strict), delta_raw)
    if v.kernel == "bimamba_scan":
        candidate = gpu.metal_bimamba_scan(u, delta_raw, z, Bs, Cs, A_log, D, v.strict)
    elif v.rank:
        candidate = per_direction(lambda k, *a: gpu.gpu_scan(
            *a, v.strict, v.which, dt_proj=(dt_proj[0][k], dt_proj[1][k])), x_dbl[..., :rank])
    else:
        candidate = per_direction(lambda _, *a: gpu.gpu_scan(*a, v.strict, v.which), delta_raw)
    return candidate, expected
