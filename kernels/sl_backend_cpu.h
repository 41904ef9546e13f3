// sl_backend_cpu.h -- CPU (GCC/Clang, C++17) definitions for sl_mamba.h.
//
// The lane type V is either `float` (one channel) or a GCC vector of 4, 8 or 16 adjacent
// channels, so a CPU "thread" runs the GPU per-thread code on a whole SIMD group at once.
// The math functions are written once as templates over V (the float and vector versions
// compute the same thing lane by lane) and use only + - * /, comparisons, ?: selects and
// bit casts. The translation unit must be compiled with -ffp-contract=off (GCC ignores the
// FP_CONTRACT pragma), which keeps every mode free of FMA contraction on the CPU.
#ifndef SL_BACKEND_CPU_H
#define SL_BACKEND_CPU_H

#include <cmath>
#include <cstdint>
#include <cstring>

#define SL_BACKEND_CPU 1
#define SL_FN static inline __attribute__((always_inline))
#define SL_I64 int64_t
#define SL_SPLAT(V, s) ((V)(sl_cpu::splat<V>(s)))
#define SL_LOAD(V, p) (sl_cpu::load<V>(p))
#define SL_LOAD_STRIDED(V, p, s) (sl_cpu::load_strided<V>((p), (s)))
#define SL_STORE(p, v) (sl_cpu::store((p), (v)))
#define SL_MUL(a, b) ((a) * (b))
#define SL_ADD(a, b) ((a) + (b))
#define SL_SUB(a, b) ((a) - (b))
#define SL_DIV(a, b) ((a) / (b))
#define SL_PREFETCH(p, steps, stride) __builtin_prefetch((p) + (steps) * (stride))
#if defined(__clang__)
#define SL_STRICT_FP_BEGIN _Pragma("clang fp contract(off)")
#define SL_UNROLL _Pragma("clang loop unroll(full)")
#else
#define SL_STRICT_FP_BEGIN
#define SL_UNROLL _Pragma("GCC unroll 16")
#endif

namespace sl_cpu {

typedef float vf4 __attribute__((vector_size(16)));
typedef float vf8 __attribute__((vector_size(32)));
typedef float vf16 __attribute__((vector_size(64)));
typedef float vf32 __attribute__((vector_size(128)));
typedef int32_t vi4 __attribute__((vector_size(16)));
typedef int32_t vi8 __attribute__((vector_size(32)));
typedef int32_t vi16 __attribute__((vector_size(64)));
typedef int32_t vi32 __attribute__((vector_size(128)));
typedef uint32_t vu4 __attribute__((vector_size(16)));
typedef uint32_t vu8 __attribute__((vector_size(32)));
typedef uint32_t vu16 __attribute__((vector_size(64)));
typedef uint32_t vu32 __attribute__((vector_size(128)));

template <typename V> struct traits;
template <> struct traits<float> { typedef int32_t I; typedef uint32_t U; static const int lanes = 1; };
template <> struct traits<vf4> { typedef vi4 I; typedef vu4 U; static const int lanes = 4; };
template <> struct traits<vf8> { typedef vi8 I; typedef vu8 U; static const int lanes = 8; };
template <> struct traits<vf16> { typedef vi16 I; typedef vu16 U; static const int lanes = 16; };
template <> struct traits<vf32> { typedef vi32 I; typedef vu32 U; static const int lanes = 32; };

// Filled through a float array: GCC 12 compiles this to one broadcast inside the ISA entry
// points. A braced list or a lane loop on the vector is built for the baseline ISA before it
// is inlined (four inserts per half), and `s - V{}` builds the vector lane by lane.
template <typename V> SL_FN V splat(float s) {
  float lanes[traits<V>::lanes];
  for (int i = 0; i < traits<V>::lanes; ++i) lanes[i] = s;
  V v;
  std::memcpy(&v, lanes, sizeof(V));
  return v;
}
template <> inline float splat<float>(float s) { return s; }

template <typename V> SL_FN V load(const float* p) { V v; std::memcpy(&v, p, sizeof(V)); return v; }
template <typename V> SL_FN void store_impl(float* p, V v) { std::memcpy(p, &v, sizeof(V)); }
SL_FN void store(float* p, float v) { *p = v; }
SL_FN void store(float* p, vf4 v) { store_impl(p, v); }
SL_FN void store(float* p, vf8 v) { store_impl(p, v); }
SL_FN void store(float* p, vf16 v) { store_impl(p, v); }
SL_FN void store(float* p, vf32 v) { store_impl(p, v); }

template <typename V> SL_FN V load_strided(const float* p, int64_t s) {
  V v;
  for (int i = 0; i < traits<V>::lanes; ++i) v[i] = p[i * s];
  return v;
}
template <> inline float load_strided<float>(const float* p, int64_t) { return *p; }

// Bit casts and conversions that work for float and the vector types alike.
SL_FN int32_t as_int(float x) { int32_t i; std::memcpy(&i, &x, 4); return i; }
SL_FN float as_float(int32_t i) { float x; std::memcpy(&x, &i, 4); return x; }
template <typename V> SL_FN typename traits<V>::I as_int(V x) { return (typename traits<V>::I)x; }
template <typename I> SL_FN auto as_float(I i) {
  typedef float F __attribute__((vector_size(sizeof(I))));
  return (F)i;
}
template <typename V> SL_FN typename traits<V>::U as_uint(V x) {
  typename traits<V>::U u;
  std::memcpy(&u, &x, sizeof(V));
  return u;
}
template <typename V> SL_FN V from_uint(typename traits<V>::U u) {
  V x;
  std::memcpy(&x, &u, sizeof(V));
  return x;
}

// max(x, c) for a constant c < 0 in one unsigned integer min on the bits: as unsigned
// integers, negative floats order by magnitude and every non-negative float (+0 included) lies
// below them, so x >= c (and x >= 0) is kept and x < c, -inf and negative NaNs become c;
// a positive NaN stays NaN. (GCC compiles the `?:` float max to a compare and a blend, both on
// the FMA ports of AMD Zen, and cannot inline an ISA intrinsic into these templates.)
template <typename V> SL_FN V max_negative(V x, float c) {
  const auto bits = as_uint(x), limit = as_uint(splat<V>(c));
  return from_uint<V>(bits < limit ? bits : limit);
}

SL_FN int32_t to_int(float x) { return (int32_t)x; }  // x integral
template <typename V> SL_FN typename traits<V>::I to_int(V x) {
  return __builtin_convertvector(x, typename traits<V>::I);
}
template <typename V, typename I> SL_FN V int_to_float(I i) {
  if constexpr (traits<V>::lanes == 1) {
    return (float)i;
  } else {
    return __builtin_convertvector(i, V);
  }
}

// NaN test on the bits (a float x != x compare scalarizes in GCC's vector lowering).
template <typename V> SL_FN auto is_nan(V x) { return (as_int(x) & 0x7fffffff) > 0x7f800000; }

// select(c, a, b): c ? a : b lane by lane (c from a comparison of the same lane type).
template <typename C, typename V> SL_FN V select(C c, V a, V b) { return c ? a : b; }

// Round to nearest even for |y| < 2^22 (adding and subtracting 1.5*2^23 in the default
// rounding mode); callers clamp y into [-127, 127] first.
template <typename V> SL_FN V rint_small(V y) {
  const V magic = splat<V>(12582912.0f);
  return (y + magic) - magic;
}

// exp(x) on the whole float range: Cody-Waite reduction by ln2 and a degree-7 Taylor
// polynomial on |r| <= ln2/2 (truncation error < 1.2e-8 relative, result within 2 ulp);
// 2^n from the exponent field; x > 88.72 gives +inf, x < -87.33 gives 0 (no subnormals).
template <typename V> SL_FN V exp_any(V x) {
  // clamp into [-88, 88]; NaN goes to -88 here and is passed through at the end
  const V xc = select(x > splat<V>(-88.0f), select(x < splat<V>(88.0f), x, splat<V>(88.0f)),
                      splat<V>(-88.0f));
  const V n = rint_small(xc * splat<V>(1.44269504f));
  V r = xc - n * splat<V>(0.693145751953125f);
  r = r - n * splat<V>(1.428606765330187e-06f);
  V p = splat<V>(1.0f / 5040.0f);
  p = p * r + splat<V>(1.0f / 720.0f);
  p = p * r + splat<V>(1.0f / 120.0f);
  p = p * r + splat<V>(1.0f / 24.0f);
  p = p * r + splat<V>(1.0f / 6.0f);
  p = p * r + splat<V>(0.5f);
  p = p * r + splat<V>(1.0f);
  p = p * r + splat<V>(1.0f);
  const auto ni = to_int(n);
  // 88 * log2(e) < 127: one scale factor 2^n (n in [-127, 127]); n = -127 builds +0.
  V res = p * as_float((ni + 127) << 23);
  res = select(x > splat<V>(88.7228394f), splat<V>(INFINITY), res);
  res = select(x < splat<V>(-87.3365479f), splat<V>(0.0f), res);
  return select(is_nan(x), x, res);  // NaN in, NaN out
}

// log(x) for x >= 0 (x = 0 gives -inf, +inf gives +inf): x = m * 2^e with m in
// [sqrt(1/2), sqrt(2)), log(m) = 2 atanh(s), s = (m - 1)/(m + 1), |s| <= 0.1716, odd series
// to s^11 (truncation < 1e-10 relative); e*ln2 in two parts. Subnormal x is not needed here
// (callers pass 1 + exp(.) >= 1) and is treated as 0.
template <typename V> SL_FN V log_pos(V x) {
  const auto bits = as_int(x);
  auto e = ((bits >> 23) & 0xff) - 127;
  V m = as_float((bits & 0x007fffff) | 0x3f800000);  // [1, 2)
  const auto big = m > splat<V>(1.41421356f);
  m = select(big, m * splat<V>(0.5f), m);
  e = select(big, e + 1, e);
  const V s = (m - splat<V>(1.0f)) / (m + splat<V>(1.0f));
  const V s2 = s * s;
  V q = splat<V>(2.0f / 11.0f);
  q = q * s2 + splat<V>(2.0f / 9.0f);
  q = q * s2 + splat<V>(2.0f / 7.0f);
  q = q * s2 + splat<V>(2.0f / 5.0f);
  q = q * s2 + splat<V>(2.0f / 3.0f);
  q = q * s2 + splat<V>(2.0f);
  const V fe = int_to_float<V>(e);
  V res = q * s + fe * splat<V>(1.428606765330187e-06f);
  res = res + fe * splat<V>(0.693145751953125f);
  res = select(x < splat<V>(1.17549435e-38f), splat<V>(-INFINITY), res);
  // +inf and NaN pass through (integer tests: float == and != scalarize in GCC's lowering)
  return select(bits >= 0x7f800000, x, res);
}

// log1p(x) for x >= 0: u = 1 + x rounded, then log(u) * x / (u - 1), exact for u == 1.
template <typename V> SL_FN V log1p_pos(V x) {
  const V u = splat<V>(1.0f) + x;
  const auto above = u > splat<V>(1.0f);  // u == 1 (x tiny or 0): log1p(x) = x
  const V d = select(above, u - splat<V>(1.0f), splat<V>(1.0f));
  return select(above, log_pos(u) * (x / d), x);
}

// The add that rounds y (|y| < 2^22) to k = rint(y) and leaves k, two's complement, in the
// low mantissa bits (exp2_parts), with no float-to-int conversion.
constexpr float kExp2Shift = 12582912.0f;  // 1.5 * 2^23
template <typename V> SL_FN V exp2_shifted(V y) { return y + splat<V>(kExp2Shift); }

// 2^k * 2^f from `shifted` = exp2_shifted(k) and f in [-1/2, 1/2]: 2^f = 1 + f*q(f), q a
// degree-4 fit of (2^f - 1)/f minimizing the relative error of 2^f (float32 max relative error
// 1.6e-7 with FMA, 1.8e-7 without, exactly 1 at f = 0, so slowly decaying states do not drift),
// then k added to its exponent field: an integer add instead of a multiply by 2^k, one
// operation fewer on the FMA ports. Exact while the result stays normal: callers keep
// |k| <= 125.
template <typename V> SL_FN V exp2_parts(V shifted, V f) {
  V q = splat<V>(1.326472964e-03f);
  q = q * f + splat<V>(9.671512991e-03f);
  q = q * f + splat<V>(5.550733209e-02f);
  q = q * f + splat<V>(2.402224541e-01f);
  q = q * f + splat<V>(6.931470037e-01f);
  const V p = q * f + splat<V>(1.0f);
  return from_uint<V>(as_uint(p) + (as_uint(shifted) << 23));
}

// 2^y for y <= 0 (the decay, with A pre-scaled by log2 e once per thread): y is clamped at
// -125, so y <= -125 and -inf give 2^-125 (2.4e-38, nothing against the state's input term);
// a NaN gives a NaN (it is in the step's other terms too); no range fixes above 0.
template <typename V> SL_FN V exp2_nonpos(V y) {
  const V yc = max_negative(y, -125.0f);
  const V shifted = exp2_shifted(yc);
  return exp2_parts(shifted, yc - (shifted - splat<V>(kExp2Shift)));
}

// SiLU(z) = z / (1 + e^-z) by exp2_parts: z is clamped into [-86, 86] for the exponential only
// (beyond, SiLU is z or below 1e-35 in magnitude), k = rint(-z log2 e), and the reduced
// argument is formed Cody-Waite style, -z - k ln2 in two parts, before it is scaled to the
// base-2 fraction f (a rounded -z log2 e would cost up to 4e-6 relative at |z| = 60). Max
// relative error about 2e-7; a NaN z stays NaN. About half the operations of exp_any with its
// range and NaN fixes, whose SiLU took most of the conv's time.
template <typename V> SL_FN V silu_exp2(V z) {
  const V zc = select(z > splat<V>(-86.0f), select(z < splat<V>(86.0f), z, splat<V>(86.0f)),
                      splat<V>(-86.0f));
  const V shifted = exp2_shifted(zc * splat<V>(-1.44269504f));
  const V k = shifted - splat<V>(kExp2Shift);
  V r = -zc - k * splat<V>(0.693145751953125f);
  r = r - k * splat<V>(1.428606765330187e-06f);
  return z / (splat<V>(1.0f) + exp2_parts(shifted, r * splat<V>(1.44269504f)));
}

template <typename V> SL_FN V exp_precise(V x) {
  if constexpr (traits<V>::lanes == 1) {
    return std::exp(x);
  } else {
    V r;
    for (int i = 0; i < traits<V>::lanes; ++i) r[i] = std::exp((float)x[i]);
    return r;
  }
}

}  // namespace sl_cpu

template <typename V> SL_FN V sl_exp(V x) { return sl_cpu::exp_any(x); }
template <typename V> SL_FN V sl_exp_fast(V x) { return sl_cpu::exp_any(x); }
template <typename V> SL_FN V sl_exp2_fast_decay(V y) { return sl_cpu::exp2_nonpos(y); }
template <typename V> SL_FN V sl_log_fast(V x) { return sl_cpu::log_pos(x); }
template <typename V> SL_FN V sl_recip_fast(V x) { return sl_cpu::splat<V>(1.0f) / x; }
template <typename V> SL_FN V sl_exp_precise(V x) { return sl_cpu::exp_precise(x); }
template <typename V> SL_FN V sl_log(V x) { return sl_cpu::log_pos(x); }
template <typename V> SL_FN V sl_log1p(V x) { return sl_cpu::log1p_pos(x); }
template <typename V> SL_FN V sl_rint(V x) { return sl_cpu::rint_small(x); }
template <typename V> SL_FN V sl_abs(V x) { return sl_cpu::select(x < sl_cpu::splat<V>(0.0f), -x, x); }
template <typename V> SL_FN V sl_max(V a, V b) { return sl_cpu::select(a > b, a, b); }
template <typename V> SL_FN V sl_pow2_int(V k) {
  return sl_cpu::as_float((sl_cpu::to_int(k) + 127) << 23);
}

#endif  // SL_BACKEND_CPU_H
