/* AVX-512F versions of the int8 / int4 decode-attention kernels of _paged_simd.h (which
 * includes this file inside its x86 section and selects them at run time): sixteen lanes,
 * eight keys per score step, the same formulas as the AVX2 and portable versions.
 */
#ifndef ONNXFORGE_PAGED_SIMD512_H
#define ONNXFORGE_PAGED_SIMD512_H

#define PG_TARGET512 __attribute__((target("avx512f,avx2,fma,f16c")))
#define PG_INLINE512 static inline __attribute__((always_inline)) PG_TARGET512

/* lane r of the result is the sum of the sixteen lanes of a[r] */
PG_INLINE512 __m256 pg_hsum8x16(const __m512* a) {
    __m256 h[8];
    int r;
    for (r = 0; r < 8; ++r)
        h[r] = _mm256_add_ps(_mm512_castps512_ps256(a[r]),
                             _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a[r]), 1)));
    return of_hsum8x8(h);
}

PG_INLINE512 __m512 pg_ld16(const uint8_t* c) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)c)));
}

PG_INLINE512 void pg_qk_i8_heads512(const float* q0, const float* q1, int NH, const uint8_t* rows,
                                    ptrdiff_t nv, ptrdiff_t D, float scale, float* s0, float* s1) {
    const ptrdiff_t rs = 4 + D;
    ptrdiff_t j = 0, i;
    int r;
    for (; j + 8 <= nv; j += 8) {
        const uint8_t* c = rows + j * rs + 4;
        __m512 a[8], b[8];
        float sv[8];
        for (r = 0; r < 8; ++r) a[r] = b[r] = _mm512_setzero_ps();
        for (i = 0; i < D; i += 16) {
            __m512 qa = _mm512_loadu_ps(q0 + i), qb = _mm512_loadu_ps(q1 + i);
            for (r = 0; r < 8; ++r) {
                __m512 x = pg_ld16(c + r * rs + i);
                a[r] = _mm512_fmadd_ps(qa, x, a[r]);
                if (NH == 2) b[r] = _mm512_fmadd_ps(qb, x, b[r]);
            }
        }
        for (r = 0; r < 8; ++r) sv[r] = pg_ldf(c + r * rs - 4) * scale;
        __m256 vs = _mm256_loadu_ps(sv);
        _mm256_storeu_ps(s0 + j, _mm256_mul_ps(pg_hsum8x16(a), vs));
        if (NH == 2) _mm256_storeu_ps(s1 + j, _mm256_mul_ps(pg_hsum8x16(b), vs));
    }
    for (; j < nv; ++j) {
        const uint8_t* c = rows + j * rs + 4;
        __m512 a = _mm512_setzero_ps(), b = a;
        for (i = 0; i < D; i += 16) {
            __m512 x = pg_ld16(c + i);
            a = _mm512_fmadd_ps(_mm512_loadu_ps(q0 + i), x, a);
            if (NH == 2) b = _mm512_fmadd_ps(_mm512_loadu_ps(q1 + i), x, b);
        }
        float s = pg_ldf(c - 4) * scale;
        s0[j] = _mm512_reduce_add_ps(a) * s;
        if (NH == 2) s1[j] = _mm512_reduce_add_ps(b) * s;
    }
}

static PG_TARGET512 void pg_qk_i8_avx512(const float* q, ptrdiff_t qhs, ptrdiff_t G, const uint8_t* rows,
                                         ptrdiff_t nv, ptrdiff_t D, float scale, float* sc, ptrdiff_t ldsc) {
    ptrdiff_t g = 0;
    for (; g + 2 <= G; g += 2)
        pg_qk_i8_heads512(q + g * qhs, q + (g + 1) * qhs, 2, rows, nv, D, scale, sc + g * ldsc,
                          sc + (g + 1) * ldsc);
    if (g < G) pg_qk_i8_heads512(q + g * qhs, q + g * qhs, 1, rows, nv, D, scale, sc + g * ldsc, sc + g * ldsc);
}

/* NV (2 or 4) vectors of 16 dims of NH heads over the keys: acc += (p_j * s_j) * code_j */
PG_INLINE512 void pg_pv_i8_chunk512(float* o0, float* o1, int NH, int NV, const float* p0, const float* p1,
                                    const uint8_t* rows, ptrdiff_t c, ptrdiff_t rs, ptrdiff_t nv) {
    __m512 a[4], b[4];
    ptrdiff_t j;
    int r;
    for (r = 0; r < NV; ++r) {
        a[r] = _mm512_loadu_ps(o0 + 16 * r);
        b[r] = NH == 2 ? _mm512_loadu_ps(o1 + 16 * r) : a[r];
    }
    for (j = 0; j < nv; ++j) {
        const uint8_t* rec = rows + j * rs;
        float s = pg_ldf(rec);
        __m512 w = _mm512_set1_ps(p0[j] * s), u = _mm512_set1_ps(p1[j] * s);
        for (r = 0; r < NV; ++r) {
            __m512 x = pg_ld16(rec + 4 + c + 16 * r);
            a[r] = _mm512_fmadd_ps(w, x, a[r]);
            if (NH == 2) b[r] = _mm512_fmadd_ps(u, x, b[r]);
        }
    }
    for (r = 0; r < NV; ++r) {
        _mm512_storeu_ps(o0 + 16 * r, a[r]);
        if (NH == 2) _mm512_storeu_ps(o1 + 16 * r, b[r]);
    }
}

PG_INLINE512 void pg_pv_i8_heads512(float* acc0, float* acc1, int NH, const float* p0, const float* p1,
                                    const uint8_t* rows, ptrdiff_t nv, ptrdiff_t D) {
    const ptrdiff_t rs = 4 + D;
    ptrdiff_t c = 0;
    for (; c + 64 <= D; c += 64)
        pg_pv_i8_chunk512(acc0 + c, acc1 + c, NH, 4, p0, p1, rows, c, rs, nv);
    if (c < D) pg_pv_i8_chunk512(acc0 + c, acc1 + c, NH, 2, p0, p1, rows, c, rs, nv);
}

static PG_TARGET512 void pg_pv_i8_avx512(float* acc, ptrdiff_t ldacc, ptrdiff_t G, const float* p,
                                         ptrdiff_t ldp, const uint8_t* rows, ptrdiff_t nv, ptrdiff_t D) {
    ptrdiff_t g = 0;
    for (; g + 2 <= G; g += 2)
        pg_pv_i8_heads512(acc + g * ldacc, acc + (g + 1) * ldacc, 2, p + g * ldp, p + (g + 1) * ldp, rows, nv, D);
    if (g < G) pg_pv_i8_heads512(acc + g * ldacc, acc + g * ldacc, 1, p + g * ldp, p + g * ldp, rows, nv, D);
}

/* int4 with sixteen lanes works in the codes' byte order: lane k of the "even" vector is
 * element 2k of a block (low nibble of byte k), lane k of the "odd" one element 2k + 1,
 * so the query and the value accumulators are split into even and odd elements. */
PG_INLINE512 __m512i pg_idx(int a, int step) {
    return _mm512_set_epi32(a + 15 * step, a + 14 * step, a + 13 * step, a + 12 * step, a + 11 * step,
                            a + 10 * step, a + 9 * step, a + 8 * step, a + 7 * step, a + 6 * step,
                            a + 5 * step, a + 4 * step, a + 3 * step, a + 2 * step, a + step, a);
}

/* even and odd elements of the 32 values at v */
PG_INLINE512 void pg_split32(const float* v, __m512* e, __m512* o) {
    __m512 lo = _mm512_loadu_ps(v), hi = _mm512_loadu_ps(v + 16);
    *e = _mm512_permutex2var_ps(lo, pg_idx(0, 2), hi);
    *o = _mm512_permutex2var_ps(lo, pg_idx(1, 2), hi);
}

/* the inverse of pg_split32, stored at v */
PG_INLINE512 void pg_merge32(float* v, __m512 e, __m512 o) {
    const __m512i i0 = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const __m512i i1 = _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
    _mm512_storeu_ps(v, _mm512_permutex2var_ps(e, i0, o));
    _mm512_storeu_ps(v + 16, _mm512_permutex2var_ps(e, i1, o));
}

/* the codes minus 8 of an int4 record's 16 bytes: even and odd elements */
PG_INLINE512 void pg_i4_codes512(const uint8_t* c, __m512* e, __m512* o) {
    const __m512i m15 = _mm512_set1_epi32(15), e8 = _mm512_set1_epi32(8);
    __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)c));
    *e = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_and_si512(b, m15), e8));
    *o = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_srli_epi32(b, 4), e8));
}

PG_INLINE512 void pg_qk_i4_heads512(const float* q0, const float* q1, int NH, const uint8_t* rows,
                                    ptrdiff_t nv, ptrdiff_t D, float scale, float* s0, float* s1) {
    const ptrdiff_t nb = D / 32, rs = nb * 18;
    const __m256 vscale = _mm256_set1_ps(scale);
    ptrdiff_t j = 0, bk;
    int r;
    for (; j + 8 <= nv; j += 8) {
        const uint8_t* c = rows + j * rs;
        __m512 a[8], b[8];
        for (r = 0; r < 8; ++r) a[r] = b[r] = _mm512_setzero_ps();
        for (bk = 0; bk < nb; ++bk) {
            __m512 qa0, qa1, qb0, qb1;
            pg_split32(q0 + bk * 32, &qa0, &qa1);
            pg_split32(q1 + bk * 32, &qb0, &qb1);
            for (r = 0; r < 8; ++r) {
                const uint8_t* rec = c + r * rs + bk * 18;
                __m512 x0, x1;
                __m512 d = _mm512_set1_ps(pg_h2f_f16c(rec));
                pg_i4_codes512(rec + 2, &x0, &x1);
                x0 = _mm512_mul_ps(d, x0);
                x1 = _mm512_mul_ps(d, x1);
                a[r] = _mm512_fmadd_ps(qa1, x1, _mm512_fmadd_ps(qa0, x0, a[r]));
                if (NH == 2) b[r] = _mm512_fmadd_ps(qb1, x1, _mm512_fmadd_ps(qb0, x0, b[r]));
            }
        }
        _mm256_storeu_ps(s0 + j, _mm256_mul_ps(pg_hsum8x16(a), vscale));
        if (NH == 2) _mm256_storeu_ps(s1 + j, _mm256_mul_ps(pg_hsum8x16(b), vscale));
    }
    for (; j < nv; ++j) {
        const uint8_t* c = rows + j * rs;
        __m512 a = _mm512_setzero_ps(), b = a;
        for (bk = 0; bk < nb; ++bk) {
            __m512 x0, x1, qa0, qa1, qb0, qb1;
            __m512 d = _mm512_set1_ps(pg_h2f_f16c(c + bk * 18));
            pg_split32(q0 + bk * 32, &qa0, &qa1);
            pg_split32(q1 + bk * 32, &qb0, &qb1);
            pg_i4_codes512(c + bk * 18 + 2, &x0, &x1);
            x0 = _mm512_mul_ps(d, x0);
            x1 = _mm512_mul_ps(d, x1);
            a = _mm512_fmadd_ps(qa1, x1, _mm512_fmadd_ps(qa0, x0, a));
            if (NH == 2) b = _mm512_fmadd_ps(qb1, x1, _mm512_fmadd_ps(qb0, x0, b));
        }
        s0[j] = _mm512_reduce_add_ps(a) * scale;
        if (NH == 2) s1[j] = _mm512_reduce_add_ps(b) * scale;
    }
}

static PG_TARGET512 void pg_qk_i4_avx512(const float* q, ptrdiff_t qhs, ptrdiff_t G, const uint8_t* rows,
                                         ptrdiff_t nv, ptrdiff_t D, float scale, float* sc, ptrdiff_t ldsc) {
    ptrdiff_t g = 0;
    for (; g + 2 <= G; g += 2)
        pg_qk_i4_heads512(q + g * qhs, q + (g + 1) * qhs, 2, rows, nv, D, scale, sc + g * ldsc,
                          sc + (g + 1) * ldsc);
    if (g < G) pg_qk_i4_heads512(q + g * qhs, q + g * qhs, 1, rows, nv, D, scale, sc + g * ldsc, sc + g * ldsc);
}

/* int4 value sums of NH heads, NB (1 or 2) blocks of 32 dims at a time */
PG_INLINE512 void pg_pv_i4_blocks512(float* o0, float* o1, int NH, int NB, const float* p0, const float* p1,
                                     const uint8_t* rows, ptrdiff_t rs, ptrdiff_t nv) {
    __m512 a[4], b[4];
    ptrdiff_t j;
    int r;
    for (r = 0; r < NB; ++r) {
        pg_split32(o0 + 32 * r, &a[2 * r], &a[2 * r + 1]);
        if (NH == 2) pg_split32(o1 + 32 * r, &b[2 * r], &b[2 * r + 1]);
        else b[2 * r] = b[2 * r + 1] = a[2 * r];
    }
    for (j = 0; j < nv; ++j) {
        for (r = 0; r < NB; ++r) {
            const uint8_t* rec = rows + j * rs + r * 18;
            __m512 x0, x1;
            float d = pg_h2f_f16c(rec);
            pg_i4_codes512(rec + 2, &x0, &x1);
            __m512 w = _mm512_set1_ps(p0[j] * d);
            a[2 * r] = _mm512_fmadd_ps(w, x0, a[2 * r]);
            a[2 * r + 1] = _mm512_fmadd_ps(w, x1, a[2 * r + 1]);
            if (NH == 2) {
                __m512 u = _mm512_set1_ps(p1[j] * d);
                b[2 * r] = _mm512_fmadd_ps(u, x0, b[2 * r]);
                b[2 * r + 1] = _mm512_fmadd_ps(u, x1, b[2 * r + 1]);
            }
        }
    }
    for (r = 0; r < NB; ++r) {
        pg_merge32(o0 + 32 * r, a[2 * r], a[2 * r + 1]);
        if (NH == 2) pg_merge32(o1 + 32 * r, b[2 * r], b[2 * r + 1]);
    }
}

PG_INLINE512 void pg_pv_i4_heads512(float* acc0, float* acc1, int NH, const float* p0, const float* p1,
                                    const uint8_t* rows, ptrdiff_t nv, ptrdiff_t D) {
    const ptrdiff_t nb = D / 32, rs = nb * 18;
    ptrdiff_t bk = 0;
    for (; bk + 2 <= nb; bk += 2)
        pg_pv_i4_blocks512(acc0 + bk * 32, acc1 + bk * 32, NH, 2, p0, p1, rows + bk * 18, rs, nv);
    if (bk < nb) pg_pv_i4_blocks512(acc0 + bk * 32, acc1 + bk * 32, NH, 1, p0, p1, rows + bk * 18, rs, nv);
}

static PG_TARGET512 void pg_pv_i4_avx512(float* acc, ptrdiff_t ldacc, ptrdiff_t G, const float* p,
                                         ptrdiff_t ldp, const uint8_t* rows, ptrdiff_t nv, ptrdiff_t D) {
    ptrdiff_t g = 0;
    for (; g + 2 <= G; g += 2)
        pg_pv_i4_heads512(acc + g * ldacc, acc + (g + 1) * ldacc, 2, p + g * ldp, p + (g + 1) * ldp, rows, nv, D);
    if (g < G) pg_pv_i4_heads512(acc + g * ldacc, acc + g * ldacc, 1, p + g * ldp, p + g * ldp, rows, nv, D);
}

#endif /* ONNXFORGE_PAGED_SIMD512_H */
