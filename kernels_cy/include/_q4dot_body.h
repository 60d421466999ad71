/* Vector body of of_q4dot32_rows (_q4dot.h), over the vector-width names of _vec.h and
 * included once per width. A block's 16 bytes are read VF_LANES at a time; the low
 * nibbles of bytes [c, c + VF_LANES) multiply ap[c ...] and their high nibbles
 * ap[16 + c ...] (the activations are in nibble order). No include guard, on purpose.
 */
#include "_vec.h"

/* sum over blocks of the row's scale times (codes . activations) of one block */
VF_INLINE vf VF_NAME(of_q4_block)(const uint8_t* cb, const vf* a, float scale, vf acc) {
    vf lo, hi, d;
    int c;
    vf_nibbles(cb, &lo, &hi);
    d = vf_fmadd(hi, a[16 / VF_LANES], vf_mul(lo, a[0]));
    for (c = 1; c < 16 / VF_LANES; ++c) {
        vf_nibbles(cb + c * VF_LANES, &lo, &hi);
        d = vf_fmadd(hi, a[16 / VF_LANES + c], vf_fmadd(lo, a[c], d));
    }
    return vf_fmadd(vf_set1(scale), d, acc);
}

static VF_TARGET void VF_NAME(of_q4dot32_rows)(const uint8_t* codes, const float* scales, const float* ap,
                                               ptrdiff_t nblk, ptrdiff_t nrows, float* out) {
    ptrdiff_t r = 0, kb;
    int i;
    vf a[32 / VF_LANES];
    for (; r + 4 <= nrows; r += 4) {  /* four rows share each block's activations */
        vf acc[4];
        for (i = 0; i < 4; ++i) acc[i] = vf_zero();
        for (kb = 0; kb < nblk; ++kb) {
            for (i = 0; i < 32 / VF_LANES; ++i) a[i] = vf_load(ap + kb * 32 + i * VF_LANES);
            for (i = 0; i < 4; ++i)
                acc[i] = VF_NAME(of_q4_block)(codes + ((r + i) * nblk + kb) * 16, a, scales[(r + i) * nblk + kb],
                                              acc[i]);
        }
        for (i = 0; i < 4; ++i) out[r + i] = vf_hsum(acc[i]);
    }
    for (; r < nrows; ++r) {
        vf acc = vf_zero();
        for (kb = 0; kb < nblk; ++kb) {
            for (i = 0; i < 32 / VF_LANES; ++i) a[i] = vf_load(ap + kb * 32 + i * VF_LANES);
            acc = VF_NAME(of_q4_block)(codes + (r * nblk + kb) * 16, a, scales[r * nblk + kb], acc);
        }
        out[r] = vf_hsum(acc);
    }
}
