"""Persistent state over the CPU backend: graph-declared bindings, retained by owner.

A model declares in ``graph.bindings`` which output feeds which input on the next
call (``cache <- present``). :func:`make_state` resolves those bindings once and
returns a :class:`State` that supplies the bound inputs itself::

    state = make_state(model)                       # zeros of the declared shapes
    out = state.run({"input_ids": ids, "position": np.array(0)})
    out = state.run({"input_ids": nxt, "position": np.array(3)})
    state.values["cache.0.key"]                     # a read-only view, no copy
    state.save("state.npz"); make_state(model, initial="state.npz")

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
"""
from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from onnxforge.graphbuilder.ir import READ_WRITE, Model, Value
from onnxforge.kernels_cy.errors import (
    StateAliasError,
    StateBusyError,
    StateClosedError,
    StateFeedError,
    StateInitError,
)
from onnxforge.kernels_cy.session import InferenceSession, _load
from onnxforge.proto_ext.dtypes import np_dtype
from onnxforge.proto_ext.errors import CodecError
from onnxforge.proto_ext.types import TensorType

__all__ = ["Binding", "State", "StateCounters", "make_state"]


@dataclass(frozen=True, slots=True)
class StateCounters:
    """Counters of the last successful run: the session's, plus the bytes the state holds."""

    allocated_bytes: int = 0
    copied_bytes: int = 0
    peak_bytes: int = 0
    cache_bytes: int = 0


@dataclass(frozen=True, slots=True)
class Binding:
    """One persistent binding, resolved once: ``input <- output`` and what the input needs."""

    input: str
    output: str
    dtype: np.dtype
    shape: tuple[int | str | None, ...] | None
    read_write: bool
    must_alias: bool  # the output's alias chain ends at the input: same buffer every call


# Addresses of READ_WRITE buffers retained by live states: one owner per buffer (R2).
_owners_lock = threading.Lock()
_owners: dict[int, tuple[int, int, weakref.ref]] = {}  # start address -> (end, state id, state)


def _extent(a: np.ndarray) -> tuple[int, int]:
    start = int(a.__array_interface__["data"][0])
    return start, start + max(a.nbytes, 1)


def _root(v: Value) -> Value:
    seen = 0
    while True:
        nxt = v.aliased_input()
        if nxt is None or seen > 10_000:
            return v
        v, seen = nxt, seen + 1


def _resolve(model: Model) -> list[Binding]:
    g = model.graph
    out: list[Binding] = []
    seen_in: set[str] = set()
    seen_out: set[str] = set()
    for inp, outp in g.bindings:
        if inp.name in seen_in or outp.name in seen_out:
            raise StateInitError(f"graph.bindings selects input {inp.name!r} or output {outp.name!r} "
                                 f"twice: each whole input and output is bound at most once")
        seen_in.add(inp.name)
        seen_out.add(outp.name)
        t = inp.type
        if not isinstance(t, TensorType):
            raise StateInitError(f"graph.bindings[{inp.name!r} <- {outp.name!r}]: only tensor inputs "
                                 f"are retained by this runtime, got {t}")
        try:
            dtype = np_dtype(t.elem_type)
        except CodecError as e:
            raise StateInitError(f"graph.bindings[{inp.name!r}]: element type {t.elem_type} cannot "
                                 f"be held as state ({e})") from None
        if dtype == np.dtype(object):
            raise StateInitError(f"graph.bindings[{inp.name!r}]: string tensors cannot be persistent")
        rw = inp.access == READ_WRITE
        out.append(Binding(inp.name, outp.name, dtype, t.shape, rw, rw and _root(outp) is inp))
    return out


class State:
    """Request-local state of one model: retained values, a session, a lock.

    Build it with :func:`make_state`. ``run(feeds)`` returns every output by name;
    ``values`` gives read-only views of the retained inputs; ``last_run`` the counters.
    """

    def __init__(self, session: InferenceSession, bindings: list[Binding],
                 initial: Any = None, dims: Mapping[str, int] | None = None):
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
        self._values: dict[str, np.ndarray] = {}
        self.last_run = StateCounters()
        self._publish(self._initial(initial))

    # -- introspection -----------------------------------------------------------
    @property
    def bindings(self) -> list[Binding]:
        return list(self._bindings)

    @property
    def session(self) -> InferenceSession:
        return self._session

    @property
    def values(self) -> dict[str, np.ndarray]:
        """Read-only views of the retained values (they keep the buffers alive)."""
        self._check_open()
        out = {}
        for k, a in self._values.items():
            v = a.view()
            v.flags.writeable = False
            out[k] = v
        return out

    @property
    def cache_bytes(self) -> int:
        return sum(a.nbytes for a in self._values.values())

    def addresses(self) -> dict[str, int]:
        """The data address of each retained buffer, by input name."""
        return {k: int(a.__array_interface__["data"][0]) for k, a in self._values.items()}

    # -- running -----------------------------------------------------------------
    def run(self, feeds: Mapping[str, Any]) -> dict[str, Any]:
        """Run one call with ``feeds`` plus the retained values; publish the bound outputs."""
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
            outs = self._session.run(None, args)
            new: dict[str, np.ndarray] = {}
            for name, k, b in self._slots:
                a = outs[k]
                if b.must_alias and a is not values[name]:
                    raise StateAliasError(f"output {b.output!r} must be the buffer of READ_WRITE input "
                                          f"{name!r} (rule R1) but came back as other storage")
                if b.read_write and not b.must_alias and not (
                        isinstance(a, np.ndarray) and a.flags.writeable and a.flags.c_contiguous):
                    raise StateAliasError(f"output {b.output!r} feeds READ_WRITE input {name!r} but "
                                          f"is not writable C-contiguous storage (rule R2)")
                new[name] = a
            self._publish(new)
            r = self._session.last_run
            self.last_run = StateCounters(r.allocated_bytes, r.copied_bytes, r.peak_bytes,
                                          sum(a.nbytes for a in new.values()))
            return dict(zip(self._out_names, outs))
        finally:
            self._lock.release()

    def reset(self, initial: Any = None) -> None:
        """Retain ``initial`` (a mapping, a saved file, or None: zeros) in place of the state."""
        if not self._lock.acquire(blocking=False):
            raise StateBusyError("State.reset: a call is active on this state (rule R5)")
        try:
            self._check_open()
            self._publish(self._initial(initial))
            self.last_run = StateCounters()
        finally:
            self._lock.release()

    def close(self) -> None:
        """Release the retained values; views handed out earlier stay valid."""
        if not self._lock.acquire(blocking=False):
            raise StateBusyError("State.close: a call is active on this state (rule R5)")
        try:
            if not self._closed:
                self._publish({})
                self._closed = True
        finally:
            self._lock.release()

    def save(self, path: str | os.PathLike) -> None:
        """Write the retained values to one ``.npz`` file (``make_state(model, initial=path)``)."""
        self._check_open()
        with open(path, "wb") as fh:
            np.savez(fh, **self._values)  # type: ignore[arg-type]

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

    def _publish(self, new: dict[str, np.ndarray]) -> None:
        """Claim the new READ_WRITE buffers of ``new``, then swap them in and release the old.

        In the in-place case every retained value is the object it was, and nothing but
        the dict swap happens."""
        old = self._values
        rw = self._by_input
        gone = [a for k, a in old.items() if rw[k].read_write and new.get(k) is not a]
        added = [(k, a) for k, a in new.items() if rw[k].read_write and old.get(k) is not a]
        if gone or added:
            with _owners_lock:
                for k, a in added:
                    start, end = _extent(a)
                    for s, (e, sid, ref) in _owners.items():
                        if s < end and start < e and sid != id(self) and ref() is not None:
                            raise StateInitError(f"READ_WRITE input {k!r}: its buffer is already bound "
                                                 f"to another live state (rule R2)")
                self._release_locked(gone)
                ref = weakref.ref(self)
                for _, a in added:
                    start, end = _extent(a)
                    _owners[start] = (end, id(self), ref)
                for s in [s for s, (_, _, r) in _owners.items() if r() is None]:
                    del _owners[s]  # entries of states collected without close()
        self._values = new

    def _release_owned(self, values: dict[str, np.ndarray]) -> None:
        with _owners_lock:
            self._release_locked([a for k, a in values.items() if self._by_input[k].read_write])

    def _release_locked(self, arrays: list[np.ndarray]) -> None:
        for a in arrays:
            start, _ = _extent(a)
            entry = _owners.get(start)
            if entry is not None and entry[1] == id(self):
                del _owners[start]

    def _initial(self, initial: Any) -> dict[str, np.ndarray]:
        if isinstance(initial, (str, os.PathLike)):
            return self._initial(_read_saved(initial))
        given = dict(initial or {})
        unknown = [k for k in given if k not in self._by_input]
        if unknown:
            raise StateInitError(f"initial value(s) for {unknown}, which are not bound inputs; the "
                                 f"bound inputs are {list(self._by_input)}")
        out: dict[str, np.ndarray] = {}
        seen: list[tuple[str, np.ndarray]] = []
        for b in self._bindings:
            a = self._check_initial(b, given[b.input]) if b.input in given else self._zeros(b)
            for other, x in seen:
                if np.shares_memory(a, x):
                    raise StateInitError(f"initial values of {other!r} and {b.input!r} share storage: "
                                         f"each bound input needs its own buffer (rule R2)")
            seen.append((b.input, a))
            out[b.input] = a
        return out

    def _zeros(self, b: Binding) -> np.ndarray:
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

    def _check_initial(self, b: Binding, x: Any) -> np.ndarray:
        if not isinstance(x, np.ndarray) and hasattr(x, "__dlpack__"):
            try:  # torch and other DLPack producers: the same storage, never a copy
                x = np.from_dlpack(x)
            except (BufferError, TypeError, RuntimeError) as e:
                raise StateInitError(f"initial value of {b.input!r}: its DLPack export cannot be "
                                     f"viewed as a CPU array without a copy ({e})") from None
        if not isinstance(x, np.ndarray):
            raise StateInitError(f"initial value of {b.input!r}: pass a numpy array (retained without "
                                 f"a copy), got {type(x).__name__}")
        if x.dtype != b.dtype:
            raise StateInitError(f"initial value of {b.input!r}: dtype {x.dtype} but the model declares "
                                 f"{b.dtype}; it is retained as it is, never cast")
        if not x.flags.c_contiguous:
            raise StateInitError(f"initial value of {b.input!r} is not C-contiguous: retaining it would "
                                 f"need a copy (rule R7)")
        if b.read_write and not x.flags.writeable:
            raise StateInitError(f"initial value of READ_WRITE input {b.input!r} is not writable (rule R2)")
        if b.shape is not None:
            bad = x.ndim != len(b.shape) or any(isinstance(d, int) and d >= 0 and d != n
                                                for d, n in zip(b.shape, x.shape))
            if bad:
                raise StateInitError(f"initial value of {b.input!r}: shape {list(x.shape)} but the model "
                                     f"declares {list(b.shape)}")
        return x


def _read_saved(path: str | os.PathLike) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except (OSError, ValueError) as e:
        raise StateInitError(f"cannot read saved state {os.fspath(path)!r}: {e}") from None


def make_state(model: Any, initial: Any = None, threads: int | None = None, *,
               dims: Mapping[str, int] | None = None) -> State:
    """A :class:`State` for ``model`` (IR Model, ModelProto, bytes or path).

    ``initial``: a mapping from bound input names to arrays (retained without a copy;
    inputs left out start as zeros), a path written by :meth:`State.save`, or None.
    ``dims`` sizes the symbolic dimensions of zero-initialized inputs. Each state
    compiles its own session, so independent states share nothing.
    """
    session = InferenceSession(_load(model), threads=threads)
    return State(session, _resolve(session.model), initial, dims)
