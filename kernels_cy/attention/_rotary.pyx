# cython: boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""Rotary position embedding for GroupQueryAttention (``do_rotary``) and RotaryEmbedding.

One kernel serves both operators. ``x`` is indexed [batch, seq, heads, head_dim]
with a unit-stride last axis and any other strides, so a [batch, heads, seq,
head_dim] tensor (RotaryEmbedding's 4-D layout) is passed as
``x.transpose(0, 2, 1, 3)`` without a copy, and a 3-D [batch, seq, hidden] one
as ``x.reshape(b, s, heads, head_dim)``.

With ``R = 2 * cos.shape[-1]`` (the rotary dim, at most head_dim) and
``c, s = cos[p], sin[p]`` at the token's position ``p``:
non-interleaved (halves):  ``y[i] = x[i] c[i] - x[i + R/2] s[i]``,
                           ``y[i + R/2] = x[i + R/2] c[i] + x[i] s[i]``;
interleaved (pairs):       ``y[2i] = x[2i] c[i] - x[2i+1] s[i]``,
                           ``y[2i+1] = x[2i+1] c[i] + x[2i] s[i]``;
dims from R on are copied. Positions come from ``position_ids`` [batch, seq]
(RotaryEmbedding, GQA with position ids), from ``start`` [batch] as
``start[b] + s`` (GQA: ``start = total_len - seq``, or 0 for a first prompt), or,
when ``cos``/``sin`` are 3-D [batch, seq, R/2], the caches are already per token.
"""
include "_common.pxi"

include "_pool_client.pxi"

__all__ = ["RotaryCall", "rotary"]


ctypedef struct _RotaryJob:
    const char* x
    char* out
    Py_ssize_t xst[3]        # byte strides of x's batch, seq and head axes
    Py_ssize_t ost[3]
    const float* cos         # [max_pos, half], or [B, S, half] per token (mode 2)
    const float* sin
    const int64_t* pos       # mode 0: position_ids [1 or B, S]; mode 1: start [B]
    Py_ssize_t pos_rows      # mode 0: 1 when position_ids broadcast over the batch
    int mode
    bint interleaved
    Py_ssize_t S, H, D, half
    Py_ssize_t items         # B * S tokens
    Py_ssize_t chunk


cdef void _rotary_task(void* ctx, long t) noexcept nogil:
    """Tokens ``[t * chunk, (t + 1) * chunk)`` of the flattened [B, S], every head."""
    cdef _RotaryJob* j = <_RotaryJob*>ctx
    cdef Py_ssize_t item = t * j.chunk, end = item + j.chunk, b, s, p, h, half = j.half
    cdef const float* cr
    cdef const float* sr
    if end > j.items:
        end = j.items
    while item < end:
        b = item // j.S
        s = item % j.S
        if j.mode == 2:
            p = item
        elif j.mode == 0:
            p = j.pos[(b if j.pos_rows > 1 else 0) * j.S + s]
        else:
            p = j.pos[b] + s
        cr = j.cos + p * half
        sr = j.sin + p * half
        for h in range(j.H):
            _rotate_head(<const float*>(j.x + b * j.xst[0] + s * j.xst[1] + h * j.xst[2]),
                         <float*>(j.out + b * j.ost[0] + s * j.ost[1] + h * j.ost[2]),
                         cr, sr, half, j.D, j.interleaved)
        item += 1


def rotary(x, cos, sin, out, position_ids=None, start=None, bint interleaved=False,
           num_threads=None):
    """Apply rotary embedding to ``x`` [B, S, H, D] into ``out`` (same shape; may be ``x``)."""
    cdef str k = "rotary"
    cdef cnp.ndarray xa = _f32(x, k, "x", 4, False, False)
    cdef cnp.ndarray oa = _f32(out, k, "out", 4, True, False)
    _same_shape(xa, oa, k, "x", "out")
    cdef cnp.ndarray ca = _arr(cos, k, "cos")
    cdef int cnd = cnp.PyArray_NDIM(ca)
    if cnd not in (2, 3):
        raise KernelError(f"{k}: cos must be [max_pos, R/2] or [batch, seq, R/2], got {_shape(ca)}")
    ca = _f32(cos, k, "cos", cnd)
    cdef cnp.ndarray sa = _f32(sin, k, "sin", cnd)
    _same_shape(ca, sa, k, "cos", "sin")
    cdef Py_ssize_t B = xa.shape[0], S = xa.shape[1], H = xa.shape[2], D = xa.shape[3]
    cdef Py_ssize_t half = ca.shape[cnd - 1]
    if 2 * half > D:
        raise KernelError(f"{k}: rotary dim {2 * half} (2 * cos.shape[-1]) exceeds head_dim {D}")
    cdef Py_ssize_t maxpos = ca.shape[0]
    cdef cnp.ndarray pa = None
    cdef int mode
    if cnd == 3:
        if position_ids is not None or start is not None:
            raise KernelError(f"{k}: 3-D cos/sin caches are per token: pass no position_ids/start")
        if ca.shape[0] != B or ca.shape[1] != S:
            raise KernelError(f"{k}: cos has shape {_shape(ca)}, expected ({B}, {S}, R/2)")
        mode = 2
    elif position_ids is not None:
        if start is not None:
            raise KernelError(f"{k}: pass position_ids or start, not both")
        pa = _arr(position_ids, k, "position_ids")
        if pa.dtype.kind not in "iu":
            raise KernelDtypeError(f"{k}: position_ids must be integers, got {pa.dtype}")
        if pa.ndim != 2 or pa.shape[1] != S or pa.shape[0] not in (1, B):
            raise KernelError(f"{k}: position_ids has shape {_shape(pa)}, expected ({B}, {S})")
        mode = 0
    elif start is not None:
        pa = _arr(start, k, "start")
        if pa.dtype.kind not in "iu":
            raise KernelDtypeError(f"{k}: start must be integers, got {pa.dtype}")
        if pa.ndim != 1 or pa.shape[0] != B:
            raise KernelError(f"{k}: start has shape {_shape(pa)}, expected ({B},)")
        mode = 1
    else:
        raise KernelError(f"{k}: 2-D cos/sin caches need position_ids or start")
    cdef const int64_t[:, ::1] pidv
    cdef const int64_t[::1] stv
    cdef Py_ssize_t b, s, p, i
    if mode == 0:
        pa = cnp.PyArray_FROMANY(pa, cnp.NPY_INT64, 2, 2, cnp.NPY_ARRAY_C_CONTIGUOUS)
        pidv = pa
        for b in range(pa.shape[0]):
            for s in range(S):
                p = pidv[b, s]
                if p < 0 or p >= maxpos:
                    raise KernelError(f"{k}: position_ids[{b}, {s}] = {p} outside the cos/sin cache "
                                      f"[0, {maxpos})")
    elif mode == 1:
        pa = cnp.PyArray_FROMANY(pa, cnp.NPY_INT64, 1, 1, cnp.NPY_ARRAY_C_CONTIGUOUS)
        stv = pa
        for b in range(B):
            if S and (stv[b] < 0 or stv[b] + S > maxpos):
                raise KernelError(f"{k}: positions [{stv[b]}, {stv[b] + S}) of row {b} outside "
                                  f"the cos/sin cache [0, {maxpos})")
    cdef int nt = _threads(num_threads, k)
    if B == 0 or S == 0 or H == 0 or D == 0:
        return out
    nt = _fit_threads(nt, B * S, 3.0 * B * S * H * D)
    # x/out are strided on their leading axes (memoryviews would demand full contiguity)
    cdef _RotaryJob job
    job.x = <const char*>cnp.PyArray_DATA(xa)
    job.out = <char*>cnp.PyArray_DATA(oa)
    for i in range(3):
        job.xst[i] = cnp.PyArray_STRIDES(xa)[i]
        job.ost[i] = cnp.PyArray_STRIDES(oa)[i]
    job.cos = <const float*>cnp.PyArray_DATA(ca)
    job.sin = <const float*>cnp.PyArray_DATA(sa)
    job.pos = <const int64_t*>cnp.PyArray_DATA(pa) if pa is not None else NULL
    job.pos_rows = pa.shape[0] if mode == 0 else B
    job.mode = mode
    job.interleaved = interleaved
    job.S = S
    job.H = H
    job.D = D
    job.half = half
    job.items = B * S
    job.chunk = _rows_per_task(B * S, nt)
    with nogil:
        _run_row_tasks(_rotary_task, &job, B * S, job.chunk, nt)
    return out


cdef class RotaryCall:
    """An ONNX RotaryEmbedding kernel's call for a float32 [B, N, S, H] input with per-token
    float32 cos / sin caches [B, S, R/2] (torch exports compute them in the graph) and no
    position_ids: the rotation with no Python in between. Other operands go to
    ``fallback(x, cos_cache, sin_cache, position_ids)``."""

    cdef bint interleaved
    cdef Py_ssize_t rot
    cdef object fallback

    def __init__(self, bint interleaved, Py_ssize_t rotary_dim, fallback):
        self.interleaved = interleaved
        self.rot = rotary_dim
        self.fallback = fallback

    def __call__(self, x, cos_cache, sin_cache, position_ids=None):
        cdef cnp.ndarray xa, ca, sa, out
        if (position_ids is not None or not cnp.PyArray_Check(x) or not cnp.PyArray_Check(cos_cache)
                or not cnp.PyArray_Check(sin_cache)):
            return self.fallback(x, cos_cache, sin_cache, position_ids)
        xa = <cnp.ndarray>x
        ca = <cnp.ndarray>cos_cache
        sa = <cnp.ndarray>sin_cache
        if (cnp.PyArray_NDIM(xa) != 4 or cnp.PyArray_TYPE(xa) != cnp.NPY_FLOAT32 or cnp.PyArray_NDIM(ca) != 3
                or cnp.PyArray_TYPE(ca) != cnp.NPY_FLOAT32 or cnp.PyArray_TYPE(sa) != cnp.NPY_FLOAT32
                or not cnp.PyArray_IS_C_CONTIGUOUS(ca) or not cnp.PyArray_IS_C_CONTIGUOUS(sa)
                or not cnp.PyArray_SAMESHAPE(ca, sa)):
            return self.fallback(x, cos_cache, sin_cache, position_ids)
        cdef Py_ssize_t B = xa.shape[0], N = xa.shape[1], S = xa.shape[2], D = xa.shape[3]
        cdef Py_ssize_t half = ca.shape[2]
        cdef Py_ssize_t rot = self.rot if self.rot else D
        if (ca.shape[0] != B or ca.shape[1] != S or 2 * half != rot or rot > D
                or (cnp.PyArray_STRIDES(xa)[3] != 4 and cnp.PyArray_SIZE(xa) != 0)):
            return self.fallback(x, cos_cache, sin_cache, position_ids)
        out = cnp.PyArray_EMPTY(4, cnp.PyArray_DIMS(xa), cnp.NPY_FLOAT32, 0)
        cdef const char* xp = <const char*>cnp.PyArray_DATA(xa)
        cdef cnp.npy_intp* xst = cnp.PyArray_STRIDES(xa)
        cdef float* op = <float*>cnp.PyArray_DATA(out)
        cdef const float* cp = <const float*>cnp.PyArray_DATA(ca)
        cdef const float* sp = <const float*>cnp.PyArray_DATA(sa)
        cdef Py_ssize_t b, n, t
        cdef bint il = self.interleaved
        with nogil:
            for b in range(B):
                for n in range(N):
                    for t in range(S):
                        _rotate_head(<const float*>(xp + b * xst[0] + n * xst[1] + t * xst[2]),
                                     op + ((b * N + n) * S + t) * D, cp + (b * S + t) * half,
                                     sp + (b * S + t) * half, half, D, il)
        return out
