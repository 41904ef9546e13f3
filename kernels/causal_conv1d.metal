// Body of the Metal causal depthwise conv1d (k = 4). MLX generates the signature:
//   inputs  x [B, L, DI], weight [DI, 4, 1], bias [DI] (with x_shape, *_strides);
//   output  out [B, L, DI] (row contiguous); template DI (channels).
// One thread per (batch, channel); L comes from x_shape, so a new length does not recompile.
const uint gid = thread_position_in_grid.x;
const int nbatch = x_shape[0];
const int length = x_shape[1];
if (gid >= uint(nbatch) * uint(DI)) {
  return;
}
const int b = int(gid / uint(DI));
const int d = int(gid % uint(DI));
sl_causal_conv1d_thread<float>(
    x + b * x_strides[0] + d * x_strides[2], x_strides[1],
    out + (int64_t(b) * length) * DI + d, int64_t(DI),
    weight + d * weight_strides[0], weight_strides[1], weight_strides[0],
    bias + d * bias_strides[0], bias_strides[0], length);
