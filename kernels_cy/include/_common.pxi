# Shared declarations and argument checks, textually included by the kernel modules.
cimport numpy as cnp
from libc.stdint cimport uint8_t, int32_t, int64_t

from onnxforge.kernels_cy.errors import CacheRangeError, KernelDtypeError, KernelError

cnp.import_array()

cdef extern from "_simd.h" nogil:
    float of_dot(const float* a, const float* b, Py_ssize_t n)
    void of_axpy(float* y, float alpha, const float* x, Py_ssize_t n)
    void of_scal(float* y, float alpha, Py_ssize_t n)
    float of_expsum(float* x, float m, Py_ssize_t n)
    void of_sigmoid(const float* x, float* y, Py_ssize_t n)
    float of_maxf(const float* x, Py_ssize_t n)
    void of_deq4(const uint8_t* codes, const float* scales, const uint8_t* zp_packed,
                 const float* zp_float, float* dst, Py_ssize_t k, Py_ssize_t block_size)
    void of_qk(const float* q, Py_ssize_t qhs, Py_ssize_t G, const float* k, Py_ssize_t ks,
               Py_ssize_t nb, Py_ssize_t d, float scale, float* sc, Py_ssize_t ldsc)
    void of_pv(float* acc, Py_ssize_t ldacc, Py_ssize_t G, const float* p, Py_ssize_t ldp,
               const float* v, Py_ssize_t vs, Py_ssize_t nb, Py_ssize_t d)
    void of_dot4(const float* w, const float* a, Py_ssize_t lda, Py_ssize_t n, float* out)
    void of_q4_prepare(const float* a, float* ap, float* asum, Py_ssize_t nblk)
    void of_q4_zero_terms(const float* scales, const uint8_t* zp_packed, const float* zp_float,
                          Py_ssize_t nblk, Py_ssize_t nrows, float* szp)
    void of_q4dot32_rows(const uint8_t* codes, const float* scales, const float* ap, Py_ssize_t nblk,
                         Py_ssize_t nrows, float* out)
    int of_simd_init()
    void of_simd_force_baseline(int on)
    int of_simd_avx2
    int of_simd_avx512

of_simd_init()


cdef inline tuple _shape(cnp.ndarray a):
    return (<object>a).shape


cdef inline cnp.ndarray _arr(object a, str kernel, str name):
    if not isinstance(a, cnp.ndarray):
        raise KernelDtypeError(f"{kernel}: {name} must be a numpy.ndarray, got {type(a).__name__}")
    return <cnp.ndarray>a


cdef cnp.ndarray _f32(object a, str kernel, str name, int ndim, bint writable=False,
                             bint contiguous=True):
    """Check a float32 array of rank ``ndim`` (C-contiguous unless ``contiguous`` is False,
    then only the last axis must be unit-stride)."""
    cdef cnp.ndarray arr = _arr(a, kernel, name)
    if cnp.PyArray_TYPE(arr) != cnp.NPY_FLOAT32:
        extra = " (float16 is not supported yet: cast to float32)" if arr.dtype.char == "e" else ""
        raise KernelDtypeError(f"{kernel}: {name} must be float32, got {arr.dtype}{extra}")
    if cnp.PyArray_NDIM(arr) != ndim:
        raise KernelError(f"{kernel}: {name} must have rank {ndim}, got shape {_shape(arr)}")
    if contiguous:
        if not cnp.PyArray_IS_C_CONTIGUOUS(arr):
            raise KernelError(f"{kernel}: {name} must be C-contiguous")
    elif ndim > 0 and cnp.PyArray_SIZE(arr) > 0 and cnp.PyArray_DIMS(arr)[ndim - 1] > 1 and cnp.PyArray_STRIDES(arr)[ndim - 1] != 4:
        raise KernelError(f"{kernel}: {name} must have a unit-stride last axis, strides {(<object>arr).strides}")
    if writable and not cnp.PyArray_ISWRITEABLE(arr):
        raise KernelError(f"{kernel}: {name} is read-only")
    return arr


cdef inline void _same_shape(cnp.ndarray a, cnp.ndarray b, str kernel, str an, str bn) except *:
    if not cnp.PyArray_SAMESHAPE(a, b):
        raise KernelError(f"{kernel}: {bn} has shape {_shape(b)}, expected {an}'s shape {_shape(a)}")


cdef inline int _threads(object num_threads, str kernel) except -1:
    if num_threads is None:
        return 1
    cdef int n = num_threads
    if n < 1:
        raise KernelError(f"{kernel}: num_threads must be >= 1, got {n}")
    return n


def simd_avx2() -> bool:
    """True when the AVX2+FMA code paths of the vector primitives are in use."""
    return bool(of_simd_avx2)


def simd_avx512() -> bool:
    """True when the primitives that have an AVX-512 version use it."""
    return bool(of_simd_avx512)


def _force_baseline_simd(int on) -> None:
    """Use the portable vector primitives (``on`` true or 1), AVX2 without AVX-512 (2), or
    the best the CPU supports again (0 or False)."""
    of_simd_force_baseline(on)


cdef inline int _fit_threads(int nt, Py_ssize_t items, double work) noexcept:
    """Threads worth waking for ``items`` parallel items costing ``work`` flops in total:
    one below ~64k flops (a wake-up costs more than it saves), never more than items."""
    if work < 65536.0 or items < 2:
        return 1
    return nt if nt < items else <int>items


cdef inline void _rotate_head(const float* x, float* y, const float* c, const float* s, Py_ssize_t half,
                              Py_ssize_t D, bint interleaved) noexcept nogil:
    """Rotary embedding of one head (``_rotary.pyx`` gives the formulas); ``y`` may be ``x``."""
    cdef Py_ssize_t i
    cdef float x0, x1
    if interleaved:
        for i in range(half):
            x0 = x[2 * i]
            x1 = x[2 * i + 1]
            y[2 * i] = x0 * c[i] - x1 * s[i]
            y[2 * i + 1] = x1 * c[i] + x0 * s[i]
    else:
        for i in range(half):
            x0 = x[i]
            x1 = x[i + half]
            y[i] = x0 * c[i] - x1 * s[i]
            y[i + half] = x1 * c[i] + x0 * s[i]
    if y != x:
        for i in range(2 * half, D):
            y[i] = x[i]
