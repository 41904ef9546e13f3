// Body of the CUDA conv of both directions of a BiMamba in one launch (Metal keeps
// bimamba_conv_body.h; same signature and output): the thread is sl_conv_cuda.h's, on VEC = 4
// adjacent channels when DI is a multiple of 4 (the launch's grid is then 2 * B * DI / 4), else
// on one. Template DI, SILU.
constexpr int kVec = DI % 4 == 0 ? 4 : 1;
constexpr int kUnroll = 4;
const SL_INDEX gid = SL_THREAD_INDEX(thread_position_in_grid);
const int nbatch = xf_shape[0];
const int length = xf_shape[1];
const SL_INDEX groups = (SL_INDEX)(DI / kVec);
const SL_INDEX pairs = (SL_INDEX)(nbatch) * groups;
if (gid >= 2 * pairs) {
  return;
}
const int dir = gid >= pairs ? 1 : 0;
const SL_INDEX g = gid - (SL_INDEX)(dir) * pairs;
const int b = (int)(g / groups);
const int d = (int)(g % groups) * kVec;
const SL_I64 first = dir ? (SL_I64)(length - 1) : 0;  // the row of the direction's first step
const SL_I64 step = dir ? -1 : 1;
sl_cuda_conv_thread<SILU, kVec, kUnroll>(
    (dir ? xb : xf) + b * xf_strides[0] + first * xf_strides[1] + d * xf_strides[2],
    step * xf_strides[1],
    out + (((SL_I64)(dir) * nbatch + b) * length + first) * DI + d, step * (SL_I64)(DI),
    weight + dir * weight_strides[0] + d * weight_strides[1], weight_strides[2],
    weight_strides[1], bias + dir * bias_strides[0] + d * bias_strides[1], bias_strides[1],
    length);
