// sl_mamba.h -- per-thread logic of speechlens' two Mamba kernels, shared by every backend.
//
//   * causal depthwise conv1d, kernel size 4 (three past inputs in registers, taps and bias
//     hoisted out of the sequence loop);
//   * fixed-16 selective scan (state h[NS] in registers, A = -exp(A_log) once per thread,
//     fused softplus, D skip, SiLU(z) gate), standard and strict mode (docs/kernels.md).
//
// One "thread" owns one (batch, channel) pair and walks the sequence. The lane type V is
// `float` on Metal and CUDA; the CPU library instantiates the same code with a SIMD vector of
// adjacent channels, so one CPU "thread" is a group of 4/8/16 channel threads.
//
// This file is pure logic. A backend header must be seen first and define:
//   SL_FN                         qualifiers of a device helper function
//   SL_I64                        64-bit signed integer type
//   SL_SPLAT(V, s)                V with every lane = float s (constants; a runtime float
//                                 scalar is mixed into V arithmetic directly: V * float)
//   SL_LOAD(V, p)                 V from p[0..lanes)           (lanes are adjacent channels)
//   SL_LOAD_STRIDED(V, p, s)      V from p[0], p[s], p[2s], ... (once-per-thread constants)
//   SL_STORE(p, v)                store V to p[0..lanes)
//   SL_MUL, SL_ADD, SL_SUB, SL_DIV  float ops that are never contracted into an FMA (strict)
//   SL_STRICT_FP_BEGIN            statement(s) opening a strict function body (may be empty)
//   SL_PREFETCH(p, steps, stride) hint that p + steps*stride is read soon (no-op on GPUs)
//   SL_UNROLL                     pragma that fully unrolls the following state loop
//   sl_exp(V)                     the backend's ordinary exp (softplus, SiLU)
//   sl_exp_fast(V)                fast exp (standard mode: A)
//   sl_exp_fast_decay(V)          fast exp for arguments <= 0 (the exact-formula standard decay)
//   sl_exp_precise(V)             precise exp (strict mode: A)
//   sl_log(V), sl_log1p(V), sl_rint(V), sl_abs(V), sl_max(V, V)
//   sl_pow2_int(V k)              2^k for integral k in [-127, 0] built in the IEEE exponent
//                                 field: bits (k + 127) << 23, so k = -127 gives +0.0
// Only for the *_fast / *_exp2 standard-mode step functions below (the CUDA, Metal, CPU scans):
//   sl_exp2_fast_decay(V)         fast 2^x for arguments <= 0 (the decay with A*log2(e))
//   sl_log_fast(V), sl_recip_fast(V)  fast log and 1/x (softplus, SiLU)

#ifndef SL_MAMBA_H
#define SL_MAMBA_H

// SL_CONV_WIDTH, the conv's taps, comes from speechlens_cli/kernels/build.py (KERNEL_DEFINES).
#ifndef SL_CONV_WIDTH
#error "SL_CONV_WIDTH comes from speechlens_cli/kernels/build.py (KERNEL_DEFINES)"
#endif
static_assert(SL_CONV_WIDTH == 4, "the conv step (sl_causal_conv1d_step) takes four taps");
#ifndef SL_SCAN_PREFETCH
#define SL_SCAN_PREFETCH 4  // time steps ahead (CPU only)
#endif
#ifndef SL_CONV_PREFETCH
#define SL_CONV_PREFETCH 16
#endif
#define SL_LOG2E_F32 1.44269502f  // float(log2(e))

#ifdef SL_INDEX
// The thread of a two-direction (BiMamba) GPU launch: direction dir (0 forward, 1 backward),
// batch row b and the first channel d of its group of `vec`; the grid holds every (b, group)
// of direction 0, then of direction 1. The backward direction walks the sequence from its last
// step (first = L - 1, step = -1), so it needs no reversed copy. dir < 0: a thread past the end
// of a grid rounded up to whole blocks.
struct sl_bimamba_lane {
  int dir, b, d;
  SL_I64 first, step;
};

SL_FN sl_bimamba_lane sl_bimamba_lane_of(SL_INDEX gid, int nbatch, int length, int channels,
                                         int vec) {
  sl_bimamba_lane lane;
  const SL_INDEX groups = (SL_INDEX)(channels / vec);
  const SL_INDEX pairs = (SL_INDEX)(nbatch) * groups;
  lane.dir = gid >= 2 * pairs ? -1 : (gid >= pairs ? 1 : 0);
  const SL_INDEX g = gid - (lane.dir > 0 ? pairs : (SL_INDEX)(0));
  lane.b = (int)(g / groups);
  lane.d = (int)(g % groups) * vec;
  lane.first = lane.dir > 0 ? (SL_I64)(length - 1) : (SL_I64)(0);
  lane.step = lane.dir > 0 ? (SL_I64)(-1) : (SL_I64)(1);
  return lane;
}
#endif

// Strict-mode decay: bitcast polynomial exp(x) for x <= 0, the same operations on every backend
// (no library exp, whose rounding differs between them).
//   y = x*log2(e); k = rint(y); f = y - k; p(f) by Horner (6th degree, no FMA);
//   result = p * 2^k with 2^k from the exponent field when k >= -126, else 0.
// Clamping y at -127 first keeps the integer conversion in range (and NaN out of it): any
// y < -126.5 rounds to k <= -127 and gives 0 either way, so the result is unchanged.
template <typename V>
SL_FN V sl_exp_poly(V x) {
  SL_STRICT_FP_BEGIN
  V y = SL_MUL(x, SL_SPLAT(V, SL_LOG2E_F32));
  y = sl_max(y, SL_SPLAT(V, -127.0f));
  V k = sl_rint(y);
  V f = SL_SUB(y, k);
  V p = SL_SPLAT(V, 0.00015465313f);
  p = SL_ADD(SL_MUL(p, f), SL_SPLAT(V, 0.0013395279f));
  p = SL_ADD(SL_MUL(p, f), SL_SPLAT(V, 0.0096180400f));
  p = SL_ADD(SL_MUL(p, f), SL_SPLAT(V, 0.055503407f));
  p = SL_ADD(SL_MUL(p, f), SL_SPLAT(V, 0.24022651f));
  p = SL_ADD(SL_MUL(p, f), SL_SPLAT(V, 0.6931472f));
  p = SL_ADD(SL_MUL(p, f), SL_SPLAT(V, 1.0f));
  return SL_MUL(p, sl_pow2_int(k));
}

// ---- selective scan, one step, written as value-to-value functions so that every backend
// arranges the loops its own way (GPU: one thread walks L; CPU: SIMD groups of channels) while
// the arithmetic stays in this one place. Standard mode: the formulas of MLX's eager graph with
// the compiler's default contraction; strict mode: stable softplus, direct-division SiLU,
// precise exp for A, bitcast polynomial decay, (dt*B)*u, no FMA contraction.

template <typename V>
SL_FN V sl_softplus_standard(V x) {
  return sl_log(SL_SPLAT(V, 1.0f) + sl_exp(x));
}

template <typename V>
SL_FN V sl_silu_standard(V z) {
  return z * (SL_SPLAT(V, 1.0f) / (SL_SPLAT(V, 1.0f) + sl_exp(-z)));
}

template <typename V>
SL_FN V sl_softplus_strict(V x) {
  SL_STRICT_FP_BEGIN
  return SL_ADD(sl_max(x, SL_SPLAT(V, 0.0f)), sl_log1p(sl_exp(-sl_abs(x))));
}

template <typename V>
SL_FN V sl_silu_strict(V z) {
  SL_STRICT_FP_BEGIN
  return SL_DIV(z, SL_ADD(SL_SPLAT(V, 1.0f), sl_exp(-z)));
}

// A = -exp(A_log), once per thread and state.
template <bool STRICT, typename V>
SL_FN V sl_scan_A(V a_log) {
  return STRICT ? -sl_exp_precise(a_log) : -sl_exp_fast(a_log);
}

// delta = softplus(delta_raw), once per step.
template <bool STRICT, typename V>
SL_FN V sl_scan_delta(V delta_raw) {
  return STRICT ? sl_softplus_strict(delta_raw) : sl_softplus_standard(delta_raw);
}

// One state: h = exp(delta*A)*h + delta*B*u. Standard passes du = delta*u ((dt*u)*B order).
template <typename V>
SL_FN V sl_scan_state_standard(V h, V delta, V du, V a, float bn) {
  return sl_exp_fast_decay(delta * a) * h + du * bn;
}

template <typename V>
SL_FN V sl_scan_state_strict(V h, V delta, V ut, V a, float bn) {
  SL_STRICT_FP_BEGIN
  const V decay = sl_exp_poly(SL_MUL(delta, a));
  return SL_ADD(SL_MUL(decay, h), SL_MUL(SL_MUL(delta, bn), ut));
}

// y += h*C.
template <typename V>
SL_FN V sl_scan_accumulate_standard(V y, V h, float cn) {
  return y + h * cn;
}

template <typename V>
SL_FN V sl_scan_accumulate_strict(V y, V h, float cn) {
  SL_STRICT_FP_BEGIN
  return SL_ADD(y, SL_MUL(h, cn));
}

// out = (y + D*u) * SiLU(z).
template <typename V>
SL_FN V sl_scan_output_standard(V y, V dskip, V ut, V zt) {
  return (y + dskip * ut) * sl_silu_standard(zt);
}

template <typename V>
SL_FN V sl_scan_output_strict(V y, V dskip, V ut, V zt) {
  SL_STRICT_FP_BEGIN
  return SL_MUL(SL_ADD(y, SL_MUL(dskip, ut)), sl_silu_strict(zt));
}

// A fused rank-R dt projection: delta_raw = dt_b + sum_k dt_w[k] * dt_low[k], one term at a
// time in rank order and never contracted into an FMA, so every kernel that fuses the
// projection (CPU, CUDA) forms the same delta_raw in both modes.
template <typename V>
SL_FN V sl_dt_proj_term(V acc, V w, V x) {
  SL_STRICT_FP_BEGIN
  return SL_ADD(acc, SL_MUL(w, x));
}

// ---- standard mode, the fast variant (CUDA scan): the same formulas as the functions above
// with the hardware's approximate exp2/exp/log/reciprocal. The decay is 2^(delta * A2) with
// A2 = A*log2(e) scaled once per thread, which saves one multiply per state and step (the
// hardware exponential is base 2). Strict mode has no fast variant: its definition is fixed.

template <typename V>
SL_FN V sl_scan_A_exp2(V a_log) {
  return sl_scan_A<false>(a_log) * SL_SPLAT(V, SL_LOG2E_F32);
}

template <typename V>
SL_FN V sl_scan_delta_fast(V delta_raw) {
  return sl_log_fast(SL_SPLAT(V, 1.0f) + sl_exp_fast(delta_raw));
}

template <typename V>
SL_FN V sl_scan_state_standard_exp2(V h, V delta, V du, V a2, float bn) {
  return sl_exp2_fast_decay(delta * a2) * h + du * bn;
}

template <typename V>
SL_FN V sl_silu_fast(V z) {
  return z * sl_recip_fast(SL_SPLAT(V, 1.0f) + sl_exp_fast(-z));
}

template <typename V>
SL_FN V sl_scan_output_fast(V y, V dskip, V ut, V zt) {
  return (y + dskip * ut) * sl_silu_fast(zt);
}

// Standard mode's step functions, exact-formula (tag false) or fast (tag true: the Metal, CUDA
// and CPU scans; the CPU's fast log and reciprocal are its exact ones, its decay a polynomial).
// Overloads on a tag type rather than a branch, so a backend only instantiates, and only needs
// the functions of, the variant it uses.
template <bool FAST>
struct sl_fast_tag {};

template <typename V>
SL_FN V sl_standard_A(V a_log, sl_fast_tag<false>) { return sl_scan_A<false>(a_log); }
template <typename V>
SL_FN V sl_standard_A(V a_log, sl_fast_tag<true>) { return sl_scan_A_exp2(a_log); }
template <typename V>
SL_FN V sl_standard_delta(V x, sl_fast_tag<false>) { return sl_scan_delta<false>(x); }
template <typename V>
SL_FN V sl_standard_delta(V x, sl_fast_tag<true>) { return sl_scan_delta_fast(x); }
template <typename V>
SL_FN V sl_standard_state(V h, V delta, V du, V a, float bn, sl_fast_tag<false>) {
  return sl_scan_state_standard(h, delta, du, a, bn);
}
template <typename V>
SL_FN V sl_standard_state(V h, V delta, V du, V a, float bn, sl_fast_tag<true>) {
  return sl_scan_state_standard_exp2(h, delta, du, a, bn);
}
template <typename V>
SL_FN V sl_standard_output(V y, V dskip, V ut, V zt, sl_fast_tag<false>) {
  return sl_scan_output_standard(y, dskip, ut, zt);
}
template <typename V>
SL_FN V sl_standard_output(V y, V dskip, V ut, V zt, sl_fast_tag<true>) {
  return sl_scan_output_fast(y, dskip, ut, zt);
}

// ---- causal depthwise conv1d, kernel size 4 ----
//
// x, out: pointers at (b, t = 0, channel); sx, so: element strides between time steps.
// w: pointer at tap 0 of the channel, swk: stride between taps, swd: stride between channels
// (read only to gather the lanes of a vector V; the GPU bodies run V = float, and the CPU walks
// rows with sl_causal_conv1d_step instead); bias at the channel, sbd its channel stride.
// out[t] = w0*x[t-3] + w1*x[t-2] + w2*x[t-1] + w3*x[t] + bias, x[t < 0] = 0; with SILU, the
// standard-mode SiLU of that (saves the GPU graph a separate elementwise pass over [B, L, D]).
template <typename V>
SL_FN V sl_causal_conv1d_step(V w0, V w1, V w2, V w3, V bv, V x0, V x1, V x2, V x3) {
  V acc = w0 * x0;
  acc = acc + w1 * x1;
  acc = acc + w2 * x2;
  acc = acc + w3 * x3;
  return acc + bv;
}

template <typename V, bool SILU = false, typename PX, typename PW, typename PBias, typename PO>
SL_FN void sl_causal_conv1d_thread(PX x, SL_I64 sx, PO out, SL_I64 so, PW w, SL_I64 swk,
                                   SL_I64 swd, PBias bias, SL_I64 sbd, int length) {
  const V w0 = SL_LOAD_STRIDED(V, w, swd);
  const V w1 = SL_LOAD_STRIDED(V, w + swk, swd);
  const V w2 = SL_LOAD_STRIDED(V, w + 2 * swk, swd);
  const V w3 = SL_LOAD_STRIDED(V, w + 3 * swk, swd);
  const V bv = SL_LOAD_STRIDED(V, bias, sbd);
  V x0 = SL_SPLAT(V, 0.0f);  // x[t-3]
  V x1 = SL_SPLAT(V, 0.0f);  // x[t-2]
  V x2 = SL_SPLAT(V, 0.0f);  // x[t-1]
  for (int t = 0; t < length; ++t) {
    SL_PREFETCH(x, SL_CONV_PREFETCH, sx);
    SL_PREFETCH(out, SL_CONV_PREFETCH, so);
    const V x3 = SL_LOAD(V, x);
    const V acc = sl_causal_conv1d_step(w0, w1, w2, w3, bv, x0, x1, x2, x3);
    SL_STORE(out, SILU ? sl_silu_standard(acc) : acc);
    x0 = x1;
    x1 = x2;
    x2 = x3;
    x += sx;
    out += so;
  }
}

// ---- selective scan, NS states (NS = 16 for RE-USE) ----
//
// u, dt (= delta_raw), z, out: pointers at (b, t = 0, channel) with per-step strides
// su, sdt, sz, so. Bm, Cm: pointers at (b, t = 0, state 0) with per-step strides sB, sC and
// per-state strides sBn, sCn. A_log: pointer at (channel, state 0), per-state stride sAn,
// per-channel stride sAd (CPU lane gather only). Dskip: pointer at the channel, sDd likewise.
//
// FAST (standard mode only): the fast step variants (exp2 with A*log2(e), fast softplus/SiLU).
template <bool STRICT, int NS, typename V, bool FAST = false, typename PU, typename PT,
          typename PZ, typename PO, typename PB, typename PC, typename PA, typename PD>
SL_FN void sl_selective_scan_thread(PU u, SL_I64 su, PT dt, SL_I64 sdt, PZ z, SL_I64 sz, PO out,
                                    SL_I64 so, PB Bm, SL_I64 sB, SL_I64 sBn, PC Cm, SL_I64 sC,
                                    SL_I64 sCn, PA A_log, SL_I64 sAn, SL_I64 sAd, PD Dskip,
                                    SL_I64 sDd, int length) {
  V a[NS];  // A = -exp(A_log), hoisted: once per thread
  V h[NS];
  SL_UNROLL
  for (int n = 0; n < NS; ++n) {
    const V al = SL_LOAD_STRIDED(V, A_log + n * sAn, sAd);
    a[n] = STRICT ? sl_scan_A<true>(al) : sl_standard_A(al, sl_fast_tag<FAST>());
    h[n] = SL_SPLAT(V, 0.0f);
  }
  const V dskip = SL_LOAD_STRIDED(V, Dskip, sDd);

  for (int t = 0; t < length; ++t) {
    SL_PREFETCH(u, SL_SCAN_PREFETCH, su);
    SL_PREFETCH(dt, SL_SCAN_PREFETCH, sdt);
    SL_PREFETCH(z, SL_SCAN_PREFETCH, sz);
    SL_PREFETCH(out, SL_SCAN_PREFETCH, so);
    const V ut = SL_LOAD(V, u);
    const V zt = SL_LOAD(V, z);
    const V dtr = SL_LOAD(V, dt);
    const V delta = STRICT ? sl_scan_delta<true>(dtr) : sl_standard_delta(dtr, sl_fast_tag<FAST>());
    V y = SL_SPLAT(V, 0.0f);
    if (STRICT) {
      SL_UNROLL
      for (int n = 0; n < NS; ++n) {
        h[n] = sl_scan_state_strict(h[n], delta, ut, a[n], (float)Bm[n * sBn]);
        y = sl_scan_accumulate_strict(y, h[n], (float)Cm[n * sCn]);
      }
      SL_STORE(out, sl_scan_output_strict(y, dskip, ut, zt));
    } else {
      const V du = delta * ut;
      SL_UNROLL
      for (int n = 0; n < NS; ++n) {
        h[n] = sl_standard_state(h[n], delta, du, a[n], (float)Bm[n * sBn],
                                 sl_fast_tag<FAST>());
        y = sl_scan_accumulate_standard(y, h[n], (float)Cm[n * sCn]);
      }
      SL_STORE(out, sl_standard_output(y, dskip, ut, zt, sl_fast_tag<FAST>()));
    }
    u += su;
    dt += sdt;
    z += sz;
    out += so;
    Bm += sB;
    Cm += sC;
  }
}

#endif  // SL_MAMBA_H
