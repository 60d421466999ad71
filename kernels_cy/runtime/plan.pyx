# cython: boundscheck=False, wraparound=False, initializedcheck=False
"""The run loop of a compiled plan.

A :class:`Program` is a flat list of steps built once by ``compile.py``: per step a
bound kernel method, the integer slots it reads and writes, and the slots it
releases afterwards. Running it touches no IR object and no dict: it fills a list
of slots with the feeds and the constants, calls each kernel with a tuple of its
input arrays (preceded by the run's context for the kernels that take it, see
``kernels_cy/runtime/runctx.py``), stores the results and drops released slots. A program
holds nothing a run writes, so any number of threads may run it at once. An error a
kernel raises on purpose (an ``OnnxforgeError``) gets a note naming the step; any
other ``ArithmeticError``, ``LookupError``, ``ValueError``, ``TypeError`` or
``AttributeError`` becomes a :class:`KernelError` naming the step, so no raw numpy or
Python error reaches a caller.

:class:`Counters` is the one allocator's bookkeeping: bytes of kernel outputs
(``allocated``), bytes moved without computing a value (``copied``), and the peak
of the bytes held by live runtime buffers (``peak``).
"""
cimport numpy as cnp
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF
from cpython.tuple cimport PyTuple_New, PyTuple_SET_ITEM
from libc.stdlib cimport calloc, free

import numpy as np

from onnxforge.kernels_cy.errors import KernelError
from onnxforge.proto_ext.errors import OnnxforgeError

cnp.import_array()

__all__ = ["Counters", "Program"]


cdef extern from "Python.h":
    object PyObject_Call(object callable, object args, PyObject* kwargs)


cdef class Counters:
    """Exact per-run byte counters kept by the allocator."""

    cdef public long long allocated
    cdef public long long copied
    cdef public long long live
    cdef public long long peak
    cdef public long long pending

    def __init__(self):
        self.reset()

    cpdef void reset(self):
        self.allocated = 0
        self.copied = 0
        self.live = 0
        self.peak = 0
        self.pending = 0

    cpdef void materialized(self, long long nbytes):
        """A view kernel copied ``nbytes`` into a new buffer (allocation and copy)."""
        self.allocated += nbytes
        self.copied += nbytes
        self.pending += nbytes

    cpdef void copied_only(self, long long nbytes):
        """Bytes moved into an existing buffer (a retention or return copy)."""
        self.copied += nbytes

    cpdef void hold(self, long long nbytes):
        """A buffer allocated outside a step (a workspace or a return copy) is live."""
        self.allocated += nbytes
        self.live += nbytes
        if self.live > self.peak:
            self.peak = self.live


cdef inline long long _nbytes(object a):
    if cnp.PyArray_Check(a):
        return cnp.PyArray_NBYTES(<cnp.ndarray>a)
    if cnp.PyArray_IsAnyScalar(a) and hasattr(a, "nbytes"):  # a 0-d result as a numpy scalar
        return a.nbytes
    return 0


cdef class Program:
    """A compiled plan: run it with :meth:`run` (feeds in input order)."""

    cdef list fns
    cdef list names
    cdef list template
    cdef Py_ssize_t n_steps
    cdef Py_ssize_t n_slots
    cdef int[::1] in_off
    cdef int[::1] in_idx
    cdef int[::1] out_off
    cdef int[::1] out_idx
    cdef int[::1] rel_off
    cdef int[::1] rel_idx
    cdef int[::1] free_off
    cdef int[::1] free_idx
    cdef int[::1] group
    cdef unsigned char[::1] fresh  # per output (parallel to out_idx): a new buffer
    cdef unsigned char[::1] with_ctx  # per step: the kernel takes the run's context first
    cdef unsigned char[::1] views  # per step: a view kernel (a copy it returns is counted)
    cdef int[::1] input_slots
    cdef int[::1] output_slots

    def __init__(self, int n_slots, list template, list fns, list names, list ins, list outs,
                 list releases, list frees, list fresh, list group, list input_slots,
                 list output_slots, list with_ctx=None, list views=None):
        if len(template) != n_slots or len(group) != n_slots:
            raise ValueError("template and group must hold one entry per slot")
        self.n_slots = n_slots
        self.template = template
        self.fns = fns
        self.names = names
        self.n_steps = len(fns)
        self.in_off, self.in_idx = _flatten(ins)
        self.out_off, self.out_idx = _flatten(outs)
        self.rel_off, self.rel_idx = _flatten(releases)
        self.free_off, self.free_idx = _flatten(frees)
        flat_fresh = [f for row in fresh for f in row]
        if len(flat_fresh) != self.out_off[self.n_steps]:
            raise ValueError("fresh needs one flag per step output")
        self.fresh = np.asarray(flat_fresh + [0], dtype=np.uint8)
        self.group = np.asarray(group, dtype=np.int32)
        if with_ctx is None:
            with_ctx = [False] * self.n_steps
        if len(with_ctx) != self.n_steps:
            raise ValueError("with_ctx needs one flag per step")
        self.with_ctx = np.asarray([bool(f) for f in with_ctx] + [False], dtype=np.uint8)
        if views is None:
            views = [False] * self.n_steps
        if len(views) != self.n_steps:
            raise ValueError("views needs one flag per step")
        self.views = np.asarray([bool(f) for f in views] + [False], dtype=np.uint8)
        self.input_slots = np.asarray(input_slots, dtype=np.int32)
        self.output_slots = np.asarray(output_slots, dtype=np.int32)

    @property
    def num_steps(self) -> int:
        return self.n_steps

    def run(self, list feeds, ctx, after_step=None):
        """Run every step with the run's context ``ctx`` (a ``RunContext``: its ``mem``
        counters are filled, kernels that take it receive it first); returns the graph
        outputs in order (a list). ``after_step(k)`` (a test hook) is called after each
        step ``k``; an exception it raises fails the run there."""
        cdef Py_ssize_t k, j, n, base, s, c
        cdef long long b
        cdef object res, obj, args
        cdef Counters mem = ctx.mem
        cdef object hook = after_step
        cdef list slots = list(self.template)
        cdef long long* owned = <long long*>calloc(self.n_slots if self.n_slots > 0 else 1, sizeof(long long))
        if owned == NULL:
            raise MemoryError()
        try:
            if len(feeds) != self.input_slots.shape[0]:
                raise ValueError(f"expected {self.input_slots.shape[0]} feeds, got {len(feeds)}")
            for j in range(self.input_slots.shape[0]):
                slots[self.input_slots[j]] = feeds[j]
            for k in range(self.n_steps):
                base = self.in_off[k]
                n = self.in_off[k + 1] - base
                c = self.with_ctx[k]
                args = PyTuple_New(n + c)
                if c:
                    Py_INCREF(ctx)
                    PyTuple_SET_ITEM(args, 0, ctx)
                for j in range(n):
                    s = self.in_idx[base + j]
                    obj = slots[s] if s >= 0 else None
                    Py_INCREF(obj)
                    PyTuple_SET_ITEM(args, j + c, obj)
                try:
                    res = PyObject_Call(self.fns[k], args, NULL)
                except OnnxforgeError as exc:
                    exc.add_note(f"while running {self.names[k]}")
                    raise
                except (ArithmeticError, LookupError, ValueError, TypeError, AttributeError) as exc:
                    # a check a kernel missed: typed, naming the node, never numpy's raw error
                    raise KernelError(f"{self.names[k]}: {type(exc).__name__}: {exc}") from exc
                base = self.out_off[k]
                n = self.out_off[k + 1] - base
                if n == 1:
                    s = self.out_idx[base]
                    slots[s] = res
                    if self.views[k] and self.in_off[k + 1] > self.in_off[k] and _copied(res, args[c]):
                        mem.materialized(_nbytes(res))
                    if self.fresh[base]:
                        b = _nbytes(res)
                        mem.allocated += b
                        owned[s] += b
                        mem.live += b
                    elif mem.pending:
                        owned[self.group[s]] += mem.pending
                        mem.live += mem.pending
                        mem.pending = 0
                elif n > 1:
                    for j in range(n):
                        s = self.out_idx[base + j]
                        obj = res[j]
                        slots[s] = obj
                        if self.fresh[base + j]:
                            b = _nbytes(obj)
                            mem.allocated += b
                            owned[s] += b
                            mem.live += b
                    if mem.pending:
                        s = self.out_idx[base]
                        owned[self.group[s]] += mem.pending
                        mem.live += mem.pending
                        mem.pending = 0
                if mem.live > mem.peak:
                    mem.peak = mem.live
                for j in range(self.rel_off[k], self.rel_off[k + 1]):
                    slots[self.rel_idx[j]] = None
                for j in range(self.free_off[k], self.free_off[k + 1]):
                    s = self.free_idx[j]
                    mem.live -= owned[s]
                    owned[s] = 0
                if hook is not None:
                    try:
                        hook(k)
                    except BaseException as exc:
                        if hasattr(exc, "add_note"):
                            exc.add_note(f"after {self.names[k]}")
                        raise
            return [slots[self.output_slots[j]] for j in range(self.output_slots.shape[0])]
        finally:
            free(owned)


cdef bint _copied(object out, object src):
    """``out`` is an array holding bytes outside the storage of the array ``src``."""
    if not cnp.PyArray_Check(out) or not cnp.PyArray_Check(src):
        return False
    cdef cnp.ndarray o = <cnp.ndarray>out
    cdef cnp.ndarray a = <cnp.ndarray>src
    if cnp.PyArray_SIZE(o) == 0:
        return False
    cdef char* lo = <char*>cnp.PyArray_DATA(a)
    cdef char* hi = lo + cnp.PyArray_ITEMSIZE(a)
    cdef int i
    cdef cnp.npy_intp ext
    for i in range(cnp.PyArray_NDIM(a)):
        if a.shape[i] == 0:
            return True
        ext = (a.shape[i] - 1) * a.strides[i]
        if ext < 0:
            lo += ext
        else:
            hi += ext
    cdef char* p = <char*>cnp.PyArray_DATA(o)
    return not (lo <= p < hi)


def _flatten(list rows):
    """Offsets and flat indices of a list of int tuples (CSR form)."""
    off = np.zeros(len(rows) + 1, dtype=np.int32)
    total = 0
    for i, r in enumerate(rows):
        total += len(r)
        off[i + 1] = total
    flat = np.empty(max(total, 1), dtype=np.int32)
    pos = 0
    for r in rows:
        for v in r:
            flat[pos] = v
            pos += 1
    return off, flat
