"""Dead-code elimination."""
from __future__ import annotations


import numpy as np
from onnx import TensorProto, helper

from onnxforge.graphbuilder.builder.graph_builder import READ_WRITE, GraphBuilder
from onnxforge.graphbuilder.ir.core import Graph, Model, Node, Value
from onnxforge.graphbuilder.serde import to_onnx
from onnxforge.passes import DeadCodeEliminationPass, check_invariants
from onnxforge.proto_ext.types import TensorType

from tests.passes.helpers import (
    FLOAT,
    assert_same_outputs,
    assert_sound,
    stateful_model,
)

T4 = TensorType(FLOAT, (4,))


def _ops(m: Model) -> list[str]:
    return [n.op_type for n in m.graph]


def test_removes_dead_chains_and_unused_initializers_keeps_results():
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [4])
    w = g.initializer("w", np.full(4, 2.0, np.float32))
    unused = g.initializer("unused", np.ones(4, np.float32))
    dead = g.op.Exp(g.op.Mul(x, unused))
    g.op.Neg(dead)
    g.output(g.op.Add(x, w), "y")
    m = g.to_model()
    before = to_onnx(m)
    assert DeadCodeEliminationPass()(m).modified
    assert _ops(m) == ["Add"]
    assert list(m.graph.initializers) == ["w"]
    assert_sound(m)
    assert_same_outputs(before, m, {"x": np.arange(4, dtype=np.float32)})
    assert not DeadCodeEliminationPass()(m).modified


def test_keeps_in_place_writes_and_bound_outputs():
    m = stateful_model()
    assert DeadCodeEliminationPass()(m).modified  # only the dead Neg goes
    assert _ops(m) == ["CacheUpdate", "Add", "Relu"]
    assert [(i.name, o.name) for i, o in m.graph.bindings] == [("cache", "cache_out")]
    assert_sound(m)


def test_keeps_a_write_whose_output_nobody_reads():
    g = GraphBuilder(opset=21)
    cache = g.input("cache", FLOAT, [1, 8, 4], access=READ_WRITE)
    vals = g.input("vals", FLOAT, [1, 1, 4])
    pos = g.input("pos", TensorProto.INT64, [])
    x = g.input("x", FLOAT, [4])
    g.op.CacheUpdate(cache, vals, pos)  # writes the caller's buffer; output unused
    g.output(g.op.Relu(x), "y")
    m = g.to_model()
    assert not DeadCodeEliminationPass()(m).modified
    assert _ops(m) == ["CacheUpdate", "Relu"]
    assert check_invariants(m) == []


def test_keeps_forwarded_bound_output():
    m = stateful_model(forwarded=True)
    DeadCodeEliminationPass()(m)
    assert "Identity" in _ops(m) and "CacheUpdate" in _ops(m)
    assert_sound(m)


def test_graph_inputs_with_defaults_and_encoded_initializers_are_kept_by_default():
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [4])
    g.encoded_initializer("q", np.linspace(-1, 1, 8, dtype=np.float32), storage_type=TensorProto.INT8)
    g.output(g.op.Relu(x), "y")
    m = g.to_model()
    dflt = Value("default_in", T4)
    m.graph.add_input(dflt)
    from onnxforge.graphbuilder.ir.tensors import Tensor

    m.graph.add_initializer(dflt, Tensor.from_numpy(np.zeros(4, np.float32)))
    assert not DeadCodeEliminationPass()(m).modified
    assert "q" in m.graph.encoded_initializers and "default_in" in m.graph.initializers
    assert DeadCodeEliminationPass(remove_encoded_initializers=True)(m).modified
    assert not m.graph.encoded_initializers and "default_in" in m.graph.initializers
    assert_sound(m)


def _if_model(used: bool) -> Model:
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [4])
    cond = g.input("c", TensorProto.BOOL, [])
    outer = g.op.Exp(x)  # read only inside the branches
    then_b, else_b = g.subgraph("then"), g.subgraph("else")
    then_b.op.Neg(x)  # dead inside the branch
    t = then_b.op.Add(outer, x)
    then_b.graph.outputs.append(t)
    t.type = T4
    e = else_b.op.Sub(outer, x)
    e.type = T4
    else_b.graph.outputs.append(e)
    res = g.op.If(cond, then_branch=then_b, else_branch=else_b)
    res.type = T4
    g.output(res if used else g.op.Relu(x), "y", type=T4)
    return g.to_model()


def test_dead_if_releases_outer_values_read_by_its_branches():
    m = _if_model(used=False)
    assert DeadCodeEliminationPass()(m).modified
    assert _ops(m) == ["Relu"]
    assert check_invariants(m) == []
    assert m.graph.inputs[0].num_uses() == 1


def test_recurses_into_branches_of_a_live_if():
    m = _if_model(used=True)
    before = to_onnx(m)
    DeadCodeEliminationPass()(m)
    node_if = next(n for n in m.graph if n.op_type == "If")
    then_b = node_if.attributes["then_branch"].value
    assert [n.op_type for n in then_b] == ["Add"]
    assert _ops(m) == ["Exp", "If"]
    assert check_invariants(m) == []
    for flag in (True, False):
        assert_same_outputs(before, m, {"x": np.arange(4, dtype=np.float32), "c": np.array(flag)})


def test_unused_local_functions_are_removed_unless_a_decoder_may_call_them():
    def build(with_decoder: bool) -> Model:
        g = GraphBuilder(opset=21)
        x = g.input("x", FLOAT, [4])
        fb = g.function("local", "unused_fn", ["a"])
        fb.graph.outputs.append(fb.op.Relu(fb.graph.inputs[0]))
        used = g.function("local", "used_fn", ["a"])
        used.graph.outputs.append(used.op.Neg(used.graph.inputs[0]))
        out = g.make_node("used_fn", [x], 1, domain="local").outputs[0]
        g.output(out, "y", type=T4)
        if with_decoder:
            dec = helper.make_function("local", "decode", ["a"], ["b"],
                                       [helper.make_node("Identity", ["a"], ["b"])],
                                       [helper.make_opsetid("", 21)])
            g.declare_struct_type("s", [("a", TensorType(FLOAT, (4,)))], decoder=dec)
        return g.to_model()

    m = build(False)
    DeadCodeEliminationPass()(m)
    assert [k[1] for k in m.functions] == ["used_fn"]
    m = build(True)
    DeadCodeEliminationPass()(m)
    assert sorted(k[1] for k in m.functions) == ["unused_fn", "used_fn"]


def test_work_is_linear_on_a_long_dead_chain(monkeypatch):
    import onnxforge.passes.rewrites.dce as dce

    def build(n: int) -> Model:
        g = Graph("g")
        x = g.add_input(Value("x", T4))
        cur = x
        for i in range(n):
            cur = g.append(Node("", "Neg", [cur], [Value(f"v{i}", T4)])).outputs[0]
        g.outputs.append(g.append(Node("", "Relu", [x], [Value("y", T4)])).outputs[0])
        return Model(g, opset_imports={"": 21})

    calls = []
    real = dce._dead
    monkeypatch.setattr(dce, "_dead", lambda *a: calls.append(1) or real(*a))
    for n in (5_000, 40_000):
        calls.clear()
        m = build(n)
        DeadCodeEliminationPass()(m)
        assert len(m.graph) == 1
        # each node is examined a bounded number of times: exact count, not a timing
        assert len(calls) <= 2 * (n + 1)


def test_function_bodies_are_cleaned_too():
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [4])
    fb = g.function("local", "f", ["a"])
    a = fb.graph.inputs[0]
    fb.op.Exp(a)  # dead inside the body
    fb.graph.outputs.append(fb.op.Neg(a))
    out = g.make_node("f", [x], 1, domain="local").outputs[0]
    g.output(out, "y", type=T4)
    m = g.to_model()
    before = to_onnx(m)
    assert DeadCodeEliminationPass()(m).modified
    assert [n.op_type for n in m.functions[("local", "f", "")]] == ["Neg"]
    assert_same_outputs(before, m, {"x": np.arange(4, dtype=np.float32)})
