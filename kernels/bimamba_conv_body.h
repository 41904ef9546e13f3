// Body of the causal depthwise conv1d (k = 4) of both directions of a BiMamba in one launch, for
// Metal and CUDA alike (the backend header supplies the thread index and integer types).
// Signature (MLX's JIT one, or the precompiled wrapper's, which rebuilds the same names):
//   inputs  xf, xb [B, L, DI]: the forward and backward directions' conv inputs (columns
//           [0, DI) and [DI, 2 DI) of their in_proj output x); weight [2, DI, 4, 1]; bias [2, DI]
//           (with *_shape, *_strides: the inputs need not be row contiguous);
//   output  out [2, B, L, DI] (row contiguous): out[0] the causal conv of xf, out[1] the
//           backward direction's, i.e. the causal conv of xf's time-reversed sequence, written
//           back in time order;
//   template DI (channels), SILU (apply SiLU).
// One thread per (direction, batch, channel), on CUDA (sl_conv_cuda.h included) per four
// adjacent channels when DI is a multiple of 4: the launch's grid is then 2 * B * DI / 4 and the
// inputs and output must be 16-byte aligned with row strides that are multiples of 4. The
// backward direction runs the same per-thread code from the last step with negated time strides,
// so no reversed copy is ever made.
#ifdef SL_CONV_CUDA_H
constexpr int kVec = DI % 4 == 0 ? 4 : 1;
#else
constexpr int kVec = 1;
#endif
const int nbatch = xf_shape[0];
const int length = xf_shape[1];
const sl_bimamba_lane lane =
    sl_bimamba_lane_of(SL_THREAD_INDEX(thread_position_in_grid), nbatch, length, DI, kVec);
if (lane.dir < 0) {
  return;
}
const int dir = lane.dir, b = lane.b, d = lane.d;
const SL_I64 first = lane.first, step = lane.step;  // the direction's first row, time step
#ifdef SL_CONV_CUDA_H
sl_cuda_conv_thread<SILU, kVec, 4>(
#else
sl_causal_conv1d_thread<float, SILU>(
#endif
    (dir ? xb : xf) + b * xf_strides[0] + first * xf_strides[1] + d * xf_strides[2],
    step * xf_strides[1],
    out + (((SL_I64)(dir) * nbatch + b) * length + first) * DI + d, step * (SL_I64)(DI),
    weight + dir * weight_strides[0] + d * weight_strides[1], weight_strides[2],
    weight_strides[1], bias + dir * bias_strides[0] + d * bias_strides[1], bias_strides[1],
    length);
