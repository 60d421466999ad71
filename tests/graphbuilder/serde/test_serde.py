"""serde: extended protobuf <-> IR, load / save, external data, lossless extras."""
from __future__ import annotations

import mmap
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from google.protobuf.unknown_fields import UnknownFieldSet
from onnx import AttributeProto, TensorProto, helper, numpy_helper

from onnxforge.errors import ExternalDataError, VerificationError, WireError
from onnxforge.graphbuilder import serde
from onnxforge.graphbuilder.serde import canonical
from onnxforge.graphbuilder.ir.core import (
    MUST_ALIAS,
    READ_WRITE,
    Alias,
    AttrType,
    Graph,
    Model,
    Node,
    Value,
)
from onnxforge.graphbuilder.serde import _decode
from onnxforge.graphbuilder.ir.tensors import EncodedTensor, Tensor
from onnxforge.proto_ext import schema
from onnxforge.proto_ext.types import StructType, TensorType
from onnxforge.graphbuilder.ir.storage import Storage
from tests.graphbuilder.serde.test_serde_corpus import (
    catalogue_model,
    function_model,
    stateful_model,
    subgraph_model,
)
from tests.proto_ext.helpers import encoded, model_with, tensor_type, value_info


def _f(dims: Any = ()) -> Any:
    return tensor_type(TensorProto.FLOAT, dims)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


UNKNOWN_1050 = _varint(1050 << 3 | 2) + _varint(5) + b"hello"  # field 1050, length-delimited


def _with_unknown(msg: Any) -> Any:
    """``msg`` (in place) with field 1050 added through its wire bytes."""
    msg.MergeFromString(UNKNOWN_1050)
    return msg


def _has_1050(msg: Any) -> bool:
    return any(f.field_number == 1050 and f.data == b"hello" for f in UnknownFieldSet(msg))


def _chain(n: int = 3) -> onnx.ModelProto:
    nodes = [helper.make_node("Relu", ["x" if i == 0 else f"t{i - 1}"], [f"t{i}"], name=f"n{i}")
             for i in range(n)]
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                          [helper.make_tensor_value_info(f"t{n - 1}", TensorProto.FLOAT, [4])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])


# --------------------------------------------------------------------------- structure


def test_load_builds_def_use_and_round_trips_byte_identically() -> None:
    stock = _chain(3)
    m = serde.load(stock)
    g = m.graph
    assert [n.name for n in g] == ["n0", "n1", "n2"]
    x = g.inputs[0]
    n0, n1, n2 = list(g)
    assert x.uses() == [(n0, 0)] and n0.inputs[0] is x
    assert n1.inputs[0] is n0.outputs[0] and n0.outputs[0].producer() is n0
    assert g.outputs == [n2.outputs[0]]
    assert x.type == TensorType(TensorProto.FLOAT, (4,))
    assert m.opset_imports == {"": 21} and m.ir_version == stock.ir_version
    assert serde.to_bytes(m) == stock.SerializeToString()


def test_model_fields_docs_and_metadata_everywhere() -> None:
    stock = _chain(2)
    stock.producer_name, stock.producer_version = "prod", "9.9"
    stock.domain, stock.model_version, stock.doc_string = "org.test", 3, "model doc"
    helper.set_model_props(stock, {"b": "2", "a": "1"})
    g = stock.graph
    g.doc_string = "graph doc"
    g.metadata_props.add(key="gk", value="gv")
    g.input[0].doc_string = "input doc"
    g.input[0].metadata_props.add(key="ik", value="iv")
    g.node[0].doc_string = "node doc"
    g.node[0].metadata_props.add(key="nk", value="nv")
    g.node[1].overload = "ov"
    t = g.initializer.add()
    t.CopyFrom(numpy_helper.from_array(np.ones(3, np.float32), "w"))
    t.doc_string = "tensor doc"
    t.metadata_props.add(key="tk", value="tv")
    m = serde.load(stock)
    assert (m.producer_name, m.producer_version, m.domain, m.model_version, m.doc_string) == (
        "prod", "9.9", "org.test", 3, "model doc")
    assert m.metadata == {"b": "2", "a": "1"}
    assert m.graph.doc_string == "graph doc" and m.graph.metadata == {"gk": "gv"}
    x = m.graph.inputs[0]
    assert (x.doc_string, x.metadata) == ("input doc", {"ik": "iv"})
    n0, n1 = list(m.graph)
    assert (n0.doc_string, n0.metadata, n1.overload) == ("node doc", {"nk": "nv"}, "ov")
    w = m.graph.initializers["w"].const
    assert (w.doc_string, w.metadata) == ("tensor doc", {"tk": "tv"})
    assert not any(n.extra for n in m.graph) and not m.graph.extra and not w.extra
    assert serde.to_bytes(m) == stock.SerializeToString()


def test_value_info_types_intermediates_only() -> None:
    stock = _chain(3)
    stock.graph.value_info.append(helper.make_tensor_value_info("t0", TensorProto.FLOAT, [4]))
    m = serde.load(stock)
    n0, n1, _ = list(m.graph)
    t0, t1 = n0.outputs[0], n1.outputs[0]
    assert t0.has_value_info and t0.type == TensorType(TensorProto.FLOAT, (4,))
    assert not t1.has_value_info and t1.type is None
    # a type set by a pass is written as value_info
    t1.type = TensorType(TensorProto.FLOAT, ("n",))
    out = serde.to_proto(m)
    assert [vi.name for vi in out.graph.value_info] == ["t0", "t1"]
    assert out.graph.value_info[1].type.tensor_type.shape.dim[0].dim_param == "n"


def test_orphan_and_duplicate_value_info_are_kept() -> None:
    stock = _chain(2)
    stock.graph.value_info.extend([
        helper.make_tensor_value_info("nowhere", TensorProto.FLOAT, [1]),
        helper.make_tensor_value_info("t0", TensorProto.FLOAT, [4]),
        helper.make_tensor_value_info("t0", TensorProto.FLOAT, [5]),
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [4]),
    ])
    m = serde.load(stock)
    assert list(m.graph)[0].outputs[0].type == TensorType(TensorProto.FLOAT, (4,))
    assert canonical.differences(stock, serde.to_proto(m)) == []


def test_initializers_inputs_and_types() -> None:
    stock = _chain(1)
    stock.graph.node[0].input.append("w")
    stock.graph.node[0].op_type = "Add"
    stock.graph.initializer.append(numpy_helper.from_array(np.arange(4, dtype=np.float32), "w"))
    stock.graph.input.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, [4]))
    stock.graph.initializer.append(numpy_helper.from_array(np.int64(3), "k"))
    m = serde.load(stock)
    w = m.graph.initializers["w"]
    assert w is m.graph.inputs[1] and w.is_graph_input() and w.is_initializer()
    np.testing.assert_array_equal(w.const.numpy(), np.arange(4, dtype=np.float32))
    k = m.graph.initializers["k"]
    assert not k.is_graph_input() and k.type == TensorType(TensorProto.INT64, ())
    assert list(m.graph)[0].inputs[1] is w
    assert serde.to_bytes(m) == stock.SerializeToString()


def test_typed_and_string_tensors_keep_their_fields() -> None:
    stock = _chain(1)
    stock.graph.initializer.extend([
        helper.make_tensor("ints", TensorProto.INT64, [3], [1, 2, 3]),
        helper.make_tensor("strs", TensorProto.STRING, [2], [b"a", "\u00e9".encode()]),
        helper.make_tensor("empty", TensorProto.FLOAT, [0], []),
    ])
    m = serde.load(stock)
    np.testing.assert_array_equal(m.graph.initializers["ints"].const.numpy(), [1, 2, 3])
    assert m.graph.initializers["strs"].const.numpy().tolist() == ["a", "\u00e9"]
    assert serde.to_bytes(m) == stock.SerializeToString()


def test_empty_optional_names_are_kept() -> None:
    node = helper.make_node("Clip", ["x", "", "hi"], ["y"], name="clip")
    drop = helper.make_node("Dropout", ["y"], ["z", ""], name="drop")
    g = helper.make_graph([node, drop], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
                           helper.make_tensor_value_info("hi", TensorProto.FLOAT, [])],
                          [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2])])
    stock = helper.make_model(g)
    m = serde.load(stock)
    clip, dropout = list(m.graph)
    assert clip.inputs[1] is None and clip.inputs[2] is m.graph.inputs[1]
    assert dropout.outputs[1].name == "" and dropout.outputs[1].producer() is dropout
    out = serde.to_proto(m)
    assert list(out.graph.node[0].input) == ["x", "", "hi"]
    assert list(out.graph.node[1].output) == ["z", ""]


def test_forward_references_and_undefined_names() -> None:
    # node order reversed (not topological) and one input that nothing defines
    a = helper.make_node("Relu", ["x"], ["a"], name="a")
    b = helper.make_node("Add", ["a", "ghost"], ["b"], name="b")
    c = helper.make_node("Neg", ["ghost"], ["c"], name="c")
    g = helper.make_graph([b, a, c], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("b", TensorProto.FLOAT, [2])])
    stock = helper.make_model(g)
    m = serde.load(stock)
    nb, na, nc = list(m.graph)
    assert nb.inputs[0] is na.outputs[0]
    ghost = nb.inputs[1]
    assert ghost is nc.inputs[0] and ghost.name == "ghost" and ghost.producer() is None
    assert {n.name for n, _ in ghost.uses()} == {"b", "c"}
    assert serde.to_bytes(m) == stock.SerializeToString()


def test_fast_node_creation_matches_the_constructor() -> None:
    assert _decode.fast_objects()
    m = serde.load(_chain(2))
    loaded = list(m.graph)[1]
    made = Graph().append(Node("", "Relu", [list(m.graph)[0].outputs[0]], ["t1b"], name="n1"))
    plain = (list, dict, bytes, str, int)
    for a, b, cls in ((loaded, made, Node), (loaded.outputs[0], made.outputs[0], Value)):
        for slot in cls.__slots__:
            if slot == "__weakref__":
                continue
            mine, ref = getattr(a, slot), getattr(b, slot)  # every slot is set
            if isinstance(ref, plain):
                assert type(mine) is type(ref), slot
    assert loaded.inputs[0].uses() == [(loaded, 0), (made, 0)]


# --------------------------------------------------------------------------- attributes


def _all_attribute_kinds() -> onnx.NodeProto:
    sub = helper.make_graph([helper.make_node("Identity", ["x"], ["s"])], "sub", [],
                            [helper.make_tensor_value_info("s", TensorProto.FLOAT, [4])])
    sparse = helper.make_sparse_tensor(
        helper.make_tensor("v", TensorProto.FLOAT, [2], [1.0, 2.0]),
        helper.make_tensor("i", TensorProto.INT64, [2], [0, 3]), [4])
    node = helper.make_node(
        "Custom", ["x"], ["y"], name="c", domain="test",
        f=0.5, i=-3, s="text", raw=b"\xff\x00", floats=[1.0, 2.5], ints=[1, 2], strings=["a", "b"],
        t=numpy_helper.from_array(np.arange(3, dtype=np.int32)),
        tensors=[numpy_helper.from_array(np.zeros(2, np.float16))],
        g=sub, graphs=[sub, sub], sparse_tensor=sparse, sparse_tensors=[sparse],
        tp=helper.make_tensor_type_proto(TensorProto.FLOAT, ["n", 3]),
        type_protos=[helper.make_sequence_type_proto(helper.make_tensor_type_proto(TensorProto.INT64, None))],
        zero=0)
    node.attribute.append(AttributeProto(name="empty_ints", type=AttributeProto.INTS))
    node.attribute.append(AttributeProto(name="alpha", ref_attr_name="a", type=AttributeProto.FLOAT))
    return node


def test_every_attribute_kind() -> None:
    node = _all_attribute_kinds()
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    stock = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("test", 1)])
    m = serde.load(stock)
    (n,) = list(m.graph)
    a = n.attributes
    assert (a["f"].value, a["i"].value, a["s"].value, a["raw"].value) == (0.5, -3, "text", b"\xff\x00")
    assert a["floats"].value == [1.0, 2.5] and a["ints"].value == [1, 2]
    assert a["strings"].value == ["a", "b"] and a["zero"].value == 0
    assert a["empty_ints"].type == AttrType.INTS and a["empty_ints"].value == []
    assert isinstance(a["t"].value, Tensor)
    np.testing.assert_array_equal(a["t"].value.numpy(), [0, 1, 2])
    assert isinstance(a["g"].value, Graph) and a["g"].value.parent is n
    assert [type(x) for x in a["graphs"].value] == [Graph, Graph]
    assert isinstance(a["sparse_tensor"].value, bytes) and len(a["sparse_tensors"].value) == 1
    assert a["tp"].value == TensorType(TensorProto.FLOAT, ("n", 3))
    assert a["alpha"].ref_attr_name == "a" and a["alpha"].value is None
    # the subgraph reads the outer input
    inner = list(a["g"].value)[0]
    assert inner.inputs[0] is m.graph.inputs[0]
    assert serde.to_bytes(m) == stock.SerializeToString()


def test_untyped_legacy_attribute_survives() -> None:
    stock = _chain(1)
    legacy = stock.graph.node[0].attribute.add(name="old")
    legacy.i = 5  # no `type` field, as in very old models
    m = serde.load(stock)
    assert list(m.graph)[0].attributes["old"].type == 0
    assert serde.to_bytes(m) == stock.SerializeToString()


# --------------------------------------------------------------------------- scopes and functions


def test_subgraph_outer_references_are_the_outer_values() -> None:
    m = serde.load(subgraph_model())
    relu, if_node, loop = list(m.graph)
    h = relu.outputs[0]
    then_g = if_node.attributes["then_branch"].value
    else_g = if_node.attributes["else_branch"].value
    body = loop.attributes["body"].value
    then_add, then_mul = list(then_g)
    assert then_add.inputs == (m.graph.inputs[0], h)
    assert then_mul.inputs[1] is m.graph.initializers["c"]
    assert list(else_g)[0].inputs[0] is h and list(body)[1].inputs[1] is h
    users = {n.name for n, _ in h.uses()}
    assert {"then_add", "else_neg"} <= users
    assert then_g.parent is if_node and then_g.path().endswith("attribute['then_branch'].g")
    assert h.has_value_info and loop.inputs[1] is None


def test_local_function() -> None:
    m = serde.load(function_model())
    fn = m.function("local", "Append")
    assert fn is not None
    cache, values, pos = fn.inputs
    assert cache.access == READ_WRITE and cache.type == TensorType(TensorProto.FLOAT, ("b", "cap", 8))
    assert fn.attributes == ["axis"] and fn.attribute_defaults["scale"].value == 1.0
    assert fn.opset_imports == {"ai.onnxforge": 1, "": 23}
    (upd,) = list(fn)
    assert upd.inputs == (cache, values, pos) and fn.outputs == [upd.outputs[0]]
    assert upd.attributes["axis"].ref_attr_name == "axis"
    assert upd.output_alias == [Alias(0, 0, MUST_ALIAS)]
    assert fn.outputs[0].alias_of is cache
    assert (fn.doc_string, fn.metadata) == ("appends in place", {"k": "v"})
    (call,) = list(m.graph)
    assert call.attributes["axis"].value == -2 and call.domain == "local"


# --------------------------------------------------------------------------- extensions


def test_struct_catalogue_and_encoded_initializers() -> None:
    msg = catalogue_model()
    m = serde.load(msg)
    assert [s.type_id for s in m.struct_types] == [2001, 1003, 1002, 1101, 1102]
    assert m.struct_types[4].fields[0].type.type_ref == 1101
    enc = m.graph.encoded_initializers
    assert sorted(enc) == sorted(e.name for e in msg.graph.encoded_initializer)
    w = enc["w_2001"]
    assert isinstance(w.const, EncodedTensor) and w.is_encoded()
    assert w.const.header.struct_type.type_ref == 2001 and w.const.nbytes == 2560
    assert bytes(w.const.payload) == msg.graph.encoded_initializer[0].raw_data
    # consumers see the logical type; the layout stays on the header
    assert w.type == w.const.header.logical_type
    assert w.type.elem_type == TensorProto.FLOAT
    small = enc["w_1102_small"].const
    assert bytes(small.payload) == bytes([0xE4] * 8) + b"\x00\x00\x00\x40"
    affine = enc["w_affine"].const.header.affine
    assert (affine.storage_type, affine.axis, affine.block_size) == (TensorProto.INT4, 0, 32)
    # the graph input with an encoded initializer's name is the same Value
    assert enc["w_1003"] is m.graph.inputs[1] and enc["w_1003"].type.type_ref == 1003
    assert serde.to_bytes(m) == msg.SerializeToString()


def test_bindings_aliases_access() -> None:
    m = serde.load(stateful_model())
    g = m.graph
    past, kv, pos, count, blocks, anything = g.inputs
    present, count_next, blocks_out = g.outputs
    assert g.bindings == [(past, present), (count, count_next)]
    assert past.access == READ_WRITE and present.alias_of is past
    upd = present.producer()
    st = Storage(m)
    assert upd.output_alias == [Alias(0, 0, MUST_ALIAS)] and st.has_side_effects(upd)
    assert st.root(present) is past
    assert blocks.type == StructType(kind="type_ref", type_ref=2001)
    assert anything.type == StructType() and anything.type.is_category


def test_binding_naming_no_input_raises_b2() -> None:
    msg = stateful_model()
    msg.graph.persistent_bindings.add(input_name="nope", output_name="present")
    with pytest.raises(VerificationError) as info:
        serde.load(msg)
    assert info.value.rules == ["B2"]
    assert "graph.persistent_bindings[2]" in str(info.value) and "'nope'" in str(info.value)


def test_alias_of_unresolved_name_stays_a_string() -> None:
    out = value_info("y", _f([2]))
    out.alias_of = "not_visible"
    msg = model_with(inputs=[("x", _f([2]))], outputs=[out],
                     nodes=[helper.make_node("Relu", ["x"], ["y"])])
    m = serde.load(msg)
    assert m.graph.outputs[0].alias_of == "not_visible"
    assert serde.to_bytes(m) == msg.SerializeToString()


def test_loading_does_not_verify() -> None:
    # a struct type reference to an undeclared id and an access on an intermediate load fine
    msg = model_with(inputs=[("x", _f([2])), value_info("s", tensor_type(TensorProto.FLOAT, [1]))],
                     outputs=[("y", _f([2]))], nodes=[helper.make_node("Relu", ["x"], ["y"])],
                     encoded=[encoded("e", type_ref=999, raw_data=b"\x00" * 3)])
    m = serde.load(msg)
    assert m.graph.encoded_initializers["e"].const.header.struct_type.type_ref == 999


# --------------------------------------------------------------------------- unknown and unmodeled fields


def _unknown_everywhere() -> Any:
    msg = stateful_model()
    _with_unknown(msg)
    g = msg.graph
    _with_unknown(g)
    _with_unknown(g.node[0])
    _with_unknown(g.node[0].attribute[0])
    _with_unknown(g.node[0].output_alias[0])
    _with_unknown(g.input[0])
    _with_unknown(g.input[1].type)
    _with_unknown(g.input[1].type.tensor_type.shape.dim[0])
    _with_unknown(g.output[1])
    _with_unknown(g.initializer[0])
    _with_unknown(g.persistent_bindings[0])
    _with_unknown(msg.opset_import[0])
    _with_unknown(msg.struct_types[0])
    g.node[1].metadata_props.add(key="k", value="v")
    _with_unknown(g.node[1].metadata_props[0])
    enc = g.encoded_initializer.add()
    enc.CopyFrom(encoded("e", type_ref=2001, raw_data=bytes(20)))
    _with_unknown(enc)
    fn = msg.functions.add(name="F", domain="d")
    _with_unknown(fn)
    return msg


def test_unknown_fields_survive_on_every_message_kind(tmp_path: Path) -> None:
    msg = _unknown_everywhere()
    data = msg.SerializeToString()
    m = serde.load(data)
    assert m.graph.inputs[0].extra and list(m.graph)[0].extra and m.extra
    out = serde.to_proto(m)
    assert out.SerializeToString() == data
    g = out.graph
    for part in (out, g, g.node[0], g.node[0].attribute[0], g.node[0].output_alias[0], g.input[0],
                 g.input[1].type, g.input[1].type.tensor_type.shape.dim[0], g.output[1],
                 g.initializer[0], g.persistent_bindings[0], out.opset_import[0], out.struct_types[0],
                 g.node[1].metadata_props[0], g.encoded_initializer[0], out.functions[0]):
        assert _has_1050(part), part.DESCRIPTOR.name
    # through a file as well, and through stock onnx
    path = tmp_path / "m.onnx"
    serde.save(m, path)
    assert path.read_bytes() == data
    assert serde.to_onnx(m).SerializeToString() == data


def test_hand_added_unknown_field_on_node_value_info_tensor() -> None:
    stock = _chain(2)
    stock.graph.initializer.append(numpy_helper.from_array(np.ones(2, np.float32), "w"))
    for part in (stock.graph.node[1], stock.graph.input[0], stock.graph.initializer[0]):
        part.MergeFromString(UNKNOWN_1050)
    out = serde.to_onnx(serde.load(stock))
    assert _has_1050(out.graph.node[1]) and _has_1050(out.graph.input[0])
    assert _has_1050(out.graph.initializer[0])
    assert out == stock


def test_unmodeled_fields_survive() -> None:
    stock = _chain(2)
    train = stock.training_info.add()
    train.algorithm.name = "step"
    train.update_binding.add(key="w", value="w2")
    ann = stock.graph.quantization_annotation.add(tensor_name="t0")
    ann.quant_parameter_tensor_names.add(key="SCALE_TENSOR", value="s")
    stock.graph.node[0].device_configurations.add(configuration_id="cfg")
    seg = stock.graph.initializer.add()
    seg.CopyFrom(numpy_helper.from_array(np.ones(2, np.float32), "w"))
    seg.segment.begin = 0
    seg.segment.end = 2
    stock.graph.node[1].domain = ""  # present with its default value
    stock.graph.node[1].metadata_props.add(key="k", value="1")
    stock.graph.node[1].metadata_props.add(key="k", value="2")  # a repeated key
    stock.opset_import[0].ClearField("domain")
    m = serde.load(stock)
    assert m.opset_imports == {"": 21} and list(m.graph)[1].metadata == {"k": "2"}
    assert serde.to_onnx(m) == stock
    assert serde.to_bytes(m) == stock.SerializeToString()


def test_edits_win_over_stored_verbatim_copies() -> None:
    stock = _chain(2)
    _with_unknown(stock.graph.input[0].type)  # the type is kept verbatim
    stock.graph.node[0].domain = ""  # presence marker in extra
    stock.graph.node[0].metadata_props.add(key="k", value="1")
    stock.graph.node[0].metadata_props.add(key="k", value="2")  # kept verbatim
    m = serde.load(stock)
    x = m.graph.inputs[0]
    n0 = list(m.graph)[0]
    x.type = TensorType(TensorProto.FLOAT16, (8,))
    n0.domain = "custom"
    n0.metadata = {"new": "v"}
    out = serde.to_proto(m)
    assert out.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT16
    assert not _has_1050(out.graph.input[0].type)
    assert out.graph.node[0].domain == "custom"
    assert [(p.key, p.value) for p in out.graph.node[0].metadata_props] == [("new", "v")]


def test_passthrough_output_with_its_own_descriptor() -> None:
    g = helper.make_graph([], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])])
    stock = helper.make_model(g)
    m = serde.load(stock)
    assert m.graph.outputs == [m.graph.inputs[0]]
    assert serde.to_bytes(m) == stock.SerializeToString()
    same = helper.make_model(helper.make_graph(
        [], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])]))
    m2 = serde.load(same)
    assert not m2.graph.extra and serde.to_bytes(m2) == same.SerializeToString()


# --------------------------------------------------------------------------- sources and targets


def test_sources_stock_extended_bytes_path(tmp_path: Path) -> None:
    msg = stateful_model()
    data = msg.SerializeToString()
    path = tmp_path / "m.onnx"
    path.write_bytes(data)
    stock = onnx.load_from_string(data)
    for source in (msg, stock, data, bytearray(data), memoryview(data), path, str(path)):
        m = serde.load(source)
        assert serde.to_bytes(m) == data, type(source)
    assert serde.from_proto(stock).graph.bindings
    assert serde.from_bytes(data).graph.bindings
    with pytest.raises(TypeError):
        serde.load(serde.load(data))  # type: ignore[arg-type]


def test_malformed_input_raises_wire_error(tmp_path: Path) -> None:
    data = _chain(2).SerializeToString()
    with pytest.raises(WireError):
        serde.load(data[:-3])
    with pytest.raises(WireError):
        serde.load(b"\xff\xff\xff\xff")
    (tmp_path / "empty.onnx").write_bytes(b"")
    with pytest.raises(WireError, match="empty"):
        serde.load(tmp_path / "empty.onnx")


def test_to_onnx_is_stock_with_extensions_as_unknown_fields() -> None:
    msg = stateful_model()
    out = serde.to_onnx(serde.load(msg))
    assert type(out) is onnx.ModelProto
    assert len(UnknownFieldSet(out.graph)) > 0  # persistent_bindings
    assert schema.from_onnx(out) == msg


def test_to_proto_without_payloads_leaves_large_raw_data_out() -> None:
    stock = _chain(1)
    stock.graph.initializer.append(numpy_helper.from_array(np.ones(1024, np.float32), "big"))
    stock.graph.initializer.append(numpy_helper.from_array(np.ones(4, np.float32), "small"))
    m = serde.load(stock)
    slim = serde.to_proto(m, include_payloads=False)
    assert not slim.graph.initializer[0].HasField("raw_data")
    assert slim.graph.initializer[1].raw_data == stock.graph.initializer[1].raw_data
    assert serde.to_proto(m).graph.initializer[0].raw_data == stock.graph.initializer[0].raw_data


def test_built_model_saves_and_loads(tmp_path: Path) -> None:
    g = Graph("built")
    x = g.add_input(Value("x", TensorType(TensorProto.FLOAT, (4,))))
    w = g.add_initializer(Value("w"), Tensor.from_numpy(np.full(4, 2.0, np.float32)))
    n = g.append(Node("", "Mul", [x, w], ["y"], name="mul"))
    n.outputs[0].type = TensorType(TensorProto.FLOAT, (4,))
    g.outputs.append(n.outputs[0])
    model = Model(g, opset_imports={"": 21})
    path = tmp_path / "built.onnx"
    serde.save(model, path)
    stock = onnx.load(str(path))
    onnx.checker.check_model(stock, full_check=True)
    assert stock.producer_name == "onnxforge" and stock.ir_version == 10
    np.testing.assert_array_equal(numpy_helper.to_array(stock.graph.initializer[0]), np.full(4, 2.0))
    back = serde.load(path)
    assert list(back.graph)[0].inputs[1] is back.graph.initializers["w"]


# --------------------------------------------------------------------------- payloads and files


def _big_model(nbytes: int = 1 << 16) -> onnx.ModelProto:
    stock = _chain(1)
    arr = np.arange(nbytes // 4, dtype=np.float32)
    stock.graph.initializer.append(numpy_helper.from_array(arr, "big"))
    stock.graph.initializer.append(numpy_helper.from_array(np.ones(3, np.float32), "small"))
    return stock


def test_inline_payload_shares_memory_with_the_file_mapping(tmp_path: Path) -> None:
    stock = _big_model()
    path = tmp_path / "m.onnx"
    onnx.save(stock, str(path))
    m = serde.load(path)
    big = m.graph.initializers["big"].const
    assert isinstance(big.raw, memoryview) and big.raw.readonly
    assert isinstance(big.raw.obj, mmap.mmap)  # a view of the file mapping, not a copy
    arr = big.numpy()
    assert not arr.flags.writeable and not arr.flags.owndata
    np.testing.assert_array_equal(arr, np.arange(1 << 14, dtype=np.float32))
    assert isinstance(m.graph.initializers["small"].const.raw, bytes)
    # saving streams it back and the file is identical
    serde.save(m, tmp_path / "out.onnx")
    assert (tmp_path / "out.onnx").read_bytes() == path.read_bytes()


def test_saving_over_the_source_file_is_safe(tmp_path: Path) -> None:
    stock = _big_model()
    path = tmp_path / "m.onnx"
    onnx.save(stock, str(path))
    m = serde.load(path)
    serde.save(m, path)
    assert path.read_bytes() == stock.SerializeToString()
    np.testing.assert_array_equal(m.graph.initializers["big"].const.numpy()[:3], [0, 1, 2])


def _external_model(folder: Path) -> Path:
    stock = _big_model()
    enc = schema.from_onnx(stock)
    enc.graph.encoded_initializer.add().CopyFrom(
        encoded("e", raw_data=bytes(range(256)) * 8, type_ref=7))
    enc.graph.encoded_initializer.add().CopyFrom(encoded("e_small", raw_data=b"\x01\x02", type_ref=7))
    m = serde.load(enc.SerializeToString())
    folder.mkdir(parents=True, exist_ok=True)
    serde.save(m, folder / "model.onnx", external_data="data/weights.bin")
    return folder / "model.onnx"


def test_save_with_external_data_and_load_maps_it(tmp_path: Path) -> None:
    path = _external_model(tmp_path / "a")
    msg = schema.parse_model(path.read_bytes())
    big = msg.graph.initializer[0]
    assert big.data_location == TensorProto.EXTERNAL and not big.HasField("raw_data")
    entries = {e.key: e.value for e in big.external_data}
    assert entries["location"] == "data/weights.bin" and int(entries["length"]) == 1 << 16
    assert msg.graph.initializer[1].HasField("raw_data")  # below the threshold
    e = msg.graph.encoded_initializer[0]
    assert e.data_location == TensorProto.EXTERNAL and not e.raw_data
    assert msg.graph.encoded_initializer[1].raw_data == b"\x01\x02"
    m = serde.load(path)
    t = m.graph.initializers["big"].const
    assert t.external is not None and t.external.location == "data/weights.bin"
    assert isinstance(t.raw, memoryview) and isinstance(t.raw.obj, mmap.mmap)
    np.testing.assert_array_equal(t.numpy(), np.arange(1 << 14, dtype=np.float32))
    et = m.graph.encoded_initializers["e"].const
    assert et.external is not None and bytes(et.payload) == bytes(range(256)) * 8
    # stock onnx reads the same values
    stock = onnx.load(str(path))
    np.testing.assert_array_equal(numpy_helper.to_array(stock.graph.initializer[0]), t.numpy())


def _locations(path: Path) -> set[str]:
    msg = schema.parse_model(path.read_bytes())
    tensors = list(msg.graph.initializer) + list(msg.graph.encoded_initializer)
    return {e.value for t in tensors for e in t.external_data if e.key == "location"}


def test_external_payloads_stay_external(tmp_path: Path) -> None:
    path = _external_model(tmp_path / "a")
    m = serde.load(path)
    before = (tmp_path / "a" / "data" / "weights.bin").stat()
    serde.save(m, tmp_path / "a" / "again.onnx")  # external payloads go to again.onnx.data
    after = (tmp_path / "a" / "data" / "weights.bin").stat()
    assert (before.st_mtime_ns, before.st_size) == (after.st_mtime_ns, after.st_size)
    assert _locations(tmp_path / "a" / "again.onnx") == {"again.onnx.data"}
    assert canonical.differences(path, tmp_path / "a" / "again.onnx") == []
    serde.save(m, tmp_path / "b" / "model.onnx")  # another folder: named after the model too
    assert not (tmp_path / "b" / "data").exists()
    assert _locations(tmp_path / "b" / "model.onnx") == {"model.onnx.data"}
    assert canonical.differences(path, tmp_path / "b" / "model.onnx") == []
    size = (tmp_path / "b" / "model.onnx.data").stat().st_size
    serde.save(m, tmp_path / "b" / "model.onnx")  # again: the data is rewritten, not appended to
    assert (tmp_path / "b" / "model.onnx.data").stat().st_size == size


def test_saving_a_model_over_itself_keeps_its_data_file(tmp_path: Path) -> None:
    path = _external_model(tmp_path / "a")
    serde.save(serde.load(path), tmp_path / "a" / "m.onnx")
    data = tmp_path / "a" / "m.onnx.data"
    before = data.stat()
    m = serde.load(tmp_path / "a" / "m.onnx")
    serde.save(m, tmp_path / "a" / "m.onnx")  # every reference points into m.onnx.data already
    after = data.stat()
    assert (before.st_ino, before.st_mtime_ns) == (after.st_ino, after.st_mtime_ns)
    assert canonical.differences(path, tmp_path / "a" / "m.onnx") == []


def test_rewriting_the_data_file_a_model_was_loaded_from(tmp_path: Path) -> None:
    path = _external_model(tmp_path / "a")
    expected = canonical.canonical_bytes(path)
    m = serde.load(path)
    serde.save(m, path, external_data="data/weights.bin", size_threshold=16)
    assert canonical.canonical_bytes(path) == expected
    assert not [p.name for p in (tmp_path / "a" / "data").iterdir() if p.name.endswith(".tmp")]
    # the loaded model still reads its (replaced) mapping
    np.testing.assert_array_equal(m.graph.initializers["big"].const.numpy()[:4], [0, 1, 2, 3])


def test_failed_save_leaves_existing_files_alone(tmp_path: Path) -> None:
    path = _external_model(tmp_path / "a")
    before = {p: p.read_bytes() for p in (tmp_path / "a").rglob("*") if p.is_file()}
    m = serde.load(path.read_bytes())  # external payloads not mapped: they cannot be copied
    m.graph.initializers["big"].const.raw = bytes(2 << 20)  # large: written before the failure
    with pytest.raises(ExternalDataError, match=r"encoded_initializer\['e'\].*not mapped"):
        serde.save(m, path, external_data="data/weights.bin", size_threshold=16)
    after = {p: p.read_bytes() for p in (tmp_path / "a").rglob("*") if p.is_file()}
    assert after == before


def test_external_payload_out_of_bounds_raises(tmp_path: Path) -> None:
    stock = _chain(1)
    t = stock.graph.initializer.add(name="w", data_type=TensorProto.FLOAT, dims=[4])
    t.data_location = TensorProto.EXTERNAL
    for k, v in (("location", "w.bin"), ("offset", "8"), ("length", "16")):
        t.external_data.add(key=k, value=v)
    (tmp_path / "w.bin").write_bytes(bytes(20))
    (tmp_path / "m.onnx").write_bytes(stock.SerializeToString())
    with pytest.raises(ExternalDataError, match=r"\[P5\] graph\.initializer\[0\]: offset 8"):
        serde.load(tmp_path / "m.onnx")


def test_one_file_per_tensor(tmp_path: Path) -> None:
    m = serde.load(_big_model().SerializeToString())
    serde.save(m, tmp_path / "m.onnx", external_data="w", all_tensors_to_one_file=False,
               size_threshold=8)
    msg = schema.parse_model((tmp_path / "m.onnx").read_bytes())
    locs = [{e.key: e.value for e in t.external_data}["location"] for t in msg.graph.initializer]
    assert len(set(locs)) == 2 and all((tmp_path / loc).exists() for loc in locs)
    assert canonical.differences(_big_model(), tmp_path / "m.onnx") == []


@pytest.mark.parametrize("location", ["../outside.bin", "/etc/passwd", "a/../../x.bin", "missing.bin"])
def test_unsafe_external_location_raises_before_reading(tmp_path: Path, location: str) -> None:
    stock = _chain(1)
    t = stock.graph.initializer.add(name="w", data_type=TensorProto.FLOAT, dims=[4])
    t.data_location = TensorProto.EXTERNAL
    t.external_data.add(key="location", value=location)
    (tmp_path / "outside.bin").write_bytes(bytes(16))
    folder = tmp_path / "model"
    folder.mkdir()
    path = folder / "m.onnx"
    path.write_bytes(stock.SerializeToString())
    with pytest.raises(ExternalDataError, match=r"graph\.initializer\[1\]\.external_data|P5"):
        serde.load(path)


def test_external_data_without_a_folder_keeps_the_reference(tmp_path: Path) -> None:
    path = _external_model(tmp_path / "a")
    m = serde.load(path.read_bytes())  # bytes: no folder to resolve against
    t = m.graph.initializers["big"].const
    assert t.raw is None and t.external is not None
    assert canonical.differences(path, serde.to_proto(m), model_dir_b=tmp_path / "a") == []


_HUGE_SCRIPT = textwrap.dedent("""
    import os, resource, sys
    import numpy as np
    from onnxforge.graphbuilder import serde

    def rss():
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    before = rss()
    m = serde.load(sys.argv[1])
    t = m.graph.initializers["huge"].const
    after = rss()
    print(t.nbytes, len(t.raw), after - before)
""")


def test_huge_external_model_loads_without_reading_payloads(tmp_path: Path) -> None:
    size = 3 * (1 << 30)
    stock = _chain(1)
    t = stock.graph.initializer.add(name="huge", data_type=TensorProto.FLOAT, dims=[size // 4])
    t.data_location = TensorProto.EXTERNAL
    for k, v in (("location", "huge.bin"), ("offset", "0"), ("length", str(size))):
        t.external_data.add(key=k, value=v)
    (tmp_path / "m.onnx").write_bytes(stock.SerializeToString())
    with open(tmp_path / "huge.bin", "wb") as fh:
        fh.truncate(size)  # sparse: no block is allocated
    blocks_before = os.stat(tmp_path / "huge.bin").st_blocks
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-c", _HUGE_SCRIPT, str(tmp_path / "m.onnx")],
                         capture_output=True, text=True, env=env, timeout=120, check=True)
    nbytes, viewed, grew = map(int, out.stdout.split())
    assert nbytes == viewed == size
    assert grew < 64 << 20  # the 3 GB payload was not read
    assert os.stat(tmp_path / "huge.bin").st_blocks == blocks_before
