"""ShapesContext core: merging, contradictions, alias equivalence, incremental inference,
encoded and struct values, and whole exported decoders checked against onnxruntime."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper

from onnxforge.errors import OnnxforgeError
from onnxforge.graphbuilder.ir.core import MUST_ALIAS, Alias, Function, Graph, Model, Node, Value
from onnxforge.graphbuilder.shapes.context import ShapesContext
from onnxforge.graphbuilder.shapes.symtensor import ShapeError, SymTensor
from onnxforge.graphbuilder.shapes.type_merge import TypeConflict, merge_types
from onnxforge.graphbuilder.shapes.symbolic import parse_dim
from onnxforge.graphbuilder.ir.tensors import EncodedTensor
from onnxforge.proto_ext.types import (
    AffineLayout,
    EncodedValue,
    OptionalType,
    SequenceType,
    StructField,
    StructType,
    TensorType,
)
from onnxforge.proto_ext.verify import check as check_rules
from tests.graphbuilder.shapes.test_infer_ops import Net, _branch, check

F = TP.FLOAT
FORGE = "ai.onnxforge"


def sym(text: str):
    return parse_dim(text)


# ----------------------------------------------------------------------------- merging


def test_set_type_refines_and_writes_the_ir() -> None:
    v = Value("v")
    g = Graph("g")
    g.add_input(v)
    ctx = ShapesContext(g)
    ctx.set_type(v, TensorType(F, None), "first")
    ctx.set_type(v, TensorType(0, ("batch", None)), "second")
    t = ctx.set_type(v, TensorType(F, (None, 4)), "third")
    assert t == TensorType(F, (sym("batch"), 4))
    assert v.type == t and ctx.type_of(v) == t
    assert ctx.shape_of(v) == (sym("batch"), 4)
    assert "first" in ctx.source_of(v) and "third" in ctx.source_of(v)


def test_contradiction_names_both_constraints() -> None:
    g = Graph("g")
    v = g.add_input(Value("cache", TensorType(F, ("b", 16, 8))))
    ctx = ShapesContext(g)
    with pytest.raises(ShapeError) as info:
        ctx.set_type(v, TensorType(F, ("b", 17, 8)), "node 'writer' (Concat)")
    msg = str(info.value)
    assert "'cache'" in msg and "FLOAT[b, 16, 8]" in msg and "declared type" in msg
    assert "FLOAT[b, 17, 8]" in msg and "node 'writer' (Concat)" in msg and "dimension 1" in msg
    assert isinstance(info.value, OnnxforgeError)
    assert ctx.type_of(v) == TensorType(F, (sym("b"), 16, 8))  # knowledge unchanged


@pytest.mark.parametrize("old,new,reason", [
    (TensorType(F, (2,)), TensorType(TP.INT64, (2,)), "element type FLOAT != INT64"),
    (TensorType(F, (2,)), TensorType(F, (2, 1)), "rank 1 != 2"),
    (TensorType(F, ("n",)), TensorType(F, ("n + 1",)), "dimension 0: n != n + 1"),
    (SequenceType(TensorType(F, None)), TensorType(F, None), "SequenceType vs TensorType"),
    (StructType(kind="type_ref", type_ref=1), StructType(kind="type_ref", type_ref=2), "type_ref 1 != 2"),
])
def test_merge_types_rejects(old, new, reason: str) -> None:
    with pytest.raises(TypeConflict, match=reason.replace("+", r"\+")):
        merge_types(old, new)


def test_merge_types_refines() -> None:
    unknown: list = []
    got = merge_types(TensorType(F, (sym("a"), None, sym("t"))), TensorType(0, (sym("a"), 3, sym("p + s"))), unknown)
    assert got == TensorType(F, (sym("a"), 3, sym("t")))
    assert unknown == [(sym("t"), sym("p + s"))]
    assert merge_types(TensorType(F, (sym("n"),)), TensorType(F, (5,))) == TensorType(F, (5,))
    assert merge_types(OptionalType(TensorType(F, None)), OptionalType(TensorType(F, (1,)))) == \
        OptionalType(TensorType(F, (1,)))
    assert merge_types(StructType(), StructType(kind="type_ref", type_ref=3)) == StructType(kind="type_ref", type_ref=3)


def test_undecidable_dimensions_are_recorded() -> None:
    g = Graph("g")
    v = g.add_input(Value("x", TensorType(F, ("total",))))
    ctx = ShapesContext(g)
    ctx.set_type(v, TensorType(F, ("past + seq",)), "computed")
    assert ctx.shape_of(v) == (sym("total"),)
    assert ctx.equalities == [(sym("total"), sym("past + seq"), "x")]


def test_declared_type_contradicting_an_initializer() -> None:
    n = Net()
    c = n.const("c", np.zeros((2, 3), np.float32))
    c.type = TensorType(F, (2, 4))
    with pytest.raises(ShapeError, match="declared type FLOAT\\[2, 4\\].*initializer FLOAT\\[2, 3\\]"):
        ShapesContext(n.g).type_of(c)


# ----------------------------------------------------------------------------- symbolic results


def test_concat_keeps_past_plus_seq_where_onnx_shape_inference_loses_it() -> None:
    n = Net()
    past = n.input("past", F, ("b", 2, "p", 8))
    new = n.input("new", F, ("b", 2, "s", 8))
    present = n.op("Concat", past, new, axis=-2)
    ctx = check(n, [present])
    assert ctx.shape_of(present) == (sym("b"), 2, sym("p + s"), 8)
    proto = helper.make_model(helper.make_graph(
        [helper.make_node("Concat", ["past", "new"], ["present"], axis=-2)], "g",
        [helper.make_tensor_value_info("past", F, ["b", 2, "p", 8]),
         helper.make_tensor_value_info("new", F, ["b", 2, "s", 8])],
        [helper.make_tensor_value_info("present", F, None)]), opset_imports=[helper.make_opsetid("", 23)])
    dim = onnx.shape_inference.infer_shapes(proto, data_prop=True).graph.output[0].type.tensor_type.shape.dim[2]
    assert dim.dim_param != "p + s"


def test_shape_values_stay_symbolic() -> None:
    n = Net()
    x = n.input("x", F, ("b", "s", 4))
    half = n.op("Div", n.op("Shape", x), n.const("two", np.array([1, 1, 2], np.int64)))
    ctx = ShapesContext(n.g).infer_graph()
    value = ctx.value_of(half)
    assert isinstance(value, SymTensor) and value.flat() == [sym("b"), sym("s"), 2]
    assert not value.is_concrete()
    eq = n.op("Equal", n.op("Shape", x), n.op("Shape", x))
    ctx.infer_graph()
    assert ctx.value_of(eq).flat() == [True, True, True]


# ----------------------------------------------------------------------------- incremental, ordering


def _chain() -> tuple[Net, list[Node]]:
    n = Net()
    x = n.input("x", F, ("b", "s", 8))
    r = n.op("Reshape", x, n.const("t", np.array([0, 0, 2, 4], np.int64)))
    t = n.op("Transpose", r, perm=[0, 2, 1, 3])
    m = n.op("MatMul", t, n.const("w", np.ones((4, 3), np.float32)))
    return n, [v.producer() for v in (r, t, m)]


def test_incremental_inference_matches_whole_graph() -> None:
    n, nodes = _chain()
    ctx = ShapesContext(n.model())
    seen = [ctx.infer_node(node)[0] for node in nodes]
    n2, nodes2 = _chain()
    whole = ShapesContext(n2.model()).infer_graph()
    assert seen == [whole.type_of(node.outputs[0]) for node in nodes2]
    assert seen[-1] == TensorType(F, (sym("b"), 2, sym("s"), 3))


def test_unsorted_graph_is_inferred_in_dependency_order() -> None:
    n, nodes = _chain()
    n.g.reorder(list(reversed(nodes)))
    ctx = ShapesContext(n.g).infer_graph()
    assert ctx.shape_of(nodes[-1].outputs[0]) == (sym("b"), 2, sym("s"), 3)


def test_trust_declared_false_recomputes_everything() -> None:
    n, nodes = _chain()
    nodes[0].outputs[0].type = TensorType(F, ("wrong", 1))
    with pytest.raises(ShapeError, match="rank 2 != 4"):
        ShapesContext(n.g).infer_graph()
    n, nodes = _chain()
    nodes[0].outputs[0].type = TensorType(F, ("wrong", 1))
    ctx = ShapesContext(n.g, trust_declared=False).infer_graph()
    assert nodes[0].outputs[0].type == TensorType(F, (sym("b"), sym("s"), 2, 4))
    assert ctx.conflicts == []


def test_non_strict_replaces_a_wrong_declared_type() -> None:
    n = Net()
    c = n.op("Constant", value_ints=[1])
    c.type = TensorType(TP.INT64, ())  # a value_info some exporters write for [1]-shaped constants
    ctx = ShapesContext(n.g, strict=False).infer_graph()
    assert ctx.shape_of(c) == (1,)
    assert len(ctx.conflicts) == 1 and "rank 0 != 1" in ctx.conflicts[0]


# ----------------------------------------------------------------------------- aliases


def _cache_graph(cache_shape, values_shape, position, out_type=None) -> tuple[Net, Value, Value, Node]:
    n = Net(domains={FORGE: 1})
    cache = n.input("cache", F, cache_shape)
    vals = n.input("vals", F, values_shape)
    pos = n.const("pos", np.array(position, np.int64))
    node = n.node("CacheUpdate", [cache, vals, pos], 1, domain=FORGE, output_alias=[Alias(0, 0, MUST_ALIAS)])
    out = node.outputs[0]
    out.type = out_type
    n.g.outputs.append(out)
    return n, cache, out, node


def test_alias_makes_knowledge_visible_through_both_names() -> None:
    n, cache, out, _ = _cache_graph(("b", 2, None, 8), ("b", 2, "s", 8), 0, TensorType(F, (None, 2, 64, 8)))
    ctx = ShapesContext(n.model()).infer_graph()
    assert ctx.shape_of(cache) == (sym("b"), 2, 64, 8)  # capacity learned from the output
    assert ctx.type_of(out) == ctx.type_of(cache) == cache.type == out.type
    assert ctx.alias_root(out) is cache and set(map(id, ctx.alias_class(cache))) == {id(cache), id(out)}
    later = TensorType(F, (3, 2, 64, 8))
    ctx.set_type(out, later, "caller")
    assert ctx.type_of(cache) == later


def test_incompatible_alias_is_rejected() -> None:
    n, *_ = _cache_graph(("b", 2, 16, 8), ("b", 2, "s", 8), 0, TensorType(TP.FLOAT16, None))
    with pytest.raises(ShapeError, match="FLOAT16"):
        ShapesContext(n.model()).infer_graph()
    n, *_ = _cache_graph(("b", 2, 16, 8), ("b", 2, "s", 8), 0, TensorType(F, ("b", 2, 32, 8)))
    with pytest.raises(ShapeError, match="dimension 2: 32 != 16"):
        ShapesContext(n.model()).infer_graph()


def test_value_level_alias_of_must_match_the_port() -> None:
    n, cache, out, node = _cache_graph(("b", 2, 16, 8), ("b", 2, "s", 8), 0)
    out.alias_of = node.inputs[1]
    with pytest.raises(ShapeError, match="alias_of 'vals' but output_alias names input 'cache'"):
        ShapesContext(n.model()).infer_graph()


def test_alias_of_by_name_and_cycles() -> None:
    n = Net()
    x = n.input("x", F, ("b", 4))
    y = n.op("Relu", x)
    y.alias_of = "x"
    ctx = ShapesContext(n.g).infer_graph()
    assert ctx.alias_root(y) is x
    n = Net()
    x = n.input("x", F, ("b", 4))
    a = n.op("Relu", x)
    b = n.op("Relu", a)
    a.alias_of, b.alias_of = b, a
    n.g.outputs.extend([a, b])
    ctx = ShapesContext(n.g).infer_graph()  # a cycle has no root; the verifier names it
    assert ctx.alias_root(a) is a and "L5" in {v.rule for v in check_rules(n.model())}


def test_cache_update_capacity_checks() -> None:
    with pytest.raises(ShapeError, match="position 14 \\+ 3 new entries exceeds the capacity 16"):
        ShapesContext(_cache_graph(("b", 2, 16, 8), ("b", 2, 3, 8), 14)[0].model()).infer_graph()
    with pytest.raises(ShapeError, match="exceeds the capacity cap"):
        ShapesContext(_cache_graph(("b", 2, "cap", 8), ("b", 2, "cap", 8), 1)[0].model()).infer_graph()
    ok = ShapesContext(_cache_graph(("b", 2, "cap", 8), ("b", 2, "s", 8), 5)[0].model()).infer_graph()
    assert ok.shape_of(ok.graph.outputs[0]) == (sym("b"), 2, sym("cap"), 8)
    with pytest.raises(ShapeError, match="dimension 3 of values and cache: 8 != 4"):
        ShapesContext(_cache_graph(("b", 2, 16, 8), ("b", 2, 3, 4), 0)[0].model()).infer_graph()


def test_cache_update_without_port_annotation_still_aliases() -> None:
    n = Net(domains={FORGE: 1})
    cache = n.input("cache", F, ("b", 16, 8))
    out = n.op("CacheUpdate", cache, n.input("v", F, ("b", 1, 8)), n.input("p", TP.INT64, ()), domain=FORGE)
    ctx = ShapesContext(n.g).infer_graph()
    assert set(map(id, ctx.alias_class(cache))) == {id(cache), id(out)}  # one type for both
    # storage needs the port annotation: without it there is no alias root, and L12 says so
    assert ctx.alias_root(out) is out
    n.g.outputs.append(out)
    assert "L12" in {v.rule for v in check_rules(n.model())}


def _update(net: Net, cache: Value, values: Value, position: Value) -> Value:
    """``CacheUpdate(cache, values, position)`` with its MUST_ALIAS port."""
    return net.node("CacheUpdate", [cache, values, position], 1, domain=FORGE,
                    output_alias=[Alias(0, 0, MUST_ALIAS)]).outputs[0]


def test_if_branches_must_agree_on_the_alias_root() -> None:
    def graph(second_cache: bool) -> tuple[Net, Value, Value]:
        n = Net(domains={FORGE: 1})
        c1 = n.input("c1", F, (1, 16, 8))
        c2 = n.input("c2", F, (1, 16, 8)) if second_cache else c1
        v = n.input("v", F, (1, 1, 8))
        p = n.const("p", np.array(0, np.int64))
        cond = n.input("cond", TP.BOOL, ())
        out = n.node("If", [cond], 1,
                     then_branch=_branch("t", lambda s: _update(s, c1, v, p)),
                     else_branch=_branch("e", lambda s: _update(s, c2, v, p))).outputs[0]
        return n, c1, out

    n, c1, out = graph(False)
    ctx = ShapesContext(n.g).infer_graph()
    assert ctx.alias_root(out) is c1 and ctx.shape_of(out) == (1, 16, 8)
    n, _, _ = graph(True)
    with pytest.raises(ShapeError, match="aliases 'c1' in then_branch but 'c2' in else_branch"):
        ShapesContext(n.g).infer_graph()


def test_function_output_alias_propagates_to_the_call_site() -> None:
    n = Net(domains={FORGE: 1, "local": 1})
    f = Function("local", "Append")
    f.opset_imports = {"": 23, FORGE: 1}
    fc, fv, fp = (f.add_input(Value(k)) for k in ("c", "v", "p"))
    body = Net(graph=f)  # type: ignore[arg-type]
    f.outputs.append(_update(body, fc, fv, fp))
    n.functions.append(f)
    cache = n.input("cache", F, (2, 32, 8))
    out = n.op("Append", cache, n.input("v", F, (2, "s", 8)), n.const("p", np.array(3, np.int64)), domain="local")
    ctx = ShapesContext(n.model()).infer_graph()
    assert ctx.alias_root(out) is cache and ctx.shape_of(out) == (2, 32, 8)


def test_recursive_local_function_is_rejected() -> None:
    n = Net(domains={"local": 1})
    f = Function("local", "Loopy")
    f.opset_imports = {"": 23, "local": 1}
    a = f.add_input(Value("a"))
    body = Net(graph=f)  # type: ignore[arg-type]
    f.outputs.append(body.op("Loopy", a, domain="local"))
    n.functions.append(f)
    n.op("Loopy", n.input("x", F, (2,)), domain="local")
    with pytest.raises(ShapeError, match="local::Loopy calls itself"):
        ShapesContext(n.model()).infer_graph()


def test_graph_builder_infers_as_nodes_are_added() -> None:
    from onnxforge.graphbuilder.builder.graph_builder import GraphBuilder

    g = GraphBuilder(opset=23)
    x = g.input("x", np.float32, ["batch", "seq", 128])
    shape = g.op.Shape(x)
    target = g.op.Concat(g.op.Slice(shape, g.initializer("s0", np.array([0], np.int64)),
                                    g.initializer("s2", np.array([2], np.int64))),
                         g.initializer("heads", np.array([4, 32], np.int64)), axis=0)
    y = g.op.Reshape(x, target)
    assert y.type == TensorType(F, (sym("batch"), sym("seq"), 4, 32))
    assert g.shapes.value_of(target).flat() == [sym("batch"), sym("seq"), 4, 32]


# ----------------------------------------------------------------------------- encoded and struct values


def test_encoded_initializer_logical_type_is_what_consumers_see() -> None:
    n = Net()
    header = EncodedValue(name="w", affine=AffineLayout(storage_type=TP.INT4, block_size=4),
                          logical_type=TensorType(F, (8, 6)), raw_data=b"\x00" * 24, has_logical_type=True)
    w = n.g.add_initializer(Value("w"), EncodedTensor(header))
    x = n.input("x", F, ("b", 8))
    y = n.op("MatMul", x, w)
    ctx = ShapesContext(n.g).infer_graph()
    assert ctx.type_of(w) == TensorType(F, (8, 6))
    assert ctx.shape_of(y) == (sym("b"), 6)
    assert ctx.layout_of(w) == AffineLayout(storage_type=TP.INT4, block_size=4)
    assert ctx.value_of(w) is None


def test_struct_fields_resolve_through_the_catalogue() -> None:
    decl = StructType(kind="structure", type_id=7, name="q4", fields=(
        StructField("codes", TensorType(TP.UINT8, (16,)), has_type=True),
        StructField("scale", TensorType(F, ()), has_type=True)))
    g = Graph("g")
    v = g.add_input(Value("blk", StructType(kind="type_ref", type_ref=7)))
    ctx = ShapesContext(Model(g, struct_types=[decl]))
    assert ctx.struct_fields(v) == {"codes": TensorType(TP.UINT8, (16,)), "scale": TensorType(F, ())}
    seq = n_seq = Net()
    s = n_seq.op("SequenceConstruct", n_seq.input("a", F, ("n", 4)), n_seq.input("c", F, ("n", 4)))
    at = n_seq.op("SequenceAt", s, n_seq.const("i", np.array(1, np.int64)))
    ctx2 = ShapesContext(seq.g).infer_graph()
    assert ctx2.type_of(s) == SequenceType(TensorType(F, (sym("n"), 4)))
    check(n_seq, [at], envs=[{"n": 2}, {"n": 5}])


# ----------------------------------------------------------------------------- exported decoders


def _cases(variant: str) -> list[dict[str, int]]:
    if variant.startswith("genai"):  # GroupQueryAttention: batch 1 unless one token per step
        return [{"batch": 1, "seq": 3, "past": 4}, {"batch": 2, "seq": 1, "past": 5}]
    return [{"batch": 2, "seq": 3, "past": 4}, {"batch": 1, "seq": 2, "past": 0}]


@pytest.mark.parametrize("variant", ["torch20", "torch23", "genai_fp32", "genai_int4"])
def test_exported_decoders_are_fully_inferred(decoder_models, variant: str) -> None:
    from onnxforge.graphbuilder.serde import load
    from tests.conftest import load_io_info, random_decoder_feeds

    path = decoder_models[variant]
    model = load(path)
    ctx = ShapesContext(model, trust_declared=False).infer_graph()
    assert ctx.unknown_ops == {} and ctx.conflicts == []
    values = {o.name: o for node in model.graph for o in node.outputs if o.name}
    for name, v in values.items():
        shape = ctx.shape_of(v)
        assert shape is not None and all(d is not None for d in shape), (name, ctx.type_of(v))
    info = load_io_info(path)
    batch = info["inputs"][0]["shape"][0]
    seq_len = sym("sequence_length")
    total = sym("past_sequence_length + sequence_length")
    logits = next(o for o in model.graph.outputs if o.name == "logits")
    assert ctx.shape_of(logits) == (sym(batch), seq_len, info["vocab_size"])
    presents = [o for o in model.graph.outputs if o.name.startswith("present.")]
    assert len(presents) == 2 * info["num_layers"]
    for p in presents:
        assert ctx.shape_of(p) == (sym(batch), info["num_kv_heads"], total, info["head_dim"]), p.name

    # every intermediate value's inferred shape against an onnxruntime run
    proto = onnx.load(str(path))
    names = [n for n in values if n not in {o.name for o in proto.graph.output}]
    for name in names:
        proto.graph.output.append(helper.make_empty_tensor_value_info(name))
    del proto.graph.value_info[:]
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])
    out_names = [o.name for o in sess.get_outputs()]
    for case in _cases(variant):
        feeds = random_decoder_feeds(path, info, batch=case["batch"], seq=case["seq"], past=case["past"])
        env = {batch: case["batch"], "sequence_length": case["seq"], "past_sequence_length": case["past"],
               "total_sequence_length": case["past"] + case["seq"]}
        results = dict(zip(out_names, sess.run(None, feeds)))
        for name, arr in results.items():
            v = values.get(name) or next(o for o in model.graph.outputs if o.name == name)
            got = tuple(d if isinstance(d, int) else d.evaluate(env) for d in ctx.shape_of(v))
            assert got == np.asarray(arr).shape, (name, ctx.type_of(v), np.asarray(arr).shape, case)


@pytest.mark.parametrize("array", [
    np.arange(6, dtype=np.int64).reshape(2, 3),
    np.array(7, dtype=np.int32),
    np.array([True, False]),
    np.array([1.5, -0.0, np.inf], dtype=np.float16),
    np.zeros((0, 2), dtype=np.uint8),
])
def test_a_content_made_from_numbers_reads_the_same_with_or_without_its_object_array(array):
    from onnxforge.proto_ext.dtypes import onnx_dtype

    st = SymTensor.of(onnx_dtype(array.dtype), array)
    # read first from the numbers, then from the object array built on demand
    assert st.shape == array.shape and st.size == array.size and st.is_concrete()
    flat = st.flat()
    plain = array.reshape(-1).tolist()
    assert flat == plain and [type(x) for x in flat] == [type(x) for x in plain]
    np.testing.assert_array_equal(st.to_numpy(), array)
    assert st.to_numpy().dtype == array.dtype and st.to_numpy() is not array
    ints = st.integers()  # None for bools and floats (unless there are no elements)
    assert ints == (flat if array.dtype.kind in "iu" or not array.size else None) or array.ndim > 1
    data = st.data
    assert data.dtype == object and data.shape == array.shape
    assert data.reshape(-1).tolist() == flat and st.data is data  # built once
    assert st.flat() == flat and st.shape == array.shape
    assert SymTensor(st.elem_type, data).integers() == ints  # what the object array gives


def test_a_content_made_from_a_writable_array_does_not_follow_later_writes():
    a = np.array([1, 2, 3], dtype=np.int64)
    st = SymTensor.of(TP.INT64, a)
    a[0] = 99
    assert st.flat() == [1, 2, 3] and st.data.tolist() == [1, 2, 3]
    with pytest.raises(AttributeError, match="no attribute 'elements'"):
        st.elements  # noqa: B018  (only ``data`` is built on demand)
