/* Route MLX's single-precision GEMM to scipy-openblas, installed from PyPI.
 *
 * scipy-openblas prefixes its symbols (scipy_cblas_sgemm), so MLX cannot bind to it directly.
 * This library exports the plain cblas_sgemm name; loaded with RTLD_GLOBAL before MLX, it comes
 * first in the dynamic linker's global scope and MLX's calls land here, then in OpenBLAS.
 * speechlens_cli/blas.py binds the target function pointer before MLX is imported.
 */
#define EXPORT __attribute__((visibility("default")))

typedef void (*sgemm_fn)(int layout, int trans_a, int trans_b, int m, int n, int k, float alpha,
                         const float *a, int lda, const float *b, int ldb, float beta, float *c,
                         int ldc);

static sgemm_fn target_sgemm = 0;

EXPORT void speechlens_blas_bind(sgemm_fn sgemm) { target_sgemm = sgemm; }

EXPORT void cblas_sgemm(int layout, int trans_a, int trans_b, int m, int n, int k, float alpha,
                        const float *a, int lda, const float *b, int ldb, float beta, float *c,
                        int ldc) {
    target_sgemm(layout, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
