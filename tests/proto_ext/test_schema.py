"""Wire compatibility of the extended schema with stock onnx (issue: proto_ext foundation 2a-2c)."""
from __future__ import annotations

import glob
import os
import struct

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxforge.errors import WireError
from onnxforge.proto_ext import schema

DATA = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")
STOCK_MODELS = sorted(glob.glob(os.path.join(DATA, "*", "*", "model.onnx")))


def test_stock_corpus_is_present():
    assert len(STOCK_MODELS) >= 100


@pytest.mark.parametrize("path", STOCK_MODELS, ids=lambda p: os.path.relpath(p, DATA))
def test_stock_model_round_trips_byte_identically(path):
    with open(path, "rb") as fh:
        data = fh.read()
    ext = schema.parse_model(data)
    assert ext.SerializeToString() == data
    # and the stock reading agrees field by field
    assert schema.to_onnx(ext) == onnx.load_from_string(data)


def _every_extension_model(stock_checkable: bool) -> "schema.ModelProto":
    """A model using every extension kind.

    With ``stock_checkable`` the stock-visible graph stays well-formed (the encoded
    initializer's name is also a graph input, no struct-typed graph value), so the
    stock checker accepts it.
    """
    m = schema.ModelProto(ir_version=10, producer_name="test")
    m.opset_import.add(domain="", version=21)
    m.opset_import.add(domain="ai.onnxforge", version=1)
    block = m.struct_types.add(type_id=2001, name="Int4Block")
    codes = block.structure.field.add(name="codes")
    arr = codes.type.struct_type.array
    arr.element_type.tensor_type.elem_type = TensorProto.INT4
    arr.element_type.tensor_type.shape.SetInParent()
    arr.dimension = 32
    scale = block.structure.field.add(name="scale")
    scale.type.tensor_type.elem_type = TensorProto.FLOAT
    scale.type.tensor_type.shape.SetInParent()

    g = m.graph
    g.name = "g"
    enc = g.encoded_initializer.add(name="w")
    enc.struct_type.type_ref = 2001
    enc.logical_type.tensor_type.elem_type = TensorProto.FLOAT
    enc.logical_type.tensor_type.shape.dim.add(dim_value=64)
    enc.raw_data = bytes(40)
    q = g.encoded_initializer.add(name="q")
    q.affine.storage_type = TensorProto.INT8
    q.affine.scale.CopyFrom(schema.from_onnx(numpy_helper.from_array(np.float32(0.5), "")))
    q.logical_type.tensor_type.elem_type = TensorProto.FLOAT
    q.logical_type.tensor_type.shape.dim.add(dim_value=4)
    q.raw_data = bytes([1, 2, 3, 4])

    cache = g.input.add(name="cache")
    cache.type.tensor_type.elem_type = TensorProto.FLOAT
    for d in (1, 8, 4):
        cache.type.tensor_type.shape.dim.add(dim_value=d)
    cache.access = schema.READ_WRITE
    for name, dims in (("values", (1, 1, 4)), ("position", ())):
        vi = g.input.add(name=name)
        vi.type.tensor_type.elem_type = TensorProto.FLOAT if name == "values" else TensorProto.INT64
        vi.type.tensor_type.shape.SetInParent()
        for d in dims:
            vi.type.tensor_type.shape.dim.add(dim_value=d)
    node = g.node.add(op_type="CacheUpdate", domain="ai.onnxforge", name="upd",
                      input=["cache", "values", "position"], output=["updated"])
    node.output_alias.add(output_index=0, input_index=0, kind=schema.MUST_ALIAS)
    out = g.output.add(name="updated")
    out.type.CopyFrom(cache.type)
    out.alias_of = "cache"
    g.persistent_bindings.add(input_name="cache", output_name="updated")
    if stock_checkable:
        for name, dims in (("w", (64,)), ("q", (4,))):
            vi = g.input.add(name=name)
            vi.type.tensor_type.elem_type = TensorProto.FLOAT
            vi.type.tensor_type.shape.dim.add(dim_value=dims[0])
        g.node.add(op_type="Identity", input=["q"], output=["q_out"])
        qo = g.output.add(name="q_out")
        qo.type.tensor_type.elem_type = TensorProto.FLOAT
        qo.type.tensor_type.shape.dim.add(dim_value=4)
    else:
        sv = g.output.add(name="w")
        sv.type.struct_type.type_ref = 2001
    return m


@pytest.mark.parametrize("checkable", [True, False])
def test_extensions_survive_stock_onnx_save_load(tmp_path, checkable):
    m = _every_extension_model(checkable)
    data = m.SerializeToString()
    stock = onnx.load_from_string(data)
    path = tmp_path / "m.onnx"
    onnx.save(stock, path)
    again = path.read_bytes()
    assert again == data
    back = schema.parse_model(again)
    assert back == m
    assert back.struct_types[0].name == "Int4Block"
    assert back.graph.encoded_initializer[0].struct_type.type_ref == 2001
    assert back.graph.input[0].access == schema.READ_WRITE
    assert back.graph.node[0].output_alias[0].kind == schema.MUST_ALIAS
    assert back.graph.output[0].alias_of == "cache"
    assert (back.graph.persistent_bindings[0].input_name,
            back.graph.persistent_bindings[0].output_name) == ("cache", "updated")


def test_stock_checker_accepts_well_formed_extended_model():
    stock = schema.to_onnx(_every_extension_model(True))
    onnx.checker.check_model(stock, full_check=True)


def test_stock_checker_rejects_struct_typed_graph_value():
    stock = schema.to_onnx(_every_extension_model(False))
    with pytest.raises(onnx.checker.ValidationError, match="Unrecognized type value case"):
        onnx.checker.check_model(stock, full_check=True)


def test_stock_checker_rejects_name_defined_only_by_encoded_initializer():
    m = _every_extension_model(True)
    del m.graph.input[3:]  # drop the graph inputs that also declare w and q
    stock = schema.to_onnx(m)
    with pytest.raises(onnx.checker.ValidationError, match="is not output of any previous nodes"):
        onnx.checker.check_model(stock, full_check=True)


# --- hand-encoded wire bytes pin the field numbers ---------------------------------

def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _key(field: int, wire: int) -> bytes:
    return _varint(field << 3 | wire)


def _ld(field: int, payload: bytes) -> bytes:
    return _key(field, 2) + _varint(len(payload)) + payload


def _vi(field: int, value: int) -> bytes:
    return _key(field, 0) + _varint(value)


def test_hand_encoded_wire_bytes_pin_field_numbers():
    # StructTypeProto: structure(2){ field(1){ name(1)="s", type(2)=TypeProto{tensor_type(1){elem_type(1)=1}} } },
    # name(7), type_id(10)
    tensor_float = _ld(1, _vi(1, TensorProto.FLOAT) + _ld(2, b""))
    st_field = _ld(1, b"s") + _ld(2, tensor_float)
    struct_decl = _ld(2, _ld(1, st_field)) + _ld(7, b"S") + _vi(10, 77)
    # EncodedValueProto: struct_type(2){type_ref(4)=77}, raw_data(4), name(7)
    encoded = _ld(2, _vi(4, 77)) + _ld(4, struct.pack("<f", 1.5)) + _ld(7, b"e")
    affine = _ld(1, _vi(1, TensorProto.INT4) + _vi(4, 0) + _vi(5, 32))
    encoded_affine = affine + _vi(6, 1) + _ld(7, b"a")
    binding = _ld(1, b"in") + _ld(2, b"out")
    alias = _vi(1, 0) + _vi(2, 0) + _vi(3, 1)
    node = _ld(1, b"in") + _ld(2, b"out") + _ld(4, b"CacheUpdate") + _ld(1000, alias)
    vi_in = _ld(1, b"in") + _vi(1000, 1)
    vi_out = _ld(1, b"out") + _ld(2, _ld(1000, _vi(4, 77))) + _ld(1001, b"in")
    graph = (_ld(1, node) + _ld(11, vi_in) + _ld(12, vi_out)
             + _ld(1000, encoded) + _ld(1000, encoded_affine) + _ld(1001, binding))
    model = _vi(1, 10) + _ld(7, graph) + _ld(1000, struct_decl)

    m = schema.parse_model(model)
    assert m.struct_types[0].type_id == 77
    assert m.struct_types[0].name == "S"
    assert m.struct_types[0].structure.field[0].type.tensor_type.elem_type == TensorProto.FLOAT
    e = m.graph.encoded_initializer[0]
    assert e.struct_type.type_ref == 77 and e.name == "e"
    assert struct.unpack("<f", e.raw_data) == (1.5,)
    a = m.graph.encoded_initializer[1]
    assert a.affine.storage_type == TensorProto.INT4 and a.affine.axis == 0
    assert a.affine.block_size == 32 and a.data_location == TensorProto.EXTERNAL
    b = m.graph.persistent_bindings[0]
    assert (b.input_name, b.output_name) == ("in", "out")
    al = m.graph.node[0].output_alias[0]
    assert (al.output_index, al.input_index, al.kind) == (0, 0, schema.MUST_ALIAS)
    assert m.graph.input[0].access == schema.READ_WRITE
    assert m.graph.output[0].alias_of == "in"
    assert m.graph.output[0].type.struct_type.type_ref == 77
    # and writing it again gives the same bytes
    assert m.SerializeToString() == model


@pytest.mark.parametrize("data", [b"\x0a", b"\xff\xff\xff", b"\x3a\x05abc", bytes(range(256))])
def test_garbage_bytes_raise_wire_error(data):
    with pytest.raises(WireError):
        schema.parse_model(data)


def test_truncated_model_raises_wire_error():
    data = schema.to_onnx(_every_extension_model(True)).SerializeToString()
    for cut in (len(data) // 3, len(data) - 1):
        with pytest.raises(WireError):
            schema.parse_model(data[:cut])
