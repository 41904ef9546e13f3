// Body of the float32-accurate projection on tensor cores (sl_gemm_cuda.h), CUDA only.
// Signature (the precompiled wrapper's):
//   inputs  a0 [NB, B * L, K0] with row stride LDA0 (a column range of a row-contiguous parent)
//           and w0 [NB, K0, N]; a1, w1 likewise with K1, LDA1 (K1 = 0: no second term; then a1
//           and w1 are not read); bias [N] (read when BIAS); norm_w, norm_b [N] (read when NORM);
//   output  out [NB, B * L, N] = a0 @ w0 + a1 @ w1 (+ bias), per weight batch, with NORM each
//           row then LayerNorm'd (eps EPS, weight norm_w, bias norm_b), with RESIDUAL a0's row
//           (K0 = N: the input of `x + f(x)`) added last;
//   template N, K0, LDA0, K1, LDA1 (multiples of 4), BN (a multiple of 16; N with NORM), NB,
//           BIAS, NORM, EPS (a float), RESIDUAL.
// Grid: NB * ceil(B * L / 128) * ceil(N / BN) blocks of 256 threads; a row block's column
// blocks are neighbours in the grid, so its rows of a are read from L2 after the first.
constexpr int kColumnBlocks = (N + BN - 1) / BN;
const int rows = B * L;
const int row_blocks = (rows + SL_GEMM_BM - 1) / SL_GEMM_BM;
const int block = blockIdx.x;
const int batch = block / (kColumnBlocks * row_blocks);
const int m0 = (block / kColumnBlocks) % row_blocks * SL_GEMM_BM;
const int n0 = block % kColumnBlocks * BN;
__shared__ __align__(16) sl_gemm_smem<BN> smem;
float acc[SL_GEMM_MI_TILES][BN / 16][4] = {};
sl_gemm_product<BN, N, K0, LDA0, K1, LDA1>(
    smem, acc, a0 + (SL_I64)batch * rows * LDA0, w0 + (SL_I64)batch * K0 * N,
    a1 + (SL_I64)batch * rows * LDA1, w1 + (SL_I64)batch * (K1 > 0 ? K1 : 4) * N, rows, m0, n0);
const sl_gemm_epilogue epilogue = {bias, norm_w, norm_b, EPS, a0 + (SL_I64)batch * rows * LDA0,
                                   LDA0};
sl_gemm_store<BN, N, BIAS, NORM, RESIDUAL>(smem, acc, out + (SL_I64)batch * rows * N, rows,
                                           epilogue, m0, n0);
