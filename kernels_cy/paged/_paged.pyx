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
  place; the other formats decode one page's rows of one head into a per-task
  workspace of :func:`workspace_floats` floats first. The int8, int4 and float16 row
  decoders and the code kernels have one vector body compiled for AVX2/FMA/F16C and for
  AVX-512F (``_paged_body.h``), selected at run time by ``_simd.h``'s CPU level (the
  decoders bit-identical to the portable loops, the kernels equal up to float32
  summation order). The work runs on the shared worker pool (``_pool.h``).
"""
from libc.math cimport INFINITY
from libc.string cimport memcpy, memset

import numpy as np

include "_common.pxi"

include "_pool_client.pxi"

__all__ = ["FORMAT_NAMES", "MAXG", "attention", "attention_many", "decode_page", "encode_rows", "init_page",
           "page_bytes", "workspace_floats"]

cdef extern from "_paged_simd.h" nogil:
    void pg_dec_i8(const uint8_t* c, float s, float* o, Py_ssize_t n)
    void pg_dec_i4(const uint8_t* c, float s, float* o)
    void pg_dec_f16(const uint8_t* c, float* o, Py_ssize_t n)
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
    int of_simd_level
    void of_simd_allow_avx512(int on)
    void __builtin_prefetch(const void* p, int rw, int locality)


def _vector_level() -> int:
    """The code kernels of int8 / int4 pages in use: 0 portable, 1 AVX2, 2 AVX-512."""
    return of_simd_level


def _allow_avx512(bint on) -> None:
    """Let the code kernels use their AVX-512 versions where the CPU has them (``on``), or
    keep to AVX2 (tests compare the paths)."""
    of_simd_allow_avx512(on)


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

include "_paged_codecs.pxi"


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
    (one page, or 64 keys of smaller pages), the scores of up to MAXG query rows, the
    accumulators of max(Hq, MAXG) query heads and MAXG gathered query rows (a block of
    queries; independent of the context length)."""
    cdef Py_ssize_t kb = _block_keys(P)
    return 2 * kb * D + MAXG_ * kb + (Hq if Hq > MAXG_ else MAXG_) * (D + 2) + MAXG_ * D


cdef str _check(str k, int fmt, Py_ssize_t nbytes, Py_ssize_t H, Py_ssize_t P, Py_ssize_t D):
    if fmt < 0 or fmt > CB:
        raise KernelError(f"{k}: unknown page format code {fmt}")
    if H <= 0 or P <= 0 or D <= 0 or D % 32 or P % 4:
        raise KernelError(f"{k}: page shape H={H}, P={P}, D={D} needs D % 32 == 0 and P % 4 == 0")
    if nbytes != _page_bytes(fmt, H, P, D):
        raise KernelError(f"{k}: payload of {nbytes} bytes, a {FORMAT_NAMES[fmt]} page [2, {H}, {P}, {D}] "
                          f"has {_page_bytes(fmt, H, P, D)}")
    return k


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


cdef inline void _start(Py_ssize_t R, Py_ssize_t D, float* acc, float* mx, float* den) noexcept nogil:
    """Empty online-softmax state for R query rows."""
    cdef Py_ssize_t r
    for r in range(R):
        mx[r] = -INFINITY
        den[r] = 0.0
    memset(acc, 0, R * D * 4)


cdef void _pages_range(const int64_t* addr, const int32_t* fmts, Py_ssize_t p0, Py_ssize_t p1, Py_ssize_t hi,
                       const float* q0, Py_ssize_t qhs, Py_ssize_t G, Py_ssize_t h, Py_ssize_t H, Py_ssize_t P,
                       Py_ssize_t D, float scale, float* ws, float* acc, float* mx, float* den) noexcept nogil:
    """G query rows over the keys of KV head h in pages [p0, p1) (cut at ``hi``), block after block."""
    cdef Py_ssize_t KB = _block_keys(P), ppb = KB // P, pb = p0, pe
    while pb < p1:
        pe = pb + ppb if pb + ppb < p1 else p1
        _pages_block(addr, fmts, pb, pe, hi, q0, qhs, G, h, H, P, D, scale, ws, ws + KB * D, ws + 2 * KB * D,
                     KB, acc, mx, den)
        pb = pe


cdef void _attend(const float* q0, Py_ssize_t qhs, Py_ssize_t G, const int64_t* addr,
                  const int32_t* fmts, Py_ssize_t h, Py_ssize_t hi, Py_ssize_t H, Py_ssize_t P,
                  Py_ssize_t D, float scale, float* ws, float* o0, Py_ssize_t ohs) noexcept nogil:
    """G query heads (stride qhs) over keys [0, hi) of KV head h, block after block."""
    cdef Py_ssize_t KB = _block_keys(P)
    cdef float* acc = ws + 2 * KB * D + MAXG_ * KB
    cdef float* mx = acc + MAXG_ * D
    cdef float* den = mx + MAXG_
    _start(G, D, acc, mx, den)
    _pages_range(addr, fmts, 0, (hi + P - 1) // P, hi, q0, qhs, G, h, H, P, D, scale, ws, acc, mx, den)
    _finish(G, D, hi, acc, den, o0, ohs)


cdef void _attend_queries(const float* q, Py_ssize_t S, Py_ssize_t s0, Py_ssize_t nq, Py_ssize_t h0,
                          Py_ssize_t nh, const int64_t* addr, const int32_t* fmts, Py_ssize_t h,
                          Py_ssize_t total, Py_ssize_t H, Py_ssize_t P, Py_ssize_t D, float scale, float* ws,
                          Py_ssize_t wsfloats, float* out) noexcept nogil:
    """Queries [s0, s0 + nq) of query heads [h0, h0 + nh) (all of KV head h; nq * nh <= MAXG)
    over their causal keys: the query rows gathered into one block, the pages every one of
    them sees whole read once for the block, the last keys per query. The same online
    softmax as :func:`_attend`, with one page decoded for nq queries instead of one."""
    cdef Py_ssize_t KB = _block_keys(P)
    cdef float* acc = ws + 2 * KB * D + MAXG_ * KB
    cdef float* mx = acc + MAXG_ * D
    cdef float* den = mx + MAXG_
    cdef float* qbuf = ws + wsfloats - MAXG_ * D  # the workspace's last MAXG rows
    cdef Py_ssize_t i, g, hi
    cdef Py_ssize_t hi0 = total - S + s0 + 1  # the first query's keys: the fewest of the block
    cdef Py_ssize_t common = hi0 // P  # pages every query of the block sees whole
    for i in range(nq):
        for g in range(nh):
            memcpy(qbuf + (i * nh + g) * D, q + ((h0 + g) * S + s0 + i) * D, D * 4)
    _start(nq * nh, D, acc, mx, den)
    _pages_range(addr, fmts, 0, common, common * P, qbuf, D, nq * nh, h, H, P, D, scale, ws, acc, mx, den)
    for i in range(nq):
        hi = hi0 + i
        _pages_range(addr, fmts, common, (hi + P - 1) // P, hi, qbuf + i * nh * D, D, nh, h, H, P, D, scale, ws,
                     acc + i * nh * D, mx + i * nh, den + i * nh)
        _finish(nh, D, hi, acc + i * nh * D, den + i * nh, out + (h0 * S + s0 + i) * D, S * D)


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
    Py_ssize_t wsfloats
    float* out
    Py_ssize_t S           # query tokens (the items tasks)
    Py_ssize_t nchunk      # chunks of at most MAXG heads per group
    Py_ssize_t items       # H * S * nchunk (or H * query blocks * nchunk)
    Py_ssize_t qb          # queries per block (1: one query per item)


cdef void _blocks_task(void* ctx, long part) noexcept nogil:
    """Items ``part, part + nparts, ...``: (KV head, block of ``qb`` queries, chunk of heads)."""
    cdef _PagesJob* j = <_PagesJob*>ctx
    cdef Py_ssize_t nqb = (j.S + j.qb - 1) // j.qb
    cdef Py_ssize_t item = part, h, b, ch, h0, nh, s0, nq
    while item < j.items:
        h = item // (nqb * j.nchunk)
        b = (item // j.nchunk) % nqb
        ch = item % j.nchunk
        h0 = h * j.G + ch * MAXG_
        nh = j.G - ch * MAXG_ if j.G - ch * MAXG_ < MAXG_ else MAXG_
        s0 = b * j.qb
        nq = j.S - s0 if j.S - s0 < j.qb else j.qb
        _attend_queries(j.q, j.S, s0, nq, h0, nh, j.addr, j.fmts, h, j.total, j.H, j.P, j.D, j.scale,
                        j.ws + part * j.wstride, j.wsfloats, j.out)
        item = item + j.nparts


cdef void _items_task(void* ctx, long part) noexcept nogil:
    """Items ``part, part + nparts, ...`` of a call, each one (KV head, query, chunk of at
    most MAXG heads of its group) over its pages, with workspace row ``part``; the stride
    spreads the queries' causal lengths evenly over the tasks."""
    cdef _PagesJob* j = <_PagesJob*>ctx
    cdef Py_ssize_t item = part, h, s, ch, h0, nh, SD = j.S * j.D
    while item < j.items:
        h = item // (j.S * j.nchunk)
        s = (item // j.nchunk) % j.S
        ch = item % j.nchunk
        h0 = h * j.G + ch * MAXG_
        nh = j.G - ch * MAXG_ if j.G - ch * MAXG_ < MAXG_ else MAXG_
        _attend(j.q + (h0 * j.S + s) * j.D, SD, nh, j.addr, j.fmts, h, j.total - j.S + s + 1, j.H, j.P, j.D,
                j.scale, j.ws + part * j.wstride, j.out + (h0 * j.S + s) * j.D, SD)
        item = item + j.nparts


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
    cdef Py_ssize_t r, pb, pe, h, npg = (hi + P - 1) // P
    _start(R, D, acc, mx, den)
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
    cdef _PagesJob pj
    pj.q = &q[0, 0, 0]
    pj.G = grp
    pj.addr = &addr[0]
    pj.fmts = &fmts[0]
    pj.H = H
    pj.total = total
    pj.P = P
    pj.D = D
    pj.scale = scale
    pj.ws = &ws[0, 0]
    pj.wstride = ws.shape[1]
    pj.out = &out[0, 0, 0]
    pj.S = S
    pj.nchunk = nchunk
    pj.items = H * S * nchunk
    pj.wsfloats = workspace_floats(P, D, Hq)
    pj.qb = MAXG_ // (grp if grp < MAXG_ else MAXG_)
    if S > 1 and pj.qb > 1:  # a prefill: blocks of queries share each page's decoding
        pj.items = H * ((S + pj.qb - 1) // pj.qb) * nchunk
        pj.nparts = num_threads if num_threads < pj.items else pj.items
        with nogil:
            of_pool_parallel_for(pj.nparts, _blocks_task, &pj, <int>pj.nparts)
        return
    if S == 1 and grp <= MAXG_:
        pj.nparts = num_threads if num_threads < H else H
        with nogil:
            of_pool_parallel_for(pj.nparts, _pages_task, &pj, <int>pj.nparts)
        return
    pj.nparts = num_threads if num_threads < pj.items else pj.items
    with nogil:
        of_pool_parallel_for(pj.nparts, _items_task, &pj, <int>pj.nparts)


# -- one query token for each of many sequences (a batched decode step) -------------------

ctypedef struct _ManyJob:
    const float* q         # [Hq, T, D]
    Py_ssize_t T
    const int64_t* rows    # the query row of each sequence
    const int64_t* addrs   # the address of each sequence's page-address array
    const int64_t* fmtps   # the address of each sequence's format array
    const int64_t* totals  # keys of each sequence
    Py_ssize_t G
    Py_ssize_t H
    Py_ssize_t P
    Py_ssize_t D
    float scale
    float* ws
    Py_ssize_t wstride
    float* out
    Py_ssize_t nchunk
    Py_ssize_t items       # sequences * H * nchunk
    Py_ssize_t nparts


cdef void _many_task(void* ctx, long part) noexcept nogil:
    """Items ``part, part + nparts, ...``: (sequence, KV head, chunk of heads), each one query
    token over that sequence's pages."""
    cdef _ManyJob* j = <_ManyJob*>ctx
    cdef Py_ssize_t item = part, i, rest, h, ch, h0, nh, row, TD = j.T * j.D
    while item < j.items:
        i = item // (j.H * j.nchunk)
        rest = item % (j.H * j.nchunk)
        h = rest // j.nchunk
        ch = rest % j.nchunk
        h0 = h * j.G + ch * MAXG_
        nh = j.G - ch * MAXG_ if j.G - ch * MAXG_ < MAXG_ else MAXG_
        row = j.rows[i]
        _attend(j.q + h0 * TD + row * j.D, TD, nh, <const int64_t*><size_t>j.addrs[i],
                <const int32_t*><size_t>j.fmtps[i], h, j.totals[i], j.H, j.P, j.D, j.scale,
                j.ws + part * j.wstride, j.out + h0 * TD + row * j.D, TD)
        item = item + j.nparts


def attention_many(const float[:, :, ::1] q, const int64_t[::1] rows, list addr_arrays, list fmt_arrays,
                   const int64_t[::1] totals, Py_ssize_t H, Py_ssize_t P, Py_ssize_t D, float scale,
                   float[:, :, ::1] out, float[:, ::1] ws, int num_threads=1) -> None:
    """One query token per sequence: row ``rows[i]`` of ``q`` float32 [Hq, T, D] attends over keys
    [0, totals[i]) of sequence i's pages (``addr_arrays[i]`` int64 / ``fmt_arrays[i]`` int32, as
    :func:`attention` takes them), writing that row of ``out``; all sequences in one parallel
    loop over (sequence, KV head) items. Rows not named are left as they are."""
    cdef str k = "paged_attention_many"
    cdef Py_ssize_t Hq = q.shape[0], T = q.shape[1], n = rows.shape[0], i, pg, npg
    if q.shape[2] != D or out.shape[0] != Hq or out.shape[1] != T or out.shape[2] != D:
        raise KernelError(f"{k}: query {tuple(q.shape)[:3]} / out {tuple(out.shape)[:3]}, expected "
                          f"[Hq, T, {D}] each")
    if H <= 0 or Hq % H:
        raise KernelError(f"{k}: {Hq} query heads are not a multiple of {H} kv heads")
    if P <= 0 or D <= 0 or D % 32 or P % 4:
        raise KernelError(f"{k}: page shape P={P}, D={D} needs D % 32 == 0 and P % 4 == 0")
    if len(addr_arrays) != n or len(fmt_arrays) != n or totals.shape[0] != n:
        raise KernelError(f"{k}: {n} rows need {n} page tables and totals")
    if num_threads < 1:
        num_threads = 1
    if ws.shape[0] < num_threads or ws.shape[1] < workspace_floats(P, D, Hq):
        raise KernelError(f"{k}: workspace {tuple(ws.shape)[:2]} is smaller than "
                          f"[{num_threads}, {workspace_floats(P, D, Hq)}]")
    cdef int64_t[::1] addrs = np.empty(n, dtype=np.int64)
    cdef int64_t[::1] fmtps = np.empty(n, dtype=np.int64)
    cdef const int64_t[::1] a
    cdef const int32_t[::1] f
    for i in range(n):
        a = addr_arrays[i]
        f = fmt_arrays[i]
        if rows[i] < 0 or rows[i] >= T:
            raise KernelError(f"{k}: row {rows[i]} of sequence {i} is outside [0, {T})")
        if totals[i] < 1:
            raise CacheRangeError(f"{k}: sequence {i}: one query token but {totals[i]} valid keys")
        npg = (totals[i] + P - 1) // P
        if a.shape[0] < npg or f.shape[0] < npg:
            raise KernelError(f"{k}: sequence {i}: {totals[i]} keys need {npg} pages, got {a.shape[0]}")
        for pg in range(npg):
            if a[pg] == 0 or f[pg] < 0 or f[pg] > CB:
                raise KernelError(f"{k}: sequence {i}: page {pg} is missing or has an unknown format")
        addrs[i] = <int64_t><size_t>&a[0]
        fmtps[i] = <int64_t><size_t>&f[0]
    if n == 0 or Hq == 0:
        return
    cdef _ManyJob mj
    mj.q = &q[0, 0, 0]
    mj.T = T
    mj.rows = &rows[0]
    mj.addrs = &addrs[0]
    mj.fmtps = &fmtps[0]
    mj.totals = &totals[0]
    mj.G = Hq // H
    mj.H = H
    mj.P = P
    mj.D = D
    mj.scale = scale
    mj.ws = &ws[0, 0]
    mj.wstride = ws.shape[1]
    mj.out = &out[0, 0, 0]
    mj.nchunk = (mj.G + MAXG_ - 1) // MAXG_
    mj.items = n * H * mj.nchunk
    mj.nparts = num_threads if num_threads < mj.items else mj.items
    with nogil:
        of_pool_parallel_for(mj.nparts, _many_task, &mj, <int>mj.nparts)
