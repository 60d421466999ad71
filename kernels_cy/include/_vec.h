/* Vector-width abstraction: kernels written once over the vf_* names below and compiled
 * for AVX2 (8 float lanes) and AVX-512F (16 lanes), the way ggml's CPU backend writes one
 * loop body per kernel. A body header includes this file first and names its functions
 * with VF_NAME(); it is included once per width, with OF_VW set:
 *
 *     #define OF_VW 8
 *     #include "_body.h"        (defines f_avx2, target avx2,fma,f16c)
 *     #undef OF_VW
 *     #define OF_VW 16
 *     #include "_body.h"        (defines f_avx512, target avx512f and the AVX2 set)
 *     #undef OF_VW
 *
 * and OF_DISPATCH_LV(f, ...) of _simd.h picks f_avx512, f_avx2 or f_base at run time.
 * Operations common to both widths map to that width's intrinsic by prefix (vf_add ->
 * _mm256_add_ps or _mm512_add_ps); the few that differ (code widening, reductions, e^x)
 * are the of_v8_* / of_v16_* functions. Only for x86 with GCC-style target attributes
 * (OF_HAVE_AVX2_CLONE); the portable versions live beside the body headers.
 */
#include "_simd.h"   /* first: _simd.h includes body headers that include this file */

#ifndef ONNXFORGE_VEC_H
#define ONNXFORGE_VEC_H

#if OF_HAVE_AVX2_CLONE
#define OF_TARGET_V8 __attribute__((target("avx2,fma,f16c")))
#define OF_TARGET_V16 OF_TARGET_AVX512
#define OF_VINLINE static inline __attribute__((always_inline))

#define OF_CAT_(a, b) a##b
#define OF_CAT(a, b) OF_CAT_(a, b)

/* the 32 codes of an int4 record's 16 bytes (low nibble first) minus 8, in element order,
 * as two vectors of 16 signed bytes */
OF_VINLINE OF_TARGET_V8 void of_nib32(const uint8_t* c, __m128i* p0, __m128i* p1) {
    const __m128i mask = _mm_set1_epi8(15), e8 = _mm_set1_epi8(8);
    __m128i b = _mm_loadu_si128((const __m128i*)c);
    __m128i lo = _mm_and_si128(b, mask);
    __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), mask);
    *p0 = _mm_sub_epi8(_mm_unpacklo_epi8(lo, hi), e8);
    *p1 = _mm_sub_epi8(_mm_unpackhi_epi8(lo, hi), e8);
}

/* exact float16 -> float32 of two little-endian bytes */
OF_VINLINE OF_TARGET_V8 float of_h2f_f16c(const uint8_t* p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* ---- 8 lanes ---------------------------------------------------------------- */

OF_VINLINE OF_TARGET_V8 float of_v8_hsum(__m256 v) { return of_hsum256(v); }

OF_VINLINE OF_TARGET_V8 float of_v8_hmax(__m256 v) {
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
    return _mm_cvtss_f32(m4);
}

/* [sum a[0], sum a[1], sum a[2], sum a[3]] */
OF_VINLINE OF_TARGET_V8 __m128 of_v8_hsum4(const __m256* a) {
    __m256 u = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    return _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1));
}

OF_VINLINE OF_TARGET_V8 __m256 of_v8_ld_i8(const uint8_t* c) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)c)));
}

OF_VINLINE OF_TARGET_V8 __m256 of_v8_ld_f16(const uint8_t* c) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)c));
}

/* the 32 values code - 8 of an int4 record's codes, four vectors in element order */
OF_VINLINE OF_TARGET_V8 void of_v8_i4(const uint8_t* c, __m256* x) {
    __m128i p0, p1;
    of_nib32(c, &p0, &p1);
    x[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(p0));
    x[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(p0, 8)));
    x[2] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(p1));
    x[3] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(p1, 8)));
}

/* VF_LANES bytes: their low and high nibbles */
OF_VINLINE OF_TARGET_V8 void of_v8_nibbles(const uint8_t* c, __m256* lo, __m256* hi) {
    __m256i x = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)c));
    *lo = _mm256_cvtepi32_ps(_mm256_and_si256(x, _mm256_set1_epi32(15)));
    *hi = _mm256_cvtepi32_ps(_mm256_srli_epi32(x, 4));
}

#define of_v8_exp of_exp8_avx2

/* ---- 16 lanes --------------------------------------------------------------- */

OF_VINLINE OF_TARGET_V16 __m256 of_v16_half(__m512 v) {
    return _mm256_add_ps(_mm512_castps512_ps256(v),
                         _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}

OF_VINLINE OF_TARGET_V16 float of_v16_hsum(__m512 v) { return of_hsum256(of_v16_half(v)); }

OF_VINLINE OF_TARGET_V16 float of_v16_hmax(__m512 v) { return _mm512_reduce_max_ps(v); }

OF_VINLINE OF_TARGET_V16 __m128 of_v16_hsum4(const __m512* a) {
    __m256 h[4];
    int r;
    for (r = 0; r < 4; ++r) h[r] = of_v16_half(a[r]);
    return of_v8_hsum4(h);
}

OF_VINLINE OF_TARGET_V16 __m512 of_v16_ld_i8(const uint8_t* c) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)c)));
}

OF_VINLINE OF_TARGET_V16 __m512 of_v16_ld_f16(const uint8_t* c) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)c));
}

OF_VINLINE OF_TARGET_V16 void of_v16_i4(const uint8_t* c, __m512* x) {
    __m128i p0, p1;
    of_nib32(c, &p0, &p1);
    x[0] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(p0));
    x[1] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(p1));
}

OF_VINLINE OF_TARGET_V16 void of_v16_nibbles(const uint8_t* c, __m512* lo, __m512* hi) {
    __m512i x = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)c));
    *lo = _mm512_cvtepi32_ps(_mm512_and_si512(x, _mm512_set1_epi32(15)));
    *hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(x, 4));
}

#define of_v16_exp of_exp16_avx512

/* ---- the generic names ------------------------------------------------------ */

#define VF_OP(op) OF_CAT(VF_PFX, op)
#define VF_W(f) OF_CAT(VF_FN, f)
#define VF_NAME(f) OF_CAT(f, VF_SUFFIX)
#define VF_INLINE OF_VINLINE VF_TARGET
#define VF_I4_VECS (32 / VF_LANES)          /* vectors per int4 record of 32 values */

#define vf_zero() VF_OP(setzero_ps)()
#define vf_set1(x) VF_OP(set1_ps)(x)
#define vf_load(p) VF_OP(loadu_ps)(p)
#define vf_store(p, v) VF_OP(storeu_ps)(p, v)
#define vf_add(a, b) VF_OP(add_ps)(a, b)
#define vf_sub(a, b) VF_OP(sub_ps)(a, b)
#define vf_mul(a, b) VF_OP(mul_ps)(a, b)
#define vf_fmadd(a, b, c) VF_OP(fmadd_ps)(a, b, c)    /* a * b + c */
#define vf_max(a, b) VF_OP(max_ps)(a, b)              /* b where either is NaN */
#define vf_hsum(v) VF_W(hsum)(v)                      /* sum of the lanes */
#define vf_hmax(v) VF_W(hmax)(v)                      /* largest lane */
#define vf_hsum4(a) VF_W(hsum4)(a)                    /* __m128 of the sums of a[0..3] */
#define vf_ld_i8(p) VF_W(ld_i8)(p)                    /* VF_LANES int8 -> float */
#define vf_ld_f16(p) VF_W(ld_f16)(p)                  /* VF_LANES float16 -> float */
#define vf_i4(p, x) VF_W(i4)(p, x)                    /* int4 record codes - 8 -> x[VF_I4_VECS] */
#define vf_nibbles(p, lo, hi) VF_W(nibbles)(p, lo, hi)  /* VF_LANES bytes' nibbles */
#define vf_exp(v) VF_W(exp)(v)                        /* e^v, _simd.h's polynomial */
#define vf_h2f(p) of_h2f_f16c(p)                      /* one float16 -> float */
#endif /* OF_HAVE_AVX2_CLONE */

#endif /* ONNXFORGE_VEC_H */

/* (re)bind the generic names to the width OF_VW of the body being compiled */
#if defined(OF_VW) && OF_HAVE_AVX2_CLONE
#undef vf
#undef VF_LANES
#undef VF_PFX
#undef VF_FN
#undef VF_SUFFIX
#undef VF_TARGET
#if OF_VW == 8
#define vf __m256
#define VF_LANES 8
#define VF_PFX _mm256_
#define VF_FN of_v8_
#define VF_SUFFIX _avx2
#define VF_TARGET OF_TARGET_V8
#elif OF_VW == 16
#define vf __m512
#define VF_LANES 16
#define VF_PFX _mm512_
#define VF_FN of_v16_
#define VF_SUFFIX _avx512
#define VF_TARGET OF_TARGET_V16
#else
#error "OF_VW must be 8 or 16"
#endif
#endif
