# cython: boundscheck=False, wraparound=False, initializedcheck=False
"""Compiled calls of the data-movement kernels: a constant-target Reshape of a C-contiguous
input becomes a numpy view, and a constant Split of a C-contiguous input copies each part
with ``memcpy``, with no Python between the run loop and numpy's C API."""
from libc.string cimport memcpy

include "_common.pxi"

__all__ = ["ReshapeCall", "SplitCall"]


cdef class ReshapeCall:
    """A Reshape kernel's call for a constant target (``0`` copies the input's dimension
    unless ``allowzero``, one ``-1`` is inferred): a C-contiguous input becomes a view with
    no Python in between; anything else goes to ``fallback(x, shape)``."""

    cdef cnp.npy_intp dims[32]
    cdef int nd
    cdef bint allowzero
    cdef object fallback

    def __init__(self, target, bint allowzero, fallback):
        if len(target) > 32:
            raise KernelError(f"reshape: rank {len(target)} exceeds 32")
        self.nd = len(target)
        for i, d in enumerate(target):
            self.dims[i] = int(d)
        self.allowzero = allowzero
        self.fallback = fallback

    def __call__(self, x, shape=None):
        cdef cnp.ndarray xa
        cdef cnp.npy_intp dims[32]
        cdef cnp.PyArray_Dims newshape
        cdef int i
        if not cnp.PyArray_Check(x):
            return self.fallback(x, shape)
        xa = <cnp.ndarray>x
        if not cnp.PyArray_IS_C_CONTIGUOUS(xa):
            return self.fallback(x, shape)
        for i in range(self.nd):
            dims[i] = self.dims[i]
            if dims[i] == 0 and not self.allowzero:
                if i >= cnp.PyArray_NDIM(xa):
                    return self.fallback(x, shape)
                dims[i] = xa.shape[i]
        newshape.ptr = dims
        newshape.len = self.nd
        return cnp.PyArray_Newshape(xa, &newshape, cnp.NPY_CORDER)


cdef class SplitCall:
    """A Split kernel's call for constant part sizes along ``axis`` (negative counts from the
    end): a C-contiguous input whose axis has the parts' total extent gives one new
    C-contiguous array per part (never a view), copied row by row; anything else goes to
    ``fallback(x, split)``."""

    cdef list sizes
    cdef int axis
    cdef Py_ssize_t extent
    cdef object fallback

    def __init__(self, sizes, int axis, fallback):
        self.sizes = [int(v) for v in sizes]
        if any(v < 0 for v in self.sizes):
            raise KernelError(f"split: part sizes must not be negative, got {self.sizes}")
        self.axis = axis
        self.extent = sum(self.sizes)
        self.fallback = fallback

    def __call__(self, x, split=None):
        cdef cnp.ndarray xa, part
        cdef cnp.npy_intp dims[32]
        cdef int nd, a, i
        cdef Py_ssize_t outer = 1, inner, row, lo = 0, size, o
        cdef char* src
        cdef char* dst
        if not cnp.PyArray_Check(x):
            return self.fallback(x, split)
        xa = <cnp.ndarray>x
        nd = cnp.PyArray_NDIM(xa)
        a = self.axis + nd if self.axis < 0 else self.axis
        if (not 0 <= a < nd or nd > 32 or not cnp.PyArray_IS_C_CONTIGUOUS(xa) or xa.shape[a] != self.extent
                or cnp.PyArray_TYPE(xa) == cnp.NPY_OBJECT):
            return self.fallback(x, split)
        inner = cnp.PyArray_ITEMSIZE(xa)
        for i in range(nd):
            dims[i] = xa.shape[i]
            if i < a:
                outer *= xa.shape[i]
            elif i > a:
                inner *= xa.shape[i]
        row = self.extent * inner
        src = <char*>cnp.PyArray_DATA(xa)
        out = []
        for size in self.sizes:
            dims[a] = size
            part = cnp.PyArray_EMPTY(nd, dims, cnp.PyArray_TYPE(xa), 0)
            dst = <char*>cnp.PyArray_DATA(part)
            if size * inner:
                with nogil:
                    for o in range(outer):
                        memcpy(dst + o * size * inner, src + o * row + lo * inner, size * inner)
            lo += size
            out.append(part)
        return tuple(out)
