# cython: boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""The error function and the exact (erf) Gelu over a flat float32 or float64 array.

One C library call per element in a ``nogil`` loop (``erff`` for float32 Erf, ``erf`` in
double for float64 Erf; Gelu as ``x / 2 * erfc(-x / sqrt(2))`` in double for both types, so
it rounds once and keeps its relative accuracy for negative x, where ``1 + erf`` would
cancel); large arrays run in blocks on the shared worker pool."""
from libc.math cimport M_SQRT1_2, erf, erfc, erff

include "_common.pxi"

include "_pool_client.pxi"

__all__ = ["erf_flat", "gelu_flat"]

# elements per pool task: large enough that claiming a task costs nothing beside it
DEF _BLOCK = 16384


ctypedef struct _Job:
    const void* x
    void* y
    Py_ssize_t n
    Py_ssize_t chunk
    int kind  # 0 erf f32, 1 erf f64, 2 gelu f32, 3 gelu f64


cdef void _task(void* ctx, long t) noexcept nogil:
    """Elements ``[t * chunk, (t + 1) * chunk)`` of the job."""
    cdef _Job* j = <_Job*>ctx
    cdef Py_ssize_t i = t * j.chunk, i1 = i + j.chunk
    cdef const float* xf = <const float*>j.x
    cdef float* yf = <float*>j.y
    cdef const double* xd = <const double*>j.x
    cdef double* yd = <double*>j.y
    cdef double v
    if i1 > j.n:
        i1 = j.n
    if j.kind == 0:
        while i < i1:
            yf[i] = erff(xf[i])
            i += 1
    elif j.kind == 1:
        while i < i1:
            yd[i] = erf(xd[i])
            i += 1
    elif j.kind == 2:
        while i < i1:
            v = xf[i]
            yf[i] = <float>(0.5 * v * erfc(-v * M_SQRT1_2))
            i += 1
    else:
        while i < i1:
            v = xd[i]
            yd[i] = 0.5 * v * erfc(-v * M_SQRT1_2)
            i += 1


cdef object _run(object x, object out, int kind_f32, object num_threads, str k):
    cdef cnp.ndarray xa = _arr(x, k, "x")
    cdef cnp.ndarray oa = _arr(out, k, "out")
    cdef int t = cnp.PyArray_TYPE(xa)
    if t != cnp.NPY_FLOAT32 and t != cnp.NPY_FLOAT64:
        raise KernelDtypeError(f"{k}: x must be float32 or float64, got {xa.dtype}")
    if cnp.PyArray_TYPE(oa) != t:
        raise KernelDtypeError(f"{k}: out must have x's dtype {xa.dtype}, got {oa.dtype}")
    if cnp.PyArray_NDIM(xa) != 1 or cnp.PyArray_NDIM(oa) != 1:
        raise KernelError(f"{k}: x and out must be 1-D")
    if not cnp.PyArray_IS_C_CONTIGUOUS(xa) or not cnp.PyArray_IS_C_CONTIGUOUS(oa):
        raise KernelError(f"{k}: x and out must be C-contiguous")
    if not cnp.PyArray_ISWRITEABLE(oa):
        raise KernelError(f"{k}: out is read-only")
    _same_shape(xa, oa, k, "x", "out")
    cdef int nt = _threads(num_threads, k)
    cdef Py_ssize_t n = xa.shape[0]
    if n == 0:
        return out
    cdef _Job job
    job.x = cnp.PyArray_DATA(xa)
    job.y = cnp.PyArray_DATA(oa)
    job.n = n
    job.kind = kind_f32 + (0 if t == cnp.NPY_FLOAT32 else 1)
    cdef Py_ssize_t blocks = (n + _BLOCK - 1) // _BLOCK
    nt = _fit_threads(nt, blocks, 20.0 * n)
    job.chunk = _BLOCK if nt > 1 else n
    with nogil:
        _run_row_tasks(_task, &job, n, job.chunk, nt)
    return out


def erf_flat(x, out, num_threads=None):
    """``out = erf(x)``; x, out: 1-D C-contiguous, both float32 or both float64 (``out``
    may be ``x``). NaN stays NaN, erf(+-inf) = +-1."""
    return _run(x, out, 0, num_threads, "erf")


def gelu_flat(x, out, num_threads=None):
    """``out = x / 2 * (1 + erf(x / sqrt(2)))``, computed as ``x / 2 * erfc(-x / sqrt(2))`` in
    double and rounded once; x, out
    as for :func:`erf_flat`."""
    return _run(x, out, 2, num_threads, "gelu")
