# cython: boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""One-row float32 products ``y = x @ W`` on the shared worker pool (``_pool.h``).

A decode step multiplies one activation row by every weight matrix: the product is
bound by the bandwidth of streaming W, and BLAS (tuned for matrices) reaches about
two thirds of it. Here each task streams a contiguous range of W's rows and columns
(``_gemv.h``): columns in blocks of :data:`COLUMN_BLOCK`; when there are fewer blocks
than threads, the rows are split too and the partial rows summed afterwards (in a
``(parts - 1) * N`` float scratch per calling thread, kept across calls like BLAS's
own buffers: it is not a runtime buffer, and a decode step allocates nothing for it). Products below
:data:`PARALLEL_BYTES` of weight run on the calling thread.
"""
include "_common.pxi"

include "_pool_client.pxi"

cdef extern from *:
    """
    #include <stdlib.h>
    /* The partial rows of a row-split product: one scratch per calling thread, kept and
     * grown across calls (like BLAS's own buffers), so a decode step allocates nothing. */
    static __thread float *of_gemv_scratch = NULL;
    static __thread size_t of_gemv_scratch_floats = 0;
    static float *of_gemv_parts(size_t floats) {
        if (floats > of_gemv_scratch_floats) {
            float *p = (float *)realloc(of_gemv_scratch, floats * sizeof(float));
            if (p == NULL) return NULL;
            of_gemv_scratch = p;
            of_gemv_scratch_floats = floats;
        }
        return of_gemv_scratch;
    }
    """
    float* of_gemv_parts(size_t floats) nogil

cdef extern from "_gemv.h" nogil:
    void of_gemv_rows(const float* x, const float* W, Py_ssize_t ldw, float* y,
                      Py_ssize_t k0, Py_ssize_t k1, Py_ssize_t j0, Py_ssize_t j1)


__all__ = ["COLUMN_BLOCK", "PARALLEL_BYTES", "OneRowMatMul", "gemv"]

cdef enum:
    CB = 2048

COLUMN_BLOCK = CB
PARALLEL_BYTES = 1 << 18


ctypedef struct _Job:
    const float* x
    const float* w
    Py_ssize_t ldw
    float* y
    float* parts
    Py_ssize_t K
    Py_ssize_t N
    Py_ssize_t nb
    Py_ssize_t kchunk


cdef void _task(void* ctx, long i) noexcept nogil:
    cdef _Job* j = <_Job*>ctx
    cdef Py_ssize_t b = i % j.nb, c = i // j.nb
    cdef Py_ssize_t j0 = b * CB, j1 = j0 + CB, k0 = c * j.kchunk, k1 = k0 + j.kchunk
    if j1 > j.N:
        j1 = j.N
    if k1 > j.K:
        k1 = j.K
    cdef float* dst = j.y if c == 0 else j.parts + (c - 1) * j.N
    if k0 >= k1:  # an empty row range still owes its partial row
        for b in range(j0, j1):
            dst[b] = 0.0
        return
    of_gemv_rows(j.x, j.w, j.ldw, dst, k0, k1, j0, j1)


def gemv(x, w, out, int threads=1):
    """``out[n] = sum_k x[k] * w[k, n]``: x float32 [K] contiguous, w float32 [K, N] with a
    unit column stride, out float32 [N] contiguous and writable. Returns ``out``."""
    cdef str k = "gemv"
    cdef cnp.ndarray xa = _f32(x, k, "x", 1)
    cdef cnp.ndarray wa = _arr(w, k, "w")
    cdef cnp.ndarray oa = _f32(out, k, "out", 1, writable=True)
    if cnp.PyArray_TYPE(wa) != cnp.NPY_FLOAT32:
        raise KernelDtypeError(f"{k}: w must be float32, got {wa.dtype}")
    if wa.ndim != 2:
        raise KernelError(f"{k}: w must be 2-D, got shape {_shape(wa)}")
    cdef Py_ssize_t K = wa.shape[0], N = wa.shape[1]
    if xa.shape[0] != K or oa.shape[0] != N:
        raise KernelError(f"{k}: shapes x {_shape(xa)}, w {_shape(wa)}, out {_shape(oa)} do not match")
    if (N > 1 and wa.strides[1] != 4) or (K > 1 and (wa.strides[0] % 4 != 0 or wa.strides[0] < 4 * N)):
        raise KernelError(f"{k}: w needs a unit column stride and non-overlapping rows, "
                          f"got strides ({wa.strides[0]}, {wa.strides[1]})")
    _gemv_core(<const float*>cnp.PyArray_DATA(xa), <const float*>cnp.PyArray_DATA(wa),
               wa.strides[0] // 4 if K > 1 else N, <float*>cnp.PyArray_DATA(oa), K, N, threads)
    return out


cdef int _gemv_core(const float* x, const float* w, Py_ssize_t ldw, float* y, Py_ssize_t K,
                    Py_ssize_t N, int threads) except -1:
    """The product on checked operands (see :func:`gemv`)."""
    if N == 0:
        return 0
    cdef _Job job
    job.x = x
    job.w = w
    job.ldw = ldw
    job.y = y
    job.K = K
    job.N = N
    job.nb = (N + CB - 1) // CB
    job.parts = NULL
    cdef int t = threads if K * N * 4 >= PARALLEL_BYTES else 1
    cdef Py_ssize_t nk = 1, i, c
    if t > 1 and job.nb < t:
        nk = t // job.nb
    job.kchunk = ((K + nk - 1) // nk + 3) // 4 * 4 if nk > 1 else K
    if nk > 1:
        nk = (K + job.kchunk - 1) // job.kchunk
    if nk > 1:
        job.parts = of_gemv_parts((nk - 1) * N)
        if job.parts == NULL:
            raise MemoryError(f"gemv: cannot allocate {(nk - 1) * N * 4} bytes of partial rows")
    with nogil:
        of_pool_parallel_for(job.nb * nk, _task, &job, t)
        for c in range(nk - 1):
            for i in range(N):
                job.y[i] += job.parts[c * N + i]
    return 0


cdef class OneRowMatMul:
    """A MatMul kernel's call: a float32 row times a 2-D float32 weight with a unit column
    stride runs :func:`gemv` with no Python in between; any other operands go to
    ``fallback(a, b)``."""

    cdef int threads
    cdef object fallback

    def __init__(self, int threads, fallback):
        self.threads = threads
        self.fallback = fallback

    def __call__(self, a, b):
        cdef cnp.ndarray aa, ba, out
        cdef cnp.npy_intp dims[32]
        cdef int nd, i
        cdef Py_ssize_t K, N
        if cnp.PyArray_Check(a) and cnp.PyArray_Check(b):
            aa = <cnp.ndarray>a
            ba = <cnp.ndarray>b
            nd = cnp.PyArray_NDIM(aa)
            if (cnp.PyArray_NDIM(ba) == 2 and 1 <= nd <= 32 and cnp.PyArray_TYPE(aa) == cnp.NPY_FLOAT32
                    and cnp.PyArray_TYPE(ba) == cnp.NPY_FLOAT32 and cnp.PyArray_IS_C_CONTIGUOUS(aa)):
                K = ba.shape[0]
                N = ba.shape[1]
                if (K > 0 and cnp.PyArray_SIZE(aa) == K and (N <= 1 or ba.strides[1] == 4)
                        and (K == 1 or (ba.strides[0] % 4 == 0 and ba.strides[0] >= 4 * N))):
                    for i in range(nd - 1):
                        dims[i] = aa.shape[i]
                    dims[nd - 1] = N
                    out = cnp.PyArray_EMPTY(nd, dims, cnp.NPY_FLOAT32, 0)
                    _gemv_core(<const float*>cnp.PyArray_DATA(aa), <const float*>cnp.PyArray_DATA(ba),
                               ba.strides[0] // 4 if K > 1 else N, <float*>cnp.PyArray_DATA(out), K, N,
                               self.threads)
                    return out
        return self.fallback(a, b)
