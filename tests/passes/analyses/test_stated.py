"""Element types, ranks and shapes read off the graph (passes/analyses/stated_types.py), and the rules
that ask for them before they ask the shapes analysis."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto

from onnxforge.graphbuilder.builder.graph_builder import GraphBuilder
from onnxforge.graphbuilder.ir.core import Model, Node, Value
from onnxforge.graphbuilder.serde import to_onnx
from onnxforge.graphbuilder.shapes.context import ShapesContext
from onnxforge.passes import RewritePass, optimize
from onnxforge.passes.analyses.stated_types import stated_dims, stated_elem_type, stated_rank, stated_shape
from onnxforge.passes.rewrites.slice_split import SliceSplitPass

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
    x = g.op.Add(g.input("x0", FLOAT, [2, 8]), g.initializer("z", np.zeros(8, np.float32)), _name="x")
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
    assert inferences == []  # the candidate's shape is inferred on its own (a broadcast's)
    assert len(set(asked)) == 1 and asked[0].startswith("x")
    assert [n.op_type for n in m.graph] == ["Add", "Split", "Identity", "Identity"]
    assert_same_outputs(before, m, {"x0": RNG.standard_normal((2, 8)).astype(np.float32)})


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


def _shape_arithmetic() -> tuple[Model, list[Value]]:
    """What exporters write between tensors: reductions that keep dims, MatMuls, squeezes,
    pieces of a split, Reshape targets built from shape vectors, transposed heads."""
    g = GraphBuilder(opset=18)
    x = g.input("x", FLOAT, ["n", 6, 4])
    w = g.initializer("w", np.ones((4, 4), np.float32))
    mean = g.op.ReduceMean(x, g.initializer("ax", np.array([-1], np.int64)))  # keepdims=1
    h = g.op.MatMul(g.op.Sub(x, mean), w)
    sq = g.op.Squeeze(g.op.Unsqueeze(h, g.initializer("u0", np.array([0, 2], np.int64))),
                      g.initializer("s0", np.array([0], np.int64)))
    parts = g.op.Split(h, g.initializer("sp", np.array([2, 4], np.int64)), axis=1, _outputs=2)
    shape = g.op.Shape(x)
    tail = g.op.Slice(shape, g.initializer("b1", np.array([1], np.int64)), g.initializer("e1", np.array([3], np.int64)),
                      g.initializer("a0", np.array([0], np.int64)))
    target = g.op.Concat(g.initializer("one", np.array([1], np.int64)), g.op.Cast(tail, to=INT64), axis=0)
    heads = g.op.Transpose(g.op.Reshape(h, g.initializer("t", np.array([0, 3, 2, 4], np.int64))), perm=[2, 0, 1, 3])
    vals = [mean, h, sq, parts[1], g.op.Slice(h, g.initializer("b2", np.array([1], np.int64)),
                                              g.initializer("e2", np.array([2], np.int64))),
            g.op.Concat(h, h, axis=0), tail, target, g.op.Reshape(x, target), heads, g.op.Relu(heads)]
    return _with_outputs(g, vals)


def test_rank_and_shape_arithmetic_agree_with_onnx_shape_inference():
    m, vals = _shape_arithmetic()
    inferred = _onnx_inferred(m, vals)
    dims = {v.name: [d.dim_value if d.HasField("dim_value") else None for d in inferred[v.name].shape.dim]
            for v in vals}
    assert [stated_rank(v) for v in vals] == [len(dims[v.name]) for v in vals] == [3, 3, 4, 3, 3, 3, 1, 1, 3, 4, 4]
    assert stated_shape(vals[6]) == (2,) and stated_shape(vals[7]) == (3,)  # Slice of [3], Concat of [1] + [2]
    # Reshape(h, [0, 3, 2, 4]) -> [n, 3, 2, 4]; heads = Transpose(., [2, 0, 1, 3]) -> [2, n, 3, 4]
    for v in vals[-2:]:
        got = stated_dims(v)
        assert got == (2, None, 3, 4)
        assert all(d is None or d == want for d, want in zip(got, dims[v.name])) and dims[v.name][0] == 2
    assert stated_dims(vals[1]) is None  # a MatMul's dims are not read


def test_a_one_d_operand_of_matmul_or_a_squeeze_without_axes_states_no_rank():
    g = GraphBuilder(opset=18)
    x = g.input("x", FLOAT, [3, 4])
    vec = g.op.MatMul(x, g.initializer("v", np.ones(4, np.float32)))  # [3]: the vector's dim goes
    sq = g.op.Squeeze(g.op.Unsqueeze(x, g.initializer("u", np.array([0], np.int64))))  # drops every 1
    g.output(g.op.Identity(vec), "a")
    g.output(g.op.Identity(sq), "b")
    g.to_model()
    assert stated_rank(vec) is None and stated_rank(sq) is None


def test_slice_split_reads_stated_dims_without_asking(inferences, monkeypatch):
    # heads = Transpose(Reshape(x, [0, 3, 2, 4]), [2, 0, 1, 3]): axis 0 is 2 whatever n is
    asked: list[str] = []
    infer_for = ShapesContext.infer_for
    monkeypatch.setattr(ShapesContext, "infer_for",
                        lambda self, values: asked.extend(v.name for v in values) or infer_for(self, values))
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, ["n", 6, 4])
    heads = g.op.Transpose(g.op.Reshape(x, g.initializer("t", np.array([0, 3, 2, 4], np.int64))), perm=[2, 0, 1, 3])
    for k in range(2):
        part = g.op.Slice(heads, g.initializer(f"s{k}", np.array([k], np.int64)),
                          g.initializer(f"e{k}", np.array([k + 1], np.int64)), g.initializer(f"a{k}", np.array([0])))
        g.output(g.op.Identity(part), f"y{k}")
    m = g.to_model()
    before = to_onnx(m)
    assert SliceSplitPass()(m).modified
    assert inferences == [] and asked == []
    assert [n.op_type for n in m.graph].count("Split") == 1
    assert_same_outputs(before, m, {"x": RNG.standard_normal((5, 6, 4)).astype(np.float32)})


def test_a_reshape_target_built_from_shape_entries_states_its_constant_dims():
    # t = Concat(Unsqueeze(Gather(Shape(x), 0)), [4], Unsqueeze(Gather(Shape(x), 2))): [n, 4, w]
    g = GraphBuilder(opset=18)
    x = g.input("x", FLOAT, ["n", 4, "w"])
    shape = g.op.Shape(x)
    n = g.op.Gather(shape, g.initializer("i0", np.array(0, np.int64)), axis=0)
    w = g.op.Gather(shape, g.initializer("i2", np.array(2, np.int64)), axis=0)
    un = g.op.Unsqueeze(n, g.initializer("ua", np.array([0], np.int64)))
    uw = g.op.Unsqueeze(w, g.initializer("ub", np.array([-1], np.int64)))
    target = g.op.Concat(un, g.initializer("four", np.array([4], np.int64)), uw, axis=0)
    y = g.op.Reshape(g.op.Transpose(x, perm=[0, 2, 1]), target)  # [n, w, 4] -> [n, 4, w]
    vals = [n, un, target, y]
    m, vals = _with_outputs(g, vals)
    for v in vals:
        v.type = None
    inferred = onnx.shape_inference.infer_shapes(to_onnx(m), strict_mode=True, data_prop=True)
    types = {vi.name: vi.type.tensor_type for vi in [*inferred.graph.value_info, *inferred.graph.output]}
    shapes = [tuple(d.dim_value if d.HasField("dim_value") else None for d in types[v.name].shape.dim) for v in vals]
    assert [stated_shape(v) for v in vals[:3]] == shapes[:3] == [(), (1,), (3,)]
    assert stated_dims(y) == (None, 4, None) and shapes[3][1] == 4


def test_expand_reductions_conv_and_unsqueeze_agree_with_onnx_shape_inference():
    g = GraphBuilder(opset=18)
    x = g.input("x", FLOAT, ["n", 3, 8, 8])
    conv = g.op.Conv(x, g.initializer("k", np.ones((5, 3, 3, 3), np.float32)))
    vals = [conv, g.op.Unsqueeze(conv, g.initializer("u", np.array([-1], np.int64))),
            g.op.ReduceSum(x, g.initializer("r", np.array([1, -1], np.int64)), keepdims=0),
            g.op.Expand(g.op.ReduceMean(x, g.initializer("m", np.array([2], np.int64)), keepdims=0),
                        g.initializer("e", np.array([2, 1, 1, 1, 8], np.int64)))]
    m, vals = _with_outputs(g, vals)
    inferred = _onnx_inferred(m, vals)
    dims = [[d.dim_value if d.HasField("dim_value") else None for d in inferred[v.name].shape.dim] for v in vals]
    assert [stated_rank(v) for v in vals] == [len(d) for d in dims] == [4, 5, 2, 5]
    assert stated_dims(vals[0]) == (None, 5, None, None) and dims[0][1] == 5
    assert stated_dims(vals[1]) == (None, 5, None, None, 1) and dims[1][1] == 5 and dims[1][4] == 1
