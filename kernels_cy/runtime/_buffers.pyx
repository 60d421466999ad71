# cython: boundscheck=False, wraparound=False
"""Low-level buffer helpers shared by the CPU kernels."""
cimport numpy as cnp
from libc.string cimport memcpy

cnp.import_array()


def buffer_address(cnp.ndarray arr not None) -> int:
    """Address of an array's first element (used to check pointer identity of aliases)."""
    return <size_t>cnp.PyArray_DATA(arr)


def write_rows(cnp.ndarray dst not None, cnp.ndarray src not None, Py_ssize_t start):
    """Copy ``src`` into rows ``[start, start + len(src))`` of ``dst`` in place.

    Both arrays must be C-contiguous with the same dtype and row shape; rows that
    do not fit raise ValueError before anything is written.
    """
    dshape = (<object>dst).shape
    sshape = (<object>src).shape
    if dst.dtype != src.dtype:
        raise ValueError(f"dtype mismatch: {dst.dtype} vs {src.dtype}")
    if not (cnp.PyArray_IS_C_CONTIGUOUS(dst) and cnp.PyArray_IS_C_CONTIGUOUS(src)):
        raise ValueError("write_rows needs C-contiguous arrays")
    if len(sshape) != len(dshape) or len(dshape) == 0 or sshape[1:] != dshape[1:]:
        raise ValueError(f"row shape mismatch: {sshape} into {dshape}")
    cdef Py_ssize_t rows = sshape[0]
    if start < 0 or start + rows > dshape[0]:
        raise ValueError(f"rows [{start}, {start + rows}) outside capacity {dshape[0]}")
    cdef Py_ssize_t row_bytes = cnp.PyArray_NBYTES(src) // rows if rows else 0
    cdef char* d = <char*>cnp.PyArray_DATA(dst) + start * row_bytes
    memcpy(d, <char*>cnp.PyArray_DATA(src), rows * row_bytes)
