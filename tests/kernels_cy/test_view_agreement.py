"""Every kernel's ``fresh`` flag agrees with liveness's one definition of views."""
from __future__ import annotations

import numpy as np

from onnxforge.graphbuilder.builder.graph_builder import GraphBuilder
from onnxforge.graphbuilder.ir.core import Node, Value
from onnxforge.kernels_cy import ops  # noqa: F401  (registers the kernels)
from onnxforge.kernels_cy.ops.base import REGISTRY
from onnxforge.kernels_cy.ops.control import FunctionCall
from onnxforge.kernels_cy.ops.shape_ops import FreshCopy
from onnxforge.kernels_cy.runtime.compile import Compiler
from onnxforge.passes.analyses.liveness import VIEW_OPS, may_view
from onnxforge.proto_ext.types import TensorProto

# Kernels that are not fresh without being views, and why: their outputs' storage is
# counted elsewhere (sub-plans) or is the aliased input's (a MUST_ALIAS port).
NOT_FRESH_EXCEPTIONS = {
    ("", "If"): "the sub-plans count their own allocations",
    ("", "Loop"): "the sub-plans count their own allocations",
    ("", "Scan"): "the sub-plans count their own allocations",
    ("ai.onnxforge", "CacheUpdate"): "writes its cache input in place (MUST_ALIAS port 0 -> 0)",
    ("ai.onnxforge", "PagedCacheUpdate"): "writes its cache input in place (MUST_ALIAS port 0 -> 0)",
    ("ai.onnxforge", "RaggedPagedCacheUpdate"): "writes its cache batch in place (MUST_ALIAS port 0 -> 0)",
}


def _node(op: str) -> Node:
    return Node("", op, [Value("x")], [Value("y")])


def test_every_kernel_fresh_flag_agrees_with_liveness() -> None:
    assert FunctionCall.fresh is False  # a call: the sub-plan counts its own allocations
    for (domain, op), cls in sorted(REGISTRY.items()):
        is_view = domain == "" and op in VIEW_OPS and may_view(_node(op))
        if is_view:
            assert cls.fresh is False and cls.views_input, (domain, op)
        elif not cls.fresh:
            assert (domain, op) in NOT_FRESH_EXCEPTIONS, (domain, op)
        else:
            assert not getattr(cls, "views_input", False), (domain, op)


def test_a_slice_liveness_calls_fresh_is_never_a_view() -> None:
    g = GraphBuilder(opset=21)
    x = g.input("x", TensorProto.FLOAT, [4, 6])
    st = g.input("st", TensorProto.INT64, [1])  # steps no graph states
    args = [g.initializer("s", np.array([0], np.int64)), g.initializer("e", np.array([6], np.int64)),
            g.initializer("a", np.array([1], np.int64))]
    g.output(g.op.Slice(x, *args, st), "y")
    g.output(g.op.Slice(x, *args, g.initializer("two", np.array([2], np.int64))), "z")
    g.output(g.op.Slice(x, *args), "w")
    m = g.to_model()
    nodes = list(m.graph)
    assert [may_view(n) for n in nodes] == [False, False, True]
    comp = Compiler(m)
    xs = np.arange(24, dtype=np.float32).reshape(4, 6)
    for k, n in enumerate(nodes):
        kern = comp._kernel(n, comp._spec(n, {}))
        if kern.views_input and not may_view(n):
            kern = FreshCopy(kern)
        args_k = [xs, np.array([0]), np.array([6]), np.array([1])] + ([np.array([2])] if k < 2 else [])
        out = kern.run(*args_k)
        assert np.array_equal(out, xs[:, ::2] if k < 2 else xs)
        assert np.may_share_memory(out, xs) == may_view(n) and kern.fresh == (not may_view(n))
