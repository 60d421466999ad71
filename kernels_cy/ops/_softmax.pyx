# cython: boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""Numerically stable softmax over the last axis (rows are the flattened leading axes),
and the logistic sigmoid."""
from libc.math cimport INFINITY, NAN, exp, isnan

include "_common.pxi"

include "_pool_client.pxi"

__all__ = ["sigmoid", "softmax"]


cdef inline void _softmax_row(const float* x, float* y, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t j
    cdef float m = -INFINITY
    cdef bint nan = False
    for j in range(n):
        if x[j] > m:
            m = x[j]
        elif isnan(x[j]):
            nan = True
        y[j] = x[j]
    if nan or m == INFINITY:
        # x - max is NaN somewhere (a NaN entry, or inf - inf): the sum and so every entry
        # of the row is NaN in onnx.reference and onnxruntime; the clamped exp would hide it
        for j in range(n):
            y[j] = NAN
        return
    if m == -INFINITY:
        # every entry is -inf: onnxruntime and onnx.reference give NaN rows; keep that
        for j in range(n):
            y[j] = y[j] - m
        return
    cdef float total = of_expsum(y, m, n)
    of_scal(y, 1.0 / total, n)


ctypedef struct _SoftmaxJob:
    const float* x
    float* y
    Py_ssize_t rows
    Py_ssize_t n
    Py_ssize_t chunk


cdef void _softmax_task(void* ctx, long t) noexcept nogil:
    """Rows ``[t * chunk, (t + 1) * chunk)``."""
    cdef _SoftmaxJob* j = <_SoftmaxJob*>ctx
    cdef Py_ssize_t r = t * j.chunk, r1 = r + j.chunk
    if r1 > j.rows:
        r1 = j.rows
    while r < r1:
        _softmax_row(j.x + r * j.n, j.y + r * j.n, j.n)
        r += 1


def softmax(x, out, num_threads=None):
    """``out[r, :] = exp(x[r, :] - max) / sum(exp(x[r, :] - max))``.

    x, out: float32 [rows, n] C-contiguous; ``out`` may be ``x``. Parallel over rows.
    """
    cdef str k = "softmax"
    cdef cnp.ndarray xa = _f32(x, k, "x", 2)
    cdef cnp.ndarray oa = _f32(out, k, "out", 2, writable=True)
    _same_shape(xa, oa, k, "x", "out")
    cdef int nt = _threads(num_threads, k)
    cdef Py_ssize_t rows = xa.shape[0], n = xa.shape[1]
    if rows == 0 or n == 0:
        return out
    nt = _fit_threads(nt, rows, 20.0 * rows * n)
    cdef _SoftmaxJob job
    job.x = <const float*>cnp.PyArray_DATA(xa)
    job.y = <float*>cnp.PyArray_DATA(oa)
    job.rows = rows
    job.n = n
    job.chunk = _rows_per_task(rows, nt)
    with nogil:
        _run_row_tasks(_softmax_task, &job, rows, job.chunk, nt)
    return out


def sigmoid(x, out):
    """``out = 1 / (1 + exp(-x))`` elementwise; x, out: float32 1-D C-contiguous (``out`` may
    be ``x``). Saturates to 0 and 1 without floating-point warnings; NaN stays NaN."""
    cdef str k = "sigmoid"
    cdef cnp.ndarray xa = _f32(x, k, "x", 1)
    cdef cnp.ndarray oa = _f32(out, k, "out", 1, writable=True)
    _same_shape(xa, oa, k, "x", "out")
    cdef const float* xp = <const float*>cnp.PyArray_DATA(xa)
    cdef float* op = <float*>cnp.PyArray_DATA(oa)
    cdef Py_ssize_t i, n = xa.shape[0]
    cdef bint nan = False
    with nogil:
        for i in range(n):
            if isnan(xp[i]):
                nan = True
                break
        if not nan:
            of_sigmoid(xp, op, n)
        else:  # rare: elementwise in double (the vector exp clamps its argument, eating NaN)
            for i in range(n):
                op[i] = <float>(1.0 / (1.0 + exp(-<double>xp[i])))
    return out
