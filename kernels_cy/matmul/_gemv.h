/* One-row products y = x @ W (x [K], W [K, N] with unit column stride), the decode step's
 * shape: bandwidth-bound, so each task streams a contiguous range of W's rows once.
 *
 * A task owns rows [k0, k1) and columns [j0, j1) and accumulates into its own output
 * buffer (the result row, or a partial row summed afterwards when the rows are split).
 * Four rows at a time: the partial row stays in L1 and the four weight rows stream
 * sequentially (in the AVX2 path, four streams a quarter of the range apart). */
#ifndef ONNXFORGE_GEMV_H
#define ONNXFORGE_GEMV_H

#include "_simd.h"

#define OF_GEMV_SIG(name) void name(const float* x, const float* W, ptrdiff_t ldw, float* y, \
                                    ptrdiff_t k0, ptrdiff_t k1, ptrdiff_t j0, ptrdiff_t j1)

static OF_GEMV_SIG(of_gemv_rows_base) {
    ptrdiff_t k, j;
    for (j = j0; j < j1; ++j) y[j] = 0.0f;
    for (k = k0; k + 4 <= k1; k += 4) {
        const float a0 = x[k], a1 = x[k + 1], a2 = x[k + 2], a3 = x[k + 3];
        const float *w0 = W + k * ldw, *w1 = w0 + ldw, *w2 = w1 + ldw, *w3 = w2 + ldw;
        for (j = j0; j < j1; ++j) y[j] += ((a0 * w0[j] + a1 * w1[j]) + (a2 * w2[j] + a3 * w3[j]));
    }
    for (; k < k1; ++k) {
        const float a = x[k];
        const float* w = W + k * ldw;
        for (j = j0; j < j1; ++j) y[j] += a * w[j];
    }
}

#if OF_HAVE_AVX2_CLONE
/* Four streams a quarter of the row range apart: rows k, k + q, k + 2q and k + 3q
 * together, k advancing by one row, so each stream reads consecutive rows. With short
 * rows (512 floats: two rows per 4 KB page) four neighbouring rows interleave within a
 * page and the hardware prefetcher follows them poorly: 14-17 GB/s on two cores for
 * [1536, 512] against 18-23 GB/s this way; wide rows stream as fast either way. */
static OF_TARGET_AVX2 OF_GEMV_SIG(of_gemv_rows_avx2) {
    ptrdiff_t i, k, j;
    const ptrdiff_t q = (k1 - k0) / 4;
    for (j = j0; j < j1; ++j) y[j] = 0.0f;
    for (i = 0; i < q; ++i) {
        k = k0 + i;
        const float x0 = x[k], x1 = x[k + q], x2 = x[k + 2 * q], x3 = x[k + 3 * q];
        const __m256 a0 = _mm256_set1_ps(x0), a1 = _mm256_set1_ps(x1);
        const __m256 a2 = _mm256_set1_ps(x2), a3 = _mm256_set1_ps(x3);
        const float *w0 = W + k * ldw, *w1 = w0 + q * ldw, *w2 = w1 + q * ldw, *w3 = w2 + q * ldw;
        for (j = j0; j + 16 <= j1; j += 16) {
            __m256 c0 = _mm256_loadu_ps(y + j), c1 = _mm256_loadu_ps(y + j + 8);
            c0 = _mm256_fmadd_ps(a0, _mm256_loadu_ps(w0 + j), c0);
            c1 = _mm256_fmadd_ps(a0, _mm256_loadu_ps(w0 + j + 8), c1);
            c0 = _mm256_fmadd_ps(a1, _mm256_loadu_ps(w1 + j), c0);
            c1 = _mm256_fmadd_ps(a1, _mm256_loadu_ps(w1 + j + 8), c1);
            c0 = _mm256_fmadd_ps(a2, _mm256_loadu_ps(w2 + j), c0);
            c1 = _mm256_fmadd_ps(a2, _mm256_loadu_ps(w2 + j + 8), c1);
            c0 = _mm256_fmadd_ps(a3, _mm256_loadu_ps(w3 + j), c0);
            c1 = _mm256_fmadd_ps(a3, _mm256_loadu_ps(w3 + j + 8), c1);
            _mm256_storeu_ps(y + j, c0);
            _mm256_storeu_ps(y + j + 8, c1);
        }
        for (; j < j1; ++j) y[j] += ((x0 * w0[j] + x1 * w1[j]) + (x2 * w2[j] + x3 * w3[j]));
    }
    for (k = k0 + 4 * q; k < k1; ++k) {
        const float a = x[k];
        const float* w = W + k * ldw;
        for (j = j0; j < j1; ++j) y[j] += a * w[j];
    }
}
#endif

static inline OF_GEMV_SIG(of_gemv_rows) {
#if OF_HAVE_AVX2_CLONE
    if (of_simd_avx2) { of_gemv_rows_avx2(x, W, ldw, y, k0, k1, j0, j1); return; }
#endif
    of_gemv_rows_base(x, W, ldw, y, k0, k1, j0, j1);
}


/* Few-row products Y[m, j0:j1] = X[m, :K] @ W[:K, j0:j1] for m < M (M small: the rows of a
 * batched decode step): W is streamed once for all M rows, as the one-row product streams it. */
#define OF_FEW_KC 256  /* X columns per chunk: 32 rows x 256 floats = 32 KB at most */
#define OF_GEMM_FEW_SIG(name) void name(const float* X, ptrdiff_t ldx, ptrdiff_t M, const float* W, \
                                        ptrdiff_t ldw, float* Y, ptrdiff_t ldy, ptrdiff_t K, \
                                        ptrdiff_t j0, ptrdiff_t j1)

static OF_GEMM_FEW_SIG(of_gemm_few_base) {
    ptrdiff_t m, k, j;
    for (m = 0; m < M; ++m) {
        float* y = Y + m * ldy;
        const float* x = X + m * ldx;
        for (j = j0; j < j1; ++j) y[j] = 0.0f;
        for (k = 0; k < K; ++k) {
            const float a = x[k];
            const float* w = W + k * ldw;
            for (j = j0; j < j1; ++j) y[j] += a * w[j];
        }
    }
}

#if OF_HAVE_AVX2_CLONE
/* Four weight rows at a time, streamed along the columns (four sequential streams, as the
 * one-row product reads them); each 16-column piece of the four rows, held in registers, is
 * applied to every row of X in turn, whose output piece stays in L1 (a task's columns times
 * M rows). The rows of one piece are independent, so the core overlaps them. */
static OF_TARGET_AVX2 OF_GEMM_FEW_SIG(of_gemm_few_avx2) {
    ptrdiff_t m, k, j, kc, ke;
    for (m = 0; m < M; ++m)
        for (j = j0; j < j1; ++j) Y[m * ldy + j] = 0.0f;
    for (kc = 0; kc < K; kc = ke) {  /* chunks of X's columns small enough to stay in L1 */
        ke = kc + OF_FEW_KC < K ? kc + OF_FEW_KC : K;
        for (k = kc; k + 4 <= ke; k += 4) {
            const float *w0 = W + k * ldw, *w1 = w0 + ldw, *w2 = w1 + ldw, *w3 = w2 + ldw;
            for (j = j0; j + 16 <= j1; j += 16) {
                const __m256 a0 = _mm256_loadu_ps(w0 + j), a1 = _mm256_loadu_ps(w0 + j + 8);
                const __m256 b0 = _mm256_loadu_ps(w1 + j), b1 = _mm256_loadu_ps(w1 + j + 8);
                const __m256 c0 = _mm256_loadu_ps(w2 + j), c1 = _mm256_loadu_ps(w2 + j + 8);
                const __m256 d0 = _mm256_loadu_ps(w3 + j), d1 = _mm256_loadu_ps(w3 + j + 8);
                for (m = 0; m < M; ++m) {
                    const float* x = X + m * ldx + k;
                    float* y = Y + m * ldy + j;
                    __m256 y0 = _mm256_loadu_ps(y), y1 = _mm256_loadu_ps(y + 8);
                    __m256 s = _mm256_broadcast_ss(x);
                    y0 = _mm256_fmadd_ps(s, a0, y0);
                    y1 = _mm256_fmadd_ps(s, a1, y1);
                    s = _mm256_broadcast_ss(x + 1);
                    y0 = _mm256_fmadd_ps(s, b0, y0);
                    y1 = _mm256_fmadd_ps(s, b1, y1);
                    s = _mm256_broadcast_ss(x + 2);
                    y0 = _mm256_fmadd_ps(s, c0, y0);
                    y1 = _mm256_fmadd_ps(s, c1, y1);
                    s = _mm256_broadcast_ss(x + 3);
                    y0 = _mm256_fmadd_ps(s, d0, y0);
                    y1 = _mm256_fmadd_ps(s, d1, y1);
                    _mm256_storeu_ps(y, y0);
                    _mm256_storeu_ps(y + 8, y1);
                }
            }
            for (; j < j1; ++j)
                for (m = 0; m < M; ++m) {
                    const float* x = X + m * ldx + k;
                    Y[m * ldy + j] += (x[0] * w0[j] + x[1] * w1[j]) + (x[2] * w2[j] + x[3] * w3[j]);
                }
        }
        for (; k < ke; ++k) {
            const float* w = W + k * ldw;
            for (m = 0; m < M; ++m) {
                const float a = X[m * ldx + k];
                float* y = Y + m * ldy;
                for (j = j0; j < j1; ++j) y[j] += a * w[j];
            }
        }
    }
}
#endif

static inline OF_GEMM_FEW_SIG(of_gemm_few) {
#if OF_HAVE_AVX2_CLONE
    if (of_simd_avx2) { of_gemm_few_avx2(X, ldx, M, W, ldw, Y, ldy, K, j0, j1); return; }
#endif
    of_gemm_few_base(X, ldx, M, W, ldw, Y, ldy, K, j0, j1);
}

#endif
