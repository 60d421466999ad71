"""Element types, ranks and shapes read off the graph (passes/stated.py), and the rules
that ask for them before they ask the shapes analysis."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto

from onnxforge.graphbuilder.builder import GraphBuilder
from onnxforge.graphbuilder.ir import Model, Node, Value
from onnxforge.graphbuilder.serde import to_onnx
from onnxforge.graphbuilder.shapes import ShapesContext
from onnxforge.passes import RewritePass, optimize
from onnxforge.passes.stated import stated_elem_type, stated_rank, stated_shape
from onnxforge.passes.fusion import SliceSplitPass

from tests.passes.helpers import FLOAT, assert_same_outputs

INT64, INT32, BOOL = TensorProto.INT64, TensorProto.INT32, TensorProto.BOOL
RNG = np.random.default_rng(3)


@pytest.fixture
def inferences(monkeypatch) -> list[int]:
    """Counts whole-model shape inferences (``ShapesContext.infer_graph`` on a main graph)."""
    calls: list[int] = []
    real = ShapesContext.infer_graph

    def counted(self, graph=None):
        if graph is None:
            calls.append(1)
        return real(self, graph)

    monkeypatch.setattr(ShapesContext, "infer_graph", counted)
    return calls


def _many_ops() -> tuple[Model, list[Value]]:
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [2, 3])
    i = g.input("i", INT32, [2])
    img = g.input("img", TensorProto.FLOAT16, [1, 3, 8, 8])
    s = g.op.Shape(x)
    vals = [
        s, g.op.Size(x), g.op.Slice(s, g.constant(np.array([0], np.int64), "s0"),
                                    g.constant(np.array([1], np.int64), "e0")),
        g.op.Cast(x, to=TensorProto.FLOAT16), g.op.Relu(x), g.op.Add(x, x), g.op.Neg(i),
        g.op.Equal(i, i), g.op.Not(g.op.Less(x, x)), g.op.Reshape(x, g.constant(np.array([3, 2], np.int64), "r")),
        g.op.Transpose(x, perm=[1, 0]), g.op.Concat(i, i, axis=0), g.op.ArgMax(x, axis=1),
        g.op.Where(g.op.Greater(i, i), i, i),
        g.op.Gather(x, g.constant(np.array([1], np.int64), "gi"), axis=0),
        g.op.Unsqueeze(i, g.constant(np.array([0], np.int64), "ua")),
        g.op.Softmax(x), g.op.MatMul(x, g.initializer("m", np.ones((3, 2), np.float32))),
        g.op.Pow(x, g.initializer("e", np.array([2], np.int32))),  # the base's type is the result's
        g.op.Pad(x, g.constant(np.array([0, 1, 0, 1], np.int64), "pads")),
        g.op.Conv(img, g.initializer("k", np.ones((2, 3, 3, 3), np.float16))),
        g.op.MaxPool(img, kernel_shape=[2, 2]),
        g.op.BatchNormalization(img, *[g.initializer(f"bn{k}", np.ones(3, np.float16)) for k in range(4)]),
        g.op.LSTM(g.op.Unsqueeze(x, g.constant(np.array([0], np.int64), "ux")),
                  g.initializer("W", np.ones((1, 8, 3), np.float32)),
                  g.initializer("R", np.ones((1, 8, 2), np.float32)), hidden_size=2, _outputs=1),
        g.op.CastLike(x, i),  # not read off the graph: None
        g.initializer("w", np.zeros((2,), np.uint8)),
    ]
    return _with_outputs(g, vals)


def _with_outputs(g: GraphBuilder, vals: list[Value]) -> tuple[Model, list[Value]]:
    for k, v in enumerate(vals):
        g.output(g.op.Identity(v), f"y{k}")
    return g.to_model(), vals


def _onnx_inferred(m: Model, vals: list[Value]) -> dict[str, onnx.TypeProto.Tensor]:
    """What onnx's shape inference says of every value, with the computed values'
    declared types dropped first (only the graph's structure may answer)."""
    for v in vals:
        if v.const is None:
            v.type = None
    inferred = onnx.shape_inference.infer_shapes(to_onnx(m), strict_mode=True)
    return {vi.name: vi.type.tensor_type
            for vi in [*inferred.graph.value_info, *inferred.graph.output, *inferred.graph.input]}


def test_stated_elem_types_agree_with_onnx_shape_inference():
    m, vals = _many_ops()
    types = {name: t.elem_type for name, t in _onnx_inferred(m, vals).items()}
    for init in m.graph.initializers.values():
        types[init.name] = init.const.dtype
    stated = {v.name: stated_elem_type(v) for v in vals}
    known = {n: t for n, t in stated.items() if t is not None}
    assert len(known) == len(vals) - 1
    assert stated[vals[-2].name] is None  # CastLike
    for name, t in known.items():
        assert types[name] == t, name
    assert stated[vals[2].name] == INT64 and stated[vals[7].name] == BOOL and stated[vals[6].name] == INT32


def test_no_element_type_without_a_rule_that_fixes_it():
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [2])
    m = g.to_model()
    custom = m.graph.append(Node("com.example", "Mystery", [x], ["c"]))
    cast = m.graph.append(Node("", "Cast", [custom.outputs[0]], ["d"]))  # no `to`: no answer
    assert stated_elem_type(custom.outputs[0]) is None
    assert stated_elem_type(cast.outputs[0]) is None
    assert stated_elem_type(x) == FLOAT
    assert stated_elem_type(None) is None


def test_cast_of_shape_arithmetic_goes_without_inferring_shapes(inferences):
    # Cast(Slice(Shape(x)), INT64) -> the Slice: Shape gives INT64 on every opset;
    # Cast(., INT32) of it changes the type and stays
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, ["b", 3])
    s = g.op.Slice(g.op.Shape(x), g.constant(np.array([1], np.int64), "s0"),
                   g.constant(np.array([2], np.int64), "e0"))
    g.output(g.op.Cast(s, to=INT64), "n")
    g.output(g.op.Cast(s, to=INT32), "n32")
    m = _rewritten_untyped(g, {"x": RNG.standard_normal((5, 3)).astype(np.float32)})
    assert [n.op_type for n in m.graph].count("Cast") == 1
    assert inferences == []


def _rewritten_untyped(g: GraphBuilder, feeds: dict[str, np.ndarray]) -> Model:
    """The model of ``g`` with no declared type on node outputs, after the rewrite pass
    (its outputs checked against the model before it)."""
    m = g.to_model()
    for n in m.graph:
        for o in n.outputs:
            o.type = None
    before = to_onnx(m)
    RewritePass()(m)
    assert_same_outputs(before, m, feeds)
    return m


def test_a_slice_that_starts_past_zero_is_kept_without_inferring_shapes(inferences):
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [4, 3])
    y = g.op.Slice(x, g.initializer("s", np.array([1], np.int64)), g.initializer("e", np.array([9], np.int64)))
    g.output(g.op.Identity(y), "y")
    m = g.to_model()
    RewritePass()(m)
    assert [n.op_type for n in m.graph] == ["Slice", "Identity"]
    assert inferences == []


def _slices(complementary: bool) -> Model:
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [2, 8])
    lo = g.op.Slice(x, g.constant(np.array([0], np.int64), "s0"), g.constant(np.array([4], np.int64), "e0"),
                    g.constant(np.array([1], np.int64), "a0"))
    g.output(g.op.Identity(lo), "lo")
    if complementary:
        hi = g.op.Slice(x, g.constant(np.array([4], np.int64), "s1"), g.constant(np.array([8], np.int64), "e1"),
                        g.constant(np.array([1], np.int64), "a1"))
        g.output(g.op.Identity(hi), "hi")
    m = g.to_model()
    optimize(m, ["constant_folding"])
    return m


def test_slice_split_infers_shapes_only_for_a_candidate(inferences, monkeypatch):
    asked: list[str] = []
    infer_for = ShapesContext.infer_for
    monkeypatch.setattr(ShapesContext, "infer_for",
                        lambda self, values: asked.extend(v.name for v in values) or infer_for(self, values))
    m = _slices(complementary=False)
    assert not SliceSplitPass()(m).modified
    assert inferences == [] and asked == []
    m = _slices(complementary=True)
    before = to_onnx(m)
    assert SliceSplitPass()(m).modified
    assert inferences == []  # the candidate's shape is inferred on its own: x's
    assert set(asked) == {"x"}
    assert [n.op_type for n in m.graph] == ["Split", "Identity", "Identity"]
    assert_same_outputs(before, m, {"x": RNG.standard_normal((2, 8)).astype(np.float32)})


def _vision_chain() -> tuple[Model, list[Value]]:
    """A CNN-like chain (conv, norm, pools, activations, broadcasts, a residual) and the
    shape arithmetic an exporter writes after it."""
    g = GraphBuilder(opset=17)
    x = g.input("x", FLOAT, ["n", 3, 16, 16])
    w = g.initializer("w", np.ones((8, 3, 3, 3), np.float32))
    c = g.op.Conv(x, w, pads=[1, 1, 1, 1])
    bn = g.op.BatchNormalization(c, *[g.initializer(f"p{k}", np.ones(8, np.float32)) for k in range(4)])
    h = g.op.HardSigmoid(g.op.Clip(bn, g.initializer("lo", np.float32(0)), g.initializer("hi", np.float32(6))))
    r = g.op.Add(g.op.Mul(h, g.initializer("s", np.ones((8, 1, 1), np.float32))), bn)  # a residual
    pooled = g.op.GlobalAveragePool(g.op.MaxPool(r, kernel_shape=[2, 2], strides=[2, 2]))
    s = g.op.Shape(pooled)
    vals = [c, bn, h, r, pooled, s, g.op.Cast(s, to=INT32), g.op.Size(pooled),
            g.op.Relu(g.op.Div(pooled, g.initializer("d", np.float32(2)))),
            g.op.Reshape(pooled, g.initializer("shape", np.array([0, -1], np.int64)))]
    return _with_outputs(g, vals)


def test_stated_ranks_and_shapes_agree_with_onnx_shape_inference():
    m, vals = _vision_chain()
    shapes = {name: [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
              for name, t in _onnx_inferred(m, vals).items()}
    ranks = [stated_rank(v) for v in vals]
    assert ranks[:-1] == [len(shapes[v.name]) for v in vals[:-1]]
    assert ranks[-1] == 2 == len(shapes[vals[-1].name])  # Reshape: the target's length
    assert stated_shape(vals[5]) == (4,) == tuple(shapes[vals[5].name])
    assert stated_shape(vals[6]) == (4,)  # through the Cast
    assert stated_shape(vals[7]) == () and shapes[vals[7].name] == []
    assert stated_shape(vals[0]) is None  # symbolic batch: no static shape
    assert stated_shape(m.graph.initializers["w"]) == (8, 3, 3, 3)


def test_no_rank_through_an_operator_that_is_not_read():
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [2, 3])
    y = g.op.Squeeze(g.op.Relu(x))  # Squeeze is not among those read
    t = g.input("t", INT64, [None])  # a target of unknown length
    g.output(g.op.Identity(g.op.Add(y, x)), "z")
    g.output(g.op.Reshape(x, t), "r")
    m = g.to_model()
    assert stated_rank(y) is None
    assert stated_rank(m.graph.outputs[0].producer().inputs[0]) is None
    assert stated_rank(m.graph.outputs[1]) is None
    assert stated_rank(x) == 2


def test_flatten_and_reshape_ranks_agree_with_onnx_shape_inference():
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, ["n", 3, 4, 5])
    vals = [g.op.Flatten(x, axis=0), g.op.Flatten(x, axis=3), g.op.Flatten(g.op.Relu(x)),
            g.op.Reshape(x, g.initializer("t3", np.array([0, -1, 5], np.int64))),
            g.op.Reshape(x, g.op.Shape(x)),  # the target is [rank(x)] long
            g.op.Add(g.op.Flatten(x), g.initializer("b", np.ones((1, 1, 60), np.float32)))]
    m, vals = _with_outputs(g, vals)
    shapes = _onnx_inferred(m, vals)
    assert [stated_rank(v) for v in vals] == [len(shapes[v.name].shape.dim) for v in vals] == [2, 2, 2, 3, 4, 3]


def test_slice_of_a_shape_vector_is_decided_without_inferring_shapes(inferences):
    # Slice(Cast(Shape(x)), [0], [1]) keeps one of rank(x) = 4 entries: not a no-op, said
    # without inference; of a rank-1 x it is the whole vector, and goes
    for rank, kept in ((4, ["Shape", "Cast", "Slice", "Identity"]), (1, ["Shape", "Cast", "Identity"])):
        g = GraphBuilder(opset=21)
        x = g.input("x", FLOAT, ["b", 3, 8, 8][:rank])
        s = g.op.Cast(g.op.Shape(g.op.Relu(x)), to=INT32)
        y = g.op.Slice(s, g.initializer("s", np.array([0], np.int64)), g.initializer("e", np.array([1], np.int64)))
        g.output(g.op.Identity(y), "y")
        m = _rewritten_untyped(g, {"x": RNG.standard_normal((2, 3, 8, 8)[:rank]).astype(np.float32)})
        assert [n.op_type for n in m.graph if n.op_type != "Relu"] == kept
        assert inferences == []
