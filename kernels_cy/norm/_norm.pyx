# cython: boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""Normalization kernels: RMS normalization along the last axis, and the per-channel
BatchNormalization (inference) and InstanceNormalization over ``[N, C, S]`` planes.

``rms_norm`` is SimplifiedLayerNormalization / RMSNormalization (opset 23) over
the last axis; ``skip_rms_norm`` is com.microsoft SkipSimplifiedLayerNormalization
(output 0 and the ``input + skip (+ bias)`` sum, output 3). Rows are the flattened
leading axes: callers pass ``x.reshape(-1, hidden)``. float32 only.
"""
from libc.math cimport sqrt, sqrtf

include "_common.pxi"

include "_pool_client.pxi"

__all__ = ["RowNorm", "SkipRowNorm", "channel_affine", "instance_norm", "rms_norm", "skip_rms_norm"]


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


ctypedef struct _NormJob:
    const float* x
    const float* skip      # NULL: plain normalization of x
    const float* bias      # or NULL
    const float* w
    float* out
    float* sum_out         # or NULL: the sum is formed in ``out`` and normalized there
    Py_ssize_t rows
    Py_ssize_t srows       # skip row i is ``skip[i % srows]``
    Py_ssize_t h
    Py_ssize_t chunk
    float eps


cdef void _norm_rows(const _NormJob* j, Py_ssize_t r0, Py_ssize_t r1) noexcept nogil:
    """Rows ``[r0, r1)``: ``out = rms_norm(x (+ skip + bias))``, the sum into ``sum_out``."""
    cdef Py_ssize_t r, k, h = j.h
    cdef const float* xr
    cdef const float* sr
    cdef float* dst
    for r in range(r0, r1):
        xr = j.x + r * h
        if j.skip == NULL:
            _normalize_into(xr, j.out + r * h, j.w, h, j.eps)
            continue
        sr = j.skip + (r % j.srows) * h
        dst = (j.sum_out + r * h) if j.sum_out != NULL else (j.out + r * h)
        if j.bias != NULL:
            for k in range(h):
                dst[k] = xr[k] + sr[k] + j.bias[k]
        else:
            for k in range(h):
                dst[k] = xr[k] + sr[k]
        if j.sum_out != NULL:
            _normalize_into(dst, j.out + r * h, j.w, h, j.eps)
        else:
            _normalize_row(dst, j.w, h, j.eps)


cdef void _norm_task(void* ctx, long t) noexcept nogil:
    cdef _NormJob* j = <_NormJob*>ctx
    cdef Py_ssize_t r0 = t * j.chunk, r1 = r0 + j.chunk
    _norm_rows(j, r0, r1 if r1 < j.rows else j.rows)


cdef void _run_norm(_NormJob* job, int nt) noexcept nogil:
    job.chunk = _rows_per_task(job.rows, nt)
    _run_row_tasks(_norm_task, job, job.rows, job.chunk, nt)


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
    cdef Py_ssize_t rows = xa.shape[0], h = xa.shape[1]
    if rows == 0 or h == 0:
        return out
    nt = _fit_threads(nt, rows, 3.0 * rows * h)
    cdef _NormJob job
    job.x = <const float*>cnp.PyArray_DATA(xa)
    job.skip = NULL
    job.bias = NULL
    job.w = <const float*>cnp.PyArray_DATA(wa)
    job.out = <float*>cnp.PyArray_DATA(oa)
    job.sum_out = NULL
    job.rows = rows
    job.srows = 1
    job.h = h
    job.eps = eps
    with nogil:
        _run_norm(&job, nt)
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
    cdef _NormJob job
    job.x = <const float*>cnp.PyArray_DATA(xa)
    job.skip = <const float*>cnp.PyArray_DATA(sa)
    job.bias = <const float*>cnp.PyArray_DATA(ba) if ba is not None else NULL
    job.w = <const float*>cnp.PyArray_DATA(wa)
    job.out = <float*>cnp.PyArray_DATA(oa)
    job.sum_out = <float*>cnp.PyArray_DATA(soa) if soa is not None else NULL
    job.rows = rows
    job.srows = srows
    job.h = h
    job.eps = eps
    with nogil:
        _run_norm(&job, nt)
    return out


cdef inline bint _rows_ok(object x, object w, Py_ssize_t* rows, Py_ssize_t* h) noexcept:
    """float32 C-contiguous x (rank >= 1, not empty) and a 1-D float32 weight of its last axis."""
    cdef cnp.ndarray xa, wa
    if not (cnp.PyArray_Check(x) and cnp.PyArray_Check(w)):
        return False
    xa = <cnp.ndarray>x
    wa = <cnp.ndarray>w
    if (cnp.PyArray_NDIM(xa) < 1 or cnp.PyArray_TYPE(xa) != cnp.NPY_FLOAT32 or not cnp.PyArray_IS_C_CONTIGUOUS(xa)
            or cnp.PyArray_NDIM(wa) != 1 or cnp.PyArray_TYPE(wa) != cnp.NPY_FLOAT32
            or not cnp.PyArray_IS_C_CONTIGUOUS(wa)):
        return False
    h[0] = xa.shape[cnp.PyArray_NDIM(xa) - 1]
    if h[0] == 0 or wa.shape[0] != h[0]:
        return False
    rows[0] = cnp.PyArray_SIZE(xa) // h[0]
    return True


cdef class RowNorm:
    """A one-output SimplifiedLayerNormalization / RMSNormalization over the last axis as a
    kernel's call: float32 operands are normalized here with no Python in between (one
    thread: a decode step has one row); any other operands go to ``fallback(x, scale)``."""

    cdef float eps
    cdef object fallback

    def __init__(self, float eps, fallback):
        if not eps >= 0.0:
            raise KernelError(f"rms_norm: eps must be >= 0, got {eps}")
        self.eps = eps
        self.fallback = fallback

    def __call__(self, x, scale):
        cdef Py_ssize_t rows, h, r
        if not _rows_ok(x, scale, &rows, &h):
            return self.fallback(x, scale)
        cdef cnp.ndarray xa = <cnp.ndarray>x
        cdef cnp.ndarray out = cnp.PyArray_EMPTY(cnp.PyArray_NDIM(xa), cnp.PyArray_DIMS(xa), cnp.NPY_FLOAT32, 0)
        cdef const float* xp = <const float*>cnp.PyArray_DATA(xa)
        cdef const float* wp = <const float*>cnp.PyArray_DATA(<cnp.ndarray>scale)
        cdef float* op = <float*>cnp.PyArray_DATA(out)
        with nogil:
            for r in range(rows):
                _normalize_into(xp + r * h, op + r * h, wp, h, self.eps)
        return out


cdef class SkipRowNorm:
    """SkipSimplifiedLayerNormalization with outputs 0 (and 3, the sum) as a kernel's call:
    float32 x and skip of one shape, float32 gamma (and bias) of the last axis run here;
    anything else goes to ``fallback(x, skip, gamma, bias)``."""

    cdef float eps
    cdef int n_out
    cdef object fallback

    def __init__(self, float eps, int n_out, fallback):
        if not eps >= 0.0:
            raise KernelError(f"skip_rms_norm: eps must be >= 0, got {eps}")
        if n_out not in (1, 4):
            raise KernelError(f"skip_rms_norm: 1 or 4 outputs, got {n_out}")
        self.eps = eps
        self.n_out = n_out
        self.fallback = fallback

    def __call__(self, x, skip, gamma, bias=None):
        cdef Py_ssize_t rows, h
        cdef cnp.ndarray xa, sa, ba
        if not _rows_ok(x, gamma, &rows, &h) or not cnp.PyArray_Check(skip):
            return self.fallback(x, skip, gamma, bias)
        xa = <cnp.ndarray>x
        sa = <cnp.ndarray>skip
        if (cnp.PyArray_TYPE(sa) != cnp.NPY_FLOAT32 or not cnp.PyArray_IS_C_CONTIGUOUS(sa)
                or not cnp.PyArray_SAMESHAPE(xa, sa)):
            return self.fallback(x, skip, gamma, bias)
        cdef const float* bp = NULL
        if bias is not None:
            if not cnp.PyArray_Check(bias):
                return self.fallback(x, skip, gamma, bias)
            ba = <cnp.ndarray>bias
            if (cnp.PyArray_TYPE(ba) != cnp.NPY_FLOAT32 or cnp.PyArray_NDIM(ba) != 1 or ba.shape[0] != h
                    or not cnp.PyArray_IS_C_CONTIGUOUS(ba)):
                return self.fallback(x, skip, gamma, bias)
            bp = <const float*>cnp.PyArray_DATA(ba)
        cdef int nd = cnp.PyArray_NDIM(xa)
        cdef cnp.ndarray out = cnp.PyArray_EMPTY(nd, cnp.PyArray_DIMS(xa), cnp.NPY_FLOAT32, 0)
        cdef cnp.ndarray total = None
        cdef float* tp = NULL
        if self.n_out == 4:
            total = cnp.PyArray_EMPTY(nd, cnp.PyArray_DIMS(xa), cnp.NPY_FLOAT32, 0)
            tp = <float*>cnp.PyArray_DATA(total)
        cdef _NormJob job
        job.x = <const float*>cnp.PyArray_DATA(xa)
        job.skip = <const float*>cnp.PyArray_DATA(sa)
        job.bias = bp
        job.w = <const float*>cnp.PyArray_DATA(<cnp.ndarray>gamma)
        job.out = <float*>cnp.PyArray_DATA(out)
        job.sum_out = tp
        job.rows = rows
        job.srows = rows
        job.h = h
        job.eps = self.eps
        with nogil:
            _norm_rows(&job, 0, rows)
        if self.n_out == 1:
            return out
        cdef cnp.npy_intp zero = 0
        return (out, cnp.PyArray_EMPTY(1, &zero, cnp.NPY_FLOAT32, 0),
                cnp.PyArray_EMPTY(1, &zero, cnp.NPY_FLOAT32, 0), total)



ctypedef struct _ChanJob:
    const float* x
    float* y
    const float* mean      # per channel (BatchNormalization), or NULL: each plane's own (instance)
    const float* scale     # per channel
    const float* bias      # per channel
    Py_ssize_t planes
    Py_ssize_t channels
    Py_ssize_t size        # elements per plane
    Py_ssize_t chunk
    double eps


cdef void _chan_planes(const _ChanJob* j, Py_ssize_t p0, Py_ssize_t p1) noexcept nogil:
    """Planes ``[p0, p1)`` of ``[N * C, S]``: ``y = (x - m) * s + b`` with the channel's
    ``m = mean[c]``, ``s = scale[c]`` (BatchNormalization: the caller folded
    ``1 / sqrt(var + eps)`` into it), or the plane's own mean and
    ``s = scale[c] / sqrt(var + eps)`` (InstanceNormalization; moments in double)."""
    cdef Py_ssize_t p, i, c, n = j.size
    cdef const float* xp
    cdef float* yp
    cdef double sum, dv, var
    cdef float m, s, b
    for p in range(p0, p1):
        c = p % j.channels
        xp = j.x + p * n
        yp = j.y + p * n
        if j.mean != NULL:
            m = j.mean[c]
            s = j.scale[c]
        else:
            sum = 0.0
            for i in range(n):
                sum += xp[i]
            sum = sum / n if n > 0 else 0.0
            var = 0.0
            for i in range(n):
                dv = xp[i] - sum
                var += dv * dv
            var = var / n if n > 0 else 0.0
            m = <float>sum
            s = <float>(j.scale[c] / sqrt(var + j.eps))
        b = j.bias[c]
        for i in range(n):
            yp[i] = (xp[i] - m) * s + b


cdef void _chan_task(void* ctx, long t) noexcept nogil:
    cdef _ChanJob* j = <_ChanJob*>ctx
    cdef Py_ssize_t p0 = t * j.chunk, p1 = p0 + j.chunk
    _chan_planes(j, p0, p1 if p1 < j.planes else j.planes)


cdef void _chan_run(object x, object mean, object scale, object bias, double eps, object out,
                    object num_threads, str k) except *:
    cdef cnp.ndarray xa = _f32(x, k, "x", 3)
    cdef cnp.ndarray oa = _f32(out, k, "out", 3, writable=True)
    cdef cnp.ndarray sa = _f32(scale, k, "scale", 1)
    cdef cnp.ndarray ba = _f32(bias, k, "bias", 1)
    cdef cnp.ndarray ma = None
    _same_shape(xa, oa, k, "x", "out")
    cdef Py_ssize_t C = xa.shape[1]
    if mean is not None:
        ma = _f32(mean, k, "mean", 1)
        if ma.shape[0] != C:
            raise KernelError(f"{k}: mean has {ma.shape[0]} elements, x has {C} channels")
    if sa.shape[0] != C or ba.shape[0] != C:
        raise KernelError(f"{k}: scale {_shape(sa)} and bias {_shape(ba)} must have x's {C} channels")
    if not eps >= 0.0:
        raise KernelError(f"{k}: eps must be >= 0, got {eps}")
    cdef int nt = _threads(num_threads, k)
    cdef _ChanJob job
    job.x = <const float*>cnp.PyArray_DATA(xa)
    job.y = <float*>cnp.PyArray_DATA(oa)
    job.mean = <const float*>cnp.PyArray_DATA(ma) if ma is not None else NULL
    job.scale = <const float*>cnp.PyArray_DATA(sa)
    job.bias = <const float*>cnp.PyArray_DATA(ba)
    job.planes = xa.shape[0] * C
    job.channels = C
    job.size = xa.shape[2]
    job.eps = eps
    if job.planes == 0 or job.size == 0:
        return
    nt = _fit_threads(nt, job.planes, (2.0 if ma is not None else 5.0) * job.planes * job.size)
    job.chunk = _rows_per_task(job.planes, nt)
    with nogil:
        _run_row_tasks(_chan_task, &job, job.planes, job.chunk, nt)


def channel_affine(x, mean, scale, bias, out, num_threads=None):
    """BatchNormalization's inference form with the variance folded into ``scale``:
    ``out[n, c, :] = (x[n, c, :] - mean[c]) * scale[c] + bias[c]``.

    x, out: float32 [N, C, S] C-contiguous (``out`` may be ``x``); mean, scale, bias:
    float32 [C]. Parallel over the ``N * C`` planes.
    """
    _chan_run(x, mean, scale, bias, 0.0, out, num_threads, "channel_affine")
    return out


def instance_norm(x, scale, bias, double eps, out, num_threads=None):
    """InstanceNormalization: each plane ``x[n, c, :]`` normalized by its own mean and
    (biased) variance, ``out = (x - mean) / sqrt(var + eps) * scale[c] + bias[c]``.

    x, out: float32 [N, C, S] C-contiguous (``out`` may be ``x``); scale, bias: float32
    [C]. Parallel over the ``N * C`` planes.
    """
    _chan_run(x, None, scale, bias, eps, out, num_threads, "instance_norm")
    return out
