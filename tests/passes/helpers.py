"""Shared helpers of the pass tests: small models, oracles and invariant checks."""
from __future__ import annotations

import os
from typing import Any

import numpy as np
import onnxruntime as ort
from onnx import TensorProto

from onnxforge.graphbuilder.builder.graph_builder import READ_WRITE, GraphBuilder
from onnxforge.graphbuilder.ir.core import Model, Value
from onnxforge.graphbuilder.serde import to_onnx
from onnxforge.passes import check_invariants
from onnxforge.proto_ext.typecompat import compatible
from onnxforge.proto_ext.verify import check
from onnxforge.graphbuilder.ir.storage import Storage

FLOAT = TensorProto.FLOAT


def ort_run(model: Model | Any, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Outputs of onnxruntime on ``model`` (an IR model, an onnx.ModelProto or a path),
    all graph optimizations off."""
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if isinstance(model, (str, os.PathLike)):
        source: Any = os.fspath(model)
    else:
        source = (to_onnx(model) if isinstance(model, Model) else model).SerializeToString()
    sess = ort.InferenceSession(source, opts, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def reference_run(model: Model | Any, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Outputs of ``onnx.reference`` on ``model``."""
    from onnx.reference import ReferenceEvaluator

    proto = to_onnx(model) if isinstance(model, Model) else model
    return [np.asarray(r) for r in ReferenceEvaluator(proto).run(None, feeds)]


def assert_same_outputs(before: Any, after: Model, feeds: dict[str, np.ndarray], *,
                        oracle=ort_run) -> None:
    """``before`` (a ModelProto taken before the pass) and ``after`` agree bit for bit."""
    want = oracle(before, feeds)
    got = oracle(after, feeds)
    assert len(want) == len(got)
    for w, g in zip(want, got):
        assert w.dtype == g.dtype and w.shape == g.shape
        np.testing.assert_array_equal(w, g)


def output_names(model: Model) -> list[str]:
    return [v.name for v in model.graph.outputs]


def assert_sound(model: Model) -> None:
    """No IR or static-rule violation; bindings and aliases name live, compatible values."""
    assert check_invariants(model) == []
    assert check(model) == []
    g = model.graph
    inputs = {id(v) for v in g.inputs}
    outputs = {id(v) for v in g.outputs}
    for i, o in g.bindings:
        assert id(i) in inputs and id(o) in outputs
        assert compatible(i.type, o.type) is None
    for v in list(g.outputs) + [o for n in g for o in n.outputs]:
        src = v.alias_of
        if isinstance(src, Value):
            root = Storage(model).root(v)
            assert root.is_graph_input() and root.access == READ_WRITE
            assert compatible(src.type, v.type) is None


def stateful_model(*, forwarded: bool = False) -> Model:
    """A decode-step-like model with an in-place cache write, a bound output and plain ops.

    graph(cache RW [1, 8, 4], vals [1, 1, 4], pos int64, x [4]) -> (cache_out, y)
      cache_out = CacheUpdate(cache, vals, pos)       bind cache <- cache_out
      y = Relu(Add(x, w)); dead = Neg(x)
    With ``forwarded`` the written cache reaches the output through an Identity.
    """
    g = GraphBuilder(opset=21)
    cache = g.input("cache", FLOAT, [1, 8, 4], access=READ_WRITE)
    vals = g.input("vals", FLOAT, [1, 1, 4])
    pos = g.input("pos", TensorProto.INT64, [])
    x = g.input("x", FLOAT, [4])
    w = g.initializer("w", np.arange(4, dtype=np.float32))
    upd = g.op.CacheUpdate(cache, vals, pos)
    if forwarded:
        upd = g.op.Identity(upd)
    g.output(upd, "cache_out")
    g.bind("cache", "cache_out")
    g.op.Neg(x, _name="dead")
    y = g.op.Relu(g.op.Add(x, w))
    g.output(y, "y")
    return g.to_model()
