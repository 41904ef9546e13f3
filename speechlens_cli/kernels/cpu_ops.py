"""The kernels on the CPU: MLX arrays in, the CPU library run on their buffers, MLX arrays out.

Each result is written into a buffer MLX allocated, so nothing is copied back.
"""

from __future__ import annotations

import ctypes

import mlx.core as mx
import numpy as np

from . import scratch
from .build import SCAN_THREAD_ORDER
from .contract import (
    CONV_WIDTH,
    D_STATE,
    LayerNormSpec,
    in_time_order,
    projection_geometry,
)
from .cpu_binding import CpuLibrary, cpu_isa, cpu_library, cpu_threads
from .fallback import two_direction_delta_raw


def _view(a: mx.array) -> np.ndarray:
    """Zero-copy NumPy view of an evaluated float32 array."""
    return np.asarray(a)


def _strides(v: np.ndarray) -> ctypes.Array:
    return (ctypes.c_int64 * v.ndim)(*(s // v.itemsize for s in v.strides))


def _unit_last(v: np.ndarray) -> np.ndarray:
    return v if v.strides[-1] == v.itemsize else np.ascontiguousarray(v)


def _output_like(shape) -> tuple[mx.array, np.ndarray] | None:
    """A fresh MLX array to write the result into (evaluated), with a writable NumPy view of
    its buffer; None if MLX did not give it its own contiguous buffer."""
    out = mx.zeros(shape, mx.float32)
    mx.eval(out)
    view = _view(out)
    if view.flags.c_contiguous and view.flags.writeable:
        return out, view
    return None


def _fresh(shape, *inputs: mx.array) -> tuple[mx.array | None, np.ndarray]:
    """(MLX array or None, writable view) to write a result of `shape` into: a buffer lent by
    the open scratch scope, else _output_like, else a NumPy buffer copied into MLX afterwards."""
    mx.eval(*inputs)
    return (scratch.take(shape) or _output_like(shape)
            or (None, np.empty(shape, np.float32)))


def _isa(isa: int) -> int:
    """An entry point's `isa` argument: -1 (the default) is SPEECHLENS_CPU_ISA's choice."""
    return cpu_isa() if isa < 0 else isa


def _result(out: mx.array | None, ov: np.ndarray) -> mx.array:
    return out if out is not None else mx.array(ov)


def _conv_into(lib: CpuLibrary, xv: np.ndarray, wv: np.ndarray, bv: np.ndarray,
               ov: np.ndarray, silu: bool) -> None:
    """The conv of the view xv [B, L, D] (any time stride, unit channel stride) into the view
    ov; weights wv [D, 4], bias bv [D]."""
    batch, length, channels = xv.shape
    rc = lib.causal_conv1d(
        x=xv.ctypes.data, x_strides=_strides(xv), weight=wv.ctypes.data,
        weight_strides=_strides(wv), bias=bv.ctypes.data, bias_stride=bv.strides[0] // 4,
        out=ov.ctypes.data, out_strides=_strides(ov), batch=batch, length=length,
        channels=channels, taps=CONV_WIDTH, threads=cpu_threads(), isa=cpu_isa(),
        silu=int(silu))
    if rc != 0:
        raise RuntimeError(f"sl_cpu_causal_conv1d returned {rc}")


def cpu_conv(lib: CpuLibrary, x, weight, bias, silu: bool = False) -> mx.array:
    channels = x.shape[2]
    out, ov = _fresh(x.shape, x, weight, bias)
    _conv_into(lib, _unit_last(_view(x)), _view(weight).reshape(channels, CONV_WIDTH),
               _view(bias), ov, silu)
    return _result(out, ov)


def cpu_bimamba_conv(lib: CpuLibrary, x, weight, bias) -> mx.array:
    """Both directions' SiLU(conv) (dispatch.bimamba_conv) -> [2, B, L, D] in one pass over
    x's rows: the backward direction runs anti-causally in place, so nothing is flipped or
    copied."""
    batch, length, width = x.shape
    channels = width // 2
    out, ov = _fresh((2, batch, length, channels), x, weight, bias)
    xv = _unit_last(_view(x))
    wv = _view(weight).reshape(2, channels, CONV_WIDTH)
    bv = _view(bias)
    rc = lib.bimamba_conv1d(
        x=xv.ctypes.data, x_strides=_strides(xv), weight=wv.ctypes.data,
        weight_strides=_strides(wv), bias=bv.ctypes.data, bias_strides=_strides(bv),
        out=ov.ctypes.data, out_strides=_strides(ov), batch=batch, length=length,
        channels=channels, taps=CONV_WIDTH, threads=cpu_threads(), isa=cpu_isa())
    if rc != 0:
        raise RuntimeError(f"sl_cpu_bimamba_conv1d returned {rc}")
    return _result(out, ov)


def _scan_into(lib: CpuLibrary, uv, dv, av, bv, cv, sv, zv, ov, strict: bool, isa: int = -1,
               thread_order: bool = False, wv=None, biasv=None) -> None:
    """The scan of the views (unit channel strides, any time stride) into the view ov; wv
    (the dt projection's weight, transposed [R, D]) and biasv: dv is its rank-R input."""
    batch, length, channels = uv.shape
    rc = lib.selective_scan(
        u=uv.ctypes.data, u_strides=_strides(uv), dt=dv.ctypes.data, dt_strides=_strides(dv),
        A_log=av.ctypes.data, A_log_strides=_strides(av), B=bv.ctypes.data,
        B_strides=_strides(bv), C=cv.ctypes.data, C_strides=_strides(cv), D=sv.ctypes.data,
        D_stride=sv.strides[0] // 4, z=zv.ctypes.data, z_strides=_strides(zv),
        out=ov.ctypes.data, out_strides=_strides(ov), batch=batch, length=length,
        channels=channels, states=D_STATE, strict=int(bool(strict)), threads=cpu_threads(),
        isa=_isa(isa), flags=SCAN_THREAD_ORDER if thread_order else 0,
        dt_weight_t=None if wv is None else wv.ctypes.data,
        dt_bias=None if biasv is None else biasv.ctypes.data,
        rank=0 if wv is None else wv.shape[0])
    if rc != 0:
        raise RuntimeError(f"sl_cpu_selective_scan returned {rc}")


def cpu_scan(lib: CpuLibrary, u, delta_raw, A_log, B, C, D, z, strict: bool,
             isa: int = -1, thread_order: bool = False, dt_proj=None) -> mx.array:
    extra = () if dt_proj is None else (mx.contiguous(dt_proj[0].T), mx.contiguous(dt_proj[1]))
    out, ov = _fresh(u.shape, u, delta_raw, A_log, B, C, D, z, *extra)
    uv, zv = (_unit_last(_view(a)) for a in (u, z))
    # the rank-R input of a fused dt projection is read through its strides as it is
    dv = _view(delta_raw) if extra else _unit_last(_view(delta_raw))
    wv, biasv = (_view(a) for a in extra) if extra else (None, None)
    _scan_into(lib, uv, dv, _view(A_log), _view(B), _view(C), _view(D), zv, ov, strict, isa,
               thread_order, wv, biasv)
    return _result(out, ov)


def cpu_bimamba_scan(lib: CpuLibrary, u, x_dbl, z, A_log, D, dt_proj,
                     strict: bool) -> mx.array:
    """Both directions' scans (dispatch.bimamba_scan) -> [B, L, 2D], each direction written
    into its half of one buffer, the backward one through time-reversed views."""
    _, batch, length, channels = u.shape
    weight, bias = dt_proj
    rank = weight.shape[2]
    fused = channels % lib.lanes() == 0  # the kernel fuses the projection for whole groups
    if fused:
        dt_inputs = (mx.contiguous(mx.swapaxes(weight, 1, 2)), mx.contiguous(bias))
    else:
        dt_inputs = (two_direction_delta_raw(x_dbl, dt_proj),)
    out, ov = _fresh((batch, length, 2 * channels), u, x_dbl, z, A_log, D, *dt_inputs)
    uv, xv, zv = _view(u), _view(x_dbl), _view(z)
    av, sv = np.ascontiguousarray(_view(A_log)), np.ascontiguousarray(_view(D))
    dt_views = [_view(a) for a in dt_inputs]
    n = D_STATE
    for k in (0, 1):
        x_k = in_time_order(xv[k], k)
        dv = x_k[..., :rank] if fused else in_time_order(dt_views[0][k], k)
        _scan_into(lib, in_time_order(uv[k], k), dv, av[k], x_k[..., rank:rank + n],
                   x_k[..., rank + n:], sv[k],
                   in_time_order(zv[..., k * channels:(k + 1) * channels], k),
                   in_time_order(ov[..., k * channels:(k + 1) * channels], k), strict,
                   wv=dt_views[0][k] if fused else None,
                   biasv=dt_views[1][k] if fused else None)
    return _result(out, ov)


def fusable_dt_proj(lib: CpuLibrary, u, delta_raw, dt_proj) -> bool:
    """The CPU kernel fuses the projection for whole SIMD groups of channels only."""
    weight, bias = dt_proj
    channels = u.shape[2]
    return (delta_raw.ndim == 3 and delta_raw.shape[:2] == u.shape[:2]
            and weight.shape == (channels, delta_raw.shape[2]) and bias.shape == (channels,)
            and channels % lib.lanes() == 0
            and all(a.dtype == mx.float32 for a in (delta_raw, weight, bias)))


def instance_norm_prelu(lib: CpuLibrary, tiles: list[mx.array], weight: mx.array,
                        bias: mx.array, eps: float, slope: mx.array) -> list[mx.array]:
    """InstanceNorm over the time tiles [B, t, F, C] of one plane, then PReLU, by the CPU
    library: statistics summed in float64 (two passes: mean, then squared deviations), the
    affine and PReLU in one pass per tile instead of MLX's separate single-threaded ops
    (dispatch.instance_norm_prelu runs it on the CPU backend)."""
    mx.eval(tiles, weight, bias, slope)
    views = [np.ascontiguousarray(_view(tile)) for tile in tiles]
    batch, _, width, channels = views[0].shape
    count = sum(v.shape[1] for v in views) * width
    weight_v, bias_v, slope_v = (np.ascontiguousarray(_view(a), dtype=np.float32)
                                 for a in (weight, bias, slope))
    outs = [_output_like(v.shape) or (None, np.empty(v.shape, np.float32)) for v in views]
    threads = cpu_threads()

    def plane_sums(b: int, center: np.ndarray | None) -> np.ndarray:
        """Per-channel float64 sums of x (center None) or (x - center)^2 over all tiles."""
        sums = np.zeros(channels, np.float64)
        for v in views:
            lib.channel_sums(x=v[b].ctypes.data, rows=v.shape[1] * width, channels=channels,
                             center=None if center is None else center.ctypes.data,
                             sums=sums.ctypes.data, threads=threads)
        return sums

    for b in range(batch):
        mean = (plane_sums(b, None) / count).astype(np.float32)
        scale = (1.0 / np.sqrt(plane_sums(b, mean) / count + eps)).astype(np.float32) * weight_v
        for v, (_, ov) in zip(views, outs, strict=True):
            lib.affine_prelu(x=v[b].ctypes.data, out=ov[b].ctypes.data, rows=v.shape[1] * width,
                             channels=channels, mean=mean.ctypes.data, scale=scale.ctypes.data,
                             bias=bias_v.ctypes.data, slope=slope_v.ctypes.data, threads=threads)
    return [out if out is not None else mx.array(ov) for out, ov in outs]


def cpu_conv2d(planes: list[mx.array], weight: mx.array, bias: mx.array | None, padding,
               dilation, isa: int = -1) -> mx.array | None:
    """A stride-1 NHWC convolution of the channel concatenation of `planes` (each [B, T, F, C_p]),
    weight [O, kh, kw, sum C_p] (MLX layout), bias [O] or None, zero padding (pt, pf), dilation
    (dt, df), by the CPU library: read straight from the planes, so neither the concatenation
    nor any padded or tap copy is made. None where the library is unavailable or cannot take
    the arguments (O not a multiple of 8)."""
    lib = cpu_library()
    out_channels, kh, kw, in_channels = weight.shape
    shapes = {p.shape[:3] for p in planes}
    if (lib is None or out_channels % 8 or len(shapes) != 1
            or sum(p.shape[3] for p in planes) != in_channels
            or any(a.dtype != mx.float32 for a in (*planes, weight))):
        return None
    (batch, height, width), = shapes
    (ph, pw), (dh, dw) = padding, dilation
    out_shape = (batch, height + 2 * ph - dh * (kh - 1), width + 2 * pw - dw * (kw - 1),
                 out_channels)
    if out_shape[1] <= 0 or out_shape[2] <= 0:
        return None
    taps_last = mx.contiguous(mx.transpose(weight, (1, 2, 3, 0)))  # [kh, kw, I, O]
    extra = () if bias is None else (bias,)
    out, ov = _fresh(out_shape, taps_last, *planes, *extra)
    views = [np.ascontiguousarray(_view(p)) for p in planes]
    pointers = (ctypes.c_void_p * len(views))(*(v.ctypes.data for v in views))
    channels = (ctypes.c_int64 * len(views))(*(v.shape[3] for v in views))
    bias_v = None if bias is None else np.ascontiguousarray(_view(bias), dtype=np.float32)
    rc = lib.conv2d(planes=pointers, plane_channels=channels, nplanes=len(views),
                    weight=_view(taps_last).ctypes.data,
                    bias=None if bias_v is None else bias_v.ctypes.data, out=ov.ctypes.data,
                    batch=batch, height=height, width=width, out_channels=out_channels,
                    kernel_height=kh, kernel_width=kw, pad_height=ph, pad_width=pw,
                    dilation_height=dh, dilation_width=dw, threads=cpu_threads(), isa=_isa(isa))
    if rc != 0:
        raise RuntimeError(f"sl_cpu_conv2d returned {rc}")
    return _result(out, ov)


def cpu_project(terms: list[tuple[mx.array, mx.array]], bias: mx.array | None,
                norm: LayerNormSpec | None = None, isa: int = -1) -> mx.array | None:
    """sum(a @ w for a, w in terms) + bias (dispatch.project's operands: one or two terms, w
    [K, N] or [NB, K, N] with a [NB, ..., K]) by the CPU library's register tiles, then
    `norm`'s LayerNorm of each output row if given; None where the library is unavailable or
    does not take the operands."""
    lib = cpu_library()
    geometry = projection_geometry(terms, bias)
    if lib is None or geometry is None or (norm is not None and not norm.fits(geometry[0])):
        return None
    n, nb, rows = geometry
    arrays = [x for term in terms for x in term] + ([bias] if bias is not None else [])
    if norm is not None:
        arrays += [norm.weight, norm.bias]
    out, ov = _fresh((nb, rows, n), *arrays)
    views = []
    for a, w in terms:
        av = _unit_last(_view(a)).reshape(nb, rows, a.shape[-1])
        wv = _view(w).reshape(nb, *w.shape[-2:])
        views.append((av, wv))
    (a0, w0), (a1, w1) = views[0], views[-1]
    two = len(views) == 2
    bv = None if bias is None else _view(bias)
    nw, nbias = (None, None) if norm is None else (_unit_last(_view(norm.weight)),
                                                   _unit_last(_view(norm.bias)))
    rc = lib.project(
        a0=a0.ctypes.data, a0_strides=_strides(a0), k0=a0.shape[2], w0=w0.ctypes.data,
        w0_strides=_strides(w0), a1=a1.ctypes.data if two else None,
        a1_strides=_strides(a1), k1=a1.shape[2] if two else 0,
        w1=w1.ctypes.data if two else None, w1_strides=_strides(w1),
        bias=None if bv is None else bv.ctypes.data,
        bias_stride=0 if bv is None else bv.strides[0] // 4, out=ov.ctypes.data,
        out_strides=_strides(ov), batch=nb, rows=rows, columns=n,
        norm_weight=None if nw is None else nw.ctypes.data,
        norm_bias=None if nbias is None else nbias.ctypes.data,
        norm_eps=0.0 if norm is None else norm.eps, threads=cpu_threads(), isa=_isa(isa))
    if rc != 0:
        raise RuntimeError(f"sl_cpu_project returned {rc}")
    return _result(out, ov).reshape(*terms[0][0].shape[:-1], n)


def cpu_exp_poly(x: np.ndarray, isa: int = -1) -> np.ndarray:
    """The strict-mode decay exponential of kernels/sl_mamba.h, run by the CPU library."""
    return _map(lambda lib: lib.exp_poly, x, isa)


def cpu_exp2_decay(x: np.ndarray, isa: int = -1) -> np.ndarray:
    """2^x for x <= 0, the CPU library's standard-mode scan decay (sl_exp2_fast_decay)."""
    return _map(lambda lib: lib.exp2_decay, x, isa)


def _map(entry, x: np.ndarray, isa: int) -> np.ndarray:
    """A CPU library math function, picked from the library by `entry`, over the floats x."""
    lib = cpu_library()
    if lib is None:
        raise RuntimeError("the CPU kernel library is unavailable")
    xv = np.ascontiguousarray(x, dtype=np.float32)
    out = np.empty_like(xv)
    entry(lib)(x=xv.ctypes.data, y=out.ctypes.data, n=xv.size, isa=_isa(isa))
    return out
