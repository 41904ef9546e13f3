// Body of the Metal selective scan of both directions of a BiMamba in one launch (CUDA has
// bimamba_scan_cuda_body.h): the thread is sl_mamba.h's sl_selective_scan_thread, as in
// selective_scan_body.h. MLX generates the signature:
//   inputs  u, delta_raw [2, B, L, DI] (both directions' conv output and dt projection);
//           zf, zb [B, L, DI]: the gates (columns [0, DI) and [DI, 2 DI) of z); Bs, Cs
//           [2, B, L, NS] (the x_proj output's columns); A_log [2, DI, NS]; Dskip [2, DI]
//           (with *_shape, *_strides: inputs need not be row contiguous);
//   output  out [B, L, 2 DI] (row contiguous): columns [0, DI) the forward direction's
//           y * SiLU(z), [DI, 2 DI) the backward direction's (the scan of the time-reversed
//           sequence, written back in time order);
//   template DI (channels), NS (states, 16), STRICT (strict mode).
// One thread per (direction, batch, channel); the backward direction starts at the last step
// with negated time strides, so no reversed copy of any input or output is made.
const int length = u_shape[2];
const sl_bimamba_lane lane =
    sl_bimamba_lane_of(SL_THREAD_INDEX(thread_position_in_grid), u_shape[1], length, DI, 1);
if (lane.dir < 0) {
  return;
}
const int dir = lane.dir, b = lane.b, d = lane.d;
const SL_I64 first = lane.first, step = lane.step;  // the direction's first row, time step
sl_selective_scan_thread<STRICT, NS, float, true>(
    u + dir * u_strides[0] + b * u_strides[1] + first * u_strides[2] + d * u_strides[3],
    step * u_strides[2],
    delta_raw + dir * delta_raw_strides[0] + b * delta_raw_strides[1] +
        first * delta_raw_strides[2] + d * delta_raw_strides[3],
    step * delta_raw_strides[2],
    (dir ? zb : zf) + b * zf_strides[0] + first * zf_strides[1] + d * zf_strides[2],
    step * zf_strides[1],
    out + ((SL_I64)(b) * length + first) * (2 * DI) + dir * DI + d, step * (SL_I64)(2 * DI),
    Bs + dir * Bs_strides[0] + b * Bs_strides[1] + first * Bs_strides[2], step * Bs_strides[2],
    Bs_strides[3],
    Cs + dir * Cs_strides[0] + b * Cs_strides[1] + first * Cs_strides[2], step * Cs_strides[2],
    Cs_strides[3],
    A_log + dir * A_log_strides[0] + d * A_log_strides[1], A_log_strides[2], A_log_strides[1],
    Dskip + dir * Dskip_strides[0] + d * Dskip_strides[1], Dskip_strides[1], length);
