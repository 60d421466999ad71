/* Small vector primitives for the CPU kernels, and the one CPU-feature dispatch.
 *
 * Each primitive has a portable baseline and a vector version selected at run time from
 * CPUID (of_simd_level below), so the build needs no -march flag. The AVX2 versions of
 * the dot products, axpy and the 4-bit dequantization use intrinsics; kernels with an
 * AVX-512F version too are written once over the vector-width names of _vec.h (_q4dot.h,
 * the paged kernels). The portable loops keep 16 independent lanes so that the compiler
 * can vectorize them without reassociating floating-point sums.
 */
#ifndef ONNXFORGE_SIMD_H
#define ONNXFORGE_SIMD_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <math.h>

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define OF_HAVE_AVX2_CLONE 1
#include <immintrin.h>
#define OF_TARGET_AVX2 __attribute__((target("avx2,fma")))
#else
#define OF_HAVE_AVX2_CLONE 0
#endif

#define OF_LANES 16

/* ---- bodies, instantiated per target ---------------------------------- */

#define OF_DOT_BODY                                                        \
    {                                                                      \
        float acc[OF_LANES];                                               \
        ptrdiff_t i = 0;                                                   \
        int l;                                                             \
        float s = 0.0f;                                                    \
        for (l = 0; l < OF_LANES; ++l) acc[l] = 0.0f;                      \
        for (; i + OF_LANES <= n; i += OF_LANES)                           \
            for (l = 0; l < OF_LANES; ++l) acc[l] += a[i + l] * b[i + l];  \
        for (; i < n; ++i) s += a[i] * b[i];                               \
        for (l = 0; l < OF_LANES / 2; ++l) acc[l] += acc[l + OF_LANES / 2]; \
        for (l = 0; l < OF_LANES / 4; ++l) acc[l] += acc[l + OF_LANES / 4]; \
        return s + ((acc[0] + acc[2]) + (acc[1] + acc[3]));                \
    }

#define OF_AXPY_BODY                                                       \
    {                                                                      \
        ptrdiff_t i;                                                       \
        for (i = 0; i < n; ++i) y[i] += alpha * x[i];                      \
    }

#define OF_SCAL_BODY                                                       \
    {                                                                      \
        ptrdiff_t i;                                                       \
        for (i = 0; i < n; ++i) y[i] *= alpha;                             \
    }

/* exp(x[i] - m) in place, returns the sum; x[i] - m <= 0 is expected.
 * Cephes-style polynomial with round-to-nearest by the 1.5 * 2^23 trick,
 * branch-free so it vectorizes. Relative error about 2e-7. */
#define OF_EXPSUM_BODY                                                     \
    {                                                                      \
        ptrdiff_t i;                                                       \
        float total = 0.0f;                                                \
        for (i = 0; i < n; ++i) {                                          \
            float v = x[i] - m;                                            \
            v = v < -87.0f ? -87.0f : v;                                   \
            v = v > 88.0f ? 88.0f : v;                                     \
            float t = v * 1.44269504088896341f + 12582912.0f;              \
            float k = t - 12582912.0f;                                     \
            float r = v - k * 0.693359375f;                                \
            r = r - k * -2.12194440e-4f;                                   \
            float p = 1.9875691500e-4f;                                    \
            p = p * r + 1.3981999507e-3f;                                  \
            p = p * r + 8.3334519073e-3f;                                  \
            p = p * r + 4.1665795894e-2f;                                  \
            p = p * r + 1.6666665459e-1f;                                  \
            p = p * r + 5.0000001201e-1f;                                  \
            p = p * r * r + r + 1.0f;                                      \
            int32_t e = ((int32_t)k + 127) << 23;                          \
            float two;                                                     \
            memcpy(&two, &e, sizeof(two));                                 \
            x[i] = p * two;                                                \
            total += x[i];                                                 \
        }                                                                  \
        return total;                                                      \
    }

/* Dequantize one row of 4-bit codes: K values, block_size codes per block,
 * codes packed low nibble first, value = (code - zp) * scale. zp_packed holds
 * two 4-bit zero points per byte (low nibble first), or is NULL (zero point 8). */
#define OF_DEQ4_BODY                                                       \
    {                                                                      \
        ptrdiff_t kb, i;                                                   \
        ptrdiff_t nblocks = (k + block_size - 1) / block_size;             \
        ptrdiff_t half = block_size / 2;                                   \
        for (kb = 0; kb < nblocks; ++kb) {                                 \
            float s = scales[kb];                                          \
            float z = 8.0f;                                                \
            if (zp_packed) z = (float)((zp_packed[kb >> 1] >> ((kb & 1) * 4)) & 15); \
            else if (zp_float) z = zp_float[kb];                           \
            const uint8_t* src = codes + kb * half;                        \
            float* d = dst + kb * block_size;                              \
            ptrdiff_t lim = k - kb * block_size;                           \
            if (lim >= block_size) {                                       \
                for (i = 0; i < half; ++i) {                               \
                    uint8_t c = src[i];                                    \
                    d[2 * i] = ((float)(c & 15) - z) * s;                  \
                    d[2 * i + 1] = ((float)(c >> 4) - z) * s;              \
                }                                                          \
            } else {                                                       \
                for (i = 0; i < lim; ++i) {                                \
                    uint8_t c = (uint8_t)((src[i >> 1] >> ((i & 1) * 4)) & 15); \
                    d[i] = ((float)c - z) * s;                             \
                }                                                          \
            }                                                              \
        }                                                                  \
    }

#define OF_DOT_SIG(name) float name(const float* a, const float* b, ptrdiff_t n)
#define OF_AXPY_SIG(name) void name(float* y, float alpha, const float* x, ptrdiff_t n)
#define OF_SCAL_SIG(name) void name(float* y, float alpha, ptrdiff_t n)
#define OF_EXPSUM_SIG(name) float name(float* x, float m, ptrdiff_t n)
#define OF_DEQ4_SIG(name) void name(const uint8_t* codes, const float* scales,  \
                                    const uint8_t* zp_packed, const float* zp_float, \
                                    float* dst, ptrdiff_t k, ptrdiff_t block_size)

static OF_DOT_SIG(of_dot_base) OF_DOT_BODY
static OF_AXPY_SIG(of_axpy_base) OF_AXPY_BODY
static OF_SCAL_SIG(of_scal_base) OF_SCAL_BODY
static OF_EXPSUM_SIG(of_expsum_base) OF_EXPSUM_BODY
static OF_DEQ4_SIG(of_deq4_base) OF_DEQ4_BODY

#if OF_HAVE_AVX2_CLONE
static OF_TARGET_AVX2 inline float of_hsum256(__m256 v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_shuffle_ps(x, x, 1));
    return _mm_cvtss_f32(x);
}
static OF_TARGET_AVX2 inline OF_DOT_SIG(of_dot_avx2) {
    __m256 c0 = _mm256_setzero_ps(), c1 = _mm256_setzero_ps();
    ptrdiff_t i = 0;
    for (; i + 16 <= n; i += 16) {
        c0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), c0);
        c1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), c1);
    }
    if (i + 8 <= n) {
        c0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), c0);
        i += 8;
    }
    float s = 0.0f;
    for (; i < n; ++i) s += a[i] * b[i];
    return s + of_hsum256(_mm256_add_ps(c0, c1));
}
static OF_TARGET_AVX2 inline OF_AXPY_SIG(of_axpy_avx2) {
    __m256 al = _mm256_set1_ps(alpha);
    ptrdiff_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(al, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; ++i) y[i] += alpha * x[i];
}
static OF_TARGET_AVX2 OF_SCAL_SIG(of_scal_avx2) OF_SCAL_BODY
/* e^v lane by lane, the polynomial of OF_EXPSUM_BODY (v clamped to [-87, 88]), one body
 * for both vector widths: P is the intrinsics' prefix (_mm256_ or _mm512_), V the float
 * vector type and CASTI the integer-to-float cast of that width. */
#define OF_VEXP_DEF(name, target, V, P, CASTI)                                              \
    static target inline V name(V v) {                                                      \
        const V magic = P##set1_ps(12582912.0f);                                            \
        v = P##min_ps(P##max_ps(v, P##set1_ps(-87.0f)), P##set1_ps(88.0f));                 \
        V t = P##fmadd_ps(v, P##set1_ps(1.44269504088896341f), magic);                      \
        V kk = P##sub_ps(t, magic);                                                         \
        V r = P##fnmadd_ps(kk, P##set1_ps(0.693359375f), v);                                \
        r = P##fnmadd_ps(kk, P##set1_ps(-2.12194440e-4f), r);                               \
        V p = P##set1_ps(1.9875691500e-4f);                                                 \
        p = P##fmadd_ps(p, r, P##set1_ps(1.3981999507e-3f));                                \
        p = P##fmadd_ps(p, r, P##set1_ps(8.3334519073e-3f));                                \
        p = P##fmadd_ps(p, r, P##set1_ps(4.1665795894e-2f));                                \
        p = P##fmadd_ps(p, r, P##set1_ps(1.6666665459e-1f));                                \
        p = P##fmadd_ps(p, r, P##set1_ps(5.0000001201e-1f));                                \
        p = P##fmadd_ps(P##mul_ps(p, r), r, P##add_ps(r, P##set1_ps(1.0f)));                \
        return P##mul_ps(p, CASTI(P##slli_epi32(                                            \
            P##add_epi32(P##cvtps_epi32(kk), P##set1_epi32(127)), 23)));                    \
    }
#define OF_TARGET_AVX512 __attribute__((target("avx512f,avx2,fma,f16c")))
OF_VEXP_DEF(of_exp8_avx2, OF_TARGET_AVX2, __m256, _mm256_, _mm256_castsi256_ps)
OF_VEXP_DEF(of_exp16_avx512, OF_TARGET_AVX512, __m512, _mm512_, _mm512_castsi512_ps)
static OF_TARGET_AVX2 OF_EXPSUM_SIG(of_expsum_avx2) {
    /* eight lanes at a time; the last partial vector through a lane mask, so the whole
     * call stays in AVX code (no call into the baseline's SSE code and its transition) */
    const __m256 vm = _mm256_set1_ps(m);
    __m256 total = _mm256_setzero_ps();
    ptrdiff_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 y = of_exp8_avx2(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));
        _mm256_storeu_ps(x + i, y);
        total = _mm256_add_ps(total, y);
    }
    if (i < n) {
        const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - i)), lane);
        __m256 y = of_exp8_avx2(_mm256_sub_ps(_mm256_maskload_ps(x + i, mask), vm));
        y = _mm256_and_ps(y, _mm256_castsi256_ps(mask));
        _mm256_maskstore_ps(x + i, mask, y);
        total = _mm256_add_ps(total, y);
    }
    return of_hsum256(total);
}
static OF_TARGET_AVX2 OF_DEQ4_SIG(of_deq4_avx2) {
    ptrdiff_t kb, c, i;
    ptrdiff_t nblocks = (k + block_size - 1) / block_size;
    ptrdiff_t half = block_size / 2;
    const __m128i mask = _mm_set1_epi8(15);
    for (kb = 0; kb < nblocks; ++kb) {
        float s = scales[kb];
        float z = 8.0f;
        if (zp_packed) z = (float)((zp_packed[kb >> 1] >> ((kb & 1) * 4)) & 15);
        else if (zp_float) z = zp_float[kb];
        const uint8_t* src = codes + kb * half;
        float* d = dst + kb * block_size;
        ptrdiff_t lim = k - kb * block_size;
        if (lim >= block_size && half % 16 == 0) {
            __m256 vs = _mm256_set1_ps(s);
            __m256 vzs = _mm256_set1_ps(-z * s);
            for (c = 0; c < half; c += 16) {
                __m128i b = _mm_loadu_si128((const __m128i*)(src + c));
                __m128i lo = _mm_and_si128(b, mask);
                __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), mask);
                __m128i p0 = _mm_unpacklo_epi8(lo, hi);   /* codes 0..15 of this chunk */
                __m128i p1 = _mm_unpackhi_epi8(lo, hi);   /* codes 16..31 */
                float* o = d + 2 * c;
                _mm256_storeu_ps(o, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(p0)), vs, vzs));
                _mm256_storeu_ps(o + 8, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
                    _mm_srli_si128(p0, 8))), vs, vzs));
                _mm256_storeu_ps(o + 16, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(p1)), vs, vzs));
                _mm256_storeu_ps(o + 24, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
                    _mm_srli_si128(p1, 8))), vs, vzs));
            }
        } else {
            ptrdiff_t m = lim < block_size ? lim : block_size;
            for (i = 0; i < m; ++i) {
                uint8_t q = (uint8_t)((src[i >> 1] >> ((i & 1) * 4)) & 15);
                d[i] = ((float)q - z) * s;
            }
        }
    }
}
#endif


/* Scores of G query heads against nb consecutive keys:
 * sc[g * ldsc + j] = scale * dot(q + g * qhs, k + j * ks), head_dim d. */
#define OF_QK_BODY                                                         \
    {                                                                      \
        ptrdiff_t j, g, i;                                                 \
        int l;                                                             \
        for (j = 0; j < nb; ++j) {                                         \
            const float* kr = k + j * ks;                                  \
            for (g = 0; g < G; ++g) {                                      \
                const float* qr = q + g * qhs;                             \
                float acc[OF_LANES];                                       \
                float s = 0.0f;                                            \
                for (l = 0; l < OF_LANES; ++l) acc[l] = 0.0f;              \
                for (i = 0; i + OF_LANES <= d; i += OF_LANES)              \
                    for (l = 0; l < OF_LANES; ++l) acc[l] += qr[i + l] * kr[i + l]; \
                for (; i < d; ++i) s += qr[i] * kr[i];                     \
                for (l = 0; l < OF_LANES / 2; ++l) acc[l] += acc[l + OF_LANES / 2]; \
                for (l = 0; l < OF_LANES / 4; ++l) acc[l] += acc[l + OF_LANES / 4]; \
                s += (acc[0] + acc[2]) + (acc[1] + acc[3]);                \
                sc[g * ldsc + j] = s * scale;                              \
            }                                                              \
        }                                                                  \
    }

/* acc[g * ldacc + :d] += sum_j p[g * ldp + j] * v[j * vs + :d] for G heads, nb keys. */
#define OF_PV_BODY                                                         \
    {                                                                      \
        ptrdiff_t j, g, i;                                                 \
        for (j = 0; j < nb; ++j) {                                         \
            const float* vr = v + j * vs;                                  \
            for (g = 0; g < G; ++g) {                                      \
                float w = p[g * ldp + j];                                  \
                float* ar = acc + g * ldacc;                               \
                for (i = 0; i < d; ++i) ar[i] += w * vr[i];                \
            }                                                              \
        }                                                                  \
    }

/* out[r] = dot(w, a + r * lda) for r < 4 (four rows of A against one weight row). */
#define OF_DOT4_BODY                                                       \
    {                                                                      \
        float c0[8], c1[8], c2[8], c3[8];                                  \
        ptrdiff_t i = 0;                                                   \
        int l;                                                             \
        const float* a0 = a;                                               \
        const float* a1 = a + lda;                                         \
        const float* a2 = a + 2 * lda;                                     \
        const float* a3 = a + 3 * lda;                                     \
        float t0 = 0.f, t1 = 0.f, t2 = 0.f, t3 = 0.f;                      \
        for (l = 0; l < 8; ++l) c0[l] = c1[l] = c2[l] = c3[l] = 0.0f;     \
        for (; i + 8 <= n; i += 8)                                         \
            for (l = 0; l < 8; ++l) {                                      \
                float x = w[i + l];                                        \
                c0[l] += x * a0[i + l];                                    \
                c1[l] += x * a1[i + l];                                    \
                c2[l] += x * a2[i + l];                                    \
                c3[l] += x * a3[i + l];                                    \
            }                                                              \
        for (; i < n; ++i) {                                               \
            t0 += w[i] * a0[i]; t1 += w[i] * a1[i];                        \
            t2 += w[i] * a2[i]; t3 += w[i] * a3[i];                        \
        }                                                                  \
        for (l = 0; l < 4; ++l) {                                          \
            c0[l] += c0[l + 4]; c1[l] += c1[l + 4];                        \
            c2[l] += c2[l + 4]; c3[l] += c3[l + 4];                        \
        }                                                                  \
        out[0] = t0 + ((c0[0] + c0[2]) + (c0[1] + c0[3]));                 \
        out[1] = t1 + ((c1[0] + c1[2]) + (c1[1] + c1[3]));                 \
        out[2] = t2 + ((c2[0] + c2[2]) + (c2[1] + c2[3]));                 \
        out[3] = t3 + ((c3[0] + c3[2]) + (c3[1] + c3[3]));                 \
    }

#define OF_QK_SIG(name) void name(const float* q, ptrdiff_t qhs, ptrdiff_t G, const float* k, \
                                  ptrdiff_t ks, ptrdiff_t nb, ptrdiff_t d, float scale,   \
                                  float* sc, ptrdiff_t ldsc)
#define OF_PV_SIG(name) void name(float* acc, ptrdiff_t ldacc, ptrdiff_t G, const float* p, \
                                  ptrdiff_t ldp, const float* v, ptrdiff_t vs, ptrdiff_t nb, \
                                  ptrdiff_t d)
#define OF_DOT4_SIG(name) void name(const float* w, const float* a, ptrdiff_t lda, ptrdiff_t n, \
                                    float* out)

static OF_QK_SIG(of_qk_base) OF_QK_BODY
static OF_PV_SIG(of_pv_base) OF_PV_BODY
static OF_DOT4_SIG(of_dot4_base) OF_DOT4_BODY
#if OF_HAVE_AVX2_CLONE
/* lane r of the result is the sum of the eight lanes of a[r] */
static OF_TARGET_AVX2 inline __m256 of_hsum8x8(const __m256* a) {
    __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
    __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
    __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}
static OF_TARGET_AVX2 OF_QK_SIG(of_qk_avx2) {
    /* eight keys at a time per head: eight accumulators, one transposing reduction */
    ptrdiff_t j, g, i;
    int r;
    const __m256 vscale = _mm256_set1_ps(scale);
    for (g = 0; g < G; ++g) {
        const float* qr = q + g * qhs;
        j = 0;
        if ((d & 7) == 0) {
            for (; j + 8 <= nb; j += 8) {
                __m256 a[8];
                const float* kr = k + j * ks;
                for (r = 0; r < 8; ++r) a[r] = _mm256_setzero_ps();
                for (i = 0; i < d; i += 8) {
                    __m256 qv = _mm256_loadu_ps(qr + i);
                    for (r = 0; r < 8; ++r)
                        a[r] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kr + r * ks + i), a[r]);
                }
                _mm256_storeu_ps(sc + g * ldsc + j, _mm256_mul_ps(of_hsum8x8(a), vscale));
            }
        }
        for (; j < nb; ++j) sc[g * ldsc + j] = of_dot_avx2(qr, k + j * ks, d) * scale;
    }
}
static OF_TARGET_AVX2 OF_PV_SIG(of_pv_avx2) {
    /* per head and 64-wide chunk of the head dim: eight register accumulators over the
     * keys, so a 64-wide head reads each value row whole and the rows in order (a value
     * block that comes from memory then streams; 32-wide chunks read every row twice, a
     * half at a time); then 32-wide chunks */
    ptrdiff_t j, g, c;
    int r;
    for (g = 0; g < G; ++g) {
        float* ar = acc + g * ldacc;
        const float* pr = p + g * ldp;
        c = 0;
        for (; c + 64 <= d; c += 64) {
            __m256 a[8];
            for (r = 0; r < 8; ++r) a[r] = _mm256_loadu_ps(ar + c + 8 * r);
            for (j = 0; j < nb; ++j) {
                const float* vr = v + j * vs + c;
                __m256 w = _mm256_set1_ps(pr[j]);
                for (r = 0; r < 8; ++r) a[r] = _mm256_fmadd_ps(w, _mm256_loadu_ps(vr + 8 * r), a[r]);
            }
            for (r = 0; r < 8; ++r) _mm256_storeu_ps(ar + c + 8 * r, a[r]);
        }
        for (; c + 32 <= d; c += 32) {
            __m256 r0 = _mm256_loadu_ps(ar + c), r1 = _mm256_loadu_ps(ar + c + 8);
            __m256 r2 = _mm256_loadu_ps(ar + c + 16), r3 = _mm256_loadu_ps(ar + c + 24);
            for (j = 0; j < nb; ++j) {
                const float* vr = v + j * vs + c;
                __m256 w = _mm256_set1_ps(pr[j]);
                r0 = _mm256_fmadd_ps(w, _mm256_loadu_ps(vr), r0);
                r1 = _mm256_fmadd_ps(w, _mm256_loadu_ps(vr + 8), r1);
                r2 = _mm256_fmadd_ps(w, _mm256_loadu_ps(vr + 16), r2);
                r3 = _mm256_fmadd_ps(w, _mm256_loadu_ps(vr + 24), r3);
            }
            _mm256_storeu_ps(ar + c, r0);
            _mm256_storeu_ps(ar + c + 8, r1);
            _mm256_storeu_ps(ar + c + 16, r2);
            _mm256_storeu_ps(ar + c + 24, r3);
        }
        if (c < d)
            for (j = 0; j < nb; ++j) of_axpy_avx2(ar + c, pr[j], v + j * vs + c, d - c);
    }
}
static OF_TARGET_AVX2 OF_DOT4_SIG(of_dot4_avx2) {
    const float* a0 = a;
    const float* a1 = a + lda;
    const float* a2 = a + 2 * lda;
    const float* a3 = a + 3 * lda;
    __m256 c0 = _mm256_setzero_ps(), c1 = _mm256_setzero_ps();
    __m256 c2 = _mm256_setzero_ps(), c3 = _mm256_setzero_ps();
    ptrdiff_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(w + i);
        c0 = _mm256_fmadd_ps(x, _mm256_loadu_ps(a0 + i), c0);
        c1 = _mm256_fmadd_ps(x, _mm256_loadu_ps(a1 + i), c1);
        c2 = _mm256_fmadd_ps(x, _mm256_loadu_ps(a2 + i), c2);
        c3 = _mm256_fmadd_ps(x, _mm256_loadu_ps(a3 + i), c3);
    }
    float t0 = 0.f, t1 = 0.f, t2 = 0.f, t3 = 0.f;
    for (; i < n; ++i) {
        t0 += w[i] * a0[i]; t1 += w[i] * a1[i];
        t2 += w[i] * a2[i]; t3 += w[i] * a3[i];
    }
    out[0] = t0 + of_hsum256(c0);
    out[1] = t1 + of_hsum256(c1);
    out[2] = t2 + of_hsum256(c2);
    out[3] = t3 + of_hsum256(c3);
}
#endif

/* The one CPU-feature dispatch of the kernels: of_simd_level is 0 (portable), 1 (AVX2 + FMA
 * + F16C) or 2 (AVX-512F on top), the CPU's level (of_simd_init(), once per module) lowered
 * by the test switches of_simd_force_baseline() and of_simd_allow_avx512(). of_simd_avx2
 * and of_simd_avx512 mirror level >= 1 and level == 2. Every module keeps its own copy of
 * these flags, so a switch affects the module that calls it. */
static int of_simd_cpu = 0;
static int of_simd_cap = 2;        /* ceiling set by of_simd_force_baseline */
static int of_simd_allow512 = 1;   /* cleared by of_simd_allow_avx512(0) */
static int of_simd_level = 0;
static int of_simd_avx2 = 0;
static int of_simd_avx512 = 0;

static void of_simd_select(void) {
    int lv = of_simd_cpu < of_simd_cap ? of_simd_cpu : of_simd_cap;
    if (lv > 1 && !of_simd_allow512) lv = 1;
    of_simd_level = lv;
    of_simd_avx2 = lv >= 1;
    of_simd_avx512 = lv >= 2;
}

static int of_simd_init(void) {
#if OF_HAVE_AVX2_CLONE
    __builtin_cpu_init();
    of_simd_cpu = 0;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
        of_simd_cpu = __builtin_cpu_supports("avx512f") ? 2 : 1;
#endif
    of_simd_select();
    return of_simd_avx2;
}

/* Force the portable versions (on=1), AVX2 without AVX-512 (on=2), or the best the CPU
 * has (on=0); tests compare the paths. */
static void of_simd_force_baseline(int on) {
    of_simd_cap = on == 1 ? 0 : (on ? 1 : 2);
    of_simd_init();
}

/* Let the functions with an AVX-512 version use it (on=1, the default) or keep to AVX2. */
static void of_simd_allow_avx512(int on) {
    of_simd_allow512 = on != 0;
    of_simd_select();
}

#if OF_HAVE_AVX2_CLONE
#define OF_DISPATCH(base, avx2, ...) (of_simd_avx2 ? avx2(__VA_ARGS__) : base(__VA_ARGS__))
/* f##_avx512, f##_avx2 or f##_base by of_simd_level */
#define OF_DISPATCH_LV(f, ...) (of_simd_level == 2 ? f##_avx512(__VA_ARGS__) :             \
                                of_simd_level == 1 ? f##_avx2(__VA_ARGS__) : f##_base(__VA_ARGS__))
#else
#define OF_DISPATCH(base, avx2, ...) base(__VA_ARGS__)
#define OF_DISPATCH_LV(f, ...) f##_base(__VA_ARGS__)
#endif

static inline float of_dot(const float* a, const float* b, ptrdiff_t n) {
    return OF_DISPATCH(of_dot_base, of_dot_avx2, a, b, n);
}
static inline void of_axpy(float* y, float alpha, const float* x, ptrdiff_t n) {
    OF_DISPATCH(of_axpy_base, of_axpy_avx2, y, alpha, x, n);
}
static inline void of_scal(float* y, float alpha, ptrdiff_t n) {
    OF_DISPATCH(of_scal_base, of_scal_avx2, y, alpha, n);
}
static inline float of_expsum(float* x, float m, ptrdiff_t n) {
    return OF_DISPATCH(of_expsum_base, of_expsum_avx2, x, m, n);
}

/* The logistic sigmoid y = 1 / (1 + exp(-x)) of x[0..n) (y may be x): exp by the
 * polynomial of of_expsum (arguments clamped, so no overflow), the quotient in double
 * rounded to float. The Sigmoid kernel and the fused SwiGLU gate both use it. */
static inline void of_sigmoid(const float* x, float* y, ptrdiff_t n) {
    ptrdiff_t i;
    for (i = 0; i < n; ++i) y[i] = -x[i];
    of_expsum(y, 0.0f, n);
    for (i = 0; i < n; ++i) y[i] = (float)(1.0 / (1.0 + (double)y[i]));
}

/* The largest of x[0..n) (n >= 1): eight (sixteen) independent lanes instead of one
 * dependent chain of comparisons; a NaN is skipped unless every value is NaN. */
static float of_maxf_base(const float* x, ptrdiff_t n) {
    float l[16];
    ptrdiff_t i, j;
    float m = x[0];
    if (n < 16) {
        for (i = 1; i < n; ++i) m = x[i] > m ? x[i] : m;
        return m;
    }
    for (j = 0; j < 16; ++j) l[j] = x[j];
    for (i = 16; i + 16 <= n; i += 16)
        for (j = 0; j < 16; ++j) l[j] = x[i + j] > l[j] ? x[i + j] : l[j];
    for (; i < n; ++i) l[0] = x[i] > l[0] ? x[i] : l[0];
    m = l[0];
    for (j = 1; j < 16; ++j) m = l[j] > m ? l[j] : m;
    return m;
}
#if OF_HAVE_AVX2_CLONE
static OF_TARGET_AVX2 float of_maxf_avx2(const float* x, ptrdiff_t n) {
    float m0 = x[0];
    if (n < 16) {  /* inline: no call into the baseline's SSE code */
        for (ptrdiff_t j = 1; j < n; ++j) m0 = x[j] > m0 ? x[j] : m0;
        return m0;
    }
    __m256 a = _mm256_loadu_ps(x), b = _mm256_loadu_ps(x + 8);
    ptrdiff_t i = 16;
    for (; i + 16 <= n; i += 16) {  /* max(new, old): a NaN in x keeps the old lane */
        a = _mm256_max_ps(_mm256_loadu_ps(x + i), a);
        b = _mm256_max_ps(_mm256_loadu_ps(x + i + 8), b);
    }
    float l[8];
    _mm256_storeu_ps(l, _mm256_max_ps(a, b));
    float m = l[0];
    for (ptrdiff_t j = 1; j < 8; ++j) m = l[j] > m ? l[j] : m;
    for (; i < n; ++i) m = x[i] > m ? x[i] : m;
    return m;
}
#endif
static inline float of_maxf(const float* x, ptrdiff_t n) {
    return OF_DISPATCH(of_maxf_base, of_maxf_avx2, x, n);
}
static inline void of_deq4(const uint8_t* codes, const float* scales, const uint8_t* zp_packed,
                           const float* zp_float, float* dst, ptrdiff_t k, ptrdiff_t block_size) {
    OF_DISPATCH(of_deq4_base, of_deq4_avx2, codes, scales, zp_packed, zp_float, dst, k, block_size);
}

static inline void of_qk(const float* q, ptrdiff_t qhs, ptrdiff_t G, const float* k, ptrdiff_t ks,
                         ptrdiff_t nb, ptrdiff_t d, float scale, float* sc, ptrdiff_t ldsc) {
    OF_DISPATCH(of_qk_base, of_qk_avx2, q, qhs, G, k, ks, nb, d, scale, sc, ldsc);
}
static inline void of_pv(float* acc, ptrdiff_t ldacc, ptrdiff_t G, const float* p, ptrdiff_t ldp,
                         const float* v, ptrdiff_t vs, ptrdiff_t nb, ptrdiff_t d) {
    OF_DISPATCH(of_pv_base, of_pv_avx2, acc, ldacc, G, p, ldp, v, vs, nb, d);
}
static inline void of_dot4(const float* w, const float* a, ptrdiff_t lda, ptrdiff_t n, float* out) {
    OF_DISPATCH(of_dot4_base, of_dot4_avx2, w, a, lda, n, out);
}

#include "_q4dot.h"

#endif /* ONNXFORGE_SIMD_H */
