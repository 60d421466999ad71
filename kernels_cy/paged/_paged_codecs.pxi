# Page codecs of _paged.pyx, textually included: the float16 / float8 / int2 / codebook
# tables and scalar conversions, the row encoders (every format) and decoders. Encoders
# round half to even and clamp; decoders are exact given the bytes (float32 arithmetic);
# the int8, int4 and float16 rows decode through _paged_simd.h's dispatched decoders.
from libc.math cimport fabsf, rintf
from libc.stdint cimport uint16_t, uint32_t
from libc.string cimport memcpy, memset

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
            pg_dec_f16(pay + r * D * 2, o, D)
        elif fmt == I8:
            rec = pay + r * (4 + D)
            pg_dec_i8(rec + 4, _ldf(rec), o, D)
        elif fmt == FP8:
            rec = pay + r * (4 + D)
            s = _ldf(rec)
            for i in range(D):
                o[i] = s * _E4M3[rec[4 + i]]
        elif fmt == I4:
            for b in range(nb):
                rec = pay + (r * nb + b) * 18
                pg_dec_i4(rec + 2, _ldh(rec), o + b * 32)
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
