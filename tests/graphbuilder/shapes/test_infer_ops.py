"""Per-operator shape rules checked against running the operator.

Every case builds a small IR graph whose inputs have symbolic dimensions,
infers it with :class:`ShapesContext`, then runs the same graph (converted to
an ``onnx.ModelProto`` by a converter local to this file) with
``onnx.reference.ReferenceEvaluator`` — or onnxruntime for ``com.microsoft``
operators — on concrete inputs for several assignments of the symbols. Each
inferred dimension, evaluated under the assignment, must equal the real
result's dimension, and the inferred element type must equal the result's.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from onnxforge.graphbuilder.ir.core import Alias, Attr, AttrType, Function, Graph, Model, Node, Value
from onnxforge.graphbuilder.shapes.context import ShapesContext
from onnxforge.graphbuilder.shapes.symtensor import ShapeError
from onnxforge.graphbuilder.shapes.symbolic import SymExpr, parse_dim
from onnxforge.graphbuilder.ir.tensors import Tensor, np_dtype, onnx_dtype
from onnxforge.proto_ext.types import TensorType

MS = "com.microsoft"
ENVS: tuple[dict[str, int], ...] = ({"b": 2, "s": 3, "p": 5}, {"b": 1, "s": 4, "p": 0}, {"b": 3, "s": 1, "p": 7})


# ----------------------------------------------------------------------------- harness


def make_attr(name: str, value: Any) -> Attr:
    """An IR attribute from a Python value."""
    if isinstance(value, bool) or isinstance(value, (int, np.integer)):
        return Attr(name, AttrType.INT, int(value))
    if isinstance(value, float):
        return Attr(name, AttrType.FLOAT, value)
    if isinstance(value, str):
        return Attr(name, AttrType.STRING, value.encode())
    if isinstance(value, np.ndarray):
        return Attr(name, AttrType.TENSOR, Tensor.from_numpy(value))
    if isinstance(value, Graph):
        return Attr(name, AttrType.GRAPH, value)
    if isinstance(value, (list, tuple)) and all(isinstance(v, (int, np.integer)) for v in value):
        return Attr(name, AttrType.INTS, [int(v) for v in value])
    if isinstance(value, (list, tuple)):
        return Attr(name, AttrType.FLOATS, [float(v) for v in value])
    raise TypeError(f"no attribute type for {value!r}")


class Net:
    """A tiny helper that builds IR graphs tersely."""

    def __init__(self, opset: int = 23, domains: dict[str, int] | None = None, graph: Graph | None = None):
        self.g = graph if graph is not None else Graph("g")
        self.opsets = {"": opset, **(domains or {})}
        self.functions: list[Function] = []
        self._n = 0

    def input(self, name: str, elem: int, shape: Sequence[int | str | None] | None) -> Value:
        return self.g.add_input(Value(name, TensorType(elem, None if shape is None else tuple(shape))))

    def const(self, name: str, array: Any) -> Value:
        return self.g.add_initializer(Value(name), Tensor.from_numpy(np.asarray(array)))

    def node(self, op: str, inputs: Sequence[Value | None], n_out: int = 1, domain: str = "",
             output_alias: Sequence[Alias] = (), **attrs: Any) -> Node:
        self._n += 1
        outs = [f"{op.lower()}{self._n}_{i}" for i in range(n_out)]
        node = Node(domain, op, inputs, outs, name=f"{op}{self._n}",
                    attributes=[make_attr(k, v) for k, v in attrs.items()], output_alias=output_alias)
        for a in node.attributes.values():
            for sg in a.graphs():
                sg.parent = node
        self.g.append(node)
        return node

    def op(self, op: str, *inputs: Value | None, domain: str = "", **attrs: Any) -> Value:
        return self.node(op, inputs, 1, domain, **attrs).outputs[0]

    def model(self) -> Model:
        m = Model(self.g, opset_imports=dict(self.opsets))
        for f in self.functions:
            m.add_function(f)
        return m


def _attr_proto(a: Attr, ctx: ShapesContext) -> onnx.AttributeProto:
    v = a.value
    if a.type == AttrType.TENSOR:
        return helper.make_attribute(a.name, numpy_helper.from_array(np.asarray(v.numpy())))
    if a.type == AttrType.GRAPH:
        return helper.make_attribute(a.name, graph_proto(v, ctx))
    if a.type == AttrType.STRING:
        return helper.make_attribute(a.name, v)
    return helper.make_attribute(a.name, v)


def _vi(v: Value, ctx: ShapesContext, scalar: bool = False) -> onnx.ValueInfoProto:
    """Value info carrying only the element type: the oracle never sees inferred shapes
    (``scalar`` keeps a rank-0 shape, which onnxruntime needs for a Loop's counters)."""
    t = ctx.type_of(v)
    elem = t.elem_type if isinstance(t, TensorType) else 0
    if not elem:
        return helper.make_empty_tensor_value_info(v.name)
    return helper.make_tensor_value_info(v.name, elem, () if scalar and t.shape == () else None)


def node_proto(n: Node, ctx: ShapesContext) -> onnx.NodeProto:
    p = helper.make_node(n.op_type, ["" if v is None else v.name for v in n.inputs],
                         [v.name for v in n.outputs], name=n.name, domain=n.domain)
    for a in n.attributes.values():
        if a.ref_attr_name:
            p.attribute.append(helper.make_attribute_ref(a.name, a.type))
            p.attribute[-1].ref_attr_name = a.ref_attr_name
        else:
            p.attribute.append(_attr_proto(a, ctx))
    return p


def graph_proto(g: Graph, ctx: ShapesContext, outputs: Sequence[Value] | None = None) -> onnx.GraphProto:
    inits = [numpy_helper.from_array(np.asarray(v.const.numpy()), v.name) for v in g.initializers.values()]
    return helper.make_graph([node_proto(n, ctx) for n in g], g.name or "g",
                             [_vi(v, ctx, scalar=g.parent is not None) for v in g.inputs],
                             [_vi(v, ctx) for v in (outputs if outputs is not None else g.outputs)],
                             initializer=inits)


def model_proto(model: Model, ctx: ShapesContext, outputs: Sequence[Value]) -> onnx.ModelProto:
    opsets = [helper.make_opsetid(d, v) for d, v in model.opset_imports.items()]
    funcs = []
    for f in model.functions.values():
        fp = helper.make_function(f.domain, f.name, [v.name for v in f.inputs], [v.name for v in f.outputs],
                                  [node_proto(n, ctx) for n in f],
                                  [helper.make_opsetid(d, v)
                                   for d, v in (f.opset_imports or model.opset_imports).items()],
                                  attributes=list(f.attributes))
        funcs.append(fp)
    return helper.make_model(graph_proto(model.graph, ctx, outputs), opset_imports=opsets, functions=funcs,
                             ir_version=10)


def run(proto: onnx.ModelProto, feeds: dict[str, np.ndarray], runtime: str) -> list[np.ndarray]:
    if runtime == "ort":
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        sess = ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])
        return sess.run(None, feeds)
    return ReferenceEvaluator(proto).run(None, feeds)


def concrete(d: Any, env: dict[str, int]) -> int | None:
    if d is None:
        return None
    if isinstance(d, SymExpr):
        return d.evaluate(env)
    return int(d)


def random_feeds(g: Graph, env: dict[str, int], rng: np.random.Generator,
                 data: dict[str, Callable[[dict[str, int], np.random.Generator], np.ndarray]]) -> dict:
    feeds = {}
    for v in g.inputs:
        if v.name in data:
            feeds[v.name] = data[v.name](env, rng)
            continue
        t = v.type
        shape = tuple(concrete(parse_dim(d) if isinstance(d, str) else d, env) for d in t.shape)
        dt = np_dtype(t.elem_type)
        if t.elem_type == TP.BOOL:
            feeds[v.name] = rng.random(shape) > 0.5
        elif np.issubdtype(dt, np.integer):
            feeds[v.name] = rng.integers(0, 3, size=shape).astype(dt)
        else:
            feeds[v.name] = rng.standard_normal(shape).astype(dt)
    return feeds


def check(net: Net, outputs: Sequence[Value], *, envs: Sequence[dict[str, int]] = ENVS,
          runtime: str = "ref", data: dict | None = None, allow_unknown: bool = False,
          ctx: ShapesContext | None = None) -> ShapesContext:
    """Infer ``net`` and compare each of ``outputs`` with the oracle for every assignment."""
    model = net.model()
    if ctx is None:
        ctx = ShapesContext(model).infer_graph()
    proto = model_proto(model, ctx, outputs)
    rng = np.random.default_rng(0)
    for env in envs:
        results = run(proto, random_feeds(net.g, env, rng, data or {}), runtime)
        for v, arr in zip(outputs, results):
            t = ctx.type_of(v)
            assert isinstance(t, TensorType), f"{v.name}: no tensor type inferred"
            assert t.elem_type == onnx_dtype(np.asarray(arr).dtype), (v.name, t, arr.dtype)
            assert t.shape is not None, f"{v.name}: rank unknown"
            got = tuple(concrete(d, env) for d in t.shape)
            want = np.asarray(arr).shape
            assert len(got) == len(want), (v.name, t.shape, want, env)
            for g_dim, w_dim in zip(got, want):
                if g_dim is None and allow_unknown:
                    continue
                assert g_dim == w_dim, (v.name, str(t), want, env)
            known = ctx.value_of(v)
            if known is not None:  # tracked contents must match the computed ones
                assert known.shape == tuple(concrete(d, env) for d in t.shape)
                for k, (x, a) in enumerate(zip(known.flat(), np.asarray(arr).reshape(-1).tolist())):
                    if x is not None:
                        assert np.isclose(concrete(x, env) if isinstance(x, SymExpr) else x, a), (v.name, k, x, a)
    return ctx


F, I64, I32, BOOL = TP.FLOAT, TP.INT64, TP.INT32, TP.BOOL


# ----------------------------------------------------------------------------- element-wise


@pytest.mark.parametrize("op", ["Sqrt", "Reciprocal", "Neg", "Abs", "Exp", "Log", "Tanh", "Sigmoid", "Relu",
                                "Erf", "Cos", "Sin", "Identity", "Softmax"])
def test_unary_float(op: str) -> None:
    n = Net()
    x = n.input("x", F, ("b", "s", 4))
    positive = {"x": lambda env, rng: rng.random((env["b"], env["s"], 4)).astype(np.float32) + 0.5}
    check(n, [n.op(op, x)], data=positive)


@pytest.mark.parametrize("op,elem", [("IsNaN", F), ("Not", BOOL)])
def test_unary_to_bool(op: str, elem: int) -> None:
    n = Net()
    x = n.input("x", elem, ("b", "s"))
    check(n, [n.op(op, x)])


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Pow"])
@pytest.mark.parametrize("shapes", [(("b", "s", 4), (1, "s", 1)), (("b", 1, 4), ("s", 1)), (("s",), ("b", 1))])
def test_binary_broadcast(op: str, shapes: tuple) -> None:
    n = Net()
    a, b = n.input("a", F, shapes[0]), n.input("c", F, shapes[1])
    check(n, [n.op(op, a, b)])


@pytest.mark.parametrize("op", ["Equal", "Less", "Greater", "LessOrEqual"])
def test_comparison(op: str) -> None:
    n = Net()
    a, b = n.input("a", I64, ("b", "s")), n.input("c", I64, ("s",))
    check(n, [n.op(op, a, b)])


@pytest.mark.parametrize("op", ["And", "Or"])
def test_logic(op: str) -> None:
    n = Net()
    a, b = n.input("a", BOOL, ("b", 1, "s")), n.input("c", BOOL, (4, 1))
    check(n, [n.op(op, a, b)])


@pytest.mark.parametrize("op", ["Max", "Min"])
def test_variadic(op: str) -> None:
    n = Net()
    a, b, c = n.input("a", F, ("b", 1)), n.input("c", F, ("s",)), n.input("d", F, (1, 1))
    check(n, [n.op(op, a, b, c)])


def test_where_clip_cast_castlike() -> None:
    n = Net()
    c, x, y = n.input("c", BOOL, ("b", 1)), n.input("x", F, ("b", "s")), n.input("y", F, ("s",))
    w = n.op("Where", c, x, y)
    lo, hi = n.const("lo", np.float32(-0.5)), n.const("hi", np.float32(0.5))
    cl = n.op("Clip", x, lo, hi)
    ca = n.op("Cast", x, to=TP.INT64)
    like = n.input("like", TP.DOUBLE, (1,))
    cl2 = n.op("CastLike", y, like)
    check(n, [w, cl, ca, cl2])


def test_dropout_outputs() -> None:
    n = Net()
    x = n.input("x", F, ("b", "s", 4))
    node = n.node("Dropout", [x], 2)
    check(n, list(node.outputs))


# ----------------------------------------------------------------------------- shape ops


def test_constant_and_constant_of_shape() -> None:
    n = Net()
    c = n.op("Constant", value=np.array([[1, 2, 3]], np.int64))
    ci = n.op("Constant", value_ints=[4, 5])
    cf = n.op("Constant", value_float=1.5)
    cos = n.op("ConstantOfShape", n.const("shape", np.array([2, 3], np.int64)), value=np.array([7], np.int32))
    n.input("unused", F, (1,))
    ctx = check(n, [c, ci, cf, cos])
    assert ctx.value_of(ci).flat() == [4, 5]
    assert ctx.value_of(cos).flat() == [7] * 6


def test_shape_size_gather_chain() -> None:
    n = Net()
    x = n.input("x", F, ("b", "s", 4))
    s = n.op("Shape", x)
    s_tail = n.op("Shape", x, start=1)
    size = n.op("Size", x)
    g = n.op("Gather", s, n.const("i", np.array([1, 0], np.int64)))
    ctx = check(n, [s, s_tail, size, g])
    assert [str(e) for e in ctx.value_of(s).flat()] == ["b", "s", "4"]
    assert ctx.value_of(s_tail).flat() == [parse_dim("s"), 4]
    assert ctx.value_of(size).flat() == [parse_dim("4*b*s")]
    assert ctx.value_of(g).flat() == [parse_dim("s"), parse_dim("b")]


def test_gather_variants() -> None:
    n = Net()
    x = n.input("x", F, ("b", "s", 6))
    idx = n.input("idx", I64, ("p", 2))
    g0 = n.op("Gather", x, idx, axis=2)
    gs = n.op("Gather", x, n.const("k", np.array(1, np.int64)), axis=1)
    ge = n.op("GatherElements", x, n.input("ie", I64, ("b", "s", 2)), axis=2)
    gnd = n.op("GatherND", x, n.input("ind", I64, ("p", 2)))
    check(n, [g0, gs, ge, gnd], data={"ind": lambda env, rng: np.zeros((env["p"], 2), np.int64)},
          envs=[e for e in ENVS if e["s"] > 1])


def test_unsqueeze_squeeze_flatten_transpose() -> None:
    n = Net()
    x = n.input("x", F, ("b", 1, "s"))
    u = n.op("Unsqueeze", x, n.const("ax", np.array([0, -1], np.int64)))
    q = n.op("Squeeze", x, n.const("ax1", np.array([1], np.int64)))
    f = n.op("Flatten", u, axis=2)
    t = n.op("Transpose", u, perm=[3, 1, 0, 2, 4])
    tr = n.op("Transpose", x)
    check(n, [u, q, f, t, tr])


def test_unsqueeze_squeeze_old_opset_attributes() -> None:
    n = Net(opset=11)
    x = n.input("x", F, ("b", 1, "s"))
    u = n.op("Unsqueeze", x, axes=[1])
    q = n.op("Squeeze", x, axes=[1])
    check(n, [u, q])


@pytest.mark.parametrize("target,allowzero", [([0, -1, 2], 0), ([-1], 0), ([2, 0, 0, 2], 1)])
def test_reshape_constant_targets(target: list[int], allowzero: int) -> None:
    n = Net()
    x = n.input("x", F, ("b", "s", 4) if allowzero == 0 else (2, 0, 0, 2))
    r = n.op("Reshape", x, n.const("t", np.array(target, np.int64)), allowzero=allowzero)
    check(n, [r])


def test_reshape_from_shape_arithmetic() -> None:
    """The torch export pattern: Shape -> Gather -> Unsqueeze -> Concat -> Reshape."""
    n = Net()
    x = n.input("x", F, ("b", "s", 128))
    s = n.op("Shape", x)
    b = n.op("Gather", s, n.const("zero", np.array(0, np.int64)))
    q = n.op("Gather", s, n.const("one", np.array(1, np.int64)))
    ax = n.const("ax", np.array([0], np.int64))
    t = n.op("Concat", n.op("Unsqueeze", b, ax), n.op("Unsqueeze", q, ax),
             n.const("rest", np.array([4, 32], np.int64)), axis=0)
    r = n.op("Reshape", x, t, allowzero=1)
    ctx = check(n, [t, r])
    assert [str(d) for d in ctx.shape_of(r)] == ["b", "s", "4", "32"]
    assert [str(e) for e in ctx.value_of(t).flat()] == ["b", "s", "4", "32"]


def test_concat_symbolic_sum() -> None:
    n = Net()
    past = n.input("past", F, ("b", 2, "p", 8))
    new = n.input("new", F, ("b", 2, "s", 8))
    c = n.op("Concat", past, new, axis=-2)
    ctx = check(n, [c])
    assert ctx.shape_of(c)[2] == parse_dim("p + s")


def test_concat_mismatch_is_an_error() -> None:
    n = Net()
    a, b = n.input("a", F, ("b", 3)), n.input("c", F, ("b", 4))
    n.op("Concat", a, b, axis=0)
    with pytest.raises(ShapeError, match="dimension 1"):
        ShapesContext(n.model()).infer_graph()


def test_split_variants() -> None:
    n = Net()
    x = n.input("x", F, ("b", "s", 6))
    s1 = n.node("Split", [x, n.const("sp", np.array([1, 5], np.int64))], 2, axis=2).outputs
    s2 = n.node("Split", [x], 3, axis=2).outputs
    check(n, [*s1, *s2])
    n = Net(opset=18)
    x = n.input("x", F, ("b", 5))
    s3 = n.node("Split", [x], 2, axis=1, num_outputs=2).outputs
    check(n, list(s3))


@pytest.mark.parametrize("starts,ends,axes,steps", [
    ([1], [-1], [2], [2]),
    ([0], [2 ** 63 - 1], [1], [1]),
    ([-1], [-(2 ** 63)], [1], [-1]),
    ([0, 1], [1, 3], [0, 2], [1, 1]),
    ([-2], [2 ** 63 - 1], [1], [1]),
])
def test_slice_constant_bounds(starts: list, ends: list, axes: list, steps: list) -> None:
    n = Net()
    x = n.input("x", F, ("b", "s", 10))
    c = [n.const(k, np.array(v, np.int64)) for k, v in (("st", starts), ("en", ends), ("ax", axes), ("sp", steps))]
    envs = [e for e in ENVS if e["s"] >= 2]
    check(n, [n.op("Slice", x, *c)], envs=envs)


def test_slice_with_symbolic_bounds() -> None:
    """Slicing a causal mask [0:past+seq] on a fixed-size dimension gives past + seq."""
    n = Net()
    mask = n.input("mask", F, (64, 64))
    past = n.input("pastv", F, ("b", 2, "p", 8))
    new = n.input("new", F, ("b", 2, "s", 8))
    sp, sn = n.op("Shape", past), n.op("Shape", new)
    two = n.const("two", np.array([2], np.int64))
    three = n.const("three", np.array([3], np.int64))
    end = n.op("Add", n.op("Slice", sp, two, three), n.op("Slice", sn, two, three))
    zero = n.const("zero", np.array([0], np.int64))
    sl = n.op("Slice", mask, zero, end, n.const("one", np.array([1], np.int64)))
    ctx = check(n, [sl])
    assert ctx.shape_of(sl) == (64, parse_dim("p + s"))


def test_expand_range_tile_trilu_pad_scatter() -> None:
    n = Net()
    x = n.input("x", F, ("b", 1, 4))
    e = n.op("Expand", x, n.const("t", np.array([1, 3, 4], np.int64)))
    s = n.op("Shape", n.input("y", F, ("s",)))
    length = n.op("Squeeze", s, n.const("a0", np.array([0], np.int64)))
    r = n.op("Range", n.const("start", np.array(0, np.int64)), length, n.const("d", np.array(1, np.int64)))
    rc = n.op("Range", n.const("f0", np.float32(1.0)), n.const("f1", np.float32(10.0)), n.const("f2", np.float32(3.0)))
    t = n.op("Tile", x, n.const("reps", np.array([1, 2, 3], np.int64)))
    tri = n.op("Trilu", n.input("m", F, ("s", "p")), upper=1)
    pad = n.op("Pad", x, n.const("pads", np.array([0, 1, 2, 0, 3, 0], np.int64)))
    upd = n.input("upd", F, (2, 4))
    sc = n.op("ScatterND", e, n.const("ind", np.array([[0, 0], [0, 2]], np.int64)), upd)
    ctx = check(n, [e, r, rc, t, tri, pad, sc])
    assert ctx.shape_of(r) == (parse_dim("s"),)
    assert ctx.value_of(rc).flat() == [1.0, 4.0, 7.0]


def test_expand_with_symbolic_target_and_constant_of_shape() -> None:
    n = Net()
    x = n.input("x", F, ("b", "s"))
    y = n.input("y", F, (1, "s"))
    e = n.op("Expand", y, n.op("Shape", x))
    c = n.op("ConstantOfShape", n.op("Shape", x))
    ctx = check(n, [e, c])
    assert ctx.shape_of(c) == (parse_dim("b"), parse_dim("s"))


def test_shape_arithmetic_contents_match_the_runtime() -> None:
    """Integer arithmetic on shape values keeps symbolic contents that equal the computed ones."""
    n = Net()
    x = n.input("x", F, ("b", "s", 6))
    s = n.op("Shape", x)
    two = n.const("two", np.array(2, np.int64))
    tail = n.op("Slice", s, n.const("one", np.array([1], np.int64)), n.const("big", np.array([9], np.int64)))
    outs = [
        n.op("Add", s, two), n.op("Sub", s, two), n.op("Mul", s, two), n.op("Div", s, two), n.op("Mod", s, two),
        n.op("Neg", s), n.op("Max", s, two), n.op("Min", tail, n.const("three", np.array([3], np.int64))),
        n.op("Equal", s, n.op("Shape", x)), n.op("Cast", s, to=TP.INT32),
        n.op("Where", n.op("Greater", tail, two), tail, two),
        n.op("ReduceProd", s, keepdims=0), n.op("ReduceSum", tail, keepdims=1),
        n.op("Tile", tail, n.const("r", np.array([2], np.int64))),
        n.op("Unsqueeze",
             n.op("Squeeze", n.op("Slice", s, n.const("z", np.array([0], np.int64)),
                                  n.const("o", np.array([1], np.int64)))),
             n.const("a0", np.array([0], np.int64))),
        n.op("Range", n.const("r0", np.array(0, np.int64)), n.const("r5", np.array(5, np.int64)), two),
        n.op("Not", n.op("Less", s, two)),
        n.op("Abs", n.op("Sub", two, n.const("nine", np.array(9, np.int64)))),
    ]
    outs.extend(n.node("Split", [s, n.const("sp", np.array([1, 2], np.int64))], 2).outputs)
    ctx = check(n, outs)
    assert all(ctx.value_of(v) is not None for v in outs), [v.name for v in outs if ctx.value_of(v) is None]
    assert ctx.value_of(outs[2]).flat() == [parse_dim("2*b"), parse_dim("2*s"), 12]


# ----------------------------------------------------------------------------- reductions, nn


@pytest.mark.parametrize("op", ["ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin"])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reductions(op: str, keepdims: int) -> None:
    n = Net()
    x = n.input("x", F, ("b", "s", 4))
    r = n.op(op, x, n.const("axes", np.array([-1, 0], np.int64)), keepdims=keepdims)
    r_all = n.op(op, x, keepdims=keepdims)
    check(n, [r, r_all])


def test_argmax() -> None:
    n = Net()
    x = n.input("x", F, ("b", "s", 4))
    check(n, [n.op("ArgMax", x, axis=1, keepdims=0), n.op("ArgMax", x, axis=-1)])


@pytest.mark.parametrize("sa,sb", [(("b", "s", 4), (4, 6)), (("b", 1, "s", 4), (3, 4, "p")), ((4,), ("b", 4, 2)),
                                   (("s", 4), (4,)), ((4,), (4,))])
def test_matmul(sa: tuple, sb: tuple) -> None:
    n = Net()
    check(n, [n.op("MatMul", n.input("a", F, sa), n.input("c", F, sb))])


def test_gemm_and_layer_norm() -> None:
    n = Net()
    a, b = n.input("a", F, (4, "b")), n.input("c", F, ("s", 4))
    g = n.op("Gemm", a, b, transA=1, transB=1)
    x = n.input("x", F, ("b", "s", 8))
    scale, bias = n.const("sc", np.ones(8, np.float32)), n.const("bi", np.zeros(8, np.float32))
    ln = n.node("LayerNormalization", [x, scale, bias], 3, axis=-1)
    check(n, [g, *ln.outputs])


def test_rms_norm_and_rotary_opset23() -> None:
    n = Net(opset=23)
    x = n.input("x", F, ("b", 4, "s", 8))
    rms = n.op("RMSNormalization", x, n.const("w", np.ones(8, np.float32)), axis=-1)
    cos = n.const("cos", np.random.default_rng(0).random((16, 4)).astype(np.float32))
    sin = n.const("sin", np.random.default_rng(1).random((16, 4)).astype(np.float32))
    pos = n.input("pos", I64, ("b", "s"))
    rot = n.op("RotaryEmbedding", x, cos, sin, pos)
    check(n, [rms, rot])


def test_attention_opset23_with_past() -> None:
    n = Net(opset=23)
    q = n.input("q", F, ("b", 4, "s", 8))
    k = n.input("k", F, ("b", 2, "s", 8))
    v = n.input("v", F, ("b", 2, "s", 6))
    pk = n.input("pk", F, ("b", 2, "p", 8))
    pv = n.input("pv", F, ("b", 2, "p", 6))
    node = n.node("Attention", [q, k, v, None, pk, pv], 4, qk_matmul_output_mode=0)
    ctx = check(n, list(node.outputs))
    assert ctx.shape_of(node.outputs[1]) == (parse_dim("b"), 2, parse_dim("p + s"), 8)


def test_attention_opset23_3d() -> None:
    n = Net(opset=23)
    q = n.input("q", F, ("b", "s", 32))
    k = n.input("k", F, ("b", "p", 16))
    v = n.input("v", F, ("b", "p", 24))
    y = n.op("Attention", q, k, v, q_num_heads=4, kv_num_heads=2)
    check(n, [y], envs=[e for e in ENVS if e["p"] > 0])


# ----------------------------------------------------------------------------- com.microsoft (onnxruntime)


def test_group_query_attention_past_plus_seq() -> None:
    n = Net(opset=21, domains={MS: 1})
    q = n.input("q", F, ("b", "s", 128))
    k = n.input("k", F, ("b", "s", 64))
    v = n.input("v", F, ("b", "s", 64))
    pk = n.input("pk", F, ("b", 2, "p", 32))
    pv = n.input("pv", F, ("b", 2, "p", 32))
    seqlens = n.input("seqlens", I32, ("b",))
    total = n.input("total", I32, ())
    node = n.node("GroupQueryAttention", [q, k, v, pk, pv, seqlens, total], 3, domain=MS,
                  num_heads=4, kv_num_heads=2)
    data = {"seqlens": lambda env, rng: np.full((env["b"],), env["p"] + env["s"] - 1, np.int32),
            "total": lambda env, rng: np.array(env["p"] + env["s"], np.int32)}
    # onnxruntime takes a batch above 1 only for single-token steps with a past
    envs = [{"b": 1, "s": 3, "p": 5}, {"b": 1, "s": 4, "p": 0}, {"b": 3, "s": 1, "p": 7}]
    ctx = check(n, list(node.outputs), runtime="ort", data=data, envs=envs)
    assert ctx.shape_of(node.outputs[1]) == (parse_dim("b"), 2, parse_dim("p + s"), 32)


def test_group_query_attention_packed_qkv_with_rotary() -> None:
    n = Net(opset=21, domains={MS: 1})
    qkv = n.input("qkv", F, ("b", "s", 256))
    pk = n.input("pk", F, ("b", 2, "p", 32))
    pv = n.input("pv", F, ("b", 2, "p", 32))
    seqlens = n.input("seqlens", I32, ("b",))
    total = n.input("total", I32, ())
    rng = np.random.default_rng(0)
    cos = n.const("cos", rng.random((64, 16)).astype(np.float32))
    sin = n.const("sin", rng.random((64, 16)).astype(np.float32))
    node = n.node("GroupQueryAttention", [qkv, None, None, pk, pv, seqlens, total, cos, sin], 3, domain=MS,
                  num_heads=4, kv_num_heads=2, do_rotary=1)
    data = {"seqlens": lambda env, rng: np.full((env["b"],), env["p"] + env["s"] - 1, np.int32),
            "total": lambda env, rng: np.array(env["p"] + env["s"], np.int32)}
    envs = [{"b": 1, "s": 3, "p": 5}, {"b": 1, "s": 4, "p": 0}, {"b": 3, "s": 1, "p": 7}]
    ctx = check(n, list(node.outputs), runtime="ort", data=data, envs=envs)
    assert ctx.shape_of(node.outputs[0]) == (parse_dim("b"), parse_dim("s"), 128)


def test_group_query_attention_shared_buffer_is_capacity_sized() -> None:
    n = Net(opset=21, domains={MS: 1})
    q = n.input("q", F, ("b", "s", 128))
    k = n.input("k", F, ("b", "s", 64))
    v = n.input("v", F, ("b", "s", 64))
    pk = n.input("pk", F, ("b", 2, 16, 32))
    pv = n.input("pv", F, ("b", 2, 16, 32))
    seqlens = n.input("seqlens", I32, ("b",))
    total = n.input("total", I32, ())
    node = n.node("GroupQueryAttention", [q, k, v, pk, pv, seqlens, total], 3, domain=MS,
                  output_alias=[Alias(1, 3), Alias(2, 4)], num_heads=4, kv_num_heads=2)
    ctx = ShapesContext(n.model()).infer_graph()
    assert ctx.shape_of(node.outputs[1]) == (parse_dim("b"), 2, 16, 32)
    assert ctx.alias_root(node.outputs[2]) is pv
    # onnxruntime with a capacity-sized past: present keeps the capacity.
    data = {"seqlens": lambda env, rng: np.full((env["b"],), env["p"] + env["s"] - 1, np.int32),
            "total": lambda env, rng: np.array(env["p"] + env["s"], np.int32)}
    check(n, list(node.outputs), runtime="ort", data=data, ctx=ctx, envs=[{"b": 1, "s": 3, "p": 5}])


def test_skip_layer_norms_and_simplified_layer_norm() -> None:
    n = Net(opset=21, domains={MS: 1})
    x = n.input("x", F, ("b", "s", 16))
    skip = n.input("skip", F, ("b", "s", 16))
    gamma = n.const("gamma", np.ones(16, np.float32))
    beta = n.const("beta", np.zeros(16, np.float32))
    ssln = n.node("SkipSimplifiedLayerNormalization", [x, skip, gamma], 4, domain=MS, epsilon=1e-5)
    sln = n.node("SkipLayerNormalization", [x, skip, gamma, beta], 4, domain=MS, epsilon=1e-5)
    simplified = n.node("SimplifiedLayerNormalization", [x, gamma], 2, axis=-1, epsilon=1e-5)
    check(n, [*ssln.outputs, *sln.outputs, *simplified.outputs], runtime="ort")


def test_matmul_nbits_and_ms_rotary() -> None:
    n = Net(opset=21, domains={MS: 1})
    a = n.input("a", F, ("b", "s", 32))
    rng = np.random.default_rng(0)
    w = n.const("w", rng.integers(0, 255, (8, 2, 8)).astype(np.uint8))
    scales = n.const("scales", rng.random((8, 2)).astype(np.float32))
    y = n.op("MatMulNBits", a, w, scales, domain=MS, K=32, N=8, bits=4, block_size=16)
    x = n.input("x", F, ("b", "s", 32))
    pos = n.input("pos", I64, ("b", "s"))
    cos = n.const("cos", rng.random((16, 4)).astype(np.float32))
    sin = n.const("sin", rng.random((16, 4)).astype(np.float32))
    rot = n.op("RotaryEmbedding", x, pos, cos, sin, domain=MS, num_heads=4)
    check(n, [y, rot], runtime="ort")


# ----------------------------------------------------------------------------- control flow


def _branch(name: str, build: Callable[[Net], Value]) -> Graph:
    sub = Net(graph=Graph(name))
    sub.g.outputs.append(build(sub))
    return sub.g


def test_if_merges_branch_types() -> None:
    n = Net()
    x = n.input("x", F, ("b", 4))
    cond = n.input("cond", BOOL, ())
    same = n.node("If", [cond], 1,
                  then_branch=_branch("t", lambda s: s.op("Add", x, x)),
                  else_branch=_branch("e", lambda s: s.op("Neg", x))).outputs[0]
    diff = n.node("If", [cond], 1,
                  then_branch=_branch("t2", lambda s: s.op("Concat", x, x, axis=0)),
                  else_branch=_branch("e2", lambda s: s.op("Identity", x))).outputs[0]
    ctx = ShapesContext(n.model()).infer_graph()
    assert ctx.shape_of(same) == (parse_dim("b"), 4)
    assert ctx.shape_of(diff) == (None, 4)
    for flag in (True, False):
        check(n, [same, diff], ctx=ctx, allow_unknown=True,
              data={"cond": lambda env, rng, f=flag: np.array(f)})


def test_if_with_known_condition_takes_the_branch() -> None:
    n = Net()
    x = n.input("x", F, ("b", 4))
    cond = n.const("cond", np.array(True))
    out = n.node("If", [cond], 1,
                 then_branch=_branch("t", lambda s: s.op("Concat", x, x, axis=0)),
                 else_branch=_branch("e", lambda s: s.op("Identity", x))).outputs[0]
    ctx = check(n, [out])
    assert ctx.shape_of(out) == (parse_dim("2*b"), 4)


def test_loop_carried_and_scan_outputs() -> None:
    n = Net()
    x = n.input("x", F, ("b", 4))
    body = Graph("body")
    it = body.add_input(Value("it", TensorType(I64, ())))
    c_in = body.add_input(Value("c_in", TensorType(BOOL, ())))
    acc = body.add_input(Value("acc", None))
    grow = body.add_input(Value("grow", None))
    sub = Net(graph=body)
    c_out = sub.op("Identity", c_in)
    acc2 = sub.op("Add", acc, x)
    grow2 = sub.op("Concat", grow, x, axis=0)
    scan = sub.op("Mul", acc, acc)
    body.outputs.extend([c_out, acc2, grow2, scan])
    del it
    trip = n.const("M", np.array(3, np.int64))
    node = n.node("Loop", [trip, None, x, x], 3, body=body)
    # onnx.reference does not run a Loop without its condition input; onnxruntime does
    ctx = check(n, list(node.outputs), allow_unknown=True, runtime="ort")
    final, grown, scanned = node.outputs
    assert ctx.shape_of(final) == (parse_dim("b"), 4)
    assert ctx.shape_of(grown)[0] is None and ctx.shape_of(grown)[1] == 4
    assert ctx.shape_of(scanned) == (3, parse_dim("b"), 4)
    # the growing carried value got a fresh symbol inside the body, not the first iteration's size
    assert str(ctx.shape_of(grow)[0]).startswith("_")


def test_scan_state_and_outputs() -> None:
    n = Net()
    init = n.input("init", F, (4,))
    xs = n.input("xs", F, ("s", 4))
    body = Graph("body")
    st = body.add_input(Value("st", None))
    xi = body.add_input(Value("xi", None))
    sub = Net(graph=body)
    st2 = sub.op("Add", st, xi)
    body.outputs.extend([st2, sub.op("Identity", st2)])
    node = n.node("Scan", [init, xs], 2, body=body, num_scan_inputs=1)
    ctx = check(n, list(node.outputs))
    assert ctx.shape_of(node.outputs[1]) == (parse_dim("s"), 4)


# ----------------------------------------------------------------------------- functions, custom ops


def test_local_function_inferred_per_call_site() -> None:
    n = Net(domains={"local": 1})
    f = Function("local", "Twice")
    f.opset_imports = {"": 23}
    a = f.add_input(Value("a"))
    body = Net(graph=f)  # type: ignore[arg-type]
    f.outputs.append(body.op("Concat", a, a, axis=-1))
    n.functions.append(f)
    x = n.input("x", F, ("b", "s"))
    y = n.input("y", I64, (3,))
    fx = n.op("Twice", x, domain="local")
    fy = n.op("Twice", y, domain="local")
    fx2 = n.op("Twice", fx, domain="local")
    ctx = check(n, [fx, fy, fx2])
    assert ctx.shape_of(fx2) == (parse_dim("b"), parse_dim("4*s"))
    assert f.outputs[0].type is None  # the shared body is never written


def test_cache_update_rule_against_numpy_semantics() -> None:
    n = Net(domains={"ai.onnxforge": 1})
    cache = n.input("cache", F, ("b", 2, 16, 8))
    vals = n.input("vals", F, ("b", 2, "s", 8))
    pos = n.const("pos", np.array(5, np.int64))
    out = n.node("CacheUpdate", [cache, vals, pos], 1, domain="ai.onnxforge").outputs[0]
    ctx = ShapesContext(n.model()).infer_graph()
    assert ctx.type_of(out) == ctx.type_of(cache)
    for env in ENVS:
        c = np.zeros((env["b"], 2, 16, 8), np.float32)
        upd = np.ones((env["b"], 2, env["s"], 8), np.float32)
        c[:, :, 5:5 + env["s"]] = upd  # the operator's definition, written in place
        assert tuple(int(d) if isinstance(d, int) else d.evaluate(env) for d in ctx.shape_of(out)) == c.shape


def test_unknown_custom_op_leaves_outputs_unknown() -> None:
    n = Net(domains={"my.ops": 1})
    x = n.input("x", F, ("b", 4))
    node = n.node("Mystery", [x], 2, domain="my.ops")
    declared = node.outputs[1]
    declared.type = TensorType(F, ("b", None))
    after = n.op("Relu", node.outputs[0])
    ctx = ShapesContext(n.model()).infer_graph()
    assert ctx.type_of(node.outputs[0]) is None
    assert ctx.type_of(after) is None
    assert ctx.shape_of(declared) == (parse_dim("b"), None)
    assert ctx.unknown_ops == {("my.ops", "Mystery"): 1}
