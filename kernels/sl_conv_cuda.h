// sl_conv_cuda.h -- the CUDA causal conv's thread (bimamba_conv_body.h). Seen after
// sl_backend_cuda.h and sl_mamba.h.
//
// The conv reads one float and writes one float per (channel, step): it is bound by memory
// latency, not arithmetic. One thread per channel, one step at a time (sl_causal_conv1d_thread,
// which Metal keeps) had one 4-byte load in flight per thread, about a third of what the H200's
// memory needs to stream at full rate. Here a thread takes VEC adjacent channels as 16-byte
// loads and reads UNROLL steps ahead through the read-only path (restrict-qualified, so the
// loads need not wait behind the previous step's stores). The per-channel arithmetic is
// sl_causal_conv1d_thread's, in the same order.
#ifndef SL_CONV_CUDA_H
#define SL_CONV_CUDA_H

// VEC = 4 needs 16-byte aligned x, out and strides that are multiples of 4 floats.
template <bool SILU, int VEC, int UNROLL>
SL_FN void sl_cuda_conv_thread(const float* __restrict__ x, SL_I64 sx, float* __restrict__ out,
                               SL_I64 so, const float* __restrict__ w, SL_I64 swk,
                               SL_I64 swd, const float* __restrict__ bias, SL_I64 sbd,
                               int length) {
  static_assert(VEC == 1 || VEC == 4, "one channel or a float4 of them per thread");
  float w0[VEC], w1[VEC], w2[VEC], w3[VEC], bv[VEC], x0[VEC], x1[VEC], x2[VEC];
  SL_UNROLL
  for (int c = 0; c < VEC; ++c) {
    w0[c] = __ldg(w + c * swd);
    w1[c] = __ldg(w + c * swd + swk);
    w2[c] = __ldg(w + c * swd + 2 * swk);
    w3[c] = __ldg(w + c * swd + 3 * swk);
    bv[c] = __ldg(bias + c * sbd);
    x0[c] = x1[c] = x2[c] = 0.0f;  // x[t-3], x[t-2], x[t-1]
  }
  for (int t0 = 0; t0 < length; t0 += UNROLL) {
    float xs[UNROLL][VEC];
    SL_UNROLL
    for (int s = 0; s < UNROLL; ++s) {  // the next UNROLL steps' loads, all in flight at once
      const float* p = x + (SL_I64)(t0 + s) * sx;
      if (t0 + s < length) {
        if (VEC == 4) {
          const float4 q = __ldg(reinterpret_cast<const float4*>(p));
          xs[s][0] = q.x;
          xs[s][VEC > 1 ? 1 : 0] = q.y;
          xs[s][VEC > 2 ? 2 : 0] = q.z;
          xs[s][VEC > 3 ? 3 : 0] = q.w;
        } else {
          xs[s][0] = __ldg(p);
        }
      }
    }
    SL_UNROLL
    for (int s = 0; s < UNROLL; ++s) {
      if (t0 + s >= length) break;
      float y[VEC];
      SL_UNROLL
      for (int c = 0; c < VEC; ++c) {
        const float x3 = xs[s][c];
        float acc = w0[c] * x0[c];
        acc = acc + w1[c] * x1[c];
        acc = acc + w2[c] * x2[c];
        acc = acc + w3[c] * x3;
        acc = acc + bv[c];
        y[c] = SILU ? sl_silu_standard(acc) : acc;
        x0[c] = x1[c];
        x1[c] = x2[c];
        x2[c] = x3;
      }
      float* o = out + (SL_I64)(t0 + s) * so;
      if (VEC == 4) {
        float4 q;
        q.x = y[0];
        q.y = y[VEC > 1 ? 1 : 0];
        q.z = y[VEC > 2 ? 2 : 0];
        q.w = y[VEC > 3 ? 3 : 0];
        *reinterpret_cast<float4*>(o) = q;
      } else {
        o[0] = y[0];
      }
    }
  }
}

#endif  // SL_CONV_CUDA_H
