"""GraphBuilder: validated authoring, names, custom domains, aliases, bindings, struct
types, encoded initializers, subgraphs, local functions and editing loaded models.

Every built model is checked with ``of.check``; models made of standard operators
also pass ``onnx.checker`` (full check) and run in onnxruntime, whose outputs are
compared with numpy. Encoded values are compared with ``onnx.reference``'s
DequantizeLinear and with numpy decodings of independently packed bytes.
"""
from __future__ import annotations

import os
import struct
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import onnxforge as of
from onnxforge.graphbuilder import serde
from onnxforge.graphbuilder.builder.graph_builder import (
    READ_WRITE,
    BuildError,
    GraphBuilder,
    struct_ref,
    tensor_type,
)
from onnxforge.graphbuilder.ir.core import MUST_ALIAS, Alias, AttrType, Model
from onnxforge.graphbuilder.builder.opschemas import SchemaCheckError
from onnxforge.proto_ext.types import ArrayKind, StructType, TensorType
from onnxforge.graphbuilder.ir.storage import Storage

FLOAT, INT64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
INT4, INT8, UINT8, UINT4, INT2 = (TensorProto.INT4, TensorProto.INT8, TensorProto.UINT8,
                                  TensorProto.UINT4, TensorProto.INT2)


def _session(proto: onnx.ModelProto) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "0")
    return ort.InferenceSession(proto.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def _check_and_run(model: Model, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """of.check, onnx.checker (full) and onnxruntime for a standard-operator model."""
    assert of.check(model) == []
    proto = serde.to_onnx(model)
    onnx.checker.check_model(proto, full_check=True)
    sess = _session(proto)
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, feeds)))


def _all_names(model: Model) -> list[str]:
    """Every value and node name of the model's graphs (inputs, weights, node outputs)."""
    names: list[str] = []
    for g in model.all_graphs():
        names.extend(v.name for v in g.inputs)
        names.extend(v.name for v in g.all_initializers() if v not in g.inputs)
        for n in g:
            names.extend(o.name for o in n.outputs if o.name)
            names.append(n.name)
    return names


def _pack_nibbles(codes: list[int]) -> bytes:
    """Signed or unsigned 4-bit codes, two per byte, low nibble first (zero padding)."""
    if len(codes) % 2:
        codes = [*codes, 0]
    return bytes((lo & 0xF) | ((hi & 0xF) << 4) for lo, hi in zip(codes[0::2], codes[1::2]))


# -- validation at the call -------------------------------------------------------------


@pytest.mark.parametrize("make, message", [
    (lambda g, x: g.op.Frobnicate(x, _name="bad"), r"node\('bad'\).*unknown operator Frobnicate"),
    (lambda g, x: g.op.Relu(x, x, _name="bad"), r"node\('bad'\).*takes 1\.\.1 inputs, got 2"),
    (lambda g, x: g.op.Relu(x, _outputs=2, _name="bad"), r"node\('bad'\).*1\.\.1 outputs, got 2"),
    (lambda g, x: g.op.Add(x, None, _name="bad"), r"node\('bad'\).*input 1 .* is required"),
    (lambda g, x: g.op.Softmax(x, axis=1.5, _name="bad"),
     r"node\('bad'\).*attribute 'axis' of Softmax must be INT, got FLOAT"),
    (lambda g, x: g.op.Softmax(x, axes=1, _name="bad"), r"node\('bad'\).*no attribute 'axes'"),
    (lambda g, x: g.op.Cast(x, _name="bad"), r"node\('bad'\).*requires attribute 'to'"),
    (lambda g, x: g.op["com.microsoft"].FusedMatMul(x, x, _name="bad"),
     r"node\('bad'\).*domain 'com.microsoft' .* not among the model's opset imports"),
])
def test_invalid_nodes_raise_at_the_call_and_change_nothing(make: Any, message: str) -> None:
    g = GraphBuilder(opset=23)
    x = g.input("x", FLOAT, [2, 3])
    before_opsets = dict(g.model.opset_imports)
    with pytest.raises(SchemaCheckError, match=message):
        make(g, x)
    assert len(g.graph) == 0 and x.uses() == []
    assert g.model.opset_imports == before_opsets


def test_failed_shape_inference_leaves_the_graph_unchanged() -> None:
    g = GraphBuilder(opset=23)
    x = g.input("x", FLOAT, [2, 3])
    with pytest.raises(of.OnnxforgeError, match="perm"):
        g.op.Transpose(x, perm=[0, 0])
    assert len(g.graph) == 0 and x.uses() == []
    g.output(g.op.Transpose(x, perm=[1, 0]), "y")
    xv = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(_check_and_run(g.to_model(), {"x": xv})["y"], xv.T)


def test_non_value_inputs_are_refused() -> None:
    g = GraphBuilder(opset=23)
    with pytest.raises(BuildError, match="not a Value"):
        g.op.Relu(np.ones(3, np.float32))


# -- attribute coercion -------------------------------------------------------------------


def test_attribute_coercion_int_for_float_and_scalar_for_list() -> None:
    g = GraphBuilder(opset=23)
    x = g.input("x", FLOAT, [4])
    leaky = g.op.LeakyRelu(x, alpha=2)  # int given for a FLOAT attribute
    a = leaky.producer().attributes["alpha"]
    assert a.type == AttrType.FLOAT and a.value == 2.0 and isinstance(a.value, float)
    t = g.op.Transpose(leaky, perm=0)  # scalar given for an INTS attribute
    p = t.producer().attributes["perm"]
    assert p.type == AttrType.INTS and p.value == [0]
    floats = g.op.Constant(value_floats=[1, 2, 3, 4])  # ints given for FLOATS
    f = floats.producer().attributes["value_floats"]
    assert f.type == AttrType.FLOATS and f.value == [1.0, 2.0, 3.0, 4.0]
    one = g.op.Constant(value_float=3)
    assert one.producer().attributes["value_float"].type == AttrType.FLOAT
    g.output(g.op.Add(g.op.Mul(t, one), floats), "y")
    s = g.input("s", TensorProto.STRING, [2])
    up = g.op.StringNormalizer(s, stopwords=[], case_change_action="UPPER", locale="C")  # [] as STRINGS
    assert up.producer().attributes["stopwords"].type == AttrType.STRINGS
    g.output(up, "up", type=tensor_type(TensorProto.STRING, [2]))
    xv = np.array([-2.0, -0.5, 1.0, 3.0], np.float32)
    out = _check_and_run(g.to_model(), {"x": xv, "s": np.array(["ab", "Cd"], dtype=object)})
    np.testing.assert_allclose(out["y"], np.where(xv > 0, xv, 2 * xv) * 3 + [1, 2, 3, 4])
    assert list(out["up"]) == ["AB", "CD"]


# -- names ------------------------------------------------------------------------------------


def test_unique_names_without_collisions_across_subgraphs() -> None:
    g = GraphBuilder(opset=23)
    x = g.input("x", FLOAT, [3])
    c = g.input("c", BOOL, [])
    r1, r2 = g.op.Relu(x), g.op.Relu(x)
    assert (r1.producer().name, r2.producer().name) == ("Relu", "Relu_1")
    assert r1.name != r2.name
    then_b, else_b = g.subgraph("then"), g.subgraph("else")
    then_b.output(then_b.op.Add(then_b.op.Relu(x), r1), "t")
    else_b.output(else_b.op.Add(else_b.op.Relu(x), r2), "e")
    with pytest.raises(BuildError, match="already used"):
        then_b.input("x", FLOAT, [3])  # would shadow the outer x (rule N3)
    y = g.op.If(c, then_branch=then_b, else_branch=else_b)
    g.output(g.op.Add(y, g.op.Relu(x)), "y")
    with pytest.raises(BuildError, match="already used"):
        g.input("x", FLOAT, [3])
    with pytest.raises(BuildError, match="already used"):
        g.initializer("y", np.zeros(3, np.float32))
    m = g.to_model()
    names = _all_names(m)
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    xv = np.array([-1.0, 2.0, -3.0], np.float32)
    relu = np.maximum(xv, 0)
    assert np.allclose(_check_and_run(m, {"x": xv, "c": np.array(True)})["y"], 3 * relu)
    assert np.allclose(_check_and_run(m, {"x": xv, "c": np.array(False)})["y"], 3 * relu)


def test_output_renaming() -> None:
    g = GraphBuilder(opset=23)
    x = g.input("x", FLOAT, [3])
    r = g.op.Relu(x)
    old = r.name
    with pytest.raises(BuildError, match="already used"):
        g.output(r, "x")  # refused: the value keeps its name, and the name stays taken
    assert r.name == old and g.graph.outputs == []
    assert g.unique_name(old) != old
    a = g.output(r, "a")
    b = g.output(r, "b")  # a second output of one value: an Identity, "a" is unchanged
    assert a is r and a.name == "a" and b.name == "b" and b.producer().op_type == "Identity"
    passthrough = g.output(x, "x_copy")  # an input is never renamed
    assert x.name == "x" and passthrough.producer().op_type == "Identity"
    c = g.input("c", BOOL, [])
    then_b, else_b = g.subgraph("then"), g.subgraph("else")
    t = then_b.output(r, "t")  # an outer value is never renamed by a branch
    e = else_b.output(else_b.op.Neg(r), "e")
    assert r.name == "a" and t.name == "t" and t.graph is then_b.graph and e.name == "e"
    g.output(g.op.If(c, then_branch=then_b, else_branch=else_b), "y")
    m = g.to_model()
    names = _all_names(m)
    assert len(names) == len(set(names))
    xv = np.array([-1.0, 2.0, 3.0], np.float32)
    for cond, sign in ((True, 1.0), (False, -1.0)):
        out = _check_and_run(m, {"x": xv, "c": np.array(cond)})
        np.testing.assert_array_equal(out["a"], np.maximum(xv, 0))
        np.testing.assert_array_equal(out["b"], np.maximum(xv, 0))
        np.testing.assert_array_equal(out["x_copy"], xv)
        np.testing.assert_array_equal(out["y"], sign * np.maximum(xv, 0))


def test_constant_nodes_get_unique_names() -> None:
    g = GraphBuilder(opset=23)
    x = g.input("x", FLOAT, [2])
    c1 = g.constant(np.array([1.0, 2.0], np.float32))
    c2 = g.constant(np.array([10.0, 20.0], np.float32))
    assert c1.producer().op_type == "Constant" and c1.name != c2.name
    g.output(g.op.Add(g.op.Mul(x, c2), c1), "y")
    xv = np.array([3.0, 4.0], np.float32)
    np.testing.assert_array_equal(_check_and_run(g.to_model(), {"x": xv})["y"], xv * [10, 20] + [1, 2])


# -- the op facade and custom domains ------------------------------------------------------------


def test_op_facade_multiple_outputs_and_explicit_names() -> None:
    g = GraphBuilder(opset=23)
    x = g.input("x", FLOAT, [4, 2])
    top, idx = g.op.TopK(x, g.initializer("k", np.array([1], np.int64)), axis=0, _outputs=2)
    assert top.producer() is idx.producer() and (top.index, idx.index) == (0, 1)
    lo, hi = g.op.Split(x, num_outputs=2, axis=0, _outputs=["lo", "hi"], _name="split")
    assert (lo.name, hi.name, lo.producer().name) == ("lo", "hi", "split")
    g.output(top, "top")
    g.output(idx, "idx")
    g.output(g.op.Sub(hi, lo), "d")
    xv = np.array([[1.0, 8.0], [5.0, 2.0], [7.0, 3.0], [0.0, 4.0]], np.float32)
    out = _check_and_run(g.to_model(), {"x": xv})
    np.testing.assert_array_equal(out["top"], xv.max(axis=0, keepdims=True))
    np.testing.assert_array_equal(out["idx"], xv.argmax(axis=0)[None])
    np.testing.assert_array_equal(out["d"], xv[2:] - xv[:2])


def test_declared_custom_domain_is_unchecked() -> None:
    g = GraphBuilder(opset=23, domains={"com.microsoft": 1})
    a = g.input("a", FLOAT, [2, 3])
    b = g.input("b", FLOAT, [4, 3])
    y = g.op["com.microsoft"].FusedMatMul(a, b, alpha=2.0, transB=1)
    node = y.producer()
    assert node.domain == "com.microsoft" and node.op_type == "FusedMatMul"
    assert {k: v.value for k, v in node.attributes.items()} == {"alpha": 2.0, "transB": 1}
    other = GraphBuilder(opset=23, domains={"com.microsoft": 1})
    anything = other.op["com.microsoft"].AnythingGoes(other.input("a", FLOAT, [1]), whatever=[1, 2])
    assert anything.producer().attributes["whatever"].value == [1, 2]  # no schema: not checked
    g.output(y, "y", type=tensor_type(FLOAT, [2, 4]))
    m = g.to_model()
    assert of.check(m) == []
    av = np.arange(6, dtype=np.float32).reshape(2, 3)
    bv = np.arange(12, dtype=np.float32).reshape(4, 3) - 5
    (res,) = _session(serde.to_onnx(m)).run(["y"], {"a": av, "b": bv})
    np.testing.assert_allclose(res, 2.0 * av @ bv.T)


# -- state and aliases --------------------------------------------------------------------------


def _cache_model() -> tuple[GraphBuilder, Any, Any]:
    g = GraphBuilder(opset=23)
    cache = g.input("cache", FLOAT, [1, 8, 4], access=READ_WRITE)
    vals = g.input("vals", FLOAT, [1, 2, 4])
    pos = g.input("pos", INT64, [])
    upd = g.op.CacheUpdate(cache, vals, pos)
    return g, cache, upd


def test_cache_update_gets_its_aliases_automatically() -> None:
    g, cache, upd = _cache_model()
    node = upd.producer()
    assert node.domain == "ai.onnxforge" and g.model.opset_imports["ai.onnxforge"] == 1
    assert node.output_alias == [Alias(0, 0, MUST_ALIAS)]
    st = Storage(g.model)
    assert st.has_side_effects(node) and st.root(upd) is cache
    out = g.output(upd, "updated_cache")
    assert out is upd and out.alias_of is cache
    g.bind("cache", "updated_cache")
    m = g.to_model()
    assert of.check(m) == []
    of.verify(m)
    # the standard lowering runs in onnxruntime: rows [pos, pos + 2) are written
    std = of.to_standard_onnx(m)
    onnx.checker.check_model(std, full_check=True)
    cv = np.arange(32, dtype=np.float32).reshape(1, 8, 4)
    vv = -np.ones((1, 2, 4), np.float32)
    (res,) = _session(std).run(["updated_cache"], {"cache": cv, "vals": vv, "pos": np.array(3)})
    expected = cv.copy()
    expected[:, 3:5] = vv
    np.testing.assert_array_equal(res, expected)


def test_output_alias_out_of_range_is_refused() -> None:
    g = GraphBuilder(opset=23)
    x = g.input("x", FLOAT, [3])
    with pytest.raises(BuildError, match="L1"):
        g.make_node("Identity", [x], output_alias=[Alias(0, 1, MUST_ALIAS)])
    assert len(g.graph) == 0


def test_alias_keeps_port_and_value_aliases_consistent() -> None:
    g = GraphBuilder(opset=23, domains={"com.example": 1})
    state = g.input("state", FLOAT, [4])
    x = g.input("x", FLOAT, [4])
    assert state.access != READ_WRITE
    out = g.op["com.example"].AccumulateInPlace(x, state)
    g.output(out, "next_state", type=tensor_type(FLOAT, [4]))
    g.alias(out, "state")
    node = out.producer()
    assert node.output_alias == [Alias(0, 1, MUST_ALIAS)]  # state is input 1
    assert out.alias_of is state and state.access == READ_WRITE
    st = Storage(g.model)
    assert st.root(out) is state and st.has_side_effects(node)
    g.alias(out, state)  # repeating the declaration changes nothing
    assert node.output_alias == [Alias(0, 1, MUST_ALIAS)]
    g.bind(state, out)
    assert of.check(g.to_model()) == []


def test_alias_refusals() -> None:
    g = GraphBuilder(opset=23, domains={"com.example": 1})
    a = g.input("a", FLOAT, [4])
    b = g.input("b", FLOAT, [4])
    out = g.op["com.example"].Op(a, b)
    with pytest.raises(BuildError, match="L3"):
        g.alias(g.op.Relu(a), b)  # the producer does not read b
    g.alias(out, a)
    with pytest.raises(BuildError, match="L3"):
        g.alias(out, b)  # port 0 already aliases input 0
    assert out.alias_of is a and out.producer().output_alias == [Alias(0, 0, MUST_ALIAS)]
    with pytest.raises(BuildError, match="L2"):
        g.alias(b, a)  # a graph input aliases nothing
    assert b.alias_of is None
    with pytest.raises(BuildError, match="no graph input or output"):
        g.alias(out, "missing")


def test_output_alias_of_argument() -> None:
    g = GraphBuilder(opset=23, domains={"com.example": 1})
    s = g.input("s", FLOAT, [4])
    out = g.op["com.example"].Scale(s)
    g.output(out, "s_next", alias_of="s", type=tensor_type(FLOAT, [4]))
    assert out.alias_of is s and out.producer().output_alias == [Alias(0, 0, MUST_ALIAS)]
    assert s.access == READ_WRITE
    assert of.check(g.to_model()) == []


def test_bind_rules() -> None:
    g = GraphBuilder(opset=23)
    s = g.input("s", FLOAT, [4])
    t = g.input("t", FLOAT, [4])
    x = g.input("x", FLOAT, [4])
    s_next = g.output(g.op.Add(s, x), "s_next")
    t_next = g.output(g.op.Mul(t, x), "t_next")
    sub = g.subgraph("body")
    with pytest.raises(BuildError, match="B1"):
        sub.bind(s, s_next)
    fn = g.function("local", "F", ["a"])
    with pytest.raises(BuildError, match="B1"):
        fn.bind(s, s_next)
    with pytest.raises(BuildError, match="B2"):
        g.bind("s_next", "t_next")  # an output on the input side
    with pytest.raises(BuildError, match="B2"):
        g.bind("s", "t")  # an input on the output side
    inner = g.op.Relu(x)
    with pytest.raises(BuildError, match="B2"):
        g.bind(s, inner)  # neither an input nor an output of the graph
    with pytest.raises(BuildError, match="no graph input or output"):
        g.bind("nope", "s_next")
    g.bind("s", "s_next")
    with pytest.raises(BuildError, match="B3"):
        g.bind("s", "t_next")
    with pytest.raises(BuildError, match="B3"):
        g.bind(t, s_next)
    g.bind(t, t_next)
    m = g.to_model()
    m.functions.clear()  # the empty function body above is not part of this model
    assert [(i.name, o.name) for i, o in m.graph.bindings] == [("s", "s_next"), ("t", "t_next")]
    assert Storage(m).has_side_effects(s_next.producer())
    xv = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    sv, tv = np.full(4, 2.0, np.float32), np.full(4, 3.0, np.float32)
    out = _check_and_run(m, {"s": sv, "t": tv, "x": xv})
    np.testing.assert_array_equal(out["s_next"], sv + xv)
    np.testing.assert_array_equal(out["t_next"], tv * xv)


# -- struct catalogue ----------------------------------------------------------------------------


def _block_decoder(n: int) -> onnx.FunctionProto:
    """value[r, i] = float(codes[r, i]) * scale[r] for codes int8 [R, n], scale float [R]."""
    nodes = [
        helper.make_node("Cast", ["codes"], ["codes_f"], to=FLOAT),
        helper.make_node("Constant", [], ["one"], value=helper.make_tensor("one", INT64, [1], [1])),
        helper.make_node("Unsqueeze", ["scale", "one"], ["scale_col"]),
        helper.make_node("Mul", ["codes_f", "scale_col"], ["value"]),
    ]
    return helper.make_function("test.decoders", f"Block{n}_decode", ["codes", "scale"], ["value"],
                                nodes, [helper.make_opsetid("", 23)])


def _declare_block(g: GraphBuilder, n: int = 8, **kw: Any) -> StructType:
    codes_t = StructType(kind="array", array=ArrayKind(TensorType(INT4, ()), n))
    return g.declare_struct_type(f"TestBlock{n}", [("codes", codes_t), ("scale", tensor_type(FLOAT, []))],
                                 decoder=_block_decoder(n), **kw)


def _block_records(codes: np.ndarray, scales: np.ndarray) -> bytes:
    """Records of {INT4[n] codes, FLOAT scale}, packed by hand (n even: byte aligned)."""
    return b"".join(_pack_nibbles([int(c) for c in row]) + struct.pack("<f", float(s))
                    for row, s in zip(codes, scales))


def test_declare_struct_type_fields_arrays_bit_packings_and_decoder() -> None:
    g = GraphBuilder(opset=23)
    ref = _declare_block(g)
    assert ref.is_reference and ref.type_ref == 1000
    nib = g.declare_struct_type("Nibbles", bit_packing=([("lo", 4), ("hi", 4)], 1), type_id=7)
    arr = g.declare_struct_type("Bytes4", array=(tensor_type(UINT8, []), 4))
    rec = g.declare_struct_type("Record", [("p", nib), ("a", arr), ("k", np.float32(2.5))],
                                doc_string="a record", metadata={"origin": "test"})
    assert (nib.type_ref, arr.type_ref, rec.type_ref) == (7, 1001, 1002)
    by_id = {s.type_id: s for s in g.model.struct_types}
    block = by_id[1000]
    assert block.kind == "structure" and [f.name for f in block.fields] == ["codes", "scale"]
    assert block.fields[0].type.array == ArrayKind(TensorType(INT4, ()), 8)
    assert block.fields[1].type == TensorType(FLOAT, ())
    assert block.decoder.name == "Block8_decode" and block.decoder.inputs == ("codes", "scale")
    assert by_id[7].kind == "bit_packing" and by_id[7].bit_packing.dimension == 1
    assert [(c.name, c.bit_width) for c in by_id[7].bit_packing.components] == [("lo", 4), ("hi", 4)]
    assert by_id[1001].kind == "array" and by_id[1001].array == ArrayKind(TensorType(UINT8, ()), 4)
    record = by_id[1002]
    assert [f.name for f in record.fields] == ["p", "a", "k"]
    assert record.fields[0].type == struct_ref(7) and record.fields[2].type is None
    assert record.fields[2].constant.array() == np.float32(2.5)
    assert record.doc_string == "a record" and record.metadata == (("origin", "test"),)
    # records: p = one byte (lo nibble, hi nibble), a = 4 bytes; k is constant (no bytes)
    payload = bytes([0x3A, 1, 2, 3, 4, 0xF0, 9, 8, 7, 6])
    g.encoded_initializer("recs", struct_type=rec, codes=payload)
    g.output(g.op.Identity(g.input("x", FLOAT, [1])), "y")
    m = g.to_model()
    assert of.check(m) == []
    fields = of.decode_value(m, "recs")
    np.testing.assert_array_equal(fields["p.lo"].ravel(), [0xA, 0x0])
    np.testing.assert_array_equal(fields["p.hi"].ravel(), [0x3, 0xF])
    np.testing.assert_array_equal(fields["a"], [[1, 2, 3, 4], [9, 8, 7, 6]])
    assert float(fields["k"]) == 2.5


def test_declare_struct_type_refusals() -> None:
    g = GraphBuilder(opset=23)
    _declare_block(g, type_id=5)
    with pytest.raises(BuildError, match="already declared"):
        g.declare_struct_type("Again", array=(tensor_type(UINT8, []), 2), type_id=5)
    with pytest.raises(BuildError, match="positive"):
        g.declare_struct_type("Zero", array=(tensor_type(UINT8, []), 2), type_id=0)
    with pytest.raises(BuildError, match="exactly one"):
        g.declare_struct_type("None")
    with pytest.raises(BuildError, match="exactly one"):
        g.declare_struct_type("Two", [("a", tensor_type(UINT8, []))], array=(tensor_type(UINT8, []), 2))
    assert [s.type_id for s in g.model.struct_types] == [5]


def test_struct_records_with_a_type_ref_decode_by_their_decoder() -> None:
    g = GraphBuilder(opset=23)
    ref = _declare_block(g)
    rng = np.random.default_rng(3)
    codes = rng.integers(-8, 8, size=(6, 8))
    scales = rng.uniform(0.1, 1.0, size=6).astype(np.float32)
    v = g.encoded_initializer("w", struct_type=ref, codes=_block_records(codes, scales),
                              logical_type=tensor_type(FLOAT, [4, 12]))
    by_id = g.encoded_initializer("w2", struct_type=ref.type_ref, codes=_block_records(codes[:2], scales[:2]),
                                  logical_type=tensor_type(FLOAT, [16]))
    assert v.type == TensorType(FLOAT, (4, 12)) and v.is_encoded()
    assert by_id.const.header.struct_type == struct_ref(1000)
    x = g.input("x", FLOAT, [2, 4])
    g.output(g.op.MatMul(x, v), "y", type=tensor_type(FLOAT, [2, 12]))
    m = g.to_model()
    assert of.check(m) == []
    expected = (codes.astype(np.float32) * scales[:, None]).reshape(4, 12)
    np.testing.assert_array_equal(of.decode_value(m, "w"), expected)
    np.testing.assert_array_equal(of.decode_value(m, "w2"), expected.ravel()[:16])
    with pytest.raises(BuildError, match="codes"):
        g.encoded_initializer("w3", struct_type=ref)


def test_two_values_of_one_struct_type_can_have_different_bindings() -> None:
    g = GraphBuilder(opset=23)
    ref = _declare_block(g)
    a = g.input("state_a", type=ref)
    b = g.input("state_b", type=struct_ref(ref.type_ref))
    na = g.output(g.op.Identity(a), "next_a", type=ref)
    nb = g.output(g.op.Identity(b), "next_b", type=struct_ref(ref.type_ref))
    g.bind(a, na)
    g.bind("state_b", "next_b")
    m = g.to_model()
    assert [(i.name, o.name) for i, o in m.graph.bindings] == [("state_a", "next_a"), ("state_b", "next_b")]
    assert a.type == b.type == na.type == nb.type == struct_ref(1000)
    assert of.check(m) == []
    of.verify(m)
    again = serde.load(serde.to_bytes(m))
    of.verify(again)
    assert [(i.name, o.name) for i, o in again.graph.bindings] == [("state_a", "next_a"),
                                                                  ("state_b", "next_b")]


# -- encoded (affine) initializers ----------------------------------------------------------------


def _reference_dequantize(v: Any) -> np.ndarray:
    """onnx.reference's DequantizeLinear applied to the value's own codes and parameters."""
    h = v.const.header
    shape = list(h.logical_type.shape)
    codes = helper.make_tensor("codes", h.affine.storage_type, shape, bytes(h.raw_data), raw=True)
    inits = [codes]
    for name, const in (("scale", h.affine.scale), ("zp", h.affine.zero_point)):
        if const is not None:
            t = onnx.TensorProto()
            t.ParseFromString(const.proto)
            t.name = name
            inits.append(t)
    attrs = {k: val for k, val in (("axis", h.affine.axis), ("block_size", h.affine.block_size))
             if val is not None}
    node = helper.make_node("DequantizeLinear", [t.name for t in inits], ["y"], **attrs)
    graph = helper.make_graph([node], "dq", [], [helper.make_tensor_value_info("y", FLOAT, shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    return ReferenceEvaluator(model).run(None, {})[0]


def _per_element_scale(scale: np.ndarray, shape: tuple[int, ...], axis: Any, block: Any) -> np.ndarray:
    if axis is None:
        return np.broadcast_to(scale, shape)
    if block is None:
        view = [1] * len(shape)
        view[axis] = shape[axis]
        return np.broadcast_to(scale.reshape(view), shape)
    full = np.repeat(scale, block, axis=axis)
    return np.take(full, np.arange(shape[axis]), axis=axis)


@pytest.mark.parametrize("storage, shape, axis, block", [
    (INT4, (8, 6), 0, 4),     # blocked
    (INT4, (6, 7), 1, 3),     # blocked with a partial last block
    (UINT4, (4, 8), 0, 2),    # unsigned: a zero point
    (INT8, (5, 4), 1, None),  # per axis
    (UINT8, (3, 4), None, None),  # per tensor with a zero point
    (INT2, (4, 4), 0, 2),
])
def test_affine_from_floats_matches_dequantize_linear(storage: int, shape: tuple[int, ...],
                                                      axis: Any, block: Any) -> None:
    rng = np.random.default_rng(11)
    w = rng.standard_normal(shape).astype(np.float32)
    g = GraphBuilder(opset=23)
    v = g.encoded_initializer("w", w, storage_type=storage, axis=axis, block_size=block)
    assert v.type == TensorType(FLOAT, shape)
    h = v.const.header
    assert (h.affine.storage_type, h.affine.axis, h.affine.block_size) == (storage, axis, block)
    g.output(g.op.Identity(g.input("x", FLOAT, [1])), "y")
    m = g.to_model()
    assert of.check(m) == []
    decoded = of.decode_value(m, "w")
    np.testing.assert_array_equal(decoded, _reference_dequantize(v))
    scale = _per_element_scale(h.affine.scale.array(), shape, axis, block).astype(np.float64)
    err = np.abs(decoded.astype(np.float64) - w)
    assert np.all(err <= scale / 2 * (1 + 1e-6)), float((err / scale).max())


def test_affine_python_scale_keeps_the_values_precision() -> None:
    g = GraphBuilder(opset=23)
    w = np.linspace(-1, 1, 8, dtype=np.float32)
    v = g.encoded_initializer("w", w, storage_type=INT8, scale=0.01)
    assert v.type == TensorType(FLOAT, (8,))
    decoded = of.decode_value(g.to_model(), "w")
    assert decoded.dtype == np.float32
    np.testing.assert_array_equal(decoded, _reference_dequantize(v))
    assert np.abs(decoded - w).max() <= 0.005 + 1e-7


def test_affine_from_existing_codes() -> None:
    g = GraphBuilder(opset=23)
    codes = [-8, -3, 0, 1, 5, 7, 2, -1, 4, -6]  # 10 INT4 codes, shape [2, 5]
    scale = np.array([0.5, 0.25], np.float32)   # per row (axis 0)
    zp = np.array([1, -2], np.int8)
    v = g.encoded_initializer("w", storage_type=INT4, codes=_pack_nibbles(codes), scale=scale,
                              zero_point=zp, axis=0, logical_type=tensor_type(FLOAT, [2, 5]))
    x = g.input("x", FLOAT, [3, 2])
    g.output(g.op.MatMul(x, v), "y", type=tensor_type(FLOAT, [3, 5]))
    m = g.to_model()
    assert of.check(m) == []
    expected = (np.array(codes, np.float32).reshape(2, 5) - zp[:, None]) * scale[:, None]
    np.testing.assert_array_equal(of.decode_value(m, "w"), expected)
    np.testing.assert_array_equal(_reference_dequantize(v), expected)
    with pytest.raises(BuildError, match="scale"):
        g.encoded_initializer("w2", storage_type=INT4, codes=b"\x00")
    with pytest.raises(BuildError, match="storage_type"):
        g.encoded_initializer("w3", np.ones(2))
    # the standard lowering (DequantizeLinear) runs in onnxruntime
    std = of.to_standard_onnx(m)
    xv = np.arange(6, dtype=np.float32).reshape(3, 2)
    (res,) = _session(std).run(["y"], {"x": xv})
    np.testing.assert_allclose(res, xv @ expected, rtol=1e-6)


def test_encoded_names_share_the_initializer_namespace() -> None:
    g = GraphBuilder(opset=23)
    g.initializer("w", np.zeros(4, np.float32))
    with pytest.raises(BuildError, match="already used"):
        g.encoded_initializer("w", np.ones(4, np.float32), storage_type=INT8)
    assert list(g.graph.encoded_initializers) == []


# -- subgraphs, functions, editing ------------------------------------------------------------------


def test_if_branches_use_outer_values() -> None:
    g = GraphBuilder(opset=23)
    x = g.input("x", FLOAT, [3])
    c = g.input("c", BOOL, [])
    w = g.initializer("w", np.array([1.0, 2.0, 3.0], np.float32))
    scaled = g.op.Mul(x, w)
    then_b, else_b = g.subgraph("then"), g.subgraph("else")
    then_b.output(then_b.op.Add(scaled, w), "t")
    else_b.output(else_b.op.Sub(x, scaled), "e")
    y = g.op.If(c, then_branch=then_b, else_branch=else_b)
    node = y.producer()
    assert then_b.graph.parent is node and node.subgraphs() == [then_b.graph, else_b.graph]
    assert {n.op_type for n, _ in scaled.uses()} == {"Add", "Sub"}  # outer uses are recorded
    g.output(y, "y")
    m = g.to_model()
    wv = np.array([1.0, 2.0, 3.0], np.float32)
    xv = np.array([0.5, -1.0, 2.0], np.float32)
    np.testing.assert_allclose(_check_and_run(m, {"x": xv, "c": np.array(True)})["y"], xv * wv + wv)
    np.testing.assert_allclose(_check_and_run(m, {"x": xv, "c": np.array(False)})["y"], xv - xv * wv)


def test_loop_body_subgraph() -> None:
    g = GraphBuilder(opset=23)
    x = g.input("x", FLOAT, [2])
    trips = g.initializer("trips", np.array(3, np.int64))
    body = g.subgraph("body")
    body.input("i", INT64, [])
    cond = body.input("cond_in", BOOL, [])
    acc = body.input("acc", FLOAT, [2])
    body.output(body.op.Identity(cond), "cond_out")
    body.output(body.op.Add(body.op.Mul(acc, x), x), "acc_out")  # acc = acc * x + x (outer x)
    out = g.op.Loop(trips, None, x, body=body)
    g.output(out, "y")
    xv = np.array([2.0, -1.0], np.float32)
    expected = xv.copy()
    for _ in range(3):
        expected = expected * xv + xv
    np.testing.assert_allclose(_check_and_run(g.to_model(), {"x": xv})["y"], expected)


def test_local_function_called_from_the_main_graph() -> None:
    g = GraphBuilder(opset=23)
    x = g.input("x", FLOAT, [3])
    y = g.input("y", FLOAT, [3])
    fb = g.function("test.local", "MulAdd", ["a", "b"])
    a, b = fb.graph.inputs
    fb.output(fb.op.Add(fb.op.Mul(a, b), a), "r")
    assert g.model.opset_imports["test.local"] == 1
    assert g.model.function("test.local", "MulAdd") is fb.graph
    assert [v.name for v in fb.graph.outputs] == ["r"]
    called = g.op["test.local"].MulAdd(x, y)
    once_more = g.op["test.local"].MulAdd(called, x)
    g.output(once_more, "out")
    m = g.to_model()
    xv = np.array([1.0, -2.0, 3.0], np.float32)
    yv = np.array([4.0, 5.0, -6.0], np.float32)
    first = xv * yv + xv
    np.testing.assert_allclose(_check_and_run(m, {"x": xv, "y": yv})["out"], first * xv + first)


def test_subgraphs_of_a_function_body_follow_the_function_opsets() -> None:
    g = GraphBuilder(opset=23)
    fb = g.function("test.local", "F", ["a", "flag"], opsets={"": 23, "com.example": 1})
    a, flag = fb.graph.inputs
    then_b, else_b = fb.subgraph("then"), fb.subgraph("else")
    custom = then_b.op["com.example"].Custom(a)  # declared by the function, not by the model
    assert custom.producer().domain == "com.example" and "com.example" not in g.model.opset_imports
    then_b.output(custom, "t")
    else_b.output(else_b.op.Neg(a), "e")
    fb.output(fb.op.If(flag, then_branch=then_b, else_branch=else_b), "r")
    with pytest.raises(SchemaCheckError, match="com.other"):
        then_b.op["com.other"].Custom(a)
    assert [n.op_type for n in fb.graph] == ["If"]


def test_from_model_continues_editing_a_loaded_model(tmp_path: Any) -> None:
    g = GraphBuilder(opset=23)
    x = g.input("x", FLOAT, [2, 3])
    c = g.input("c", BOOL, [])
    w = g.initializer("w", np.arange(6, dtype=np.float32).reshape(2, 3))
    then_b, else_b = g.subgraph("then"), g.subgraph("else")
    then_b.output(then_b.op.Add(x, w), "t")
    else_b.output(else_b.op.Sub(x, w), "e")
    g.output(g.op.If(c, then_branch=then_b, else_branch=else_b), "y")
    first = os.path.join(tmp_path, "first.onnx")
    of.save(g.to_model(), first)

    loaded = of.load(first)
    ed = GraphBuilder.from_model(loaded)
    y = loaded.graph.outputs[0]
    bias = ed.initializer("bias", np.full((2, 3), 10.0, np.float32))
    z = ed.op.Add(ed.op.Relu(y), bias)
    ed.output(z, "z")
    with pytest.raises(BuildError, match="already used"):
        ed.initializer("w", np.zeros(1, np.float32))  # names of the loaded model are taken
    names = _all_names(loaded)
    assert len(names) == len(set(names))  # new nodes avoid the names inside loaded branches
    second = os.path.join(tmp_path, "second.onnx")
    of.save(loaded, second)

    again = of.load(second)
    of.verify(again)
    assert [o.name for o in again.graph.outputs] == ["y", "z"]
    xv = np.array([[-10.0, 1.0, 2.0], [3.0, -4.0, 5.0]], np.float32)
    wv = np.arange(6, dtype=np.float32).reshape(2, 3)
    for cond, ref in ((True, xv + wv), (False, xv - wv)):
        out = _check_and_run(again, {"x": xv, "c": np.array(cond)})
        np.testing.assert_allclose(out["y"], ref)
        np.testing.assert_allclose(out["z"], np.maximum(ref, 0) + 10.0)
