# cython: boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""RMS normalization kernels along the last axis.

``rms_norm`` is SimplifiedLayerNormalization / RMSNormalization (opset 23) over
the last axis; ``skip_rms_norm`` is com.microsoft SkipSimplifiedLayerNormalization
(output 0 and the ``input + skip (+ bias)`` sum, output 3). Rows are the flattened
leading axes: callers pass ``x.reshape(-1, hidden)``. float32 only.
"""
from cython.parallel cimport prange
from libc.math cimport sqrtf

include "_common.pxi"

__all__ = ["rms_norm", "skip_rms_norm"]


cdef inline void _normalize_row(float* row, const float* w, Py_ssize_t h, float eps) noexcept nogil:
    cdef float ms = of_dot(row, row, h) / <float>h
    cdef float inv = 1.0 / sqrtf(ms + eps)
    cdef Py_ssize_t j
    for j in range(h):
        row[j] = row[j] * inv * w[j]


cdef inline void _normalize_into(const float* src, float* dst, const float* w, Py_ssize_t h,
                                 float eps) noexcept nogil:
    cdef float ms = of_dot(src, src, h) / <float>h
    cdef float inv = 1.0 / sqrtf(ms + eps)
    cdef Py_ssize_t j
    for j in range(h):
        dst[j] = src[j] * inv * w[j]


def rms_norm(x, weight, float eps, out, num_threads=None):
    """``out[r, :] = x[r, :] / sqrt(mean(x[r, :]**2) + eps) * weight``.

    x, out: float32 [rows, hidden] C-contiguous (``out`` may be ``x``);
    weight: float32 [hidden]. Parallel over rows.
    """
    cdef str k = "rms_norm"
    cdef cnp.ndarray xa = _f32(x, k, "x", 2)
    cdef cnp.ndarray wa = _f32(weight, k, "weight", 1)
    cdef cnp.ndarray oa = _f32(out, k, "out", 2, writable=True)
    _same_shape(xa, oa, k, "x", "out")
    if wa.shape[0] != xa.shape[1]:
        raise KernelError(f"{k}: weight has {wa.shape[0]} elements, x's last axis is {xa.shape[1]}")
    if not eps >= 0.0:
        raise KernelError(f"{k}: eps must be >= 0, got {eps}")
    cdef int nt = _threads(num_threads, k)
    cdef const float[:, ::1] xv = xa
    cdef const float[::1] wv = wa
    cdef float[:, ::1] ov = oa
    cdef Py_ssize_t rows = xv.shape[0], h = xv.shape[1], r
    if rows == 0 or h == 0:
        return out
    nt = _fit_threads(nt, rows, 3.0 * rows * h)
    with nogil:
        for r in prange(rows, num_threads=nt, schedule="static"):
            _normalize_into(&xv[r, 0], &ov[r, 0], &wv[0], h, eps)
    return out


def skip_rms_norm(x, skip, bias, weight, float eps, out, sum_out=None, num_threads=None):
    """SkipSimplifiedLayerNormalization: ``s = x + skip (+ bias)``, ``out = rms_norm(s)``.

    x, out, sum_out: float32 [rows, hidden]; skip: float32 [rows, hidden] or
    [r, hidden] with ``rows % r == 0`` (row i reads ``skip[i % r]``, the
    operator's broadcast over batch); bias: float32 [hidden] or None; weight:
    float32 [hidden]. ``sum_out`` (output 3) receives ``s`` when given. ``out``
    and ``sum_out`` may alias ``x`` or each other's input rows (same index).
    """
    cdef str k = "skip_rms_norm"
    cdef cnp.ndarray xa = _f32(x, k, "x", 2)
    cdef cnp.ndarray sa = _f32(skip, k, "skip", 2)
    cdef cnp.ndarray wa = _f32(weight, k, "weight", 1)
    cdef cnp.ndarray oa = _f32(out, k, "out", 2, writable=True)
    cdef cnp.ndarray ba = None
    cdef cnp.ndarray soa = None
    _same_shape(xa, oa, k, "x", "out")
    cdef Py_ssize_t rows = xa.shape[0], h = xa.shape[1]
    if sa.shape[1] != h:
        raise KernelError(f"{k}: skip has shape {_shape(sa)}, x has shape {_shape(xa)}")
    cdef Py_ssize_t srows = sa.shape[0]
    if (srows == 0 and rows != 0) or (srows != 0 and rows % srows != 0):
        raise KernelError(f"{k}: skip has {srows} rows, which does not divide x's {rows} rows")
    if wa.shape[0] != h:
        raise KernelError(f"{k}: weight has {wa.shape[0]} elements, x's last axis is {h}")
    if bias is not None:
        ba = _f32(bias, k, "bias", 1)
        if ba.shape[0] != h:
            raise KernelError(f"{k}: bias has {ba.shape[0]} elements, x's last axis is {h}")
    if sum_out is not None:
        soa = _f32(sum_out, k, "sum_out", 2, writable=True)
        _same_shape(xa, soa, k, "x", "sum_out")
    if not eps >= 0.0:
        raise KernelError(f"{k}: eps must be >= 0, got {eps}")
    cdef int nt = _threads(num_threads, k)
    if rows == 0 or h == 0:
        return out
    nt = _fit_threads(nt, rows, 4.0 * rows * h)
    cdef const float[:, ::1] xv = xa
    cdef const float[:, ::1] sv = sa
    cdef const float[::1] wv = wa
    cdef float[:, ::1] ov = oa
    cdef const float[::1] bv
    cdef float[:, ::1] sov
    cdef const float* bp = NULL
    cdef bint has_sum = soa is not None
    if ba is not None:
        bv = ba
        bp = &bv[0]
    if has_sum:
        sov = soa
    cdef Py_ssize_t r, j
    cdef float* dst
    cdef const float* xr
    cdef const float* sr
    with nogil:
        for r in prange(rows, num_threads=nt, schedule="static"):
            xr = &xv[r, 0]
            sr = &sv[r % srows, 0]
            dst = &sov[r, 0] if has_sum else &ov[r, 0]
            if bp != NULL:
                for j in range(h):
                    dst[j] = xr[j] + sr[j] + bp[j]
            else:
                for j in range(h):
                    dst[j] = xr[j] + sr[j]
            if has_sum:
                _normalize_into(dst, &ov[r, 0], &wv[0], h, eps)
            else:
                _normalize_row(dst, &wv[0], h, eps)
    return out
