// sl_scan_cuda.h -- the CUDA selective scan's geometry and loads (selective_scan_cuda_body.h).
// Seen after sl_backend_cuda.h and sl_mamba.h; the per-step math is sl_mamba.h's.
//
// RE-USE calls the scan with ~113k (batch, channel) pairs and L = 161-1501: about one wave of
// threads already, so one thread per pair (more lanes per pair only add waves and shuffles,
// measured). What made it faster on the H200 is latency hiding within the thread:
//   * the next step's u, z, delta_raw are loaded into registers before this step's math, through
//     restrict-qualified read-only loads (plain loads would wait behind the previous step's
//     store, which the compiler must assume may alias);
//   * B and C (per batch row and step, the same for every channel) are staged per block: the
//     block's threads copy CHUNK steps of them into shared memory together (double-buffered, the
//     next chunk loaded into registers while this one is computed, one barrier per chunk), so a
//     step reads them as broadcast float4s instead of waiting on global loads;
//   * standard mode uses the fast variant (sl_scan_delta_fast, 2^(delta*A*log2 e), fast SiLU);
//   * the dt projection (rank R, 4 for RE-USE) is applied per step from a staged input instead
//     of being a [B, L, DI] matmul output read back: one stream less per step and one tensor of
//     the scan's size less in memory.
// Staging needs every block inside one batch row (DI % TG == 0, so the grid is whole blocks and
// every thread reaches each barrier); otherwise the unstaged thread reads B/C in place (float4
// when their state stride is 1 and 16-byte aligned).
#ifndef SL_SCAN_CUDA_H
#define SL_SCAN_CUDA_H

// Sum over the NS states of one step: h updated in place, returns y = sum h*C. load(n, b, c)
// puts B and C of states n..n+3 into b[4], c[4]: loading four at a time, next to their use,
// keeps fewer values live than loading all 2*NS first (measured: 96 vs 119 registers).
template <bool STRICT, int NS, typename Load>
SL_FN float sl_cuda_scan_states(float* h, const float* a, float delta, float ut, Load load) {
  float y = 0.0f;
  const float du = delta * ut;
  SL_UNROLL
  for (int n = 0; n < NS; n += 4) {
    float bv[4], cv[4];
    load(n, bv, cv);
    SL_UNROLL
    for (int q = 0; q < 4; ++q) {
      if (STRICT) {
        h[n + q] = sl_scan_state_strict(h[n + q], delta, ut, a[n + q], bv[q]);
        y = sl_scan_accumulate_strict(y, h[n + q], cv[q]);
      } else {
        h[n + q] = sl_scan_state_standard_exp2(h[n + q], delta, du, a[n + q], bv[q]);
        y = sl_scan_accumulate_standard(y, h[n + q], cv[q]);
      }
    }
  }
  return y;
}

SL_FN void sl_cuda_unpack4(float4 q, float* v) {
  v[0] = q.x;
  v[1] = q.y;
  v[2] = q.z;
  v[3] = q.w;
}

// One (batch, channel) pair. u, z, out at (b, t = 0, d) with per-step strides; Bm, Cm at
// (b, t = 0, state 0) with per-step strides sB, sC and per-state strides sBn, sCn.
// R = 0: dt is delta_raw at (b, t = 0, d), per-step stride sdt. R > 0: dt is the rank-R input
// of the dt projection at (b, t = 0, 0) (per-step stride sdt, per-rank stride sdr), dtw the
// projection's row for this channel (per-rank stride sdw) and dtb its bias: delta_raw is formed
// per step (sl_dt_proj_term), so the [B, L, DI] delta_raw never exists. Like B and C, the rank-R
// input is the same for every channel of a step, so it is staged with them.
template <bool STRICT, int NS, int R, bool STAGE, int CHUNK, int TG>
SL_FN void sl_cuda_scan_thread(const float* __restrict__ u, int su,
                               const float* __restrict__ dt, int sdt, int sdr,
                               const float* __restrict__ dtw, int sdw, float dtb,
                               const float* __restrict__ z, int sz, float* __restrict__ out,
                               int so, const float* __restrict__ Bm, int sB, int sBn,
                               const float* __restrict__ Cm, int sC, int sCn,
                               const float* __restrict__ A_log, int sAn, float dskip,
                               int length) {
  constexpr int RP = (R + 3) / 4 * 4;               // the rank-R input, padded to a float4
  constexpr int ROW = 2 * NS + RP;                  // B, C, then the rank-R input of one step
  constexpr int TOTAL = CHUNK * ROW;                // staged values per chunk
  constexpr int PER = STAGE ? (TOTAL + TG - 1) / TG : 1;  // of them per thread
  __shared__ __align__(16) float sbc[STAGE ? 2 : 1][STAGE ? CHUNK : 1][ROW];
  float a[NS];
  float h[NS];
  SL_UNROLL
  for (int n = 0; n < NS; ++n) {
    const float al = __ldg(A_log + n * sAn);
    a[n] = STRICT ? sl_scan_A<true>(al) : sl_scan_A_exp2(al);
    h[n] = 0.0f;
  }
  float w[R > 0 ? R : 1];
  SL_UNROLL
  for (int k = 0; k < R; ++k) {
    w[k] = __ldg(dtw + k * sdw);
  }
  static_assert(NS % 4 == 0, "states are read four at a time");
  const bool vec = sBn == 1 && sCn == 1 && (sB & 3) == 0 && (sC & 3) == 0 &&
                   ((((unsigned long long)Bm) | ((unsigned long long)Cm)) & 15ull) == 0;
  const int tid = threadIdx.x;
  float r[PER];
  // Chunk t0's staged values into registers (zeros past the end), then into shared buffer `buf`.
  auto fetch = [&](int t0) {
    SL_UNROLL
    for (int k = 0; k < PER; ++k) {
      const int e = tid + k * TG;
      const int t = t0 + e / ROW;
      const int j = e % ROW;
      float v = 0.0f;
      if (e < TOTAL && t < length) {
        if (j < NS) {
          v = __ldg(Bm + (SL_I64)t * sB + j * sBn);
        } else if (j < 2 * NS) {
          v = __ldg(Cm + (SL_I64)t * sC + (j - NS) * sCn);
        } else if (j < 2 * NS + R) {
          v = __ldg(dt + (SL_I64)t * sdt + (j - 2 * NS) * sdr);
        }
      }
      r[k] = v;
    }
  };
  auto stash = [&](int buf) {
    SL_UNROLL
    for (int k = 0; k < PER; ++k) {
      const int e = tid + k * TG;
      if (e < TOTAL) sbc[buf][e / ROW][e % ROW] = r[k];
    }
  };
  if (STAGE) {
    fetch(0);
    stash(0);
    __syncthreads();
  }
  float nu = 0.0f, nz = 0.0f, ndt = 0.0f;
  if (length > 0) {
    nu = __ldg(u);
    nz = __ldg(z);
    if (R == 0) ndt = __ldg(dt);
  }
  int t = 0;
  for (int c = 0, t0 = 0; t0 < length; ++c, t0 += (STAGE ? CHUNK : length)) {
    const int steps = STAGE && length - t0 > CHUNK ? CHUNK : length - t0;
    const bool more = STAGE && t0 + CHUNK < length;
    if (more) fetch(t0 + CHUNK);
    const int buf = c & 1;
    for (int s = 0; s < steps; ++s, ++t) {
      const float ut = nu, zt = nz;
      float dtr = ndt;
      u += su;
      z += sz;
      if (R == 0) dt += sdt;
      if (t + 1 < length) {
        nu = __ldg(u);
        nz = __ldg(z);
        if (R == 0) ndt = __ldg(dt);
      }
      const float* row = STAGE ? &sbc[buf][s][0] : nullptr;
      if (R > 0) {
        dtr = dtb;
        SL_UNROLL
        for (int k = 0; k < R; ++k) {
          const float x = STAGE ? row[2 * NS + k] : __ldg(dt + (SL_I64)t * sdt + k * sdr);
          dtr = sl_dt_proj_term(dtr, w[k], x);
        }
      }
      const float delta = STRICT ? sl_scan_delta<true>(dtr) : sl_scan_delta_fast(dtr);
      float y;
      if (STAGE) {  // broadcast float4 reads of the staged step (rows are 16-byte aligned)
        y = sl_cuda_scan_states<STRICT, NS>(h, a, delta, ut, [&](int n, float* bv, float* cv) {
          sl_cuda_unpack4(*reinterpret_cast<const float4*>(row + n), bv);
          sl_cuda_unpack4(*reinterpret_cast<const float4*>(row + NS + n), cv);
        });
      } else {  // B/C in place: float4 when the state stride is 1 and aligned
        const float* bp = Bm + (SL_I64)t * sB;
        const float* cp = Cm + (SL_I64)t * sC;
        y = sl_cuda_scan_states<STRICT, NS>(h, a, delta, ut, [&](int n, float* bv, float* cv) {
          if (vec) {
            sl_cuda_unpack4(__ldg(reinterpret_cast<const float4*>(bp + n)), bv);
            sl_cuda_unpack4(__ldg(reinterpret_cast<const float4*>(cp + n)), cv);
          } else {
            SL_UNROLL
            for (int q = 0; q < 4; ++q) {
              bv[q] = __ldg(bp + (n + q) * sBn);
              cv[q] = __ldg(cp + (n + q) * sCn);
            }
          }
        });
      }
      *out = STRICT ? sl_scan_output_strict(y, dskip, ut, zt)
                    : sl_scan_output_fast(y, dskip, ut, zt);
      out += so;
    }
    if (STAGE) {
      if (more) stash(buf ^ 1);
      __syncthreads();
    }
  }
}

#endif  // SL_SCAN_CUDA_H
