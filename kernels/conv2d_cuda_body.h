// Body of the direct stride-1 2-D convolution (NHWC) on tensor cores at float32 accuracy: the
// product of sl_gemm_cuda.h with its A slices read by sl_conv_stager straight from the planes.
// CUDA only. Signature (the precompiled wrapper's):
//   inputs  x0, x1, x2, x3 [B, L, WIDTH, C]: the planes whose channel concatenation is the
//           conv's input (the first NP are read; L is the height), w [KH * KW * NP * C, N] (the
//           weight taps first: tap row, tap column, input channel), bias [N] (read when BIAS);
//   output  out [B, OH, OW, N], OH = L + 2 PH - DH (KH - 1), OW = WIDTH + 2 PW - DW (KW - 1);
//   template N, BN (as the projection's), C, NP, KH, KW, PH, PW, DH, DW, WIDTH, OW, BIAS.
// Grid: ceil(B * OH * OW / 128) * ceil(N / BN) blocks of 256 threads; a row block's column
// blocks are neighbours in the grid, so its taps are read from L2 after the first.
constexpr int kColumnBlocks = (N + BN - 1) / BN;
const int out_rows = B * (L + 2 * PH - DH * (KH - 1)) * OW;
const int m0 = blockIdx.x / kColumnBlocks * SL_GEMM_BM;
const int n0 = blockIdx.x % kColumnBlocks * BN;
const float* const planes[4] = {x0, x1, x2, x3};
__shared__ __align__(16) sl_gemm_smem<BN> smem;
float acc[SL_GEMM_MI_TILES][BN / 16][4] = {};
using Taps = sl_conv_stager<BN, N, C, NP, KH, KW, PH, PW, DH, DW, WIDTH, OW>;
const Taps taps(planes, w, B, L, m0, n0, threadIdx.x);
sl_gemm_pipeline<BN>(smem, acc, Taps::kSlices,
                     [&](int slice, int buf) { taps.stage(smem, buf, slice, threadIdx.x); });
const sl_gemm_epilogue epilogue = {bias, bias, bias, 0.0f, bias, 0};
sl_gemm_store<BN, N, BIAS, false, false>(smem, acc, out, out_rows, epilogue, m0, n0);
