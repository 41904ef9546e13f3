// sl_backend_metal.h -- Metal (mx.fast.metal_kernel) definitions for sl_mamba.h.
// Lane type: float, one Metal thread per (batch, channel).
// Strict functions open with `#pragma clang fp contract(off)` (Metal's compiler is clang).
#ifndef SL_BACKEND_METAL_H
#define SL_BACKEND_METAL_H

#define SL_BACKEND_METAL 1
#define SL_FN inline
#define SL_I64 int64_t
// The kernel bodies' thread index and its type. The bodies name `thread_position_in_grid`
// (as this macro's argument): MLX adds that attribute to the signature only when the body
// mentions it.
#define SL_INDEX uint
#define SL_THREAD_INDEX(position) ((position).x)
#define SL_SPLAT(V, s) ((V)(s))
#define SL_LOAD(V, p) ((V)(p)[0])
#define SL_LOAD_STRIDED(V, p, s) ((V)(p)[0])
#define SL_STORE(p, v) ((p)[0] = (v))
#define SL_MUL(a, b) ((a) * (b))
#define SL_ADD(a, b) ((a) + (b))
#define SL_SUB(a, b) ((a) - (b))
#define SL_DIV(a, b) ((a) / (b))
#define SL_PREFETCH(p, steps, stride) ((void)0)
#define SL_STRICT_FP_BEGIN _Pragma("clang fp contract(off)")
#define SL_UNROLL _Pragma("clang loop unroll(full)")

SL_FN float sl_exp(float x) { return metal::exp(x); }
SL_FN float sl_exp_fast(float x) { return metal::fast::exp(x); }
SL_FN float sl_exp_fast_decay(float x) { return metal::fast::exp(x); }
SL_FN float sl_exp_precise(float x) { return metal::precise::exp(x); }
SL_FN float sl_log(float x) { return metal::precise::log(x); }
// Metal has no log1p: u = 1 + x rounded, then log(u) * x / (u - 1), exact for u == 1.
SL_FN float sl_log1p(float x) {
  SL_STRICT_FP_BEGIN
  const float u = 1.0f + x;
  return (u == 1.0f) ? x : metal::precise::log(u) * (x / (u - 1.0f));
}
SL_FN float sl_rint(float x) { return metal::rint(x); }
SL_FN float sl_abs(float x) { return metal::abs(x); }
SL_FN float sl_max(float a, float b) { return metal::max(a, b); }
SL_FN float sl_pow2_int(float k) { return as_type<float>((int(k) + 127) << 23); }
// Fast variants (standard mode's scan): the GPU's own 2^x, log and reciprocal.
SL_FN float sl_exp2_fast_decay(float x) { return metal::fast::exp2(x); }
SL_FN float sl_log_fast(float x) { return metal::fast::log(x); }
SL_FN float sl_recip_fast(float x) { return metal::fast::divide(1.0f, x); }

#endif  // SL_BACKEND_METAL_H
