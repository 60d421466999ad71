"""Struct-record codecs and the values specification's worked examples (exact bytes)."""
from __future__ import annotations

import struct

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxforge as of
from onnxforge.errors import CodecError
from onnxforge.proto_ext import schema
from onnxforge.proto_ext.catalogue import Catalogue
from onnxforge.proto_ext.codecs.records import read_fields
from onnxforge.proto_ext.codecs.registry import register_decoder, unregister_decoder
from onnxforge.proto_ext.convert import struct_from_proto
from onnxforge.proto_ext.sizes import record_layout


# -- builders (extended protobuf) ---------------------------------------------------------

def _scalar_type(msg, elem):
    msg.tensor_type.elem_type = elem
    msg.tensor_type.shape.SetInParent()


def _array_field(st, name, elem, n):
    f = st.structure.field.add(name=name)
    arr = f.type.struct_type.array
    _scalar_type(arr.element_type, elem)
    arr.dimension = n
    return f


def _scalar_field(st, name, elem):
    f = st.structure.field.add(name=name)
    _scalar_type(f.type, elem)


def _const_field(st, name, value):
    f = st.structure.field.add(name=name)
    f.constant.CopyFrom(schema.from_onnx(numpy_helper.from_array(np.asarray(value))))


def _model(*decls):
    m = schema.ModelProto(ir_version=10)
    m.opset_import.add(domain="", version=21)
    for d in decls:
        m.struct_types.add().CopyFrom(d)
    m.graph.name = "g"
    return m


def _encoded(m, name, type_ref, payload, logical_len=None):
    e = m.graph.encoded_initializer.add(name=name)
    e.struct_type.type_ref = type_ref
    if logical_len is not None:
        e.logical_type.tensor_type.elem_type = TensorProto.FLOAT
        e.logical_type.tensor_type.shape.dim.add(dim_value=logical_len)
    e.raw_data = payload
    return e


def int4_block_decl():
    st = schema.StructTypeProto(type_id=2001, name="Int4Block")
    _array_field(st, "codes", TensorProto.INT4, 32)
    _scalar_field(st, "scale", TensorProto.FLOAT)
    return st


def linear_decls():
    fixed = schema.StructTypeProto(type_id=1003, name="LINEAR_INT4_128_FIXED_PARAMETERS")
    _array_field(fixed, "values", TensorProto.INT4, 128)
    _const_field(fixed, "scale", np.float32(0.25))
    _const_field(fixed, "zero_point", np.int64(-2))
    params = schema.StructTypeProto(type_id=1002, name="LINEAR_INT4_128_WITH_PARAMETERS")
    _array_field(params, "values", TensorProto.INT4, 128)
    _scalar_field(params, "scale", TensorProto.FLOAT)
    _scalar_field(params, "zero_point", TensorProto.INT64)
    return fixed, params


def codebook_decls():
    sub = schema.StructTypeProto(type_id=1101, name="CODEBOOK2_BLOCK_32")
    codes = sub.structure.field.add(name="codes")
    bp = codes.type.struct_type.bit_packing
    bp.component.add(name="index", bit_width=2)
    bp.dimension = 32
    _const_field(sub, "codebook", np.array([-1.0, -0.25, 0.25, 1.0], np.float32))
    parent = schema.StructTypeProto(type_id=1102, name="SCALED_CODEBOOK2_BLOCK_32")
    q = parent.structure.field.add(name="quantized")
    q.type.struct_type.type_ref = 1101
    _scalar_field(parent, "scale", TensorProto.FLOAT)
    return sub, parent


def _pack_int4(codes):
    """Pack with onnx's own TensorProto packing (independent of our bit packer)."""
    import ml_dtypes

    return numpy_helper.from_array(np.asarray(codes, dtype=np.int8).astype(ml_dtypes.int4)).raw_data


# -- Int4Block ------------------------------------------------------------------------------

def _int4_block_payload(rng, n_records):
    codes = rng.integers(-8, 8, size=(n_records, 32))
    scales = rng.uniform(0.01, 1.0, size=n_records).astype(np.float32)
    payload = b"".join(_pack_int4(codes[r]) + struct.pack("<f", scales[r]) for r in range(n_records))
    expected = (codes.astype(np.float64) * scales.astype(np.float64)[:, None]).reshape(-1)
    return payload, expected


@pytest.mark.parametrize("n_records,nbytes", [(128, 2560), (256, 5120)])
def test_int4_block_records_and_decode(n_records, nbytes):
    rng = np.random.default_rng(n_records)
    payload, expected = _int4_block_payload(rng, n_records)
    assert len(payload) == nbytes
    m = _model(int4_block_decl())
    _encoded(m, "w", 2001, payload, n_records * 32)
    of.verify(m)
    cat = Catalogue([struct_from_proto(s) for s in m.struct_types])
    layout = record_layout(struct_from_proto(m.graph.encoded_initializer[0].struct_type), cat)
    assert layout.bytes == 20 and len(payload) // layout.bytes == n_records
    got = of.decode_value(m, "w")
    assert got.dtype == np.float32 and got.shape == (n_records * 32,)
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_two_values_share_one_type_with_different_lengths():
    rng = np.random.default_rng(0)
    p1, e1 = _int4_block_payload(rng, 128)
    p2, e2 = _int4_block_payload(rng, 256)
    m = _model(int4_block_decl())
    _encoded(m, "a", 2001, p1, 4096)
    _encoded(m, "b", 2001, p2, 8192)
    of.verify(m)
    np.testing.assert_allclose(of.decode_value(m, "a"), e1, rtol=1e-6)
    np.testing.assert_allclose(of.decode_value(m, "b"), e2, rtol=1e-6)


# -- types 1003 / 1002 ------------------------------------------------------------------

def test_linear_fixed_and_with_parameters():
    rng = np.random.default_rng(3)
    fixed, params = linear_decls()
    m = _model(fixed, params)
    ca, cb, c1, c2 = (rng.integers(-8, 8, 128) for _ in range(4))
    _encoded(m, "weight_a", 1003, _pack_int4(ca), 128)
    _encoded(m, "weight_b", 1003, _pack_int4(cb), 128)
    p1 = _pack_int4(c1) + struct.pack("<f", 0.125) + struct.pack("<q", 0)
    p2 = _pack_int4(c2) + struct.pack("<f", 0.25) + struct.pack("<q", -2)
    assert (len(_pack_int4(ca)), len(p1)) == (64, 76)
    _encoded(m, "weight_c", 1002, p1, 128)
    _encoded(m, "weight_d", 1002, p2, 128)
    of.verify(m)
    np.testing.assert_array_equal(of.decode_value(m, "weight_a"), (ca + 2) * 0.25)
    np.testing.assert_array_equal(of.decode_value(m, "weight_b"), (cb + 2) * 0.25)
    np.testing.assert_array_equal(of.decode_value(m, "weight_c"), c1 * 0.125)
    np.testing.assert_array_equal(of.decode_value(m, "weight_d"), (c2 + 2) * 0.25)


def test_unaligned_int64_field_is_read_little_endian():
    # the INT64 zero point of type 1002 starts at byte 68: not 8-aligned in a 76-byte record
    _, params = linear_decls()
    m = _model(params)
    codes = np.zeros(128, dtype=np.int64)
    payload = (_pack_int4(codes) + struct.pack("<f", 1.0) + struct.pack("<q", -123456789012)) * 3
    _encoded(m, "v", 1002, payload)
    fields = of.decode_value(m, "v")  # no logical type: dict of field arrays
    assert isinstance(fields, dict)
    assert fields["zero_point"].tolist() == [-123456789012] * 3
    assert fields["scale"].tolist() == [1.0] * 3
    assert fields["values"].shape == (3, 128) and fields["values"].dtype == np.int8


# -- codebook 1101 / 1102 --------------------------------------------------------------------

def test_codebook_exact_bytes():
    sub, parent = codebook_decls()
    m = _model(sub, parent)
    payload = bytes.fromhex("E4E4E4E4E4E4E4E4" "00000040")
    assert len(payload) == 12
    _encoded(m, "cb", 1102, payload, 32)
    of.verify(m)
    got = of.decode_value(m, "cb")
    np.testing.assert_array_equal(got, np.tile(np.array([-2.0, -0.5, 0.5, 2.0], np.float32), 8))


def test_codebook_128_records():
    sub, parent = codebook_decls()
    m = _model(sub, parent)
    rng = np.random.default_rng(5)
    idx = rng.integers(0, 4, size=(128, 32))
    scales = rng.uniform(0.5, 2.0, 128).astype(np.float32)
    payload = b""
    for r in range(128):
        packed = bytes(int(sum(int(idx[r, 4 * b + k]) << (2 * k) for k in range(4))) for b in range(8))
        payload += packed + struct.pack("<f", scales[r])
    assert len(payload) == 1536
    _encoded(m, "cb", 1102, payload, 4096)
    of.verify(m)
    table = np.array([-1.0, -0.25, 0.25, 1.0])
    expected = (table[idx] * scales.astype(np.float64)[:, None]).reshape(-1)
    np.testing.assert_allclose(of.decode_value(m, "cb"), expected, rtol=1e-6)
    cat = Catalogue([struct_from_proto(s) for s in m.struct_types])
    assert record_layout(struct_from_proto(m.struct_types[1]), cat).bytes == 12
    assert record_layout(struct_from_proto(m.struct_types[0]), cat).bytes == 8


# -- generic access, registry, decoder functions ------------------------------------------------

def test_missing_decoder_fails_explicitly():
    st = schema.StructTypeProto(type_id=7, name="Unregistered")
    _array_field(st, "codes", TensorProto.UINT8, 4)
    m = _model(st)
    _encoded(m, "x", 7, bytes(8), 8)
    of.verify(m)  # loading / verifying runs no codec code
    with pytest.raises(CodecError, match="no registered decoder"):
        of.decode_value(m, "x")


def test_registered_decoder_checks_declaration_structure():
    calls = []

    @register_decoder("TestFmt", {"codes": (TensorProto.UINT8, (4,))})
    def _dec(fields, n, layout):
        calls.append(n)
        return fields["codes"].astype(np.float32) * 2

    try:
        st = schema.StructTypeProto(type_id=9, name="TestFmt")
        _array_field(st, "codes", TensorProto.UINT8, 4)
        m = _model(st)
        _encoded(m, "x", 9, bytes([1, 2, 3, 4, 5, 6, 7, 8]), 8)
        np.testing.assert_array_equal(of.decode_value(m, "x"), np.arange(1, 9) * 2)
        assert calls == [2]
        # same name, another layout: refused before decoding
        st2 = schema.StructTypeProto(type_id=9, name="TestFmt")
        _array_field(st2, "codes", TensorProto.INT8, 4)
        m2 = _model(st2)
        _encoded(m2, "x", 9, bytes(8), 8)
        with pytest.raises(CodecError, match="expects 'codes' of element type UINT8"):
            of.decode_value(m2, "x")
        assert calls == [2]
    finally:
        unregister_decoder("TestFmt")


def test_decoder_function_runs_with_dotted_leaf_names():
    # decoder: scale * codes  (inputs: codes [R, 4] int8, scale [R])
    fn = helper.make_function(
        "test", "DecodeScaled", ["codes", "scale"], ["out"],
        [helper.make_node("Cast", ["codes"], ["cf"], to=TensorProto.FLOAT),
         helper.make_node("Unsqueeze", ["scale", "ax"], ["s2"]),
         helper.make_node("Mul", ["cf", "s2"], ["out"])],
        [helper.make_opsetid("", 21)])
    ax = helper.make_node("Constant", [], ["ax"], value=numpy_helper.from_array(np.array([1], np.int64)))
    fn.node.insert(0, ax)
    st = schema.StructTypeProto(type_id=11, name="FnScaled")
    _array_field(st, "codes", TensorProto.INT8, 4)
    _scalar_field(st, "scale", TensorProto.FLOAT)
    st.decoder.CopyFrom(schema.from_onnx(fn))
    m = _model(st)
    payload = bytes([1, 2, 0xFF, 4]) + struct.pack("<f", 0.5) + bytes([5, 6, 7, 8]) + struct.pack("<f", 2.0)
    _encoded(m, "x", 11, payload, 8)
    of.verify(m)
    np.testing.assert_array_equal(of.decode_value(m, "x"),
                                  np.array([0.5, 1.0, -0.5, 2.0, 10, 12, 14, 16], np.float32))


def test_bit_offset_fields_and_bitpacking_components():
    # record: flag BOOL? no: bit_packing {a:3, b:5} x 2 then a FLOAT at bit offset 16 then INT4[3] + UINT4
    st = schema.StructTypeProto(type_id=21, name="Mixed")
    bp = st.structure.field.add(name="packed").type.struct_type.bit_packing
    bp.component.add(name="a", bit_width=3)
    bp.component.add(name="b", bit_width=5)
    bp.dimension = 2
    _array_field(st, "n", TensorProto.INT4, 3)
    _scalar_field(st, "f", TensorProto.FLOAT)
    _array_field(st, "u", TensorProto.UINT4, 1)
    cat = Catalogue([struct_from_proto(st)])
    layout = record_layout(struct_from_proto(st), cat)
    assert layout.bits == 16 + 12 + 32 + 4 and layout.bytes == 8
    rng = np.random.default_rng(9)
    recs, want = [], []
    for _ in range(5):
        a = rng.integers(0, 8, 2)
        b = rng.integers(0, 32, 2)
        n = rng.integers(-8, 8, 3)
        f = np.float32(rng.normal())
        u = int(rng.integers(0, 16))
        bits = 0
        pos = 0
        for k in range(2):
            bits |= int(a[k]) << pos
            pos += 3
            bits |= int(b[k]) << pos
            pos += 5
        for v in n:
            bits |= (int(v) & 0xF) << pos
            pos += 4
        bits |= struct.unpack("<I", struct.pack("<f", f))[0] << pos
        pos += 32
        bits |= u << pos
        recs.append(bits.to_bytes(8, "little"))
        want.append((a, b, n, f, u))
    fields = read_fields(b"".join(recs), layout)
    assert fields["packed.a"].dtype == np.uint8 and fields["packed.a"].shape == (5, 2)
    for r, (a, b, n, f, u) in enumerate(want):
        assert fields["packed.a"][r].tolist() == a.tolist()
        assert fields["packed.b"][r].tolist() == b.tolist()
        assert fields["n"][r].tolist() == n.tolist()
        assert fields["f"][r] == f
        assert fields["u"][r].tolist() == [u]


def test_partial_record_is_rejected_before_decoding():
    m = _model(int4_block_decl())
    _encoded(m, "w", 2001, bytes(30), 32)
    with pytest.raises(of.VerificationError) as info:
        of.verify(m)
    assert "S5" in info.value.rules
    with pytest.raises(CodecError):
        of.decode_value(m, "w")


def test_empty_payload_is_zero_records():
    m = _model(int4_block_decl())
    _encoded(m, "w", 2001, b"")
    of.verify(m)
    fields = of.decode_value(m, "w")
    assert fields["codes"].shape == (0, 32) and fields["scale"].shape == (0,)
