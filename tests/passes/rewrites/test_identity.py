"""Identity elimination."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from onnxforge.graphbuilder.builder.graph_builder import GraphBuilder
from onnxforge.graphbuilder.ir.core import Model
from onnxforge.graphbuilder.serde import to_onnx
from onnxforge.passes import IdentityEliminationPass
from onnxforge.proto_ext.types import TensorType

from tests.passes.helpers import (
    FLOAT,
    assert_same_outputs,
    assert_sound,
    output_names,
    stateful_model,
)

X = {"x": np.array([1.0, -2.0, 3.0, 0.5], np.float32)}
T4 = TensorType(FLOAT, (4,))


def _ops(m: Model) -> list[str]:
    return [n.op_type for n in m.graph]


def test_chain_of_identities_collapses_and_output_name_is_kept():
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [4])
    r = g.op.Relu(x)
    g.output(g.op.Identity(g.op.Identity(g.op.Neg(g.op.Identity(r)))), "y")
    m = g.to_model()
    before = to_onnx(m)
    assert IdentityEliminationPass()(m).modified
    assert _ops(m) == ["Relu", "Neg"]
    assert output_names(m) == ["y"]
    assert list(m.graph)[-1].outputs[0].name == "y"
    assert_sound(m)
    assert_same_outputs(before, m, X)


def test_identity_of_an_input_or_initializer_feeding_an_output_stays():
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [4])
    w = g.initializer("w", np.ones(4, np.float32))
    g.output(g.op.Identity(x), "copy_x")
    g.output(g.op.Identity(w), "copy_w")
    g.output(g.op.Add(g.op.Identity(x), w), "y")
    m = g.to_model()
    before = to_onnx(m)
    IdentityEliminationPass()(m)
    assert _ops(m) == ["Identity", "Identity", "Add"]
    assert output_names(m) == ["copy_x", "copy_w", "y"]
    assert_same_outputs(before, m, X)


def test_two_outputs_of_one_value_keep_one_identity():
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [4])
    r = g.op.Relu(x)
    g.output(r, "a")
    g.output(g.op.Identity(r), "b")
    m = g.to_model()
    IdentityEliminationPass()(m)
    assert _ops(m) == ["Relu", "Identity"]
    assert output_names(m) == ["a", "b"]


def test_forwarded_bound_cache_keeps_its_binding_and_gets_its_alias():
    m = stateful_model(forwarded=True)
    assert IdentityEliminationPass()(m).modified
    upd = next(n for n in m.graph if n.op_type == "CacheUpdate")
    out = upd.outputs[0]
    assert out.name == "cache_out" and m.graph.outputs[0] is out
    assert m.graph.bindings[0][1] is out
    assert out.alias_of is m.graph.inputs[0]
    assert_sound(m)


def test_identity_inside_a_branch_reading_an_outer_value():
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [4])
    cond = g.input("c", TensorProto.BOOL, [])
    then_b, else_b = g.subgraph("then"), g.subgraph("else")
    t = then_b.op.Neg(then_b.op.Identity(x))
    t.type = T4
    then_b.graph.outputs.append(t)
    e = else_b.op.Identity(x)  # a branch output: must stay
    e.type = T4
    else_b.graph.outputs.append(e)
    g.output(g.op.If(cond, then_branch=then_b, else_branch=else_b), "y", type=T4)
    m = g.to_model()
    before = to_onnx(m)
    IdentityEliminationPass()(m)
    assert [n.op_type for n in then_b.graph] == ["Neg"]
    assert [n.op_type for n in else_b.graph] == ["Identity"]
    assert_sound(m)
    for flag in (True, False):
        assert_same_outputs(before, m, {**X, "c": np.array(flag)})
