# cython: boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""Compiled float32 pooling windows.

``pool_nd`` runs MaxPool (with the optional flat indices), AveragePool and LpPool over
1 to 3 spatial axes (fewer than three are taken as leading axes of length 1) with any
strides, dilations and begin / end padding; ``global_pool`` reduces each row of a
``[rows, n]`` view (GlobalAveragePool / GlobalMaxPool / GlobalLpPool over the flattened
spatial axes). Planes (``N * C``) or rows run in parallel on the backend's pool.

The window geometry (output lengths, effective padding) is the caller's
(``pool/geometry.py``); here each axis of each output position gives the range of taps
inside the input (``lo <= j < hi``) and, for ``count_include_pad``, the number of taps
inside input + padding. Maxima keep the window's first valid value and take a later one
only when it is strictly greater (what a NaN does follows from that); sums accumulate in
double. A window with no tap inside the input (dilated taps all in the padding) gives
-FLT_MAX and index -1 (MaxPool) or 0, as onnxruntime does.
"""
from libc.float cimport FLT_MAX
from libc.math cimport NAN, fabs, pow, sqrt
from libc.stdlib cimport free, malloc

include "_common.pxi"

include "_pool_client.pxi"

__all__ = ["MODE_AVG", "MODE_LP", "MODE_MAX", "global_pool", "pool_nd"]

MODE_MAX = 0
MODE_AVG = 1
MODE_LP = 2


ctypedef struct _Job:
    const float* x
    float* y
    int64_t* idx           # or NULL
    Py_ssize_t planes
    Py_ssize_t chunk
    Py_ssize_t isz         # input elements per plane
    Py_ssize_t osz         # output elements per plane
    Py_ssize_t inp[3]
    Py_ssize_t out[3]
    Py_ssize_t k[3]
    Py_ssize_t s[3]
    Py_ssize_t d[3]
    Py_ssize_t pb[3]
    Py_ssize_t pe[3]
    Py_ssize_t w[3]        # flat-index weight of each axis (row- or column-major)
    int mode
    bint include_pad
    double p


cdef inline void _taps(const _Job* j, int a, Py_ssize_t o, Py_ssize_t* st, Py_ssize_t* lo,
                       Py_ssize_t* hi, Py_ssize_t* padded) noexcept nogil:
    """Axis ``a``, output ``o``: the window start ``st`` (input coordinates), the taps inside
    the input ``[lo, hi)`` and the number of taps inside input + padding."""
    cdef Py_ssize_t start = o * j.s[a] - j.pb[a], d = j.d[a], k = j.k[a], n = j.inp[a]
    cdef Py_ssize_t first = 0 if start >= 0 else (-start + d - 1) // d
    cdef Py_ssize_t last = (n - 1 - start) // d + 1 if n - 1 - start >= 0 else 0
    cdef Py_ssize_t ends = (n + j.pe[a] - 1 - start) // d + 1 if n + j.pe[a] - 1 - start >= 0 else 0
    if last > k:
        last = k
    if last < first:
        last = first
    if ends > k:
        ends = k
    st[0] = start
    lo[0] = first
    hi[0] = last
    padded[0] = ends


cdef void _interior(const _Job* j, const float* xp, float* y, double* acc, Py_ssize_t n,
                    Py_ssize_t st0, Py_ssize_t lo0, Py_ssize_t hi0, Py_ssize_t c0,
                    Py_ssize_t st1, Py_ssize_t lo1, Py_ssize_t hi1, Py_ssize_t c1, Py_ssize_t start) noexcept nogil:
    """``n`` consecutive outputs along the last axis whose windows lie inside the input on
    that axis (the first starts at input column ``start``), no indices: taps in the same
    row-major order as the scalar path, each applied to the whole run of outputs at once
    (a maximum keeps the first tap and takes a strictly greater later one, as there)."""
    cdef Py_ssize_t i, j0, j1, j2, k2 = j.k[2], d2 = j.d[2], s2 = j.s[2], in1 = j.inp[1], in2 = j.inp[2]
    cdef Py_ssize_t count
    cdef const float* src
    cdef float v
    cdef double p_exp = j.p
    cdef bint first = True
    if hi0 <= lo0 or hi1 <= lo1:  # no tap inside the input on a leading axis
        for i in range(n):
            y[i] = -FLT_MAX if j.mode == 0 else 0.0
        return
    if j.mode != 0:
        for i in range(n):
            acc[i] = 0.0
    for j0 in range(lo0, hi0):
        for j1 in range(lo1, hi1):
            for j2 in range(k2):
                src = xp + ((st0 + j0 * j.d[0]) * in1 + st1 + j1 * j.d[1]) * in2 + start + j2 * d2
                if j.mode == 0:
                    if first:
                        for i in range(n):
                            y[i] = src[i * s2]
                        first = False
                    elif s2 == 1:
                        for i in range(n):
                            v = src[i]
                            y[i] = v if v > y[i] else y[i]
                    else:
                        for i in range(n):
                            v = src[i * s2]
                            y[i] = v if v > y[i] else y[i]
                elif j.mode == 1:
                    if s2 == 1:
                        for i in range(n):
                            acc[i] += src[i]
                    else:
                        for i in range(n):
                            acc[i] += src[i * s2]
                elif p_exp == 2.0:
                    for i in range(n):
                        v = src[i * s2]
                        acc[i] += <double>v * v
                elif p_exp == 1.0:
                    for i in range(n):
                        acc[i] += fabs(src[i * s2])
                else:
                    for i in range(n):
                        acc[i] += pow(fabs(src[i * s2]), p_exp)
    if j.mode == 1:
        count = (c0 * c1 if j.include_pad else (hi0 - lo0) * (hi1 - lo1)) * k2
        for i in range(n):
            y[i] = <float>(acc[i] / count)
    elif j.mode == 2:
        for i in range(n):
            if p_exp == 2.0:
                y[i] = <float>sqrt(acc[i])
            elif p_exp == 1.0:
                y[i] = <float>acc[i]
            else:
                y[i] = <float>pow(acc[i], 1.0 / p_exp)


cdef void _pool_planes(const _Job* j, Py_ssize_t p0, Py_ssize_t p1) noexcept nogil:
    cdef Py_ssize_t p, oi, o0, o1, o2, j0, j1, j2, t0, t1, t2, bi
    cdef Py_ssize_t st0, lo0, hi0, c0, st1, lo1, hi1, c1, st2, lo2, hi2, c2, count
    cdef Py_ssize_t in1 = j.inp[1], in2 = j.inp[2], plane_base
    cdef const float* xp
    cdef const float* r0
    cdef const float* r1
    cdef float* yp
    cdef int64_t* ip
    cdef float v, best
    cdef bint have
    cdef double acc, p_exp = j.p, inv_p = 1.0 / j.p
    # the outputs along the last axis whose windows lie inside the input there run as one
    # vector pass per output row (_interior); the others, and every indexed MaxPool, here
    cdef Py_ssize_t s2 = j.s[2], reach = (j.k[2] - 1) * j.d[2], row
    cdef Py_ssize_t ilo = (j.pb[2] + s2 - 1) // s2, ihi = 0
    if j.inp[2] - 1 - reach + j.pb[2] >= 0:
        ihi = (j.inp[2] - 1 - reach + j.pb[2]) // s2 + 1
    if ihi > j.out[2]:
        ihi = j.out[2]
    cdef double* accbuf = NULL
    cdef bint fast = j.idx == NULL and ihi - ilo >= 4
    if fast and j.mode != 0:
        accbuf = <double*>malloc((ihi - ilo) * sizeof(double))
        fast = accbuf != NULL
    for p in range(p0, p1):
        plane_base = p * j.isz
        xp = j.x + plane_base
        yp = j.y + p * j.osz
        ip = (j.idx + p * j.osz) if j.idx != NULL else NULL
        oi = 0
        for o0 in range(j.out[0]):
            _taps(j, 0, o0, &st0, &lo0, &hi0, &c0)
            for o1 in range(j.out[1]):
                _taps(j, 1, o1, &st1, &lo1, &hi1, &c1)
                row = oi
                if fast:
                    _interior(j, xp, yp + row + ilo, accbuf, ihi - ilo, st0, lo0, hi0, c0, st1, lo1, hi1, c1,
                              ilo * s2 - j.pb[2])
                for o2 in range(j.out[2]):
                    if fast and ilo <= o2 < ihi:
                        oi += 1
                        continue
                    _taps(j, 2, o2, &st2, &lo2, &hi2, &c2)
                    if j.mode == 0:
                        have = False
                        best = NAN
                        bi = -1
                        for j0 in range(lo0, hi0):
                            t0 = st0 + j0 * j.d[0]
                            r0 = xp + t0 * in1 * in2
                            for j1 in range(lo1, hi1):
                                t1 = st1 + j1 * j.d[1]
                                r1 = r0 + t1 * in2
                                for j2 in range(lo2, hi2):
                                    t2 = st2 + j2 * j.d[2]
                                    v = r1[t2]
                                    if not have or v > best:
                                        best = v
                                        have = True
                                        bi = t0 * j.w[0] + t1 * j.w[1] + t2 * j.w[2]
                        yp[oi] = best if have else -FLT_MAX  # no tap: onnxruntime's lowest value
                        if ip != NULL:
                            ip[oi] = plane_base + bi if bi >= 0 else -1
                    else:
                        acc = 0.0
                        for j0 in range(lo0, hi0):
                            t0 = st0 + j0 * j.d[0]
                            r0 = xp + t0 * in1 * in2
                            for j1 in range(lo1, hi1):
                                t1 = st1 + j1 * j.d[1]
                                r1 = r0 + t1 * in2
                                if j.mode == 1:
                                    for j2 in range(lo2, hi2):
                                        acc += r1[st2 + j2 * j.d[2]]
                                elif p_exp == 2.0:
                                    for j2 in range(lo2, hi2):
                                        v = r1[st2 + j2 * j.d[2]]
                                        acc += <double>v * v
                                elif p_exp == 1.0:
                                    for j2 in range(lo2, hi2):
                                        acc += fabs(r1[st2 + j2 * j.d[2]])
                                else:
                                    for j2 in range(lo2, hi2):
                                        acc += pow(fabs(r1[st2 + j2 * j.d[2]]), p_exp)
                        if j.mode == 1:
                            if j.include_pad:
                                count = c0 * c1 * c2
                            else:
                                count = (hi0 - lo0) * (hi1 - lo1) * (hi2 - lo2)
                            yp[oi] = <float>(acc / count) if count > 0 else 0.0
                        elif p_exp == 2.0:
                            yp[oi] = <float>sqrt(acc)
                        elif p_exp == 1.0:
                            yp[oi] = <float>acc
                        else:
                            yp[oi] = <float>pow(acc, inv_p)
                    oi += 1
    free(accbuf)


cdef void _pool_task(void* ctx, long t) noexcept nogil:
    cdef _Job* j = <_Job*>ctx
    cdef Py_ssize_t p0 = t * j.chunk, p1 = p0 + j.chunk
    _pool_planes(j, p0, p1 if p1 < j.planes else j.planes)


cdef list _ints(object seq, Py_ssize_t n, str name, Py_ssize_t least):
    cdef list v = [int(i) for i in seq]
    if len(v) != n:
        raise KernelError(f"pool_nd: {name} {v} must have {n} values")
    for i in v:
        if i < least:
            raise KernelError(f"pool_nd: {name} {v} must be >= {least}")
    return v


def pool_nd(x, y, idx, int mode, kernel, strides, dilations, pad_begin, pad_end,
            bint include_pad=False, double p=2.0, int storage_order=0, num_threads=None):
    """One pooling window over each plane of ``x``: float32 ``[N, C, *spatial]`` with 1 to 3
    spatial axes, C-contiguous, into ``y`` (float32 ``[N, C, *out]``, ``out`` from the
    geometry) and, for MaxPool, ``idx`` (int64 of ``y``'s shape, or None).

    ``mode``: MODE_MAX, MODE_AVG (``include_pad``: count the padding taps) or MODE_LP
    (exponent ``p`` > 0). ``storage_order`` 1 makes the indices column-major over the
    spatial axes. Windows reaching past the input + ``pad_end`` (ceil_mode) are allowed.
    """
    cdef str k = "pool_nd"
    cdef cnp.ndarray xa = _arr(x, k, "x")
    cdef int nd = cnp.PyArray_NDIM(xa)
    if nd < 3 or nd > 5:
        raise KernelError(f"{k}: x must have rank 3 to 5, got shape {_shape(xa)}")
    xa = _f32(x, k, "x", nd)
    cdef cnp.ndarray ya = _f32(y, k, "y", nd, writable=True)
    cdef cnp.ndarray ia = None
    if mode not in (0, 1, 2):
        raise KernelError(f"{k}: mode must be MODE_MAX, MODE_AVG or MODE_LP, got {mode}")
    if mode == 2 and not p > 0.0:
        raise KernelError(f"{k}: p must be > 0, got {p}")
    if idx is not None:
        ia = _arr(idx, k, "idx")
        if mode != 0 or cnp.PyArray_TYPE(ia) != cnp.NPY_INT64 or not cnp.PyArray_IS_C_CONTIGUOUS(ia) \
                or not cnp.PyArray_ISWRITEABLE(ia):
            raise KernelError(f"{k}: idx must be a writable C-contiguous int64 array (MaxPool only)")
        _same_shape(ya, ia, k, "y", "idx")
    cdef Py_ssize_t n = nd - 2, lead = 3 - (nd - 2), a
    if xa.shape[0] != ya.shape[0] or xa.shape[1] != ya.shape[1]:
        raise KernelError(f"{k}: y has shape {_shape(ya)}, x has shape {_shape(xa)}")
    cdef list kv = _ints(kernel, n, "kernel", 1), sv = _ints(strides, n, "strides", 1)
    cdef list dv = _ints(dilations, n, "dilations", 1)
    cdef list bv = _ints(pad_begin, n, "pad_begin", 0), ev = _ints(pad_end, n, "pad_end", 0)
    cdef _Job job
    for a in range(3):
        if a < lead:
            job.inp[a] = job.out[a] = job.k[a] = job.s[a] = job.d[a] = 1
            job.pb[a] = job.pe[a] = 0
        else:
            job.inp[a] = xa.shape[2 + a - lead]
            job.out[a] = ya.shape[2 + a - lead]
            job.k[a] = kv[a - lead]
            job.s[a] = sv[a - lead]
            job.d[a] = dv[a - lead]
            job.pb[a] = bv[a - lead]
            job.pe[a] = ev[a - lead]
            # every window must start inside the input or its begin padding
            if job.out[a] > 0 and (job.out[a] - 1) * job.s[a] - job.pb[a] >= job.inp[a] and job.inp[a] > 0:
                raise KernelError(f"{k}: output axis {a - lead} of length {job.out[a]} starts a window past the input")
    if storage_order == 1:
        job.w[0], job.w[1], job.w[2] = 1, job.inp[0], job.inp[0] * job.inp[1]
    else:
        job.w[0], job.w[1], job.w[2] = job.inp[1] * job.inp[2], job.inp[2], 1
    job.x = <const float*>cnp.PyArray_DATA(xa)
    job.y = <float*>cnp.PyArray_DATA(ya)
    job.idx = <int64_t*>cnp.PyArray_DATA(ia) if ia is not None else NULL
    job.planes = xa.shape[0] * xa.shape[1]
    job.isz = job.inp[0] * job.inp[1] * job.inp[2]
    job.osz = job.out[0] * job.out[1] * job.out[2]
    job.mode = mode
    job.include_pad = include_pad
    job.p = p
    cdef int nt = _threads(num_threads, k)
    if job.planes == 0 or job.osz == 0:
        return y
    nt = _fit_threads(nt, job.planes, <double>job.planes * job.osz * job.k[0] * job.k[1] * job.k[2])
    job.chunk = _rows_per_task(job.planes, nt)
    with nogil:
        _run_row_tasks(_pool_task, &job, job.planes, job.chunk, nt)
    return y


ctypedef struct _GJob:
    const float* x
    float* y
    Py_ssize_t rows
    Py_ssize_t n
    Py_ssize_t chunk
    int mode
    double p


cdef void _global_rows(const _GJob* j, Py_ssize_t r0, Py_ssize_t r1) noexcept nogil:
    cdef Py_ssize_t r, i, n = j.n
    cdef const float* row
    cdef double acc
    cdef float v, best
    cdef bint nan
    for r in range(r0, r1):
        row = j.x + r * n
        if j.mode == 0:
            best = row[0]
            nan = best != best
            for i in range(1, n):
                v = row[i]
                if v > best:
                    best = v
                elif v != v:
                    nan = True
            j.y[r] = NAN if nan else best
            continue
        acc = 0.0
        if j.mode == 1:
            for i in range(n):
                acc += row[i]
            j.y[r] = <float>(acc / n) if n > 0 else NAN
        elif j.p == 2.0:
            for i in range(n):
                acc += <double>row[i] * row[i]
            j.y[r] = <float>sqrt(acc)
        elif j.p == 1.0:
            for i in range(n):
                acc += fabs(row[i])
            j.y[r] = <float>acc
        else:
            for i in range(n):
                acc += pow(fabs(row[i]), j.p)
            j.y[r] = <float>pow(acc, 1.0 / j.p)


cdef void _global_task(void* ctx, long t) noexcept nogil:
    cdef _GJob* j = <_GJob*>ctx
    cdef Py_ssize_t r0 = t * j.chunk, r1 = r0 + j.chunk
    _global_rows(j, r0, r1 if r1 < j.rows else j.rows)


def global_pool(x, y, int mode, double p=2.0, num_threads=None):
    """Reduce each row of ``x`` (float32 ``[rows, n]``, C-contiguous) into ``y`` (float32
    ``[rows]``): the maximum (NaN when the row holds one; ``n`` must be > 0), the mean
    (NaN for ``n == 0``) or ``(sum |x|**p) ** (1/p)``."""
    cdef str k = "global_pool"
    cdef cnp.ndarray xa = _f32(x, k, "x", 2)
    cdef cnp.ndarray ya = _f32(y, k, "y", 1, writable=True)
    if ya.shape[0] != xa.shape[0]:
        raise KernelError(f"{k}: y has {ya.shape[0]} rows, x has {xa.shape[0]}")
    if mode not in (0, 1, 2):
        raise KernelError(f"{k}: mode must be MODE_MAX, MODE_AVG or MODE_LP, got {mode}")
    if mode == 2 and not p > 0.0:
        raise KernelError(f"{k}: p must be > 0, got {p}")
    if mode == 0 and xa.shape[1] == 0 and xa.shape[0] > 0:
        raise KernelError(f"{k}: the maximum of an empty row is undefined")
    cdef _GJob job
    job.x = <const float*>cnp.PyArray_DATA(xa)
    job.y = <float*>cnp.PyArray_DATA(ya)
    job.rows = xa.shape[0]
    job.n = xa.shape[1]
    job.mode = mode
    job.p = p
    cdef int nt = _threads(num_threads, k)
    if job.rows == 0:
        return y
    nt = _fit_threads(nt, job.rows, <double>job.rows * job.n)
    job.chunk = _rows_per_task(job.rows, nt)
    with nogil:
        _run_row_tasks(_global_task, &job, job.rows, job.chunk, nt)
    return y
