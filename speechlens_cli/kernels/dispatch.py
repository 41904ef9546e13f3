"""Which implementation runs each kernel call: one table per operation, one function walks it.

Every operation the model calls (causal_conv1d, selective_scan, bimamba_conv, bimamba_scan,
project, project_conv, conv2d, instance_norm_prelu) has a table (OPERATIONS): per backend
(``cpu``, ``metal``, ``cuda``: backend()), its implementations in the order they are tried.
Each is an :class:`Implementation`: a name, a `skip` predicate that says why it cannot run on
this machine with these settings (a setting turned it off, no library, no compiler, a GPU too
old; None where it can) and a `run` that returns None where it does not take the operands (a
shape it does not support, a failed self-check) or the result. `_dispatch` walks the table
of the backend in use: the first implementation not skipped that returns a result is the one
that runs; the last of each table always runs (MLX ops), except for conv2d and
instance_norm_prelu, whose last entry is the caller's own MLX form (None to the caller).
`dispatch_table()` evaluates every `skip` for ``speechlens doctor --json``, and `explain()`
says, for given operands, what each implementation did (tests).

Per call the walk costs a loop over two or three entries and their predicates (settings are
read at each use, as everywhere; the CPU library, NVRTC, the compute capability, the
precompiled kernels' probe per D and the self-check verdicts are cached where they are made).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import mlx.core as mx

from .. import runtime, settings
from . import cpu_ops, cuda_conv2d, cuda_packed, cuda_projection, gpu, selfcheck
from .contract import (
    CONV_WIDTH,
    D_STATE,
    KernelInputError,
    LayerNormSpec,
    in_time_order,
    validate_bimamba_conv,
    validate_bimamba_scan,
    validate_conv,
    validate_scan,
)
from .cpu_binding import cpu_isa, cpu_library, cpu_library_errors, cpu_threads
from .cpu_ops import (
    cpu_bimamba_conv,
    cpu_bimamba_scan,
    cpu_conv,
    cpu_conv2d,
    cpu_project,
    cpu_scan,
    fusable_dt_proj,
)
from .fallback import conv1d_fallback, selective_scan_ops, two_direction_delta_raw
from .gpu import CUDA_MAX_DT_RANK, launch_description
from .notices import warn_once
from .nvrtc import compute_capability, nvrtc

DISABLE_CONV_ENV = settings.DISABLE_CONV1D.name
DISABLE_CONV_ENV_ALIAS = settings.DISABLE_CONV1D_ALIAS.name
BACKENDS = ("cpu", "metal", "cuda")

def gpu_backend() -> str | None:
    """``"metal"`` or ``"cuda"`` when this MLX build has that GPU backend, else None
    (runtime.gpu_backend)."""
    return runtime.gpu_backend()


def backend() -> str:
    """``"metal"``, ``"cuda"`` or ``"cpu"``: where the kernels run for the default device
    (runtime.current)."""
    return runtime.current().backend



# ------------------------------------------------------------------------- the table's parts


@dataclass(frozen=True)
class Implementation:
    """One way to run an operation on one backend. `skip()`: why it cannot run here (a
    sentence naming the setting, library or hardware), None where it can; `run(*operands)`:
    the result, or None where it does not take these operands (the walk goes on)."""

    name: str
    run: Callable
    skip: Callable[[], str | None] | None = None


@dataclass(frozen=True)
class Operation:
    """An operation's implementations per backend, in the order they are tried. `warns`: a
    skipped implementation is logged once per reason (the conv, whose fallback is slower)."""

    name: str
    table: dict[str, tuple[Implementation, ...]]
    warns: bool = False


def _dispatch(op: Operation, which: str, operands: tuple, trace: list | None = None):
    """Walk `op`'s table for backend `which`: the result of the first implementation that is
    not skipped and takes the operands; None where none does (conv2d and instance_norm_prelu:
    the caller's MLX form). `trace` collects (implementation, what happened) for explain()."""
    for impl in op.table[which]:
        if impl.skip is not None:
            why = impl.skip()
            if why is not None:
                if trace is not None:
                    trace.append((impl.name, f"skipped: {why}"))
                if op.warns:
                    warn_once(f"{op.name}: {why}", f"{op.name}: {impl.name} skipped ({why}); "
                              f"using {_next_name(op, which, impl)}")
                continue
        out = impl.run(*operands)
        if trace is not None:
            trace.append((impl.name, "ran" if out is not None or impl is _CALLER_MLX
                          else "declined"))
        if out is not None:
            return out
    return None


def _next_name(op: Operation, which: str, impl: Implementation) -> str:
    impls = op.table[which]
    return impls[impls.index(impl) + 1].name


def _turned_off(setting: settings.Setting) -> str:
    return f"turned off by {setting.shown()}"


def conv_kernel_disabled() -> bool:
    return _conv_kernel_off() is not None


def _conv_kernel_off() -> str | None:
    """Why the conv kernels do not run: SPEECHLENS_DISABLE_METAL_CONV1D or its alias."""
    for setting in (settings.DISABLE_CONV1D, settings.DISABLE_CONV1D_ALIAS):
        if setting.value():
            return _turned_off(setting)
    return None


def _no_cpu_library() -> str | None:
    if cpu_library() is not None:
        return None
    errors = cpu_library_errors()
    return "no CPU kernel library" + (f" ({'; '.join(errors)})" if errors else "")


def _no_precompiled() -> str | None:
    """Why the CUDA kernels compiled once per machine by NVRTC (cuda_packed.py) cannot run."""
    if cuda_packed.unusable():
        return f"the precompiled kernels failed ({cuda_packed.unusable_reason()})"
    if nvrtc() is None:
        return "no NVRTC library (pip install nvidia-cuda-nvrtc)"
    if compute_capability() is None:
        return "no CUDA driver answered"
    return None


def _no_tensor_cores(*switches: settings.Setting) -> Callable[[], str | None]:
    """Why a kernel on sl_gemm_cuda.h cannot run (cuda_projection.tensor_cores_problem): one
    of its `switches` is off, the GPU has no TF32 mma, the precompiled kernels failed."""
    return _first(*(partial(cuda_projection.tensor_cores_problem, switch)
                    for switch in switches))


def _first(*skips: Callable[[], str | None]) -> Callable[[], str | None]:
    def skip() -> str | None:
        for one in skips:
            why = one()
            if why is not None:
                return why
        return None
    return skip


def _backend_missing(which: str) -> str | None:
    """Why backend `which` does not run here at all (for dispatch_table)."""
    if which == "cpu" or gpu_backend() == which:
        return None
    if which == "metal":
        return "this MLX build has no Metal backend"
    return "this MLX build has no CUDA backend"


# ------------------------------------------------------------------------------ causal_conv1d


def causal_conv1d(x: mx.array, weight: mx.array, bias: mx.array, silu: bool = False) -> mx.array:
    """x [B, L, D], weight [D, 4, 1] (MLX layout), bias [D] -> [B, L, D], zero causal padding.

    ``silu=True`` returns SiLU(conv): fused into the CPU kernel (MLX's CPU sigmoid is scalar and
    cost more than the conv itself, measured) and the CUDA kernel (the separate op doubled the
    conv's time on an H200); a separate op on Metal, where fusing it measured slower than MLX's
    own sigmoid.
    """
    y, fused = _dispatch(CAUSAL_CONV1D, backend(), (x, weight, bias, silu))
    return y * mx.sigmoid(y) if silu and not fused else y


def _conv_kernel(which: str, launch: Callable) -> Callable:
    """A conv kernel's run: the inputs validated (a failure: one warning, the fallback), a
    failure of the kernel itself the same."""
    def run(x, weight, bias, silu):
        try:
            validate_conv(x, weight, bias)
        except KernelInputError as exc:
            warn_once("conv-validation", f"causal_conv1d: {exc}; using mx.conv1d")
            return None
        try:
            return launch(x, weight, bias, silu)
        except Exception as exc:  # noqa: BLE001 - a dispatch failure means: use the fallback
            warn_once(f"conv-dispatch-{which}",
                      f"causal_conv1d: the {which} kernel failed ({exc}); using mx.conv1d")
            return None
    return run


def _cpu_conv(x, weight, bias, silu):
    return cpu_conv(cpu_library(), x, weight, bias, silu), silu


def _gpu_conv(which: str) -> Callable:
    def launch(x, weight, bias, silu):
        fuse = silu and which == "cuda"
        if selfcheck.works(selfcheck.Variant("causal_conv1d", which, int(x.shape[2]),
                                             silu=fuse)):
            return gpu.gpu_conv(x, weight, bias, which, silu=fuse), fuse
        return None
    return launch


def _mlx_conv(x, weight, bias, silu):
    return conv1d_fallback(x, weight, bias), False


_MLX_CONV = Implementation("mlx", _mlx_conv)
CAUSAL_CONV1D = Operation("causal_conv1d", {
    "cpu": (Implementation("cpu-library", _conv_kernel("cpu", _cpu_conv),
                           _first(_conv_kernel_off, _no_cpu_library)), _MLX_CONV),
    "metal": (Implementation("metal-kernel", _conv_kernel("metal", _gpu_conv("metal")),
                             _conv_kernel_off), _MLX_CONV),
    "cuda": (Implementation("cuda-jit", _conv_kernel("cuda", _gpu_conv("cuda")),
                            _conv_kernel_off), _MLX_CONV),
}, warns=True)


# ----------------------------------------------------------------------------- selective_scan


def selective_scan(
    u: mx.array,
    delta_raw: mx.array,
    A_log: mx.array,
    B: mx.array,
    C: mx.array,
    D: mx.array,
    z: mx.array,
    strict: bool = False,
    dt_proj: tuple[mx.array, mx.array] | None = None,
) -> mx.array:
    """y_t = C_t . h_t + D*u_t with h_t = exp(dt*A) h_{t-1} + dt*B_t*u_t, then y * SiLU(z).

    dt = softplus(delta_raw), A = -exp(A_log). u, delta_raw, z [B, L, D]; B, C [B, L, 16];
    A_log [D, 16]; D [D]; all float32. ``strict`` selects strict mode (docs/kernels.md).

    ``dt_proj=(weight [D, R], bias [D])`` passes delta_raw as the rank-R input [B, L, R] of the
    dt projection instead: the CPU and CUDA kernels apply it per step (a K=R GEMM is slow, and
    its [B, L, D] output costs a memory round trip and as much memory as u); on Metal it runs as
    a matmul first (the fusion measured slower on Apple GPUs in the design this project comes
    from). A bad input is a KernelInputError on every backend.
    """
    return _dispatch(SELECTIVE_SCAN, backend(),
                     (u, delta_raw, A_log, B, C, D, z, strict, dt_proj))


def _projected(dt_input: mx.array, dt_proj: tuple[mx.array, mx.array]) -> mx.array:
    """delta_raw from the dt projection's rank-R input, for a scan that does not apply it."""
    weight, bias = dt_proj
    return mx.addmm(bias, dt_input, weight.T)


def _cpu_scan(u, delta_raw, A_log, B, C, D, z, strict, dt_proj):
    lib = cpu_library()
    if dt_proj is not None and not fusable_dt_proj(lib, u, delta_raw, dt_proj):
        delta_raw, dt_proj = _projected(delta_raw, dt_proj), None
    validate_scan(u, delta_raw, A_log, B, C, D, z, dt_proj)
    return cpu_scan(lib, u, delta_raw, A_log, B, C, D, z, strict, dt_proj=dt_proj)


def _gpu_scan(which: str) -> Callable:
    """The JIT scan (self-checked): on CUDA with a dt projection of rank up to
    CUDA_MAX_DT_RANK applied per step, on Metal after its matmul."""
    def run(u, delta_raw, A_log, B, C, D, z, strict, dt_proj):
        if dt_proj is not None and not (which == "cuda" and delta_raw.ndim == 3
                                        and delta_raw.shape[2] <= CUDA_MAX_DT_RANK):
            delta_raw, dt_proj = _projected(delta_raw, dt_proj), None
        validate_scan(u, delta_raw, A_log, B, C, D, z, dt_proj)
        rank = 0 if dt_proj is None else int(delta_raw.shape[2])
        if selfcheck.works(selfcheck.Variant("selective_scan", which, int(u.shape[2]),
                                             strict=strict, rank=rank)):
            return gpu.gpu_scan(u, delta_raw, A_log, B, C, D, z, strict, which, dt_proj=dt_proj)
        return None
    return run


def _mlx_scan(u, delta_raw, A_log, B, C, D, z, strict, dt_proj):
    if dt_proj is not None:
        delta_raw = _projected(delta_raw, dt_proj)
    validate_scan(u, delta_raw, A_log, B, C, D, z)
    return selective_scan_ops(u, delta_raw, A_log, B, C, D, z, strict)


_MLX_SCAN = Implementation("mlx", _mlx_scan)
SELECTIVE_SCAN = Operation("selective_scan", {
    "cpu": (Implementation("cpu-library", _cpu_scan, _no_cpu_library), _MLX_SCAN),
    "metal": (Implementation("metal-kernel", _gpu_scan("metal")), _MLX_SCAN),
    "cuda": (Implementation("cuda-jit", _gpu_scan("cuda")), _MLX_SCAN),
})


# ------------------------------------------------------------------------------- bimamba_conv


def bimamba_conv(x: mx.array, weight: mx.array, bias: mx.array) -> mx.array:
    """SiLU(conv) of both directions of a BiMamba -> [2, B, L, D].

    x [B, L, 2D] holds the two directions' conv inputs side by side (the forward one, then the
    backward one); weight [2, D, 4, 1], bias [2, D]. [0] is the causal conv of x[..., :D];
    [1] the backward direction's: the causal conv of the time-reversed x[..., D:], returned in
    time order. On CUDA, Metal and the CPU one call does both and the backward direction reads
    the sequence from its end (nothing is flipped); elsewhere each direction is causal_conv1d
    on a time-reversed view."""
    validate_bimamba_conv(x, weight, bias)
    return _dispatch(BIMAMBA_CONV, backend(), (x, weight, bias))


def _packed_conv(x, weight, bias):
    if _packed_works(int(weight.shape[1])):
        return cuda_packed.bimamba_conv(x, weight, bias)
    return None


def _cpu_bimamba_conv(x, weight, bias):
    return cpu_bimamba_conv(cpu_library(), x, weight, bias)


def _gpu_bimamba_conv(which: str) -> Callable:
    fuse = which == "cuda"  # as in causal_conv1d: SiLU as its own op on Metal

    def run(x, weight, bias):
        if not selfcheck.works(selfcheck.Variant("bimamba_conv", which, int(weight.shape[1]),
                                                 silu=fuse)):
            return None
        y = gpu.gpu_bimamba_conv(x, weight, bias, which, silu=fuse)
        return y if fuse else y * mx.sigmoid(y)
    return run


def _conv_per_direction(x, weight, bias):
    channels = int(weight.shape[1])
    return mx.stack([in_time_order(causal_conv1d(
        in_time_order(x, k)[..., k * channels:(k + 1) * channels], weight[k], bias[k],
        silu=True), k) for k in (0, 1)])


_CONV_PER_DIRECTION = Implementation("per-direction", _conv_per_direction)
BIMAMBA_CONV = Operation("bimamba_conv", {
    "cpu": (Implementation("cpu-library", _cpu_bimamba_conv,
                           _first(_conv_kernel_off, _no_cpu_library)), _CONV_PER_DIRECTION),
    "metal": (Implementation("metal-kernel", _gpu_bimamba_conv("metal"), _conv_kernel_off),
              _CONV_PER_DIRECTION),
    "cuda": (Implementation("cuda-precompiled", _packed_conv,
                            _first(_conv_kernel_off, _no_precompiled)),
             Implementation("cuda-jit", _gpu_bimamba_conv("cuda"), _conv_kernel_off),
             _CONV_PER_DIRECTION),
})


# ------------------------------------------------------------------------------- bimamba_scan


def bimamba_scan(u: mx.array, x_dbl: mx.array, z: mx.array, A_log: mx.array, D: mx.array,
                 dt_proj: tuple[mx.array, mx.array], strict: bool = False) -> mx.array:
    """The scans of both directions of a BiMamba -> [B, L, 2D]: columns [0, D) the forward
    direction's y * SiLU(z), [D, 2D) the backward direction's, in time order.

    u [2, B, L, D] is bimamba_conv's output, x_dbl [2, B, L, R + 2*16] the x_proj outputs
    (dt's rank-R input, B, C), z [B, L, 2D] the gates side by side, A_log [2, D, 16], D [2, D],
    dt_proj=(weight [2, D, R], bias [2, D]). On CUDA, Metal and the CPU one call does both
    (the backward direction from the sequence's end); elsewhere (CUDA without its compiled
    kernels, a CPU without the library) each direction is selective_scan on time-reversed
    views."""
    validate_bimamba_scan(u, x_dbl, z, A_log, D, dt_proj)
    return _dispatch(BIMAMBA_SCAN, backend(), (u, x_dbl, z, A_log, D, dt_proj, strict))


def _packed_scan(u, x_dbl, z, A_log, D, dt_proj, strict):
    if int(dt_proj[0].shape[-1]) <= CUDA_MAX_DT_RANK and _packed_works(int(u.shape[-1])):
        return cuda_packed.bimamba_scan(u, x_dbl, z, A_log, D, dt_proj, strict)
    return None


def _cpu_bimamba_scan(u, x_dbl, z, A_log, D, dt_proj, strict):
    return cpu_bimamba_scan(cpu_library(), u, x_dbl, z, A_log, D, dt_proj, strict)


def _metal_bimamba_scan(u, x_dbl, z, A_log, D, dt_proj, strict):
    rank, n = int(dt_proj[0].shape[-1]), D_STATE
    if not selfcheck.works(selfcheck.Variant("bimamba_scan", "metal", int(u.shape[-1]),
                                             strict=strict)):
        return None
    # the dt projection as a matmul first, as in selective_scan
    return gpu.metal_bimamba_scan(u, two_direction_delta_raw(x_dbl, dt_proj), z,
                                  x_dbl[..., rank:rank + n], x_dbl[..., rank + n:], A_log, D,
                                  strict)


def _scan_per_direction(u, x_dbl, z, A_log, D, dt_proj, strict):
    weight, bias = dt_proj
    rank, channels, n = int(weight.shape[-1]), int(u.shape[-1]), D_STATE
    outs = []
    for k in (0, 1):
        dbl = in_time_order(x_dbl[k], k)
        outs.append(in_time_order(selective_scan(
            in_time_order(u[k], k), dbl[..., :rank], A_log[k], dbl[..., rank:rank + n],
            dbl[..., rank + n:], D[k], in_time_order(z, k)[..., k * channels:(k + 1) * channels],
            strict=strict, dt_proj=(weight[k], bias[k])), k))
    return mx.concatenate(outs, axis=-1)


_SCAN_PER_DIRECTION = Implementation("per-direction", _scan_per_direction)
BIMAMBA_SCAN = Operation("bimamba_scan", {
    "cpu": (Implementation("cpu-library", _cpu_bimamba_scan, _no_cpu_library),
            _SCAN_PER_DIRECTION),
    "metal": (Implementation("metal-kernel", _metal_bimamba_scan), _SCAN_PER_DIRECTION),
    "cuda": (Implementation("cuda-precompiled", _packed_scan, _no_precompiled),
             _SCAN_PER_DIRECTION),
})


# -------------------------------------------------------------------- project, project_conv


def project(terms: list[tuple[mx.array, mx.array]], bias: mx.array | None = None,
            norm: LayerNormSpec | None = None, residual: mx.array | None = None) -> mx.array:
    """sum(a @ w for a, w in terms) + bias, then `norm`'s LayerNorm of each output row if
    given, then + `residual` if given (an array of the result's shape): the model's projections
    (one or two terms, weights [K, N], or [NB, K, N] for a batch of NB row sets a [NB, ..., K]).

    On the CPU, the CPU library's register tiles (cpu_ops.cpu_project: 2-3x the BLAS at these
    shapes), the LayerNorm applied to each row block while it is in cache; on CUDA (compute
    capability 8.0+), one kernel at float32 accuracy on the tensor cores with the LayerNorm and,
    where it is the first term's input, the residual in its store (cuda_projection.py;
    SPEECHLENS_CUDA_PROJECTION=0 turns it off); elsewhere MLX's matmul, the terms added in
    order. Without the CPU library, the LayerNorm is MLX's; a residual the kernel did not add
    is MLX's add."""
    y, normed, added = _dispatch(PROJECT, backend(), (terms, bias, norm, residual))
    if norm is not None and not normed:
        y = mx.fast.layer_norm(y, norm.weight, norm.bias, norm.eps)
    return y if residual is None or added else y + residual


def _cpu_project(terms, bias, norm, residual):
    y = cpu_project(terms, bias, norm)
    return None if y is None else (y, True, False)


def _mlx_project(terms, bias, norm, residual):
    (a, w), rest = terms[0], terms[1:]
    y = a @ w if bias is None else mx.addmm(bias, a, w)
    for a, w in rest:
        y = mx.addmm(y, a, w)
    return y, False, False


_MLX_PROJECT = Implementation("mlx", _mlx_project)
PROJECT = Operation("project", {
    "cpu": (Implementation("cpu-library", _cpu_project, _no_cpu_library), _MLX_PROJECT),
    "metal": (_MLX_PROJECT,),
    "cuda": (Implementation("cuda-tensor-cores", lambda *operands: cuda_projection.project(
        *operands), _no_tensor_cores(settings.CUDA_PROJECTION)), _MLX_PROJECT),
})


def project_conv(x: mx.array, w: mx.array, conv_weight: mx.array,
                 conv_bias: mx.array) -> mx.array:
    """bimamba_conv(project([(x, w)]), conv_weight, conv_bias): a BiMamba's in_proj
    conv-input half, both directions' conv and SiLU -> [2, B, L, D]. On CUDA one tensor-core
    kernel applies the conv in the projection's store, so x @ w ([B, L, 2D], as large as the
    result) is never written or read back (cuda_projection.project_conv;
    SPEECHLENS_CUDA_PROJECT_CONV=0 turns it off); elsewhere the two calls."""
    return _dispatch(PROJECT_CONV, backend(), (x, w, conv_weight, conv_bias))


def _two_calls(x, w, conv_weight, conv_bias):
    return bimamba_conv(project([(x, w)]), conv_weight, conv_bias)


_TWO_CALLS = Implementation("project+bimamba_conv", _two_calls)
PROJECT_CONV = Operation("project_conv", {
    "cpu": (_TWO_CALLS,),
    "metal": (_TWO_CALLS,),
    "cuda": (Implementation("cuda-tensor-cores", lambda *operands: cuda_projection.project_conv(
        *operands), _first(_conv_kernel_off, _no_tensor_cores(
            settings.CUDA_PROJECTION, settings.CUDA_PROJECT_CONV))), _TWO_CALLS),
})


# ------------------------------------------------------------ conv2d, instance_norm_prelu


def conv2d(planes: list[mx.array], weight: mx.array, bias: mx.array | None, padding,
           dilation) -> mx.array | None:
    """A stride-1 NHWC conv of the channel concatenation of `planes` (weight [O, kh, kw, I]),
    run straight from the planes by the CPU library, or on CUDA by the tensor-core kernel
    (cuda_conv2d.py; SPEECHLENS_CUDA_CONV2D=0 turns it off); None where neither runs (Metal,
    no CPU library or NVRTC, shapes they do not take): the caller then runs its matmul form
    (the table's last entry, "caller-mlx")."""
    return _dispatch(CONV2D, backend(), (planes, weight, bias, padding, dilation))


def instance_norm_prelu(tiles: list[mx.array], weight: mx.array, bias: mx.array, eps: float,
                        slope: mx.array) -> list[mx.array] | None:
    """InstanceNorm over the time tiles [B, t, F, C] of one plane, then PReLU: by the CPU
    library on the CPU (cpu_ops.instance_norm_prelu); None elsewhere, or without the library:
    the caller then runs its MLX ops (the table's last entry, "caller-mlx")."""
    return _dispatch(INSTANCE_NORM_PRELU, backend(), (tiles, weight, bias, eps, slope))


def _cpu_instance_norm_prelu(tiles, weight, bias, eps, slope):
    return cpu_ops.instance_norm_prelu(cpu_library(), tiles, weight, bias, eps, slope)


def _caller_mlx(*operands):
    return None


_CALLER_MLX = Implementation("caller-mlx", _caller_mlx)
CONV2D = Operation("conv2d", {
    "cpu": (Implementation("cpu-library", cpu_conv2d, _no_cpu_library), _CALLER_MLX),
    "metal": (_CALLER_MLX,),
    "cuda": (Implementation("cuda-tensor-cores", lambda *operands: cuda_conv2d.conv2d(
        *operands), _no_tensor_cores(settings.CUDA_CONV2D)), _CALLER_MLX),
})
INSTANCE_NORM_PRELU = Operation("instance_norm_prelu", {
    "cpu": (Implementation("cpu-library", _cpu_instance_norm_prelu, _no_cpu_library),
            _CALLER_MLX),
    "metal": (_CALLER_MLX,),
    "cuda": (_CALLER_MLX,),
})

OPERATIONS = (CAUSAL_CONV1D, SELECTIVE_SCAN, BIMAMBA_CONV, BIMAMBA_SCAN, PROJECT, PROJECT_CONV,
              CONV2D, INSTANCE_NORM_PRELU)
_BY_NAME = {op.name: op for op in OPERATIONS}


def dispatch_table() -> dict[str, dict[str, list[list]]]:
    """The table for this machine and these settings: operation -> backend -> one
    [implementation, available, reason] per implementation, in the order they are tried;
    reason None where it is available (it may still decline operands it does not take, or a
    GPU kernel its self-check). A backend this MLX build lacks makes all of its entries
    unavailable; a bad setting is the reason of the entries that read it."""
    table: dict[str, dict[str, list[list]]] = {}
    for op in OPERATIONS:
        table[op.name] = {}
        for which in BACKENDS:
            missing = _backend_missing(which)
            rows = []
            for impl in op.table[which]:
                why = missing
                if why is None and impl.skip is not None:
                    try:
                        why = impl.skip()
                    except settings.SettingError as error:
                        why = str(error)
                rows.append([impl.name, why is None, why])
            table[op.name][which] = rows
    return table


def explain(name: str, *operands, which: str | None = None) -> list[tuple[str, str]]:
    """What each implementation of operation `name` did with `operands` (as its dispatch
    passes them) on backend `which` (default: backend()): (implementation, "ran", "declined" or
    "skipped: reason"), up to the one that ran. Runs it (tests, debugging)."""
    trace: list[tuple[str, str]] = []
    _dispatch(_BY_NAME[name], which or backend(), operands, trace)
    return trace


def chosen(name: str, *operands, which: str | None = None) -> str | None:
    """The implementation that runs operation `name` on `operands` (explain's last "ran")."""
    return next((impl for impl, what in explain(name, *operands, which=which)
                 if what == "ran"), None)


_packed_probed: dict[int, bool] = {}


def _packed_works(channels: int) -> bool:
    """Run the precompiled conv once per D on a tiny input (a cubin that fails to load would
    only fail at evaluation, in the middle of a window); a failure turns them all off."""
    if channels not in _packed_probed:
        ok = False
        try:
            y = cuda_packed.bimamba_conv(mx.zeros((1, 2, 2 * channels), mx.float32),
                                         mx.zeros((2, channels, CONV_WIDTH, 1), mx.float32),
                                         mx.zeros((2, channels), mx.float32))
            if y is not None:
                mx.eval(y)
                ok = True
        except Exception as exc:  # noqa: BLE001 - any failure means: use MLX's JIT kernels
            cuda_packed.mark_unusable(str(exc))
        _packed_probed[channels] = ok
    return _packed_probed[channels] and not cuda_packed.unusable()


def self_check(channels: int, rank: int) -> dict[str, str]:
    """The self-check verdict (selfcheck.py) of each GPU kernel variant a model of `channels`
    (d_inner) and dt rank `rank` may take here, by name, checked now where no verdict is kept:
    on Metal the two-direction kernels and the single-direction ones their fallback takes; on
    CUDA the JIT kernels where the precompiled ones are unavailable; none on the CPU."""
    which = backend()
    if which == "cpu" or (which == "cuda" and _packed_works(channels)):
        return {}
    fuse = which == "cuda"
    variants = [] if conv_kernel_disabled() else [
        selfcheck.Variant(kernel, which, channels, silu=fuse)
        for kernel in ("bimamba_conv", "causal_conv1d")]
    for strict in (False, True):
        if which == "metal":
            variants.append(selfcheck.Variant("bimamba_scan", which, channels, strict=strict))
        variants.append(selfcheck.Variant(
            "selective_scan", which, channels, strict=strict,
            rank=rank if fuse and rank <= CUDA_MAX_DT_RANK else 0))
    return {variant.name: selfcheck.verdict(variant) for variant in variants}


def kernel_info() -> dict[str, str]:
    """Where the kernels run here (for benchmarks and bug reports)."""
    which = backend()
    info = {"backend": which, "mlx": mx.__version__}
    if which == "cpu":
        lib = cpu_library()
        info["cpu_library"] = str(lib.path) if lib else "unavailable (MLX-op fallbacks)"
        if lib:
            info["cpu_isa"] = lib.isa_name(cpu_isa())
            info["cpu_threads"] = str(cpu_threads())
    else:
        info["gpu_kernels"] = launch_description(which)
        if which == "cuda":
            info["cuda_compilation"] = cuda_packed.describe()
            info["cuda_projections"] = ("tensor cores, float32 accuracy (3xTF32)"
                                        if cuda_projection.enabled() else "MLX matmul")
            info["cuda_conv2d"] = ("direct, tensor cores, float32 accuracy (3xTF32)"
                                   if cuda_conv2d.enabled() else "MLX matmuls")
            info["cuda_mamba_conv"] = ("in the in_proj kernel's store"
                                       if cuda_projection.project_conv_enabled()
                                       else "a kernel of its own")
    return info
