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
// Geometry: a block of 256 threads (8 warps, 4 along rows x 2 along columns) computes a BM x BN
// tile of the output, BM = 128 (build.py's GEMM_ROWS), BN a multiple of 16 (each warp 32 x BN/2: 2 x BN/16 tiles of
// 16 x 8). K goes through shared memory in slices of 16 as plain floats, copied asynchronously
// (cp.async) three slices deep, so the next slices are in flight while one is multiplied; the
// two terms of a two-term product are one sequence of slices, and each thread works out its
// copies' addresses once (a slice adds its offset). Each operand is split as its fragment is
// read (integer rounding: full-rate ALU work, where cvt.rna runs at a fraction of that rate).
// The finished tile goes through shared memory, so every row leaves in 16-byte stores, with the
// bias added and, where the block holds whole rows, the LayerNorm applied.
//
// Accuracy: the tensor core truncates its float32 sums, so one accumulator fed every product
// of a long K drifts toward zero (measured on an H200: 4.4e-6 relative at K = 576, against
// 2.5e-7 for cuBLAS in float32). Each K slice therefore sums into fresh registers, which are
// then added to the running sum with a correctly rounded float add.
#ifndef SL_GEMM_CUDA_H
#define SL_GEMM_CUDA_H

// SL_GEMM_THREADS, SL_GEMM_BM and SL_GEMM_BK come from speechlens_cli/kernels/build.py
// (KERNEL_DEFINES["cuda"]), which launches the kernels with them.
#if !defined(SL_GEMM_THREADS) || !defined(SL_GEMM_BM) || !defined(SL_GEMM_BK)
#error "SL_GEMM_THREADS, SL_GEMM_BM and SL_GEMM_BK come from speechlens_cli/kernels/build.py"
#endif
static_assert(SL_GEMM_THREADS == 256, "the warps are laid out 4 along rows x 2 along columns");
static_assert(SL_GEMM_BM % (4 * 16) == 0, "each warp takes whole 16-row mma tiles");
static_assert(SL_GEMM_BK % 8 == 0, "a K slice is whole k8 mma steps");
constexpr int SL_GEMM_MI_TILES = SL_GEMM_BM / (4 * 16);  // 16-row mma tiles per warp
constexpr int SL_GEMM_STAGES = 3;
constexpr int SL_GEMM_A_STRIDE = SL_GEMM_BK + 4;  // rows 20 banks apart: conflict-free fragments

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
  asm(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// 16 bytes from global to shared memory without passing through registers (zeros when !valid:
// nothing is read then), and the fences of such copies: commit closes a group of copies, wait
// returns once at most PENDING of this thread's groups are still in flight.
SL_FN void sl_cp_async16(float* dst, const float* src, bool valid) {
  const unsigned to = (unsigned)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
               :: "r"(to), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
SL_FN void sl_cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int PENDING>
SL_FN void sl_cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" :: "n"(PENDING) : "memory");
}

SL_FN float sl_shfl_xor(float v, int mask) { return __shfl_xor_sync(0xffffffffu, v, mask); }
#endif

// The sum of v over the warp's 32 lanes, the same in every lane (butterfly: every lane adds the
// same pairs in the same order).
SL_FN float sl_warp_sum(float v) {
  SL_UNROLL
  for (int mask = 16; mask > 0; mask /= 2) v = __fadd_rn(v, sl_shfl_xor(v, mask));
  return v;
}

// x = hi + lo: hi is x rounded to TF32 (nearest, ties away from zero, by integer arithmetic on
// its bits), lo the exact remainder, of which the tensor core reads the top 11 bits.
SL_FN void sl_tf32_split(float x, unsigned& hi, unsigned& lo) {
  hi = (sl_float_bits(x) + 0x1000u) & 0xffffe000u;
  lo = sl_float_bits(x - sl_bits_float(hi));
}

// The block's shared memory: STAGES slices of A [BM][BK] and W [BK][BN] (padded rows) while the
// product runs, then the finished BM x BN tile.
template <int BN>
struct sl_gemm_smem {
  static constexpr int out_stride = BN + 4;
  union {
    struct {
      float a[SL_GEMM_STAGES][SL_GEMM_BM * SL_GEMM_A_STRIDE];
      float w[SL_GEMM_STAGES][SL_GEMM_BK * sl_gemm_w<BN>::stride];
    } pipe;
    float out[SL_GEMM_BM * out_stride];
  };
};

// This thread's share of W's slices (BK x BN of W [K, N], at most one float4 per thread): the
// same rows and columns of each slice, so the address is worked out once and a slice only adds
// its k0 (zeros outside W).
template <int BN, int N, int K>
struct sl_gemm_w_stager {
  const float* w;
  int w_row;
  bool w_inside;  // this thread's vector of W (where it stages one) is inside N

  SL_FN sl_gemm_w_stager(const float* w0, int n0, int tid) {
    w_row = tid / (BN / 4);
    const int w_col = (tid % (BN / 4)) * 4;
    w = w0 + (SL_I64)w_row * N + n0 + w_col;
    w_inside = n0 + w_col < N;
  }

  SL_FN void stage(sl_gemm_smem<BN>& s, int buf, int k0, int tid) const {
    if (tid < SL_GEMM_BK * BN / 4) {
      const bool inside = w_inside && (K % SL_GEMM_BK == 0 || k0 + w_row < K);
      sl_cp_async16(s.pipe.w[buf] + w_row * sl_gemm_w<BN>::stride + (tid % (BN / 4)) * 4,
                    inside ? w + (SL_I64)k0 * N : w, inside);
    }
  }
};

// The rows of A's slices (BM x BK) this thread copies: kAVecs float4s, kRowStep rows apart.
constexpr int SL_GEMM_ROW_STEP = SL_GEMM_THREADS / (SL_GEMM_BK / 4);
constexpr int SL_GEMM_A_VECS = SL_GEMM_BM / SL_GEMM_ROW_STEP;
static_assert(SL_GEMM_BM % SL_GEMM_ROW_STEP == 0, "A's slice is whole vectors per thread");

// Where this thread's vector j of A's slice goes in stage `buf`.
template <int BN>
SL_FN float* sl_gemm_a_slot(sl_gemm_smem<BN>& s, int buf, int j, int tid) {
  return s.pipe.a[buf] + (tid / (SL_GEMM_BK / 4) + j * SL_GEMM_ROW_STEP) * SL_GEMM_A_STRIDE +
         (tid % (SL_GEMM_BK / 4)) * 4;
}

// One term's share of this thread in the staging of every slice of a0 @ w0: A's rows are read
// with row stride LDA, and the addresses are worked out once (a slice adds its k0).
template <int BN, int N, int K, int LDA>
struct sl_gemm_stager {
  const float* a;  // this thread's first vector of the slice at k0 = 0
  unsigned rows_inside;  // bit j: the row of vector j is below `rows`
  int a_col;
  sl_gemm_w_stager<BN, N, K> w;

  SL_FN sl_gemm_stager(const float* a0, const float* w0, int rows, int m0, int n0, int tid)
      : w(w0, n0, tid) {
    const int r = tid / (SL_GEMM_BK / 4);
    a_col = (tid % (SL_GEMM_BK / 4)) * 4;
    a = a0 + (SL_I64)(m0 + r) * LDA + a_col;
    rows_inside = 0;
    SL_UNROLL
    for (int j = 0; j < SL_GEMM_A_VECS; ++j) {  // rows before 0 too: a conv's halo (zeros)
      const int row = m0 + r + j * SL_GEMM_ROW_STEP;
      rows_inside |= (row >= 0 && row < rows ? 1u : 0u) << j;
    }
  }

  // Starts the copies of the slice at k0 into stage `buf` (zeros outside the operands).
  SL_FN void stage(sl_gemm_smem<BN>& s, int buf, int k0, int tid) const {
    const bool a_cols = K % SL_GEMM_BK == 0 || k0 + a_col < K;
    SL_UNROLL
    for (int j = 0; j < SL_GEMM_A_VECS; ++j) {
      const bool inside = a_cols && (rows_inside >> j & 1u);
      sl_cp_async16(sl_gemm_a_slot(s, buf, j, tid),
                    inside ? a + (SL_I64)j * SL_GEMM_ROW_STEP * LDA + k0 : a, inside);
    }
    w.stage(s, buf, k0, tid);
  }
};

// acc += stage `buf`'s A slice times its W slice, for this warp's 32 x BN/2 part (the slice's
// products summed in fresh registers first).
template <int BN>
SL_FN void sl_gemm_slice(const sl_gemm_smem<BN>& s, int buf,
                         float (&acc)[SL_GEMM_MI_TILES][BN / 16][4], int warp_m, int warp_n,
                         int lane) {
  constexpr int kWs = sl_gemm_w<BN>::stride, kNT = BN / 16;
  const float* sa = s.pipe.a[buf];
  const float* sw = s.pipe.w[buf];
  const int g = lane / 4, t = lane % 4;
  float part[SL_GEMM_MI_TILES][kNT][4] = {};
  SL_UNROLL
  for (int k = 0; k < SL_GEMM_BK; k += 8) {
    unsigned ah[SL_GEMM_MI_TILES][4], al[SL_GEMM_MI_TILES][4], bh[kNT][2], bl[kNT][2];
    SL_UNROLL
    for (int mi = 0; mi < SL_GEMM_MI_TILES; ++mi) {
      const int r = warp_m * 16 * SL_GEMM_MI_TILES + mi * 16 + g;
      const int at[4] = {r * SL_GEMM_A_STRIDE + k + t, (r + 8) * SL_GEMM_A_STRIDE + k + t,
                         r * SL_GEMM_A_STRIDE + k + t + 4, (r + 8) * SL_GEMM_A_STRIDE + k + t + 4};
      SL_UNROLL
      for (int i = 0; i < 4; ++i) sl_tf32_split(sa[at[i]], ah[mi][i], al[mi][i]);
    }
    SL_UNROLL
    for (int ni = 0; ni < kNT; ++ni) {
      const int col = warp_n * (BN / 2) + ni * 8 + g;
      sl_tf32_split(sw[(k + t) * kWs + col], bh[ni][0], bl[ni][0]);
      sl_tf32_split(sw[(k + t + 4) * kWs + col], bh[ni][1], bl[ni][1]);
    }
    // the small terms first, then hi * hi; each round over all tiles, so that the products
    // into one accumulator are a round apart (independent ones in between)
    SL_UNROLL
    for (int term = 0; term < 3; ++term) {
      SL_UNROLL
      for (int mi = 0; mi < SL_GEMM_MI_TILES; ++mi) {
        SL_UNROLL
        for (int ni = 0; ni < kNT; ++ni) {
          sl_mma_tf32(part[mi][ni], term == 0 ? al[mi] : ah[mi], term == 1 ? bl[ni] : bh[ni]);
        }
      }
    }
  }
  SL_UNROLL
  for (int mi = 0; mi < SL_GEMM_MI_TILES; ++mi) {
    SL_UNROLL
    for (int ni = 0; ni < kNT; ++ni) {
      SL_UNROLL
      for (int i = 0; i < 4; ++i) acc[mi][ni][i] = __fadd_rn(acc[mi][ni][i], part[mi][ni][i]);
    }
  }
}

// acc += the product of `slices` K slices, stage(slice, buf) starting the copies of one: STAGES - 1
// of them in flight while one is multiplied. Ends with the block's shared memory free for the
// tile.
template <int BN, typename Stage>
SL_FN void sl_gemm_pipeline(sl_gemm_smem<BN>& s, float (&acc)[SL_GEMM_MI_TILES][BN / 16][4],
                            int slices, Stage stage) {
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  SL_UNROLL
  for (int slice = 0; slice < SL_GEMM_STAGES - 1; ++slice) {
    if (slice < slices) stage(slice, slice % SL_GEMM_STAGES);
    sl_cp_async_commit();
  }
  for (int slice = 0; slice < slices; ++slice) {
    sl_cp_async_wait<SL_GEMM_STAGES - 2>();  // this thread's copies of `slice` have landed,
    __syncthreads();  // everyone's too, and the stage about to be refilled has been read
    const int next = slice + SL_GEMM_STAGES - 1;
    if (next < slices) stage(next, next % SL_GEMM_STAGES);
    sl_cp_async_commit();
    sl_gemm_slice<BN>(s, slice % SL_GEMM_STAGES, acc, warp / 2, warp % 2, lane);
  }
  sl_cp_async_wait<0>();
  __syncthreads();
}

// acc = rows [m0, m0 + BM) of a0 @ w0 + a1 @ w1 (K1 = 0: one term), columns [n0, n0 + BN): the
// slices of both terms in one pipeline.
template <int BN, int N, int K0, int LDA0, int K1, int LDA1>
SL_FN void sl_gemm_product(sl_gemm_smem<BN>& s, float (&acc)[SL_GEMM_MI_TILES][BN / 16][4],
                           const float* a0, const float* w0, const float* a1, const float* w1,
                           int rows, int m0, int n0) {
  constexpr int kFirst = (K0 + SL_GEMM_BK - 1) / SL_GEMM_BK;
  constexpr int kSlices = kFirst + (K1 + SL_GEMM_BK - 1) / SL_GEMM_BK;
  const int tid = threadIdx.x;
  const sl_gemm_stager<BN, N, K0, LDA0> first(a0, w0, rows, m0, n0, tid);
  const sl_gemm_stager<BN, N, K1, LDA1> second(a1, w1, rows, m0, n0, tid);
  sl_gemm_pipeline<BN>(s, acc, kSlices, [&](int slice, int buf) {
    if (slice < kFirst) {
      first.stage(s, buf, slice * SL_GEMM_BK, tid);
    } else {
      second.stage(s, buf, (slice - kFirst) * SL_GEMM_BK, tid);
    }
  });
}

// A stride-1 2-D convolution (NHWC) as the product of its taps and W [KH * KW * NP * C, N]: row
// m of A is output pixel m (batch, time, column: [B, OH, OW] flattened), and the K slice of tap
// (i, j), plane p and channels [c0, c0 + 16) is read straight from plane p at the pixel the tap
// lands on (zeros where it lands outside the plane: the conv's zero padding), so neither the
// taps nor the planes' concatenation is built. The planes are NP inputs [B, H, WIDTH, C] (C a
// multiple of 16); K's order, tap row, tap column, plane, channel, is W's row order.
template <int BN, int N, int C, int NP, int KH, int KW, int PH, int PW, int DH, int DW,
          int WIDTH, int OW>
struct sl_conv_stager {
  static_assert(C % SL_GEMM_BK == 0, "a K slice lies within one plane");
  static constexpr int kPerTap = NP * C / SL_GEMM_BK;  // K slices per tap
  static constexpr int kSlices = KH * KW * kPerTap;
  const float* const* planes;
  int height;
  SL_I64 pixel[SL_GEMM_A_VECS];  // input pixel of vector j's output pixel (-1: no such row)
  int t[SL_GEMM_A_VECS], f[SL_GEMM_A_VECS];  // its time and column
  int a_col;
  sl_gemm_w_stager<BN, N, KH * KW * NP * C> w;

  SL_FN sl_conv_stager(const float* const* planes_, const float* w0, int batch, int height_,
                       int m0, int n0, int tid)
      : planes(planes_), height(height_), w(w0, n0, tid) {
    const int out_height = height + 2 * PH - DH * (KH - 1);
    const int rows = batch * out_height * OW;
    a_col = (tid % (SL_GEMM_BK / 4)) * 4;
    SL_UNROLL
    for (int j = 0; j < SL_GEMM_A_VECS; ++j) {
      const int m = m0 + tid / (SL_GEMM_BK / 4) + j * SL_GEMM_ROW_STEP;
      const int b = m / (out_height * OW), rest = m % (out_height * OW);
      t[j] = rest / OW;
      f[j] = rest % OW;
      pixel[j] = m < rows ? ((SL_I64)b * height + t[j]) * WIDTH + f[j] : -1;
    }
  }

  SL_FN void stage(sl_gemm_smem<BN>& s, int buf, int slice, int tid) const {
    const int tap = slice / kPerTap, within = slice % kPerTap;
    const int p = within / (C / SL_GEMM_BK), c0 = within % (C / SL_GEMM_BK) * SL_GEMM_BK;
    const int dt = tap / KW * DH - PH, df = tap % KW * DW - PW;
    const float* plane = planes[p] + c0 + a_col;
    SL_UNROLL
    for (int j = 0; j < SL_GEMM_A_VECS; ++j) {
      const int ti = t[j] + dt, fi = f[j] + df;
      const bool inside = pixel[j] >= 0 && ti >= 0 && ti < height && fi >= 0 && fi < WIDTH;
      sl_cp_async16(sl_gemm_a_slot(s, buf, j, tid),
                    inside ? plane + (pixel[j] + (SL_I64)dt * WIDTH + df) * C : planes[0],
                    inside);
    }
    w.stage(s, buf, slice * SL_GEMM_BK, tid);
  }
};

SL_FN void sl_add4(float4& v, float4 b) {
  v.x = __fadd_rn(v.x, b.x);
  v.y = __fadd_rn(v.y, b.y);
  v.z = __fadd_rn(v.z, b.z);
  v.w = __fadd_rn(v.w, b.w);
}

// What the store applies to the product: the bias (BIAS), a LayerNorm of each row (NORM: the
// block holds whole rows, BN == N, N a multiple of 32: zero mean and unit variance, divided by
// sqrt(variance + eps), scaled by norm_w and shifted by norm_b), then a residual (RESIDUAL:
// residual[row * residual_stride + column] added last, as `x + f(x)` adds it).
struct sl_gemm_epilogue {
  const float* __restrict__ bias;
  const float* __restrict__ norm_w;
  const float* __restrict__ norm_b;
  float eps;
  const float* __restrict__ residual;
  SL_I64 residual_stride;
};

// The finished tile from the warps' accumulators into the block's shared memory (s.out).
template <int BN>
SL_FN void sl_gemm_stash(sl_gemm_smem<BN>& s,
                         const float (&acc)[SL_GEMM_MI_TILES][BN / 16][4]) {
  constexpr int kOs = sl_gemm_smem<BN>::out_stride;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  SL_UNROLL
  for (int mi = 0; mi < SL_GEMM_MI_TILES; ++mi) {
    SL_UNROLL
    for (int ni = 0; ni < BN / 16; ++ni) {
      const int col = (warp % 2) * (BN / 2) + ni * 8 + 2 * t;
      SL_UNROLL
      for (int h = 0; h < 2; ++h) {
        const int row = (warp / 2) * 16 * SL_GEMM_MI_TILES + mi * 16 + g + 8 * h;
        s.out[row * kOs + col] = acc[mi][ni][2 * h];
        s.out[row * kOs + col + 1] = acc[mi][ni][2 * h + 1];
      }
    }
  }
  __syncthreads();
}

// out[m0.., n0..] = the epilogue of acc, rows below `rows` and columns below N only.
template <int BN, int N, bool BIAS, bool NORM, bool RESIDUAL>
SL_FN void sl_gemm_store(sl_gemm_smem<BN>& s, const float (&acc)[SL_GEMM_MI_TILES][BN / 16][4],
                         float* __restrict__ out, int rows, const sl_gemm_epilogue& e, int m0,
                         int n0) {
  static_assert(!NORM || (BN == N && N % 32 == 0), "a LayerNorm needs whole rows in a block");
  constexpr int kOs = sl_gemm_smem<BN>::out_stride;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  sl_gemm_stash<BN>(s, acc);
  if constexpr (NORM) {  // constexpr: N / 32 is no array size for narrower outputs
    // a warp per row, N / 32 values per lane; every lane of every warp takes part in every
    // row's sums (rows past the end included), only the stores are bounded
    constexpr int kPer = N / 32;
    for (int row = warp; row < SL_GEMM_BM; row += SL_GEMM_THREADS / 32) {
      float v[kPer];
      float sum = 0.0f;
      SL_UNROLL
      for (int j = 0; j < kPer; ++j) {
        const int col = lane + 32 * j;
        v[j] = s.out[row * kOs + col];
        if (BIAS) v[j] = __fadd_rn(v[j], __ldg(e.bias + col));
        sum = __fadd_rn(sum, v[j]);
      }
      const float mean = __fdiv_rn(sl_warp_sum(sum), (float)N);
      float squares = 0.0f;
      SL_UNROLL
      for (int j = 0; j < kPer; ++j) {
        v[j] = __fsub_rn(v[j], mean);
        squares = __fadd_rn(squares, __fmul_rn(v[j], v[j]));
      }
      const float variance = __fdiv_rn(sl_warp_sum(squares), (float)N);
      const float scale = __fdiv_rn(1.0f, sqrtf(__fadd_rn(variance, e.eps)));
      if (m0 + row < rows) {
        SL_UNROLL
        for (int j = 0; j < kPer; ++j) {
          const int col = lane + 32 * j;
          float y = __fadd_rn(__fmul_rn(__fmul_rn(v[j], scale), __ldg(e.norm_w + col)),
                              __ldg(e.norm_b + col));
          if (RESIDUAL) {
            y = __fadd_rn(y, __ldg(e.residual + (m0 + row) * e.residual_stride + col));
          }
          out[(SL_I64)(m0 + row) * N + col] = y;
        }
      }
    }
    return;
  }
  constexpr int kVecs = SL_GEMM_BM * BN / 4;
  for (int i = tid; i < kVecs; i += SL_GEMM_THREADS) {
    const int r = i / (BN / 4), c = (i % (BN / 4)) * 4;
    if (m0 + r >= rows || n0 + c >= N) continue;
    float4 v = *reinterpret_cast<const float4*>(s.out + r * kOs + c);
    if (BIAS) sl_add4(v, __ldg(reinterpret_cast<const float4*>(e.bias + n0 + c)));
    if (RESIDUAL) {
      const float* row = e.residual + (m0 + r) * e.residual_stride + n0 + c;
      sl_add4(v, __ldg(reinterpret_cast<const float4*>(row)));
    }
    *reinterpret_cast<float4*>(out + (SL_I64)(m0 + r) * N + n0 + c) = v;
  }
}

// A width-4 causal conv reads three steps back: the rows a tile computes beyond those it stores.
constexpr int SL_CONV_HALO = SL_CONV_WIDTH - 1;

// The store of a BiMamba's in_proj conv-input half with the Mamba conv applied
// (project_conv_cuda_body.h): the tile holds rows [m0, m0 + BM) of x = a @ w and columns
// [n0, n0 + BN) of one direction (dir = n0 / DI: the forward direction's channels, then the
// backward one's), and stores u = SiLU(conv(x) + bias) for the rows [first, first + BM - 3),
// whose taps all lie in the tile: the forward conv's three rows before (m0 = first - 3), the
// backward one's, which runs from the sequence's end, three rows after (m0 = first). A tap that
// lands outside the row's sequence (rows of `length` steps) reads zero: the conv's padding.
// The arithmetic is the conv kernel's (sl_causal_conv1d_step, taps in the direction's time
// order), so u is what that kernel makes of this x. out [2, rows, DI]; conv_w [2, DI, 4] (tap
// stride 1); conv_b [2, DI].
template <int BN, int DI>
SL_FN void sl_gemm_store_conv(sl_gemm_smem<BN>& s,
                              const float (&acc)[SL_GEMM_MI_TILES][BN / 16][4],
                              float* __restrict__ out, int rows, int length,
                              const float* __restrict__ conv_w, const float* __restrict__ conv_b,
                              int m0, int first, int n0) {
  static_assert(DI % BN == 0 && SL_GEMM_THREADS % (BN / 4) == 0,
                "a tile lies in one direction and a thread keeps its four channels");
  constexpr int kOs = sl_gemm_smem<BN>::out_stride, kRowStep = SL_GEMM_THREADS / (BN / 4);
  sl_gemm_stash<BN>(s, acc);
  const int tid = threadIdx.x, c = (tid % (BN / 4)) * 4;
  const int dir = n0 / DI, channel = dir * DI + n0 % DI + c;  // of conv_w's 2 * DI rows
  float w[4][SL_CONV_HALO + 1], bv[4];
  SL_UNROLL
  for (int q = 0; q < 4; ++q) {
    SL_UNROLL
    for (int k = 0; k <= SL_CONV_HALO; ++k) {
      w[q][k] = __ldg(conv_w + (SL_I64)(channel + q) * (SL_CONV_HALO + 1) + k);
    }
    bv[q] = __ldg(conv_b + channel + q);
  }
  int r = tid / (BN / 4);
  int t = (first + r) % length;  // the row's step in its sequence, then advanced row by row
  for (; r < SL_GEMM_BM - SL_CONV_HALO; r += kRowStep) {
    const int m = first + r;
    if (m >= rows) break;
    const int i = m - m0;  // the row in the tile
    float x[SL_CONV_HALO + 1][4];  // tap k = SL_CONV_HALO - k steps back in the conv's time
    SL_UNROLL
    for (int k = 0; k <= SL_CONV_HALO; ++k) {
      const int back = SL_CONV_HALO - k;
      const bool inside = dir == 0 ? t >= back : t + back < length;
      // rows are 16-byte aligned (out_stride is a multiple of 4): one vector load per tap
      float4 v = {0.0f, 0.0f, 0.0f, 0.0f};
      if (inside) {
        v = *reinterpret_cast<const float4*>(s.out + (dir == 0 ? i - back : i + back) * kOs + c);
      }
      x[k][0] = v.x;
      x[k][1] = v.y;
      x[k][2] = v.z;
      x[k][3] = v.w;
    }
    float y[4];
    SL_UNROLL
    for (int q = 0; q < 4; ++q) {
      y[q] = sl_silu_standard(sl_causal_conv1d_step(w[q][0], w[q][1], w[q][2], w[q][3], bv[q],
                                                    x[0][q], x[1][q], x[2][q], x[3][q]));
    }
    float4 o;
    o.x = y[0];
    o.y = y[1];
    o.z = y[2];
    o.w = y[3];
    *reinterpret_cast<float4*>(out + ((SL_I64)dir * rows + m) * DI + n0 % DI + c) = o;
    for (t += kRowStep; t >= length;) t -= length;
  }
}

#endif  // SL_GEMM_CUDA_H
