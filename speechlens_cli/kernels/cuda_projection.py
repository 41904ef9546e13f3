"""The model's projections on CUDA tensor cores at float32 accuracy (sl_gemm_cuda.h).

``a @ w`` in full float32 runs on the CUDA cores; TF32 alone would break float32 parity. The
kernel splits every operand into two TF32 parts and takes three tensor-core products per tile,
which keeps float32 accuracy (measured on an H200: 2.2-2.5e-7 relative RMS, as cuBLAS in float32).
Second design (256 threads, 128-row tiles, cp.async three slices deep, addresses worked out once
per thread, the LayerNorm in the store), per call on an H200 at 5 s / 44.1 kHz against MLX's
matmul in the same run: in_proj half 0.215 vs 0.258 ms, x_proj 0.145 vs 0.205, the merge with
its LayerNorm 0.219 vs 0.348, all at 1.0-1.6e-7 relative RMS against float64; the whole 5-s
window 8-9% faster at 44.1 and 48 kHz (docs/kernels.md). It needs compute capability 8.0 or
later and NVRTC (compiled once per machine, cuda_packed.py); elsewhere, or with
SPEECHLENS_CUDA_PROJECTION=0, the caller runs MLX's matmul.

A BiMamba's in_proj conv-input half feeds only the Mamba conv, so `project_conv` applies the
conv and its SiLU in the product's store: the in_proj output (as large as the conv's) is never
written or read back, and the conv is no pass of its own.
"""

from __future__ import annotations

import functools

import mlx.core as mx

from .. import settings
from .build import GEMM_ROWS, GEMM_THREADS
from .contract import CONV_WIDTH, LayerNormSpec, projection_geometry
from .cuda_packed import Part, build_variant, launch, unusable
from .nvrtc import compute_capability

#: Set to 0 to run the projections through MLX's matmul on CUDA instead of this kernel.
PROJECTION_KERNEL_ENV = settings.CUDA_PROJECTION.name
#: Set to 0 to run a BiMamba's in_proj conv-input half and its conv as two kernels.
PROJECT_CONV_ENV = settings.CUDA_PROJECT_CONV.name
CONV_ROWS_PER_BLOCK = GEMM_ROWS - (CONV_WIDTH - 1)  # the rest: the conv's taps


#: A block's output columns (BN) are a multiple of this: two warps side by side, each a whole
#: number of 8-column mma tiles.
COLUMN_STEP = 16


def column_block(n: int) -> int:
    """Output columns per block: 64, or N rounded up to COLUMN_STEP for narrower outputs."""
    return 64 if n >= 64 else -(-n // COLUMN_STEP) * COLUMN_STEP


def tensor_cores_problem(switch: settings.Setting) -> str | None:
    """Why a kernel on sl_gemm_cuda.h does not run here (its `switch` is off, the GPU has no
    TF32 mma: compute capability below 8.0, precompiled kernels failed to load), else None."""
    if not switch.value():
        return f"turned off by {switch.shown()}"
    arch = compute_capability()
    if arch is None:
        return "no CUDA driver answered"
    if arch < (8, 0):
        return f"compute capability {arch[0]}.{arch[1]} has no TF32 tensor cores (8.0+)"
    if unusable():
        return "the precompiled kernels failed"
    return None


def tensor_cores_enabled(switch: settings.Setting) -> bool:
    """Whether a kernel on sl_gemm_cuda.h runs here: its `switch` is on, the GPU has TF32 mma
    (compute capability 8.0+) and precompiled kernels load."""
    return tensor_cores_problem(switch) is None


def enabled() -> bool:
    return tensor_cores_enabled(settings.CUDA_PROJECTION)


def project_conv_enabled() -> bool:
    """project_conv runs: the projection kernel does and SPEECHLENS_CUDA_PROJECT_CONV is on."""
    return enabled() and tensor_cores_enabled(settings.CUDA_PROJECT_CONV)


def _geometry(terms: list[tuple[mx.array, mx.array]],
              bias: mx.array | None) -> tuple[int, int, int] | None:
    """(N, NB, rows per batch) where the kernel takes these operands, else None: well-formed
    projection operands (contract.projection_geometry) with K and N multiples of 4."""
    geometry = projection_geometry(terms, bias)
    if geometry is None or geometry[0] % 4 or any(int(a.shape[-1]) % 4 for a, _ in terms):
        return None
    return geometry


def fuses_norm(n: int, norm: LayerNormSpec | None) -> bool:
    """Whether the kernel applies `norm` itself: a block then holds whole rows (N <= 64, a
    multiple of 32)."""
    return norm is not None and n == column_block(n) and n % 32 == 0 and norm.fits(n)


@functools.cache
def _kernel(n: int, ks: tuple[int, ...], nb: int, bias: bool, eps: float | None,
            residual: bool):
    k0, k1 = ks[0], ks[1] if len(ks) > 1 else 0
    vec = (n,)
    parts = (Part("a0", 0, (nb, "B", "L", k0), k0), Part("w0", 0, (nb, k0, n), n),
             Part("a1", 0, (nb, "B", "L", max(k1, 4)), max(k1, 4)),
             Part("w1", 0, (nb, max(k1, 4), n), n), Part("bias", 0, vec, n),
             Part("norm_w", 0, vec, n), Part("norm_b", 0, vec, n))
    template = (("N", n), ("K0", k0), ("LDA0", k0), ("K1", k1), ("LDA1", max(k1, 4)),
                ("BN", column_block(n)), ("NB", nb), ("BIAS", bias), ("NORM", eps is not None),
                ("EPS", 0.0 if eps is None else float(eps)), ("RESIDUAL", residual))
    return build_variant("proj", parts, template)


def project(terms: list[tuple[mx.array, mx.array]], bias: mx.array | None,
            norm: LayerNormSpec | None = None,
            residual: mx.array | None = None) -> tuple[mx.array, bool, bool] | None:
    """(sum(a @ w) + bias, whether `norm` was applied too, whether `residual` was added last),
    or None where the kernel does not take the operands or cannot run. The kernel adds the
    residual where it is the first term's input (`x + f(x)` with f's first term x @ w) and
    nothing is left to apply after the kernel (no LayerNorm it does not fuse)."""
    geometry = _geometry(terms, bias)
    if geometry is None:
        return None
    n, nb, rows = geometry
    a0, w0 = terms[0]
    normed = fuses_norm(n, norm)
    added = (residual is a0 and int(a0.shape[-1]) == n and (norm is None or normed))
    kernel = _kernel(n, tuple(int(a.shape[-1]) for a, _ in terms), nb, bias is not None,
                     norm.eps if normed else None, added)
    second = terms[1] if len(terms) > 1 else terms[0]  # not read when there is one term
    unread = w0  # a placeholder for the inputs this variant does not read
    inputs = [a0, w0, *second, bias if bias is not None else unread,
              norm.weight if normed else unread, norm.bias if normed else unread]
    blocks = nb * -(-rows // GEMM_ROWS) * -(-n // column_block(n))
    out = launch(kernel, inputs, blocks * GEMM_THREADS, GEMM_THREADS, (nb * rows, n), rows, 1)
    return None if out is None else (out.reshape(*a0.shape[:-1], n), normed, added)


@functools.cache
def _conv_kernel(k: int, channels: int):
    parts = (Part("a0", 0, ("B", "L", k), k), Part("w0", 0, (k, 2 * channels), 2 * channels),
             Part("conv_w", 0, (2, channels, CONV_WIDTH, 1), 1),
             Part("conv_b", 0, (2, channels), channels))
    template = (("K0", k), ("LDA0", k), ("DI", channels), ("BN", column_block(2 * channels)))
    return build_variant("projconv", parts, template)


def project_conv(x: mx.array, w: mx.array, conv_weight: mx.array,
                 conv_bias: mx.array) -> mx.array | None:
    """Both directions' SiLU(conv) of x @ w in one kernel (project_conv_cuda_body.h), the
    conv applied in the product's store: x [B, L, K], w [K, 2D] (the forward direction's D
    columns, then the backward one's), conv_weight [2, D, 4, 1], conv_bias [2, D] ->
    [2, B, L, D], what bimamba_conv makes of x @ w. None where it takes no such operands:
    float32, K a multiple of 4, D of whole column blocks (whether it runs here at all, its
    switches and the GPU, is the dispatch table's skip)."""
    if x.ndim != 3 or w.ndim != 2 or conv_weight.ndim != 4:
        return None
    batch, length, k = (int(v) for v in x.shape)
    channels = int(conv_weight.shape[1])
    if (w.shape != (k, 2 * channels) or k % 4
            or channels % column_block(2 * channels)
            or conv_weight.shape != (2, channels, CONV_WIDTH, 1)
            or conv_bias.shape != (2, channels)
            or any(a.dtype != mx.float32 for a in (x, w, conv_weight, conv_bias))):
        return None
    column_blocks = 2 * channels // column_block(2 * channels)
    blocks = -(-batch * length // CONV_ROWS_PER_BLOCK) * column_blocks
    return launch(_conv_kernel(k, channels), [x, w, conv_weight, conv_bias],
                  blocks * GEMM_THREADS, GEMM_THREADS, (2, batch, length, channels), batch, length)
