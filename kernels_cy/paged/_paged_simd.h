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
 * Every kernel has a portable version here and one vector body (_paged_body.h, over the
 * vector-width names of _vec.h) compiled for AVX2+FMA+F16C and for AVX-512F; _simd.h's
 * of_simd_level picks one at run time (the build has no -march flag; the tests lower the
 * level). The row decoders are bit-identical on every path; the attention kernels agree
 * up to float32 summation order.
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

/* row decoders: int8 (scale s, n codes), int4 (one record's 16 bytes of codes, scale s),
 * float16 (n values) */
static void pg_dec_i8_base(const uint8_t* c, float s, float* o, ptrdiff_t n) {
    ptrdiff_t i;
    for (i = 0; i < n; ++i) o[i] = s * (float)(int8_t)c[i];
}

static void pg_dec_i4_base(const uint8_t* c, float s, float* o) {
    int i;
    for (i = 0; i < 16; ++i) {
        o[2 * i] = s * (float)((int)(c[i] & 15) - 8);
        o[2 * i + 1] = s * (float)((int)(c[i] >> 4) - 8);
    }
}

static void pg_dec_f16_base(const uint8_t* c, float* o, ptrdiff_t n) {
    ptrdiff_t i;
    for (i = 0; i < n; ++i) o[i] = pg_h2f(c + 2 * i);
}

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

/* ---- vector versions: one body, two widths ------------------------------------ */

#if OF_HAVE_AVX2_CLONE
#define OF_VW 8
#include "_paged_body.h"
#undef OF_VW
#define OF_VW 16
#include "_paged_body.h"
#undef OF_VW
#endif

static inline void pg_dec_i8(const uint8_t* c, float s, float* o, ptrdiff_t n) {
    OF_DISPATCH_LV(pg_dec_i8, c, s, o, n);
}
static inline void pg_dec_i4(const uint8_t* c, float s, float* o) {
    OF_DISPATCH_LV(pg_dec_i4, c, s, o);
}
static inline void pg_dec_f16(const uint8_t* c, float* o, ptrdiff_t n) {
    OF_DISPATCH_LV(pg_dec_f16, c, o, n);
}
static inline void pg_softmax(ptrdiff_t G, ptrdiff_t nv, float* sc, ptrdiff_t ldsc, float* acc, ptrdiff_t D,
                              float* mx, float* den) {
    OF_DISPATCH_LV(pg_softmax, G, nv, sc, ldsc, acc, D, mx, den);
}
static inline void pg_qk_i8(const float* q, ptrdiff_t qhs, ptrdiff_t G, const uint8_t* rows, ptrdiff_t nv,
                            ptrdiff_t D, float scale, float* sc, ptrdiff_t ldsc) {
    OF_DISPATCH_LV(pg_qk_i8, q, qhs, G, rows, nv, D, scale, sc, ldsc);
}
static inline void pg_pv_i8(float* acc, ptrdiff_t ldacc, ptrdiff_t G, const float* p, ptrdiff_t ldp,
                            const uint8_t* rows, ptrdiff_t nv, ptrdiff_t D) {
    OF_DISPATCH_LV(pg_pv_i8, acc, ldacc, G, p, ldp, rows, nv, D);
}
static inline void pg_qk_i4(const float* q, ptrdiff_t qhs, ptrdiff_t G, const uint8_t* rows, ptrdiff_t nv,
                            ptrdiff_t D, float scale, float* sc, ptrdiff_t ldsc) {
    OF_DISPATCH_LV(pg_qk_i4, q, qhs, G, rows, nv, D, scale, sc, ldsc);
}
static inline void pg_pv_i4(float* acc, ptrdiff_t ldacc, ptrdiff_t G, const float* p, ptrdiff_t ldp,
                            const uint8_t* rows, ptrdiff_t nv, ptrdiff_t D) {
    OF_DISPATCH_LV(pg_pv_i4, acc, ldacc, G, p, ldp, rows, nv, D);
}

#endif /* ONNXFORGE_PAGED_SIMD_H */
