// Body of the Metal selective scan (CUDA has selective_scan_cuda_body.h): the backend header
// supplies the thread index and integer types. Standard mode takes the fast step variants
// (2^(delta*A*log2 e), fast softplus and SiLU), as the CUDA scan does.
// MLX generates the signature:
//   inputs  u, delta_raw, z [B, L, DI]; Bs, Cs [B, L, NS]; A_log [DI, NS]; Dskip [DI]
//           (with u_shape and *_strides: inputs need not be row contiguous);
//   output  out [B, L, DI] (row contiguous) = y * SiLU(z);
//   template DI (channels), NS (states, 16), STRICT (strict mode).
// One thread per (batch, channel); L comes from u_shape, so a new length does not recompile.
// The grid may be rounded up to whole threadgroups / blocks, hence the bounds check.
const SL_INDEX gid = SL_THREAD_INDEX(thread_position_in_grid);
const int nbatch = u_shape[0];
const int length = u_shape[1];
if (gid >= (SL_INDEX)(nbatch) * (SL_INDEX)(DI)) {
  return;
}
const int b = (int)(gid / (SL_INDEX)(DI));
const int d = (int)(gid % (SL_INDEX)(DI));
sl_selective_scan_thread<STRICT, NS, float, true>(
    u + b * u_strides[0] + d * u_strides[2], u_strides[1],
    delta_raw + b * delta_raw_strides[0] + d * delta_raw_strides[2], delta_raw_strides[1],
    z + b * z_strides[0] + d * z_strides[2], z_strides[1],
    out + ((SL_I64)(b) * length) * DI + d, (SL_I64)(DI),
    Bs + b * Bs_strides[0], Bs_strides[1], Bs_strides[2],
    Cs + b * Cs_strides[0], Cs_strides[1], Cs_strides[2],
    A_log + d * A_log_strides[0], A_log_strides[1], A_log_strides[0],
    Dskip + d * Dskip_strides[0], Dskip_strides[0], length);
