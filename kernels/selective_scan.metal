// Body of the Metal fixed-16 selective scan. MLX generates the signature:
//   inputs  u, delta_raw, z [B, L, DI]; Bs, Cs [B, L, NS]; A_log [DI, NS]; Dskip [DI]
//           (with u_shape and *_strides: inputs need not be row contiguous);
//   output  out [B, L, DI] (row contiguous) = y * SiLU(z);
//   template DI (channels), NS (states, 16), STRICT (strict mode).
// One thread per (batch, channel); L comes from u_shape, so a new length does not recompile.
const uint gid = thread_position_in_grid.x;
const int nbatch = u_shape[0];
const int length = u_shape[1];
if (gid >= uint(nbatch) * uint(DI)) {
  return;
}
const int b = int(gid / uint(DI));
const int d = int(gid % uint(DI));
sl_selective_scan_thread<STRICT, NS, float>(
    u + b * u_strides[0] + d * u_strides[2], u_strides[1],
    delta_raw + b * delta_raw_strides[0] + d * delta_raw_strides[2], delta_raw_strides[1],
    z + b * z_strides[0] + d * z_strides[2], z_strides[1],
    out + (int64_t(b) * length) * DI + d, int64_t(DI),
    Bs + b * Bs_strides[0], Bs_strides[1], Bs_strides[2],
    Cs + b * Cs_strides[0], Cs_strides[1], Cs_strides[2],
    A_log + d * A_log_strides[0], A_log_strides[1], A_log_strides[0],
    Dskip + d * Dskip_strides[0], Dskip_strides[0], length);
