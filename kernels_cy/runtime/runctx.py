"""The per-run context: everything one run of a compiled plan writes.

A compiled plan, its constants and its kernel objects are immutable after
compilation and shared by every thread and every state. What one run writes
lives here and reaches the kernels as an argument: the byte counters, the
published lengths of the state's in-place buffers and the lengths this run
writes, the staged pages of paged caches, the thread bound. Two runs on one
session never share a context::

    ctx = RunContext(threads=2, lengths=RunLengths(names, published))
    outs = program.run(args, ctx)          # kernels with ``uses_context`` get ``ctx`` first
    ctx.lengths.written                    # the lengths to publish if the run succeeded

A kernel that needs the context sets ``uses_context = True`` and is called as
``kernel.run(ctx, *inputs)``; every other kernel keeps ``run(*inputs)``. A kernel
that writes a state's cache in place asks :meth:`RunContext.floor` for the
published length of the buffer, refuses a write below it before touching memory
(:class:`~onnxforge.kernels_cy.errors.CacheRangeError`), and records the new length
with :meth:`RunContext.wrote`; the state publishes it only if the whole run
succeeds (rule R4).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from onnxforge.kernels_cy.runtime.plan import Counters

__all__ = ["Length", "RunContext", "RunLengths"]

Length = int | tuple[int, ...]  # a buffer's valid length: one, or one per batch row


class RunLengths:
    """Published lengths of a state's READ_WRITE buffers, handed to one run (rule R3).

    ``names`` maps ``id(buffer)`` to the bound input name, ``lengths`` the name to its
    published length, ``addresses`` (optional) a buffer's data address to the name for
    kernels that receive another array object over the same storage. Kernels call
    :meth:`floor` before a write and :meth:`wrote` after it; ``written`` holds the new
    lengths of the buffers written in this run.
    """

    __slots__ = ("_names", "_lengths", "_addresses", "written")

    def __init__(self, names: Mapping[int, str], lengths: Mapping[str, Length],
                 addresses: Mapping[int, str] | None = None):
        self._names = names
        self._lengths = lengths
        self._addresses = addresses or {}
        self.written: dict[str, Length] = {}

    def _name(self, buf: Any) -> str | None:
        name = self._names.get(id(buf))
        if name is None and self._addresses and isinstance(buf, np.ndarray):
            name = self._addresses.get(int(buf.__array_interface__["data"][0]))
        return name

    def floor(self, buf: Any) -> Length | None:
        """The published length of ``buf`` (None: the buffer is not a tracked state buffer)."""
        name = self._name(buf)
        return None if name is None else self._lengths.get(name, 0)

    def name(self, buf: Any) -> str | None:
        """The bound input name of ``buf``, for error messages."""
        return self._name(buf)

    def next(self, buf: Any) -> Length | None:
        """Where the next write of ``buf`` in this run must start: the length an earlier
        write of this run reached, else the published length (None: not tracked)."""
        name = self._name(buf)
        if name is None:
            return None
        got = self.written.get(name)
        return self._lengths.get(name, 0) if got is None else got

    def wrote(self, buf: Any, length: Length) -> None:
        """Record that this run made ``buf`` valid up to ``length`` (kept: the largest)."""
        name = self._name(buf)
        if name is None:
            return
        old = self.written.get(name)
        if old is not None:
            length = _max_length(old, length)
        self.written[name] = length


def _max_length(a: Length, b: Length) -> Length:
    if isinstance(a, int) and isinstance(b, int):
        return a if a > b else b
    return tuple(int(x) for x in np.maximum(np.asarray(a), np.asarray(b)))


class RunContext:
    """What one run writes: counters, lengths, staged pages; see the module docstring.

    ``mem``: the run's :class:`~onnxforge.kernels_cy.runtime.plan.Counters`. ``lengths``: the
    state's :class:`RunLengths` (None: a stateless run, nothing is tracked).
    ``threads``: the bound of the backend's own pool for this run. ``staged``: per
    paged cache object (by ``id``), the :class:`~onnxforge.kernels_cy.paged.pages.PageStage`
    of the tokens this run wrote, committed when the run succeeds (:meth:`commit`, by
    the state that owns the caches or by a stateless session run) and discarded
    otherwise (:meth:`discard`).
    """

    __slots__ = ("mem", "lengths", "threads", "staged")

    def __init__(self, threads: int = 1, lengths: RunLengths | None = None):
        self.mem = Counters()
        self.lengths = lengths
        self.threads = threads
        self.staged: dict[int, Any] = {}

    def floor(self, buf: Any) -> Length | None:
        """The published length of ``buf``, or None when it is not a tracked state buffer."""
        lengths = self.lengths
        return None if lengths is None else lengths.floor(buf)

    def name(self, buf: Any) -> str | None:
        lengths = self.lengths
        return None if lengths is None else lengths.name(buf)

    def next(self, buf: Any) -> Length | None:
        """Where this run's next write of ``buf`` must start (see :meth:`RunLengths.next`):
        a write above it would publish entries nobody wrote."""
        lengths = self.lengths
        return None if lengths is None else lengths.next(buf)

    def wrote(self, buf: Any, length: Length) -> None:
        lengths = self.lengths
        if lengths is not None:
            lengths.wrote(buf, length)

    def threads_for(self, work: int, bound: int) -> int | None:
        """Threads for a parallel loop of ``work`` multiply-adds under a kernel's plan-time
        ``bound``: None (one thread) below ~1M, else the smaller of the two bounds."""
        from onnxforge.kernels_cy.ops.base import PARALLEL_WORK

        n = bound if bound < self.threads else self.threads
        return n if n > 1 and work >= PARALLEL_WORK else None

    def commit(self) -> tuple[int, int]:
        """Publish every staged cache update; returns the (allocated, freed) bytes of the
        pages the commits converted (aging, KR2)."""
        allocated = freed = 0
        staged, self.staged = self.staged, {}
        for stage in staged.values():
            extra = stage.allocated_bytes
            c = stage.commit()
            allocated += c.allocated_bytes - extra
            freed += c.freed_bytes
        return allocated, freed

    def discard(self) -> None:
        """Drop every staged cache update (a failed run): nothing published changes."""
        staged, self.staged = self.staged, {}
        for stage in staged.values():
            stage.discard()
