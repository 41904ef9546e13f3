// Body of the float32-accurate projection on tensor cores (sl_gemm_cuda.h), CUDA only.
// Signature (the precompiled wrapper's):
//   inputs  a0 [NB, B * L, K0] with row stride LDA0 (a column range of a row-contiguous parent)
//           and w0 [NB, K0, N]; a1, w1 likewise with K1, LDA1 (K1 = 0: no second term; then a1
//           and w1 are not read); bias [N] (read when BIAS);
//   output  out [NB, B * L, N] = a0 @ w0 + a1 @ w1 (+ bias), per weight batch;
//   template N, K0, LDA0, K1, LDA1 (multiples of 4), BN (a multiple of 16), NB, BIAS.
// Grid: NB * ceil(B * L / 64) * ceil(N / BN) blocks of 128 threads; a row block's column blocks
// are neighbours in the grid, so its rows of a are read from L2 after the first.
constexpr int kColumnBlocks = (N + BN - 1) / BN;
const int rows = B * L;
const int row_blocks = (rows + SL_GEMM_BM - 1) / SL_GEMM_BM;
const int block = blockIdx.x;
const int batch = block / (kColumnBlocks * row_blocks);
const int m0 = (block / kColumnBlocks) % row_blocks * SL_GEMM_BM;
const int n0 = block % kColumnBlocks * BN;
__shared__ __align__(16) sl_gemm_smem<BN> smem;
float acc[2][BN / 16][4] = {};
sl_gemm_term<BN, N>(smem, acc, a0 + (SL_I64)batch * rows * LDA0, LDA0, rows, K0,
                    w0 + (SL_I64)batch * K0 * N, m0, n0);
if (K1 > 0) {
  sl_gemm_term<BN, N>(smem, acc, a1 + (SL_I64)batch * rows * LDA1, LDA1, rows, K1,
                      w1 + (SL_I64)batch * K1 * N, m0, n0);
}
sl_gemm_store<BN, N, BIAS>(acc, out + (SL_I64)batch * rows * N, rows, bias, m0, n0);
