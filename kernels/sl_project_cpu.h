// sl_project_cpu.h -- the CPU's projections: out = sum over terms of a @ w, plus a bias.
//
// RE-USE's projections are matrix products with a short inner dimension and few columns
// (in_proj 64 -> 512, x_proj 256 -> 36, the merge 64 + 512 -> 64) over ~10^5 rows, shapes at
// which the BLAS ran at 28-45 GFLOP/s on 2 AVX2 cores where the register tile of
// sl_tile_cpu.h reaches ~100 (measured). Work unit = P rows; for each block of NV vectors of
// columns, each term sums its K inputs through the tile into the rows' outputs (the first from
// the bias, or 0). The weights are packed once per call into column panels [K][OB] (zero
// columns past N), so a tile reads them contiguously. Each output sums the bias, then each
// term in order, whatever the thread count. Optionally a LayerNorm of each output row follows
// while the row block is still in cache (the BiMamba merge's: MLX's own LayerNorm, single-
// threaded, took 22-37 ms per merge at 5 s / 16 kHz on 2 Intel Xeon cores; measured).
#ifndef SL_PROJECT_CPU_H
#define SL_PROJECT_CPU_H

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "sl_backend_cpu.h"
#include "sl_tile_cpu.h"

namespace sl_project {

constexpr int kMaxTerms = 2;

struct Term {
  const float* a;       // rows of K inputs, row stride lda, unit column stride
  int64_t lda, k;
  const float* panels;  // the packed weights: ceil(N / OB) panels of [k][OB]
};

struct Args {
  Term terms[kMaxTerms];
  int nterms;
  const float* start;  // what each output starts from: the bias, or zeros, padded to whole panels
  float* out;          // rows of n outputs, row stride ldo, unit column stride
  int64_t ldo, rows, n;
  const float* norm_w;  // a LayerNorm over each output row, with weight and bias [n] (unit
  const float* norm_b;  // stride); null: none
  float norm_eps;
};

template <typename V>
SL_FN float lane_sum(V v) {
  float s = 0.0f;
  for (int i = 0; i < sl_cpu::traits<V>::lanes; ++i) s += v[i];
  return s;
}

// In place over `valid` rows at o (stride ldo) of n values: (x - mean) / sqrt(var + eps) * w + b,
// the mean and the (biased) variance of the row itself, in float32, two passes. Each row alone,
// in a fixed order: the result does not depend on the thread count.
template <typename V>
SL_FN void layer_norm_rows(float* o, int64_t ldo, int valid, int64_t n, const float* w,
                           const float* b, float eps) {
  constexpr int L = sl_cpu::traits<V>::lanes;
  const int64_t nv = n / L * L;
  for (int q = 0; q < valid; ++q) {
    float* row = o + q * ldo;
    V acc = sl_cpu::splat<V>(0.0f);
    for (int64_t j = 0; j < nv; j += L) acc = acc + SL_LOAD(V, row + j);
    float sum = lane_sum(acc);
    for (int64_t j = nv; j < n; ++j) sum += row[j];
    const float mean = sum / (float)n;
    const V m = sl_cpu::splat<V>(mean);
    V acc2 = sl_cpu::splat<V>(0.0f);
    for (int64_t j = 0; j < nv; j += L) {
      const V d = SL_LOAD(V, row + j) - m;
      acc2 = acc2 + d * d;
    }
    float squares = lane_sum(acc2);
    for (int64_t j = nv; j < n; ++j) squares += (row[j] - mean) * (row[j] - mean);
    const float scale = 1.0f / std::sqrt(squares / (float)n + eps);
    const V s = sl_cpu::splat<V>(scale);
    for (int64_t j = 0; j < nv; j += L) {
      SL_STORE(row + j, (SL_LOAD(V, row + j) - m) * s * SL_LOAD(V, w + j) + SL_LOAD(V, b + j));
    }
    for (int64_t j = nv; j < n; ++j) row[j] = (row[j] - mean) * scale * w[j] + b[j];
  }
}

// Packs w (element (k, j) at w[k * swk + j * swj]) into panels of OB columns.
inline void pack(const float* w, int64_t swk, int64_t swj, int64_t k, int64_t n, int ob,
                 float* panels) {
  for (int64_t p = 0; p * ob < n; ++p) {
    float* panel = panels + p * k * ob;
    for (int64_t c = 0; c < k; ++c) {
      for (int j = 0; j < ob; ++j) {
        const int64_t col = p * ob + j;
        panel[c * ob + j] = col < n ? w[c * swk + col * swj] : 0.0f;
      }
    }
  }
}

// Row blocks [begin, end) of P rows; `scratch` holds P x OB floats for a last, partial column
// block.
template <typename V, int NV, int P>
SL_FN void row_blocks(const Args& a, int64_t begin, int64_t end, float* scratch) {
  constexpr int OB = NV * sl_cpu::traits<V>::lanes;
  for (int64_t blk = begin; blk < end; ++blk) {
    const int64_t m0 = blk * P;
    const int valid = (int)std::min<int64_t>(P, a.rows - m0);
    for (int64_t col = 0; col < a.n; col += OB) {
      const int width = (int)std::min<int64_t>(OB, a.n - col);
      float* o = width == OB ? a.out + m0 * a.ldo + col : scratch;
      const int64_t ldo = width == OB ? a.ldo : OB;
      for (int t = 0; t < a.nterms; ++t) {
        const Term& term = a.terms[t];
        const float* x[P];
        for (int q = 0; q < P; ++q) x[q] = term.a + (m0 + std::min(q, valid - 1)) * term.lda;
        sl_tile::tile<V, NV, P>(x, term.k, term.panels + (col / OB) * term.k * OB, OB, o, ldo,
                                valid, t == 0 ? a.start + col : nullptr);
      }
      if (width < OB) {
        for (int q = 0; q < valid; ++q) {
          std::memcpy(a.out + (m0 + q) * a.ldo + col, scratch + q * OB, width * sizeof(float));
        }
      }
    }
    if (a.norm_w != nullptr) {
      layer_norm_rows<V>(a.out + m0 * a.ldo, a.ldo, valid, a.n, a.norm_w, a.norm_b, a.norm_eps);
    }
  }
}

}  // namespace sl_project

#endif  // SL_PROJECT_CPU_H
