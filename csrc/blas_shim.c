/* Route MLX's single-precision GEMM to an optimized BLAS, with results that do not depend on
 * the thread count.
 *
 * scipy-openblas (installed from PyPI) prefixes its symbols (scipy_cblas_sgemm), so MLX cannot
 * bind to it directly. This library exports the plain cblas_sgemm name; loaded with RTLD_GLOBAL
 * before MLX, it comes first in the dynamic linker's global scope and MLX's calls land here.
 * speechlens_cli/blas.py binds the target functions before MLX is imported.
 *
 * Threads: OpenBLAS splits a product across its threads at boundaries that depend on the thread
 * count, and on some CPUs (AMD Zen with OpenBLAS's Haswell kernels, measured) rows on either
 * side of a boundary are rounded differently, so 1 and 2 threads gave different bytes. Here the
 * BLAS runs single-threaded and the product is cut into blocks of rows whose size depends on
 * the shape alone; the threads only decide who computes which block, never what a block is.
 */
#include <pthread.h>

#define EXPORT __attribute__((visibility("default")))

enum { ROW_MAJOR = 101, COL_MAJOR = 102, NO_TRANS = 111 };

/* Rows per block, and the work (multiply-adds) below which a product runs in one call. */
#define BLOCK_ROWS 256
#define SPLIT_WORK (1L << 21)
#define MAX_THREADS 256

typedef void (*sgemm_fn)(int layout, int trans_a, int trans_b, int m, int n, int k, float alpha,
                         const float *a, int lda, const float *b, int ldb, float beta, float *c,
                         int ldc);
typedef void (*set_threads_fn)(int threads);

static sgemm_fn target_sgemm = 0;
static int worker_count = 1;

/* set_threads may be 0 for a BLAS without a known thread control; threads < 1 means 1. */
EXPORT void speechlens_blas_bind(sgemm_fn sgemm, set_threads_fn set_threads, int threads) {
    target_sgemm = sgemm;
    if (set_threads) set_threads(1);
    worker_count = threads < 1 ? 1 : (threads > MAX_THREADS ? MAX_THREADS : threads);
}

EXPORT int speechlens_blas_threads(void) { return worker_count; }

/* One row-major product C[m, n] = alpha A[m, k] B[k, n] + beta C, and the block range
 * [first, last) of its rows that one thread computes. */
typedef struct {
    int trans_a, trans_b, m, n, k, lda, ldb, ldc, first, last;
    float alpha, beta;
    const float *a, *b;
    float *c;
} Share;

static void *run_share(void *arg) {
    const Share *s = (const Share *)arg;
    for (int block = s->first; block < s->last; ++block) {
        const int row = block * BLOCK_ROWS;
        const int rows = s->m - row < BLOCK_ROWS ? s->m - row : BLOCK_ROWS;
        /* Row r of op(A) is row r of A, or column r of A stored transposed. */
        const float *a = s->a + (s->trans_a == NO_TRANS ? (long)row * s->lda : row);
        target_sgemm(ROW_MAJOR, s->trans_a, s->trans_b, rows, s->n, s->k, s->alpha, a, s->lda,
                     s->b, s->ldb, s->beta, s->c + (long)row * s->ldc, s->ldc);
    }
    return 0;
}

static void row_major_sgemm(int trans_a, int trans_b, int m, int n, int k, float alpha,
                            const float *a, int lda, const float *b, int ldb, float beta,
                            float *c, int ldc) {
    if ((long)m * n * k < SPLIT_WORK) {
        target_sgemm(ROW_MAJOR, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        return;
    }
    const int blocks = (m + BLOCK_ROWS - 1) / BLOCK_ROWS;
    const int threads = worker_count < blocks ? worker_count : blocks;
    Share shares[MAX_THREADS];
    pthread_t ids[MAX_THREADS];
    int started[MAX_THREADS];
    for (int t = 0; t < threads; ++t) {
        shares[t] = (Share){trans_a, trans_b, m, n, k, lda, ldb, ldc,
                            (int)((long)blocks * t / threads),
                            (int)((long)blocks * (t + 1) / threads), alpha, beta, a, b, c};
    }
    for (int t = 1; t < threads; ++t) {
        started[t] = pthread_create(&ids[t], 0, run_share, &shares[t]) == 0;
        if (!started[t]) run_share(&shares[t]);
    }
    run_share(&shares[0]);
    for (int t = 1; t < threads; ++t) {
        if (started[t]) pthread_join(ids[t], 0);
    }
}

EXPORT void cblas_sgemm(int layout, int trans_a, int trans_b, int m, int n, int k, float alpha,
                        const float *a, int lda, const float *b, int ldb, float beta, float *c,
                        int ldc) {
    if (layout == COL_MAJOR) {
        /* A column-major C is the row-major C^T = op(B)^T op(A)^T. */
        row_major_sgemm(trans_b, trans_a, n, m, k, alpha, b, ldb, a, lda, beta, c, ldc);
    } else {
        row_major_sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    }
}
