# cython: boundscheck=False, wraparound=False, initializedcheck=False
"""Compiled calls of the view kernels: a constant-target Reshape of a C-contiguous input
becomes a numpy view with no Python between the run loop and numpy's C API."""

include "_common.pxi"

__all__ = ["ReshapeCall"]


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
