# cython: boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""Causal attention with grouped KV heads that reads a cache only up to its valid length.

Semantics of com.microsoft GroupQueryAttention (CPU) after the new keys and values
are in the cache: for batch row ``b`` the cache holds ``total = total_len[b] +
length_offset`` valid positions (GQA: ``seqlens_k`` with ``length_offset=1``);
query ``i`` of the ``S`` new tokens sits at position ``p = start[b] + i`` with
``start[b] = total - S`` unless ``query_start`` is given (a first prompt uses 0),
and attends to keys ``[lo, min(p + 1, total))`` with ``lo = max(0, p + 1 -
local_window)`` when ``local_window > 0`` (a window of ``local_window`` keys ending
at the query, onnxruntime's ``local_window_size``) else 0. Scores are ``scale * q.k``
(``scale`` 0 means ``1/sqrt(head_dim)``), optionally ``softcap * tanh(score /
softcap)``, then a softmax over the attended keys. A query with no key gets zeros.

The caches may be capacity-sized (the in-place stateful path: only the first
``total`` positions are read) or exactly ``total`` long (past/present path), in
[batch, kv_heads, length, head_dim] layout with any strides except a unit-stride
last axis. Query heads ``h`` read KV head ``h // (heads // kv_heads)``; the heads
of one group are processed together so each cache row is read once per query.
Work: B * kv_heads * S items in parallel on the shared worker pool (``_pool.h``); per item a fixed stack workspace of
``(16 * 64 + 16 * 256 + 32) * 4`` bytes (no heap).
"""
from libc.math cimport INFINITY, expf, tanhf, sqrtf
from libc.stdlib cimport free, malloc
from libc.string cimport memchr, memcpy, memset

include "_common.pxi"

include "_pool_client.pxi"

cdef extern from *:
    void __builtin_prefetch(const void* p, int rw, int locality) noexcept nogil

__all__ = ["MAX_HEAD_DIM", "AttentionOneQuery", "GqaOneToken", "gqa_attention", "gqa_decode"]

cdef enum:
    MAXG = 16      # query heads of one group handled in one pass
    BLK = 64       # keys per block of the online softmax
    MAXD = 256     # largest supported head_dim
    SPLIT_KEYS = 512   # keys per task of a one-token attention split along the keys
    PREFETCH_BYTES = 1024 * 1024   # K and V bytes of a call from which the next block is prefetched

MAX_HEAD_DIM = MAXD


cdef void _attend_group(const float* q0, Py_ssize_t qhs, Py_ssize_t G,
                        const float* kb, Py_ssize_t ks, const float* vb, Py_ssize_t vs,
                        Py_ssize_t lo, Py_ssize_t hi, Py_ssize_t D, float scale, float softcap,
                        float* o0, Py_ssize_t ohs, float* part, bint stream) noexcept nogil:
    """G query heads over keys [lo, hi): the normalized output rows ``o0`` (``ohs`` floats
    apart), or with ``part`` the softmax state of this key range, ``D + 2`` floats per head
    (running max, denominator, unnormalized output) for :func:`_merge_parts`. ``stream``:
    the call reads enough K and V rows to come from memory, so the next block is
    prefetched (for rows the caches hold, the prefetches only cost)."""
    cdef float sc[MAXG][BLK]
    cdef float acc[MAXG][MAXD]
    cdef float mx[MAXG]
    cdef float den[MAXG]
    cdef Py_ssize_t g, j0, jj, nb, d
    cdef float bm, c, inv
    for g in range(G):
        mx[g] = -INFINITY
        den[g] = 0.0
        for d in range(D):
            acc[g][d] = 0.0
    cdef Py_ssize_t pf, pn, line
    j0 = lo
    while j0 < hi:
        nb = hi - j0
        if nb > BLK:
            nb = BLK
        # the next block's key and value rows, one cache line at a time (two streams that
        # the hardware prefetcher follows poorly once the cache is larger than L2)
        pn = hi - j0 - nb if stream else 0
        if pn > BLK:
            pn = BLK
        for pf in range(pn):
            line = 0
            while line < D:
                __builtin_prefetch(kb + (j0 + nb + pf) * ks + line, 0, 3)
                __builtin_prefetch(vb + (j0 + nb + pf) * vs + line, 0, 3)
                line = line + 16
        of_qk(q0, qhs, G, kb + j0 * ks, ks, nb, D, scale, &sc[0][0], BLK)
        for g in range(G):
            if softcap > 0.0:
                for jj in range(nb):
                    sc[g][jj] = softcap * tanhf(sc[g][jj] / softcap)
            bm = of_maxf(&sc[g][0], nb)
            if bm > mx[g]:
                if mx[g] != -INFINITY:
                    c = expf(mx[g] - bm)
                    of_scal(&acc[g][0], c, D)
                    den[g] = den[g] * c
                mx[g] = bm
            den[g] = den[g] + of_expsum(&sc[g][0], mx[g], nb)
        of_pv(&acc[0][0], MAXD, G, &sc[0][0], BLK, vb + j0 * vs, vs, nb, D)
        j0 = j0 + nb
    if part != NULL:
        for g in range(G):
            part[g * (D + 2)] = mx[g]
            part[g * (D + 2) + 1] = den[g]
            for d in range(D):
                part[g * (D + 2) + 2 + d] = acc[g][d]
        return
    for g in range(G):
        if hi > lo:
            inv = 1.0 / den[g]
            for d in range(D):
                o0[g * ohs + d] = acc[g][d] * inv
        else:
            for d in range(D):
                o0[g * ohs + d] = 0.0


cdef cnp.ndarray _int_lengths(object a, str k, str name, Py_ssize_t B):
    cdef cnp.ndarray arr = _arr(a, k, name)
    if arr.dtype.kind not in "iu":
        raise KernelDtypeError(f"{k}: {name} must be an integer array, got {arr.dtype}")
    if arr.ndim != 1 or arr.shape[0] != B:
        raise KernelError(f"{k}: {name} has shape {_shape(arr)}, expected ({B},)")
    return cnp.PyArray_FROMANY(arr, cnp.NPY_INT64, 1, 1, cnp.NPY_ARRAY_C_CONTIGUOUS)


cdef int _check_heads(str k, Py_ssize_t Hq, Py_ssize_t Hkv, Py_ssize_t D, float softcap) except -1:
    if Hkv == 0 or Hq % Hkv != 0:
        raise KernelError(f"{k}: {Hq} query heads are not a multiple of {Hkv} kv heads")
    if D > MAXD:
        raise KernelError(f"{k}: head_dim {D} exceeds the supported {MAXD}")
    if not softcap >= 0.0:
        raise KernelError(f"{k}: softcap must be >= 0, got {softcap}")
    return 0


ctypedef struct _GqaJob:
    const char* qp
    const char* kp
    const char* vp
    char* op
    cnp.npy_intp* qst
    cnp.npy_intp* kst
    cnp.npy_intp* vst
    cnp.npy_intp* ost
    const int64_t* tv
    const int64_t* sv
    Py_ssize_t length_offset
    Py_ssize_t local_window
    Py_ssize_t S
    Py_ssize_t Hkv
    Py_ssize_t grp
    Py_ssize_t D
    float scale
    float softcap
    bint stream


cdef void _gqa_item(void* ctx, long item) noexcept nogil:
    """One (batch row, KV head, query token) of :func:`gqa_attention`."""
    cdef _GqaJob* j = <_GqaJob*>ctx
    cdef Py_ssize_t S = j.S, Hkv = j.Hkv, grp = j.grp
    cdef Py_ssize_t b = item // (Hkv * S), g = (item // S) % Hkv, s = item % S
    cdef Py_ssize_t tot = j.tv[b] + j.length_offset
    cdef Py_ssize_t pos = (j.sv[b] if j.sv != NULL else tot - S) + s
    cdef Py_ssize_t hi = pos + 1 if pos + 1 < tot else tot
    cdef Py_ssize_t lo = 0, h0, nh
    if j.local_window > 0 and pos + 1 - j.local_window > 0:
        lo = pos + 1 - j.local_window
    cdef const float* kb = <const float*>(j.kp + b * j.kst[0] + g * j.kst[1])
    cdef const float* vb = <const float*>(j.vp + b * j.vst[0] + g * j.vst[1])
    h0 = g * grp
    while h0 < (g + 1) * grp:
        nh = (g + 1) * grp - h0
        if nh > MAXG:
            nh = MAXG
        _attend_group(<const float*>(j.qp + b * j.qst[0] + s * j.qst[1] + h0 * j.qst[2]), j.qst[2] // 4,
                      nh, kb, j.kst[2] // 4, vb, j.vst[2] // 4, lo, hi, j.D, j.scale, j.softcap,
                      <float*>(j.op + b * j.ost[0] + s * j.ost[1] + h0 * j.ost[2]), j.ost[2] // 4, NULL,
                      j.stream)
        h0 = h0 + nh


def gqa_attention(q, k_cache, v_cache, total_len, out, float scale=0.0, *, int length_offset=0,
                  query_start=None, float softcap=0.0, int local_window=-1, num_threads=None):
    """Grouped-query causal attention over the valid prefix of a KV cache.

    q, out: float32 [B, S, Hq, D] (unit-stride last axis; ``out`` must not overlap
    ``q``); k_cache, v_cache: float32 [B, Hkv, L, D]; total_len: int32/int64 [B];
    query_start: int32/int64 [B] or None. See the module docstring for the
    semantics. Raises KernelError / CacheRangeError before writing when a length
    is negative or exceeds ``L``, or a query position is negative.
    """
    cdef str k = "gqa_attention"
    cdef cnp.ndarray qa = _f32(q, k, "q", 4, False, False)
    cdef cnp.ndarray ka = _f32(k_cache, k, "k_cache", 4, False, False)
    cdef cnp.ndarray va = _f32(v_cache, k, "v_cache", 4, False, False)
    cdef cnp.ndarray oa = _f32(out, k, "out", 4, True, False)
    _same_shape(qa, oa, k, "q", "out")
    _same_shape(ka, va, k, "k_cache", "v_cache")
    cdef Py_ssize_t B = qa.shape[0], S = qa.shape[1], Hq = qa.shape[2], D = qa.shape[3]
    cdef Py_ssize_t Hkv = ka.shape[1], L = ka.shape[2]
    if ka.shape[0] != B or ka.shape[3] != D:
        raise KernelError(f"{k}: k_cache has shape {_shape(ka)}, expected ({B}, kv_heads, length, {D})")
    _check_heads(k, Hq, Hkv, D, softcap)
    cdef cnp.ndarray ta, sa
    ta = _int_lengths(total_len, k, "total_len", B)
    cdef const int64_t[::1] tv = ta
    cdef const int64_t[::1] sv
    cdef bint has_start = query_start is not None
    if has_start:
        sa = _int_lengths(query_start, k, "query_start", B)
        sv = sa
    cdef Py_ssize_t b, tot, st, maxtot = 0
    for b in range(B):
        tot = tv[b] + length_offset
        if tot > maxtot:
            maxtot = tot
        if tot < 0 or tot > L:
            raise CacheRangeError(f"{k}: row {b} has valid length {tot} outside [0, {L}] "
                                  f"(the cache length)")
        st = sv[b] if has_start else tot - S
        if st < 0:
            raise CacheRangeError(f"{k}: row {b}: {S} new tokens but valid length {tot}; "
                                  f"pass query_start for a padded first prompt")
    cdef int nt = _threads(num_threads, k)
    if B == 0 or S == 0 or Hq == 0 or D == 0:
        return out
    nt = _fit_threads(nt, B * Hkv * S, 4.0 * B * S * Hq * D * maxtot)
    if scale == 0.0:
        scale = 1.0 / sqrtf(<float>D)
    cdef _GqaJob job
    job.qp = <const char*>cnp.PyArray_DATA(qa)
    job.kp = <const char*>cnp.PyArray_DATA(ka)
    job.vp = <const char*>cnp.PyArray_DATA(va)
    job.op = <char*>cnp.PyArray_DATA(oa)
    job.qst = cnp.PyArray_STRIDES(qa)
    job.kst = cnp.PyArray_STRIDES(ka)
    job.vst = cnp.PyArray_STRIDES(va)
    job.ost = cnp.PyArray_STRIDES(oa)
    job.tv = &tv[0]
    job.sv = &sv[0] if has_start else NULL
    job.length_offset = length_offset
    job.local_window = local_window
    job.S = S
    job.Hkv = Hkv
    job.grp = Hq // Hkv
    job.D = D
    job.scale = scale
    job.softcap = softcap
    job.stream = B * Hkv * maxtot * D * 8 >= PREFETCH_BYTES
    with nogil:
        of_pool_parallel_for(B * Hkv * S, _gqa_item, &job, nt)
    return out


cdef int _decode_step(const char* qp, cnp.npy_intp qhs, const char* kp, cnp.npy_intp khs,
                      const char* vp, cnp.npy_intp vhs, char* kcp, cnp.npy_intp* kcs, char* vcp,
                      cnp.npy_intp* vcs, Py_ssize_t position, Py_ssize_t Hq, Py_ssize_t Hkv, Py_ssize_t D,
                      const float* cr, const float* sr, Py_ssize_t half, bint interleaved, float scale,
                      float softcap, float* outp, int nt) except -1:
    """The checked body of :func:`gqa_decode`: heads ``qhs`` / ``khs`` / ``vhs`` bytes apart
    (unit-stride rows), caches [1, Hkv, L, D] by strides, ``out`` C-contiguous [Hq, D];
    ``cr`` / ``sr`` the rotary row of ``position`` (NULL: no rotation)."""
    cdef bint rot = cr != NULL
    cdef str kn = "gqa_decode"
    if scale == 0.0:
        scale = 1.0 / sqrtf(<float>D)
    cdef float* qr = <float*>malloc(Hq * D * sizeof(float))
    if qr == NULL:
        raise MemoryError(f"{kn}: cannot allocate {Hq * D * 4} bytes for the rotated query")
    cdef Py_ssize_t h, i
    cdef const float* src
    cdef float* dst
    nt = _fit_threads(nt, Hkv * ((position + SPLIT_KEYS) // SPLIT_KEYS), 4.0 * Hq * D * (position + 1))
    try:
        with nogil:
            for h in range(Hq):
                src = <const float*>(qp + h * qhs)
                if rot:
                    _rotate_head(src, qr + h * D, cr, sr, half, D, interleaved)
                else:
                    for i in range(D):
                        qr[h * D + i] = src[i]
            for h in range(Hkv):
                src = <const float*>(kp + h * khs)
                dst = <float*>(kcp + h * kcs[1] + position * kcs[2])
                if rot:
                    _rotate_head(src, dst, cr, sr, half, D, interleaved)
                else:
                    for i in range(D):
                        dst[i] = src[i]
                src = <const float*>(vp + h * vhs)
                dst = <float*>(vcp + h * vcs[1] + position * vcs[2])
                for i in range(D):
                    dst[i] = src[i]
            _attend_one(<const char*>qr, D * 4, kcp, kcs, vcp, vcs, position + 1, Hq, Hkv, D, scale, softcap,
                        outp, nt)
    finally:
        free(qr)
    return 0


ctypedef struct _SplitJob:
    const char* qp
    Py_ssize_t qhs
    const char* kp
    const char* vp
    cnp.npy_intp* kst
    cnp.npy_intp* vst
    Py_ssize_t total
    Py_ssize_t chunk
    Py_ssize_t nchunks
    Py_ssize_t grp
    Py_ssize_t D
    float scale
    float softcap
    float* parts
    bint stream


cdef void _split_item(void* ctx, long item) noexcept nogil:
    """Keys ``[c * chunk, (c + 1) * chunk)`` of KV head ``g`` for one query token, item
    ``g * nchunks + c``: the softmax state of each query head of the group."""
    cdef _SplitJob* j = <_SplitJob*>ctx
    cdef Py_ssize_t g = item // j.nchunks, c = item % j.nchunks
    cdef Py_ssize_t lo = c * j.chunk, hi = lo + j.chunk
    if hi > j.total:
        hi = j.total
    _attend_group(<const float*>(j.qp + g * j.grp * j.qhs), j.qhs // 4, j.grp,
                  <const float*>(j.kp + g * j.kst[1]), j.kst[2] // 4, <const float*>(j.vp + g * j.vst[1]),
                  j.vst[2] // 4, lo, hi, j.D, j.scale, j.softcap, NULL, 0,
                  j.parts + item * j.grp * (j.D + 2), j.stream)


cdef void _merge_parts(const float* parts, Py_ssize_t Hkv, Py_ssize_t nchunks, Py_ssize_t grp, Py_ssize_t D,
                       float* out) noexcept nogil:
    """out[h] = sum_c e^(m_c - M) acc_c / sum_c e^(m_c - M) den_c over the key chunks ``c`` of
    query head ``h`` (M the largest running max); zeros for a head that saw no key."""
    cdef Py_ssize_t g, i, c, d, w = D + 2
    cdef const float* p
    cdef float M, f, den
    cdef float* o
    for g in range(Hkv):
        for i in range(grp):
            M = -INFINITY
            for c in range(nchunks):
                p = parts + ((g * nchunks + c) * grp + i) * w
                if p[0] > M:
                    M = p[0]
            o = out + (g * grp + i) * D
            for d in range(D):
                o[d] = 0.0
            if M == -INFINITY:
                continue
            den = 0.0
            for c in range(nchunks):
                p = parts + ((g * nchunks + c) * grp + i) * w
                if p[0] == -INFINITY:
                    continue
                f = expf(p[0] - M)
                den = den + f * p[1]
                of_axpy(o, f, p + 2, D)
            of_scal(o, 1.0 / den, D)


cdef void _attend_one(const char* qp, cnp.npy_intp qhs, const char* kcp, cnp.npy_intp* kcs, const char* vcp,
                      cnp.npy_intp* vcs, int64_t total, Py_ssize_t Hq, Py_ssize_t Hkv, Py_ssize_t D, float scale,
                      float softcap, float* outp, int nt) noexcept nogil:
    """One query token (heads ``qhs`` bytes apart) attends to keys ``[0, total)`` of caches
    [1, Hkv, L, D] given by strides; ``out`` C-contiguous [Hq, D]. From ``2 * SPLIT_KEYS``
    keys on, each KV head's keys are split into tasks of ``SPLIT_KEYS`` whose softmax
    states are merged afterwards, so that every thread of the pool shares the cache reads
    whatever the head count, and a thread that runs late holds up one chunk, not a head."""
    cdef _SplitJob sj
    cdef Py_ssize_t nchunks = (total + SPLIT_KEYS - 1) // SPLIT_KEYS
    if total >= 2 * SPLIT_KEYS and Hq // Hkv <= MAXG:
        sj.parts = <float*>malloc(Hkv * nchunks * (Hq // Hkv) * (D + 2) * sizeof(float))
        if sj.parts != NULL:
            sj.qp = qp
            sj.qhs = qhs
            sj.kp = kcp
            sj.vp = vcp
            sj.kst = kcs
            sj.vst = vcs
            sj.total = total
            sj.chunk = SPLIT_KEYS
            sj.nchunks = nchunks
            sj.grp = Hq // Hkv
            sj.D = D
            sj.scale = scale
            sj.softcap = softcap
            sj.stream = Hkv * total * D * 8 >= PREFETCH_BYTES
            of_pool_parallel_for(Hkv * nchunks, _split_item, &sj, nt)
            _merge_parts(sj.parts, Hkv, nchunks, Hq // Hkv, D, outp)
            free(sj.parts)
            return
    cdef int64_t start = total - 1
    cdef cnp.npy_intp qst[3]
    cdef cnp.npy_intp ost[3]
    cdef _GqaJob job
    qst[0] = 0
    qst[1] = 0
    qst[2] = qhs
    ost[0] = Hq * D * 4
    ost[1] = Hq * D * 4
    ost[2] = D * 4
    job.qp = qp
    job.kp = kcp
    job.vp = vcp
    job.op = <char*>outp
    job.qst = qst
    job.kst = kcs
    job.vst = vcs
    job.ost = ost
    job.tv = &total
    job.sv = &start
    job.length_offset = 0
    job.local_window = -1
    job.S = 1
    job.Hkv = Hkv
    job.grp = Hq // Hkv
    job.D = D
    job.scale = scale
    job.softcap = softcap
    job.stream = Hkv * total * D * 8 >= PREFETCH_BYTES
    of_pool_parallel_for(Hkv, _gqa_item, &job, nt)


def gqa_decode(q, k, v, k_cache, v_cache, Py_ssize_t position, cos, sin, out, float scale=0.0, *,
               float softcap=0.0, bint interleaved=False, num_threads=None):
    """One new token of a batch-1 GroupQueryAttention step, in one call.

    q [1, 1, Hq, D], k and v [1, 1, Hkv, D] (unit-stride last axis), caches [1, Hkv, L, D],
    out float32 [1, 1, Hq, D] C-contiguous. The key, rotated at ``position`` when ``cos``
    and ``sin`` ([max_pos, R/2]) are given, and the value are written into row ``position``
    of the caches; then the rotated query attends to keys ``[0, position]``. Raises
    KernelError / CacheRangeError before writing anything when a shape, the position or
    the rotary cache does not fit.
    """
    cdef str kn = "gqa_decode"
    cdef cnp.ndarray qa = _f32(q, kn, "q", 4, False, False)
    cdef cnp.ndarray ka = _f32(k, kn, "k", 4, False, False)
    cdef cnp.ndarray va = _f32(v, kn, "v", 4, False, False)
    cdef cnp.ndarray kc = _f32(k_cache, kn, "k_cache", 4, True, False)
    cdef cnp.ndarray vc = _f32(v_cache, kn, "v_cache", 4, True, False)
    cdef cnp.ndarray oa = _f32(out, kn, "out", 4, True)
    _same_shape(qa, oa, kn, "q", "out")
    _same_shape(ka, va, kn, "k", "v")
    _same_shape(kc, vc, kn, "k_cache", "v_cache")
    cdef Py_ssize_t Hq = qa.shape[2], D = qa.shape[3], Hkv = ka.shape[2], L = kc.shape[2]
    if qa.shape[0] != 1 or qa.shape[1] != 1 or ka.shape[0] != 1 or ka.shape[1] != 1:
        raise KernelError(f"{kn}: one token of batch row 0 only, got q {_shape(qa)} and k {_shape(ka)}")
    if ka.shape[3] != D or kc.shape[0] != 1 or kc.shape[1] != Hkv or kc.shape[3] != D:
        raise KernelError(f"{kn}: k {_shape(ka)} and k_cache {_shape(kc)} do not match q {_shape(qa)}")
    _check_heads(kn, Hq, Hkv, D, softcap)
    if position < 0 or position >= L:
        raise CacheRangeError(f"{kn}: position {position} outside the cache capacity [0, {L})")
    cdef bint rot = cos is not None
    cdef cnp.ndarray ca, sa
    cdef Py_ssize_t half = 0
    cdef const float* cr = NULL
    cdef const float* sr = NULL
    if rot:
        ca = _f32(cos, kn, "cos", 2)
        sa = _f32(sin, kn, "sin", 2)
        _same_shape(ca, sa, kn, "cos", "sin")
        half = ca.shape[1]
        if 2 * half > D:
            raise KernelError(f"{kn}: rotary dim {2 * half} (2 * cos.shape[-1]) exceeds head_dim {D}")
        if position >= ca.shape[0]:
            raise KernelError(f"{kn}: position {position} exceeds the rotary cache of {ca.shape[0]}")
        cr = <const float*>cnp.PyArray_DATA(ca) + position * half
        sr = <const float*>cnp.PyArray_DATA(sa) + position * half
    cdef int nt = _threads(num_threads, kn)
    if Hq == 0 or D == 0:
        return out
    _decode_step(<const char*>cnp.PyArray_DATA(qa), cnp.PyArray_STRIDES(qa)[2],
                 <const char*>cnp.PyArray_DATA(ka), cnp.PyArray_STRIDES(ka)[2],
                 <const char*>cnp.PyArray_DATA(va), cnp.PyArray_STRIDES(va)[2],
                 <char*>cnp.PyArray_DATA(kc), cnp.PyArray_STRIDES(kc),
                 <char*>cnp.PyArray_DATA(vc), cnp.PyArray_STRIDES(vc), position, Hq, Hkv, D,
                 cr, sr, half, interleaved, scale, softcap, <float*>cnp.PyArray_DATA(oa), nt)
    return out


cdef inline bint _f32_rows(object a, int nd) noexcept:
    """``a`` is a float32 ndarray of rank ``nd`` with a unit-stride last axis (or no element)."""
    return (cnp.PyArray_Check(a) and cnp.PyArray_TYPE(<cnp.ndarray>a) == cnp.NPY_FLOAT32
            and cnp.PyArray_NDIM(<cnp.ndarray>a) == nd
            and (cnp.PyArray_STRIDES(<cnp.ndarray>a)[nd - 1] == 4 or cnp.PyArray_SIZE(<cnp.ndarray>a) == 0))


cdef inline bint _one_int(object a, int64_t* value) noexcept:
    """Reads the single element of an int32 / int64 array into ``value``."""
    if not cnp.PyArray_Check(a) or cnp.PyArray_SIZE(<cnp.ndarray>a) != 1:
        return False
    cdef int t = cnp.PyArray_TYPE(<cnp.ndarray>a)
    if t == cnp.NPY_INT32:
        value[0] = (<int32_t*>cnp.PyArray_DATA(<cnp.ndarray>a))[0]
    elif t == cnp.NPY_INT64:
        value[0] = (<int64_t*>cnp.PyArray_DATA(<cnp.ndarray>a))[0]
    else:
        return False
    return True


cdef class GqaOneToken:
    """A GroupQueryAttention kernel's call for one new token of batch row 0 (a decode
    step): the rotation, the cache writes and the attention in one compiled call, with no
    Python in between. Operands of any other form go to ``fallback`` (the kernel's
    general path, which checks them and raises its errors).

    It is called with the run's context first (``ctx``, which it hands on). ``shared``:
    present aliases past (the caches are written in place); ``floors(ctx, past_k, past_v,
    position, 1)`` checks the write against the published lengths and returns the run's
    length record, ``wrote(record, k, v, length)`` records the new length. Otherwise
    present is a new ``[1, Hkv, max(total, capacity), D]`` buffer holding the past's first
    ``position`` rows, the new row and zeros after it, as the general path makes it."""

    cdef Py_ssize_t nq, nkv
    cdef float scale, softcap
    cdef bint rotary, interleaved, shared
    cdef int n_out, threads
    cdef object fallback, floors, wrote, where

    def __init__(self, Py_ssize_t num_heads, Py_ssize_t kv_heads, float scale, float softcap, bint rotary,
                 bint interleaved, bint shared, int n_outputs, int threads, fallback, floors, wrote, str where):
        self.nq = num_heads
        self.nkv = kv_heads
        self.scale = scale
        self.softcap = softcap
        self.rotary = rotary
        self.interleaved = interleaved
        self.shared = shared
        self.n_out = n_outputs
        self.threads = threads if threads > 0 else 1
        self.fallback = fallback
        self.floors = floors
        self.wrote = wrote
        self.where = where

    def __call__(self, ctx, q, k=None, v=None, past_k=None, past_v=None, seqlens_k=None, total_len=None,
                 cos_cache=None, sin_cache=None, position_ids=None, attention_bias=None, head_sink=None):
        if position_ids is None and attention_bias is None and head_sink is None:
            got = self._step(ctx, q, k, v, past_k, past_v, seqlens_k, total_len, cos_cache, sin_cache)
            if got is not None:
                return got
        return self.fallback(ctx, q, k, v, past_k, past_v, seqlens_k, total_len, cos_cache, sin_cache,
                             position_ids, attention_bias, head_sink)

    cdef object _step(self, ctx, q, k, v, past_k, past_v, seqlens_k, total_len, cos_cache, sin_cache):
        """The decode step, or None when the operands need the general path."""
        cdef Py_ssize_t nq = self.nq, nkv = self.nkv, W, D, cap, plen, half = 0, h
        cdef int64_t seqk, total
        cdef const char* qp
        cdef const char* kp
        cdef const char* vp
        cdef const float* cr = NULL
        cdef const float* sr = NULL
        cdef cnp.ndarray qa, ka, va, pka, pva, pk, pv, out
        cdef cnp.npy_intp dims[4]
        if (not _f32_rows(q, 3) or not _f32_rows(past_k, 4) or not _f32_rows(past_v, 4)
                or not _one_int(seqlens_k, &seqk) or not _one_int(total_len, &total)):
            return None
        qa = <cnp.ndarray>q
        W = qa.shape[2]
        if qa.shape[0] != 1 or qa.shape[1] != 1:
            return None
        if k is None and v is None:  # packed QKV
            D = W // (nq + 2 * nkv)
            if D * (nq + 2 * nkv) != W:
                return None
            qp = <const char*>cnp.PyArray_DATA(qa)
            kp = qp + nq * D * 4
            vp = kp + nkv * D * 4
        else:
            D = W // nq
            if (D * nq != W or not _f32_rows(k, 3) or not _f32_rows(v, 3)
                    or cnp.PyArray_SIZE(<cnp.ndarray>k) != nkv * D or cnp.PyArray_SIZE(<cnp.ndarray>v) != nkv * D):
                return None
            qp = <const char*>cnp.PyArray_DATA(qa)
            kp = <const char*>cnp.PyArray_DATA(<cnp.ndarray>k)
            vp = <const char*>cnp.PyArray_DATA(<cnp.ndarray>v)
        pka = <cnp.ndarray>past_k
        pva = <cnp.ndarray>past_v
        cap = pka.shape[2]
        if (D == 0 or D > MAXD or nq % nkv != 0 or nq // nkv > MAXG or pka.shape[0] != 1 or pka.shape[1] != nkv
                or pka.shape[3] != D or pva.shape[0] != 1 or pva.shape[1] != nkv or pva.shape[2] != cap
                or pva.shape[3] != D):
            return None
        cdef Py_ssize_t position = seqk if seqk > 0 else 0  # valid length seqlens_k + 1, one new token
        if self.rotary:
            if (not _f32_rows(cos_cache, 2) or not _f32_rows(sin_cache, 2)
                    or not cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray>cos_cache)
                    or not cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray>sin_cache)):
                return None
            half = (<cnp.ndarray>cos_cache).shape[1]
            if (position >= (<cnp.ndarray>cos_cache).shape[0] or 2 * half > D
                    or (<cnp.ndarray>sin_cache).shape[0] != (<cnp.ndarray>cos_cache).shape[0]
                    or (<cnp.ndarray>sin_cache).shape[1] != half):
                return None
            cr = <const float*>cnp.PyArray_DATA(<cnp.ndarray>cos_cache) + position * half
            sr = <const float*>cnp.PyArray_DATA(<cnp.ndarray>sin_cache) + position * half
        record = None
        if self.shared:
            if position + 1 > cap:
                raise CacheRangeError(f"{self.where}: new tokens at {[position]} + 1 exceed the buffer "
                                      f"capacity {cap}")
            if not cnp.PyArray_ISWRITEABLE(pka) or not cnp.PyArray_ISWRITEABLE(pva):
                return None
            record = self.floors(ctx, past_k, past_v, position, 1)
            pk, pv = pka, pva
        else:
            plen = total if total > cap else cap
            if position + 1 > plen or position > cap:
                return None
            dims[0] = 1
            dims[1] = nkv
            dims[2] = plen
            dims[3] = D
            pk = cnp.PyArray_EMPTY(4, dims, cnp.NPY_FLOAT32, 0)
            pv = cnp.PyArray_EMPTY(4, dims, cnp.NPY_FLOAT32, 0)
            _copy_prefix(pka, pk, position, plen)
            _copy_prefix(pva, pv, position, plen)
        dims[0] = 1
        dims[1] = 1
        dims[2] = nq * D
        out = cnp.PyArray_EMPTY(3, dims, cnp.NPY_FLOAT32, 0)
        _decode_step(qp, D * 4, kp, D * 4, vp, D * 4, <char*>cnp.PyArray_DATA(pk), cnp.PyArray_STRIDES(pk),
                     <char*>cnp.PyArray_DATA(pv), cnp.PyArray_STRIDES(pv), position, nq, nkv, D, cr, sr, half,
                     self.interleaved, self.scale, self.softcap, <float*>cnp.PyArray_DATA(out), self.threads)
        if record is not None:
            self.wrote(record, pk, pv, position + 1)
        if self.n_out == 1:
            return out
        return (out, pk, pv)[:self.n_out]


cdef void _copy_prefix(cnp.ndarray src, cnp.ndarray dst, Py_ssize_t rows, Py_ssize_t plen) noexcept:
    """dst [1, H, plen, D] (C-contiguous) = src's first ``rows`` rows per head, zeros from
    row ``rows + 1`` on (row ``rows`` is written next)."""
    cdef Py_ssize_t H = dst.shape[1], D = dst.shape[3], h, t
    cdef const char* sp = <const char*>cnp.PyArray_DATA(src)
    cdef cnp.npy_intp* ss = cnp.PyArray_STRIDES(src)
    cdef float* dp = <float*>cnp.PyArray_DATA(dst)
    with nogil:
        for h in range(H):
            if ss[2] == D * 4:
                memcpy(dp + h * plen * D, sp + h * ss[1], rows * D * 4)
            else:
                for t in range(rows):
                    memcpy(dp + (h * plen + t) * D, sp + h * ss[1] + t * ss[2], D * 4)
            if rows + 1 < plen:
                memset(dp + (h * plen + rows + 1) * D, 0, (plen - rows - 1) * D * 4)


cdef bint _inert_mask(object mask, Py_ssize_t T, Py_ssize_t Hq) noexcept:
    """``mask`` (None, bool or float32) masks nothing for one query over ``T`` keys and
    broadcasts to [1, Hq, 1, T]."""
    if mask is None:
        return True
    if not cnp.PyArray_Check(mask):
        return False
    cdef cnp.ndarray m = <cnp.ndarray>mask
    cdef int nd = cnp.PyArray_NDIM(m), t = cnp.PyArray_TYPE(m), i
    cdef Py_ssize_t n = cnp.PyArray_SIZE(m), j
    if nd < 1 or nd > 4 or m.shape[nd - 1] != T or not cnp.PyArray_IS_C_CONTIGUOUS(m):
        return False
    for i in range(nd - 1):  # axes (.., heads, query) from the right: 1 or the head count
        if not (m.shape[i] == 1 or (i == nd - 3 and m.shape[i] == Hq)):
            return False
    cdef const char* bp = <const char*>cnp.PyArray_DATA(m)
    cdef const float* fp = <const float*>cnp.PyArray_DATA(m)
    if t == cnp.NPY_BOOL:
        return memchr(bp, 0, n) == NULL
    if t == cnp.NPY_FLOAT32:
        for j in range(n):
            if fp[j] != 0.0:
                return False
        return True
    return False


cdef class AttentionOneQuery:
    """An ONNX Attention kernel's call for one query token of batch row 0 over 4-D keys and
    values with grouped heads (a decode step: K and V may be views of a cache), no past
    inputs, one output and a mask that masks nothing: the grouped-head kernel reads K and
    V in place, with no Python in between. Other operands go to ``fallback``."""

    cdef float scale
    cdef int threads
    cdef object fallback

    def __init__(self, float scale, int threads, fallback):
        self.scale = scale
        self.threads = threads if threads > 0 else 1
        self.fallback = fallback

    def __call__(self, q, k, v, mask=None, past_k=None, past_v=None, nonpad=None):
        cdef cnp.ndarray qa, ka, va, out
        if (past_k is not None or past_v is not None or nonpad is not None or not _f32_rows(q, 4)
                or not _f32_rows(k, 4) or not _f32_rows(v, 4)):
            return self.fallback(q, k, v, mask, past_k, past_v, nonpad)
        qa = <cnp.ndarray>q
        ka = <cnp.ndarray>k
        va = <cnp.ndarray>v
        cdef Py_ssize_t Hq = qa.shape[1], D = qa.shape[3], Hkv = ka.shape[1], T = ka.shape[2]
        if (qa.shape[0] != 1 or qa.shape[2] != 1 or ka.shape[0] != 1 or va.shape[0] != 1 or va.shape[1] != Hkv
                or va.shape[2] != T or va.shape[3] != D or ka.shape[3] != D or T < 1 or D < 1 or D > MAXD
                or Hkv < 1 or Hq % Hkv != 0 or Hq // Hkv > MAXG or not _inert_mask(mask, T, Hq)):
            return self.fallback(q, k, v, mask, past_k, past_v, nonpad)
        out = cnp.PyArray_EMPTY(4, cnp.PyArray_DIMS(qa), cnp.NPY_FLOAT32, 0)
        cdef float scale = self.scale if self.scale > 0.0 else 1.0 / sqrtf(<float>D)
        cdef int nt = _fit_threads(self.threads, Hkv * ((T + SPLIT_KEYS - 1) // SPLIT_KEYS), 4.0 * Hq * D * T)
        with nogil:
            _attend_one(<const char*>cnp.PyArray_DATA(qa), cnp.PyArray_STRIDES(qa)[1],
                        <const char*>cnp.PyArray_DATA(ka), cnp.PyArray_STRIDES(ka),
                        <const char*>cnp.PyArray_DATA(va), cnp.PyArray_STRIDES(va), T, Hq, Hkv, D, scale, 0.0,
                        <float*>cnp.PyArray_DATA(out), nt)
        return out
