"""Static shape folding: Shape / Size / Gather(Shape) / Slice(Shape) and their arithmetic."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto
from onnxforge.graphbuilder.builder.graph_builder import GraphBuilder
from onnxforge.graphbuilder.ir.core import Model
from onnxforge.graphbuilder.serde import load, to_onnx
from onnxforge.passes import ShapeFoldPass, optimize
from onnxforge.passes.framework.invariants import containers

from tests.passes.helpers import FLOAT, assert_same_outputs, assert_sound

INT64 = TensorProto.INT64
RNG = np.random.default_rng(3)


def _same_and_optimized(before, m: Model, feeds: dict[str, np.ndarray]) -> None:
    """``m`` computes what ``before`` computes, and so does the whole default pipeline
    (invariants checked between passes) run on ``before``."""
    assert_same_outputs(before, m, feeds)
    assert_same_outputs(before, optimize(load(before), debug=True), feeds)


def _ops(m: Model) -> list[str]:
    return [n.op_type for c in containers(m) for n in c]


def _x(shape=(2, 3, 4)) -> dict[str, np.ndarray]:
    return {"x": RNG.standard_normal(shape).astype(np.float32)}


def test_shape_and_size_of_static_value_become_initializers():
    # Shape(x) with x: FLOAT[2, 3, 4] -> [2, 3, 4]; Size(x) -> 24
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [2, 3, 4])
    s = g.op.Shape(x)
    n = g.op.Size(x)
    g.output(g.op.Reshape(x, g.op.Concat(g.op.Unsqueeze(n, g.initializer("z", np.array([0]))),
                                          g.initializer("one", np.array([1])), axis=0)), "y")
    g.output(g.op.Identity(s), "s")
    m = g.to_model()
    before = to_onnx(m)
    ShapeFoldPass()(m)
    assert "Shape" not in _ops(m) and "Size" not in _ops(m)
    assert_sound(m)
    _same_and_optimized(before, m, _x())


def test_gather_of_static_dim_folds_while_the_shape_stays_symbolic():
    # Gather(Shape(x), 2) with x: FLOAT[n, 3, 4] -> 4 (the dim is static, the rank known)
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, ["n", 3, 4])
    d = g.op.Gather(g.op.Shape(x), g.initializer("i", np.array(-1, np.int64)), axis=0)
    g.output(g.op.Mul(x, g.op.Cast(d, to=FLOAT)), "y")
    m = g.to_model()
    before = to_onnx(m)
    ShapeFoldPass()(m)
    assert "Gather" not in _ops(m)
    assert_sound(m)
    _same_and_optimized(before, m, _x((5, 3, 4)))
    optimize(m, debug=True)
    assert _ops(m) == ["Mul"]
    _same_and_optimized(before, m, _x((5, 3, 4)))


def test_slice_of_shape_becomes_shape_with_start_end():
    # Slice(Shape(x), [1], [INT64_MAX]) -> Shape(x, start=1)  (opset >= 15, not static)
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, ["a", "b", 4])
    s = g.op.Slice(g.op.Shape(x), g.initializer("st", np.array([1])),
                   g.initializer("en", np.array([np.iinfo(np.int64).max])))
    g.output(g.op.Identity(s), "y")
    m = g.to_model()
    before = to_onnx(m)
    ShapeFoldPass()(m)
    shapes = [n for n in m.graph if n.op_type == "Shape" and n.attr("start") == 1]
    assert len(shapes) == 1 and shapes[0].attr("end") is None
    assert "Slice" not in _ops(m)
    assert_sound(m)
    _same_and_optimized(before, m, _x((2, 5, 4)))


def test_slice_of_shape_with_negative_end_and_folded_static_part():
    # Slice(Shape(x), [0], [-1]) on x: FLOAT[a, 3, 4] -> Shape(x, start=0, end=-1);
    # Slice(Shape(x), [1], [3]) -> [3, 4] folded
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, ["a", 3, 4])
    sh = g.op.Shape(x)
    head = g.op.Slice(sh, g.initializer("s0", np.array([0])), g.initializer("e0", np.array([-1])))
    tail = g.op.Slice(sh, g.initializer("s1", np.array([1])), g.initializer("e1", np.array([3])))
    g.output(g.op.Concat(head, tail, axis=0), "y")
    m = g.to_model()
    before = to_onnx(m)
    ShapeFoldPass()(m)
    assert _ops(m).count("Slice") == 0
    assert_sound(m)
    _same_and_optimized(before, m, _x((6, 3, 4)))


def test_opset_below_15_keeps_slice_of_symbolic_shape():
    g = GraphBuilder(opset=13)
    x = g.input("x", FLOAT, ["a", "b"])
    s = g.op.Slice(g.op.Shape(x), g.initializer("st", np.array([1])), g.initializer("en", np.array([2])))
    g.output(g.op.Identity(s), "y")
    m = g.to_model()
    ShapeFoldPass()(m)
    assert "Slice" in _ops(m)


def test_graph_output_is_not_replaced_by_an_initializer():
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [2, 3])
    g.output(g.op.Shape(x), "s")
    m = g.to_model()
    before = to_onnx(m)
    ShapeFoldPass()(m)
    assert [v.name for v in m.graph.outputs] == ["s"]
    assert_sound(m)
    _same_and_optimized(before, m, _x((2, 3)))


def test_shape_in_if_branch_folds_in_the_branch():
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [2, 3])
    c = g.input("c", TensorProto.BOOL, [])
    t = g.subgraph("then")
    t.output(t.op.Reshape(x, t.op.Shape(x)), "t_out")
    e = g.subgraph("else")
    e.output(e.op.Neg(x), "e_out")
    y = g.op.If(c, then_branch=t.graph, else_branch=e.graph)
    g.output(g.op.Identity(y), "y")
    m = g.to_model()
    before = to_onnx(m)
    ShapeFoldPass()(m)
    assert "Shape" not in _ops(m)
    assert_sound(m)
    for cond in (True, False):
        _same_and_optimized(before, m, {**_x((2, 3)), "c": np.array(cond)})


def _flatten_head(dims, extra_shape_entries):
    """y = Reshape(x, Concat(Cast(Cast(Slice(Shape(x), 0, 1))), extra)) (the PaddlePaddle form)."""
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, dims)
    head = g.op.Slice(g.op.Cast(g.op.Shape(x), to=TensorProto.INT32),
                      g.initializer("s0", np.array([0])), g.initializer("s1", np.array([1])))
    t = g.op.Concat(g.op.Cast(head, to=INT64), g.initializer("rest", np.array(extra_shape_entries)), axis=0)
    g.output(g.op.Reshape(x, t), "y")
    return g.to_model()


def test_reshape_target_known_but_for_one_entry_becomes_a_constant():
    # x: FLOAT[n, 6, 1, 1]; target [n, 6] -> [-1, 6]: the whole shape computation goes
    m = _flatten_head(["n", 6, 1, 1], [6])
    before = to_onnx(m)
    ShapeFoldPass()(m)
    reshape = next(n for n in m.graph if n.op_type == "Reshape")
    assert reshape.inputs[1].const is not None
    assert reshape.inputs[1].const.numpy().tolist() in ([-1, 6], [0, 6])
    assert_sound(m)
    _same_and_optimized(before, m, {"x": RNG.standard_normal((3, 6, 1, 1)).astype(np.float32)})
    assert sorted(_ops(optimize(load(before)))) == ["Reshape"]


def test_reshape_target_with_an_unknown_dim_and_a_zero_entry_stays():
    # [n, 0] copies x's dim 1, which may be 0: -1 could not be inferred then, so nothing changes
    m = _flatten_head([None, None, 2], [0])
    ShapeFoldPass()(m)
    reshape = next(n for n in m.graph if n.op_type == "Reshape")
    assert reshape.inputs[1].const is None


def test_reshape_target_with_an_unknown_batch_folds_to_minus_one():
    # the batch is unknown (None), not symbolic: the entry is still the inferred one
    m = _flatten_head([None, 4, 1, 1], [4])
    before = to_onnx(m)
    ShapeFoldPass()(m)
    reshape = next(n for n in m.graph if n.op_type == "Reshape")
    assert reshape.inputs[1].const.numpy().tolist() == [-1, 4]
    _same_and_optimized(before, m, {"x": RNG.standard_normal((5, 4, 1, 1)).astype(np.float32)})
