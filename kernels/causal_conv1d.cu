// Body of the CUDA causal depthwise conv1d (k = 4). MLX generates the signature:
//   inputs  x [B, L, DI], weight [DI, 4, 1], bias [DI] (with x_shape, *_strides);
//   output  out [B, L, DI] (row contiguous); template DI (channels).
// One thread per (batch, channel); the grid is rounded up to whole blocks, hence the check.
const long long gid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
const int nbatch = x_shape[0];
const int length = x_shape[1];
if (gid >= (long long)nbatch * DI) {
  return;
}
const int b = (int)(gid / DI);
const int d = (int)(gid % DI);
sl_causal_conv1d_thread<float>(
    x + b * x_strides[0] + d * x_strides[2], x_strides[1],
    out + ((long long)b * length) * DI + d, (long long)DI,
    weight + d * weight_strides[0], weight_strides[1], weight_strides[0],
    bias + d * bias_strides[0], bias_strides[0], length);
