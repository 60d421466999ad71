/* Vector kernels of the paged KV cache (kernels_cy/paged/_paged.pyx).
 *
 * Row decoders (int8, int4, float16 -> float32) and the decode-attention kernels that
 * work on the codes of int8 and int4 pages directly: scores
 *     int8  sc[g, j] = scale * s_j * sum_d q_gd * code_jd
 *     int4  sc[g, j] = scale * sum_b d_jb * sum_{d in b} q_gd * (code_jd - 8)
 * the online-softmax step, and the weighted value sums
 *     int8  acc[g, :] += (p_gj * s_j) * code_j
 *     int4  acc[g, b] += (p_gj * d_jb) * (code_jb - 8)
 * convert codes to float in registers; no decoded row is written to memory.
 *
 * Every kernel has a portable version and an AVX2+FMA+F16C version selected at run time
 * (the build has no -march flag): pg_fast() is true when _simd.h's AVX2 paths are on
 * (of_simd_avx2, which the tests switch off) and the CPU has F16C. The int8 / int4
 * kernels also have AVX-512F versions (_paged_simd512.h), used where the CPU has
 * AVX-512F unless pg_set_use512(0) keeps them to AVX2. The row decoders are
 * bit-identical on both paths; the attention kernels agree up to float32 summation order.
 * Layouts (kernels_cy/paged/_paged.pyx, the paged-formats contract): an int8 row is a float32
 * scale and D int8 codes; an int4 row is D/32 records of a float16 scale and 16 bytes of
 * codes, low nibble first. D is a multiple of 32.
 */
#ifndef ONNXFORGE_PAGED_SIMD_H
#define ONNXFORGE_PAGED_SIMD_H

#include "_simd.h"

static inline float pg_ldf(const uint8_t* p) {
    float f;
    memcpy(&f, p, 4);
    return f;
}

/* exact float16 -> float32 of two little-endian bytes */
static inline float pg_h2f(const uint8_t* p) {
    uint16_t h = (uint16_t)(p[0] | (p[1] << 8));
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1F, m = h & 0x3FF, bits;
    float f;
    if (e == 0) {
        f = (float)m * 5.9604644775390625e-08f;   /* m * 2^-24 */
        return sign ? -f : f;
    }
    bits = e == 31 ? (sign | 0x7F800000u | (m << 13)) : (sign | ((e + 112) << 23) | (m << 13));
    memcpy(&f, &bits, 4);
    return f;
}

/* ---- portable versions ------------------------------------------------------- */

static void pg_qk_i8_base(const float* q, ptrdiff_t qhs, ptrdiff_t G, const uint8_t* rows, ptrdiff_t nv,
                          ptrdiff_t D, float scale, float* sc, ptrdiff_t ldsc) {
    ptrdiff_t j, g, i;
    int l;
    for (j = 0; j < nv; ++j) {
        const uint8_t* rec = rows + j * (4 + D);
        const int8_t* c = (const int8_t*)(rec + 4);
        float s = pg_ldf(rec) * scale;
        for (g = 0; g < G; ++g) {
            const float* qr = q + g * qhs;
            float acc[OF_LANES];
            for (l = 0; l < OF_LANES; ++l) acc[l] = 0.0f;
            for (i = 0; i < D; i += OF_LANES)
                for (l = 0; l < OF_LANES; ++l) acc[l] += qr[i + l] * (float)c[i + l];
            for (l = 0; l < OF_LANES / 2; ++l) acc[l] += acc[l + OF_LANES / 2];
            for (l = 0; l < OF_LANES / 4; ++l) acc[l] += acc[l + OF_LANES / 4];
            sc[g * ldsc + j] = ((acc[0] + acc[2]) + (acc[1] + acc[3])) * s;
        }
    }
}

static void pg_pv_i8_base(float* acc, ptrdiff_t ldacc, ptrdiff_t G, const float* p, ptrdiff_t ldp,
                          const uint8_t* rows, ptrdiff_t nv, ptrdiff_t D) {
    ptrdiff_t j, g, i;
    for (j = 0; j < nv; ++j) {
        const uint8_t* rec = rows + j * (4 + D);
        const int8_t* c = (const int8_t*)(rec + 4);
        float s = pg_ldf(rec);
        for (g = 0; g < G; ++g) {
            float w = p[g * ldp + j] * s;
            float* ar = acc + g * ldacc;
            for (i = 0; i < D; ++i) ar[i] += w * (float)c[i];
        }
    }
}

static void pg_qk_i4_base(const float* q, ptrdiff_t qhs, ptrdiff_t G, const uint8_t* rows, ptrdiff_t nv,
                          ptrdiff_t D, float scale, float* sc, ptrdiff_t ldsc) {
    ptrdiff_t nb = D / 32, j, g, b, i;
    int l;
    for (j = 0; j < nv; ++j) {
        for (g = 0; g < G; ++g) {
            const float* qr = q + g * qhs;
            float total = 0.0f;
            for (b = 0; b < nb; ++b) {
                const uint8_t* rec = rows + (j * nb + b) * 18;
                const float* qb = qr + b * 32;
                float acc[OF_LANES];
                for (l = 0; l < OF_LANES; ++l) acc[l] = 0.0f;
                for (i = 0; i < 16; i += OF_LANES / 2)
                    for (l = 0; l < OF_LANES / 2; ++l) {
                        uint8_t c = rec[2 + i + l];
                        acc[2 * l] += qb[2 * (i + l)] * (float)((int)(c & 15) - 8);
                        acc[2 * l + 1] += qb[2 * (i + l) + 1] * (float)((int)(c >> 4) - 8);
                    }
                for (l = 0; l < OF_LANES / 2; ++l) acc[l] += acc[l + OF_LANES / 2];
                for (l = 0; l < OF_LANES / 4; ++l) acc[l] += acc[l + OF_LANES / 4];
                total += pg_h2f(rec) * ((acc[0] + acc[2]) + (acc[1] + acc[3]));
            }
            sc[g * ldsc + j] = total * scale;
        }
    }
}

static void pg_pv_i4_base(float* acc, ptrdiff_t ldacc, ptrdiff_t G, const float* p, ptrdiff_t ldp,
                          const uint8_t* rows, ptrdiff_t nv, ptrdiff_t D) {
    ptrdiff_t nb = D / 32, j, g, b, i;
    for (j = 0; j < nv; ++j) {
        for (b = 0; b < nb; ++b) {
            const uint8_t* rec = rows + (j * nb + b) * 18;
            float d = pg_h2f(rec);
            for (g = 0; g < G; ++g) {
                float w = p[g * ldp + j] * d;
                float* ar = acc + g * ldacc + b * 32;
                for (i = 0; i < 16; ++i) {
                    uint8_t c = rec[2 + i];
                    ar[2 * i] += w * (float)((int)(c & 15) - 8);
                    ar[2 * i + 1] += w * (float)((int)(c >> 4) - 8);
                }
            }
        }
    }
}

/* Online-softmax step of G query heads over the scores of nv keys (rows of sc, stride
 * ldsc): the running maxima mx, the accumulators acc (G rows of D, rescaled when the
 * maximum grows) and the denominators den; the scores become exp(score - max). */
static void pg_softmax_base(ptrdiff_t G, ptrdiff_t nv, float* sc, ptrdiff_t ldsc, float* acc, ptrdiff_t D,
                            float* mx, float* den) {
    ptrdiff_t g, j;
    for (g = 0; g < G; ++g) {
        float* s = sc + g * ldsc;
        float bm = s[0];
        for (j = 1; j < nv; ++j)
            if (s[j] > bm) bm = s[j];
        if (bm > mx[g]) {
            if (mx[g] != -INFINITY) {
                float c = expf(mx[g] - bm);
                of_scal_base(acc + g * D, c, D);
                den[g] *= c;
            }
            mx[g] = bm;
        }
        den[g] += of_expsum_base(s, mx[g], nv);
    }
}

/* exp(v) for v <= 0 by the polynomial of _simd.h's OF_EXPSUM_BODY (one value) */
static inline float pg_exp1(float v) {
    v = v < -87.0f ? -87.0f : v;
    float t = v * 1.44269504088896341f + 12582912.0f;
    float k = t - 12582912.0f;
    float r = v - k * 0.693359375f;
    r = r - k * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t e = ((int32_t)k + 127) << 23;
    float two;
    memcpy(&two, &e, sizeof(two));
    return p * two;
}

/* ---- AVX2 + FMA + F16C versions ---------------------------------------------- */

#if OF_HAVE_AVX2_CLONE
#define PG_TARGET __attribute__((target("avx2,fma,f16c")))
#define PG_INLINE static inline __attribute__((always_inline)) PG_TARGET

/* row decoders, bit-identical to the portable loops of _paged.pyx */
static PG_TARGET void pg_i8_avx2(const uint8_t* c, float s, float* o, ptrdiff_t n) {
    __m256 vs = _mm256_set1_ps(s);
    ptrdiff_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i b = _mm_loadl_epi64((const __m128i*)(c + i));
        _mm256_storeu_ps(o + i, _mm256_mul_ps(vs, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b))));
    }
    for (; i < n; ++i) o[i] = s * (float)(int8_t)c[i];
}

/* the 32 codes of an int4 record minus 8, as two vectors of 16 signed bytes */
PG_INLINE void pg_nib32(const uint8_t* c, __m128i* p0, __m128i* p1) {
    const __m128i mask = _mm_set1_epi8(15), e8 = _mm_set1_epi8(8);
    __m128i b = _mm_loadu_si128((const __m128i*)c);
    __m128i lo = _mm_and_si128(b, mask);
    __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), mask);
    *p0 = _mm_sub_epi8(_mm_unpacklo_epi8(lo, hi), e8);
    *p1 = _mm_sub_epi8(_mm_unpackhi_epi8(lo, hi), e8);
}

PG_INLINE __m256 pg_cvt8(__m128i x) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(x)); }

PG_INLINE __m256 pg_ld8(const uint8_t* c) {
    return pg_cvt8(_mm_loadl_epi64((const __m128i*)c));
}

PG_INLINE float pg_h2f_f16c(const uint8_t* p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

static PG_TARGET void pg_i4_avx2(const uint8_t* c, float s, float* o) {
    const __m256 vs = _mm256_set1_ps(s);
    __m128i p0, p1;
    pg_nib32(c, &p0, &p1);
    _mm256_storeu_ps(o, _mm256_mul_ps(vs, pg_cvt8(p0)));
    _mm256_storeu_ps(o + 8, _mm256_mul_ps(vs, pg_cvt8(_mm_srli_si128(p0, 8))));
    _mm256_storeu_ps(o + 16, _mm256_mul_ps(vs, pg_cvt8(p1)));
    _mm256_storeu_ps(o + 24, _mm256_mul_ps(vs, pg_cvt8(_mm_srli_si128(p1, 8))));
}

static PG_TARGET void pg_f16_avx2(const uint8_t* c, float* o, ptrdiff_t n) {
    ptrdiff_t i;
    for (i = 0; i + 8 <= n; i += 8)
        _mm256_storeu_ps(o + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(c + 2 * i))));
}

/* [sum a0, sum a1, sum a2, sum a3] */
PG_INLINE __m128 pg_hsum4(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
    __m256 u = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    return _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1));
}

/* int8 scores of NH (1 or 2) heads against keys [0, nv): four keys per step */
PG_INLINE void pg_qk_i8_heads(const float* q0, const float* q1, int NH, const uint8_t* rows, ptrdiff_t nv,
                              ptrdiff_t D, float scale, float* s0, float* s1) {
    const ptrdiff_t rs = 4 + D;
    ptrdiff_t j = 0, i;
    for (; j + 4 <= nv; j += 4) {
        const uint8_t* r = rows + j * rs + 4;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        __m256 b0 = a0, b1 = a0, b2 = a0, b3 = a0;
        for (i = 0; i < D; i += 8) {
            __m256 x0 = pg_ld8(r + i), x1 = pg_ld8(r + rs + i);
            __m256 x2 = pg_ld8(r + 2 * rs + i), x3 = pg_ld8(r + 3 * rs + i);
            __m256 qa = _mm256_loadu_ps(q0 + i);
            a0 = _mm256_fmadd_ps(qa, x0, a0);
            a1 = _mm256_fmadd_ps(qa, x1, a1);
            a2 = _mm256_fmadd_ps(qa, x2, a2);
            a3 = _mm256_fmadd_ps(qa, x3, a3);
            if (NH == 2) {
                __m256 qb = _mm256_loadu_ps(q1 + i);
                b0 = _mm256_fmadd_ps(qb, x0, b0);
                b1 = _mm256_fmadd_ps(qb, x1, b1);
                b2 = _mm256_fmadd_ps(qb, x2, b2);
                b3 = _mm256_fmadd_ps(qb, x3, b3);
            }
        }
        __m128 sv = _mm_mul_ps(_mm_set_ps(pg_ldf(r + 3 * rs - 4), pg_ldf(r + 2 * rs - 4), pg_ldf(r + rs - 4),
                                          pg_ldf(r - 4)), _mm_set1_ps(scale));
        _mm_storeu_ps(s0 + j, _mm_mul_ps(pg_hsum4(a0, a1, a2, a3), sv));
        if (NH == 2) _mm_storeu_ps(s1 + j, _mm_mul_ps(pg_hsum4(b0, b1, b2, b3), sv));
    }
    for (; j < nv; ++j) {
        const uint8_t* r = rows + j * rs + 4;
        __m256 a = _mm256_setzero_ps(), b = a;
        for (i = 0; i < D; i += 8) {
            __m256 x = pg_ld8(r + i);
            a = _mm256_fmadd_ps(_mm256_loadu_ps(q0 + i), x, a);
            if (NH == 2) b = _mm256_fmadd_ps(_mm256_loadu_ps(q1 + i), x, b);
        }
        float s = pg_ldf(r - 4) * scale;
        s0[j] = of_hsum256(a) * s;
        if (NH == 2) s1[j] = of_hsum256(b) * s;
    }
}

static PG_TARGET void pg_qk_i8_avx2(const float* q, ptrdiff_t qhs, ptrdiff_t G, const uint8_t* rows,
                                    ptrdiff_t nv, ptrdiff_t D, float scale, float* sc, ptrdiff_t ldsc) {
    ptrdiff_t g = 0;
    for (; g + 2 <= G; g += 2)
        pg_qk_i8_heads(q + g * qhs, q + (g + 1) * qhs, 2, rows, nv, D, scale, sc + g * ldsc,
                       sc + (g + 1) * ldsc);
    if (g < G) pg_qk_i8_heads(q + g * qhs, q + g * qhs, 1, rows, nv, D, scale, sc + g * ldsc, sc + g * ldsc);
}

/* int8 weighted value sums of NH heads, 32 dims at a time */
PG_INLINE void pg_pv_i8_heads(float* acc0, float* acc1, int NH, const float* p0, const float* p1,
                              const uint8_t* rows, ptrdiff_t nv, ptrdiff_t D) {
    const ptrdiff_t rs = 4 + D;
    ptrdiff_t c, j;
    for (c = 0; c < D; c += 32) {
        __m256 a0 = _mm256_loadu_ps(acc0 + c), a1 = _mm256_loadu_ps(acc0 + c + 8);
        __m256 a2 = _mm256_loadu_ps(acc0 + c + 16), a3 = _mm256_loadu_ps(acc0 + c + 24);
        __m256 b0 = a0, b1 = a1, b2 = a2, b3 = a3;
        if (NH == 2) {
            b0 = _mm256_loadu_ps(acc1 + c);
            b1 = _mm256_loadu_ps(acc1 + c + 8);
            b2 = _mm256_loadu_ps(acc1 + c + 16);
            b3 = _mm256_loadu_ps(acc1 + c + 24);
        }
        for (j = 0; j < nv; ++j) {
            const uint8_t* rec = rows + j * rs;
            const uint8_t* r = rec + 4 + c;
            float s = pg_ldf(rec);
            __m256 x0 = pg_ld8(r), x1 = pg_ld8(r + 8), x2 = pg_ld8(r + 16), x3 = pg_ld8(r + 24);
            __m256 w = _mm256_set1_ps(p0[j] * s);
            a0 = _mm256_fmadd_ps(w, x0, a0);
            a1 = _mm256_fmadd_ps(w, x1, a1);
            a2 = _mm256_fmadd_ps(w, x2, a2);
            a3 = _mm256_fmadd_ps(w, x3, a3);
            if (NH == 2) {
                __m256 u = _mm256_set1_ps(p1[j] * s);
                b0 = _mm256_fmadd_ps(u, x0, b0);
                b1 = _mm256_fmadd_ps(u, x1, b1);
                b2 = _mm256_fmadd_ps(u, x2, b2);
                b3 = _mm256_fmadd_ps(u, x3, b3);
            }
        }
        _mm256_storeu_ps(acc0 + c, a0);
        _mm256_storeu_ps(acc0 + c + 8, a1);
        _mm256_storeu_ps(acc0 + c + 16, a2);
        _mm256_storeu_ps(acc0 + c + 24, a3);
        if (NH == 2) {
            _mm256_storeu_ps(acc1 + c, b0);
            _mm256_storeu_ps(acc1 + c + 8, b1);
            _mm256_storeu_ps(acc1 + c + 16, b2);
            _mm256_storeu_ps(acc1 + c + 24, b3);
        }
    }
}

static PG_TARGET void pg_pv_i8_avx2(float* acc, ptrdiff_t ldacc, ptrdiff_t G, const float* p, ptrdiff_t ldp,
                                    const uint8_t* rows, ptrdiff_t nv, ptrdiff_t D) {
    ptrdiff_t g = 0;
    for (; g + 2 <= G; g += 2)
        pg_pv_i8_heads(acc + g * ldacc, acc + (g + 1) * ldacc, 2, p + g * ldp, p + (g + 1) * ldp, rows, nv, D);
    if (g < G) pg_pv_i8_heads(acc + g * ldacc, acc + g * ldacc, 1, p + g * ldp, p + g * ldp, rows, nv, D);
}

/* the 32 values s * (code - 8) of an int4 record as four vectors */
PG_INLINE void pg_i4_vals(const uint8_t* rec, __m256* x) {
    __m128i p0, p1;
    __m256 d = _mm256_set1_ps(pg_h2f_f16c(rec));
    pg_nib32(rec + 2, &p0, &p1);
    x[0] = _mm256_mul_ps(d, pg_cvt8(p0));
    x[1] = _mm256_mul_ps(d, pg_cvt8(_mm_srli_si128(p0, 8)));
    x[2] = _mm256_mul_ps(d, pg_cvt8(p1));
    x[3] = _mm256_mul_ps(d, pg_cvt8(_mm_srli_si128(p1, 8)));
}

PG_INLINE __m256 pg_dot32(const float* q, const __m256* x, __m256 a) {
    a = _mm256_fmadd_ps(_mm256_loadu_ps(q), x[0], a);
    a = _mm256_fmadd_ps(_mm256_loadu_ps(q + 8), x[1], a);
    a = _mm256_fmadd_ps(_mm256_loadu_ps(q + 16), x[2], a);
    return _mm256_fmadd_ps(_mm256_loadu_ps(q + 24), x[3], a);
}

/* int4 scores of NH heads against keys [0, nv): four keys per step */
PG_INLINE void pg_qk_i4_heads(const float* q0, const float* q1, int NH, const uint8_t* rows, ptrdiff_t nv,
                              ptrdiff_t D, float scale, float* s0, float* s1) {
    const ptrdiff_t nb = D / 32, rs = nb * 18;
    const __m128 vscale = _mm_set1_ps(scale);
    ptrdiff_t j = 0, b;
    __m256 x[4];
    for (; j + 4 <= nv; j += 4) {
        const uint8_t* r = rows + j * rs;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        __m256 b0 = a0, b1 = a0, b2 = a0, b3 = a0;
        for (b = 0; b < nb; ++b) {
            const float* qa = q0 + b * 32;
            const float* qb = q1 + b * 32;
            pg_i4_vals(r + b * 18, x);
            a0 = pg_dot32(qa, x, a0);
            if (NH == 2) b0 = pg_dot32(qb, x, b0);
            pg_i4_vals(r + rs + b * 18, x);
            a1 = pg_dot32(qa, x, a1);
            if (NH == 2) b1 = pg_dot32(qb, x, b1);
            pg_i4_vals(r + 2 * rs + b * 18, x);
            a2 = pg_dot32(qa, x, a2);
            if (NH == 2) b2 = pg_dot32(qb, x, b2);
            pg_i4_vals(r + 3 * rs + b * 18, x);
            a3 = pg_dot32(qa, x, a3);
            if (NH == 2) b3 = pg_dot32(qb, x, b3);
        }
        _mm_storeu_ps(s0 + j, _mm_mul_ps(pg_hsum4(a0, a1, a2, a3), vscale));
        if (NH == 2) _mm_storeu_ps(s1 + j, _mm_mul_ps(pg_hsum4(b0, b1, b2, b3), vscale));
    }
    for (; j < nv; ++j) {
        const uint8_t* r = rows + j * rs;
        __m256 a = _mm256_setzero_ps(), c = a;
        for (b = 0; b < nb; ++b) {
            pg_i4_vals(r + b * 18, x);
            a = pg_dot32(q0 + b * 32, x, a);
            if (NH == 2) c = pg_dot32(q1 + b * 32, x, c);
        }
        s0[j] = of_hsum256(a) * scale;
        if (NH == 2) s1[j] = of_hsum256(c) * scale;
    }
}

static PG_TARGET void pg_qk_i4_avx2(const float* q, ptrdiff_t qhs, ptrdiff_t G, const uint8_t* rows,
                                    ptrdiff_t nv, ptrdiff_t D, float scale, float* sc, ptrdiff_t ldsc) {
    ptrdiff_t g = 0;
    for (; g + 2 <= G; g += 2)
        pg_qk_i4_heads(q + g * qhs, q + (g + 1) * qhs, 2, rows, nv, D, scale, sc + g * ldsc,
                       sc + (g + 1) * ldsc);
    if (g < G) pg_qk_i4_heads(q + g * qhs, q + g * qhs, 1, rows, nv, D, scale, sc + g * ldsc, sc + g * ldsc);
}

/* int4 weighted value sums of NH heads, one 32-value block at a time */
PG_INLINE void pg_pv_i4_heads(float* acc0, float* acc1, int NH, const float* p0, const float* p1,
                              const uint8_t* rows, ptrdiff_t nv, ptrdiff_t D) {
    const ptrdiff_t nb = D / 32, rs = nb * 18;
    ptrdiff_t b, j;
    for (b = 0; b < nb; ++b) {
        float* o0 = acc0 + b * 32;
        float* o1 = acc1 + b * 32;
        __m256 a0 = _mm256_loadu_ps(o0), a1 = _mm256_loadu_ps(o0 + 8);
        __m256 a2 = _mm256_loadu_ps(o0 + 16), a3 = _mm256_loadu_ps(o0 + 24);
        __m256 b0 = a0, b1 = a1, b2 = a2, b3 = a3;
        if (NH == 2) {
            b0 = _mm256_loadu_ps(o1);
            b1 = _mm256_loadu_ps(o1 + 8);
            b2 = _mm256_loadu_ps(o1 + 16);
            b3 = _mm256_loadu_ps(o1 + 24);
        }
        for (j = 0; j < nv; ++j) {
            const uint8_t* rec = rows + j * rs + b * 18;
            __m128i c0, c1;
            float d = pg_h2f_f16c(rec);
            pg_nib32(rec + 2, &c0, &c1);
            __m256 x0 = pg_cvt8(c0), x1 = pg_cvt8(_mm_srli_si128(c0, 8));
            __m256 x2 = pg_cvt8(c1), x3 = pg_cvt8(_mm_srli_si128(c1, 8));
            __m256 w = _mm256_set1_ps(p0[j] * d);
            a0 = _mm256_fmadd_ps(w, x0, a0);
            a1 = _mm256_fmadd_ps(w, x1, a1);
            a2 = _mm256_fmadd_ps(w, x2, a2);
            a3 = _mm256_fmadd_ps(w, x3, a3);
            if (NH == 2) {
                __m256 u = _mm256_set1_ps(p1[j] * d);
                b0 = _mm256_fmadd_ps(u, x0, b0);
                b1 = _mm256_fmadd_ps(u, x1, b1);
                b2 = _mm256_fmadd_ps(u, x2, b2);
                b3 = _mm256_fmadd_ps(u, x3, b3);
            }
        }
        _mm256_storeu_ps(o0, a0);
        _mm256_storeu_ps(o0 + 8, a1);
        _mm256_storeu_ps(o0 + 16, a2);
        _mm256_storeu_ps(o0 + 24, a3);
        if (NH == 2) {
            _mm256_storeu_ps(o1, b0);
            _mm256_storeu_ps(o1 + 8, b1);
            _mm256_storeu_ps(o1 + 16, b2);
            _mm256_storeu_ps(o1 + 24, b3);
        }
    }
}

static PG_TARGET void pg_pv_i4_avx2(float* acc, ptrdiff_t ldacc, ptrdiff_t G, const float* p, ptrdiff_t ldp,
                                    const uint8_t* rows, ptrdiff_t nv, ptrdiff_t D) {
    ptrdiff_t g = 0;
    for (; g + 2 <= G; g += 2)
        pg_pv_i4_heads(acc + g * ldacc, acc + (g + 1) * ldacc, 2, p + g * ldp, p + (g + 1) * ldp, rows, nv, D);
    if (g < G) pg_pv_i4_heads(acc + g * ldacc, acc + g * ldacc, 1, p + g * ldp, p + g * ldp, rows, nv, D);
}

/* pg_softmax_base with eight lanes: vector maximum, rescale and exponentials */
static PG_TARGET void pg_softmax_avx2(ptrdiff_t G, ptrdiff_t nv, float* sc, ptrdiff_t ldsc, float* acc,
                                      ptrdiff_t D, float* mx, float* den) {
    ptrdiff_t g, j;
    for (g = 0; g < G; ++g) {
        float* s = sc + g * ldsc;
        float bm = s[0];
        j = 0;
        if (nv >= 8) {
            __m256 m8 = _mm256_loadu_ps(s);
            for (j = 8; j + 8 <= nv; j += 8) m8 = _mm256_max_ps(m8, _mm256_loadu_ps(s + j));
            __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
            m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
            bm = _mm_cvtss_f32(m4);
        }
        for (; j < nv; ++j)
            if (s[j] > bm) bm = s[j];
        if (bm > mx[g]) {
            if (mx[g] != -INFINITY) {
                float c = expf(mx[g] - bm);
                __m256 vc = _mm256_set1_ps(c);
                float* a = acc + g * D;
                for (j = 0; j + 8 <= D; j += 8) _mm256_storeu_ps(a + j, _mm256_mul_ps(vc, _mm256_loadu_ps(a + j)));
                for (; j < D; ++j) a[j] *= c;
                den[g] *= c;
            }
            mx[g] = bm;
        }
        const __m256 vm = _mm256_set1_ps(mx[g]);
        __m256 total = _mm256_setzero_ps();
        for (j = 0; j + 8 <= nv; j += 8) {
            __m256 y = of_exp8_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + j), vm));  /* the kernels' e^x */
            _mm256_storeu_ps(s + j, y);
            total = _mm256_add_ps(total, y);
        }
        float rest = 0.0f;
        for (; j < nv; ++j) {
            s[j] = pg_exp1(s[j] - mx[g]);
            rest += s[j];
        }
        den[g] += of_hsum256(total) + rest;
    }
}

/* ---- AVX-512F versions ------------------------------------------------------- */

#include "_paged_simd512.h"

static int pg_f16c = 0;
static int pg_avx512 = 0;      /* the CPU has AVX-512F (and the AVX2 set) */
static int pg_use512 = 1;      /* cleared by tests to run the AVX2 versions */

static int pg_init(void) {
    __builtin_cpu_init();
    pg_f16c = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    pg_avx512 = pg_f16c && __builtin_cpu_supports("avx512f");
    return pg_f16c;
}

/* 0 portable, 1 AVX2, 2 AVX-512 */
static inline int pg_level(void) {
    if (!(of_simd_avx2 && pg_f16c)) return 0;
    return pg_avx512 && pg_use512 ? 2 : 1;
}
static void pg_set_use512(int on) { pg_use512 = on; }

#define PG_FAST (of_simd_avx2 && pg_f16c)
#define PG_DISPATCH(base, fast, ...) (PG_FAST ? fast(__VA_ARGS__) : base(__VA_ARGS__))
#define PG_DISPATCH3(base, fast, wide, ...) do { int lv_ = pg_level(); \
        if (lv_ == 2) wide(__VA_ARGS__); else if (lv_ == 1) fast(__VA_ARGS__); else base(__VA_ARGS__); } while (0)

#else  /* no x86 vector paths */
#define PG_FAST 0
#define PG_DISPATCH(base, fast, ...) base(__VA_ARGS__)
#define PG_DISPATCH3(base, fast, wide, ...) base(__VA_ARGS__)
static void pg_i8_avx2(const uint8_t* c, float s, float* o, ptrdiff_t n) {}
static void pg_i4_avx2(const uint8_t* c, float s, float* o) {}
static void pg_f16_avx2(const uint8_t* c, float* o, ptrdiff_t n) {}
static int pg_init(void) { return 0; }
static inline int pg_level(void) { return 0; }
static void pg_set_use512(int on) {}
#endif

/* 1 when the vector versions run (the row decoders check it too) */
static inline int pg_fast(void) { return PG_FAST; }

static inline void pg_softmax(ptrdiff_t G, ptrdiff_t nv, float* sc, ptrdiff_t ldsc, float* acc, ptrdiff_t D,
                              float* mx, float* den) {
    PG_DISPATCH(pg_softmax_base, pg_softmax_avx2, G, nv, sc, ldsc, acc, D, mx, den);
}
static inline void pg_qk_i8(const float* q, ptrdiff_t qhs, ptrdiff_t G, const uint8_t* rows, ptrdiff_t nv,
                            ptrdiff_t D, float scale, float* sc, ptrdiff_t ldsc) {
    PG_DISPATCH3(pg_qk_i8_base, pg_qk_i8_avx2, pg_qk_i8_avx512, q, qhs, G, rows, nv, D, scale, sc, ldsc);
}
static inline void pg_pv_i8(float* acc, ptrdiff_t ldacc, ptrdiff_t G, const float* p, ptrdiff_t ldp,
                            const uint8_t* rows, ptrdiff_t nv, ptrdiff_t D) {
    PG_DISPATCH3(pg_pv_i8_base, pg_pv_i8_avx2, pg_pv_i8_avx512, acc, ldacc, G, p, ldp, rows, nv, D);
}
static inline void pg_qk_i4(const float* q, ptrdiff_t qhs, ptrdiff_t G, const uint8_t* rows, ptrdiff_t nv,
                            ptrdiff_t D, float scale, float* sc, ptrdiff_t ldsc) {
    PG_DISPATCH3(pg_qk_i4_base, pg_qk_i4_avx2, pg_qk_i4_avx512, q, qhs, G, rows, nv, D, scale, sc, ldsc);
}
static inline void pg_pv_i4(float* acc, ptrdiff_t ldacc, ptrdiff_t G, const float* p, ptrdiff_t ldp,
                            const uint8_t* rows, ptrdiff_t nv, ptrdiff_t D) {
    PG_DISPATCH3(pg_pv_i4_base, pg_pv_i4_avx2, pg_pv_i4_avx512, acc, ldacc, G, p, ldp, rows, nv, D);
}

#endif /* ONNXFORGE_PAGED_SIMD_H */
