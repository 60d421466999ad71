# cython: boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""CacheUpdate (``ai.onnxforge``): write new tokens into a capacity-sized cache in place.

``cache[..., position:position + n, ...] = values`` along ``axis`` (default -2,
the sequence axis), with ``position`` one scalar or one per batch row (axis 0).
Every range is checked before the first byte is written, so a rejected update
leaves the cache untouched. Element types: float32, float16, bfloat16, int8,
uint8 (the copy is by bytes; any fixed-size dtype of 1, 2 or 4 bytes works).
"""
import operator

from libc.string cimport memcpy

include "_common.pxi"

__all__ = ["DTYPES", "cache_update"]

cdef enum:
    NPY_USERDEF = 256   # first type number of a user-defined dtype (ml_dtypes bfloat16)

DTYPES = frozenset({"float32", "float16", "bfloat16", "int8", "uint8"})  # the element types copied here


def cache_update(cache, values, position, int axis=-2, out_len=None):
    """Write ``values`` into ``cache`` at ``[position, position + n)`` along ``axis``.

    cache: C-contiguous writable array [..., capacity, ...]; values: same dtype
    and rank, the same dims except ``n`` along ``axis``; position: int (or 0-d
    integer array) or an int32/int64 array [batch] (batch = cache.shape[0],
    ``axis`` must then not be 0). Returns the new valid length: ``position + n``
    (an int) for a scalar position; for per-row positions the lengths are written
    into ``out_len`` (int64 [batch]) when given and their maximum is returned.
    Raises CacheRangeError for a negative position or ``position + n > capacity``,
    KernelError / KernelDtypeError for shapes and types; nothing is written then.
    """
    cdef str k = "cache_update"
    cdef cnp.ndarray ca = _arr(cache, k, "cache")
    cdef cnp.ndarray va = _arr(values, k, "values")
    cdef int ct = cnp.PyArray_TYPE(ca)
    if ct != cnp.PyArray_TYPE(va) or (ct >= NPY_USERDEF and ca.dtype != va.dtype):
        raise KernelDtypeError(f"{k}: values are {va.dtype}, the cache is {ca.dtype}")
    if not (ct == cnp.NPY_FLOAT32 or ct == cnp.NPY_FLOAT16 or ct == cnp.NPY_INT8
            or ct == cnp.NPY_UINT8 or (ct >= NPY_USERDEF and ca.dtype.name == "bfloat16")):
        raise KernelDtypeError(f"{k}: dtype {ca.dtype} is not one of {sorted(DTYPES)}")
    cdef int nd = cnp.PyArray_NDIM(ca)
    if nd < 1 or cnp.PyArray_NDIM(va) != nd:
        raise KernelError(f"{k}: values have shape {_shape(va)}, the cache has shape {_shape(ca)}")
    if axis < -nd or axis >= nd:
        raise KernelError(f"{k}: axis {axis} out of range for rank {nd}")
    if axis < 0:
        axis += nd
    cdef cnp.npy_intp* cdims = cnp.PyArray_DIMS(ca)
    cdef cnp.npy_intp* vdims = cnp.PyArray_DIMS(va)
    cdef Py_ssize_t i
    for i in range(nd):
        if i != axis and cdims[i] != vdims[i]:
            raise KernelError(f"{k}: values have shape {_shape(va)}, expected {_shape(ca)} "
                              f"except along axis {axis}")
    if not cnp.PyArray_IS_C_CONTIGUOUS(ca):
        raise KernelError(f"{k}: the cache must be C-contiguous (it is updated in place)")
    if not cnp.PyArray_ISWRITEABLE(ca):
        raise KernelError(f"{k}: the cache is read-only")
    if not cnp.PyArray_IS_C_CONTIGUOUS(va):
        raise KernelError(f"{k}: values must be C-contiguous")
    cdef Py_ssize_t cap = cdims[axis], n = vdims[axis]
    cdef Py_ssize_t outer = 1, inner = cnp.PyArray_ITEMSIZE(ca)
    for i in range(axis):
        outer *= cdims[i]
    for i in range(axis + 1, nd):
        inner *= cdims[i]
    cdef Py_ssize_t batch = cdims[0]
    cdef cnp.ndarray pa
    cdef const int64_t[::1] pv
    cdef int64_t[::1] lv
    cdef Py_ssize_t pos, per, b, o, newmax
    cdef char* cp = <char*>cnp.PyArray_DATA(ca)
    cdef const char* vp = <const char*>cnp.PyArray_DATA(va)
    if isinstance(position, cnp.ndarray) and (<cnp.ndarray>position).ndim == 1:
        pa = <cnp.ndarray>position
        if pa.dtype.kind not in "iu":
            raise KernelDtypeError(f"{k}: position must be an integer array, got {pa.dtype}")
        if axis == 0:
            raise KernelError(f"{k}: per-row positions need a batch axis before the sequence axis")
        if pa.shape[0] != batch:
            raise KernelError(f"{k}: position has {pa.shape[0]} entries, the cache batch is {batch}")
        pa = cnp.PyArray_FROMANY(pa, cnp.NPY_INT64, 1, 1, cnp.NPY_ARRAY_C_CONTIGUOUS)
        pv = pa
        for b in range(batch):
            if pv[b] < 0 or pv[b] + n > cap:
                raise CacheRangeError(
                    f"{k}: row {b} writes [{pv[b]}, {pv[b] + n}) outside capacity {cap}")
        if out_len is not None:
            la = _arr(out_len, k, "out_len")
            if la.dtype != "int64" or _shape(la) != (batch,) or not la.flags.writeable:
                raise KernelError(f"{k}: out_len must be a writable int64 array of shape ({batch},)")
            lv = la
        per = outer // batch if batch else 0
        newmax = 0
        with nogil:
            for b in range(batch):
                pos = pv[b]
                if pos + n > newmax:
                    newmax = pos + n
                for o in range(b * per, (b + 1) * per):
                    memcpy(cp + (o * cap + pos) * inner, vp + o * n * inner, n * inner)
        if out_len is not None:
            for b in range(batch):
                lv[b] = pv[b] + n
        return newmax
    if isinstance(position, int):
        pos = position
    else:
        try:
            pos = operator.index(position)
        except TypeError:
            raise KernelDtypeError(f"{k}: position must be an integer or an integer array [batch], "
                                   f"got {type(position).__name__}") from None
    if pos < 0 or pos + n > cap:
        raise CacheRangeError(f"{k}: writes [{pos}, {pos + n}) outside capacity {cap}")
    if n == 0 or inner == 0:
        return pos + n
    with nogil:
        for o in range(outer):
            memcpy(cp + (o * cap + pos) * inner, vp + o * n * inner, n * inner)
    return pos + n
