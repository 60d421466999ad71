"""Common-subexpression elimination."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from onnxforge.graphbuilder.builder.graph_builder import READ_WRITE, GraphBuilder
from onnxforge.graphbuilder.ir.core import Attr, AttrType, Graph, Model, Node, Value
from onnxforge.graphbuilder.serde import to_onnx
from onnxforge.passes import CommonSubexpressionEliminationPass, check_invariants
from onnxforge.passes.rewrites.cse import node_key
from onnxforge.proto_ext.types import TensorType

from tests.passes.helpers import FLOAT, assert_same_outputs, assert_sound, output_names

T4 = TensorType(FLOAT, (4,))
X = {"x": np.array([-1.5, 0.0, 2.0, 3.25], np.float32)}


def _ops(m: Model) -> list[str]:
    return [n.op_type for n in m.graph]


def test_merges_duplicates_transitively_in_one_walk():
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [4])
    w = g.initializer("w", np.full(4, 0.5, np.float32))
    a1, a2 = g.op.Add(x, w), g.op.Add(x, w)
    e1, e2 = g.op.Exp(a1), g.op.Exp(a2)
    g.output(g.op.Sub(e1, e2), "y")
    m = g.to_model()
    before = to_onnx(m)
    assert CommonSubexpressionEliminationPass()(m).modified
    assert _ops(m) == ["Add", "Exp", "Sub"]
    sub = list(m.graph)[-1]
    assert sub.inputs[0] is sub.inputs[1]
    assert_sound(m)
    assert_same_outputs(before, m, X)
    assert not CommonSubexpressionEliminationPass()(m).modified


def test_duplicate_graph_output_hands_its_name_to_the_kept_value():
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [4])
    inner = g.op.Relu(x)
    out = g.op.Relu(x)
    g.output(g.op.Neg(inner), "n")
    g.output(out, "y")
    m = g.to_model()
    before = to_onnx(m)
    CommonSubexpressionEliminationPass()(m)
    assert _ops(m) == ["Relu", "Neg"]
    assert output_names(m) == ["n", "y"]
    assert list(m.graph)[0].outputs[0].name == "y"
    assert_same_outputs(before, m, X)


def test_two_graph_outputs_are_not_merged():
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [4])
    g.output(g.op.Relu(x), "a")
    g.output(g.op.Relu(x), "b")
    m = g.to_model()
    assert not CommonSubexpressionEliminationPass()(m).modified
    assert output_names(m) == ["a", "b"]


def test_attributes_are_canonical_and_exact():
    x = Value("x", T4)

    def node(**attrs) -> Node:
        return Node("", "LeakyRelu", [x], 1,
                    attributes=[Attr(k, AttrType.FLOAT, v) for k, v in attrs.items()])

    assert node_key(node(alpha=0.1)) == node_key(node(alpha=0.1))
    assert node_key(node(alpha=0.1)) != node_key(node(alpha=0.2))
    assert node_key(node(alpha=0.0)) != node_key(node(alpha=-0.0))
    assert node_key(node(alpha=float("nan"))) == node_key(node(alpha=float("nan")))
    a = Node("", "Transpose", [x], 1, attributes=[Attr("perm", AttrType.INTS, [1, 0])])
    b = Node("", "Transpose", [x], 1, attributes=[Attr("perm", AttrType.INTS, [0, 1])])
    assert node_key(a) != node_key(b)
    y = Value("y", T4)
    assert node_key(Node("", "Add", [x, y], 1)) != node_key(Node("", "Add", [y, x], 1))
    assert node_key(Node("", "Add", [x, y], 1)) != node_key(Node("custom", "Add", [x, y], 1))


def test_constants_merge_by_value_dtype_and_shape():
    g = GraphBuilder(opset=21)
    x = g.input("x", TensorProto.INT32, [4])
    def const(name: str, arr: np.ndarray) -> Value:
        return g.make_node("Constant", [], [name], value=arr).outputs[0]

    c1 = const("c1", np.array([1, 2, 3, 4], np.int32))
    c2 = const("c2", np.array([1, 2, 3, 4], np.int32))
    c3 = const("c3", np.array([1, 2, 3, 4], np.int32).reshape(2, 2))  # same bytes, other shape
    c4 = const("c4", np.array([1, 2, 3, 4], np.int32).view(np.float32))  # same bytes, other dtype
    s = g.op.Add(g.op.Add(x, c1), c2)
    g.output(s, "y")
    g.output(c3, "shape_other")
    g.output(c4, "dtype_other")
    m = g.to_model()
    before = to_onnx(m)
    CommonSubexpressionEliminationPass()(m)
    assert _ops(m).count("Constant") == 3
    assert_same_outputs(before, m, {"x": np.arange(4, dtype=np.int32)})


def test_side_effects_and_random_operators_are_never_merged():
    g = GraphBuilder(opset=21)
    state = g.input("state", FLOAT, [4])
    one = g.initializer("one", np.ones(4, np.float32))
    nxt = g.op.Add(state, one)
    g.output(nxt, "state_out")
    g.bind("state", "state_out")
    twin = g.op.Add(state, one)  # same computation as the bound output's producer
    r1 = g.op.RandomNormal(shape=[4], dtype=1)
    r2 = g.op.RandomNormal(shape=[4], dtype=1)
    g.output(g.op.Sub(g.op.Mul(twin, r1), r2), "y")
    m = g.to_model()
    assert not CommonSubexpressionEliminationPass()(m).modified
    assert _ops(m).count("Add") == 2 and _ops(m).count("RandomNormal") == 2
    assert_sound(m)


def test_cache_writes_are_never_merged():
    g = Graph("g")
    cache = g.add_input(Value("cache", TensorType(FLOAT, (1, 8, 4)), access=READ_WRITE))
    vals = g.add_input(Value("vals", TensorType(FLOAT, (1, 1, 4))))
    pos = g.add_input(Value("pos", TensorType(TensorProto.INT64, ())))
    from onnxforge.graphbuilder.ir.core import Alias

    for k in range(2):
        g.append(Node("ai.onnxforge", "CacheUpdate", [cache, vals, pos], [f"u{k}"],
                      output_alias=[Alias(0, 0)]))
    m = Model(g, opset_imports={"": 21, "ai.onnxforge": 1})
    assert not CommonSubexpressionEliminationPass()(m).modified
    assert len(m.graph) == 2


def test_branch_reuses_a_computation_of_the_enclosing_graph():
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [4])
    cond = g.input("c", TensorProto.BOOL, [])
    outer = g.op.Exp(x)
    then_b, else_b = g.subgraph("then"), g.subgraph("else")
    inner = then_b.op.Exp(x)
    t = then_b.op.Neg(inner)
    t.type = T4
    then_b.graph.outputs.append(t)
    e = else_b.op.Relu(x)
    e.type = T4
    else_b.graph.outputs.append(e)
    res = g.op.If(cond, then_branch=then_b, else_branch=else_b)
    g.output(g.op.Add(res, outer), "y", type=T4)
    m = g.to_model()
    before = to_onnx(m)
    assert CommonSubexpressionEliminationPass()(m).modified
    then_graph = next(n for n in m.graph if n.op_type == "If").attributes["then_branch"].value
    assert [n.op_type for n in then_graph] == ["Neg"]
    assert list(then_graph)[0].inputs[0] is outer
    assert check_invariants(m) == []
    for flag in (True, False):
        assert_same_outputs(before, m, {**X, "c": np.array(flag)})


def test_duplicates_inside_a_function_body_merge():
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [4])
    fb = g.function("local", "f", ["a"])
    a = fb.graph.inputs[0]
    fb.graph.outputs.append(fb.op.Sub(fb.op.Exp(a), fb.op.Exp(a)))
    out = g.make_node("f", [x], 1, domain="local").outputs[0]
    g.output(out, "y", type=T4)
    m = g.to_model()
    before = to_onnx(m)
    assert CommonSubexpressionEliminationPass()(m).modified
    assert [n.op_type for n in m.functions[("local", "f", "")]] == ["Exp", "Sub"]
    assert_same_outputs(before, m, X)
