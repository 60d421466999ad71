/* 4-bit MatMulNBits dot products of _simd.h (which includes this file at its end): the
 * portable version here, the vector one written once in _q4dot_body.h and compiled for
 * AVX2 and AVX-512F, picked by of_simd_level. */
#ifndef ONNXFORGE_Q4DOT_H
#define ONNXFORGE_Q4DOT_H

#include "_simd.h"

/* 4-bit MatMulNBits rows with block_size 32 against one activation row, without
 * materializing a row. codes: 16 bytes per block, low nibble first (byte j holds elements
 * 2j and 2j + 1). The activations are laid out once per call in "nibble order"
 * (of_q4_prepare): per block, ap[j] = a[2j] and ap[16 + j] = a[2j + 1], so that the low and
 * high nibbles of 16 bytes widen to two vectors that multiply contiguous activations.
 * of_q4dot32_rows gives sum over blocks b of s_b * (codes_b . a_b); the zero points enter
 * as - sum_b s_b z_b asum_b, asum_b being the sum of a over block b (of_q4_zero_terms). */
static inline float of_q4zp(const uint8_t* zp_packed, const float* zp_float, ptrdiff_t kb) {
    if (zp_packed) return (float)((zp_packed[kb >> 1] >> ((kb & 1) * 4)) & 15);
    if (zp_float) return zp_float[kb];
    return 8.0f;
}
static void of_q4_prepare(const float* a, float* ap, float* asum, ptrdiff_t nblk) {
    ptrdiff_t kb, j;
    for (kb = 0; kb < nblk; ++kb) {
        const float* x = a + kb * 32;
        float* y = ap + kb * 32;
        float t = 0.0f;
        for (j = 0; j < 16; ++j) {
            y[j] = x[2 * j];
            y[16 + j] = x[2 * j + 1];
        }
        for (j = 0; j < 32; ++j) t += x[j];
        asum[kb] = t;
    }
}
/* szp[r * nblk + b] = s_b z_b of row r (rows [0, nrows)), for the zero-point term. */
static void of_q4_zero_terms(const float* scales, const uint8_t* zp_packed, const float* zp_float,
                             ptrdiff_t nblk, ptrdiff_t nrows, float* szp) {
    ptrdiff_t r, kb, zrow = (nblk + 1) / 2;
    for (r = 0; r < nrows; ++r)
        for (kb = 0; kb < nblk; ++kb)
            szp[r * nblk + kb] = scales[r * nblk + kb] *
                of_q4zp(zp_packed ? zp_packed + r * zrow : NULL, zp_float ? zp_float + r * nblk : NULL, kb);
}
static void of_q4dot32_rows_base(const uint8_t* codes, const float* scales, const float* ap,
                                 ptrdiff_t nblk, ptrdiff_t nrows, float* out) {
    ptrdiff_t r, kb, j;
    for (r = 0; r < nrows; ++r) {
        float total = 0.0f;
        for (kb = 0; kb < nblk; ++kb) {
            const uint8_t* c = codes + (r * nblk + kb) * 16;
            const float* ab = ap + kb * 32;
            float d = 0.0f;
            for (j = 0; j < 16; ++j) d += (float)(c[j] & 15) * ab[j] + (float)(c[j] >> 4) * ab[16 + j];
            total += scales[r * nblk + kb] * d;
        }
        out[r] = total;
    }
}
#if OF_HAVE_AVX2_CLONE
#define OF_VW 8
#include "_q4dot_body.h"
#undef OF_VW
#define OF_VW 16
#include "_q4dot_body.h"
#undef OF_VW
#endif

static inline void of_q4dot32_rows(const uint8_t* codes, const float* scales, const float* ap,
                                   ptrdiff_t nblk, ptrdiff_t nrows, float* out) {
    OF_DISPATCH_LV(of_q4dot32_rows, codes, scales, ap, nblk, nrows, out);
}

#endif /* ONNXFORGE_Q4DOT_H */
