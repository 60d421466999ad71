"""Persistent state over the CPU backend: graph-declared bindings, retained by owner.

A model declares in ``graph.bindings`` which output feeds which input on the next
call (``cache <- present``). :func:`make_state` resolves those bindings once and
returns a :class:`State` that supplies the bound inputs itself::

    state = make_state(model)                       # zeros of the declared shapes
    out = state.run({"input_ids": ids, "position": np.array(0)})
    out = state.run({"input_ids": nxt, "position": np.array(3)})
    state.values["cache.0.key"]                     # a read-only view, no copy
    state.save("state.bin"); make_state(model, initial="state.bin")

It is the ordinary stateless loop, with the retained values handed over by owner::

    outputs = session.run(None, {**feeds, **state.values})
    state.values = {inp: outputs[out] for inp, out in bindings}

Rules (RULES.md R1-R7):

* the model is never serialized, cloned, hashed or rescanned: the bindings and the
  input specs are read once at construction, and a run touches no IR object;
* a feed naming a retained input is a :class:`StateFeedError`; every other input
  comes from the feeds (the session reports a missing one);
* an output bound to a READ_WRITE input through MUST_ALIAS is that input's buffer:
  the state checks the identity before publishing (:class:`StateAliasError`);
* retained values are published only after a successful run, all at once, so a
  failed run (a wrong-dtype feed, a cache write past its capacity) leaves the
  previous state as it was; kernels check their arguments before writing and an
  append writes only at or above the published position;
* initial values are retained as they are (numpy arrays, or torch tensors and other
  DLPack producers viewed through ``np.from_dlpack``): a READ_WRITE value must be a writable,
  C-contiguous array of the declared dtype and shape, never storage bound to another
  live state; nothing is cast or copied (:class:`StateInitError` otherwise);
* ``initial=None`` gives zeros of the declared shape. A symbolic dimension of a bound
  input has no size of its own: give it in ``dims={"past_sequence_length": 0}`` (0 is
  an empty Concat-based cache) or pass that input's initial value; otherwise the error
  names the input and the dimension;
* a second ``run`` (or ``reset``/``close``) while one is active on the same state is a
  :class:`StateBusyError`; independent states share nothing.

Published lengths (rule R3). For each READ_WRITE buffer the state keeps its
published length, the valid tokens after the last successful run (``state.lengths``;
0 for zeros). A run hands these to the kernels that write caches in place
(CacheUpdate, GroupQueryAttention in shared-buffer mode): a write below the
published length, past the capacity or at a negative position is a
:class:`CacheRangeError` raised before that write, and the new lengths
(``position + n``, ``seqlens_k + 1``) are published with the values only when the
whole run succeeds. A failed run therefore leaves every buffer unchanged below its
published length and the lengths as they were; no backup copy is made.
``save`` writes the lengths too, and restoring a saved file restores them.

Structured values. A bound input typed as a struct (``TypeProto.struct_type``,
e.g. a ``Cache`` category) is retained like a tensor: a dict of field arrays
(``{"key": k, "value": v, "length": n}``) or a runtime cache object that exposes
``nbytes`` and ``buffer_addresses()`` (and ``length``, reported in
``state.lengths``). It is held by owner (never copied), its bytes count in
``cache_bytes``, ``addresses()`` lists its buffers (``"name.field"`` or
``"name[page]"``) and it is published atomically with the other values.
"""
from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
from onnxforge.graphbuilder.ir.core import READ_WRITE, Model, Value
from onnxforge.graphbuilder.ir.storage import Storage
from onnxforge.kernels_cy.errors import (
    StateAliasError,
    StateBusyError,
    StateClosedError,
    StateFeedError,
    StateInitError,
)
from onnxforge.kernels_cy.runtime.session import (
    InferenceSession,
    Length,
    RunContext,
    RunCounters,
    RunLengths,
    _load,
    is_structured,
)
from onnxforge.proto_ext.dtypes import np_dtype
from onnxforge.proto_ext.errors import CodecError
from onnxforge.proto_ext.types import StructType, TensorType

__all__ = ["Binding", "State", "StateCounters", "make_state"]


@dataclass(slots=True)
class StateCounters(RunCounters):
    """Counters of the last successful run: the session's, plus the bytes the state holds."""

    cache_bytes: int = 0


@dataclass(frozen=True, slots=True)
class Binding:
    """One persistent binding, resolved once: ``input <- output`` and what the input needs."""

    input: str
    output: str
    dtype: np.dtype | None  # None: a structured value
    shape: tuple[int | str | None, ...] | None
    read_write: bool
    must_alias: bool  # the output's alias chain ends at the input: same buffer every call

    @property
    def structured(self) -> bool:
        return self.dtype is None


# Addresses of READ_WRITE buffers retained by live states: one owner per buffer (R2).
_owners_lock = threading.Lock()
_owners: dict[int, tuple[int, int, weakref.ref]] = {}  # start address -> (end, state id, state)


def _address(a: np.ndarray) -> int:
    return int(a.__array_interface__["data"][0])


def _extent(a: np.ndarray) -> tuple[int, int]:
    start = _address(a)
    return start, start + max(a.nbytes, 1)


def _arrays(value: Any) -> list[np.ndarray]:
    """The arrays a retained value holds: itself, or a structured value's field arrays."""
    if isinstance(value, np.ndarray):
        return [value]
    if isinstance(value, dict):
        return list(value.values())
    return []


def _extents(value: Any) -> list[tuple[int, int]]:
    """Storage extents of a retained value (an opaque object: one byte per buffer address)."""
    if isinstance(value, (np.ndarray, dict)):
        return [_extent(a) for a in _arrays(value)]
    return [(a, a + 1) for a in _flat_addresses("", value).values()]


def _nbytes(value: Any) -> int:
    if isinstance(value, (np.ndarray, dict)):
        return sum(a.nbytes for a in _arrays(value))
    return int(value.nbytes)


def _flat_addresses(name: str, value: Any) -> dict[str, int]:
    """``{name: address}`` for an array; ``{name.field: ...}`` / ``{name[page]: ...}`` otherwise."""
    if isinstance(value, np.ndarray):
        return {name: _address(value)}
    if isinstance(value, dict):
        return {f"{name}.{k}": _address(a) for k, a in value.items()}
    got = value.buffer_addresses()
    items = got.items() if isinstance(got, Mapping) else enumerate(got)
    return {f"{name}[{k}]": int(a) for k, a in items}


def _read_only(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        v = value.view()
        v.flags.writeable = False
        return v
    if isinstance(value, dict):
        return {k: _read_only(a) for k, a in value.items()}
    return value  # a runtime object: its own API guards its storage


def _resolve(model: Model) -> list[Binding]:
    g = model.graph
    out: list[Binding] = []
    storage = Storage(model)  # alias roots: the one resolution (proto_ext.aliasing)
    seen_in: set[str] = set()
    seen_out: set[str] = set()
    for inp, outp in g.bindings:
        if inp.name in seen_in or outp.name in seen_out:
            raise StateInitError(f"graph.bindings selects input {inp.name!r} or output {outp.name!r} "
                                 f"twice: each whole input and output is bound at most once")
        seen_in.add(inp.name)
        seen_out.add(outp.name)
        t = inp.type
        rw = inp.access == READ_WRITE
        if isinstance(t, StructType):
            out.append(Binding(inp.name, outp.name, None, None, rw, rw and storage.root(outp) is inp))
            continue
        if not isinstance(t, TensorType):
            raise StateInitError(f"graph.bindings[{inp.name!r} <- {outp.name!r}]: only tensor and struct "
                                 f"inputs are retained by this runtime, got {t}")
        try:
            dtype = np_dtype(t.elem_type)
        except CodecError as e:
            raise StateInitError(f"graph.bindings[{inp.name!r}]: element type {t.elem_type} cannot "
                                 f"be held as state ({e})") from None
        if dtype == np.dtype(object):
            raise StateInitError(f"graph.bindings[{inp.name!r}]: string tensors cannot be persistent")
        out.append(Binding(inp.name, outp.name, dtype, t.shape, rw, rw and storage.root(outp) is inp))
    return out


class State:
    """Request-local state of one model: retained values, their published lengths, a session, a lock.

    Build it with :func:`make_state`. ``run(feeds)`` returns every output by name;
    ``values`` gives read-only views of the retained inputs; ``lengths`` their
    published lengths; ``last_run`` the counters.
    """

    def __init__(self, session: InferenceSession, bindings: list[Binding],
                 initial: Any = None, dims: Mapping[str, int] | None = None,
                 lengths: Mapping[str, Length] | None = None):
        self._session = session
        self._bindings = bindings
        self._by_input = {b.input: b for b in bindings}
        self._out_names = [v.name for v in session.model.graph.outputs]
        self._out_index = {n: i for i, n in enumerate(self._out_names)}
        missing = [b.output for b in bindings if b.output not in self._out_index]
        if missing:
            raise StateInitError(f"bound output(s) {missing} are not outputs of the model")
        self._slots = [(b.input, self._out_index[b.output], b) for b in bindings]
        self._dims = dict(dims or {})
        self._lock = threading.Lock()
        self._closed = False
        self._values: dict[str, Any] = {}
        self._held = 0  # bytes of the retained arrays and struct fields
        self._objects: list[str] = []  # inputs holding runtime cache objects (their bytes vary)
        self._lengths: dict[str, Length] = {}
        self._ids: dict[int, str] = {}  # id(READ_WRITE buffer) -> input name, for the kernels
        self._addrs: dict[int, str] = {}  # its data address -> input name
        # in-place inputs whose retained buffers a run has checked and kept (the same objects
        # since): the session does not check them again
        self._aliased = frozenset(b.input for b in bindings if b.must_alias)
        self._trusted: frozenset[str] = frozenset()
        self.last_run = StateCounters()
        values, saved = self._initial(initial)
        self._publish(values, self._initial_lengths(lengths if lengths is not None else saved))

    # -- introspection -----------------------------------------------------------
    @property
    def bindings(self) -> list[Binding]:
        return list(self._bindings)

    @property
    def session(self) -> InferenceSession:
        return self._session

    @property
    def values(self) -> dict[str, Any]:
        """Read-only views of the retained values (they keep the buffers alive); a
        structured value's fields are views too, a runtime cache object is itself."""
        self._check_open()
        return {k: _read_only(a) for k, a in self._values.items()}

    @property
    def lengths(self) -> dict[str, Length]:
        """The published length of each READ_WRITE buffer (and of each retained runtime
        cache object that has a ``length``): valid tokens after the last successful run."""
        out = dict(self._lengths)
        for k, a in self._values.items():
            if not isinstance(a, (np.ndarray, dict)) and hasattr(a, "length"):
                out[k] = int(a.length)
        return out

    @property
    def cache_bytes(self) -> int:
        """Bytes the retained values hold (a runtime cache object: the pages it holds now)."""
        held = self._held
        for k in self._objects:
            held += int(self._values[k].nbytes)
        return held

    def addresses(self) -> dict[str, int]:
        """The data address of each retained buffer: by input name, ``name.field`` for a
        structured value's fields, ``name[page]`` for a runtime cache object's buffers."""
        out: dict[str, int] = {}
        for k, a in self._values.items():
            out.update(_flat_addresses(k, a))
        return out

    # -- running -----------------------------------------------------------------
    def run(self, feeds: Mapping[str, Any], *, after_step: Any = None) -> dict[str, Any]:
        """Run one call with ``feeds`` plus the retained values; publish the bound outputs
        and the new lengths, all at once, only if the call succeeds. ``after_step(k)``
        is a fault-injection hook for tests (see :meth:`InferenceSession.run`)."""
        if not self._lock.acquire(blocking=False):
            raise StateBusyError("State.run: another call is active on this state (rule R5)")
        try:
            self._check_open()
            values = self._values
            clash = [k for k in feeds if k in values]
            if clash:
                raise StateFeedError(f"feed(s) {clash} name input(s) the state retains (rule R6); "
                                     f"feed only {self._free_inputs()}")
            args = dict(feeds)
            args.update(values)
            ctx = RunLengths(self._ids, self._lengths, self._addrs)
            run = RunContext(lengths=ctx)
            counters = RunCounters()
            outs = self._session.run(None, args, trusted=self._trusted, counters=counters,
                                     after_step=after_step, context=run)
            try:
                new = self._accept(outs, values)
                lengths = dict(self._lengths)
                for name, length in ctx.written.items():
                    lengths[name] = length
                for name in self._lengths:  # a buffer replaced by other storage starts over
                    if new.get(name) is not values.get(name) and name not in ctx.written:
                        lengths[name] = 0
                self._publish(new, lengths)
            except BaseException:
                run.discard()  # the paged caches' staged tokens: nothing of this run is published
                raise
            converted, _ = run.commit()  # the paged caches' steps publish with the values
            self._trusted = self._aliased  # checked by this run, and each is the object it was (R1)
            self.last_run = StateCounters(counters.allocated_bytes + converted, counters.copied_bytes,
                                          counters.peak_bytes, self.cache_bytes)
            return dict(zip(self._out_names, outs))
        finally:
            self._lock.release()

    def _accept(self, outs: list[Any], values: dict[str, Any]) -> dict[str, Any]:
        """The bound outputs of a finished run, checked (R1, R2, R6) before anything publishes."""
        new: dict[str, Any] = {}
        for name, k, b in self._slots:
            a = outs[k]
            if b.must_alias and a is not values[name]:
                raise StateAliasError(f"output {b.output!r} must be the buffer of READ_WRITE input "
                                      f"{name!r} (rule R1) but came back as other storage")
            if b.read_write and not b.must_alias and not _writable(a):
                raise StateAliasError(f"output {b.output!r} feeds READ_WRITE input {name!r} but "
                                      f"is not writable C-contiguous storage (rule R2)")
            if b.structured and not is_structured(a):
                raise StateAliasError(f"output {b.output!r} feeds struct input {name!r} but came back "
                                      f"as {type(a).__name__}, not a structured value (rule R6)")
            new[name] = a
        return new

    def reset(self, initial: Any = None, lengths: Mapping[str, Length] | None = None) -> None:
        """Retain ``initial`` (a mapping, a saved file, or None: zeros) in place of the state;
        ``lengths`` gives published lengths (default: 0, or those of a saved file)."""
        if not self._lock.acquire(blocking=False):
            raise StateBusyError("State.reset: a call is active on this state (rule R5)")
        try:
            self._check_open()
            values, saved = self._initial(initial)
            self._publish(values, self._initial_lengths(lengths if lengths is not None else saved))
            self.last_run = StateCounters()
        finally:
            self._lock.release()

    def rewind(self, lengths: Mapping[str, Length] | int) -> None:
        """Lower published lengths (an int applies to every READ_WRITE buffer and every
        paged cache): the next run writes again from there. Raising a length, or naming
        something that has none, is a :class:`StateInitError`; nothing changes then."""
        if not self._lock.acquire(blocking=False):
            raise StateBusyError("State.rewind: a call is active on this state (rule R5)")
        try:
            self._check_open()
            paged = {k: a for k, a in self._values.items() if _is_paged(a)}
            if isinstance(lengths, int) and not isinstance(lengths, bool):
                given: dict[str, Any] = dict.fromkeys([*self._lengths, *paged], lengths)
            elif isinstance(lengths, Mapping):
                given = dict(lengths)
            else:
                raise StateInitError(f"rewind takes an int or a mapping of lengths, got {type(lengths).__name__}")
            to_cut = {k: given.pop(k) for k in list(given) if k in paged}
            new = self._initial_lengths({**self._lengths, **given})
            up = [k for k in given if np.any(np.asarray(new[k]) > np.asarray(self._lengths[k]))]
            for k, n in to_cut.items():
                if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 0:
                    raise StateInitError(f"rewind: the length of paged cache {k!r} must be an int >= 0, got {n!r}")
                if n > paged[k].length:
                    up.append(k)
            if up:
                published = self.lengths
                raise StateInitError(f"rewind can only lower published lengths; {up} would grow "
                                     f"(published: {[published[k] for k in up]})")
            for k, n in to_cut.items():
                paged[k].truncate(int(n))
            self._lengths = new
        finally:
            self._lock.release()

    def close(self) -> None:
        """Release the retained values; views handed out earlier stay valid."""
        if not self._lock.acquire(blocking=False):
            raise StateBusyError("State.close: a call is active on this state (rule R5)")
        try:
            if not self._closed:
                self._publish({}, {})
                self._closed = True
        finally:
            self._lock.release()

    def save(self, path: str | os.PathLike) -> None:
        """Write the retained values and their published lengths to one state file
        (``make_state(model, initial=path)`` and ``reset(path)`` restore both).

        The file (format: :mod:`onnxforge.kernels_cy.runtime.statefile`) records a format
        version, a SHA-256 checksum per payload (each array, each struct field, each
        paged cache's encoded pages) and the declared identity: each bound input's name,
        dtype and shape, capacities and published lengths, and for paged caches the page
        size, page count, KV heads, head dimension and format policy. The state's lock is
        held throughout, so no run starts meanwhile (a run already active is a
        :class:`StateBusyError`). The file is written beside ``path`` under a temporary
        name, fsynced and renamed onto ``path``: on any failure (``OSError`` of a full
        disk...) the temporary file is removed and a previous file stays as it was. A
        runtime cache object other than a paged cache has no file form (:class:`StateError`).
        """
        if not self._lock.acquire(blocking=False):
            raise StateBusyError("State.save: a call is active on this state (rule R5)")
        try:
            self._check_open()
            from onnxforge.kernels_cy.runtime import statefile

            statefile.write_state(path, self._file_slots(), self._values, self._lengths)
        finally:
            self._lock.release()

    def _file_slots(self) -> list[Any]:
        """The declared identity of each bound input, as a state file records and checks it."""
        from onnxforge.kernels_cy.runtime import statefile

        model = self._session.model
        out = []
        for b in self._bindings:
            layout = _paged_layout(model, b.input) if b.structured else None
            paged = None if layout is None else statefile.PagedGeometry(*layout)
            axis = statefile.token_axis(model, b.input) if b.read_write and not b.structured else None
            out.append(statefile.Slot(b.input, b.dtype, b.shape, b.read_write, paged, axis))
        return out

    def __enter__(self) -> State:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self._release_owned(self._values)
        except (AttributeError, TypeError):  # a half-built state, or interpreter shutdown
            pass

    # -- internals ---------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise StateClosedError("the state is closed: make a new one with make_state")

    def _free_inputs(self) -> list[str]:
        return [v.name for v in self._session.model.graph.inputs if v.name not in self._by_input]

    def _publish(self, new: dict[str, Any], lengths: dict[str, Length]) -> None:
        """Claim the new READ_WRITE buffers of ``new``, then swap them and the lengths in
        and release the old. In the in-place case every retained value is the object it
        was, and nothing but the two swaps happens."""
        old = self._values
        rw = self._by_input
        if len(new) == len(old) and all(new.get(k) is a for k, a in old.items()):
            self._lengths = lengths  # the in-place case
            return
        self._trusted = frozenset()
        self._objects = [k for k, a in new.items() if not isinstance(a, (np.ndarray, dict))]
        self._held = sum(_nbytes(a) for k, a in new.items() if isinstance(a, (np.ndarray, dict)))
        gone = [a for k, a in old.items() if rw[k].read_write and new.get(k) is not a]
        added = [(k, a) for k, a in new.items() if rw[k].read_write and old.get(k) is not a]
        if gone or added:
            with _owners_lock:
                for k, a in added:
                    for start, end in _extents(a):
                        for s, (e, sid, ref) in _owners.items():
                            if s < end and start < e and sid != id(self) and ref() is not None:
                                raise StateInitError(f"READ_WRITE input {k!r}: its buffer is already "
                                                     f"bound to another live state (rule R2)")
                self._release_locked(gone)
                ref = weakref.ref(self)
                for _, a in added:
                    for start, end in _extents(a):
                        _owners[start] = (end, id(self), ref)
                for s in [s for s, (_, _, r) in _owners.items() if r() is None]:
                    del _owners[s]  # entries of states collected without close()
            self._ids = {id(a): k for k, a in new.items() if rw[k].read_write and isinstance(a, np.ndarray)}
            self._addrs = {_address(a): k for k, a in new.items()
                           if rw[k].read_write and isinstance(a, np.ndarray)}
        self._values = new
        self._lengths = lengths

    def _release_owned(self, values: dict[str, Any]) -> None:
        with _owners_lock:
            self._release_locked([a for k, a in values.items() if self._by_input[k].read_write])

    def _release_locked(self, values: list[Any]) -> None:
        for a in values:
            for start, _ in _extents(a):
                entry = _owners.get(start)
                if entry is not None and entry[1] == id(self):
                    del _owners[start]

    def _initial_lengths(self, given: Mapping[str, Length] | None) -> dict[str, Length]:
        """0 for every READ_WRITE array binding, then the ``given`` lengths, checked."""
        out: dict[str, Length] = {b.input: 0 for b in self._bindings if b.read_write and not b.structured}
        for k, v in dict(given or {}).items():
            v = cast(Any, v)
            if k not in out:
                raise StateInitError(f"published length for {k!r}, which is not a READ_WRITE array "
                                     f"binding; those are {list(out)}")
            try:
                length: Length = int(v) if np.ndim(v) == 0 else tuple(int(x) for x in np.asarray(v).ravel())
            except (TypeError, ValueError):
                raise StateInitError(f"published length of {k!r} must be an int or ints per row, "
                                     f"got {v!r}") from None
            if np.any(np.asarray(length) < 0):
                raise StateInitError(f"published length of {k!r} is negative: {length}")
            out[k] = length
        return out

    def _initial(self, initial: Any) -> tuple[dict[str, Any], dict[str, Length] | None]:
        """The values to retain and, for a saved file, its published lengths."""
        if isinstance(initial, (str, os.PathLike)):  # every byte and declaration checked first
            values, lengths = _read_saved(initial, self._file_slots())
            return self._initial(values)[0], lengths
        given = dict(initial or {})
        unknown = [k for k in given if k not in self._by_input]
        if unknown:
            raise StateInitError(f"initial value(s) for {unknown}, which are not bound inputs; the "
                                 f"bound inputs are {list(self._by_input)}")
        out: dict[str, Any] = {}
        seen: list[tuple[str, np.ndarray]] = []
        for b in self._bindings:
            a = self._check_initial(b, given[b.input]) if b.input in given else self._zeros(b)
            for x in _arrays(a):
                for other, y in seen:
                    if np.shares_memory(x, y):
                        raise StateInitError(f"initial values of {other!r} and {b.input!r} share storage: "
                                             f"each bound input needs its own buffer (rule R2)")
            seen.extend((b.input, x) for x in _arrays(a))
            out[b.input] = a
        return out, None

    def _zeros(self, b: Binding) -> Any:
        if b.structured:
            layout = _paged_layout(self._session.model, b.input)
            if layout is not None:  # an empty paged cache: no page held, length 0
                from onnxforge.kernels_cy.paged.pages import PagedKVCache

                heads, head_dim, page, pages, formats = layout
                return PagedKVCache(heads, head_dim, page, pages, formats=formats)
            raise StateInitError(f"bound input {b.input!r} is a struct value with no zero form: pass "
                                 f"its initial value (a dict of field arrays or a cache object)")
        if b.shape is None:
            raise StateInitError(f"bound input {b.input!r} has no declared shape: pass its initial value")
        dims = []
        for i, d in enumerate(b.shape):
            if isinstance(d, int) and d >= 0:
                dims.append(d)
            elif isinstance(d, str) and d in self._dims:
                dims.append(int(self._dims[d]))
            else:
                raise StateInitError(f"bound input {b.input!r}: dimension {i} is symbolic ({d!r}), so "
                                     f"zeros have no shape; pass dims={{{d!r}: N}} or its initial value")
        return np.zeros(dims, b.dtype)

    def _check_initial(self, b: Binding, x: Any) -> Any:
        if b.structured:
            return _check_structured(b, x)
        x = _as_array(b.input, x)
        if x.dtype != b.dtype:
            raise StateInitError(f"initial value of {b.input!r}: dtype {x.dtype} but the model declares "
                                 f"{b.dtype}; it is retained as it is, never cast")
        _check_layout(b, b.input, x)
        if b.shape is not None:
            bad = x.ndim != len(b.shape) or any(isinstance(d, int) and d >= 0 and d != n
                                                for d, n in zip(b.shape, x.shape))
            if bad:
                raise StateInitError(f"initial value of {b.input!r}: shape {list(x.shape)} but the model "
                                     f"declares {list(b.shape)}")
        return x


def _as_array(what: str, x: Any) -> np.ndarray:
    if not isinstance(x, np.ndarray) and hasattr(x, "__dlpack__"):
        try:  # torch and other DLPack producers: the same storage, never a copy
            x = np.from_dlpack(x)
        except (BufferError, TypeError, RuntimeError) as e:
            raise StateInitError(f"initial value of {what!r}: its DLPack export cannot be "
                                 f"viewed as a CPU array without a copy ({e})") from None
    if not isinstance(x, np.ndarray):
        raise StateInitError(f"initial value of {what!r}: pass a numpy array (retained without "
                             f"a copy), got {type(x).__name__}")
    return x


def _check_layout(b: Binding, what: str, x: np.ndarray) -> None:
    if not x.flags.c_contiguous:
        raise StateInitError(f"initial value of {what!r} is not C-contiguous: retaining it would "
                             f"need a copy (rule R7)")
    if b.read_write and not x.flags.writeable:
        raise StateInitError(f"initial value of READ_WRITE input {what!r} is not writable (rule R2)")


def _check_structured(b: Binding, x: Any) -> Any:
    """A dict of field arrays (each retained as it is) or a runtime cache object."""
    if isinstance(x, Mapping) and not isinstance(x, dict):
        raise StateInitError(f"initial value of struct input {b.input!r}: pass a dict of field arrays "
                             f"(retained as it is), got {type(x).__name__}")
    if isinstance(x, dict):
        for k, a in x.items():
            if not isinstance(k, str) or not k or "." in k:
                raise StateInitError(f"initial value of struct input {b.input!r}: field name {k!r} must "
                                     f"be a non-empty string without '.'")
            a = _as_array(f"{b.input}.{k}", a)
            _check_layout(b, f"{b.input}.{k}", a)
            x[k] = a  # a DLPack field becomes its numpy view of the same storage
        return x
    if not is_structured(x):
        raise StateInitError(f"initial value of struct input {b.input!r}: pass a dict of field arrays or "
                             f"a cache object with nbytes and buffer_addresses(), got {type(x).__name__}")
    return x


def _writable(a: Any) -> bool:
    if isinstance(a, np.ndarray):
        return bool(a.flags.writeable and a.flags.c_contiguous)
    if isinstance(a, dict):
        return all(isinstance(x, np.ndarray) and x.flags.writeable and x.flags.c_contiguous
                   for x in a.values())
    return is_structured(a)


def _is_paged(a: Any) -> bool:
    from onnxforge.kernels_cy.paged.pages import PagedKVCache

    return isinstance(a, PagedKVCache)


def _paged_layout(model: Model, name: str) -> tuple[int, int, int, int, tuple[str, ...]] | None:
    """``(kv_heads, head_dim, page_size, num_pages, formats)`` of a graph input typed by
    a reference to an ``ONNXFORGE_PAGED_KV_CACHE`` declaration, else None."""
    from onnxforge.proto_ext.codecs.kvcache import CACHE_STRUCT_NAME, FORMATS_KEY

    inp = next((v for v in model.graph.inputs if v.name == name), None)
    t = inp.type if inp is not None else None
    if not isinstance(t, StructType) or t.kind != "type_ref":
        return None
    decl = next((s for s in model.struct_types if s.type_id == t.type_ref), None)
    if decl is None or decl.name != CACHE_STRUCT_NAME:
        return None
    consts = {f.name: f.constant.array() for f in decl.fields if f.constant is not None}
    _, h, page, d = (int(v) for v in consts["page_shape"])
    formats = tuple(dict(decl.metadata).get(FORMATS_KEY, "float32").split(","))
    return h, d, page, int(consts["capacity"]) // page, formats


def _read_saved(path: str | os.PathLike, slots: list[Any]) -> tuple[dict[str, Any], dict[str, Length]]:
    """The values and lengths of a state file, checked against ``slots`` (a
    :class:`~onnxforge.kernels_cy.errors.StateFileError` otherwise)."""
    from onnxforge.kernels_cy.runtime import statefile

    return statefile.read_state(path, slots)


def make_state(model: Any, initial: Any = None, threads: int | None = None, *,
               dims: Mapping[str, int] | None = None, lengths: Mapping[str, Length] | None = None) -> State:
    """A :class:`State` for ``model`` (an :class:`InferenceSession`, or an IR Model,
    ModelProto, bytes or path, compiled here).

    ``initial``: a mapping from bound input names to arrays or structured values
    (retained without a copy; inputs left out start as zeros), a path written by
    :meth:`State.save`, or None. ``dims`` sizes the symbolic dimensions of
    zero-initialized inputs. ``lengths`` gives the published lengths of READ_WRITE
    buffers given in ``initial`` (default 0; a saved file brings its own).

    Given a session, the state runs on it without compiling: any number of states over
    one session run concurrently, each from its own thread, sharing the plan, the
    constants and the kernels (``threads`` is then the session's and must be left
    out). Given a model, the state compiles a session of its own.
    """
    if isinstance(model, InferenceSession):
        if threads is not None and threads != model.threads:
            raise StateInitError(f"make_state(session, threads={threads}): the session was compiled with "
                                 f"threads={model.threads}; a state runs with its session's bound")
        session = model
    else:
        session = InferenceSession(model, threads=threads)
    return State(session, _resolve(session.model), initial, dims, lengths)
