// cpu_kernels.cpp -- speechlens' CPU kernels: the per-thread logic of sl_mamba.h (the same code
// the Metal and CUDA kernels run) instantiated on SIMD groups of adjacent channels, spread over
// CPU threads. Built by setup.py as speechlens_cli/_cpu_kernels*.so (or at run time by
// speechlens_cli/kernels/compiler.py) and called through ctypes with a plain C ABI
// (speechlens_cli/kernels/cpu_binding.py names every parameter).
//
// Compile with: -O2/-O3 -std=c++17 -ffp-contract=off (no -ffast-math) and build.py's -D flags.
//
// ISA: AVX-512 (16 lanes), AVX2 (8 lanes) and baseline (4 lanes) versions are compiled side by
// side with target attributes and picked at run time, so the library is portable across x86-64
// machines; other architectures get the 4-lane version.

#include "sl_backend_cpu.h"
#include "sl_conv2d_cpu.h"
#include "sl_mamba.h"
#include "sl_project_cpu.h"

#include <algorithm>
#include <cstdlib>
#include <cstdint>
#include <thread>
#include <vector>

#ifndef SL_SOURCE_HASH
#define SL_SOURCE_HASH "unknown"  // setup.py and the run-time compile pass the hash of the sources
#endif
// The ABI version, the state size, the scan's flags bit SL_SCAN_THREAD_ORDER (walk (batch,
// channel group) units as GPU threads do) and the codes of the SIMD builds (SL_ISA_*) come from
// speechlens_cli/kernels/build.py (KERNEL_DEFINES["cpu"]), as -D flags; sl_cpu_defines reports
// them back.
#if !defined(SL_CPU_ABI_VERSION) || !defined(SL_NSTATE) || !defined(SL_SCAN_THREAD_ORDER) || \
    !defined(SL_ISA_GENERIC) || !defined(SL_ISA_AVX2) || !defined(SL_ISA_AVX512)
#error "compile with the -D flags of speechlens_cli/kernels/build.py (KERNEL_DEFINES['cpu'])"
#endif
#define SL_STRINGIFY(x) #x
#define SL_VALUE(x) SL_STRINGIFY(x)

// Standard mode runs sl_mamba.h's fast step variants: the decay 2^(delta * A*log2 e), whose
// pre-scaled A saves a multiply per state and step and whose exponent-field 2^k needs no
// float-to-int conversion (sl_cpu::exp2_nonpos); softplus and SiLU keep their exact formulas
// (the CPU's sl_log_fast and sl_recip_fast are its ordinary log and division).
constexpr bool kCpuFastStep = true;
typedef sl_fast_tag<kCpuFastStep> CpuStandard;

namespace {

using sl_cpu::vf16;
using sl_cpu::vf32;
using sl_cpu::vf4;
using sl_cpu::vf8;

struct ConvArgs {
  const float* x;
  const float* w;
  const float* bias;
  float* out;
  int64_t nb, length, channels;
  int64_t sx[3], so[3], sw[2], sbias;
  int silu;  // apply SiLU to the output (CPU only: saves a separate, slow MLX pass)
  // Both directions of a BiMamba (directions == 2): x holds 2 x channels per step, the
  // backward direction's second; it runs anti-causally in place (its past is the later steps)
  // into out + out_dir, with taps w + w_dir and bias + bias_dir.
  int directions = 1;
  int64_t out_dir = 0, w_dir = 0, bias_dir = 0;
};

struct ScanArgs {
  const float *u, *dt, *z, *Bm, *Cm, *A_log, *Dskip;
  float* out;
  int64_t nb, length, channels;
  int64_t su[3], sdt[3], sz[3], so[3], sB[3], sC[3], sA[2], sD;
  int strict;
  int row_order;
  // Fused dt projection (row order only): when dt_wT is set, `dt` is the rank-R input of
  // dt_proj and delta_raw = dt_b + dt_wT^T . dt is formed per step in a per-thread row, which
  // saves writing and re-reading a [B, L, D] tensor (a K=4 GEMM runs far below BLAS speed).
  const float* dt_wT = nullptr;  // [rank, channels], contiguous
  const float* dt_b = nullptr;   // [channels], contiguous
  int64_t rank = 0;
};

// Row order: for one batch row, each time step computes every channel group before the next
// step, so x and out stream through memory row by row (the per-thread walk down one column
// touched a new cache line per step, and its SiLU pass read the column again). With both
// directions, one pass reads each whole input row once: the backward direction's output at
// step t takes steps t..t+3, read where they are, so nothing is reversed or read twice (two
// half-row passes ran 2x slower, measured). The taps and bias are gathered once into `wt`
// [directions, 5, channels] (taps oldest first, then the bias); the per-step arithmetic is
// sl_mamba.h's, and SiLU (sl_cpu::silu_exp2, the same in both modes) is applied while the
// output is in a register.
template <typename V>
SL_FN void conv_step(const float* wt, int64_t D, int64_t d, const float* xt, const float* x1,
                     const float* x2, const float* x3, float* ot, int silu) {
  const V zero = SL_SPLAT(V, 0.0f);
  const V y = sl_causal_conv1d_step(
      SL_LOAD(V, wt + d), SL_LOAD(V, wt + D + d), SL_LOAD(V, wt + 2 * D + d),
      SL_LOAD(V, wt + 3 * D + d), SL_LOAD(V, wt + 4 * D + d), x3 ? SL_LOAD(V, x3 + d) : zero,
      x2 ? SL_LOAD(V, x2 + d) : zero, x1 ? SL_LOAD(V, x1 + d) : zero, SL_LOAD(V, xt + d));
  SL_STORE(ot + d, silu ? sl_cpu::silu_exp2(y) : y);
}

// One direction at step t: x1..x3 are its previous three steps (null before the sequence).
template <typename V>
SL_FN void conv_direction(const float* wt, int64_t D, const float* xt, const float* x1,
                          const float* x2, const float* x3, float* ot, int silu) {
  const int W = sl_cpu::traits<V>::lanes;
  const int64_t G = D / W;
  for (int64_t g = 0; g < G; ++g) conv_step<V>(wt, D, g * W, xt, x1, x2, x3, ot, silu);
  for (int64_t d = G * W; d < D; ++d) conv_step<float>(wt, D, d, xt, x1, x2, x3, ot, silu);
}

template <typename V>
SL_FN void conv_rows(const ConvArgs& a, int64_t b_begin, int64_t b_end, float* wt) {
  const int64_t D = a.channels, L = a.length, st = a.sx[1];
  for (int k = 0; k < a.directions; ++k) {
    float* wk = wt + k * (SL_CONV_WIDTH + 1) * D;
    for (int64_t d = 0; d < D; ++d) {
      for (int j = 0; j < SL_CONV_WIDTH; ++j) {
        wk[j * D + d] = a.w[k * a.w_dir + d * a.sw[0] + j * a.sw[1]];
      }
      wk[SL_CONV_WIDTH * D + d] = a.bias[k * a.bias_dir + d * a.sbias];
    }
  }
  for (int64_t b = b_begin; b < b_end; ++b) {
    const float* x = a.x + b * a.sx[0];
    float* out = a.out + b * a.so[0];
    for (int64_t t = 0; t < L; ++t) {
      const float* xt = x + t * st;
      conv_direction<V>(wt, D, xt, t >= 1 ? xt - st : nullptr, t >= 2 ? xt - 2 * st : nullptr,
                        t >= 3 ? xt - 3 * st : nullptr, out + t * a.so[1], a.silu);
      if (a.directions == 2) {
        const float* xb = xt + D;
        conv_direction<V>(wt + (SL_CONV_WIDTH + 1) * D, D, xb,
                          t + 1 < L ? xb + st : nullptr, t + 2 < L ? xb + 2 * st : nullptr,
                          t + 3 < L ? xb + 3 * st : nullptr, out + a.out_dir + t * a.so[1],
                          a.silu);
      }
    }
  }
}

template <typename V>
SL_FN void conv_rows_alloc(const ConvArgs& a, int64_t b_begin, int64_t b_end) {
  std::vector<float> wt((size_t)(a.directions * (SL_CONV_WIDTH + 1) * a.channels));
  conv_rows<V>(a, b_begin, b_end, wt.data());
}

template <bool STRICT, typename V>
SL_FN V scan_delta(V delta_raw) {
  return STRICT ? sl_scan_delta<true>(delta_raw) : sl_standard_delta(delta_raw, CpuStandard());
}

template <typename V, bool STRICT>
SL_FN void scan_one(const ScanArgs& a, int64_t b, int64_t d) {
  sl_selective_scan_thread<STRICT, SL_NSTATE, V, kCpuFastStep>(
      a.u + b * a.su[0] + d * a.su[2], a.su[1], a.dt + b * a.sdt[0] + d * a.sdt[2], a.sdt[1],
      a.z + b * a.sz[0] + d * a.sz[2], a.sz[1], a.out + b * a.so[0] + d * a.so[2], a.so[1],
      a.Bm + b * a.sB[0], a.sB[1], a.sB[2], a.Cm + b * a.sC[0], a.sC[1], a.sC[2],
      a.A_log + d * a.sA[0], a.sA[1], a.sA[0], a.Dskip + d * a.sD, a.sD, (int)a.length);
}

// Thread-order scan: unit = (batch, group of W channels) walks the whole sequence, exactly the
// GPU per-thread function with V = W lanes.
template <typename V, bool STRICT>
SL_FN void scan_units(const ScanArgs& a, int64_t begin, int64_t end) {
  const int W = sl_cpu::traits<V>::lanes;
  const int64_t groups = (a.channels + W - 1) / W;
  for (int64_t unit = begin; unit < end; ++unit) {
    const int64_t b = unit / groups;
    const int64_t d0 = (unit % groups) * W;
    if (d0 + W <= a.channels) {
      scan_one<V, STRICT>(a, b, d0);
    } else {
      for (int64_t d = d0; d < a.channels; ++d) scan_one<float, STRICT>(a, b, d);
    }
  }
}

// Row-order scan: for one batch row, every time step updates all channel groups before the
// next step, so u/delta/z/out stream through memory row by row (1 KB rows at D = 256) instead
// of one 64-byte column per row. The state of the whole row (D x 16 floats) stays in L1. Same
// per-step arithmetic (sl_scan_* of sl_mamba.h); channels beyond the last full group use the
// per-thread function lane by lane.
template <typename V, bool STRICT>
SL_FN void scan_rows(const ScanArgs& a, int64_t b_begin, int64_t b_end, V* h, V* A, V* dskip,
                     float* dt_row) {
  const int W = sl_cpu::traits<V>::lanes;
  const int64_t G = a.channels / W;
  for (int64_t g = 0; g < G; ++g) {
    for (int n = 0; n < SL_NSTATE; ++n) {
      const V al = SL_LOAD_STRIDED(V, a.A_log + g * W * a.sA[0] + n * a.sA[1], a.sA[0]);
      A[g * SL_NSTATE + n] = STRICT ? sl_scan_A<true>(al) : sl_standard_A(al, CpuStandard());
    }
    dskip[g] = SL_LOAD_STRIDED(V, a.Dskip + g * W * a.sD, a.sD);
  }
  for (int64_t b = b_begin; b < b_end; ++b) {
    for (int64_t i = 0; i < G * SL_NSTATE; ++i) h[i] = SL_SPLAT(V, 0.0f);
    const float* u = a.u + b * a.su[0];
    const float* dt = a.dt + b * a.sdt[0];
    const float* z = a.z + b * a.sz[0];
    float* out = a.out + b * a.so[0];
    const float* Bm = a.Bm + b * a.sB[0];
    const float* Cm = a.Cm + b * a.sC[0];
    for (int64_t t = 0; t < a.length; ++t) {
      const float* dts = dt;
      if (a.dt_wT != nullptr) {
        for (int64_t g = 0; g < G; ++g) {
          V acc = SL_LOAD(V, a.dt_b + g * W);
          for (int64_t k = 0; k < a.rank; ++k) {
            acc = sl_dt_proj_term(acc, SL_LOAD(V, a.dt_wT + k * a.channels + g * W),
                                  SL_SPLAT(V, dt[k * a.sdt[2]]));
          }
          SL_STORE(dt_row + g * W, acc);
        }
        dts = dt_row;
      }
      float bn[SL_NSTATE], cn[SL_NSTATE];
      for (int n = 0; n < SL_NSTATE; ++n) {
        bn[n] = Bm[n * a.sB[2]];
        cn[n] = Cm[n * a.sC[2]];
      }
      int64_t g = 0;
      // two channel groups per pass: their 2 x 16 independent state chains interleave in the
      // instruction stream, which the out-of-order core needs to hide the exp latency
      for (; g + 2 <= G; g += 2) {
        V* h0 = h + g * SL_NSTATE;
        V* h1 = h0 + SL_NSTATE;
        const V* A0 = A + g * SL_NSTATE;
        const V* A1 = A0 + SL_NSTATE;
        const V u0 = SL_LOAD(V, u + g * W), u1 = SL_LOAD(V, u + g * W + W);
        const V z0 = SL_LOAD(V, z + g * W), z1 = SL_LOAD(V, z + g * W + W);
        const V d0 = scan_delta<STRICT>(SL_LOAD(V, dts + g * W));
        const V d1 = scan_delta<STRICT>(SL_LOAD(V, dts + g * W + W));
        V y0 = SL_SPLAT(V, 0.0f), y1 = SL_SPLAT(V, 0.0f);
        if (STRICT) {
          SL_UNROLL
          for (int n = 0; n < SL_NSTATE; ++n) {
            h0[n] = sl_scan_state_strict(h0[n], d0, u0, A0[n], bn[n]);
            h1[n] = sl_scan_state_strict(h1[n], d1, u1, A1[n], bn[n]);
            y0 = sl_scan_accumulate_strict(y0, h0[n], cn[n]);
            y1 = sl_scan_accumulate_strict(y1, h1[n], cn[n]);
          }
          SL_STORE(out + g * W, sl_scan_output_strict(y0, dskip[g], u0, z0));
          SL_STORE(out + g * W + W, sl_scan_output_strict(y1, dskip[g + 1], u1, z1));
        } else {
          const V du0 = d0 * u0, du1 = d1 * u1;
          SL_UNROLL
          for (int n = 0; n < SL_NSTATE; ++n) {
            h0[n] = sl_standard_state(h0[n], d0, du0, A0[n], bn[n], CpuStandard());
            h1[n] = sl_standard_state(h1[n], d1, du1, A1[n], bn[n], CpuStandard());
            y0 = sl_scan_accumulate_standard(y0, h0[n], cn[n]);
            y1 = sl_scan_accumulate_standard(y1, h1[n], cn[n]);
          }
          SL_STORE(out + g * W, sl_standard_output(y0, dskip[g], u0, z0, CpuStandard()));
          SL_STORE(out + g * W + W,
                   sl_standard_output(y1, dskip[g + 1], u1, z1, CpuStandard()));
        }
      }
      for (; g < G; ++g) {
        V* hg = h + g * SL_NSTATE;
        const V* Ag = A + g * SL_NSTATE;
        const V ut = SL_LOAD(V, u + g * W);
        const V zt = SL_LOAD(V, z + g * W);
        const V delta = scan_delta<STRICT>(SL_LOAD(V, dts + g * W));
        V y = SL_SPLAT(V, 0.0f);
        if (STRICT) {
          SL_UNROLL
          for (int n = 0; n < SL_NSTATE; ++n) {
            hg[n] = sl_scan_state_strict(hg[n], delta, ut, Ag[n], bn[n]);
            y = sl_scan_accumulate_strict(y, hg[n], cn[n]);
          }
          SL_STORE(out + g * W, sl_scan_output_strict(y, dskip[g], ut, zt));
        } else {
          const V du = delta * ut;
          SL_UNROLL
          for (int n = 0; n < SL_NSTATE; ++n) {
            hg[n] = sl_standard_state(hg[n], delta, du, Ag[n], bn[n], CpuStandard());
            y = sl_scan_accumulate_standard(y, hg[n], cn[n]);
          }
          SL_STORE(out + g * W, sl_standard_output(y, dskip[g], ut, zt, CpuStandard()));
        }
      }
      u += a.su[1];
      dt += a.sdt[1];
      z += a.sz[1];
      out += a.so[1];
      Bm += a.sB[1];
      Cm += a.sC[1];
    }
    for (int64_t d = G * W; d < a.channels; ++d) scan_one<float, STRICT>(a, b, d);
  }
}

template <typename V, bool STRICT>
SL_FN void scan_rows_alloc(const ScanArgs& a, int64_t b_begin, int64_t b_end) {
  const int W = sl_cpu::traits<V>::lanes;
  const int64_t G = a.channels / W;
  // 64-byte aligned scratch (std::vector of over-aligned vector types is not reliable here)
  const size_t count = (size_t)(2 * G * SL_NSTATE + 2 * G + 1);
  void* raw = std::aligned_alloc(64, ((count * sizeof(V) + 63) / 64) * 64);
  if (raw == nullptr) return;
  V* buf = static_cast<V*>(raw);
  scan_rows<V, STRICT>(a, b_begin, b_end, buf, buf + G * SL_NSTATE, buf + 2 * G * SL_NSTATE,
                       reinterpret_cast<float*>(buf + 2 * G * SL_NSTATE + G));
  std::free(raw);
}

// y = fn(x) over n contiguous floats, W lanes at a time (the tests' window on a math function).
template <typename V, typename Fn>
SL_FN void map_n(const float* x, float* y, int64_t n, Fn fn) {
  const int W = sl_cpu::traits<V>::lanes;
  int64_t i = 0;
  for (; i + W <= n; i += W) sl_cpu::store(y + i, fn(sl_cpu::load<V>(x + i)));
  for (; i < n; ++i) y[i] = fn(x[i]);
}

#define SL_MEMBER_FN inline __attribute__((always_inline))
struct ExpPoly {
  template <typename V> SL_MEMBER_FN V operator()(V x) const { return sl_exp_poly(x); }
};
struct Exp2Decay {
  template <typename V> SL_MEMBER_FN V operator()(V x) const { return sl_exp2_fast_decay(x); }
};

enum Isa { ISA_GENERIC = SL_ISA_GENERIC, ISA_AVX2 = SL_ISA_AVX2, ISA_AVX512 = SL_ISA_AVX512 };

// One entry point per ISA; everything below them is force-inlined, so each gets its own code.
// Standard mode keeps the compiler's default FP contraction (GCC: fuse across statements), and
// so do the kernels that are the same in both modes (conv1d, the 2-D conv, the projections);
// the translation unit itself is built with -ffp-contract=off, which strict mode relies on.
#if defined(__GNUC__) && !defined(__clang__)
#define SL_CONTRACT_DEFAULT __attribute__((optimize("fp-contract=fast")))
#else
#define SL_CONTRACT_DEFAULT
#endif

#define SL_DEFINE_ISA(SUFFIX, TARGET, V)                                                     \
  TARGET SL_CONTRACT_DEFAULT static void conv_##SUFFIX(const ConvArgs& a, int64_t b,        \
                                                       int64_t e) {                          \
    conv_rows_alloc<V>(a, b, e);                                                              \
  }                                                                                           \
  TARGET SL_CONTRACT_DEFAULT static void scan_std_##SUFFIX(const ScanArgs& a, int64_t b,     \
                                                           int64_t e) {                      \
    scan_rows_alloc<V, false>(a, b, e);                                                       \
  }                                                                                           \
  TARGET static void scan_strict_##SUFFIX(const ScanArgs& a, int64_t b, int64_t e) {         \
    scan_rows_alloc<V, true>(a, b, e);                                                        \
  }                                                                                           \
  TARGET static void scan_##SUFFIX(const ScanArgs& a, int64_t b, int64_t e) {                \
    if (a.strict) {                                                                           \
      scan_strict_##SUFFIX(a, b, e);                                                          \
    } else {                                                                                  \
      scan_std_##SUFFIX(a, b, e);                                                             \
    }                                                                                         \
  }                                                                                           \
  TARGET static void exp_poly_##SUFFIX(const float* x, float* y, int64_t n) {                \
    map_n<V>(x, y, n, ExpPoly());                                                             \
  }                                                                                           \
  TARGET SL_CONTRACT_DEFAULT static void exp2_decay_##SUFFIX(const float* x, float* y,         \
                                                             int64_t n) {                     \
    map_n<V>(x, y, n, Exp2Decay());                                                           \
  }

// The register tiles (sl_tile_cpu.h) per ISA: NV vectors of columns x P rows. AVX2: 4 x 3 for
// the convs and the projections whose columns fill 32-wide blocks, 2 x 6 for the others (x_proj's
// 36 columns: 48 computed instead of 64). On an AMD EPYC (Zen 3), 2 threads, alternating builds,
// 4 x 3 ran a four-plane dense layer at 124-140 GFLOP/s (2 x 6: 75-129) and in_proj at 95-115
// (83-104); x_proj ran at 61-74 with 2 x 6 (4 x 3: 52-56); 1 x 12, 2 x 5, 3 x 4 and 4 x 2 were
// slower. AVX-512 (not compared here): 4 x 6, 24 accumulators of 32 registers; baseline 2 x 6.
#define SL_DEFINE_TILES(SUFFIX, TARGET, V, NV, P, NARROW_NV, NARROW_P)                          \
  constexpr int64_t kTileColumns_##SUFFIX = NV * sl_cpu::traits<V>::lanes;                    \
  constexpr int kTileRows_##SUFFIX = P;                                                       \
  constexpr int64_t kNarrowColumns_##SUFFIX = NARROW_NV * sl_cpu::traits<V>::lanes;           \
  constexpr int kNarrowRows_##SUFFIX = NARROW_P;                                              \
  TARGET SL_CONTRACT_DEFAULT static void conv2d_##SUFFIX(const sl_conv2d::Args& a, int64_t b, \
                                                         int64_t e) {                         \
    sl_conv2d::rows<V, NV, P>(a, b, e);                                                       \
  }                                                                                           \
  TARGET SL_CONTRACT_DEFAULT static void project_##SUFFIX(                                    \
      const sl_project::Args& a, int64_t b, int64_t e, float* scratch, bool narrow) {         \
    if (narrow) return sl_project::row_blocks<V, NARROW_NV, NARROW_P>(a, b, e, scratch);      \
    sl_project::row_blocks<V, NV, P>(a, b, e, scratch);                                       \
  }                                                                                           \
  static_assert(true, "")

// Thread order (the GPU's walk, kept for tests and comparison): baseline ISA only.
SL_CONTRACT_DEFAULT static void scan_threads_std(const ScanArgs& a, int64_t b, int64_t e) {
  scan_units<vf4, false>(a, b, e);
}
static void scan_threads_strict(const ScanArgs& a, int64_t b, int64_t e) {
  scan_units<vf4, true>(a, b, e);
}

#define SL_TARGET_AVX2 __attribute__((target("avx2,fma")))
#define SL_TARGET_AVX512 __attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,avx2,fma")))
SL_DEFINE_ISA(generic, , vf4)
SL_DEFINE_TILES(generic, , vf4, 2, 6, 2, 6);
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SL_HAVE_X86_ISAS 1
SL_DEFINE_ISA(avx2, SL_TARGET_AVX2, vf8)
SL_DEFINE_ISA(avx512, SL_TARGET_AVX512, vf16)
SL_DEFINE_TILES(avx2, SL_TARGET_AVX2, vf8, 4, 3, 2, 6);
SL_DEFINE_TILES(avx512, SL_TARGET_AVX512, vf16, 4, 6, 4, 6);
#endif

int best_isa() {
#ifdef SL_HAVE_X86_ISAS
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("fma")) {
    return ISA_AVX512;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return ISA_AVX2;
#endif
  return ISA_GENERIC;
}

int resolve_isa(int requested) {
  const int best = best_isa();
  if (requested < 0 || requested > best) return best;
  return requested;
}

// The per-ISA builds of one map function of SL_DEFINE_ISA (y = f(x) over n floats).
typedef void (*MapFn)(const float*, float*, int64_t);
struct MapBuilds {
  MapFn generic, avx2, avx512;
};
#ifdef SL_HAVE_X86_ISAS
#define SL_MAP_BUILDS(NAME) (MapBuilds{NAME##_generic, NAME##_avx2, NAME##_avx512})
#else
#define SL_MAP_BUILDS(NAME) (MapBuilds{NAME##_generic, nullptr, nullptr})
#endif

void map_on_isa(const MapBuilds& builds, int isa, const float* x, float* y, int64_t n) {
  isa = resolve_isa(isa);
  if (isa == ISA_AVX512 && builds.avx512 != nullptr) return builds.avx512(x, y, n);
  if (isa == ISA_AVX2 && builds.avx2 != nullptr) return builds.avx2(x, y, n);
  builds.generic(x, y, n);
}

int lanes_of(int isa) { return isa == ISA_AVX512 ? 16 : (isa == ISA_AVX2 ? 8 : 4); }

// Runs fn(begin, end) over [0, units) on up to nthreads threads (the caller's thread included).
template <typename Fn>
void parallel_for(int64_t units, int nthreads, Fn fn) {
  nthreads = (int)std::max<int64_t>(1, std::min<int64_t>(nthreads, units));
  if (nthreads == 1) {
    fn(0, units);
    return;
  }
  std::vector<std::thread> pool;
  pool.reserve(nthreads - 1);
  const int64_t chunk = units / nthreads, extra = units % nthreads;
  int64_t begin = 0;
  for (int i = 0; i < nthreads; ++i) {
    const int64_t end = begin + chunk + (i < extra ? 1 : 0);
    if (i == nthreads - 1) {
      fn(begin, end);
    } else {
      pool.emplace_back(fn, begin, end);
    }
    begin = end;
  }
  for (auto& t : pool) t.join();
}

// ---- InstanceNorm statistics and the affine + PReLU that follows it (dense blocks) ----
// x is [rows, channels] contiguous (one batch item's T x F plane, or a time tile of it).

// Per-channel sums of x (center == nullptr) or of (x - center)^2, in double, over rows
// [begin, end) into acc[channels].
void channel_sums_rows(const float* __restrict__ x, int64_t channels,
                       const float* __restrict__ center, double* __restrict__ acc, int64_t begin,
                       int64_t end) {
  for (int64_t r = begin; r < end; ++r) {
    const float* row = x + r * channels;
    if (center == nullptr) {
      for (int64_t c = 0; c < channels; ++c) acc[c] += (double)row[c];
    } else {
      for (int64_t c = 0; c < channels; ++c) {
        const double d = (double)row[c] - (double)center[c];
        acc[c] += d * d;
      }
    }
  }
}

// y = (x - mean) * scale + bias, then PReLU: the same float32 operations, in the same order,
// as the MLX graph (layers.InstanceNorm, layers.PReLU), so only signed zeros can differ. Four
// channels at a time in vector types: GCC does not if-convert the scalar select (measured
// 100 ms for a 64-channel 16 kHz plane, branch mispredictions on random signs).
template <typename V>
SL_FN V affine_prelu(V x, V mean, V scale, V bias, V slope) {
  const V y = (x - mean) * scale + bias;
  return sl_cpu::select(y >= sl_cpu::splat<V>(0.0f), y, slope * y);
}

void affine_prelu_rows(const float* x, float* out, int64_t channels, const float* mean,
                       const float* scale, const float* bias, const float* slope, int64_t begin,
                       int64_t end) {
  const int64_t whole = channels - channels % 4;
  for (int64_t r = begin; r < end; ++r) {
    const float* row = x + r * channels;
    float* dst = out + r * channels;
    for (int64_t c = 0; c < whole; c += 4) {
      SL_STORE(dst + c, affine_prelu(SL_LOAD(vf4, row + c), SL_LOAD(vf4, mean + c),
                                     SL_LOAD(vf4, scale + c), SL_LOAD(vf4, bias + c),
                                     SL_LOAD(vf4, slope + c)));
    }
    for (int64_t c = whole; c < channels; ++c) {
      dst[c] = affine_prelu(row[c], mean[c], scale[c], bias[c], slope[c]);
    }
  }
}

void run_conv(const ConvArgs& a, int nthreads, int isa) {
  isa = resolve_isa(isa);
  parallel_for(a.nb, nthreads, [&a, isa](int64_t b, int64_t e) {
#ifdef SL_HAVE_X86_ISAS
    if (isa == ISA_AVX512) return conv_avx512(a, b, e);
    if (isa == ISA_AVX2) return conv_avx2(a, b, e);
#endif
    conv_generic(a, b, e);
  });
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) int sl_cpu_abi_version() { return SL_CPU_ABI_VERSION; }

// The macros this library was compiled with, "NAME=value" separated by spaces
// (speechlens_cli/kernels/cpu_binding.py compares them with build.py's when it loads it).
__attribute__((visibility("default"))) const char* sl_cpu_defines() {
  return "SL_CPU_ABI_VERSION=" SL_VALUE(SL_CPU_ABI_VERSION) " SL_NSTATE=" SL_VALUE(SL_NSTATE)
         " SL_CONV_WIDTH=" SL_VALUE(SL_CONV_WIDTH)
         " SL_SCAN_THREAD_ORDER=" SL_VALUE(SL_SCAN_THREAD_ORDER)
         " SL_ISA_AVX512=" SL_VALUE(SL_ISA_AVX512) " SL_ISA_AVX2=" SL_VALUE(SL_ISA_AVX2)
         " SL_ISA_GENERIC=" SL_VALUE(SL_ISA_GENERIC);
}

// Hash of the kernel sources this library was compiled from (speechlens_cli/kernels/cpu_binding.py compares it).
__attribute__((visibility("default"))) const char* sl_cpu_source_hash() { return SL_SOURCE_HASH; }

// The ISA that `requested` (-1 = best available, else an SL_ISA_* code) resolves to here.
__attribute__((visibility("default"))) int sl_cpu_isa(int requested) {
  return resolve_isa(requested);
}

// The SIMD width, in channels, of the ISA that `requested` resolves to here.
__attribute__((visibility("default"))) int sl_cpu_lanes(int requested) {
  return lanes_of(resolve_isa(requested));
}

// Strides are in elements, ordered (batch, time, channel); weight strides (channel, tap).
// Output/input channel strides must be 1 (the SIMD lanes are adjacent channels).
// Returns 0 on success, a negative code for arguments it cannot handle.
__attribute__((visibility("default"))) int sl_cpu_causal_conv1d(
    const float* x, const int64_t* sx, const float* w, const int64_t* sw, const float* bias,
    int64_t sbias, float* out, const int64_t* so, int64_t nb, int64_t length, int64_t channels,
    int64_t taps, int nthreads, int isa, int silu) {
  if (taps != SL_CONV_WIDTH) return -1;
  if (sx[2] != 1 || so[2] != 1) return -2;
  if (nb <= 0 || length <= 0 || channels <= 0) return 0;
  run_conv(ConvArgs{x, w, bias, out, nb, length, channels, {sx[0], sx[1], sx[2]},
                    {so[0], so[1], so[2]}, {sw[0], sw[1]}, sbias, silu},
           nthreads, isa);
  return 0;
}

// Both directions of a BiMamba's conv + SiLU in one pass over the rows: x [nb, length,
// 2 * channels] (the forward direction's channels, then the backward one's; strides (batch,
// time, channel)), out [2, nb, length, channels] (strides (direction, batch, time, channel)), w
// [2, channels, taps] and bias [2, channels] (strides (direction, channel[, tap])). The
// backward direction is the causal conv of the time-reversed sequence, written in original
// time order.
__attribute__((visibility("default"))) int sl_cpu_bimamba_conv1d(
    const float* x, const int64_t* sx, const float* w, const int64_t* sw, const float* bias,
    const int64_t* sbias, float* out, const int64_t* so, int64_t nb, int64_t length,
    int64_t channels, int64_t taps, int nthreads, int isa) {
  if (taps != SL_CONV_WIDTH) return -1;
  if (sx[2] != 1 || so[3] != 1) return -2;
  if (nb <= 0 || length <= 0 || channels <= 0) return 0;
  ConvArgs a{x, w, bias, out, nb, length, channels, {sx[0], sx[1], sx[2]},
             {so[1], so[2], so[3]}, {sw[1], sw[2]}, sbias[1], 1};
  a.directions = 2;
  a.out_dir = so[0];
  a.w_dir = sw[0];
  a.bias_dir = sbias[0];
  run_conv(a, nthreads, isa);
  return 0;
}

__attribute__((visibility("default"))) int sl_cpu_selective_scan(
    const float* u, const int64_t* su, const float* dt, const int64_t* sdt, const float* A_log,
    const int64_t* sA, const float* Bm, const int64_t* sB, const float* Cm, const int64_t* sC,
    const float* Dskip, int64_t sD, const float* z, const int64_t* sz, float* out,
    const int64_t* so, int64_t nb, int64_t length, int64_t channels, int64_t nstate, int strict,
    int nthreads, int isa, int flags, const float* dt_wT, const float* dt_b, int64_t rank) {
  if (nstate != SL_NSTATE) return -1;
  if (su[2] != 1 || (rank == 0 && sdt[2] != 1) || sz[2] != 1 || so[2] != 1) return -2;
  if (nb <= 0 || length <= 0 || channels <= 0) return 0;
  ScanArgs a{u, dt, z, Bm, Cm, A_log, Dskip, out, nb, length, channels,
             {su[0], su[1], su[2]}, {sdt[0], sdt[1], sdt[2]}, {sz[0], sz[1], sz[2]},
             {so[0], so[1], so[2]}, {sB[0], sB[1], sB[2]}, {sC[0], sC[1], sC[2]},
             {sA[0], sA[1]}, sD, strict ? 1 : 0, (flags & SL_SCAN_THREAD_ORDER) ? 0 : 1};
  isa = a.row_order ? resolve_isa(isa) : ISA_GENERIC;
  if (rank > 0) {
    // the fused projection exists in the row-order walk only, for whole channel groups
    if (!a.row_order || channels % lanes_of(isa) != 0) return -3;
    a.dt_wT = dt_wT;
    a.dt_b = dt_b;
    a.rank = rank;
  }
  const int64_t units = a.row_order ? nb : nb * ((channels + 3) / 4);
  parallel_for(units, nthreads, [&a, isa](int64_t b, int64_t e) {
    if (!a.row_order) return a.strict ? scan_threads_strict(a, b, e) : scan_threads_std(a, b, e);
#ifdef SL_HAVE_X86_ISAS
    if (isa == ISA_AVX512) return scan_avx512(a, b, e);
    if (isa == ISA_AVX2) return scan_avx2(a, b, e);
#endif
    scan_generic(a, b, e);
  });
  return 0;
}

// A stride-1 2-D convolution (sl_conv2d_cpu.h) whose input is the channel concatenation of
// nplanes contiguous NHWC planes, each [nb, height, width, channels[p]]; weight
// [kh, kw, sum(channels), out_channels] and out [nb, out_height, out_width, out_channels],
// contiguous; bias [out_channels] or null. Zero padding ph (time) and pw (width), dilation dh, dw.
// Returns 0, or a negative code for arguments it cannot handle (out_channels must be a multiple
// of 8; the widest ISA whose register tile divides out_channels runs).
__attribute__((visibility("default"))) int sl_cpu_conv2d(
    const float* const* planes, const int64_t* channels, int64_t nplanes, const float* weight,
    const float* bias, float* out, int64_t nb, int64_t height, int64_t width,
    int64_t out_channels, int64_t kh, int64_t kw, int64_t ph, int64_t pw, int64_t dh,
    int64_t dw, int nthreads, int isa) {
  if (nplanes <= 0 || kh <= 0 || kw <= 0 || dh <= 0 || dw <= 0 || ph < 0 || pw < 0) return -1;
  if (out_channels <= 0 || out_channels % kTileColumns_generic != 0) return -2;
  int64_t widest = 0;
  for (int64_t p = 0; p < nplanes; ++p) {
    if (channels[p] <= 0) return -1;
    widest = std::max(widest, channels[p]);
  }
  const int64_t out_height = height + 2 * ph - dh * (kh - 1);
  const int64_t out_width = width + 2 * pw - dw * (kw - 1);
  if (nb <= 0 || out_height <= 0 || out_width <= 0) return 0;
  const std::vector<float> zeros((size_t)widest, 0.0f);
  const sl_conv2d::Args a{planes, channels, nplanes, weight, bias, out, nb, height, width,
                          out_height, out_width, out_channels, kh, kw, ph, pw, dh, dw,
                          zeros.data()};
  isa = resolve_isa(isa);
#ifdef SL_HAVE_X86_ISAS
  if (isa == ISA_AVX512 && out_channels % kTileColumns_avx512 != 0) isa = ISA_AVX2;
  if (isa == ISA_AVX2 && out_channels % kTileColumns_avx2 != 0) isa = ISA_GENERIC;
#endif
  parallel_for(nb * out_height, nthreads, [&a, isa](int64_t b, int64_t e) {
#ifdef SL_HAVE_X86_ISAS
    if (isa == ISA_AVX512) return conv2d_avx512(a, b, e);
    if (isa == ISA_AVX2) return conv2d_avx2(a, b, e);
#endif
    conv2d_generic(a, b, e);
  });
  return 0;
}

// out = a0 @ w0 (+ a1 @ w1) (+ bias) for nb batches of `rows` rows (sl_project_cpu.h). Strides
// in elements: a (batch, row) with unit column stride, w (batch, k, column), out (batch, row)
// with unit column stride, bias one stride; a1/w1 null for one term, bias null for none;
// norm_w/norm_b ([n], contiguous) a LayerNorm of each output row with norm_eps, or both null.
// Returns 0, or a negative code for arguments it cannot handle.
__attribute__((visibility("default"))) int sl_cpu_project(
    const float* a0, const int64_t* sa0, int64_t k0, const float* w0, const int64_t* sw0,
    const float* a1, const int64_t* sa1, int64_t k1, const float* w1, const int64_t* sw1,
    const float* bias, int64_t sbias, float* out, const int64_t* so, int64_t nb, int64_t rows,
    int64_t n, const float* norm_w, const float* norm_b, float norm_eps, int nthreads, int isa) {
  if (k0 <= 0 || n <= 0 || (a1 != nullptr && k1 <= 0)) return -1;
  if ((norm_w == nullptr) != (norm_b == nullptr)) return -1;
  if (nb <= 0 || rows <= 0) return 0;
  isa = resolve_isa(isa);
  int64_t ob = kTileColumns_generic;
  int P = kTileRows_generic;
  bool narrow = false;
  auto pick = [&](int64_t wide, int wide_rows, int64_t thin, int thin_rows) {
    narrow = n % wide != 0 && thin < wide;  // a partial wide block would compute too much
    ob = narrow ? thin : wide;
    P = narrow ? thin_rows : wide_rows;
  };
#ifdef SL_HAVE_X86_ISAS
  if (isa == ISA_AVX512) {
    pick(kTileColumns_avx512, kTileRows_avx512, kNarrowColumns_avx512, kNarrowRows_avx512);
  } else if (isa == ISA_AVX2) {
    pick(kTileColumns_avx2, kTileRows_avx2, kNarrowColumns_avx2, kNarrowRows_avx2);
  } else
#endif
  {
    pick(kTileColumns_generic, kTileRows_generic, kNarrowColumns_generic, kNarrowRows_generic);
  }
  const int64_t blocks = (rows + P - 1) / P, column_blocks = (n + ob - 1) / ob;
  std::vector<float> start((size_t)(column_blocks * ob), 0.0f);  // the bias, or zeros
  for (int64_t j = 0; bias != nullptr && j < n; ++j) start[j] = bias[j * sbias];
  const int nterms = a1 != nullptr ? 2 : 1;
  const float* as[2] = {a0, a1};
  const int64_t* sas[2] = {sa0, sa1};
  const float* ws[2] = {w0, w1};
  const int64_t* sws[2] = {sw0, sw1};
  const int64_t ks[2] = {k0, k1};
  std::vector<float> panels[2];
  for (int t = 0; t < nterms; ++t) panels[t].resize((size_t)(column_blocks * ks[t] * ob));
  for (int64_t b = 0; b < nb; ++b) {
    sl_project::Args a{};
    a.nterms = nterms;
    for (int t = 0; t < nterms; ++t) {
      sl_project::pack(ws[t] + b * sws[t][0], sws[t][1], sws[t][2], ks[t], n, ob,
                       panels[t].data());
      a.terms[t] = sl_project::Term{as[t] + b * sas[t][0], sas[t][1], ks[t], panels[t].data()};
    }
    a.start = start.data();
    a.out = out + b * so[0];
    a.ldo = so[1];
    a.rows = rows;
    a.n = n;
    a.norm_w = norm_w;
    a.norm_b = norm_b;
    a.norm_eps = norm_eps;
    parallel_for(blocks, nthreads, [&a, isa, P, ob, narrow](int64_t begin, int64_t end) {
      std::vector<float> scratch((size_t)(P * ob));
#ifdef SL_HAVE_X86_ISAS
      if (isa == ISA_AVX512) return project_avx512(a, begin, end, scratch.data(), narrow);
      if (isa == ISA_AVX2) return project_avx2(a, begin, end, scratch.data(), narrow);
#endif
      project_generic(a, begin, end, scratch.data(), narrow);
    });
  }
  return 0;
}

// The strict-mode decay exponential of sl_mamba.h on n contiguous floats (for tests).
__attribute__((visibility("default"))) void sl_cpu_exp_poly(const float* x, float* y, int64_t n,
                                                             int isa) {
  map_on_isa(SL_MAP_BUILDS(exp_poly), isa, x, y, n);
}

// The standard-mode decay 2^x (x <= 0) of the scan on n contiguous floats (for tests), compiled as
// the standard scan is (FMA contraction where the ISA has it).
__attribute__((visibility("default"))) void sl_cpu_exp2_decay(const float* x, float* y, int64_t n,
                                                               int isa) {
  map_on_isa(SL_MAP_BUILDS(exp2_decay), isa, x, y, n);
}

// Per-channel sums over a [rows, channels] float32 plane, accumulated in double into acc
// (added to what acc holds, so a plane's time tiles can be summed call by call): of x when
// center is null, else of (x - center)^2. Rows are summed in fixed blocks whose partial sums
// are added in block order, so the result does not depend on nthreads.
__attribute__((visibility("default"))) void sl_cpu_channel_sums(
    const float* x, int64_t rows, int64_t channels, const float* center, double* acc,
    int nthreads) {
  if (rows <= 0 || channels <= 0) return;
  const int64_t block = 1024, blocks = (rows + block - 1) / block;
  std::vector<double> partial((size_t)blocks * channels, 0.0);
  parallel_for(blocks, nthreads, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      channel_sums_rows(x, channels, center, partial.data() + i * channels, i * block,
                        std::min(rows, (i + 1) * block));
    }
  });
  for (int64_t i = 0; i < blocks; ++i) {
    for (int64_t c = 0; c < channels; ++c) acc[c] += partial[(size_t)i * channels + c];
  }
}

// out = PReLU((x - mean) * scale + bias) over a [rows, channels] float32 plane.
__attribute__((visibility("default"))) void sl_cpu_affine_prelu(
    const float* x, float* out, int64_t rows, int64_t channels, const float* mean,
    const float* scale, const float* bias, const float* slope, int nthreads) {
  if (rows <= 0 || channels <= 0) return;
  parallel_for(rows, nthreads, [&](int64_t b, int64_t e) {
    affine_prelu_rows(x, out, channels, mean, scale, bias, slope, b, e);
  });
}

}  // extern "C"
