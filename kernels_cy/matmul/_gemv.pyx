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
from libc.math cimport isnan

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
    void of_gemm_few(const float* X, Py_ssize_t ldx, Py_ssize_t M, const float* W, Py_ssize_t ldw,
                     float* Y, Py_ssize_t ldy, Py_ssize_t K, Py_ssize_t j0, Py_ssize_t j1)


__all__ = ["COLUMN_BLOCK", "FEW_ROWS", "PARALLEL_BYTES", "OneRowMatMul", "OneRowSwiGLU", "gemm_few", "gemv",
           "swiglu_gate", "swiglu_row"]

cdef enum:
    CB = 2048
    PAR_BYTES = 1 << 18
    FEW = 32      # rows a few-row product takes (more go to BLAS)
    FEW_CB = 256  # columns of one few-row task

COLUMN_BLOCK = CB
PARALLEL_BYTES = PAR_BYTES
FEW_ROWS = FEW


ctypedef struct _Job:
    const float* x
    const float* w[2]  # one or two products of the same row: x @ w[0] (and x @ w[1])
    Py_ssize_t ldw[2]
    float* y[2]
    float* parts       # the partial rows: (nk - 1) * N floats per product
    float* extra       # the caller's own scratch floats, if it asked for any
    int np
    Py_ssize_t K
    Py_ssize_t N
    Py_ssize_t nb
    Py_ssize_t nk
    Py_ssize_t kchunk


cdef void _task(void* ctx, long i) noexcept nogil:
    """Item ``i``: product ``i // (nb * nk)``, its column block and row chunk."""
    cdef _Job* j = <_Job*>ctx
    cdef Py_ssize_t per = j.nb * j.nk
    cdef Py_ssize_t p = i // per
    i -= p * per
    cdef Py_ssize_t b = i % j.nb, c = i // j.nb
    cdef Py_ssize_t j0 = b * CB, j1 = j0 + CB, k0 = c * j.kchunk, k1 = k0 + j.kchunk
    if j1 > j.N:
        j1 = j.N
    if k1 > j.K:
        k1 = j.K
    cdef float* dst = j.y[p] if c == 0 else j.parts + (p * (j.nk - 1) + c - 1) * j.N
    if k0 >= k1:  # an empty row range still owes its partial row
        for b in range(j0, j1):
            dst[b] = 0.0
        return
    of_gemv_rows(j.x, j.w[p], j.ldw[p], dst, k0, k1, j0, j1)


cdef int _products(_Job* job, bint own_rows, Py_ssize_t extra, int threads) except -1:
    """Run ``job`` (x, w, ldw, np, K, N set; y set unless ``own_rows``) on the pool: columns
    in blocks of :data:`COLUMN_BLOCK`; when there are fewer blocks than threads the rows
    are split too (chunks of a multiple of 4 rows) and the partial rows summed afterwards.
    Products below :data:`PARALLEL_BYTES` of weight run on the calling thread. The
    calling thread's scratch holds ``extra`` floats for the caller (``job.extra``), the
    result rows when ``own_rows``, then the partial rows."""
    cdef Py_ssize_t K = job.K, N = job.N, i, c, p
    cdef int t = threads if K * N * 4 >= PAR_BYTES else 1
    job.nb = (N + CB - 1) // CB
    job.nk = 1
    if t > 1 and job.nb < t:
        job.nk = t // job.nb
    job.kchunk = ((K + job.nk - 1) // job.nk + 3) // 4 * 4 if job.nk > 1 else K
    if job.nk > 1:
        job.nk = (K + job.kchunk - 1) // job.kchunk
    cdef Py_ssize_t rows = job.np * N if own_rows else 0
    cdef Py_ssize_t total = extra + rows + job.np * (job.nk - 1) * N
    cdef float* buf = NULL
    if total:
        buf = of_gemv_parts(total)
        if buf == NULL:
            raise MemoryError(f"gemv: cannot allocate {total * 4} bytes of scratch")
    job.extra = buf
    if own_rows:
        for p in range(job.np):
            job.y[p] = buf + extra + p * N
    job.parts = buf + extra + rows if job.nk > 1 else NULL
    with nogil:
        of_pool_parallel_for(job.np * job.nb * job.nk, _task, job, t)
        for p in range(job.np):
            for c in range(job.nk - 1):
                for i in range(N):
                    job.y[p][i] += job.parts[(p * (job.nk - 1) + c) * N + i]
    return 0


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
    job.w[0] = w
    job.ldw[0] = ldw
    job.y[0] = y
    job.np = 1
    job.K = K
    job.N = N
    return _products(&job, False, 0, threads)


# -- a few rows (a batched decode step) ---------------------------------------------------

ctypedef struct _FewJob:
    const float* x
    const float* w
    float* y
    Py_ssize_t M
    Py_ssize_t K
    Py_ssize_t N
    Py_ssize_t ldw
    Py_ssize_t cols  # columns per task (a multiple of 16)


cdef void _few_task(void* ctx, long t) noexcept nogil:
    cdef _FewJob* j = <_FewJob*>ctx
    cdef Py_ssize_t j0 = t * j.cols, j1 = j0 + j.cols
    if j1 > j.N:
        j1 = j.N
    of_gemm_few(j.x, j.K, j.M, j.w, j.ldw, j.y, j.N, j.K, j0, j1)


cdef int _few_core(const float* x, Py_ssize_t M, const float* w, Py_ssize_t ldw, float* y, Py_ssize_t K,
                   Py_ssize_t N, int threads) except -1:
    """``y[m] = x[m] @ w`` for ``M`` rows (x [M, K] and y [M, N] contiguous): column ranges on
    the pool, the weight streamed once for all the rows."""
    if N == 0 or M == 0:
        return 0
    cdef _FewJob job
    job.x = x
    job.w = w
    job.y = y
    job.M = M
    job.K = K
    job.N = N
    job.ldw = ldw
    cdef int t = threads if K * N * 4 >= PAR_BYTES else 1
    cdef Py_ssize_t tasks = (N + FEW_CB - 1) // FEW_CB
    if t > 1 and tasks < t:  # one strip per thread, still whole 16-column vectors
        job.cols = ((N + t - 1) // t + 15) // 16 * 16
    else:
        job.cols = FEW_CB
    tasks = (N + job.cols - 1) // job.cols
    with nogil:
        _run_row_tasks(_few_task, &job, tasks, 1, t)
    return 0


def gemm_few(x, w, out, int threads=1):
    """``out[m, n] = sum_k x[m, k] * w[k, n]`` for a few rows: x float32 [M, K] and out float32
    [M, N] C-contiguous (M <= :data:`FEW_ROWS`), w float32 [K, N] with a unit column stride."""
    cdef str k = "gemm_few"
    cdef cnp.ndarray xa = _f32(x, k, "x", 2)
    cdef cnp.ndarray wa = _arr(w, k, "w")
    cdef cnp.ndarray oa = _f32(out, k, "out", 2, writable=True)
    cdef Py_ssize_t M = xa.shape[0], K = xa.shape[1]
    if not _row_operand(wa, K) or M > FEW:
        raise KernelError(f"{k}: x {_shape(xa)} (at most {FEW} rows) and w {wa.dtype}{_shape(wa)} (float32 "
                          f"[{K}, N], unit column stride) do not fit")
    cdef Py_ssize_t N = wa.shape[1]
    if oa.shape[0] != M or oa.shape[1] != N:
        raise KernelError(f"{k}: out {_shape(oa)}, expected [{M}, {N}]")
    _few_core(<const float*>cnp.PyArray_DATA(xa), M, <const float*>cnp.PyArray_DATA(wa),
              wa.strides[0] // 4 if K > 1 else N, <float*>cnp.PyArray_DATA(oa), K, N, threads)
    return out


cdef bint _row_operand(cnp.ndarray w, Py_ssize_t K) noexcept:
    cdef Py_ssize_t N
    if cnp.PyArray_NDIM(w) != 2 or cnp.PyArray_TYPE(w) != cnp.NPY_FLOAT32 or w.shape[0] != K:
        return False
    N = w.shape[1]
    return (N <= 1 or w.strides[1] == 4) and (K == 1 or (w.strides[0] % 4 == 0 and w.strides[0] >= 4 * N))


cdef class OneRowMatMul:
    """A MatMul kernel's call: a float32 row times a 2-D float32 weight with a unit column
    stride runs :func:`gemv` with no Python in between, up to :data:`FEW_ROWS` rows
    :func:`gemm_few`; any other operands go to ``fallback(a, b)``."""

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
                if (K > 0 and aa.shape[nd - 1] == K and cnp.PyArray_SIZE(aa) <= FEW * K
                        and _row_operand(ba, K)):
                    for i in range(nd - 1):
                        dims[i] = aa.shape[i]
                    dims[nd - 1] = N
                    out = cnp.PyArray_EMPTY(nd, dims, cnp.NPY_FLOAT32, 0)
                    if cnp.PyArray_SIZE(aa) == K:
                        _gemv_core(<const float*>cnp.PyArray_DATA(aa), <const float*>cnp.PyArray_DATA(ba),
                                   ba.strides[0] // 4 if K > 1 else N, <float*>cnp.PyArray_DATA(out), K, N,
                                   self.threads)
                    else:  # a few rows: the weight streamed once for all of them
                        _few_core(<const float*>cnp.PyArray_DATA(aa), cnp.PyArray_SIZE(aa) // K,
                                  <const float*>cnp.PyArray_DATA(ba), ba.strides[0] // 4 if K > 1 else N,
                                  <float*>cnp.PyArray_DATA(out), K, N, self.threads)
                    return out
        return self.fallback(a, b)


# -- the gated unit of a decoder's MLP on one row --------------------------------------

cdef int _swiglu_core(const float* x, const float* wg, Py_ssize_t ldg, const float* wu, Py_ssize_t ldu,
                      float* out, Py_ssize_t K, Py_ssize_t N, int threads) except -1:
    """``out = (g * sigmoid(g)) * u`` with ``g = x @ Wg`` and ``u = x @ Wu``: both products
    in one pass of the pool (each split as :func:`gemv` splits it, so the same partial
    sums), then the gate on the calling thread. Every float operation is the one the
    unfused kernels do, in the same order (``gemv``, ``_softmax.sigmoid``, two float32
    products), so the result is bitwise the same as theirs on as many threads."""
    if N == 0:
        return 0
    cdef _Job job
    job.x = x
    job.w[0] = wg
    job.w[1] = wu
    job.ldw[0] = ldg
    job.ldw[1] = ldu
    job.np = 2
    job.K = K
    job.N = N
    _products(&job, True, N, threads)  # N floats of scratch for the gate's sigmoid
    cdef const float* g = job.y[0]
    cdef const float* u = job.y[1]
    cdef float* s = job.extra
    cdef Py_ssize_t i
    cdef float a
    with nogil:
        of_sigmoid(g, s, N)  # the Sigmoid kernel's own routine; then Mul(g, s), Mul(., u) in float32
        for i in range(N):
            a = g[i] * s[i]
            out[i] = a * u[i]
    return 0


def swiglu_row(x, wg, wu, out, int threads=1):
    """``out = (g * sigmoid(g)) * u`` for ``g = x @ wg``, ``u = x @ wu``: x float32 [K]
    contiguous, wg and wu float32 [K, N] with unit column strides, out float32 [N]
    contiguous and writable. Returns ``out``."""
    cdef str k = "swiglu_row"
    cdef cnp.ndarray xa = _f32(x, k, "x", 1)
    cdef cnp.ndarray ga = _arr(wg, k, "wg")
    cdef cnp.ndarray ua = _arr(wu, k, "wu")
    cdef cnp.ndarray oa = _f32(out, k, "out", 1, writable=True)
    cdef Py_ssize_t K = xa.shape[0]
    if not (_row_operand(ga, K) and _row_operand(ua, K)):
        raise KernelError(f"{k}: wg {ga.dtype}{_shape(ga)} and wu {ua.dtype}{_shape(ua)} must be float32 "
                          f"[{K}, N] with unit column strides")
    cdef Py_ssize_t N = ga.shape[1]
    if ua.shape[1] != N or oa.shape[0] != N:
        raise KernelError(f"{k}: shapes wg {_shape(ga)}, wu {_shape(ua)}, out {_shape(oa)} do not match")
    _swiglu_core(<const float*>cnp.PyArray_DATA(xa), <const float*>cnp.PyArray_DATA(ga),
                 ga.strides[0] // 4 if K > 1 else N, <const float*>cnp.PyArray_DATA(ua),
                 ua.strides[0] // 4 if K > 1 else N, <float*>cnp.PyArray_DATA(oa), K, N, threads)
    return out


# -- the gate of many rows ------------------------------------------------------------

ctypedef struct _GateJob:
    const float* g
    const float* u
    float* out
    Py_ssize_t n      # elements in all
    Py_ssize_t block  # elements per task (a multiple of 64)


cdef void _gate_task(void* ctx, long t) noexcept nogil:
    """Elements ``[t * block, (t + 1) * block)``: the sigmoid into ``out``, then the two products."""
    cdef _GateJob* j = <_GateJob*>ctx
    cdef Py_ssize_t lo = t * j.block, hi = lo + j.block, i
    cdef float a
    if hi > j.n:
        hi = j.n
    of_sigmoid(j.g + lo, j.out + lo, hi - lo)
    for i in range(lo, hi):
        a = j.g[i] * j.out[i]
        j.out[i] = a * j.u[i]


def swiglu_gate(g, u, out, int threads=1):
    """``out = (g * sigmoid(g)) * u`` elementwise over float32 arrays of one size (1-D
    C-contiguous; ``out`` may be neither input), on the pool. Each block of elements starts
    at a multiple of 64 and the last ends where the array does, so every element takes the
    same vector lanes as the Sigmoid kernel's one pass over the whole array gives it: the
    result is bitwise that of Sigmoid, Mul and Mul (float products commute exactly).
    Returns ``out``, or None (``out`` untouched) when ``g`` holds a NaN: the Sigmoid kernel
    then takes its double-precision path, which the caller runs instead."""
    cdef str k = "swiglu_gate"
    cdef cnp.ndarray ga = _f32(g, k, "g", 1)
    cdef cnp.ndarray ua = _f32(u, k, "u", 1)
    cdef cnp.ndarray oa = _f32(out, k, "out", 1, writable=True)
    if ua.shape[0] != ga.shape[0] or oa.shape[0] != ga.shape[0]:
        raise KernelError(f"{k}: g {_shape(ga)}, u {_shape(ua)} and out {_shape(oa)} differ in size")
    cdef _GateJob job
    job.g = <const float*>cnp.PyArray_DATA(ga)
    job.u = <const float*>cnp.PyArray_DATA(ua)
    job.out = <float*>cnp.PyArray_DATA(oa)
    job.n = ga.shape[0]
    if job.n == 0:
        return out
    cdef Py_ssize_t i
    cdef bint nan = False
    with nogil:
        for i in range(job.n):
            if isnan(job.g[i]):
                nan = True
                break
    if nan:
        return None
    cdef int nt = threads if threads > 1 and job.n >= (1 << 14) else 1
    cdef Py_ssize_t blocks = (job.n + 63) // 64
    job.block = 64 * _rows_per_task(blocks, nt)
    with nogil:
        _run_row_tasks(_gate_task, &job, job.n, job.block, nt)
    return out


cdef class OneRowSwiGLU:
    """A fused gated unit's call ``(ctx, x, wg, wu)`` (``ctx``: the run's context): a float32
    row with two 2-D float32 weights of one shape runs :func:`swiglu_row` with no Python in
    between; anything else goes to ``fallback(ctx, x, wg, wu)``."""

    cdef int threads
    cdef object fallback

    def __init__(self, int threads, fallback):
        self.threads = threads
        self.fallback = fallback

    def __call__(self, ctx, x, wg, wu):
        cdef cnp.ndarray xa, ga, ua, out
        cdef cnp.npy_intp dims[32]
        cdef int nd, i
        cdef Py_ssize_t K, N
        if cnp.PyArray_Check(x) and cnp.PyArray_Check(wg) and cnp.PyArray_Check(wu):
            xa = <cnp.ndarray>x
            ga = <cnp.ndarray>wg
            ua = <cnp.ndarray>wu
            nd = cnp.PyArray_NDIM(xa)
            if (1 <= nd <= 32 and cnp.PyArray_TYPE(xa) == cnp.NPY_FLOAT32 and cnp.PyArray_IS_C_CONTIGUOUS(xa)
                    and cnp.PyArray_NDIM(ga) == 2):
                K = ga.shape[0]
                N = ga.shape[1]
                if (K > 0 and cnp.PyArray_SIZE(xa) == K and _row_operand(ga, K) and _row_operand(ua, K)
                        and ua.shape[1] == N):
                    for i in range(nd - 1):
                        dims[i] = xa.shape[i]
                    dims[nd - 1] = N
                    out = cnp.PyArray_EMPTY(nd, dims, cnp.NPY_FLOAT32, 0)
                    _swiglu_core(<const float*>cnp.PyArray_DATA(xa), <const float*>cnp.PyArray_DATA(ga),
                                 ga.strides[0] // 4 if K > 1 else N, <const float*>cnp.PyArray_DATA(ua),
                                 ua.strides[0] // 4 if K > 1 else N, <float*>cnp.PyArray_DATA(out), K, N,
                                 self.threads)
                    return out
        return self.fallback(ctx, x, wg, wu)
