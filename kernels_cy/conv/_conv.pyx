# cython: boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""Compiled cores of the convolution kernels, float32, over 3-D spatial geometry.

1-D and 2-D convolutions are 3-D ones with leading spatial extents of 1 (kernel 1,
stride 1, dilation 1, no padding), so one set of loops serves every rank:

* ``im2col``: the patch matrix of one image's channel slab for a band of output rows
  (a row is one ``(od, oh)`` pair, ``oW`` outputs), which a BLAS product with the
  weights turns into that band of outputs (Conv);
* ``col2im``: the scatter-add back of the column matrix a BLAS product of the
  transposed weights with one band of input rows gives (ConvTranspose);
* ``depthwise``: a direct loop for group == channels (one input channel per output
  plane), where a product would be a matrix-vector one per plane.

Every loop runs on the backend's pool (``_pool_client.pxi``) over independent rows or
planes; the geometry comes per call, so one plan serves any input size.
"""
from libc.string cimport memcpy, memset

include "_common.pxi"

include "_pool_client.pxi"

__all__ = ["col2im", "depthwise", "im2col"]


ctypedef struct _Geom:
    # input extents, output extents, kernel, strides, dilations, leading pads (3-D)
    Py_ssize_t C, D, H, W
    Py_ssize_t oD, oH, oW
    Py_ssize_t kd, kh, kw
    Py_ssize_t sd, sh, sw
    Py_ssize_t dd, dh, dw
    Py_ssize_t pd, ph, pw


cdef inline void _span(Py_ssize_t base, Py_ssize_t s, Py_ssize_t n_in, Py_ssize_t n_out,
                       Py_ssize_t* lo, Py_ssize_t* hi) noexcept nogil:
    """The outputs ``o`` in ``[lo, hi)`` of ``[0, n_out)`` whose input ``o * s + base`` lies in
    ``[0, n_in)`` (s >= 1)."""
    cdef Py_ssize_t a = 0, b, t
    if base < 0:
        a = (-base + s - 1) // s
    t = n_in - 1 - base
    b = 0 if t < 0 else t // s + 1
    if b > n_out:
        b = n_out
    if a > b:
        a = b
    lo[0] = a
    hi[0] = b


ctypedef struct _ColJob:
    const float* x         # [C, D, H, W]
    float* col             # [C * kd * kh * kw, (r1 - r0) * oW]
    _Geom g
    Py_ssize_t r0, r1      # output rows (od * oH + oh) of the band
    Py_ssize_t rows        # col rows
    Py_ssize_t chunk


cdef void _col_rows(const _ColJob* j, Py_ssize_t q0, Py_ssize_t q1) noexcept nogil:
    cdef const _Geom* g = &j.g
    cdef Py_ssize_t K = g.kd * g.kh * g.kw, L = (j.r1 - j.r0) * g.oW
    cdef Py_ssize_t q, c, rem, a, b, e, r, od, oh, idd, ih, base, lo, hi, ow
    cdef float* dst
    cdef const float* src
    for q in range(q0, q1):
        c = q // K
        rem = q - c * K
        a = rem // (g.kh * g.kw)
        rem = rem - a * g.kh * g.kw
        b = rem // g.kw
        e = rem - b * g.kw
        base = e * g.dw - g.pw
        _span(base, g.sw, g.W, g.oW, &lo, &hi)
        for r in range(j.r0, j.r1):
            dst = j.col + q * L + (r - j.r0) * g.oW
            od = r // g.oH
            oh = r - od * g.oH
            idd = od * g.sd - g.pd + a * g.dd
            ih = oh * g.sh - g.ph + b * g.dh
            if idd < 0 or idd >= g.D or ih < 0 or ih >= g.H or lo >= hi:
                memset(dst, 0, g.oW * sizeof(float))
                continue
            src = j.x + ((c * g.D + idd) * g.H + ih) * g.W
            if lo > 0:
                memset(dst, 0, lo * sizeof(float))
            if g.sw == 1:
                memcpy(dst + lo, src + lo + base, (hi - lo) * sizeof(float))
            else:
                for ow in range(lo, hi):
                    dst[ow] = src[ow * g.sw + base]
            if hi < g.oW:
                memset(dst + hi, 0, (g.oW - hi) * sizeof(float))


cdef void _col_task(void* ctx, long t) noexcept nogil:
    cdef _ColJob* j = <_ColJob*>ctx
    cdef Py_ssize_t q0 = t * j.chunk, q1 = q0 + j.chunk
    _col_rows(j, q0, q1 if q1 < j.rows else j.rows)


ctypedef struct _ImJob:
    const float* col       # [M * kd * kh * kw, (r1 - r0) * iW]
    float* y               # [M, oD, oH, oW], accumulated into
    _Geom g                # C, D, H, W: the input (M output channels here)
    Py_ssize_t M
    Py_ssize_t r0, r1      # input rows (id * H + ih) of the band
    Py_ssize_t chunk


cdef void _im_planes(const _ImJob* j, Py_ssize_t m0, Py_ssize_t m1) noexcept nogil:
    cdef const _Geom* g = &j.g
    cdef Py_ssize_t K = g.kd * g.kh * g.kw, L = (j.r1 - j.r0) * g.W
    cdef Py_ssize_t m, k, a, b, e, r, idd, ih, od, oh, base, lo, hi, iw
    cdef const float* src
    cdef float* dst
    for m in range(m0, m1):
        for k in range(K):
            a = k // (g.kh * g.kw)
            b = (k // g.kw) - a * g.kh
            e = k - (a * g.kh + b) * g.kw
            base = e * g.dw - g.pw
            _span(base, g.sw, g.oW, g.W, &lo, &hi)  # inputs iw whose output lies in [0, oW)
            if lo >= hi:
                continue
            for r in range(j.r0, j.r1):
                idd = r // g.H
                ih = r - idd * g.H
                od = idd * g.sd - g.pd + a * g.dd
                oh = ih * g.sh - g.ph + b * g.dh
                if od < 0 or od >= g.oD or oh < 0 or oh >= g.oH:
                    continue
                src = j.col + (m * K + k) * L + (r - j.r0) * g.W
                dst = j.y + ((m * g.oD + od) * g.oH + oh) * g.oW
                if g.sw == 1:
                    of_axpy(dst + lo + base, 1.0, src + lo, hi - lo)
                else:
                    for iw in range(lo, hi):
                        dst[iw * g.sw + base] += src[iw]


cdef void _im_task(void* ctx, long t) noexcept nogil:
    cdef _ImJob* j = <_ImJob*>ctx
    cdef Py_ssize_t m0 = t * j.chunk, m1 = m0 + j.chunk
    _im_planes(j, m0, m1 if m1 < j.M else j.M)


ctypedef struct _DwJob:
    const float* x         # [N, C, D, H, W]
    const float* w         # [C * mult, kd * kh * kw]
    const float* bias      # [C * mult] or NULL
    float* y               # [N, C * mult, oD, oH, oW]
    _Geom g
    Py_ssize_t mult
    Py_ssize_t planes      # N * C * mult
    Py_ssize_t chunk


cdef void _dw_planes(const _DwJob* j, Py_ssize_t p0, Py_ssize_t p1) noexcept nogil:
    cdef const _Geom* g = &j.g
    cdef Py_ssize_t K = g.kd * g.kh * g.kw, Cout = g.C * j.mult
    cdef Py_ssize_t oS = g.oD * g.oH * g.oW, iS = g.D * g.H * g.W
    cdef Py_ssize_t p, n, m, c, od, oh, a, b, e, idd, ih, base, lo, hi, ow, i
    cdef const float* xin
    cdef const float* wk
    cdef const float* src
    cdef float* yout
    cdef float* yrow
    cdef float wv, b0
    for p in range(p0, p1):
        n = p // Cout
        m = p - n * Cout
        c = m // j.mult
        xin = j.x + (n * g.C + c) * iS
        wk = j.w + m * K
        yout = j.y + p * oS
        b0 = j.bias[m] if j.bias != NULL else 0.0
        for i in range(oS):
            yout[i] = b0
        for od in range(g.oD):
            for oh in range(g.oH):
                yrow = yout + (od * g.oH + oh) * g.oW
                for a in range(g.kd):
                    idd = od * g.sd - g.pd + a * g.dd
                    if idd < 0 or idd >= g.D:
                        continue
                    for b in range(g.kh):
                        ih = oh * g.sh - g.ph + b * g.dh
                        if ih < 0 or ih >= g.H:
                            continue
                        src = xin + (idd * g.H + ih) * g.W
                        for e in range(g.kw):
                            wv = wk[(a * g.kh + b) * g.kw + e]
                            base = e * g.dw - g.pw
                            _span(base, g.sw, g.W, g.oW, &lo, &hi)
                            if lo >= hi:
                                continue
                            if g.sw == 1:
                                of_axpy(yrow + lo, wv, src + lo + base, hi - lo)
                            else:
                                for ow in range(lo, hi):
                                    yrow[ow] += wv * src[ow * g.sw + base]


cdef void _dw_task(void* ctx, long t) noexcept nogil:
    cdef _DwJob* j = <_DwJob*>ctx
    cdef Py_ssize_t p0 = t * j.chunk, p1 = p0 + j.chunk
    _dw_planes(j, p0, p1 if p1 < j.planes else j.planes)


cdef int _geom(_Geom* g, tuple ins, tuple outs, tuple kernel, tuple strides, tuple dilations,
               tuple pads, str k) except -1:
    """Fill ``g`` from 3-tuples (``ins`` is ``(C, D, H, W)``), checking positivity."""
    if len(ins) != 4 or len(outs) != 3 or len(kernel) != 3 or len(strides) != 3 \
            or len(dilations) != 3 or len(pads) != 3:
        raise KernelError(f"{k}: the geometry takes (C, D, H, W) and 3-tuples")
    g.C, g.D, g.H, g.W = ins
    g.oD, g.oH, g.oW = outs
    g.kd, g.kh, g.kw = kernel
    g.sd, g.sh, g.sw = strides
    g.dd, g.dh, g.dw = dilations
    g.pd, g.ph, g.pw = pads
    if min(g.C, g.D, g.H, g.W, g.oD, g.oH, g.oW) < 0 or min(g.kd, g.kh, g.kw) < 1 \
            or min(g.sd, g.sh, g.sw, g.dd, g.dh, g.dw) < 1:
        raise KernelError(f"{k}: invalid geometry {ins} -> {outs}, kernel {kernel}, strides "
                          f"{strides}, dilations {dilations}")
    return 0


cdef float _EMPTY[1]


cdef float* _buf(object a, Py_ssize_t n, str k, str name, bint writable) except NULL:
    """The data of a C-contiguous float32 array of exactly ``n`` elements."""
    cdef cnp.ndarray arr = _arr(a, k, name)
    if cnp.PyArray_TYPE(arr) != cnp.NPY_FLOAT32:
        raise KernelDtypeError(f"{k}: {name} must be float32, got {arr.dtype}")
    if not cnp.PyArray_IS_C_CONTIGUOUS(arr):
        raise KernelError(f"{k}: {name} must be C-contiguous")
    if cnp.PyArray_SIZE(arr) != n:
        raise KernelError(f"{k}: {name} has {cnp.PyArray_SIZE(arr)} elements, expected {n}")
    if writable and not cnp.PyArray_ISWRITEABLE(arr):
        raise KernelError(f"{k}: {name} is read-only")
    if cnp.PyArray_DATA(arr) == NULL:  # never dereferenced: n == 0
        return _EMPTY
    return <float*>cnp.PyArray_DATA(arr)


cdef int _nt(object num_threads, Py_ssize_t tasks) except -1:
    cdef int nt = 1 if num_threads is None else int(num_threads)
    if nt < 1:
        raise KernelError(f"num_threads must be >= 1, got {nt}")
    if nt > tasks:
        nt = <int>tasks if tasks > 1 else 1
    return nt


def im2col(x, col, tuple ins, tuple outs, tuple kernel, tuple strides, tuple dilations,
           tuple pads, Py_ssize_t r0, Py_ssize_t r1, num_threads=None):
    """Patch matrix of output rows ``[r0, r1)`` (row ``od * oH + oh``).

    x: float32 [C, D, H, W] C-contiguous; col: float32 [C*kd*kh*kw, (r1 - r0) * oW],
    written whole (zeros where a tap falls in the padding). ``pads`` are the leading
    pads; trailing padding is implied by the output extents."""
    cdef str k = "im2col"
    cdef _ColJob job
    _geom(&job.g, ins, outs, kernel, strides, dilations, pads, k)
    if not (0 <= r0 <= r1 <= job.g.oD * job.g.oH):
        raise KernelError(f"{k}: rows [{r0}, {r1}) outside [0, {job.g.oD * job.g.oH})")
    job.rows = job.g.C * job.g.kd * job.g.kh * job.g.kw
    job.r0, job.r1 = r0, r1
    job.x = _buf(x, job.g.C * job.g.D * job.g.H * job.g.W, k, "x", False)
    job.col = _buf(col, job.rows * (r1 - r0) * job.g.oW, k, "col", True)
    if job.rows == 0 or r1 == r0 or job.g.oW == 0:
        return col
    cdef int nt = _nt(num_threads, job.rows)
    job.chunk = _rows_per_task(job.rows, nt)
    with nogil:
        _run_row_tasks(_col_task, &job, job.rows, job.chunk, nt)
    return col


def col2im(col, y, tuple ins, tuple outs, tuple kernel, tuple strides, tuple dilations,
           tuple pads, Py_ssize_t r0, Py_ssize_t r1, num_threads=None):
    """Scatter-add the column matrix of input rows ``[r0, r1)`` (row ``id * H + ih``) into y.

    ``ins`` is ``(M, D, H, W)``: M output channels over the input extents;
    col: float32 [M*kd*kh*kw, (r1 - r0) * W]; y: float32 [M, oD, oH, oW], accumulated
    into. Output position ``i * s - pad + k * d`` (outside ``[0, o)``: dropped)."""
    cdef str k = "col2im"
    cdef _ImJob job
    _geom(&job.g, ins, outs, kernel, strides, dilations, pads, k)
    if not (0 <= r0 <= r1 <= job.g.D * job.g.H):
        raise KernelError(f"{k}: rows [{r0}, {r1}) outside [0, {job.g.D * job.g.H})")
    job.M = job.g.C
    job.r0, job.r1 = r0, r1
    job.col = _buf(col, job.M * job.g.kd * job.g.kh * job.g.kw * (r1 - r0) * job.g.W, k, "col", False)
    job.y = _buf(y, job.M * job.g.oD * job.g.oH * job.g.oW, k, "y", True)
    if job.M == 0 or r1 == r0 or job.g.W == 0:
        return y
    cdef int nt = _nt(num_threads, job.M)
    job.chunk = _rows_per_task(job.M, nt)
    with nogil:
        _run_row_tasks(_im_task, &job, job.M, job.chunk, nt)
    return y


def depthwise(x, w, bias, y, Py_ssize_t n, Py_ssize_t mult, tuple ins, tuple outs, tuple kernel,
              tuple strides, tuple dilations, tuple pads, num_threads=None):
    """Grouped convolution with one input channel per group (group == C), ``mult`` output
    channels per input channel.

    x: float32 [n, C, D, H, W]; w: float32 [C*mult, 1, kd, kh, kw]; bias: float32
    [C*mult] or None; y: float32 [n, C*mult, oD, oH, oW], written whole."""
    cdef str k = "depthwise"
    cdef _DwJob job
    _geom(&job.g, ins, outs, kernel, strides, dilations, pads, k)
    if n < 0 or mult < 1:
        raise KernelError(f"{k}: invalid batch {n} or multiplier {mult}")
    cdef Py_ssize_t cout = job.g.C * mult
    job.mult = mult
    job.planes = n * cout
    job.x = _buf(x, n * job.g.C * job.g.D * job.g.H * job.g.W, k, "x", False)
    job.w = _buf(w, cout * job.g.kd * job.g.kh * job.g.kw, k, "w", False)
    job.bias = NULL if bias is None else _buf(bias, cout, k, "bias", False)
    job.y = _buf(y, job.planes * job.g.oD * job.g.oH * job.g.oW, k, "y", True)
    if job.planes == 0 or job.g.oD * job.g.oH * job.g.oW == 0:
        return y
    cdef int nt = _nt(num_threads, job.planes)
    job.chunk = _rows_per_task(job.planes, nt)
    with nogil:
        _run_row_tasks(_dw_task, &job, job.planes, job.chunk, nt)
    return y
