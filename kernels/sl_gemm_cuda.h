// sl_gemm_cuda.h -- float32-accurate matrix products on tensor cores (projection_cuda_body.h).
// Seen after sl_backend_cuda.h.
//
// The model's projections are skinny products (K = 64-768, N = 36-512, M = 100k+ rows) that
// cuBLAS runs in full float32 on the CUDA cores, far below the GPU's float32 peak: K is too
// short for its tiles to reach steady state. Tensor cores take TF32 (10 mantissa bits), which
// alone would cost the model its float32 parity. Here every operand is split into a TF32 "high"
// part and the TF32 rounding of its remainder, and a*b is taken as hi*hi + hi*lo + lo*hi in
// float32 accumulators (the dropped lo*lo term is below float32's rounding of the product): three
// tensor-core products per tile, which keeps the accuracy of a float32 product.
//
// Geometry: a block of 128 threads (4 warps, 2 x 2) computes a BM x BN tile of the output,
// BM = 64, BN a multiple of 16 (each warp 32 x BN/2: 2 x BN/16 tiles of 16 x 8). K goes through
// shared memory in slices of 32 as plain floats; each operand is split as its fragment is read
// (integer rounding: full-rate ALU work, where cvt.rna runs at a fraction of that rate).
//
// Accuracy: the tensor core truncates its float32 sums, so one accumulator fed every product
// of a long K drifts toward zero (measured on an H200: 4.4e-6 relative at K = 576, against
// 2.5e-7 for cuBLAS in float32). Each K slice therefore sums into fresh registers, which are
// then added to the running sum with a correctly rounded float add.
#ifndef SL_GEMM_CUDA_H
#define SL_GEMM_CUDA_H

constexpr int SL_GEMM_THREADS = 128;
constexpr int SL_GEMM_BM = 64;
constexpr int SL_GEMM_BK = 32;
constexpr int SL_GEMM_A_STRIDE = SL_GEMM_BK + 4;  // rows 4 banks apart: conflict-free fragments

// Shared-memory row stride of a BN-wide weight slice: 8 or 24 (mod 32) banks between rows, so a
// warp's fragment loads (4 rows x 8 columns) hit 32 different banks.
template <int BN>
struct sl_gemm_w {
  static constexpr int stride = (BN % 32 == 0) ? BN + 8 : BN + (24 - BN % 32 + 32) % 32;
};

#ifndef SL_CUDA_ON_CPU
SL_FN unsigned sl_float_bits(float x) { return __float_as_uint(x); }
SL_FN float sl_bits_float(unsigned u) { return __uint_as_float(u); }

// c += a * b for one 16 x 8 x 8 tile of a warp (PTX mma.sync m16n8k8, TF32 in, float32 out).
// Fragments (g = lane / 4, t = lane % 4): a = A[g][t], A[g+8][t], A[g][t+4], A[g+8][t+4];
// b = B[t][g], B[t+4][g]; c = C[g][2t], C[g][2t+1], C[g+8][2t], C[g+8][2t+1].
SL_FN void sl_mma_tf32(float (&c)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#endif

// x = hi + lo: hi is x rounded to TF32 (nearest, ties away from zero, by integer arithmetic on
// its bits), lo the exact remainder, of which the tensor core reads the top 11 bits.
SL_FN void sl_tf32_split(float x, unsigned& hi, unsigned& lo) {
  hi = (sl_float_bits(x) + 0x1000u) & 0xffffe000u;
  lo = sl_float_bits(x - sl_bits_float(hi));
}

// The block's shared slices: A [BM][BK] and W [BK][BN] (padded rows).
template <int BN>
struct sl_gemm_smem {
  float a[SL_GEMM_BM * SL_GEMM_A_STRIDE];
  float w[SL_GEMM_BK * sl_gemm_w<BN>::stride];
};

// Stores the slice [k0, k0 + BK) of rows [m0, m0 + BM) of a (row stride lda, `rows` rows, K
// columns) and of rows [k0, k0 + BK), columns [n0, n0 + BN) of w ([K, N] row-major), zeros
// outside. K, N, lda multiples of 4 and 16-byte aligned rows (float4 loads and stores).
template <int BN, int N>
SL_FN void sl_gemm_stage(sl_gemm_smem<BN>& s, const float* __restrict__ a, SL_I64 lda, int rows,
                         int K, const float* __restrict__ w, int m0, int n0, int k0, int tid) {
  constexpr int kWs = sl_gemm_w<BN>::stride;
  constexpr int kAVecs = SL_GEMM_BM * SL_GEMM_BK / 4, kWVecs = SL_GEMM_BK * BN / 4;
  const float4 zero = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int i = tid; i < kAVecs; i += SL_GEMM_THREADS) {
    const int r = i / (SL_GEMM_BK / 4), c = (i % (SL_GEMM_BK / 4)) * 4;
    const bool inside = m0 + r < rows && k0 + c < K;
    *reinterpret_cast<float4*>(s.a + r * SL_GEMM_A_STRIDE + c) =
        inside ? __ldg(reinterpret_cast<const float4*>(a + (SL_I64)(m0 + r) * lda + k0 + c))
               : zero;
  }
  for (int i = tid; i < kWVecs; i += SL_GEMM_THREADS) {
    const int r = i / (BN / 4), c = (i % (BN / 4)) * 4;
    const bool inside = k0 + r < K && n0 + c < N;
    *reinterpret_cast<float4*>(s.w + r * kWs + c) =
        inside ? __ldg(reinterpret_cast<const float4*>(w + (SL_I64)(k0 + r) * N + n0 + c))
               : zero;
  }
}

// acc += the staged A slice times the staged W slice, for this warp's 32 x BN/2 part.
template <int BN>
SL_FN void sl_gemm_slice(const sl_gemm_smem<BN>& s, float (&acc)[2][BN / 16][4], int warp_m,
                         int warp_n, int lane) {
  constexpr int kWs = sl_gemm_w<BN>::stride, kNT = BN / 16;
  const int g = lane / 4, t = lane % 4;
  float part[2][kNT][4] = {};
  SL_UNROLL
  for (int k = 0; k < SL_GEMM_BK; k += 8) {
    unsigned ah[2][4], al[2][4], bh[kNT][2], bl[kNT][2];
    SL_UNROLL
    for (int mi = 0; mi < 2; ++mi) {
      const int r = warp_m * 32 + mi * 16 + g;
      const int at[4] = {r * SL_GEMM_A_STRIDE + k + t, (r + 8) * SL_GEMM_A_STRIDE + k + t,
                         r * SL_GEMM_A_STRIDE + k + t + 4, (r + 8) * SL_GEMM_A_STRIDE + k + t + 4};
      SL_UNROLL
      for (int i = 0; i < 4; ++i) sl_tf32_split(s.a[at[i]], ah[mi][i], al[mi][i]);
    }
    SL_UNROLL
    for (int ni = 0; ni < kNT; ++ni) {
      const int col = warp_n * (BN / 2) + ni * 8 + g;
      sl_tf32_split(s.w[(k + t) * kWs + col], bh[ni][0], bl[ni][0]);
      sl_tf32_split(s.w[(k + t + 4) * kWs + col], bh[ni][1], bl[ni][1]);
    }
    SL_UNROLL
    for (int mi = 0; mi < 2; ++mi) {
      SL_UNROLL
      for (int ni = 0; ni < kNT; ++ni) {  // the small terms first, then hi * hi
        sl_mma_tf32(part[mi][ni], al[mi], bh[ni]);
        sl_mma_tf32(part[mi][ni], ah[mi], bl[ni]);
        sl_mma_tf32(part[mi][ni], ah[mi], bh[ni]);
      }
    }
  }
  SL_UNROLL
  for (int mi = 0; mi < 2; ++mi) {
    SL_UNROLL
    for (int ni = 0; ni < kNT; ++ni) {
      SL_UNROLL
      for (int i = 0; i < 4; ++i) acc[mi][ni][i] = __fadd_rn(acc[mi][ni][i], part[mi][ni][i]);
    }
  }
}

// acc += rows [m0, m0 + BM) of a times columns [n0, n0 + BN) of w, over all of K.
template <int BN, int N>
SL_FN void sl_gemm_term(sl_gemm_smem<BN>& s, float (&acc)[2][BN / 16][4],
                        const float* __restrict__ a, SL_I64 lda, int rows, int K,
                        const float* __restrict__ w, int m0, int n0) {
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  for (int k0 = 0; k0 < K; k0 += SL_GEMM_BK) {
    sl_gemm_stage<BN, N>(s, a, lda, rows, K, w, m0, n0, k0, tid);
    __syncthreads();
    sl_gemm_slice<BN>(s, acc, warp / 2, warp % 2, lane);
    __syncthreads();
  }
}

// out[m0.., n0..] = acc (+ bias), rows below `rows` and columns below N only (N even).
template <int BN, int N, bool BIAS>
SL_FN void sl_gemm_store(const float (&acc)[2][BN / 16][4], float* __restrict__ out, int rows,
                         const float* __restrict__ bias, int m0, int n0) {
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  SL_UNROLL
  for (int mi = 0; mi < 2; ++mi) {
    SL_UNROLL
    for (int ni = 0; ni < BN / 16; ++ni) {
      const int col = n0 + (warp % 2) * (BN / 2) + ni * 8 + 2 * t;
      if (col >= N) continue;
      const float b0 = BIAS ? __ldg(bias + col) : 0.0f, b1 = BIAS ? __ldg(bias + col + 1) : 0.0f;
      SL_UNROLL
      for (int h = 0; h < 2; ++h) {
        const int row = m0 + (warp / 2) * 32 + mi * 16 + g + 8 * h;
        if (row < rows) {
          out[(SL_I64)row * N + col] = acc[mi][ni][2 * h] + b0;
          out[(SL_I64)row * N + col + 1] = acc[mi][ni][2 * h + 1] + b1;
        }
      }
    }
  }
}

#endif  // SL_GEMM_CUDA_H
