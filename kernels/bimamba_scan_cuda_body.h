// Body of the CUDA selective scan of both directions of a BiMamba in one launch (the thread is
// sl_scan_cuda.h's). Signature (MLX's JIT one, or the precompiled wrapper's):
//   inputs  u [2, B, L, DI] (the conv output of both directions); dt, Bs, Cs: the rank-R input
//           of the dt projection, B and C of both directions ([2, B, L, R], [2, B, L, NS]: the
//           x_proj output's columns); dt_w [2, DI, R], dt_b [2, DI]; A_log [2, DI, NS];
//           Dskip [2, DI]; zf, zb [B, L, DI]: the gates (columns [0, DI) and [DI, 2 DI) of
//           their in_proj output z) (with *_shape, *_strides);
//   output  out [B, L, 2 DI] (row contiguous): columns [0, DI) the forward direction's
//           y * SiLU(z), [DI, 2 DI) the backward direction's (the scan of the time-reversed
//           sequence, written back in time order);
//   template DI, NS, R (> 0), STRICT, CHUNK, TG as in selective_scan_cuda_body.h.
// One thread per (direction, batch, channel); a block never spans two (direction, batch) rows
// when DI % TG == 0, so B, C and the dt input stay staged per block. The backward direction
// starts at the last step with negated time strides: no reversed copy of any input or output.
static_assert(R > 0, "the two-direction scan applies the dt projection itself");
constexpr bool kStage = DI % TG == 0 && NS % 4 == 0;
const int length = u_shape[2];
const sl_bimamba_lane lane =
    sl_bimamba_lane_of(SL_THREAD_INDEX(thread_position_in_grid), u_shape[1], length, DI, 1);
if (lane.dir < 0) {
  return;  // only in a grid rounded up to whole blocks, i.e. never when kStage
}
const int dir = lane.dir, b = lane.b, d = lane.d;
const SL_I64 first = lane.first;  // the direction's first row
const int step = (int)lane.step;  // its time step (per-step strides are int here)
const float* zp = dir ? zb : zf;
sl_cuda_scan_thread<STRICT, NS, R, kStage, CHUNK, TG>(
    u + dir * u_strides[0] + b * u_strides[1] + first * u_strides[2] + d * u_strides[3],
    step * (int)u_strides[2],
    dt + dir * dt_strides[0] + b * dt_strides[1] + first * dt_strides[2],
    step * (int)dt_strides[2], (int)dt_strides[3],
    dt_w + dir * dt_w_strides[0] + d * dt_w_strides[1], (int)dt_w_strides[2],
    dt_b[dir * dt_b_strides[0] + d * dt_b_strides[1]],
    zp + b * zf_strides[0] + first * zf_strides[1] + d * zf_strides[2], step * (int)zf_strides[1],
    out + ((SL_I64)(b) * length + first) * (2 * DI) + dir * DI + d, step * 2 * DI,
    Bs + dir * Bs_strides[0] + b * Bs_strides[1] + first * Bs_strides[2],
    step * (int)Bs_strides[2], (int)Bs_strides[3],
    Cs + dir * Cs_strides[0] + b * Cs_strides[1] + first * Cs_strides[2],
    step * (int)Cs_strides[2], (int)Cs_strides[3],
    A_log + dir * A_log_strides[0] + d * A_log_strides[1], (int)A_log_strides[2],
    Dskip[dir * Dskip_strides[0] + d * Dskip_strides[1]], length);
