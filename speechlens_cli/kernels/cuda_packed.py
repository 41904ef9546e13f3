"""The CUDA kernels of a BiMamba's two directions on its packed tensors, compiled once per
machine.

A BiMamba holds both directions' conv inputs side by side in ``x`` and their gates in ``z``
([B, L, 2D] each), and each direction's dt input, B and C side by side in the x_proj output
``x_dbl`` ([2, B, L, R + 2N]). The kernels read them in place. MLX arrays do not expose their
strides, so a precompiled kernel (``mx.fast.precompiled_cuda_kernel``, see nvrtc.py) cannot be
handed a slice: it is handed the row-contiguous parent and the column where its part starts,
and the strides follow from the parent's shape. The kernel bodies are the JIT path's, wrapped
in a signature of pointers and int scalars (MLX passes inputs, then outputs, then scalars).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from .build import GEMM_THREADS
from .contract import CONV_WIDTH, D_STATE
from .gpu import (
    CUDA_SCAN_CHUNK,
    bimamba_conv_threads,
    cuda_scan_threads,
    kernel_sources,
    threadgroup,
)
from .notices import warn_once
from .nvrtc import NvrtcError, cached_cubin, compute_capability, nvrtc, nvrtc_version
from .sources import cache_dir

#: The runtime dimensions of the batched parts; everything else is a compile-time constant.
RUNTIME_DIMS = ("B", "L")


@dataclass(frozen=True)
class Part:
    """Input `name` of a kernel body: columns [offset, offset + width) of a row-contiguous
    parent of dimensions `dims` (ints, or "B" / "L" for the batch and length, which the kernel
    takes at run time). Only B and L are passed per launch: a launch costs two int arguments
    and no per-call Python work beyond the inputs."""

    name: str
    offset: int
    dims: tuple[int | str, ...]
    width: int

    def strides(self) -> list[str]:
        """The parent's row-major strides, as C++ expressions."""
        out, step = [], "1"
        for size in reversed(self.dims):
            out.append(step)
            step = f"(long long)({size}) * {step}"
        return out[::-1]

    def shape(self) -> list[str]:
        return [str(d) for d in self.dims[:-1]] + [str(self.width)]


def _uses(body: str, name: str, what: str) -> bool:
    return f"{name}_{what}" in body


def wrapper_source(kernel_name: str, body: str, header: str, parts: tuple[Part, ...],
                   template: tuple[tuple[str, int | bool | float], ...],
                   bounds: tuple[int, int] | None = None) -> str:
    """An ``extern "C"`` kernel that rebuilds what the body expects from MLX's JIT signature
    (``NAME``, ``NAME_shape``, ``NAME_strides``) out of base pointers, the packed layout and the
    int scalars B and L; `bounds` = (threads per block, blocks per SM) declares its
    ``__launch_bounds__``."""
    params = [f"const float* {p.name}_base" for p in parts] + ["float* out"]
    params += [f"int {d}" for d in RUNTIME_DIMS]
    lines = [f"  constexpr {_constant(v)} {k} = {_literal(v)};" for k, v in template]
    for p in parts:
        lines.append(f"  const float* {p.name} = {p.name}_base + {p.offset};")
        for what, ctype, values in (("shape", "int", p.shape()),
                                    ("strides", "long long", p.strides())):
            if _uses(body, p.name, what):
                lines.append(f"  const {ctype} {p.name}_{what}[{len(values)}] = "
                             f"{{{', '.join(values)}}};")
    bounded = f"__launch_bounds__({bounds[0]}, {bounds[1]}) " if bounds else ""
    return (f"{header}\nextern \"C\" __global__ void {bounded}{kernel_name}(\n    "
            + ",\n    ".join(params) + ") {\n" + "\n".join(lines) + "\n" + body + "\n}\n")


def _constant(value: int | bool | float) -> str:
    return {bool: "bool", int: "int", float: "float"}[type(value)]


def _float_bits(value: float) -> int:
    return int(np.array(value, np.float32).view(np.uint32))


def _literal(value: int | bool | float) -> str:
    """A template value in C++: a float as the hexadecimal literal of its float32 rounding
    (exact, the value MLX's float32 ops would use)."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return float(np.float32(value)).hex() + "f"
    return str(value)


_unusable: list[str] = []


def kernel_name(kind: str, template: tuple) -> str:
    """A float template value is named by its float32 bits (hex), the others as integers."""
    return "speechlens_" + kind + "".join(
        f"_{k}{_float_bits(v):x}" if isinstance(v, float) else f"_{k}{int(v)}"
        for k, v in template)


def variant_source(kind: str, parts: tuple[Part, ...], template: tuple) -> tuple[str, str]:
    """(name, CUDA source) of one kernel variant: the JIT path's body and header, wrapped."""
    name = kernel_name(kind, template)
    body, header = kernel_sources(KERNELS[kind], "cuda")
    return name, wrapper_source(name, body, header, parts, template, LAUNCH_BOUNDS.get(kind))


def build_variant(kind: str, parts: tuple[Part, ...], template: tuple) -> tuple[str, bytes] | None:
    """(name, cubin) of one kernel variant, or None (no NVRTC or driver, or a compile error:
    the JIT path runs instead)."""
    name, text = variant_source(kind, parts, template)
    try:
        cubin = cached_cubin(text, name)
    except (NvrtcError, OSError) as exc:
        warn_once(f"nvrtc-{name}", f"{name}: {exc}; compiling it with MLX in every process")
        return None
    return None if cubin is None else (name, cubin)


#: The kernels by the short names their variants carry (speechlens_biconv_..., ...).
KERNELS = {"biconv": "bimamba_conv", "biscan": "bimamba_scan", "proj": "projection",
           "projconv": "project_conv", "conv2d": "conv2d"}
#: (threads per block, blocks per SM) a kernel is compiled for: the projection's 256 threads
#: at two blocks per SM cap it at 128 registers (it took 154 uncapped, one block per SM; x_proj
#: 0.161 -> 0.145 ms on an H200).
LAUNCH_BOUNDS = {kind: (GEMM_THREADS, 2) for kind in ("proj", "projconv", "conv2d")}


def launch(kernel: tuple[str, bytes] | None, inputs: list[mx.array], grid: int, block: int,
           out_shape: tuple[int, ...], batch: int, length: int) -> mx.array | None:
    """Run a precompiled kernel, or None where there is none (the caller slices the parents
    and takes the JIT path)."""
    if kernel is None or _unusable:
        return None
    name, cubin = kernel
    return mx.fast.precompiled_cuda_kernel(
        name=name, compiled_source=cubin, inputs=inputs, output_shapes=[out_shape],
        output_dtypes=[mx.float32], scalars=[int(batch), int(length)],
        grid=(grid, 1, 1), threadgroup=(block, 1, 1), ensure_row_contiguous=True)[0]


def describe() -> str:
    """How the Mamba block's CUDA kernels get compiled here (for benchmark and bug reports)."""
    lib, arch = nvrtc(), compute_capability()
    if _unusable or lib is None or arch is None:
        why = _unusable[0] if _unusable else ("no NVRTC library" if lib is None
                                               else "no CUDA driver answered")
        return f"compiled by MLX (mx.fast.cuda_kernel) in every process: {why}"
    return (f"compiled once per machine by NVRTC {nvrtc_version(lib)} for sm_{arch[0]}{arch[1]}, "
            f"kept in {cache_dir() / 'cuda-kernels'}, launched with "
            "mx.fast.precompiled_cuda_kernel on the packed xz / x_dbl tensors")


def unusable() -> bool:
    return bool(_unusable)


def unusable_reason() -> str | None:
    """Why precompiled kernels are not used in this process (mark_unusable), else None."""
    return _unusable[0] if _unusable else None


def mark_unusable(reason: str) -> None:
    """Stop using precompiled kernels in this process (one failed to load or run)."""
    if not _unusable:
        _unusable.append(reason)
        warn_once("precompiled-cuda", f"precompiled CUDA kernels failed ({reason}); "
                  "compiling them with MLX instead")


def biconv_parts(channels: int) -> tuple[Part, ...]:
    """xf, xb = columns [0, D) and [D, 2D) of the two directions' conv input x [B, L, 2D];
    the weights [2, D, 4, 1] and biases [2, D] whole."""
    parent = ("B", "L", 2 * channels)
    return (Part("xf", 0, parent, channels), Part("xb", channels, parent, channels),
            Part("weight", 0, (2, channels, CONV_WIDTH, 1), 1),
            Part("bias", 0, (2, channels), channels))


def biscan_parts(channels: int, rank: int) -> tuple[Part, ...]:
    """u [2, B, L, D]; dt, B, C = columns of x_dbl [2, B, L, R + 2N]; the gates zf, zb =
    columns [0, D) and [D, 2D) of z [B, L, 2D]; the per-direction weights [2, ...] whole."""
    n = D_STATE
    row = (2, "B", "L", rank + 2 * n)
    parent = ("B", "L", 2 * channels)
    return (Part("u", 0, (2, "B", "L", channels), channels), Part("dt", 0, row, rank),
            Part("dt_w", 0, (2, channels, rank), rank), Part("dt_b", 0, (2, channels), channels),
            Part("A_log", 0, (2, channels, n), n), Part("Bs", rank, row, n),
            Part("Cs", rank + n, row, n), Part("Dskip", 0, (2, channels), channels),
            Part("zf", 0, parent, channels), Part("zb", channels, parent, channels))


def conv_template(channels: int) -> tuple:
    return (("DI", channels), ("SILU", True))


def scan_template(channels: int, rank: int, strict: bool, threads: int) -> tuple:
    return (("DI", channels), ("NS", D_STATE), ("STRICT", bool(strict)), ("R", rank),
            ("CHUNK", CUDA_SCAN_CHUNK[bool(strict)]), ("TG", threads))


@functools.cache
def biconv_kernel(channels: int) -> tuple[str, bytes] | None:
    return build_variant("biconv", biconv_parts(channels), conv_template(channels))


@functools.cache
def biscan_kernel(channels: int, rank: int, strict: bool,
                  threads: int) -> tuple[str, bytes] | None:
    return build_variant("biscan", biscan_parts(channels, rank),
                  scan_template(channels, rank, strict, threads))


def bimamba_conv(x: mx.array, weight: mx.array, bias: mx.array) -> mx.array | None:
    """Both directions' SiLU(conv) of x [B, L, 2D] -> [2, B, L, D] (biconv_parts), or None
    (see launch)."""
    batch, length, _ = x.shape
    channels = int(weight.shape[1])
    return launch(biconv_kernel(channels), [x, x, weight, bias],
                  bimamba_conv_threads("cuda", batch, channels), threadgroup(),
                  (2, batch, length, channels), batch, length)


def bimamba_scan(u: mx.array, x_dbl: mx.array, z: mx.array, A_log: mx.array, D: mx.array,
                 dt_proj: tuple[mx.array, mx.array], strict: bool) -> mx.array | None:
    """Both directions' scans on the packed tensors (biscan_parts) -> [B, L, 2D], or None."""
    _, batch, length, channels = u.shape
    weight, bias = dt_proj
    threads = cuda_scan_threads()
    kernel = biscan_kernel(int(channels), int(weight.shape[2]), bool(strict), threads)
    return launch(kernel, [u, x_dbl, weight, bias, A_log, x_dbl, x_dbl, D, z, z],
                  2 * batch * channels, threads, (batch, length, 2 * channels), batch, length)
