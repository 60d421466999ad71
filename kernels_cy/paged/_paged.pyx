# cython: boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""Page codecs and grouped-query attention of the paged KV cache.

A page holds the keys and values of ``P`` tokens of one attention layer: logically
float32 ``[2, H, P, D]`` (0 = keys, 1 = values), physically a flat uint8 payload
in one of seven formats whose byte layouts are fixed by the paged-formats
contract (float32, float16, int8, int4, fp8, int2, codebook; format codes 0..6
in that order). Every encoder rounds half to even and clamps; every decoder is
exact given the bytes (float32 arithmetic).

Entry points (argument checks are the caller's, ``kernels_cy/paged/pages.py``, except
sizes, which are checked here before any byte is written):

* :func:`init_page` writes the encoding of an all-zero page;
* :func:`encode_rows` quantizes ``n`` tokens of K and V into a page at token
  offset ``t0`` (int2 keys are quantized per channel over the page, so their
  groups are requantized from the page's earlier tokens, page-local work);
* :func:`decode_page` decodes a whole page (conversion, tests);
* :func:`attention` is causal grouped-query attention over the pages, one online-softmax
  block (one page, or 64 keys of smaller pages) of one KV head at a time, so no work
  buffer grows with the context. int8 and int4 pages are attended on their codes
  (``_paged_simd.h``: scores and weighted value sums convert codes to float in
  registers, the per-token or per-block scales folded in); float32 pages are read in
  place; the other formats decode one page's rows of one head into a per-thread
  workspace of :func:`workspace_floats` floats first. int8, int4 and float16 row
  decoders and the code kernels use AVX2/FMA/F16C where the CPU has them, the code
  kernels AVX-512F where it has that (``_paged_simd512.h``; selected at run time, the
  decoders bit-identical to the portable loops, the kernels equal up to float32
  summation order).
"""
from cython.parallel cimport prange, threadid
from libc.math cimport INFINITY, fabsf, rintf
from libc.stdint cimport uint16_t, uint32_t
from libc.string cimport memcpy, memset

include "_common.pxi"

include "_pool_client.pxi"

__all__ = ["FORMAT_NAMES", "MAXG", "attention", "decode_page", "encode_rows", "init_page",
           "page_bytes", "workspace_floats"]

cdef extern from "_paged_simd.h" nogil:
    void pg_i8_avx2(const uint8_t* c, float s, float* o, Py_ssize_t n)
    void pg_i4_avx2(const uint8_t* c, float s, float* o)
    void pg_f16_avx2(const uint8_t* c, float* o, Py_ssize_t n)
    void pg_qk_i8(const float* q, Py_ssize_t qhs, Py_ssize_t G, const uint8_t* rows, Py_ssize_t nv,
                  Py_ssize_t D, float scale, float* sc, Py_ssize_t ldsc)
    void pg_pv_i8(float* acc, Py_ssize_t ldacc, Py_ssize_t G, const float* p, Py_ssize_t ldp,
                  const uint8_t* rows, Py_ssize_t nv, Py_ssize_t D)
    void pg_qk_i4(const float* q, Py_ssize_t qhs, Py_ssize_t G, const uint8_t* rows, Py_ssize_t nv,
                  Py_ssize_t D, float scale, float* sc, Py_ssize_t ldsc)
    void pg_pv_i4(float* acc, Py_ssize_t ldacc, Py_ssize_t G, const float* p, Py_ssize_t ldp,
                  const uint8_t* rows, Py_ssize_t nv, Py_ssize_t D)
    void pg_softmax(Py_ssize_t G, Py_ssize_t nv, float* sc, Py_ssize_t ldsc, float* acc, Py_ssize_t D,
                    float* mx, float* den)
    int pg_init()
    int pg_fast()
    int pg_level()
    void pg_set_use512(int on)
    void __builtin_prefetch(const void* p, int rw, int locality)

pg_init()

def _vector_level() -> int:
    """The code kernels of int8 / int4 pages in use: 0 portable, 1 AVX2, 2 AVX-512."""
    return pg_level()


def _allow_avx512(bint on) -> None:
    """Let the code kernels use their AVX-512 versions where the CPU has them (``on``), or
    keep to AVX2 (tests compare the paths)."""
    pg_set_use512(on)


cdef enum:
    F32 = 0
    F16 = 1
    I8 = 2
    I4 = 3
    FP8 = 4
    I2 = 5
    CB = 6
    MAXG_ = 16     # query heads of one group handled in one pass

FORMAT_NAMES = ("float32", "float16", "int8", "int4", "fp8", "int2", "codebook")
MAXG = MAXG_

cdef float _E4M3[256]
cdef float _CBOOK[4]
_CBOOK[0] = -1.0
_CBOOK[1] = -0.25
_CBOOK[2] = 0.25
_CBOOK[3] = 1.0


cdef void _init_e4m3() noexcept:
    cdef int b, e, m
    cdef float v
    cdef uint32_t nan = 0x7FC00000
    for b in range(256):
        e = (b >> 3) & 15
        m = b & 7
        if e == 0:
            v = <float>m * 0.001953125          # m * 2^-9
        elif e == 15 and m == 7:
            memcpy(&v, &nan, 4)
        else:
            v = (1.0 + <float>m * 0.125) * _pow2(e - 7)
        _E4M3[b] = -v if b & 0x80 else v


cdef float _pow2(int e) noexcept:
    cdef float r = 1.0
    while e > 0:
        r = r * 2.0
        e -= 1
    while e < 0:
        r = r * 0.5
        e += 1
    return r


_init_e4m3()


# ---- scalar conversions ---------------------------------------------------------

cdef inline float _h2f(uint16_t h) noexcept nogil:
    cdef uint32_t sign = (<uint32_t>(h & 0x8000)) << 16
    cdef uint32_t e = (h >> 10) & 0x1F
    cdef uint32_t m = h & 0x3FF
    cdef uint32_t bits
    cdef float f
    if e == 0:
        f = <float>m * 5.9604644775390625e-08     # m * 2^-24, exact
        return -f if sign else f
    if e == 31:
        bits = sign | 0x7F800000 | (m << 13)
    else:
        bits = sign | ((e + 112) << 23) | (m << 13)
    memcpy(&f, &bits, 4)
    return f


cdef inline uint16_t _f2h(float f) noexcept nogil:
    """float32 -> float16, round to nearest even (numpy's astype(float16))."""
    cdef uint32_t x
    memcpy(&x, &f, 4)
    cdef uint16_t sign = <uint16_t>((x >> 16) & 0x8000)
    cdef uint32_t ax = x & 0x7FFFFFFF
    cdef uint32_t hm, r
    if ax > 0x7F800000:
        return sign | 0x7E00
    if ax >= 0x477FF000:                            # rounds to infinity
        return sign | 0x7C00
    if ax < 0x38800000:                             # below 2^-14: a subnormal half
        return sign | <uint16_t>rintf(fabsf(f) * 16777216.0)
    hm = (((ax >> 23) - 112) << 10) | ((ax & 0x7FFFFF) >> 13)
    r = ax & 0x1FFF
    if r > 0x1000 or (r == 0x1000 and (hm & 1)):
        hm += 1
    return sign | <uint16_t>hm


cdef inline uint8_t _f2e4m3(float v) noexcept nogil:
    """float32 -> FLOAT8E4M3FN, round to nearest even, saturating to +-448."""
    cdef uint32_t x
    memcpy(&x, &v, 4)
    cdef uint8_t sign = <uint8_t>((x >> 24) & 0x80)
    cdef uint32_t ax = x & 0x7FFFFFFF
    cdef float a
    cdef uint32_t q, rem
    if ax > 0x7F800000:
        return sign | 0x7F
    if ax >= 0x43E00000:                            # >= 448
        return sign | 0x7E
    if ax < 0x3C800000:                             # below 2^-6: subnormal codes 0..8
        memcpy(&a, &ax, 4)
        return sign | <uint8_t>rintf(a * 512.0)
    q = ((((ax >> 23) - 127) + 7) << 3) | ((ax >> 20) & 7)
    rem = ax & 0xFFFFF
    if rem > 0x80000 or (rem == 0x80000 and (q & 1)):
        q += 1
    if q > 0x7E:
        q = 0x7E
    return sign | <uint8_t>q


cdef inline float _ldf(const uint8_t* p) noexcept nogil:
    cdef float f
    memcpy(&f, p, 4)
    return f


cdef inline void _stf(uint8_t* p, float f) noexcept nogil:
    memcpy(p, &f, 4)


cdef inline float _ldh(const uint8_t* p) noexcept nogil:
    cdef uint16_t h = <uint16_t>p[0] | (<uint16_t>p[1] << 8)
    return _h2f(h)


cdef inline void _sth(uint8_t* p, float f) noexcept nogil:
    cdef uint16_t h = _f2h(f)
    p[0] = <uint8_t>(h & 0xFF)
    p[1] = <uint8_t>(h >> 8)


cdef inline float _clampf(float x, float lo, float hi) noexcept nogil:
    return lo if x < lo else (hi if x > hi else x)


# ---- layout ---------------------------------------------------------------------

cdef Py_ssize_t _page_bytes(int fmt, Py_ssize_t H, Py_ssize_t P, Py_ssize_t D) noexcept:
    cdef Py_ssize_t nb = D // 32
    if fmt == F32:
        return 2 * H * P * D * 4
    if fmt == F16:
        return 2 * H * P * D * 2
    if fmt == I8 or fmt == FP8:
        return 2 * H * P * (4 + D)
    if fmt == I4:
        return 2 * H * P * nb * 18
    if fmt == I2:
        return H * D * (4 + P // 4) + H * P * nb * 12
    if fmt == CB:
        return 2 * H * P * nb * 12
    return -1


def page_bytes(int fmt, Py_ssize_t H, Py_ssize_t P, Py_ssize_t D) -> int:
    """Payload bytes of one page of format code ``fmt`` (-1 for an unknown code)."""
    return _page_bytes(fmt, H, P, D)


def workspace_floats(Py_ssize_t P, Py_ssize_t D, Py_ssize_t Hq=0) -> int:
    """Floats of one thread's attention workspace: one block's K and V rows of one head
    (one page, or 64 keys of smaller pages), the scores of up to MAXG query heads and the
    accumulators of max(Hq, MAXG) query heads (independent of the context length)."""
    cdef Py_ssize_t kb = _block_keys(P)
    return 2 * kb * D + MAXG_ * kb + (Hq if Hq > MAXG_ else MAXG_) * (D + 2)


cdef str _check(str k, int fmt, Py_ssize_t nbytes, Py_ssize_t H, Py_ssize_t P, Py_ssize_t D):
    if fmt < 0 or fmt > CB:
        raise KernelError(f"{k}: unknown page format code {fmt}")
    if H <= 0 or P <= 0 or D <= 0 or D % 32 or P % 4:
        raise KernelError(f"{k}: page shape H={H}, P={P}, D={D} needs D % 32 == 0 and P % 4 == 0")
    if nbytes != _page_bytes(fmt, H, P, D):
        raise KernelError(f"{k}: payload of {nbytes} bytes, a {FORMAT_NAMES[fmt]} page [2, {H}, {P}, {D}] "
                          f"has {_page_bytes(fmt, H, P, D)}")
    return k


# ---- encoders -------------------------------------------------------------------

cdef void _enc_row(int fmt, uint8_t* pay, Py_ssize_t r, const float* x, Py_ssize_t D) noexcept nogil:
    """Encode row ``r`` = (kv, h, t) of a page in every format but int2."""
    cdef Py_ssize_t i, j, b, nb = D // 32, kbest
    cdef float amax, s, inv, m, dd, y, best, dist
    cdef uint8_t* rec
    cdef uint16_t* hp
    cdef int c, c0, c1
    if fmt == F32:
        memcpy(pay + r * D * 4, x, D * 4)
    elif fmt == F16:
        rec = pay + r * D * 2
        for i in range(D):
            _sth(rec + 2 * i, x[i])
    elif fmt == I8 or fmt == FP8:
        rec = pay + r * (4 + D)
        amax = 0.0
        for i in range(D):
            if fabsf(x[i]) > amax:
                amax = fabsf(x[i])
        s = amax / (127.0 if fmt == I8 else 448.0)
        _stf(rec, s)
        if s == 0.0:
            memset(rec + 4, 0, D)
        elif fmt == I8:
            for i in range(D):
                c = <int>_clampf(rintf(x[i] / s), -127.0, 127.0)
                rec[4 + i] = <uint8_t>(c & 0xFF)
        else:
            for i in range(D):
                rec[4 + i] = _f2e4m3(_clampf(x[i] / s, -448.0, 448.0))
    elif fmt == I4:
        for b in range(nb):
            rec = pay + (r * nb + b) * 18
            amax = 0.0
            m = 0.0
            for j in range(32):
                if fabsf(x[b * 32 + j]) > amax:
                    amax = fabsf(x[b * 32 + j])
                    m = x[b * 32 + j]
            dd = m / -8.0
            inv = 1.0 / dd if dd != 0.0 else 0.0
            _sth(rec, dd)
            for j in range(16):
                c0 = <int>_clampf(rintf(x[b * 32 + 2 * j] * inv) + 8.0, 0.0, 15.0)
                c1 = <int>_clampf(rintf(x[b * 32 + 2 * j + 1] * inv) + 8.0, 0.0, 15.0)
                rec[2 + j] = <uint8_t>(c0 | (c1 << 4))
    elif fmt == CB:
        for b in range(nb):
            rec = pay + (r * nb + b) * 12
            amax = 0.0
            for j in range(32):
                if fabsf(x[b * 32 + j]) > amax:
                    amax = fabsf(x[b * 32 + j])
            memset(rec, 0, 8)
            _stf(rec + 8, amax)
            if amax == 0.0:
                continue
            for j in range(32):
                y = x[b * 32 + j] / amax
                kbest = 0
                best = fabsf(y - _CBOOK[0])
                for i in range(1, 4):
                    dist = fabsf(y - _CBOOK[i])
                    if dist < best:
                        best = dist
                        kbest = i
                rec[j >> 2] |= <uint8_t>(kbest << ((j & 3) * 2))


cdef void _enc_group2(uint8_t* rec, const float* x, Py_ssize_t stride, Py_ssize_t n) noexcept nogil:
    """int2 group of ``n`` values (stride ``stride``): scale f16, min f16, UINT2[n] codes."""
    cdef Py_ssize_t j
    cdef float lo = x[0], hi = x[0], v, s, sf, mf
    cdef int c
    for j in range(1, n):
        v = x[j * stride]
        if v < lo:
            lo = v
        if v > hi:
            hi = v
    s = (hi - lo) / 3.0 if hi != lo else 0.0
    _sth(rec, s)
    _sth(rec + 2, lo)
    sf = _ldh(rec)
    mf = _ldh(rec + 2)
    memset(rec + 4, 0, n // 4)
    if sf == 0.0:
        return
    for j in range(n):
        c = <int>_clampf(rintf((x[j * stride] - mf) / sf), 0.0, 3.0)
        rec[4 + (j >> 2)] |= <uint8_t>(c << ((j & 3) * 2))


cdef inline Py_ssize_t _i2_kbytes(Py_ssize_t H, Py_ssize_t P, Py_ssize_t D) noexcept nogil:
    return H * D * (4 + P // 4)


def init_page(int fmt, uint8_t[::1] payload, Py_ssize_t H, Py_ssize_t P, Py_ssize_t D) -> None:
    """Write the encoding of an all-zero page (int4: scale -0.0 and codes 8; others: zero bytes)."""
    _check("init_page", fmt, payload.shape[0], H, P, D)
    cdef Py_ssize_t n = payload.shape[0], r
    with nogil:
        memset(&payload[0], 0, n)
        if fmt == I4:
            for r in range(n // 18):       # scale float16(0 / -8) = -0.0, codes 8
                payload[r * 18 + 1] = 0x80
                memset(&payload[r * 18 + 2], 0x88, 16)


def encode_rows(int fmt, uint8_t[::1] payload, const float[:, :, :] k, const float[:, :, :] v,
                Py_ssize_t j0, Py_ssize_t n, Py_ssize_t t0, Py_ssize_t H, Py_ssize_t P, Py_ssize_t D,
                float[::1] scratch) -> None:
    """Quantize tokens ``j0 .. j0+n`` of ``k`` and ``v`` (float32 [H, N, D]) into page rows
    ``t0 .. t0+n``. Rows below ``t0`` are the page's earlier tokens, rows from ``t0+n`` on
    are unwritten (zeros). ``k``, ``v`` may have any strides but a unit-stride last axis.
    ``scratch``: at least ``P * D`` floats (int2 keys)."""
    cdef str kn = _check("encode_rows", fmt, payload.shape[0], H, P, D)
    if k.strides[2] != 4 or v.strides[2] != 4:
        raise KernelError(f"{kn}: keys and values need a unit-stride last axis")
    if k.shape[0] != H or k.shape[2] != D or v.shape[0] != H or v.shape[2] != D \
            or v.shape[1] != k.shape[1]:
        raise KernelError(f"{kn}: keys {tuple(k.shape)[:3]} / values {tuple(v.shape)[:3]}, expected "
                          f"[{H}, n, {D}] each")
    if j0 < 0 or n < 0 or j0 + n > k.shape[1] or t0 < 0 or t0 + n > P:
        raise CacheRangeError(f"{kn}: tokens [{j0}, {j0 + n}) of {k.shape[1]} into page rows "
                              f"[{t0}, {t0 + n}) of {P}")
    if fmt == I2 and scratch.shape[0] < P * D:
        raise KernelError(f"{kn}: scratch needs {P * D} floats, got {scratch.shape[0]}")
    if n == 0:
        return
    cdef uint8_t* pay = &payload[0]
    cdef Py_ssize_t h, j, d, t, kb
    cdef const float* src
    cdef float* ws
    cdef uint8_t* rec
    cdef int code
    with nogil:
        if fmt != I2:
            for h in range(H):
                for j in range(n):
                    _enc_row(fmt, pay, h * P + t0 + j, &k[h, j0 + j, 0], D)
                    _enc_row(fmt, pay, (H + h) * P + t0 + j, &v[h, j0 + j, 0], D)
        else:
            ws = &scratch[0]
            kb = _i2_kbytes(H, P, D)
            for h in range(H):
                # keys of head h over the page: earlier rows decoded, new rows, zeros
                if t0 > 0:
                    _dec_i2k(pay, h, 0, t0, P, D, ws)
                for j in range(n):
                    memcpy(ws + (t0 + j) * D, &k[h, j0 + j, 0], D * 4)
                if t0 + n < P:
                    memset(ws + (t0 + n) * D, 0, (P - t0 - n) * D * 4)
                for d in range(D):
                    _enc_group2(pay + (h * D + d) * (4 + P // 4), ws + d, D, P)
                for j in range(n):
                    src = &v[h, j0 + j, 0]
                    for d in range(D // 32):
                        _enc_group2(pay + kb + ((h * P + t0 + j) * (D // 32) + d) * 12, src + d * 32, 1, 32)


# ---- decoders -------------------------------------------------------------------

cdef void _dec_i2k(const uint8_t* pay, Py_ssize_t h, Py_ssize_t t0, Py_ssize_t t1, Py_ssize_t P,
                   Py_ssize_t D, float* dst) noexcept nogil:
    """int2 keys of head ``h``, tokens [t0, t1) -> dst [(t1 - t0), D]."""
    cdef Py_ssize_t d, t
    cdef const uint8_t* rec
    cdef float sf, mf
    for d in range(D):
        rec = pay + (h * D + d) * (4 + P // 4)
        sf = _ldh(rec)
        mf = _ldh(rec + 2)
        for t in range(t0, t1):
            dst[(t - t0) * D + d] = mf + sf * <float>((rec[4 + (t >> 2)] >> ((t & 3) * 2)) & 3)


cdef void _dec_rows(int fmt, const uint8_t* pay, Py_ssize_t kv, Py_ssize_t h, Py_ssize_t t0,
                    Py_ssize_t t1, Py_ssize_t H, Py_ssize_t P, Py_ssize_t D, float* dst) noexcept nogil:
    """Rows (kv, h, t) for t in [t0, t1) of a page -> dst [(t1 - t0), D] float32."""
    cdef Py_ssize_t t, i, b, nb = D // 32, r
    cdef const uint8_t* rec
    cdef float* o
    cdef float s, mf
    cdef uint8_t c
    for t in range(t0, t1):
        r = (kv * H + h) * P + t
        o = dst + (t - t0) * D
        if fmt == F32:
            memcpy(o, pay + r * D * 4, D * 4)
        elif fmt == F16:
            rec = pay + r * D * 2
            if pg_fast():
                pg_f16_avx2(rec, o, D)
            else:
                for i in range(D):
                    o[i] = _ldh(rec + 2 * i)
        elif fmt == I8:
            rec = pay + r * (4 + D)
            s = _ldf(rec)
            if pg_fast():
                pg_i8_avx2(rec + 4, s, o, D)
            else:
                for i in range(D):
                    o[i] = s * <float>(<signed char>rec[4 + i])
        elif fmt == FP8:
            rec = pay + r * (4 + D)
            s = _ldf(rec)
            for i in range(D):
                o[i] = s * _E4M3[rec[4 + i]]
        elif fmt == I4:
            for b in range(nb):
                rec = pay + (r * nb + b) * 18
                s = _ldh(rec)
                if pg_fast():
                    pg_i4_avx2(rec + 2, s, o + b * 32)
                    continue
                for i in range(16):
                    c = rec[2 + i]
                    o[b * 32 + 2 * i] = s * <float>(<int>(c & 15) - 8)
                    o[b * 32 + 2 * i + 1] = s * <float>(<int>(c >> 4) - 8)
        elif fmt == CB:
            for b in range(nb):
                rec = pay + (r * nb + b) * 12
                s = _ldf(rec + 8)
                for i in range(32):
                    o[b * 32 + i] = s * _CBOOK[(rec[i >> 2] >> ((i & 3) * 2)) & 3]
        elif fmt == I2:
            if kv == 0:
                _dec_i2k(pay, h, t, t + 1, P, D, o)
            else:
                for b in range(nb):
                    rec = pay + _i2_kbytes(H, P, D) + ((h * P + t) * nb + b) * 12
                    s = _ldh(rec)
                    mf = _ldh(rec + 2)
                    for i in range(32):
                        c = (rec[4 + (i >> 2)] >> ((i & 3) * 2)) & 3
                        o[b * 32 + i] = mf + s * <float>c


cdef void _head_span(int fmt, Py_ssize_t kv, Py_ssize_t h, Py_ssize_t H, Py_ssize_t P, Py_ssize_t D,
                     Py_ssize_t* off, Py_ssize_t* n) noexcept nogil:
    """Byte range of one head's keys (kv 0) or values (kv 1) in a page."""
    cdef Py_ssize_t row, nb = D // 32
    if fmt == I2:
        if kv == 0:
            row = D * (4 + P // 4)
            off[0] = h * row
            n[0] = row
        else:
            row = P * nb * 12
            off[0] = _i2_kbytes(H, P, D) + h * row
            n[0] = row
        return
    if fmt == F32:
        row = D * 4
    elif fmt == F16:
        row = D * 2
    elif fmt == I8 or fmt == FP8:
        row = 4 + D
    elif fmt == I4:
        row = nb * 18
    else:
        row = nb * 12
    off[0] = (kv * H + h) * P * row
    n[0] = P * row


cdef void _dec_head(int fmt, const uint8_t* pay, Py_ssize_t kv, Py_ssize_t h, Py_ssize_t nv,
                    Py_ssize_t H, Py_ssize_t P, Py_ssize_t D, float* dst) noexcept nogil:
    if fmt == I2 and kv == 0:
        _dec_i2k(pay, h, 0, nv, P, D, dst)
    else:
        _dec_rows(fmt, pay, kv, h, 0, nv, H, P, D, dst)


def decode_page(int fmt, const uint8_t[::1] payload, float[:, :, :, ::1] out) -> None:
    """Decode a whole page into ``out`` float32 [2, H, P, D]."""
    cdef Py_ssize_t H = out.shape[1], P = out.shape[2], D = out.shape[3], kv, h
    if out.shape[0] != 2:
        raise KernelError(f"decode_page: out must be [2, H, P, D], got {tuple(out.shape)[:4]}")
    _check("decode_page", fmt, payload.shape[0], H, P, D)
    cdef const uint8_t* pay = &payload[0]
    with nogil:
        for kv in range(2):
            for h in range(H):
                _dec_head(fmt, pay, kv, h, P, H, P, D, &out[kv, h, 0, 0])


# ---- attention ------------------------------------------------------------------

cdef enum:
    SUBKEYS = 16   # keys per code-kernel call; the next block's rows are prefetched in between


cdef inline void _prefetch_part(const uint8_t* pf, Py_ssize_t n, Py_ssize_t j0, Py_ssize_t j1,
                                Py_ssize_t nv) noexcept nogil:
    """Prefetch the share [j0, j1) of nv of the ``n`` bytes at ``pf`` (nothing for NULL)."""
    cdef Py_ssize_t a = n * j0 // nv, b = n * j1 // nv
    if pf == NULL:
        return
    while a < b:
        __builtin_prefetch(pf + a, 0, 1)
        a = a + 64


cdef void _page_scores(int fmt, const uint8_t* pay, const float* q0, Py_ssize_t qhs, Py_ssize_t G,
                       Py_ssize_t h, Py_ssize_t nv, Py_ssize_t H, Py_ssize_t P, Py_ssize_t D, float scale,
                       float* kbuf, float* sc, Py_ssize_t ldsc, const uint8_t* pf,
                       Py_ssize_t pfn) noexcept nogil:
    """Scores ``sc[g * ldsc + j]`` of G query heads (stride qhs) against keys [0, nv) of KV
    head h of one page: int8 and int4 on their codes, float32 in place, others decoded
    into ``kbuf`` first. The ``pfn`` bytes at ``pf`` (keys the next block reads) are
    prefetched along the way."""
    cdef Py_ssize_t j, m, rs = 4 + D if fmt == I8 else (D // 32) * 18    # int8 / int4 row bytes
    cdef const uint8_t* rows = pay + h * P * rs
    if fmt == I8 or fmt == I4:
        j = 0
        while j < nv:
            m = nv - j if nv - j < SUBKEYS else SUBKEYS
            _prefetch_part(pf, pfn, j, j + m, nv)
            if fmt == I8:
                pg_qk_i8(q0, qhs, G, rows + j * rs, m, D, scale, sc + j, ldsc)
            else:
                pg_qk_i4(q0, qhs, G, rows + j * rs, m, D, scale, sc + j, ldsc)
            j = j + m
        return
    _prefetch_part(pf, pfn, 0, 1, 1)
    if fmt == F32:
        of_qk(q0, qhs, G, <const float*>pay + h * P * D, D, nv, D, scale, sc, ldsc)
    else:
        _dec_head(fmt, pay, 0, h, nv, H, P, D, kbuf)
        of_qk(q0, qhs, G, kbuf, D, nv, D, scale, sc, ldsc)


cdef void _page_values(int fmt, const uint8_t* pay, Py_ssize_t G, Py_ssize_t h, Py_ssize_t nv, Py_ssize_t H,
                       Py_ssize_t P, Py_ssize_t D, const float* sc, Py_ssize_t ldsc, float* vbuf,
                       float* acc, const uint8_t* pf, Py_ssize_t pfn) noexcept nogil:
    """``acc[g, :] += sum_j sc[g * ldsc + j] * v_j`` over the values [0, nv) of KV head h of
    one page (the same format split and prefetching as :func:`_page_scores`)."""
    cdef Py_ssize_t j, m, rs = 4 + D if fmt == I8 else (D // 32) * 18    # int8 / int4 row bytes
    cdef const uint8_t* rows = pay + (H + h) * P * rs
    if fmt == I8 or fmt == I4:
        j = 0
        while j < nv:
            m = nv - j if nv - j < SUBKEYS else SUBKEYS
            _prefetch_part(pf, pfn, j, j + m, nv)
            if fmt == I8:
                pg_pv_i8(acc, D, G, sc + j, ldsc, rows + j * rs, m, D)
            else:
                pg_pv_i4(acc, D, G, sc + j, ldsc, rows + j * rs, m, D)
            j = j + m
        return
    _prefetch_part(pf, pfn, 0, 1, 1)
    if fmt == F32:
        of_pv(acc, D, G, sc, ldsc, <const float*>pay + (H + h) * P * D, D, nv, D)
    else:
        _dec_head(fmt, pay, 1, h, nv, H, P, D, vbuf)
        of_pv(acc, D, G, sc, ldsc, vbuf, D, nv, D)


cdef inline const uint8_t* _next_span(const int64_t* addr, const int32_t* fmts, Py_ssize_t pn, Py_ssize_t npg,
                                      Py_ssize_t kv, Py_ssize_t h, Py_ssize_t H, Py_ssize_t P, Py_ssize_t D,
                                      Py_ssize_t* n) noexcept nogil:
    """Start and length ``n`` of head h's keys (kv 0) or values (kv 1) in page pn, or NULL
    past the last page."""
    cdef Py_ssize_t off
    n[0] = 0
    if pn >= npg:
        return NULL
    _head_span(fmts[pn], kv, h, H, P, D, &off, n)
    return <const uint8_t*><size_t>addr[pn] + off


cdef void _pages_block(const int64_t* addr, const int32_t* fmts, Py_ssize_t pb, Py_ssize_t pe, Py_ssize_t hi,
                       const float* q0, Py_ssize_t qhs, Py_ssize_t G, Py_ssize_t h, Py_ssize_t H, Py_ssize_t P,
                       Py_ssize_t D, float scale, float* kbuf, float* vbuf, float* sc, Py_ssize_t ldsc,
                       float* acc, float* mx, float* den) noexcept nogil:
    """One online-softmax block: G query heads over the keys of KV head h in pages
    [pb, pe) (at most ``ldsc`` keys, the last page cut at ``hi``), any mix of formats,
    while head h's rows of the next block's pages are prefetched."""
    cdef Py_ssize_t pg, nv, rows = 0, pfn, npg = (hi + P - 1) // P
    cdef const uint8_t* pf
    for pg in range(pb, pe):
        nv = hi - pg * P if hi - pg * P < P else P
        pf = _next_span(addr, fmts, pg + pe - pb, npg, 0, h, H, P, D, &pfn)
        _page_scores(fmts[pg], <const uint8_t*><size_t>addr[pg], q0, qhs, G, h, nv, H, P, D, scale, kbuf,
                     sc + rows, ldsc, pf, pfn)
        rows = rows + nv
    pg_softmax(G, rows, sc, ldsc, acc, D, mx, den)
    rows = 0
    for pg in range(pb, pe):
        nv = hi - pg * P if hi - pg * P < P else P
        pf = _next_span(addr, fmts, pg + pe - pb, npg, 1, h, H, P, D, &pfn)
        _page_values(fmts[pg], <const uint8_t*><size_t>addr[pg], G, h, nv, H, P, D, sc + rows, ldsc, vbuf,
                     acc, pf, pfn)
        rows = rows + nv


cdef void _finish(Py_ssize_t G, Py_ssize_t D, Py_ssize_t hi, const float* acc, const float* den,
                  float* o0, Py_ssize_t ohs) noexcept nogil:
    cdef Py_ssize_t g, d
    cdef float inv
    for g in range(G):
        inv = 1.0 / den[g] if hi > 0 else 0.0
        for d in range(D):
            o0[g * ohs + d] = acc[g * D + d] * inv


cdef inline Py_ssize_t _block_keys(Py_ssize_t P) noexcept nogil:
    """Keys per online-softmax block: whole pages, at least 64 keys when pages are smaller
    (small pages are gathered so a block's fixed cost is shared)."""
    return P * (64 // P) if P < 64 else P


cdef void _attend(const float* q0, Py_ssize_t qhs, Py_ssize_t G, const int64_t* addr,
                  const int32_t* fmts, Py_ssize_t h, Py_ssize_t hi, Py_ssize_t H, Py_ssize_t P,
                  Py_ssize_t D, float scale, float* ws, float* o0, Py_ssize_t ohs) noexcept nogil:
    """G query heads (stride qhs) over keys [0, hi) of KV head h, block after block."""
    cdef Py_ssize_t KB = _block_keys(P), ppb = KB // P
    cdef float* kbuf = ws
    cdef float* vbuf = ws + KB * D
    cdef float* sc = ws + 2 * KB * D
    cdef float* acc = sc + MAXG_ * KB
    cdef float* mx = acc + MAXG_ * D
    cdef float* den = mx + MAXG_
    cdef Py_ssize_t g, pb, pe, npg = (hi + P - 1) // P
    for g in range(G):
        mx[g] = -INFINITY
        den[g] = 0.0
    memset(acc, 0, G * D * 4)
    pb = 0
    while pb < npg:
        pe = pb + ppb if pb + ppb < npg else npg
        _pages_block(addr, fmts, pb, pe, hi, q0, qhs, G, h, H, P, D, scale, kbuf, vbuf, sc, KB, acc, mx, den)
        pb = pe
    _finish(G, D, hi, acc, den, o0, ohs)


ctypedef struct _PagesJob:
    const float* q
    Py_ssize_t G
    const int64_t* addr
    const int32_t* fmts
    Py_ssize_t H
    Py_ssize_t nparts
    Py_ssize_t total
    Py_ssize_t P
    Py_ssize_t D
    float scale
    float* ws
    Py_ssize_t wstride
    float* out


cdef void _pages_task(void* ctx, long part) noexcept nogil:
    """KV heads ``[part * H / nparts, (part + 1) * H / nparts)`` of a one-token call, with
    workspace row ``part``."""
    cdef _PagesJob* j = <_PagesJob*>ctx
    _attend_pages(j.q, j.G, j.addr, j.fmts, part * j.H // j.nparts, (part + 1) * j.H // j.nparts,
                  j.total, j.H, j.P, j.D, j.scale, j.ws + part * j.wstride, j.out)


cdef void _attend_pages(const float* q, Py_ssize_t G, const int64_t* addr, const int32_t* fmts,
                        Py_ssize_t h0, Py_ssize_t h1, Py_ssize_t hi, Py_ssize_t H, Py_ssize_t P,
                        Py_ssize_t D, float scale, float* ws, float* out) noexcept nogil:
    """One query token, KV heads [h0, h1): blocks of pages outer, heads inner, so the
    pages are read front to back once."""
    cdef Py_ssize_t KB = _block_keys(P), ppb = KB // P
    cdef float* kbuf = ws
    cdef float* vbuf = ws + KB * D
    cdef float* sc = ws + 2 * KB * D
    cdef Py_ssize_t R = (h1 - h0) * G
    cdef float* acc = sc + MAXG_ * KB
    cdef float* mx = acc + R * D
    cdef float* den = mx + R
    cdef Py_ssize_t r, pb, pg, pe, h, npg = (hi + P - 1) // P
    for r in range(R):
        mx[r] = -INFINITY
        den[r] = 0.0
    memset(acc, 0, R * D * 4)
    pb = 0
    while pb < npg:
        pe = pb + ppb if pb + ppb < npg else npg
        for h in range(h0, h1):
            r = (h - h0) * G
            _pages_block(addr, fmts, pb, pe, hi, q + h * G * D, D, G, h, H, P, D, scale, kbuf, vbuf, sc, KB,
                         acc + r * D, mx + r, den + r)
        pb = pe
    for h in range(h0, h1):
        r = (h - h0) * G
        _finish(G, D, hi, acc + r * D, den + r, out + h * G * D, D)


def attention(const float[:, :, ::1] q, const int64_t[::1] addr, const int32_t[::1] fmts,
              Py_ssize_t total, Py_ssize_t H, Py_ssize_t P, Py_ssize_t D, float scale,
              float[:, :, ::1] out, float[:, ::1] ws, int num_threads=1) -> None:
    """Causal grouped-query attention of ``q`` float32 [Hq, S, D] over keys [0, total).

    Query ``i`` sits at position ``total - S + i``. ``addr``/``fmts``: payload address
    and format code of every page covering [0, total) (the caller keeps the payloads
    alive and checked); ``out``: float32 [Hq, S, D]; ``ws``: float32 [threads,
    workspace_floats(P, D, Hq)] with at least ``num_threads`` rows. One query token with
    groups of at most MAXG heads runs pages-outer over a share of the KV heads per thread;
    otherwise every (KV head, query, group chunk) item runs over its pages.
    """
    cdef str k = "paged_attention"
    cdef Py_ssize_t Hq = q.shape[0], S = q.shape[1]
    if q.shape[2] != D or out.shape[0] != Hq or out.shape[1] != S or out.shape[2] != D:
        raise KernelError(f"{k}: query {tuple(q.shape)[:3]} / out {tuple(out.shape)[:3]}, expected "
                          f"[Hq, S, {D}] each")
    if H <= 0 or Hq % H:
        raise KernelError(f"{k}: {Hq} query heads are not a multiple of {H} kv heads")
    if P <= 0 or D <= 0 or D % 32 or P % 4:
        raise KernelError(f"{k}: page shape P={P}, D={D} needs D % 32 == 0 and P % 4 == 0")
    if total < S or total < 0:
        raise CacheRangeError(f"{k}: {S} query tokens but {total} valid keys")
    cdef Py_ssize_t npg = (total + P - 1) // P, i
    if addr.shape[0] < npg or fmts.shape[0] < npg:
        raise KernelError(f"{k}: {total} keys need {npg} pages, got {addr.shape[0]}")
    for i in range(npg):
        if addr[i] == 0 or fmts[i] < 0 or fmts[i] > CB:
            raise KernelError(f"{k}: page {i} is missing or has an unknown format")
    if num_threads < 1:
        num_threads = 1
    if ws.shape[0] < num_threads or ws.shape[1] < workspace_floats(P, D, Hq):
        raise KernelError(f"{k}: workspace {tuple(ws.shape)[:2]} is smaller than "
                          f"[{num_threads}, {workspace_floats(P, D, Hq)}]")
    if Hq == 0 or S == 0:
        return
    cdef Py_ssize_t grp = Hq // H, nchunk = (grp + MAXG_ - 1) // MAXG_
    cdef Py_ssize_t items = H * S * nchunk, item, h, s, ch, h0, nh
    cdef const float* qp = &q[0, 0, 0]
    cdef float* op = &out[0, 0, 0]
    cdef const int64_t* ap = &addr[0]
    cdef const int32_t* fp = &fmts[0]
    cdef float* wp = &ws[0, 0]
    cdef Py_ssize_t wstride = ws.shape[1]
    cdef Py_ssize_t nparts
    cdef _PagesJob pj
    if S == 1 and grp <= MAXG_:
        nparts = num_threads if num_threads < H else H
        pj.q = qp
        pj.G = grp
        pj.addr = ap
        pj.fmts = fp
        pj.H = H
        pj.nparts = nparts
        pj.total = total
        pj.P = P
        pj.D = D
        pj.scale = scale
        pj.ws = wp
        pj.wstride = wstride
        pj.out = op
        with nogil:
            of_pool_parallel_for(nparts, _pages_task, &pj, <int>nparts)
        return
    if num_threads > items:
        num_threads = <int>items
    with nogil:
        for item in prange(items, num_threads=num_threads, schedule="dynamic", chunksize=1):
            h = item // (S * nchunk)
            s = (item // nchunk) % S
            ch = item % nchunk
            h0 = h * grp + ch * MAXG_
            nh = grp - ch * MAXG_
            if nh > MAXG_:
                nh = MAXG_
            _attend(qp + (h0 * S + s) * D, S * D, nh, ap, fp, h, total - S + s + 1, H, P, D, scale,
                    wp + threadid() * wstride, op + (h0 * S + s) * D, S * D)
