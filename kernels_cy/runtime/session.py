"""``InferenceSession``: compile a model once, run it many times on the CPU backend::

    sess = InferenceSession(model)                  # IR Model, ModelProto, bytes or path
    logits, *present = sess.run(None, feeds)        # like onnxruntime: a list
    sess.last_run.allocated_bytes                   # exact per-run counters

Feeds are checked before anything runs: a missing or unknown name, a wrong dtype or
rank, or a concrete dimension that contradicts the model raises :class:`FeedError`
naming the input. A READ_WRITE input is caller storage: the caller's array is bound
as it is (writable, C-contiguous, the model's dtype, else FeedError before any
write) and outputs that must alias it return that same buffer.

An input typed as a struct (``TypeProto.struct_type``: a ``Cache`` category value)
takes a structured value as it is, never converted: a dict of field arrays
(``{"key": k, "value": v, "length": n}``) or a runtime object that exposes
``nbytes`` and ``buffer_addresses()`` (a paged cache). Kernels that pass values
through (Identity) hand it on by owner.

Threads. A session is compiled once and then read-only: its plan, constants and
kernel objects are shared by every thread and every state, and everything one run
writes (scratch, published and written lengths, counters, outputs) lives in that
run's :class:`~onnxforge.kernels_cy.runtime.runctx.RunContext`. Any number of threads may call
:meth:`InferenceSession.run` at once, and any number of states made over one session
(``make_state(sess)``) run concurrently. A call's result is bitwise equal to the same
call run alone with the same ``threads=``: no kernel splits its work by the number of
pool threads it obtains. ``sess.last_run`` is the counters of the last run to finish
(under threads, whichever that was); pass ``counters=RunCounters()`` to get one run's.

Published lengths (rule R3): ``run(..., lengths=RunLengths(...))`` hands the
kernels that write a READ_WRITE cache in place the valid length of each buffer
after the previous successful call, through the run's context. Such a kernel asks
``ctx.floor(cache)`` for the floor of the buffer it writes, refuses a write below it
before touching memory (:class:`CacheRangeError`), and records the buffer's new
length with ``ctx.wrote(cache, end)``, which the caller publishes only if the whole
run succeeds.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from onnxforge.graphbuilder.ir.core import READ_WRITE, Model, Value
from onnxforge.kernels_cy.runtime.compile import compile_model
from onnxforge.kernels_cy.errors import BackendError, FeedError
from onnxforge.kernels_cy.ops import fast
from onnxforge.kernels_cy.runtime.runctx import Length, RunContext, RunLengths
from onnxforge.kernels_cy.runtime.threads import BLAS
from onnxforge.proto_ext.dtypes import np_dtype
from onnxforge.proto_ext.errors import CodecError, OnnxforgeError, VerificationError
from onnxforge.proto_ext.types import StructType, TensorType, type_name

__all__ = ["InferenceSession", "Length", "NodeArg", "RunContext", "RunCounters", "RunLengths", "backend_ops",
           "is_structured"]

def is_structured(x: Any) -> bool:
    """True for a structured value: a dict of field arrays, or an object with ``nbytes``
    and ``buffer_addresses()`` (a runtime cache object)."""
    if isinstance(x, dict):
        return all(isinstance(k, str) and isinstance(a, np.ndarray) for k, a in x.items())
    return not isinstance(x, np.ndarray) and hasattr(x, "nbytes") and callable(getattr(x, "buffer_addresses", None))


@dataclass(slots=True)
class RunCounters:
    """Counters of one run: bytes of new buffers, payload bytes copied, peak bytes held.

    ``sess.run(..., counters=c)`` fills ``c`` when the run returns (also when it fails)."""

    allocated_bytes: int = 0
    copied_bytes: int = 0
    peak_bytes: int = 0

    def _fill(self, mem: Any) -> None:
        self.allocated_bytes = int(mem.allocated)
        self.copied_bytes = int(mem.copied)
        self.peak_bytes = int(mem.peak)


@dataclass(frozen=True, slots=True)
class NodeArg:
    """An input or output as onnxruntime describes it: ``tensor(float)``, dims or symbols."""

    name: str
    type: str
    shape: list[int | str | None] | None


def _type_string(t: Any) -> str:
    if isinstance(t, TensorType):
        return f"tensor({type_name(t.elem_type).lower()})"
    return str(t) if t is not None else "unknown"


def _load(model: Any) -> Model:
    """The IR of ``model`` once it keeps every static rule (X1 and X2 included), checked
    before anything is compiled: a path, bytes or a ModelProto on the message its IR is
    then decoded from (read and parsed once, before the IR is built), an IR model on its
    own view, never serialized. A model that breaks a rule raises
    :class:`VerificationError` naming the rule and the path, never an error from deep
    inside the compiler."""
    if isinstance(model, Model):
        from onnxforge.proto_ext.verify.source import source_violations

        violations = source_violations(model)
        if violations:
            raise VerificationError(violations)
        return model
    if not isinstance(model, (str, os.PathLike, bytes, bytearray, memoryview)) \
            and not hasattr(model, "SerializeToString"):
        raise BackendError(f"InferenceSession needs an IR Model, a ModelProto, bytes or a path, "
                           f"got {type(model).__name__}")
    from onnxforge.graphbuilder import serde

    return serde.load(model, verify=True)


@dataclass(slots=True)
class _InputSpec:
    name: str
    dtype: np.dtype | None
    shape: tuple | None
    read_write: bool
    default: np.ndarray | None
    struct: bool = False  # typed TypeProto.struct_type: a structured value, passed as it is
    fixed: tuple[tuple[int, int], ...] = ()  # (axis, size) of every concrete dimension
    other: str | None = None  # a type the backend does not run (sequence, optional, map): its name

    def __post_init__(self) -> None:
        if self.shape is not None:
            self.fixed = tuple((i, d) for i, d in enumerate(self.shape) if isinstance(d, int) and d >= 0)


def backend_ops() -> list[tuple[str, str]]:
    """The ``(domain, op_type)`` pairs the CPU backend claims (``""``: the ONNX domain)."""
    from onnxforge.kernels_cy.ops.base import claimed_ops

    return claimed_ops()


class InferenceSession:
    """A model compiled into a flat plan for the CPU backend."""

    def __init__(self, model: Any, threads: int | None = None, fallback: str | None = None, *,
                 verify: bool = True):
        """Compile ``model``; it is verified first (every static rule; ``verify=False``
        only for an IR model its caller built and checked, such as a decoder function's
        body)."""
        if threads is not None and (not isinstance(threads, int) or threads < 1):
            raise BackendError(f"threads must be None or a positive int, got {threads!r}")
        self.model = _load(model) if verify or not isinstance(model, Model) else model
        self.threads = threads
        effects = None
        try:
            from onnxforge.passes.analyses.effects import effect_analysis

            effects = effect_analysis(self.model)
        except (OnnxforgeError, ValueError):  # a model the analysis refuses: plan without it
            effects = None
        self._cg, _ = compile_model(self.model, fallback=fallback, effects=effects,
                                    threads=threads or os.cpu_count() or 1)
        self.fallback_nodes: list[str] = list(self._cg.fallback_nodes)
        g = self.model.graph
        self._specs = [self._input_spec(v) for v in g.inputs]
        self._index = {s.name: i for i, s in enumerate(self._specs)}
        self._outputs = [v.name for v in g.outputs]
        self._out_index = {n: i for i, n in enumerate(self._outputs)}
        self.last_run = RunCounters()
        self._bound = threads or os.cpu_count() or 1

    def _input_spec(self, v: Value) -> _InputSpec:
        t = v.type
        dtype = None
        shape = None
        if isinstance(t, TensorType):
            try:
                dtype = np_dtype(t.elem_type)
            except CodecError:
                dtype = np.dtype(object) if t.elem_type == 8 else None
            shape = t.shape
        default = None
        if v.const is not None:
            default = self._cg_const(v)
        other = None if t is None or isinstance(t, (TensorType, StructType)) else _type_string(t)
        return _InputSpec(v.name, dtype, shape, v.access == READ_WRITE, default, isinstance(t, StructType),
                          other=other)

    def _cg_const(self, v: Value) -> np.ndarray:
        from onnxforge.kernels_cy.runtime.compile import Compiler

        return Compiler(self.model).constant(v)

    # -- introspection -------------------------------------------------------------
    def get_inputs(self) -> list[NodeArg]:
        return [NodeArg(v.name, _type_string(v.type), _shape(v.type)) for v in self.model.graph.inputs]

    def get_outputs(self) -> list[NodeArg]:
        return [NodeArg(v.name, _type_string(v.type), _shape(v.type)) for v in self.model.graph.outputs]

    @property
    def num_steps(self) -> int:
        return self._cg.program.num_steps

    # -- running -------------------------------------------------------------------
    def _feeds(self, feeds: Mapping[str, Any], trusted: frozenset[str] = frozenset()) -> list[Any]:
        unknown = [k for k in feeds if k not in self._index]
        if unknown:
            raise FeedError(f"unknown feed(s) {unknown}; the model's inputs are {list(self._index)}")
        out: list[Any] = []
        missing = []
        for s in self._specs:
            if s.name not in feeds:
                if s.default is None:
                    missing.append(s.name)
                out.append(s.default)
                continue
            x = feeds[s.name]
            # a trusted buffer is still refused once its owner made it read-only (rule R2)
            out.append(x if s.name in trusted and isinstance(x, np.ndarray) and x.flags.writeable
                       else self._check(s, x))
        if missing:
            raise FeedError(f"missing feed(s) {missing}")
        self._check_disjoint(out, trusted)
        return out

    def _check_disjoint(self, args: list[Any], trusted: frozenset[str]) -> None:
        """Two READ_WRITE inputs never share storage (rule R2): one buffer, or overlapping
        views, fed to both would have each write clobber the other's. A state's retained
        buffers are disjoint by construction (it checks them when it binds them)."""
        spans: list[tuple[int, int, str]] = []
        fresh = False
        for spec, x in zip(self._specs, args):
            if not spec.read_write or x is None:
                continue
            fresh = fresh or spec.name not in trusted
            for a in ([x] if isinstance(x, np.ndarray) else list(x.values()) if isinstance(x, dict) else []):
                if isinstance(a, np.ndarray) and a.nbytes:
                    spans.append((*_byte_span(a), spec.name))
        if not fresh or len(spans) < 2:
            return
        spans.sort()
        for (_, hi, a), (lo, _, b) in zip(spans, spans[1:]):
            if lo < hi:
                raise FeedError(f"READ_WRITE inputs {a!r} and {b!r} share storage: each in-place input "
                                f"needs its own buffer (rule R2), or one's writes would change the other")

    def _check(self, s: _InputSpec, x: Any) -> Any:
        if s.other is not None:
            raise FeedError(f"input {s.name!r} is typed {s.other}: the CPU backend runs tensor and struct "
                            f"values only, so it cannot take this input")
        if s.struct:
            return _check_struct(s, x)
        if s.read_write:
            if not isinstance(x, np.ndarray):
                raise FeedError(f"input {s.name!r} is READ_WRITE storage: pass a numpy array, "
                                f"got {type(x).__name__}")
            if not x.flags.writeable:
                raise FeedError(f"input {s.name!r} is READ_WRITE storage: the array is not writable")
            if not x.flags.c_contiguous:
                raise FeedError(f"input {s.name!r} is READ_WRITE storage: the array is not C-contiguous")
        elif not isinstance(x, np.ndarray):
            x = np.asarray(x)
        if s.dtype is not None and x.dtype != s.dtype:
            raise FeedError(f"input {s.name!r}: dtype {x.dtype} but the model declares {s.dtype}")
        if s.shape is not None:
            if x.ndim != len(s.shape):
                raise FeedError(f"input {s.name!r}: rank {x.ndim} (shape {list(x.shape)}) but the model "
                                f"declares rank {len(s.shape)} {list(s.shape)}")
            shape = x.shape
            for i, d in s.fixed:
                n = shape[i]
                if d != n:
                    raise FeedError(f"input {s.name!r}: dimension {i} is {n} but the model declares {d} "
                                    f"(shape {list(x.shape)} vs {list(s.shape)})")
        return x

    def run(self, output_names: Sequence[str] | None, feeds: Mapping[str, Any],
            run_options: Any = None, *, lengths: RunLengths | None = None,
            trusted: frozenset[str] = frozenset(), counters: RunCounters | None = None,
            after_step: Callable[[int], None] | None = None, context: RunContext | None = None) -> list[Any]:
        """Run the plan; returns the requested outputs (None: all) in order, as a list.

        Safe to call from several threads at once (see the module docstring).
        ``lengths`` gives the cache-writing kernels the published length of each state
        buffer (rule R3); their new lengths are in ``lengths.written`` afterwards.
        ``trusted`` names feeds a state has already checked (its retained in-place
        buffers): they are passed as they are. ``counters`` is filled with this run's
        counters. ``after_step(k)`` is called after each step ``k`` of the plan (a test
        hook for faults: an exception it raises fails the run there).

        Paged caches fed to the run are updated as a transaction: a failed run leaves
        them bitwise as they were. Without ``context`` the run commits their staged
        tokens when it succeeds; a caller that passes its own ``context`` (a state)
        commits them itself (:meth:`RunContext.commit`) once it accepts the outputs."""
        if output_names is not None:
            bad = [n for n in output_names if n not in self._out_index]
            if bad:
                raise FeedError(f"unknown output name(s) {bad}; the model's outputs are {self._outputs}")
        args = self._feeds(feeds, trusted)
        if context is None:
            ctx = RunContext(self._bound, lengths)
        else:
            ctx = context
            ctx.threads = self._bound
            if lengths is not None:
                ctx.lengths = lengths
        token = BLAS.begin(self._bound)
        if fast.pool_run_begins is not None:
            fast.pool_run_begins()
        try:
            outs = self._cg.program.run(args, ctx, after_step)
        except BaseException:
            ctx.discard()
            raise
        else:
            if context is None and ctx.staged:
                ctx.mem.hold(ctx.commit()[0])  # pages aging on commit are this run's allocations
        finally:
            if fast.pool_run_ends is not None:
                fast.pool_run_ends()
            BLAS.end(token)
            mem = ctx.mem
            last = RunCounters(int(mem.allocated), int(mem.copied), int(mem.peak))
            self.last_run = last  # the last run to finish (racy under threads, by design)
            if counters is not None:
                counters._fill(mem)
        if output_names is None:
            return list(outs)
        return [outs[self._out_index[n]] for n in output_names]


def _byte_span(a: np.ndarray) -> tuple[int, int]:
    """The first and one-past-last byte addresses an array's elements occupy."""
    lo = hi = int(a.__array_interface__["data"][0])
    for n, st in zip(a.shape, a.strides):
        ext = (n - 1) * st
        if ext < 0:
            lo += ext
        else:
            hi += ext
    return lo, hi + a.itemsize


def _check_struct(s: _InputSpec, x: Any) -> Any:
    if isinstance(x, np.ndarray) or not is_structured(x):
        raise FeedError(f"input {s.name!r} is typed as a struct value: pass a dict of field arrays "
                        f"or a cache object with nbytes and buffer_addresses(), got {type(x).__name__}")
    if s.read_write and isinstance(x, dict):
        bad = [k for k, a in x.items() if not (a.flags.writeable and a.flags.c_contiguous)]
        if bad:
            raise FeedError(f"input {s.name!r} is READ_WRITE storage: field(s) {bad} are not writable "
                            f"C-contiguous arrays")
    return x


def _shape(t: Any) -> list[int | str | None] | None:
    if isinstance(t, TensorType) and t.shape is not None:
        return list(t.shape)
    return None
