// Body of the CUDA selective scan (Metal keeps selective_scan_body.h): sl_scan_cuda.h has the
// thread. MLX generates the signature:
//   inputs  u, z [B, L, DI]; dt: delta_raw [B, L, DI] when R = 0, else the rank-R input of the
//           dt projection [B, L, R] with its weight dt_w [DI, R] and bias dt_b [DI] (with R = 0
//           these two are placeholders, never read); Bs, Cs [B, L, NS]; A_log [DI, NS];
//           Dskip [DI] (with u_shape and *_strides: inputs need not be row contiguous);
//   output  out [B, L, DI] (row contiguous) = y * SiLU(z);
//   template DI (channels), NS (states, 16), R (rank of a fused dt projection, 0 for none),
//   STRICT (strict mode), CHUNK (steps staged per barrier), TG (threads per block: must be the
//   launch's block size).
// One thread per (batch, channel); L comes from u_shape, so a new length does not recompile.
// Per-step and per-state strides are passed as int (they step within a row of a [B, L, D] or
// [B, L, NS] array, far below 2^31); batch offsets and step offsets are 64-bit.
constexpr bool kStage = DI % TG == 0 && NS % 4 == 0;
const SL_INDEX gid = SL_THREAD_INDEX(thread_position_in_grid);
const int nbatch = u_shape[0];
const int length = u_shape[1];
if (gid >= (SL_INDEX)(nbatch) * (SL_INDEX)(DI)) {
  return;  // only in a grid rounded up to whole blocks, i.e. never when kStage
}
const int b = (int)(gid / (SL_INDEX)(DI));
const int d = (int)(gid % (SL_INDEX)(DI));
sl_cuda_scan_thread<STRICT, NS, R, kStage, CHUNK, TG>(
    u + b * u_strides[0] + d * u_strides[2], (int)u_strides[1],
    dt + b * dt_strides[0] + (R > 0 ? 0 : d * dt_strides[2]), (int)dt_strides[1],
    (int)dt_strides[2], R > 0 ? dt_w + d * dt_w_strides[0] : dt_w, (int)dt_w_strides[1],
    R > 0 ? dt_b[d * dt_b_strides[0]] : 0.0f,
    z + b * z_strides[0] + d * z_strides[2], (int)z_strides[1],
    out + ((SL_I64)(b) * length) * DI + d, DI,
    Bs + b * Bs_strides[0], (int)Bs_strides[1], (int)Bs_strides[2],
    Cs + b * Cs_strides[0], (int)Cs_strides[1], (int)Cs_strides[2],
    A_log + d * A_log_strides[0], (int)A_log_strides[1], Dskip[d * Dskip_strides[0]], length);
