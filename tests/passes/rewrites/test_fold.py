"""Constant folding and lifting of Constant nodes."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

from onnxforge.graphbuilder.builder.graph_builder import GraphBuilder
from onnxforge.graphbuilder.ir.core import Model, Node, Value
from onnxforge.graphbuilder.serde import to_onnx
from onnxforge.graphbuilder.ir.tensors import Tensor
from onnxforge.passes import ConstantFoldingPass, LiftConstantsPass, check_invariants, optimize
from onnxforge.proto_ext.types import TensorType

from tests.passes.helpers import (
    FLOAT,
    assert_same_outputs,
    assert_sound,
    ort_run,
    output_names,
    reference_run,
)

X = {"x": np.array([1.0, -2.0, 3.0, 0.5], np.float32)}


def _ops(m: Model) -> list[str]:
    return [n.op_type for n in m.graph]


def _const(g: GraphBuilder, name: str, arr: np.ndarray) -> Value:
    return g.make_node("Constant", [], [name], value=np.asarray(arr)).outputs[0]


def test_constant_nodes_become_initializers_without_copying_payloads():
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [4])
    c = _const(g, "c", np.array([1, 2, 3, 4], np.float32))
    payload = next(iter(g.graph)).attributes["value"].value
    s = g.make_node("Constant", [], ["s"], value_float=2.0).outputs[0]
    g.output(g.op.Mul(g.op.Add(x, c), s), "y")
    m = g.to_model()
    before = to_onnx(m)
    assert LiftConstantsPass()(m).modified
    assert _ops(m) == ["Add", "Mul"]
    lifted = m.graph.initializers["c"].const
    assert lifted.array is payload.array and lifted.raw is payload.raw  # the payload is not copied
    assert m.graph.initializers["s"].const.numpy().dtype == np.float32
    assert_sound(m)
    assert_same_outputs(before, m, X)


def test_folds_chains_of_constant_nodes_fast_path_and_reference():
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [2, 3])
    a = g.initializer("a", np.arange(6, dtype=np.float32).reshape(3, 2))
    b = _const(g, "b", np.full((2, 3), 0.25, np.float32))
    t = g.op.Transpose(a, perm=[1, 0])                       # numpy path
    s = g.op.Sqrt(g.op.Add(t, b))                            # numpy, then onnx.reference
    shape = g.op.Shape(x)                                     # x is an input: not constant
    shp = g.op.Concat(g.initializer("two", np.array([2], np.int64)),
                      g.initializer("three", np.array([3], np.int64)), axis=0)
    r = g.op.Reshape(g.op.Cast(s, to=TensorProto.DOUBLE), shp)  # reference (Cast), numpy (Reshape)
    g.output(g.op.Add(g.op.Cast(x, to=TensorProto.DOUBLE), r), "y")
    g.output(shape, "shape")
    m = g.to_model()
    before = to_onnx(m)
    assert ConstantFoldingPass()(m).modified
    assert _ops(m) == ["Shape", "Cast", "Add"]
    assert_sound(m)
    feeds = {"x": np.arange(6, dtype=np.float32).reshape(2, 3)}
    assert_same_outputs(before, m, feeds)
    assert_same_outputs(before, m, feeds, oracle=reference_run)


def test_folded_graph_output_keeps_its_name_and_type():
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [4])
    one = g.initializer("one", np.ones(4, np.float32))
    g.output(g.op.Neg(one), "minus_one")
    g.output(g.op.Relu(x), "y")
    m = g.to_model()
    before = to_onnx(m)
    ConstantFoldingPass()(m)
    assert _ops(m) == ["Relu"]
    assert output_names(m) == ["minus_one", "y"]
    assert m.graph.outputs[0].is_initializer()
    assert_same_outputs(before, m, X)


def test_size_limits_are_respected_before_evaluating():
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [4])
    big_shape = g.initializer("big_shape", np.array([1 << 20, 1 << 20], np.int64))  # 4 TiB
    huge = g.op.ConstantOfShape(big_shape)
    small = g.op.ConstantOfShape(g.initializer("small_shape", np.array([4], np.int64)))
    wide = g.op.Expand(g.initializer("v", np.ones(4, np.float32)),
                       g.initializer("target", np.array([4096, 4], np.int64)))
    g.output(g.op.Add(x, small), "y")
    g.output(huge, "huge", type=TensorType(FLOAT, (1 << 20, 1 << 20)))
    g.output(wide, "wide", type=TensorType(FLOAT, (4096, 4)))
    m = g.to_model()
    assert ConstantFoldingPass(max_output_bytes=32 * 1024, max_growth_bytes=1 << 20)(m).modified
    assert _ops(m) == ["ConstantOfShape", "Expand", "Add"]
    assert not ConstantFoldingPass(max_output_bytes=1 << 20)(m).modified  # 64 KiB of new payload
    assert ConstantFoldingPass(max_output_bytes=1 << 20, max_growth_bytes=1 << 20)(m).modified
    assert _ops(m) == ["ConstantOfShape", "Add"]
    assert check_invariants(m) == []


def test_never_folds_side_effects_random_overridable_or_encoded_inputs():
    g = GraphBuilder(opset=21)
    state = g.input("state", FLOAT, [4])
    one = g.initializer("one", np.ones(4, np.float32))
    nxt = g.op.Add(one, one)  # constant, but it produces the bound output
    g.output(nxt, "state_out")
    g.bind("state", "state_out")
    noise = g.op.RandomUniform(shape=[4], dtype=1)
    q = g.encoded_initializer("q", np.linspace(-1, 1, 4, dtype=np.float32), storage_type=TensorProto.INT8)
    g.output(g.op.Add(g.op.Add(state, noise), g.op.Identity(q)), "y", type=TensorType(FLOAT, (4,)))
    m = g.to_model()
    dflt = Value("dflt", TensorType(FLOAT, (4,)))
    m.graph.add_input(dflt)
    m.graph.add_initializer(dflt, Tensor.from_numpy(np.zeros(4, np.float32)))
    neg = m.graph.append(Node("", "Neg", [dflt], [Value("neg_default", TensorType(FLOAT, (4,)))]))
    m.graph.outputs.append(neg.outputs[0])
    ops = _ops(m)
    assert not ConstantFoldingPass()(m).modified
    assert _ops(m) == ops
    assert_sound(m)


def test_folding_inside_a_function_body_makes_constant_nodes():
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [4])
    fb = g.function("local", "f", ["a"])
    c1 = fb.make_node("Constant", [], ["c1"], value=np.full(4, 2.0, np.float32)).outputs[0]
    c2 = fb.make_node("Constant", [], ["c2"], value=np.full(4, 3.0, np.float32)).outputs[0]
    fb.graph.outputs.append(fb.op.Mul(fb.graph.inputs[0], fb.op.Add(c1, c2)))
    out = g.make_node("f", [x], 1, domain="local").outputs[0]
    g.output(out, "y", type=TensorType(FLOAT, (4,)))
    m = g.to_model()
    before = to_onnx(m)
    assert ConstantFoldingPass()(m).modified
    fn = m.functions[("local", "f", "")]
    assert [n.op_type for n in fn] == ["Constant", "Mul"]
    folded = list(fn)[0].attributes["value"].value.numpy()
    np.testing.assert_array_equal(folded, np.full(4, 5.0, np.float32))
    assert_same_outputs(before, m, X)


def test_folded_relu_keeps_negative_zero_and_nan_like_onnxruntime():
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [4])
    w = g.initializer("w", np.array([-0.0, 0.0, np.nan, -2.0], np.float32))
    g.output(g.op.Add(g.op.Relu(w), g.op.Mul(x, g.initializer("zero", np.zeros(4, np.float32)))), "y")
    g.output(g.op.Relu(g.initializer("nz", np.full(4, -0.0, np.float32))), "z")
    m = g.to_model()
    before = to_onnx(m)
    assert ConstantFoldingPass()(m).modified
    assert _ops(m) == ["Mul", "Add"]
    assert m.graph.outputs[1].is_initializer()
    feeds = {"x": np.array([-1.0, 1.0, 2.0, 3.0], np.float32)}
    for want, got in zip(ort_run(before, feeds), ort_run(m, feeds)):
        np.testing.assert_array_equal(want, got)
        np.testing.assert_array_equal(np.signbit(want), np.signbit(got))


def _branchy(share_outer: bool):
    """y = If(c) then {Relu(x) + Transpose(W)} else {Neg(x) * Transpose(W)}; W a large outer
    initializer; with ``share_outer`` the main graph reads W too."""
    from onnx import TensorProto

    from onnxforge.graphbuilder.builder.graph_builder import GraphBuilder

    g = GraphBuilder(opset=21)
    x = g.input("x", TensorProto.FLOAT, [64, 64])
    c = g.input("c", TensorProto.BOOL, [])
    w = g.initializer("W", np.random.default_rng(1).standard_normal((64, 64)).astype(np.float32))
    t = g.subgraph("then")
    t.output(t.op.Add(t.op.Relu(x), t.op.Transpose(w, perm=[1, 0])), "t_out")
    e = g.subgraph("else")
    e.output(e.op.Mul(e.op.Neg(x), e.op.Transpose(w, perm=[1, 0])), "e_out")
    y = g.op.If(c, then_branch=t.graph, else_branch=e.graph)
    g.output(g.op.Add(y, w) if share_outer else g.op.Identity(y), "y")
    return g.to_model()


@pytest.mark.parametrize("share_outer", [False, True])
def test_folding_in_branches_never_duplicates_an_outer_payload(tmp_path, share_outer):
    # Transpose(W) in both branches folds to ONE initializer, in the graph defining W; when
    # the main graph reads W too, folding would add a payload: the Transposes stay nodes
    m = _branchy(share_outer)
    before = to_onnx(m)
    src = tmp_path / "in.onnx"
    src.write_bytes(before.SerializeToString())
    out = optimize(str(src), debug=True)
    size = len(to_onnx(out).SerializeToString())
    assert size <= src.stat().st_size
    big = [v for g in out.all_graphs() for v in g.all_initializers() if v.const.numpy().size > 1]
    assert len(big) == 1
    assert all(v.graph is out.graph for v in big)
    feeds = {"x": np.random.default_rng(2).standard_normal((64, 64)).astype(np.float32)}
    for cond in (True, False):
        assert_same_outputs(before, out, {**feeds, "c": np.array(cond)})
