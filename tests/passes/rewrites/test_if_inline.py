"""Constant-condition If inlining."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto
from onnxforge.graphbuilder.builder.graph_builder import GraphBuilder
from onnxforge.graphbuilder.ir.core import Model
from onnxforge.graphbuilder.serde import load, to_onnx
from onnxforge.passes import IfInlinePass, optimize
from onnxforge.passes.framework.invariants import containers

from tests.passes.helpers import FLOAT, assert_same_outputs, assert_sound

RNG = np.random.default_rng(5)
BOOL = TensorProto.BOOL


def _same_and_optimized(before, m: Model, feeds: dict[str, np.ndarray]) -> None:
    """``m`` computes what ``before`` computes, and so does the whole default pipeline
    (invariants checked between passes) run on ``before``."""
    assert_same_outputs(before, m, feeds)
    assert_same_outputs(before, optimize(load(before), debug=True), feeds)


def _ops(m: Model) -> list[str]:
    return [n.op_type for c in containers(m) for n in c]


def _feeds() -> dict[str, np.ndarray]:
    return {"x": RNG.standard_normal((2, 3)).astype(np.float32)}


def _if_model(cond: bool, *, output_is_if: bool = True, else_returns_outer: bool = True) -> Model:
    """y = If(cond) then {w = init [3]; t = Mul(x, w); u = Add(t, outer) -> u}
                    else {k = init [2, 3] -> k} or {-> Neg(x)}"""
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [2, 3])
    outer = g.initializer("outer", np.full((3,), 0.5, np.float32))
    c = g.initializer("cond", np.array(cond))
    t = g.subgraph("then")
    w = t.initializer("w", np.arange(3, dtype=np.float32))
    t.output(t.op.Add(t.op.Mul(x, w), outer), "t_out")
    e = g.subgraph("else")
    if else_returns_outer:  # a branch initializer returned as is
        e.graph.outputs.append(e.initializer("k", np.full((2, 3), 2.0, np.float32)))
    else:
        e.output(e.op.Neg(x), "e_out")
    y = g.op.If(c, then_branch=t.graph, else_branch=e.graph)
    if output_is_if:
        g.output(y, "y")
    else:
        g.output(g.op.Abs(y), "y")
    return g.to_model()


def test_true_condition_moves_then_branch_and_keeps_output_name():
    m = _if_model(True)
    before = to_onnx(m)
    assert IfInlinePass()(m).modified
    assert _ops(m) == ["Mul", "Add"]
    assert [v.name for v in m.graph.outputs] == ["y"]
    assert "w" in m.graph.initializers  # the branch weight moved out, once
    assert_sound(m)
    _same_and_optimized(before, m, _feeds())


def test_false_condition_returning_initializer_as_graph_output_gets_identity():
    m = _if_model(False)
    before = to_onnx(m)
    IfInlinePass()(m)
    assert _ops(m) == ["Identity"]
    assert [v.name for v in m.graph.outputs] == ["y"]
    assert_sound(m)
    _same_and_optimized(before, m, _feeds())


def test_initializer_is_forwarded_directly_when_not_an_output():
    m = _if_model(False, output_is_if=False)
    before = to_onnx(m)
    IfInlinePass()(m)
    assert _ops(m) == ["Abs"]
    assert m.graph.nodes[0].inputs[0].name == "k"
    _same_and_optimized(before, m, _feeds())


def test_nested_if_and_nested_subgraph_are_kept_and_inlined():
    # outer If(True) then { inner If(c2) then {Neg(x)} else {Abs(x)} -> r }; c2 a graph input
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [2, 3])
    c2 = g.input("c2", BOOL, [])
    t = g.subgraph("then")
    it = t.subgraph("inner_then")
    it.output(it.op.Neg(x), "it_out")
    ie = t.subgraph("inner_else")
    ie.output(ie.op.Abs(x), "ie_out")
    r = t.op.If(c2, then_branch=it.graph, else_branch=ie.graph)
    t.output(t.op.Sigmoid(r), "t_out")
    e = g.subgraph("else")
    e.output(e.op.Relu(x), "e_out")
    y = g.op.If(g.initializer("cond", np.array(True)), then_branch=t.graph, else_branch=e.graph)
    g.output(y, "y")
    m = g.to_model()
    before = to_onnx(m)
    IfInlinePass()(m)
    assert [n.op_type for n in m.graph] == ["If", "Sigmoid"]
    assert_sound(m)
    for c in (True, False):
        _same_and_optimized(before, m, {**_feeds(), "c2": np.array(c)})


def test_condition_from_folded_shape_inlines_in_default_pipeline():
    # cond = Equal(Gather(Shape(x), 1), 3) with x: [n, 3]: shape folding makes it constant
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, ["n", 3])
    d = g.op.Gather(g.op.Shape(x), g.initializer("i", np.array(1, np.int64)), axis=0)
    cond = g.op.Equal(d, g.initializer("three", np.array(3, np.int64)))
    t = g.subgraph("then")
    t.output(t.op.Neg(x), "t_out")
    e = g.subgraph("else")
    e.output(e.op.Abs(x), "e_out")
    g.output(g.op.If(cond, then_branch=t.graph, else_branch=e.graph), "y")
    m = g.to_model()
    before = to_onnx(m)
    optimize(m, debug=True)
    assert _ops(m) == ["Neg"]
    _same_and_optimized(before, m, {"x": RNG.standard_normal((4, 3)).astype(np.float32)})


def test_if_with_graph_input_condition_is_kept():
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [2, 3])
    c = g.input("c", BOOL, [])
    t = g.subgraph("then")
    t.output(t.op.Neg(x), "t_out")
    e = g.subgraph("else")
    e.output(e.op.Abs(x), "e_out")
    g.output(g.op.If(c, then_branch=t.graph, else_branch=e.graph), "y")
    m = g.to_model()
    assert not IfInlinePass()(m).modified


def test_inlined_branches_do_not_grow_the_file(tmp_path):
    m = _if_model(True, output_is_if=False)
    src = tmp_path / "in.onnx"
    src.write_bytes(to_onnx(m).SerializeToString())
    out = optimize(str(src), debug=True)
    assert len(to_onnx(out).SerializeToString()) <= src.stat().st_size
    assert_same_outputs(to_onnx(_if_model(True, output_is_if=False)), out, _feeds())
