// Body of the causal depthwise conv1d (k = 4), for Metal and CUDA alike: the backend header
// (sl_backend_metal.h / sl_backend_cuda.h) supplies the thread index and integer types.
// MLX generates the signature:
//   inputs  x [B, L, DI], weight [DI, 4, 1], bias [DI] (with x_shape, *_strides);
//   output  out [B, L, DI] (row contiguous); template DI (channels), SILU (apply SiLU).
// One thread per (batch, channel); L comes from x_shape, so a new length does not recompile.
// The grid may be rounded up to whole threadgroups / blocks, hence the bounds check.
const SL_INDEX gid = SL_THREAD_INDEX(thread_position_in_grid);
const int nbatch = x_shape[0];
const int length = x_shape[1];
if (gid >= (SL_INDEX)(nbatch) * (SL_INDEX)(DI)) {
  return;
}
const int b = (int)(gid / (SL_INDEX)(DI));
const int d = (int)(gid % (SL_INDEX)(DI));
sl_causal_conv1d_thread<float, SILU>(
    x + b * x_strides[0] + d * x_strides[2], x_strides[1],
    out + ((SL_I64)(b) * length) * DI + d, (SL_I64)(DI),
    weight + d * weight_strides[0], weight_strides[1], weight_strides[0],
    bias + d * bias_strides[0], bias_strides[0], length);
