# cython: boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""Separable float32 resampling of the last two axes.

``resize_planes`` resizes every ``[H, W]`` plane of a C-contiguous ``[P, H, W]`` float32
array into ``[P, OH, OW]`` from two precomputed tap tables, one per axis: output row
``oy`` is ``sum_k wy[oy, k] * x[iy[oy, k], :]`` (a row of the input width) and output
element ``ox`` of that row is ``sum_k wx[ox, k] * row[ix[ox, k]]``. The tables carry
everything the mode, the coordinate transformation, antialiasing and the edge rule
decide, so one call serves nearest, linear and cubic alike and any input size: the
caller builds the tables per call from the shapes it gets.

A one-tap axis whose weights are all 1 (nearest) copies values instead of multiplying,
so nearest resizing reproduces the input values bit for bit (NaN and infinities too).
"""
from libc.stdlib cimport malloc, free

import numpy as np

include "_common.pxi"

include "_pool_client.pxi"

__all__ = ["resize_planes"]


ctypedef struct _Job:
    const float* x
    float* out
    const int64_t* iy
    const float* wy
    const int64_t* ix
    const float* wx
    Py_ssize_t h, w, oh, ow, ky, kx
    Py_ssize_t rows      # P * OH output rows
    Py_ssize_t chunk
    bint copy_y          # one tap of weight 1 per output row
    bint copy_x          # one tap of weight 1 per output column
    int failed           # a task could not get its row buffer


cdef void _rows(_Job* j, Py_ssize_t r0, Py_ssize_t r1, float* tmp) noexcept nogil:
    """Output rows ``[r0, r1)`` of the flattened ``[P * OH]`` rows."""
    cdef Py_ssize_t r, p, oy, k, c, ox
    cdef const float* plane
    cdef const float* src
    cdef const float* row
    cdef const int64_t* ti
    cdef const float* tw
    cdef float* dst
    cdef float wk, acc
    for r in range(r0, r1):
        p = r // j.oh
        oy = r - p * j.oh
        plane = j.x + p * j.h * j.w
        if j.copy_y:
            row = plane + j.iy[oy] * j.w
        else:
            ti = j.iy + oy * j.ky
            tw = j.wy + oy * j.ky
            src = plane + ti[0] * j.w
            wk = tw[0]
            for c in range(j.w):
                tmp[c] = wk * src[c]
            for k in range(1, j.ky):
                wk = tw[k]
                if wk == 0.0:
                    continue
                src = plane + ti[k] * j.w
                for c in range(j.w):
                    tmp[c] += wk * src[c]
            row = tmp
        dst = j.out + r * j.ow
        if j.copy_x:
            for ox in range(j.ow):
                dst[ox] = row[j.ix[ox]]
        else:
            for ox in range(j.ow):
                ti = j.ix + ox * j.kx
                tw = j.wx + ox * j.kx
                acc = tw[0] * row[ti[0]]
                for k in range(1, j.kx):
                    acc += tw[k] * row[ti[k]]
                dst[ox] = acc


cdef void _task(void* ctx, long t) noexcept nogil:
    cdef _Job* j = <_Job*>ctx
    cdef Py_ssize_t r0 = t * j.chunk
    cdef Py_ssize_t r1 = r0 + j.chunk
    cdef float* tmp = NULL
    if r1 > j.rows:
        r1 = j.rows
    if not j.copy_y:
        tmp = <float*>malloc((j.w if j.w > 0 else 1) * sizeof(float))
        if tmp == NULL:
            j.failed = 1
            return
    _rows(j, r0, r1, tmp)
    free(tmp)


cdef cnp.ndarray _table(object a, object dt, str name, Py_ssize_t rows):
    cdef cnp.ndarray arr = _arr(a, "resize_planes", name)
    if arr.dtype != dt or cnp.PyArray_NDIM(arr) != 2 or not cnp.PyArray_IS_C_CONTIGUOUS(arr):
        raise KernelError(f"resize_planes: {name} must be a C-contiguous 2-D {dt} array")
    if cnp.PyArray_DIMS(arr)[0] != rows or cnp.PyArray_DIMS(arr)[1] < 1:
        raise KernelError(f"resize_planes: {name} has shape {_shape(arr)}, expected [{rows}, >=1]")
    return arr


def resize_planes(x, iy, wy, ix, wx, out, num_threads=None) -> None:
    """``out[p] = Ry @ x[p] @ Rx.T`` for the sparse resampling matrices the tap tables
    describe (``iy``/``ix`` int64 indices, ``wy``/``wx`` float32 weights, ``[OH, KY]`` and
    ``[OW, KX]``); ``x`` ``[P, H, W]`` and ``out`` ``[P, OH, OW]`` C-contiguous float32.
    Every index must lie in its axis (the caller clamps them)."""
    cdef cnp.ndarray xa = _f32(x, "resize_planes", "x", 3)
    cdef cnp.ndarray oa = _f32(out, "resize_planes", "out", 3, writable=True)
    cdef Py_ssize_t p = cnp.PyArray_DIMS(xa)[0], h = cnp.PyArray_DIMS(xa)[1], w = cnp.PyArray_DIMS(xa)[2]
    cdef Py_ssize_t oh = cnp.PyArray_DIMS(oa)[1], ow = cnp.PyArray_DIMS(oa)[2]
    if cnp.PyArray_DIMS(oa)[0] != p:
        raise KernelError(f"resize_planes: out has {cnp.PyArray_DIMS(oa)[0]} planes, x has {p}")
    cdef cnp.ndarray iya = _table(iy, np.dtype(np.int64), "iy", oh)
    cdef cnp.ndarray wya = _table(wy, np.dtype(np.float32), "wy", oh)
    cdef cnp.ndarray ixa = _table(ix, np.dtype(np.int64), "ix", ow)
    cdef cnp.ndarray wxa = _table(wx, np.dtype(np.float32), "wx", ow)
    if _shape(iya) != _shape(wya) or _shape(ixa) != _shape(wxa):
        raise KernelError("resize_planes: each index table must have its weight table's shape")
    if p * oh * ow == 0:
        return
    if h == 0 or w == 0:
        raise KernelError("resize_planes: an empty input axis cannot be resized to a non-empty one")
    if (<object>iya).min() < 0 or (<object>iya).max() >= h or (<object>ixa).min() < 0 or (<object>ixa).max() >= w:
        raise KernelError("resize_planes: a tap index lies outside its axis")
    cdef int nt = _threads(num_threads, "resize_planes")
    cdef _Job job
    job.x = <const float*>cnp.PyArray_DATA(xa)
    job.out = <float*>cnp.PyArray_DATA(oa)
    job.iy = <const int64_t*>cnp.PyArray_DATA(iya)
    job.wy = <const float*>cnp.PyArray_DATA(wya)
    job.ix = <const int64_t*>cnp.PyArray_DATA(ixa)
    job.wx = <const float*>cnp.PyArray_DATA(wxa)
    job.h, job.w, job.oh, job.ow = h, w, oh, ow
    job.ky = cnp.PyArray_DIMS(iya)[1]
    job.kx = cnp.PyArray_DIMS(ixa)[1]
    job.copy_y = job.ky == 1 and bool(((<object>wya) == 1.0).all())
    job.copy_x = job.kx == 1 and bool(((<object>wxa) == 1.0).all())
    job.rows = p * oh
    job.failed = 0
    cdef double work = <double>job.rows * (<double>w * job.ky + <double>ow * job.kx)
    nt = _fit_threads(nt, job.rows, work)
    with nogil:
        job.chunk = _rows_per_task(job.rows, nt)
        _run_row_tasks(_task, &job, job.rows, job.chunk, nt)
    if job.failed:
        raise MemoryError("resize_planes: no memory for a row buffer")
