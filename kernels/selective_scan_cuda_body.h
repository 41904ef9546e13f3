// Body of the CUDA selective scan (Metal keeps selective_scan_body.h): sl_scan_cuda.h has the
// thread. MLX generates the signature:
//   inputs  u, delta_raw, z [B, L, DI]; Bs, Cs [B, L, NS]; A_log [DI, NS]; Dskip [DI]
//           (with u_shape and *_strides: inputs need not be row contiguous);
//   output  out [B, L, DI] (row contiguous) = y * SiLU(z);
//   template DI (channels), NS (states, 16), STRICT (strict mode), CHUNK (steps of B/C staged
//   per barrier), TG (threads per block: must be the launch's block size).
// One thread per (batch, channel); L comes from u_shape, so a new length does not recompile.
// Per-step and per-state strides are passed as int (they step within a row of a [B, L, D] or
// [B, L, NS] array, far below 2^31); batch offsets and step offsets are 64-bit.
constexpr bool kStage = DI % TG == 0 && (CHUNK * 2 * NS) % TG == 0 && NS % 4 == 0;
const SL_INDEX gid = SL_THREAD_INDEX(thread_position_in_grid);
const int nbatch = u_shape[0];
const int length = u_shape[1];
if (gid >= (SL_INDEX)(nbatch) * (SL_INDEX)(DI)) {
  return;  // only in a grid rounded up to whole blocks, i.e. never when kStage
}
const int b = (int)(gid / (SL_INDEX)(DI));
const int d = (int)(gid % (SL_INDEX)(DI));
sl_cuda_scan_thread<STRICT, NS, kStage, CHUNK, TG>(
    u + b * u_strides[0] + d * u_strides[2], (int)u_strides[1],
    delta_raw + b * delta_raw_strides[0] + d * delta_raw_strides[2], (int)delta_raw_strides[1],
    z + b * z_strides[0] + d * z_strides[2], (int)z_strides[1],
    out + ((SL_I64)(b) * length) * DI + d, DI,
    Bs + b * Bs_strides[0], (int)Bs_strides[1], (int)Bs_strides[2],
    Cs + b * Cs_strides[0], (int)Cs_strides[1], (int)Cs_strides[2],
    A_log + d * A_log_strides[0], (int)A_log_strides[1], Dskip[d * Dskip_strides[0]], length);
