# cython: boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""com.microsoft MatMulNBits (bits=4, accuracy_level 0): ``out = a @ dequant(B).T (+ bias)``.

B is consumed encoded: ``b_quant`` uint8 [N, n_blocks, block_size / 2] holds the
4-bit codes of row ``n`` of the [N, K] weight, K-ordered, two per byte with the
low nibble first (``n_blocks = ceil(K / block_size)``, the last block padded);
``scales`` float32 [N * n_blocks] or [N, n_blocks]; ``zero_points`` None (zero
point 8), uint8 packed [N * ceil(n_blocks / 2)] or [N, ceil(n_blocks / 2)] (two
4-bit zero points per byte, low nibble first, per row of N), or float32 [N *
n_blocks] like the scales. ``w[n, k] = (code - zp) * scale``.

The float weight is never materialized: each task of the pool dequantizes one row of N
at a time into its own row buffer (``4 * (K_padded + 4)`` bytes per task, allocated
once per call) and multiplies it with every row of ``a``. A single activation row with ``block_size`` 32 (a decode
step) skips the row buffer: per block, ``scale * (codes . a - zero_point * sum(a))``
straight from the packed codes. Parallel over N. float32 activations only.
"""
from libc.stdlib cimport malloc, free

import mmap

include "_common.pxi"

include "_pool_client.pxi"


ctypedef struct _RowJob:
    const uint8_t* bp
    const float* scp
    const float* szp
    const float* biasp
    const float* ap
    const float* asum
    float* op
    Py_ssize_t nblk
    Py_ssize_t N
    Py_ssize_t chunk


cdef void _row_task(void* ctx, long t) noexcept nogil:
    """Outputs ``[t * chunk, (t + 1) * chunk)`` of a one-row product straight from the codes."""
    cdef _RowJob* j = <_RowJob*>ctx
    cdef Py_ssize_t n, n0 = t * j.chunk, n1 = (t + 1) * j.chunk, nblk = j.nblk
    if n1 > j.N:
        n1 = j.N
    of_q4dot32_rows(j.bp + n0 * nblk * 16, j.scp + n0 * nblk, j.ap, nblk, n1 - n0, j.op + n0)
    for n in range(n0, n1):
        j.op[n] = j.op[n] - of_dot(j.szp + n * nblk, j.asum, nblk) + (j.biasp[n] if j.biasp != NULL else 0.0)


cdef int _fused_row(const uint8_t* bp, const float* scp, const float* szp, const uint8_t* zpu,
                    const float* zpf, const float* biasp, const float* ap, float* op, Py_ssize_t nblk,
                    Py_ssize_t N, int nt) except -1:
    """One activation row with blocks of 32: the row in nibble order and its block sums,
    then the outputs in chunks on the pool, straight from the packed codes. ``szp`` holds
    the scale times zero point of every block (of_q4_zero_terms); NULL computes it here."""
    cdef Py_ssize_t words = nblk * 33 + (N * nblk if szp == NULL else 0)
    cdef float* work = <float*>malloc(words * sizeof(float))
    cdef _RowJob job
    if work == NULL:
        raise MemoryError(f"matmul_nbits: cannot allocate {words * 4} bytes of workspace")
    with nogil:
        of_q4_prepare(ap, work, work + nblk * 32, nblk)
        if szp == NULL:
            of_q4_zero_terms(scp, zpu, zpf, nblk, N, work + nblk * 33)
            szp = work + nblk * 33
        job.bp = bp
        job.scp = scp
        job.szp = szp
        job.biasp = biasp
        job.ap = work
        job.asum = work + nblk * 32
        job.op = op
        job.nblk = nblk
        job.N = N
        # chunks of a multiple of four rows: the kernel shares each block's activations among four
        job.chunk = ((N + 4 * nt - 1) // (4 * nt) + 3) // 4 * 4 if nt > 1 else N
        of_pool_parallel_for((N + job.chunk - 1) // job.chunk if N > 0 else 0, _row_task, &job, nt)
    free(work)
    return 0


ctypedef struct _DeqJob:
    const uint8_t* bp
    const float* scp
    const uint8_t* zpu
    const float* zpf
    const float* biasp
    const float* ap
    float* op
    float* rows              # ``kpad + 4`` floats per task: the dequantized row, then 4 sums
    Py_ssize_t M, N, K, nblk, block_size, zrow, kpad
    Py_ssize_t chunk


cdef void _deq_task(void* ctx, long t) noexcept nogil:
    """Outputs ``[:, t * chunk, (t + 1) * chunk)``: per row of N, the row dequantized into
    this task's buffer, then its products with every row of ``a`` (four at a time)."""
    cdef _DeqJob* j = <_DeqJob*>ctx
    cdef Py_ssize_t n = t * j.chunk, n1 = n + j.chunk, m, M = j.M, N = j.N, K = j.K, nblk = j.nblk
    cdef float* row = j.rows + t * (j.kpad + 4)
    cdef float* four = row + j.kpad
    cdef float bias, acc
    cdef int i
    if n1 > N:
        n1 = N
    while n < n1:
        of_deq4(j.bp + n * nblk * (j.block_size // 2), j.scp + n * nblk,
                j.zpu + n * j.zrow if j.zpu != NULL else NULL,
                j.zpf + n * nblk if j.zpf != NULL else NULL,
                row, K, j.block_size)
        bias = j.biasp[n] if j.biasp != NULL else 0.0
        m = 0
        while m + 4 <= M:
            of_dot4(row, j.ap + m * K, K, K, four)
            for i in range(4):
                j.op[(m + i) * N + n] = four[i] + bias
            m = m + 4
        while m < M:
            acc = of_dot(row, j.ap + m * K, K)
            if j.biasp != NULL:
                acc = acc + j.biasp[n]
            j.op[m * N + n] = acc
            m = m + 1
        n += 1


__all__ = ["OneRowNBits", "matmul_nbits"]


def matmul_nbits(a, b_quant, scales, zero_points, Py_ssize_t K, Py_ssize_t N, out, *,
                 int bits=4, Py_ssize_t block_size=32, bias=None, num_threads=None):
    """``out[m, n] = sum_k a[m, k] * w[n, k] (+ bias[n])`` with 4-bit block-quantized ``w``.

    a: float32 [M, K] C-contiguous (callers flatten leading axes); out: float32
    [M, N] C-contiguous; K, N: the operator's attributes. Raises KernelError /
    KernelDtypeError before writing anything.
    """
    cdef str k = "matmul_nbits"
    if bits != 4:
        raise KernelError(f"{k}: bits={bits} is not supported (only 4)")
    if block_size < 16 or (block_size & (block_size - 1)) != 0:
        raise KernelError(f"{k}: block_size must be a power of two >= 16, got {block_size}")
    if K < 0 or N < 0:
        raise KernelError(f"{k}: K and N must be >= 0, got K={K}, N={N}")
    cdef cnp.ndarray aa = _f32(a, k, "a", 2)
    cdef cnp.ndarray oa = _f32(out, k, "out", 2, writable=True)
    cdef Py_ssize_t M = aa.shape[0]
    cdef Py_ssize_t nblk = (K + block_size - 1) // block_size, half = block_size // 2
    if aa.shape[1] != K:
        raise KernelError(f"{k}: a has shape {_shape(aa)}, its last axis must be K={K}")
    if oa.shape[0] != M or oa.shape[1] != N:
        raise KernelError(f"{k}: out has shape {_shape(oa)}, expected ({M}, {N})")
    cdef cnp.ndarray ba = _arr(b_quant, k, "b_quant")
    if cnp.PyArray_TYPE(ba) != cnp.NPY_UINT8:
        raise KernelDtypeError(f"{k}: b_quant must be uint8, got {ba.dtype}")
    if (ba.ndim != 3 or ba.shape[0] != N or ba.shape[1] != nblk or ba.shape[2] != half
            or not cnp.PyArray_IS_C_CONTIGUOUS(ba)):
        raise KernelError(f"{k}: b_quant has shape {_shape(ba)}, expected C-contiguous "
                          f"({N}, {nblk}, {half})")
    cdef cnp.ndarray sa = _arr(scales, k, "scales")
    if cnp.PyArray_TYPE(sa) != cnp.NPY_FLOAT32:
        raise KernelDtypeError(f"{k}: scales must be float32, got {sa.dtype}")
    if sa.size != N * nblk or sa.ndim not in (1, 2) or (sa.ndim == 2 and (sa.shape[0] != N or sa.shape[1] != nblk)) \
            or not cnp.PyArray_IS_C_CONTIGUOUS(sa):
        raise KernelError(f"{k}: scales has shape {_shape(sa)}, expected C-contiguous "
                          f"({N * nblk},) or ({N}, {nblk})")
    cdef cnp.ndarray za = None
    cdef Py_ssize_t zrow = (nblk + 1) // 2
    cdef bint zp_u8 = False
    if zero_points is not None:
        za = _arr(zero_points, k, "zero_points")
        if cnp.PyArray_TYPE(za) == cnp.NPY_UINT8:
            zp_u8 = True
            if za.size != N * zrow or za.ndim not in (1, 2) or (za.ndim == 2 and (za.shape[0] != N or za.shape[1] != zrow)):
                raise KernelError(f"{k}: uint8 zero_points has shape {_shape(za)}, expected "
                                  f"({N * zrow},) or ({N}, {zrow})")
        elif cnp.PyArray_TYPE(za) == cnp.NPY_FLOAT32:
            if za.size != N * nblk or za.ndim not in (1, 2) or (za.ndim == 2 and (za.shape[0] != N or za.shape[1] != nblk)):
                raise KernelError(f"{k}: float zero_points has shape {_shape(za)}, expected "
                                  f"({N * nblk},) or ({N}, {nblk})")
        else:
            raise KernelDtypeError(f"{k}: zero_points must be uint8 or float32, got {za.dtype}")
        if not cnp.PyArray_IS_C_CONTIGUOUS(za):
            raise KernelError(f"{k}: zero_points must be C-contiguous")
    cdef cnp.ndarray biasa = None
    if bias is not None:
        biasa = _f32(bias, k, "bias", 1)
        if biasa.shape[0] != N:
            raise KernelError(f"{k}: bias has {biasa.shape[0]} elements, expected N={N}")
    cdef int nt = _threads(num_threads, k)
    if M == 0 or N == 0:
        return out
    cdef float* op = <float*>cnp.PyArray_DATA(oa)
    cdef Py_ssize_t m, n
    if K == 0:
        with nogil:
            for m in range(M):
                for n in range(N):
                    op[m * N + n] = 0.0
        if biasa is not None:
            oa += biasa
        return out
    nt = _fit_threads(nt, N, 2.0 * M * N * K)
    cdef const float* ap = <const float*>cnp.PyArray_DATA(aa)
    cdef const uint8_t* bp = <const uint8_t*>cnp.PyArray_DATA(ba)
    cdef const float* scp = <const float*>cnp.PyArray_DATA(sa)
    cdef const uint8_t* zpu = <const uint8_t*>cnp.PyArray_DATA(za) if zp_u8 else NULL
    cdef const float* zpf = <const float*>cnp.PyArray_DATA(za) if (za is not None and not zp_u8) else NULL
    cdef const float* biasp = <const float*>cnp.PyArray_DATA(biasa) if biasa is not None else NULL
    cdef Py_ssize_t kpad = nblk * block_size
    if M == 1 and block_size == 32 and K == kpad:
        # one activation row: a fused per-block product that never writes a dequantized row
        _fused_row(bp, scp, NULL, zpu, zpf, biasp, ap, op, nblk, N, nt)
        return out
    cdef _DeqJob job
    job.chunk = _rows_per_task(N, nt)
    cdef Py_ssize_t tasks = (N + job.chunk - 1) // job.chunk
    job.rows = <float*>malloc(tasks * (kpad + 4) * sizeof(float))
    if job.rows == NULL:
        raise MemoryError(f"{k}: cannot allocate {tasks} row workspaces of {(kpad + 4) * 4} bytes")
    job.bp = bp
    job.scp = scp
    job.zpu = zpu
    job.zpf = zpf
    job.biasp = biasp
    job.ap = ap
    job.op = op
    job.M = M
    job.N = N
    job.K = K
    job.nblk = nblk
    job.block_size = block_size
    job.zrow = zrow
    job.kpad = kpad
    with nogil:
        _run_row_tasks(_deq_task, &job, N, job.chunk, nt)
    free(job.rows)
    return out


cdef bint _frozen(object a):
    """Nothing in the process writes ``a``'s data: a read-only array whose bases are
    read-only arrays, ending in immutable bytes or a read-only view of them or of a memory
    map (a model's weights read from its file)."""
    while isinstance(a, cnp.ndarray):
        if cnp.PyArray_ISWRITEABLE(<cnp.ndarray>a):
            return False
        a = a.base
    if isinstance(a, memoryview):
        return (<memoryview>a).readonly and isinstance((<memoryview>a).obj, (bytes, mmap.mmap))
    return a is None or isinstance(a, bytes)


cdef class OneRowNBits:
    """A MatMulNBits kernel's call for one float32 activation row with 4-bit blocks of 32
    (a decode step): the fused product straight from the packed codes with no Python in
    between. Operands of any other form go to ``fallback(a, b, scales, zp, g_idx, bias)``,
    which checks them and raises the kernel's errors."""

    cdef Py_ssize_t K, N, nblk
    cdef int threads
    cdef object fallback
    cdef object _cached  # (scales, zero points, their scale * zero point per block) or None

    def __init__(self, Py_ssize_t K, Py_ssize_t N, Py_ssize_t block_size, int threads, fallback):
        self.K = K
        self.N = N
        self.nblk = (K + 31) // 32 if block_size == 32 and K % 32 == 0 and K > 0 and N > 0 else -1
        self.threads = threads
        self.fallback = fallback

    def __call__(self, a, b, scales, zp=None, g_idx=None, bias=None):
        cdef cnp.ndarray aa, ba, sa, za, biasa, out
        cdef Py_ssize_t K = self.K, N = self.N, nblk = self.nblk
        cdef const uint8_t* zpu = NULL
        cdef const float* zpf = NULL
        cdef const float* biasp = NULL
        cdef cnp.npy_intp dims[32]
        cdef int nd, d
        if (nblk < 0 or g_idx is not None or not cnp.PyArray_Check(a) or not cnp.PyArray_Check(b)
                or not cnp.PyArray_Check(scales)):
            return self.fallback(a, b, scales, zp, g_idx, bias)
        aa = <cnp.ndarray>a
        ba = <cnp.ndarray>b
        sa = <cnp.ndarray>scales
        nd = cnp.PyArray_NDIM(aa)
        if (nd < 1 or nd > 32 or cnp.PyArray_TYPE(aa) != cnp.NPY_FLOAT32 or not cnp.PyArray_IS_C_CONTIGUOUS(aa)
                or cnp.PyArray_SIZE(aa) != K
                or cnp.PyArray_TYPE(ba) != cnp.NPY_UINT8 or not cnp.PyArray_IS_C_CONTIGUOUS(ba)
                or ba.ndim != 3 or ba.shape[0] != N or ba.shape[1] != nblk or ba.shape[2] != 16
                or cnp.PyArray_TYPE(sa) != cnp.NPY_FLOAT32 or not cnp.PyArray_IS_C_CONTIGUOUS(sa)
                or cnp.PyArray_SIZE(sa) != N * nblk or sa.ndim > 2):
            return self.fallback(a, b, scales, zp, g_idx, bias)
        if zp is not None:
            if not cnp.PyArray_Check(zp):
                return self.fallback(a, b, scales, zp, g_idx, bias)
            za = <cnp.ndarray>zp
            if not cnp.PyArray_IS_C_CONTIGUOUS(za) or za.ndim > 2:
                return self.fallback(a, b, scales, zp, g_idx, bias)
            if cnp.PyArray_TYPE(za) == cnp.NPY_UINT8 and cnp.PyArray_SIZE(za) == N * ((nblk + 1) // 2):
                zpu = <const uint8_t*>cnp.PyArray_DATA(za)
            elif cnp.PyArray_TYPE(za) == cnp.NPY_FLOAT32 and cnp.PyArray_SIZE(za) == N * nblk:
                zpf = <const float*>cnp.PyArray_DATA(za)
            else:
                return self.fallback(a, b, scales, zp, g_idx, bias)
        if bias is not None:
            if not cnp.PyArray_Check(bias):
                return self.fallback(a, b, scales, zp, g_idx, bias)
            biasa = <cnp.ndarray>bias
            if (cnp.PyArray_TYPE(biasa) != cnp.NPY_FLOAT32 or biasa.ndim != 1 or biasa.shape[0] != N
                    or not cnp.PyArray_IS_C_CONTIGUOUS(biasa)):
                return self.fallback(a, b, scales, zp, g_idx, bias)
            biasp = <const float*>cnp.PyArray_DATA(biasa)
        for d in range(nd - 1):
            dims[d] = aa.shape[d]
        dims[nd - 1] = N
        out = cnp.PyArray_EMPTY(nd, dims, cnp.NPY_FLOAT32, 0)
        cdef int nt = _fit_threads(self.threads, N, 2.0 * N * K) if self.threads > 1 else 1
        cdef object terms = self._zero_terms(sa, zp, zpu, zpf)  # held here: another thread may replace it
        cdef const float* szp = NULL if terms is None else <const float*>cnp.PyArray_DATA(<cnp.ndarray>terms)
        _fused_row(<const uint8_t*>cnp.PyArray_DATA(ba), <const float*>cnp.PyArray_DATA(sa),
                   szp, zpu, zpf, biasp,
                   <const float*>cnp.PyArray_DATA(aa), <float*>cnp.PyArray_DATA(out), nblk, N, nt)
        return out

    cdef object _zero_terms(self, cnp.ndarray sa, object zp, const uint8_t* zpu, const float* zpf):
        """The blocks' scale * zero point (float32 [N * nblk]), computed once for read-only
        constant operands (a model's weights), else None (computed per call). The record is
        replaced whole, so a thread reading it never sees half of another's."""
        cached = self._cached
        if cached is not None and sa is cached[0] and zp is cached[1]:
            return cached[2]
        if not _frozen(sa) or (zp is not None and not _frozen(zp)):
            return None
        cdef cnp.npy_intp size = self.N * self.nblk
        cdef cnp.ndarray szp = cnp.PyArray_EMPTY(1, &size, cnp.NPY_FLOAT32, 0)
        with nogil:
            of_q4_zero_terms(<const float*>cnp.PyArray_DATA(sa), zpu, zpf, self.nblk, self.N,
                             <float*>cnp.PyArray_DATA(szp))
        self._cached = (sa, zp, szp)
        return szp
