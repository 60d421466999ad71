"""Two executions of a stateful model: its meaning, and what an in-place backend computes.

* :func:`functional_run` is the meaning of a graph: values are immutable, and
  ``ai.onnxforge::CacheUpdate`` returns a *copy* of its cache with the new entries
  written at ``[position, position + n)`` along ``axis`` (default -2). It runs the
  exported model with ``onnx.reference``, the custom operator registered through
  ``new_ops``.
* :func:`inplace_run` executes the IR in its node order the way a backend that
  honours the aliases would: ``CacheUpdate`` writes *into* its cache array and
  returns it, ``Identity`` and ``Reshape`` return numpy views of their input, and
  before a write every view of the written storage is materialized (DESIGN.md,
  *Semantics of in-place writes*: a view read after the write means the
  pre-write contents). A graph that reads a storage version after it was
  overwritten, or returns the overwritten version, gives a different result
  here than :func:`functional_run`; for a graph that satisfies rule L13 and is
  scheduled readers-before-writer, the two agree.

Example::

    want = functional_run(model, feeds)            # {output name: array}
    got, buffers = inplace_run(model, feeds)       # buffers: final READ_WRITE inputs
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun
from onnxforge.graphbuilder.ir.core import READ_WRITE, Function, Graph, Model, Node, Value
from onnxforge.graphbuilder.serde import to_onnx
from onnxforge.graphbuilder.ir.tensors import Tensor, np_dtype

__all__ = ["CacheUpdateOp", "SimulationError", "functional_run", "inplace_run", "write_entries"]

ONNXFORGE_DOMAIN = "ai.onnxforge"


class SimulationError(NotImplementedError):
    """The in-place simulator met an operator or construct it does not model."""


def write_entries(cache: np.ndarray, values: np.ndarray, position: np.ndarray,
                  axis: int = -2) -> None:
    """Write ``values`` into ``cache`` at ``[position, position + n)`` along ``axis``, in place.

    ``position`` is a scalar (every batch row) or ``[batch]`` (one offset per row of axis 0).
    """
    ax = axis % cache.ndim
    n = values.shape[ax]
    pos = np.asarray(position, dtype=np.int64)
    rows = [(slice(None), int(pos))] if pos.ndim == 0 else [
        (b, int(p)) for b, p in enumerate(pos.reshape(-1))]
    for batch, start in rows:
        if start < 0 or start + n > cache.shape[ax]:
            raise ValueError(f"CacheUpdate: position {start} + {n} exceeds capacity "
                             f"{cache.shape[ax]} on axis {axis}")
        dst: list[Any] = [slice(None)] * cache.ndim
        src: list[Any] = [slice(None)] * cache.ndim
        dst[0] = src[0] = batch
        dst[ax] = slice(start, start + n)
        cache[tuple(dst)] = values[tuple(src)]


class CacheUpdateOp(OpRun):
    """``ai.onnxforge::CacheUpdate`` for ``onnx.reference``, functionally: a written copy."""

    op_domain = ONNXFORGE_DOMAIN
    op_name = "CacheUpdate"

    def _run(self, cache, values, position, axis=None):
        out = np.array(cache, copy=True)
        write_entries(out, np.asarray(values), np.asarray(position), -2 if axis is None else axis)
        return (out,)


CacheUpdateOp.__name__ = "CacheUpdate"  # onnx.reference matches new_ops by class name


class _Evaluator(ReferenceEvaluator):
    """A ReferenceEvaluator that knows CacheUpdate in every scope: onnx.reference builds
    the evaluators of local-function bodies from the class alone, without ``new_ops``."""

    def __init__(self, proto: Any, *args: Any, new_ops: Any = None, **kwargs: Any):
        super().__init__(proto, *args, new_ops=[CacheUpdateOp, *(new_ops or [])], **kwargs)


def functional_run(model: Model, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every graph output of ``model`` by name, values immutable (the graph's meaning)."""
    proto = to_onnx(model)
    sess = _Evaluator(proto)
    names = [o.name for o in proto.graph.output]
    results = sess.run(None, {k: np.array(v, copy=True) for k, v in feeds.items()})
    return {n: np.asarray(r) for n, r in zip(names, results)}


# -- the in-place simulator -------------------------------------------------------------------

_Env = dict[Value, np.ndarray]


class _Machine:
    """Executes IR nodes in order over one shared memory: arrays are storage, not values."""

    def __init__(self, model: Model):
        self.model = model
        self.envs: list[_Env] = []  # every scope ever opened: views may hide in any of them

    # -- scopes ----------------------------------------------------------------------------
    def lookup(self, scopes: list[_Env], v: Value) -> np.ndarray:
        for env in reversed(scopes):
            if v in env:
                return env[v]
        if v.const is not None:
            return self._constant(v)
        raise SimulationError(f"value {v.name!r} is read before it is computed "
                              "(node order is not a schedule)")

    @staticmethod
    def _constant(v: Value) -> np.ndarray:
        if not isinstance(v.const, Tensor):
            raise SimulationError(f"initializer {v.name!r} is encoded; the simulator reads dense ones")
        return np.array(v.const.numpy(), copy=True)

    def run_body(self, body: Graph | Function, scopes: list[_Env]) -> list[np.ndarray]:
        env = scopes[-1]
        self.envs.append(env)
        for node in body:
            outs = self.run_node(node, scopes)
            if len(outs) != len(node.outputs):
                raise SimulationError(f"{node!r}: produced {len(outs)} results")
            for value, arr in zip(node.outputs, outs):
                env[value] = arr
        return [self.lookup(scopes, o) for o in body.outputs]

    def materialize_views_of(self, storage: np.ndarray) -> None:
        """Before ``storage`` is overwritten, every view of it becomes a copy.

        The storage itself is one array object shared by all of its versions (the
        READ_WRITE input, each write's result); a *different* array object over the
        same memory is a view (``Identity``, ``Reshape``) and keeps the old contents.
        """
        for env in self.envs:
            for value, arr in env.items():
                if arr is not storage and np.shares_memory(arr, storage):
                    env[value] = arr.copy()

    # -- operators -------------------------------------------------------------------------
    def run_node(self, node: Node, scopes: list[_Env]) -> list[np.ndarray]:
        args = [None if v is None else self.lookup(scopes, v) for v in node.inputs]
        if node.domain == ONNXFORGE_DOMAIN and node.op_type == "CacheUpdate":
            cache, values, position = args
            self.materialize_views_of(cache)
            write_entries(cache, values, position, node.attr("axis", -2))
            return [cache]
        fn = self.model.function(node.domain, node.op_type, node.overload)
        if fn is not None:
            return self.run_body(fn, [dict(zip(fn.inputs, args))])
        if node.domain not in ("", "ai.onnx"):
            raise SimulationError(f"{node!r}: domain {node.domain!r} is not simulated")
        if node.op_type == "If":
            cond = bool(np.asarray(args[0]).reshape(()))
            branch = node.attr("then_branch" if cond else "else_branch")
            return self.run_body(branch, [*scopes, {}])
        impl = _ELEMENTARY.get(node.op_type)
        if impl is None:
            raise SimulationError(f"{node!r}: operator {node.op_type} is not simulated")
        return [impl(node, args)]


def _reshape(node: Node, args: list[Any]) -> np.ndarray:
    x, shape = args
    dims = [x.shape[i] if d == 0 and not node.attr("allowzero", 0) else int(d)
            for i, d in enumerate(np.asarray(shape).reshape(-1))]
    return x.reshape(dims)  # a view of x wherever numpy can make one


def _reduce_sum(node: Node, args: list[Any]) -> np.ndarray:
    x = args[0]
    axes = None if len(args) < 2 or args[1] is None else tuple(int(a) for a in args[1])
    if axes == () and node.attr("noop_with_empty_axes", 0):
        return x.copy()
    keep = bool(node.attr("keepdims", 1))
    return np.asarray(np.sum(x, axis=axes, keepdims=keep, dtype=x.dtype))


def _constant_node(node: Node, args: list[Any]) -> np.ndarray:
    value = node.attr("value")
    if value is None:
        raise SimulationError(f"{node!r}: only Constant(value=tensor) is simulated")
    return np.array(value.numpy(), copy=True)


_ELEMENTARY: dict[str, Callable[[Node, list[Any]], np.ndarray]] = {
    "Identity": lambda node, a: a[0][...],  # a view: same memory, a distinct array object
    "Reshape": _reshape,
    "Cast": lambda node, a: a[0].astype(np_dtype(node.attr("to")), copy=True),
    "Add": lambda node, a: np.asarray(a[0] + a[1]),
    "Sub": lambda node, a: np.asarray(a[0] - a[1]),
    "Mul": lambda node, a: np.asarray(a[0] * a[1]),
    "Neg": lambda node, a: np.asarray(-a[0]),
    "Relu": lambda node, a: np.asarray(np.maximum(a[0], np.zeros((), a[0].dtype))),
    "ReduceSum": _reduce_sum,
    "Concat": lambda node, a: np.concatenate([x for x in a if x is not None], axis=node.attr("axis")),
    "Constant": _constant_node,
}


def inplace_run(model: Model, feeds: Mapping[str, np.ndarray]
                ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Run ``model`` in node order on shared storage.

    Returns ``(outputs, buffers)``: every graph output by name (copied when the run
    ends), and the final contents of every READ_WRITE input's buffer by input name
    (what the caller observes after the call).
    """
    machine = _Machine(model)
    graph = model.graph
    env: _Env = {}
    buffers: dict[str, np.ndarray] = {}
    for v in graph.inputs:
        if v.const is not None:
            continue  # an initializer listed as an input keeps its value
        if v.name not in feeds:
            raise SimulationError(f"no feed for graph input {v.name!r}")
        env[v] = np.array(feeds[v.name], copy=True)
        if v.access == READ_WRITE:
            buffers[v.name] = env[v]
    results = machine.run_body(graph, [env])
    outputs = {o.name: np.array(r, copy=True) for o, r in zip(graph.outputs, results)}
    return outputs, {k: b.copy() for k, b in buffers.items()}
