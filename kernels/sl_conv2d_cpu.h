// sl_conv2d_cpu.h -- the CPU's direct 2-D convolution for the encoder and decoders (NHWC).
//
// The dense blocks' 3x3 convolutions read the concatenation of every earlier layer's output.
// As matmuls they need that concatenation and its kernel-width taps materialised (three
// copies of a plane per layer) and run BLAS at K = 3 * channels; here each output pixel is
// summed straight from the input planes, so nothing is copied, padding costs nothing (an
// out-of-range pixel reads a zero row) and the weights of one (tap, plane) pair stay in L1.
//
// Work unit = one output row (batch item, time step). Within it, for every tap and plane, a
// register tile (sl_tile_cpu.h) of P adjacent pixels x NV vectors of output channels sums the
// plane's channels into the output row, which stays in cache.
// Each output sums bias, then (tap row, tap column, plane, channel) in that order, whatever the
// thread count, so results are reproducible.
#ifndef SL_CONV2D_CPU_H
#define SL_CONV2D_CPU_H

#include <algorithm>
#include <cstdint>

#include "sl_backend_cpu.h"
#include "sl_tile_cpu.h"

namespace sl_conv2d {

struct Args {
  const float* const* planes;  // nplanes inputs [batch, height, width, channels[p]], contiguous
  const int64_t* channels;     // channels of each plane
  int64_t nplanes;
  const float* weight;  // [kh, kw, sum(channels), out_channels], contiguous
  const float* bias;    // [out_channels] or null
  float* out;           // [batch, out_height, out_width, out_channels], contiguous
  int64_t batch, height, width, out_height, out_width, out_channels;
  int64_t kh, kw, ph, pw, dh, dw;
  const float* zeros;  // max(channels) zeros: the row an out-of-range pixel reads
};

template <typename V, int NV, int P>
SL_FN void rows(const Args& a, int64_t begin, int64_t end) {
  constexpr int OB = NV * sl_cpu::traits<V>::lanes;
  const int64_t O = a.out_channels, in_channels_total = [&] {
    int64_t s = 0;
    for (int64_t p = 0; p < a.nplanes; ++p) s += a.channels[p];
    return s;
  }();
  for (int64_t unit = begin; unit < end; ++unit) {
    const int64_t b = unit / a.out_height, t = unit % a.out_height;
    float* orow = a.out + (b * a.out_height + t) * a.out_width * O;
    for (int64_t f = 0; f < a.out_width; ++f) {
      for (int64_t o = 0; o < O; ++o) orow[f * O + o] = a.bias != nullptr ? a.bias[o] : 0.0f;
    }
    for (int64_t i = 0; i < a.kh; ++i) {
      const int64_t ti = t - a.ph + i * a.dh;
      if (ti < 0 || ti >= a.height) continue;
      for (int64_t j = 0; j < a.kw; ++j) {
        int64_t first_channel = 0;
        for (int64_t p = 0; p < a.nplanes; ++p) {
          const int64_t C = a.channels[p];
          const float* xrow = a.planes[p] + (b * a.height + ti) * a.width * C;
          const float* w = a.weight + ((i * a.kw + j) * in_channels_total + first_channel) * O;
          for (int64_t f0 = 0; f0 < a.out_width; f0 += P) {
            const float* x[P];
            for (int q = 0; q < P; ++q) {
              const int64_t fi = f0 + q - a.pw + j * a.dw;
              x[q] = (f0 + q < a.out_width && fi >= 0 && fi < a.width) ? xrow + fi * C : a.zeros;
            }
            const int valid = (int)std::min<int64_t>(P, a.out_width - f0);
            for (int64_t ob = 0; ob < O; ob += OB) {
              sl_tile::tile<V, NV, P>(x, C, w + ob, O, orow + f0 * O + ob, O, valid);
            }
          }
          first_channel += C;
        }
      }
    }
  }
}

}  // namespace sl_conv2d

#endif  // SL_CONV2D_CPU_H
