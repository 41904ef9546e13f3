// sl_tile_cpu.h -- the CPU's register-tile micro-kernel: a small block of a matrix product
// summed in registers, shared by the direct 2-D convolution (sl_conv2d_cpu.h) and the
// projections (sl_project_cpu.h).
#ifndef SL_TILE_CPU_H
#define SL_TILE_CPU_H

#include <cstdint>

#include "sl_backend_cpu.h"

namespace sl_tile {

// o[q][v] += sum over c < C of x[q][c] * w[c][v], for P rows (pixels) and NV vectors of W
// output columns: x[q] points at row q's C inputs, w at C rows of weights (stride ldw floats),
// o at row q's outputs (stride ldo floats). The sum starts from zero in registers and is added
// to `o` once, so a caller summing several blocks into `o` gets an error that grows with C
// plus the number of blocks, not with their product (a conv at 3 x 3 x 192 inputs: the largest
// error fell from 1.5e-6 to 2.0e-7 of the largest output, below BLAS's 3.3e-7). Rows from
// `valid` on are padding of the last tile: computed, never stored. With `init` (NV * W floats),
// `o` is not read: each row is set to init + the sum (a projection's first term and its bias).
template <typename V, int NV, int P>
SL_FN void tile(const float* const* x, int64_t C, const float* w, int64_t ldw, float* o,
                int64_t ldo, int valid, const float* init = nullptr) {
  constexpr int W = sl_cpu::traits<V>::lanes;
  V acc[P][NV];
  SL_UNROLL
  for (int q = 0; q < P; ++q) {
    SL_UNROLL
    for (int v = 0; v < NV; ++v) {
      acc[q][v] = SL_SPLAT(V, 0.0f);
    }
  }
  for (int64_t c = 0; c < C; ++c) {
    V wv[NV];
    SL_UNROLL
    for (int v = 0; v < NV; ++v) wv[v] = SL_LOAD(V, w + c * ldw + v * W);
    SL_UNROLL
    for (int q = 0; q < P; ++q) {
      const V xq = SL_SPLAT(V, x[q][c]);
      SL_UNROLL
      for (int v = 0; v < NV; ++v) acc[q][v] = acc[q][v] + xq * wv[v];
    }
  }
  SL_UNROLL
  for (int q = 0; q < P; ++q) {
    if (q < valid) {
      SL_UNROLL
      for (int v = 0; v < NV; ++v) {
        const V base = init != nullptr ? SL_LOAD(V, init + v * W) : SL_LOAD(V, o + q * ldo + v * W);
        SL_STORE(o + q * ldo + v * W, base + acc[q][v]);
      }
    }
  }
}

}  // namespace sl_tile

#endif  // SL_TILE_CPU_H
