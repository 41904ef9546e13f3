// Body of a BiMamba's in_proj conv-input half with both directions' causal conv and SiLU applied
// in the store (sl_gemm_cuda.h's product and sl_gemm_store_conv), CUDA only: the in_proj output
// x [B, L, 2 DI] is never written, and the conv is not a pass of its own over it.
// Signature (the precompiled wrapper's):
//   inputs  a0 [B * L, K0] with row stride LDA0 (the BiMamba's input), w0 [K0, 2 DI] (both
//           directions' conv-input columns of in_proj, the forward ones first), conv_w [2, DI,
//           4, 1], conv_b [2, DI];
//   output  out [2, B, L, DI]: u, as the two-direction conv (bimamba_conv_body.h) makes it of x;
//   template K0, LDA0 (multiples of 4), DI (a multiple of BN), BN (a multiple of 16).
// Grid: ceil(B * L / (128 - 3)) * (2 DI / BN) blocks of 256 threads. A block stores 125 rows
// and computes 128: the forward direction's tiles start three rows early, the backward one's
// end three rows late (the conv's taps; 2.4% more product). A row block's column blocks are
// neighbours in the grid, so its rows of a are read from L2 after the first.
constexpr int N = 2 * DI;
constexpr int kColumnBlocks = N / BN;
constexpr int kStep = SL_GEMM_BM - SL_CONV_HALO;
const int rows = B * L;
const int first = blockIdx.x / kColumnBlocks * kStep;
const int n0 = blockIdx.x % kColumnBlocks * BN;
const int m0 = n0 < DI ? first - SL_CONV_HALO : first;
__shared__ __align__(16) sl_gemm_smem<BN> smem;
float acc[SL_GEMM_MI_TILES][BN / 16][4] = {};
sl_gemm_product<BN, N, K0, LDA0, 0, 4>(smem, acc, a0, w0, a0, w0, rows, m0, n0);
sl_gemm_store_conv<BN, DI>(smem, acc, out, rows, L, conv_w, conv_b, m0, first, n0);
