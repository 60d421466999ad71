/* Vector bodies of the paged kernels (_paged_simd.h), written once over the vf_* names of
 * _vec.h and included once per vector width (OF_VW 8 and 16): VF_NAME(f) is f_avx2 or
 * f_avx512. Four keys per score step, query heads in pairs, codes converted to float in
 * registers (no decoded row is written to memory). No include guard, on purpose.
 */
#include "_vec.h"

/* row decoders: one multiply per value, so bit-identical to the portable loops */
static VF_TARGET void VF_NAME(pg_dec_i8)(const uint8_t* c, float s, float* o, ptrdiff_t n) {
    const vf vs = vf_set1(s);
    ptrdiff_t i = 0;
    for (; i + VF_LANES <= n; i += VF_LANES) vf_store(o + i, vf_mul(vs, vf_ld_i8(c + i)));
    for (; i < n; ++i) o[i] = s * (float)(int8_t)c[i];
}

static VF_TARGET void VF_NAME(pg_dec_i4)(const uint8_t* c, float s, float* o) {
    const vf vs = vf_set1(s);
    vf x[VF_I4_VECS];
    int r;
    vf_i4(c, x);
    for (r = 0; r < VF_I4_VECS; ++r) vf_store(o + r * VF_LANES, vf_mul(vs, x[r]));
}

static VF_TARGET void VF_NAME(pg_dec_f16)(const uint8_t* c, float* o, ptrdiff_t n) {
    ptrdiff_t i = 0;
    for (; i + VF_LANES <= n; i += VF_LANES) vf_store(o + i, vf_ld_f16(c + 2 * i));
    for (; i < n; ++i) o[i] = pg_h2f(c + 2 * i);
}

/* int8 scores of NH (1 or 2) heads against keys [0, nv) */
VF_INLINE void VF_NAME(pg_qk_i8_heads)(const float* q0, const float* q1, int NH, const uint8_t* rows,
                                       ptrdiff_t nv, ptrdiff_t D, float scale, float* s0, float* s1) {
    const ptrdiff_t rs = 4 + D;
    ptrdiff_t j = 0, i;
    int r;
    for (; j + 4 <= nv; j += 4) {
        const uint8_t* c = rows + j * rs + 4;
        vf a[4], b[4];
        for (r = 0; r < 4; ++r) a[r] = b[r] = vf_zero();
        for (i = 0; i < D; i += VF_LANES) {
            vf qa = vf_load(q0 + i), qb = vf_load(q1 + i);
            for (r = 0; r < 4; ++r) {
                vf x = vf_ld_i8(c + r * rs + i);
                a[r] = vf_fmadd(qa, x, a[r]);
                if (NH == 2) b[r] = vf_fmadd(qb, x, b[r]);
            }
        }
        __m128 sv = _mm_mul_ps(_mm_set_ps(pg_ldf(c + 3 * rs - 4), pg_ldf(c + 2 * rs - 4), pg_ldf(c + rs - 4),
                                          pg_ldf(c - 4)), _mm_set1_ps(scale));
        _mm_storeu_ps(s0 + j, _mm_mul_ps(vf_hsum4(a), sv));
        if (NH == 2) _mm_storeu_ps(s1 + j, _mm_mul_ps(vf_hsum4(b), sv));
    }
    for (; j < nv; ++j) {
        const uint8_t* c = rows + j * rs + 4;
        vf a = vf_zero(), b = a;
        for (i = 0; i < D; i += VF_LANES) {
            vf x = vf_ld_i8(c + i);
            a = vf_fmadd(vf_load(q0 + i), x, a);
            if (NH == 2) b = vf_fmadd(vf_load(q1 + i), x, b);
        }
        float s = pg_ldf(c - 4) * scale;
        s0[j] = vf_hsum(a) * s;
        if (NH == 2) s1[j] = vf_hsum(b) * s;
    }
}

/* NV (<= 4) vectors of dims at o0 / o1 of NH heads over the keys: acc += (p_j * s_j) * code_j */
VF_INLINE void VF_NAME(pg_pv_i8_chunk)(float* o0, float* o1, int NH, int NV, const float* p0, const float* p1,
                                       const uint8_t* rows, ptrdiff_t c, ptrdiff_t rs, ptrdiff_t nv) {
    vf a[4], b[4];
    ptrdiff_t j;
    int r;
    for (r = 0; r < NV; ++r) {
        a[r] = vf_load(o0 + r * VF_LANES);
        b[r] = NH == 2 ? vf_load(o1 + r * VF_LANES) : a[r];
    }
    for (j = 0; j < nv; ++j) {
        const uint8_t* rec = rows + j * rs;
        float s = pg_ldf(rec);
        vf w = vf_set1(p0[j] * s), u = vf_set1(p1[j] * s);
        for (r = 0; r < NV; ++r) {
            vf x = vf_ld_i8(rec + 4 + c + r * VF_LANES);
            a[r] = vf_fmadd(w, x, a[r]);
            if (NH == 2) b[r] = vf_fmadd(u, x, b[r]);
        }
    }
    for (r = 0; r < NV; ++r) {
        vf_store(o0 + r * VF_LANES, a[r]);
        if (NH == 2) vf_store(o1 + r * VF_LANES, b[r]);
    }
}

/* chunks of four vectors, then of two (D is a multiple of 32, so of 2 * VF_LANES) */
VF_INLINE void VF_NAME(pg_pv_i8_heads)(float* acc0, float* acc1, int NH, const float* p0, const float* p1,
                                       const uint8_t* rows, ptrdiff_t nv, ptrdiff_t D) {
    ptrdiff_t c = 0;
    for (; c + 4 * VF_LANES <= D; c += 4 * VF_LANES)
        VF_NAME(pg_pv_i8_chunk)(acc0 + c, acc1 + c, NH, 4, p0, p1, rows, c, 4 + D, nv);
    for (; c < D; c += 2 * VF_LANES)
        VF_NAME(pg_pv_i8_chunk)(acc0 + c, acc1 + c, NH, 2, p0, p1, rows, c, 4 + D, nv);
}

/* the 32 values d * (code - 8) of an int4 record */
VF_INLINE void VF_NAME(pg_i4_vals)(const uint8_t* rec, vf* x) {
    vf d = vf_set1(vf_h2f(rec));
    int r;
    vf_i4(rec + 2, x);
    for (r = 0; r < VF_I4_VECS; ++r) x[r] = vf_mul(d, x[r]);
}

VF_INLINE vf VF_NAME(pg_dot32)(const float* q, const vf* x, vf a) {
    int r;
    for (r = 0; r < VF_I4_VECS; ++r) a = vf_fmadd(vf_load(q + r * VF_LANES), x[r], a);
    return a;
}

/* int4 scores of NH heads against keys [0, nv) */
VF_INLINE void VF_NAME(pg_qk_i4_heads)(const float* q0, const float* q1, int NH, const uint8_t* rows,
                                       ptrdiff_t nv, ptrdiff_t D, float scale, float* s0, float* s1) {
    const ptrdiff_t nb = D / 32, rs = nb * 18;
    const __m128 vscale = _mm_set1_ps(scale);
    ptrdiff_t j = 0, bk;
    int r;
    vf x[VF_I4_VECS];
    for (; j + 4 <= nv; j += 4) {
        const uint8_t* c = rows + j * rs;
        vf a[4], b[4];
        for (r = 0; r < 4; ++r) a[r] = b[r] = vf_zero();
        for (bk = 0; bk < nb; ++bk) {
            for (r = 0; r < 4; ++r) {
                VF_NAME(pg_i4_vals)(c + r * rs + bk * 18, x);
                a[r] = VF_NAME(pg_dot32)(q0 + bk * 32, x, a[r]);
                if (NH == 2) b[r] = VF_NAME(pg_dot32)(q1 + bk * 32, x, b[r]);
            }
        }
        _mm_storeu_ps(s0 + j, _mm_mul_ps(vf_hsum4(a), vscale));
        if (NH == 2) _mm_storeu_ps(s1 + j, _mm_mul_ps(vf_hsum4(b), vscale));
    }
    for (; j < nv; ++j) {
        const uint8_t* c = rows + j * rs;
        vf a = vf_zero(), b = a;
        for (bk = 0; bk < nb; ++bk) {
            VF_NAME(pg_i4_vals)(c + bk * 18, x);
            a = VF_NAME(pg_dot32)(q0 + bk * 32, x, a);
            if (NH == 2) b = VF_NAME(pg_dot32)(q1 + bk * 32, x, b);
        }
        s0[j] = vf_hsum(a) * scale;
        if (NH == 2) s1[j] = vf_hsum(b) * scale;
    }
}

/* int4 value sums of NH heads over NB whole records (NB * VF_I4_VECS <= 4 vectors) */
VF_INLINE void VF_NAME(pg_pv_i4_blocks)(float* o0, float* o1, int NH, int NB, const float* p0, const float* p1,
                                        const uint8_t* rows, ptrdiff_t rs, ptrdiff_t nv) {
    const int NV = NB * VF_I4_VECS;
    vf a[4], b[4], x[VF_I4_VECS];
    ptrdiff_t j;
    int r, k;
    for (r = 0; r < NV; ++r) {
        a[r] = vf_load(o0 + r * VF_LANES);
        b[r] = NH == 2 ? vf_load(o1 + r * VF_LANES) : a[r];
    }
    for (j = 0; j < nv; ++j) {
        for (k = 0; k < NB; ++k) {
            const uint8_t* rec = rows + j * rs + k * 18;
            float d = vf_h2f(rec);
            vf w = vf_set1(p0[j] * d), u = vf_set1(p1[j] * d);
            vf_i4(rec + 2, x);
            for (r = 0; r < VF_I4_VECS; ++r) {
                a[k * VF_I4_VECS + r] = vf_fmadd(w, x[r], a[k * VF_I4_VECS + r]);
                if (NH == 2) b[k * VF_I4_VECS + r] = vf_fmadd(u, x[r], b[k * VF_I4_VECS + r]);
            }
        }
    }
    for (r = 0; r < NV; ++r) {
        vf_store(o0 + r * VF_LANES, a[r]);
        if (NH == 2) vf_store(o1 + r * VF_LANES, b[r]);
    }
}

VF_INLINE void VF_NAME(pg_pv_i4_heads)(float* acc0, float* acc1, int NH, const float* p0, const float* p1,
                                       const uint8_t* rows, ptrdiff_t nv, ptrdiff_t D) {
    const ptrdiff_t nb = D / 32, rs = nb * 18, step = 4 / VF_I4_VECS;
    ptrdiff_t bk = 0;
    for (; bk + step <= nb; bk += step)
        VF_NAME(pg_pv_i4_blocks)(acc0 + bk * 32, acc1 + bk * 32, NH, (int)step, p0, p1, rows + bk * 18, rs, nv);
    for (; bk < nb; ++bk)
        VF_NAME(pg_pv_i4_blocks)(acc0 + bk * 32, acc1 + bk * 32, NH, 1, p0, p1, rows + bk * 18, rs, nv);
}

/* the heads of a group in pairs, then the odd one */
static VF_TARGET void VF_NAME(pg_qk_i8)(const float* q, ptrdiff_t qhs, ptrdiff_t G, const uint8_t* rows,
                                        ptrdiff_t nv, ptrdiff_t D, float scale, float* sc, ptrdiff_t ldsc) {
    ptrdiff_t g = 0;
    for (; g + 2 <= G; g += 2)
        VF_NAME(pg_qk_i8_heads)(q + g * qhs, q + (g + 1) * qhs, 2, rows, nv, D, scale, sc + g * ldsc,
                                sc + (g + 1) * ldsc);
    if (g < G)
        VF_NAME(pg_qk_i8_heads)(q + g * qhs, q + g * qhs, 1, rows, nv, D, scale, sc + g * ldsc, sc + g * ldsc);
}

static VF_TARGET void VF_NAME(pg_qk_i4)(const float* q, ptrdiff_t qhs, ptrdiff_t G, const uint8_t* rows,
                                        ptrdiff_t nv, ptrdiff_t D, float scale, float* sc, ptrdiff_t ldsc) {
    ptrdiff_t g = 0;
    for (; g + 2 <= G; g += 2)
        VF_NAME(pg_qk_i4_heads)(q + g * qhs, q + (g + 1) * qhs, 2, rows, nv, D, scale, sc + g * ldsc,
                                sc + (g + 1) * ldsc);
    if (g < G)
        VF_NAME(pg_qk_i4_heads)(q + g * qhs, q + g * qhs, 1, rows, nv, D, scale, sc + g * ldsc, sc + g * ldsc);
}

static VF_TARGET void VF_NAME(pg_pv_i8)(float* acc, ptrdiff_t ldacc, ptrdiff_t G, const float* p, ptrdiff_t ldp,
                                        const uint8_t* rows, ptrdiff_t nv, ptrdiff_t D) {
    ptrdiff_t g = 0;
    for (; g + 2 <= G; g += 2)
        VF_NAME(pg_pv_i8_heads)(acc + g * ldacc, acc + (g + 1) * ldacc, 2, p + g * ldp, p + (g + 1) * ldp,
                                rows, nv, D);
    if (g < G) VF_NAME(pg_pv_i8_heads)(acc + g * ldacc, acc + g * ldacc, 1, p + g * ldp, p + g * ldp, rows, nv, D);
}

static VF_TARGET void VF_NAME(pg_pv_i4)(float* acc, ptrdiff_t ldacc, ptrdiff_t G, const float* p, ptrdiff_t ldp,
                                        const uint8_t* rows, ptrdiff_t nv, ptrdiff_t D) {
    ptrdiff_t g = 0;
    for (; g + 2 <= G; g += 2)
        VF_NAME(pg_pv_i4_heads)(acc + g * ldacc, acc + (g + 1) * ldacc, 2, p + g * ldp, p + (g + 1) * ldp,
                                rows, nv, D);
    if (g < G) VF_NAME(pg_pv_i4_heads)(acc + g * ldacc, acc + g * ldacc, 1, p + g * ldp, p + g * ldp, rows, nv, D);
}

/* pg_softmax_base over vectors: vector maximum, rescale and exponentials (the tail of the
 * scores by the same polynomial, one value at a time) */
static VF_TARGET void VF_NAME(pg_softmax)(ptrdiff_t G, ptrdiff_t nv, float* sc, ptrdiff_t ldsc, float* acc,
                                          ptrdiff_t D, float* mx, float* den) {
    ptrdiff_t g, j;
    for (g = 0; g < G; ++g) {
        float* s = sc + g * ldsc;
        float bm = s[0], rest = 0.0f;
        j = 0;
        if (nv >= VF_LANES) {
            vf m = vf_load(s);
            for (j = VF_LANES; j + VF_LANES <= nv; j += VF_LANES) m = vf_max(m, vf_load(s + j));
            bm = vf_hmax(m);
        }
        for (; j < nv; ++j)
            if (s[j] > bm) bm = s[j];
        if (bm > mx[g]) {
            if (mx[g] != -INFINITY) {
                float c = expf(mx[g] - bm);
                vf vc = vf_set1(c);
                float* a = acc + g * D;
                for (j = 0; j + VF_LANES <= D; j += VF_LANES) vf_store(a + j, vf_mul(vc, vf_load(a + j)));
                for (; j < D; ++j) a[j] *= c;
                den[g] *= c;
            }
            mx[g] = bm;
        }
        vf vm = vf_set1(mx[g]), total = vf_zero();
        for (j = 0; j + VF_LANES <= nv; j += VF_LANES) {
            vf y = vf_exp(vf_sub(vf_load(s + j), vm));
            vf_store(s + j, y);
            total = vf_add(total, y);
        }
        for (; j < nv; ++j) {
            s[j] = pg_exp1(s[j] - mx[g]);
            rest += s[j];
        }
        den[g] += vf_hsum(total) + rest;
    }
}
