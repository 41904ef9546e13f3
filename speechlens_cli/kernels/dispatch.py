"""Which implementation runs each kernel call: the backend, the switches and the fallbacks."""

from __future__ import annotations

import mlx.core as mx

from .. import runtime, settings
from . import cuda_conv2d, cuda_packed, cuda_projection, gpu, selfcheck
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
from .cpu_binding import cpu_isa, cpu_library, cpu_threads
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

DISABLE_CONV_ENV = settings.DISABLE_CONV1D.name
DISABLE_CONV_ENV_ALIAS = settings.DISABLE_CONV1D_ALIAS.name


def gpu_backend() -> str | None:
    """``"metal"`` or ``"cuda"`` when this MLX build has that GPU backend, else None
    (runtime.gpu_backend)."""
    return runtime.gpu_backend()


def backend() -> str:
    """``"metal"``, ``"cuda"`` or ``"cpu"``: where the kernels run for the default device
    (runtime.current)."""
    return runtime.current().backend


def conv_kernel_disabled() -> bool:
    return settings.DISABLE_CONV1D.value() or settings.DISABLE_CONV1D_ALIAS.value()


def causal_conv1d(x: mx.array, weight: mx.array, bias: mx.array, silu: bool = False) -> mx.array:
    """x [B, L, D], weight [D, 4, 1] (MLX layout), bias [D] -> [B, L, D], zero causal padding.

    ``silu=True`` returns SiLU(conv): fused into the CPU kernel (MLX's CPU sigmoid is scalar and
    cost more than the conv itself, measured) and the CUDA kernel (the separate op doubled the
    conv's time on an H200); a separate op on Metal, where fusing it measured slower than MLX's
    own sigmoid.
    """
    y, fused = _dispatch_conv(x, weight, bias, silu)
    return y * mx.sigmoid(y) if silu and not fused else y


def _dispatch_conv(x, weight, bias, silu: bool) -> tuple[mx.array, bool]:
    """The conv by the best path available; the flag says whether SiLU was applied too."""
    if conv_kernel_disabled():
        warn_once("conv-disabled", f"causal_conv1d: kernel disabled by {DISABLE_CONV_ENV}; "
                  "using mx.conv1d")
        return conv1d_fallback(x, weight, bias), False
    try:
        validate_conv(x, weight, bias)
    except KernelInputError as exc:
        warn_once("conv-validation", f"causal_conv1d: {exc}; using mx.conv1d")
        return conv1d_fallback(x, weight, bias), False
    which = backend()
    try:
        if which == "cpu":
            lib = cpu_library()
            if lib is not None:
                return cpu_conv(lib, x, weight, bias, silu), silu
            warn_once("conv-no-cpu-library", "causal_conv1d: no CPU kernel library; "
                      "using mx.conv1d")
        else:
            fuse = silu and which == "cuda"
            if selfcheck.works(selfcheck.Variant("causal_conv1d", which, int(x.shape[2]),
                                                 silu=fuse)):
                return gpu.gpu_conv(x, weight, bias, which, silu=fuse), fuse
    except Exception as exc:  # noqa: BLE001 - a dispatch failure means: use the fallback
        warn_once(f"conv-dispatch-{which}",
                  f"causal_conv1d: the {which} kernel failed ({exc}); using mx.conv1d")
    return conv1d_fallback(x, weight, bias), False


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
    from).
    """
    which = backend()
    lib = cpu_library() if which == "cpu" else None
    if dt_proj is not None and not _fuses_dt_proj(which, lib, u, delta_raw, dt_proj):
        delta_raw, dt_proj = _projected(delta_raw, dt_proj), None
    validate_scan(u, delta_raw, A_log, B, C, D, z, dt_proj)
    if which != "cpu":
        rank = 0 if dt_proj is None else int(delta_raw.shape[2])
        if selfcheck.works(selfcheck.Variant("selective_scan", which, int(u.shape[2]),
                                             strict=strict, rank=rank)):
            return gpu.gpu_scan(u, delta_raw, A_log, B, C, D, z, strict, which, dt_proj=dt_proj)
        if dt_proj is not None:
            delta_raw, dt_proj = _projected(delta_raw, dt_proj), None
    elif lib is not None:
        return cpu_scan(lib, u, delta_raw, A_log, B, C, D, z, strict, dt_proj=dt_proj)
    return selective_scan_ops(u, delta_raw, A_log, B, C, D, z, strict)


def _projected(dt_input: mx.array, dt_proj: tuple[mx.array, mx.array]) -> mx.array:
    """delta_raw from the dt projection's rank-R input, for a scan that does not apply it."""
    weight, bias = dt_proj
    return mx.addmm(bias, dt_input, weight.T)


def _fuses_dt_proj(which: str, lib, u, delta_raw, dt_proj) -> bool:
    if which == "cpu":
        return lib is not None and fusable_dt_proj(lib, u, delta_raw, dt_proj)
    return which == "cuda" and delta_raw.ndim == 3 and delta_raw.shape[2] <= CUDA_MAX_DT_RANK


def bimamba_conv(x: mx.array, weight: mx.array, bias: mx.array) -> mx.array:
    """SiLU(conv) of both directions of a BiMamba -> [2, B, L, D].

    x [B, L, 2D] holds the two directions' conv inputs side by side (the forward one, then the
    backward one); weight [2, D, 4, 1], bias [2, D]. [0] is the causal conv of x[..., :D];
    [1] the backward direction's: the causal conv of the time-reversed x[..., D:], returned in
    time order. On CUDA, Metal and the CPU one call does both and the backward direction reads
    the sequence from its end (nothing is flipped); elsewhere each direction is causal_conv1d
    on a time-reversed view."""
    validate_bimamba_conv(x, weight, bias)
    which, channels = backend(), int(weight.shape[1])
    if not conv_kernel_disabled():
        if which == "cuda" and _packed_works(channels):
            y = cuda_packed.bimamba_conv(x, weight, bias)
            if y is not None:
                return y
        if which == "cpu" and (lib := cpu_library()) is not None:
            return cpu_bimamba_conv(lib, x, weight, bias)
        fuse = which == "cuda"  # as in causal_conv1d: SiLU as its own op on Metal
        if which != "cpu" and selfcheck.works(
                selfcheck.Variant("bimamba_conv", which, channels, silu=fuse)):
            y = gpu.gpu_bimamba_conv(x, weight, bias, which, silu=fuse)
            return y if fuse else y * mx.sigmoid(y)
    return mx.stack([in_time_order(causal_conv1d(
        in_time_order(x, k)[..., k * channels:(k + 1) * channels], weight[k], bias[k],
        silu=True), k) for k in (0, 1)])


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
    weight, bias = dt_proj
    rank, channels, n = int(weight.shape[-1]), int(u.shape[-1]), D_STATE
    which = backend()
    if which == "cuda" and rank <= CUDA_MAX_DT_RANK and _packed_works(channels):
        y = cuda_packed.bimamba_scan(u, x_dbl, z, A_log, D, dt_proj, strict)
        if y is not None:
            return y
    if which == "cpu" and (lib := cpu_library()) is not None:
        return cpu_bimamba_scan(lib, u, x_dbl, z, A_log, D, dt_proj, strict)
    if which == "metal" and selfcheck.works(
            selfcheck.Variant("bimamba_scan", which, channels, strict=strict)):
        # the dt projection as a matmul first, as in selective_scan
        return gpu.metal_bimamba_scan(u, two_direction_delta_raw(x_dbl, dt_proj), z,
                                      x_dbl[..., rank:rank + n], x_dbl[..., rank + n:], A_log,
                                      D, strict)
    outs = []
    for k in (0, 1):
        dbl = in_time_order(x_dbl[k], k)
        outs.append(in_time_order(selective_scan(
            in_time_order(u[k], k), dbl[..., :rank], A_log[k], dbl[..., rank:rank + n],
            dbl[..., rank + n:], D[k], in_time_order(z, k)[..., k * channels:(k + 1) * channels],
            strict=strict, dt_proj=(weight[k], bias[k])), k))
    return mx.concatenate(outs, axis=-1)


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
    which = backend()
    y, normed, added = None, False, False
    if which == "cpu":
        y = cpu_project(terms, bias, norm)
        normed = y is not None
    elif which == "cuda" and cuda_projection.enabled():
        done = cuda_projection.project(terms, bias, norm, residual)
        if done is not None:
            y, normed, added = done
    if y is None:
        (a, w), rest = terms[0], terms[1:]
        y = a @ w if bias is None else mx.addmm(bias, a, w)
        for a, w in rest:
            y = mx.addmm(y, a, w)
    if norm is not None and not normed:
        y = mx.fast.layer_norm(y, norm.weight, norm.bias, norm.eps)
    return y if residual is None or added else y + residual


def project_conv(x: mx.array, w: mx.array, conv_weight: mx.array,
                 conv_bias: mx.array) -> mx.array:
    """bimamba_conv(project([(x, w)]), conv_weight, conv_bias): a BiMamba's in_proj
    conv-input half, both directions' conv and SiLU -> [2, B, L, D]. On CUDA one tensor-core
    kernel applies the conv in the projection's store, so x @ w ([B, L, 2D], as large as the
    result) is never written or read back (cuda_projection.project_conv;
    SPEECHLENS_CUDA_PROJECT_CONV=0 turns it off); elsewhere the two calls."""
    if backend() == "cuda" and not conv_kernel_disabled():
        u = cuda_projection.project_conv(x, w, conv_weight, conv_bias)
        if u is not None:
            return u
    return bimamba_conv(project([(x, w)]), conv_weight, conv_bias)


def conv2d(planes: list[mx.array], weight: mx.array, bias: mx.array | None, padding,
           dilation) -> mx.array | None:
    """A stride-1 NHWC conv of the channel concatenation of `planes` (weight [O, kh, kw, I]),
    run straight from the planes by the CPU library, or on CUDA by the tensor-core kernel
    (cuda_conv2d.py; SPEECHLENS_CUDA_CONV2D=0 turns it off); None where neither runs (Metal,
    no CPU library or NVRTC, shapes they do not take): the caller then runs its matmul form."""
    which = backend()
    if which == "cpu":
        return cpu_conv2d(planes, weight, bias, padding, dilation)
    if which == "cuda" and cuda_conv2d.enabled():
        return cuda_conv2d.conv2d(planes, weight, bias, padding, dilation)
    return None


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
