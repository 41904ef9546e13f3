"""The encoder's and decoders' stride-1 convolutions on CUDA, read straight from their planes.

As matmuls (model/layers.py) a dense layer's 3x3 conv needs its input's kernel-width taps
built (three copies of every earlier output), and on a GPU in time tiles to bound them. This
kernel (conv2d_cuda_body.h on sl_gemm_cuda.h) is the same float32-accurate tensor-core product
as the projections, with each K slice of A read from the plane and pixel its tap lands on
(zeros outside: the zero padding): no taps, no concatenation, no padding copies, no tiles.
It needs compute capability 8.0 or later and NVRTC (compiled once per machine per shape,
cuda_packed.py); elsewhere, or with SPEECHLENS_CUDA_CONV2D=0, the caller runs its matmuls.
"""

from __future__ import annotations

import functools

import mlx.core as mx

from .. import settings
from .build import GEMM_ROWS, GEMM_SLICE, GEMM_THREADS
from .cuda_packed import Part, build_variant, launch
from .cuda_projection import COLUMN_STEP, column_block, tensor_cores_enabled

#: Set to 0 to run the convolutions as MLX matmuls on CUDA instead of this kernel.
CONV_KERNEL_ENV = settings.CUDA_CONV2D.name
MAX_PLANES = 4  # x0 .. x3 (a dense block's last layer reads x and three outputs)


def enabled() -> bool:
    return tensor_cores_enabled(settings.CUDA_CONV2D)


def takes(planes: list[mx.array], weight: mx.array) -> bool:
    """Whether the kernel takes these operands: 1-4 float32 planes of one shape [B, H, W, C]
    (C whole K slices: a plane's channels are staged GEMM_SLICE at a time) whose channels add
    up to the weight's [O, kh, kw, I] input, O a multiple of COLUMN_STEP."""
    if not 1 <= len(planes) <= MAX_PLANES or weight.ndim != 4:
        return False
    shape = planes[0].shape
    out_channels, _, _, in_channels = weight.shape
    return (all(p.shape == shape and p.dtype == mx.float32 for p in planes)
            and len(shape) == 4 and shape[3] % GEMM_SLICE == 0
            and shape[3] * len(planes) == in_channels and out_channels % COLUMN_STEP == 0
            and weight.dtype == mx.float32)


@functools.cache
def _kernel(out_channels: int, channels: int, nplanes: int, kernel: tuple[int, int],
            padding: tuple[int, int], dilation: tuple[int, int], width: int, out_width: int,
            bias: bool):
    k = kernel[0] * kernel[1] * nplanes * channels
    parts = tuple(Part(f"x{i}", 0, ("B", "L", width, channels), channels)
                  for i in range(MAX_PLANES))
    parts += (Part("w", 0, (k, out_channels), out_channels),
              Part("bias", 0, (out_channels,), out_channels))
    template = (("N", out_channels), ("BN", column_block(out_channels)), ("C", channels),
                ("NP", nplanes), ("KH", kernel[0]), ("KW", kernel[1]), ("PH", padding[0]),
                ("PW", padding[1]), ("DH", dilation[0]), ("DW", dilation[1]), ("WIDTH", width),
                ("OW", out_width), ("BIAS", bias))
    return build_variant("conv2d", parts, template)


def conv2d(planes: list[mx.array], weight: mx.array, bias: mx.array | None,
           padding: tuple[int, int], dilation: tuple[int, int]) -> mx.array | None:
    """The stride-1 conv (zero padding, dilation) of the channel concatenation of `planes`
    ([B, H, W, C] each), weight [O, kh, kw, I] (MLX's layout), bias [O] or None -> [B, OH, OW,
    O]; None where the kernel does not take the operands or cannot run."""
    if not takes(planes, weight):
        return None
    batch, height, width, channels = planes[0].shape
    out_channels, kh, kw, in_channels = weight.shape
    (ph, pw), (dh, dw) = padding, dilation
    out_height, out_width = height + 2 * ph - dh * (kh - 1), width + 2 * pw - dw * (kw - 1)
    if out_height <= 0 or out_width <= 0:
        return None
    kernel = _kernel(int(out_channels), int(channels), len(planes), (int(kh), int(kw)),
                     (int(ph), int(pw)), (int(dh), int(dw)), int(width), int(out_width),
                     bias is not None)
    taps_first = mx.transpose(weight, (1, 2, 3, 0)).reshape(kh * kw * in_channels, out_channels)
    unread = planes[0]  # the inputs this variant does not read
    inputs = [*planes, *[unread] * (MAX_PLANES - len(planes)), taps_first,
              bias if bias is not None else taps_first]
    rows = batch * out_height * out_width
    blocks = -(-rows // GEMM_ROWS) * -(-out_channels // column_block(out_channels))
    return launch(kernel, inputs, blocks * GEMM_THREADS, GEMM_THREADS,
                  (batch, out_height, out_width, out_channels), batch, height)
