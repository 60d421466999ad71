"""Typed TensorProto payloads read straight from the bytes (proto_ext/typed_data.py),
checked against stock onnx's numpy_helper."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from onnxforge.proto_ext.convert import tensor_proto_to_numpy
from onnxforge.proto_ext.errors import CodecError
from onnxforge.proto_ext.typed_data import decode_typed

_TYPES = {TensorProto.FLOAT: np.float32, TensorProto.DOUBLE: np.float64,
          TensorProto.INT32: np.int32, TensorProto.INT64: np.int64}


def _stock(data: bytes) -> np.ndarray:
    t = onnx.TensorProto()
    t.ParseFromString(data)
    return numpy_helper.to_array(t)


@st.composite
def _typed(draw) -> bytes:
    dtype = draw(st.sampled_from(sorted(_TYPES)))
    dims = draw(st.lists(st.integers(0, 4), max_size=3))
    n = int(np.prod(dims, dtype=np.int64))
    if dtype in (TensorProto.FLOAT, TensorProto.DOUBLE):
        vals = draw(st.lists(st.floats(allow_nan=False, width=32 if dtype == TensorProto.FLOAT else 64),
                             min_size=n, max_size=n))
    else:
        info = np.iinfo(_TYPES[dtype])
        vals = draw(st.lists(st.integers(int(info.min), int(info.max)), min_size=n, max_size=n))
    t = helper.make_tensor(draw(st.sampled_from(["", "w"])), dtype, dims, vals)
    if draw(st.booleans()):
        t.doc_string = "doc"
    return t.SerializeToString()


@settings(max_examples=200, deadline=None)
@given(_typed())
def test_typed_payloads_decode_as_stock_onnx_does(data: bytes):
    got = decode_typed(data)
    want = _stock(data)
    assert got is not None
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    assert not got.flags.writeable


@settings(max_examples=200, deadline=None)
@given(_typed(), st.data())
def test_cut_or_corrupted_bytes_give_none_or_the_stock_value(data: bytes, draw):
    cut = draw.draw(st.integers(0, len(data)))
    flip = draw.draw(st.integers(0, max(0, cut - 1)))
    broken = bytearray(data[:cut])
    if broken:
        broken[flip] ^= draw.draw(st.integers(1, 255))
    got = decode_typed(bytes(broken))
    if got is None:
        return
    want = _stock(bytes(broken))  # whatever the fast path reads, stock onnx reads the same
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_other_layouts_are_left_to_stock_onnx():
    raw = numpy_helper.from_array(np.arange(3, dtype=np.float32), "r")  # raw_data
    strings = helper.make_tensor("s", TensorProto.STRING, [1], [b"a"])
    halves = helper.make_tensor("h", TensorProto.FLOAT16, [2], [1.0, 2.0])
    wrong_count = onnx.TensorProto(name="c", data_type=TensorProto.FLOAT, dims=[3], float_data=[1.0, 2.0])
    external = helper.make_tensor("e", TensorProto.FLOAT, [1], [1.0])
    external.data_location = TensorProto.EXTERNAL
    for t in (raw, strings, halves, wrong_count, external):
        assert decode_typed(t.SerializeToString()) is None, t.name
    # the stock path still reports a payload that does not match dims
    with pytest.raises(CodecError, match="cannot decode"):
        tensor_proto_to_numpy(wrong_count.SerializeToString())
    np.testing.assert_array_equal(tensor_proto_to_numpy(halves.SerializeToString()),
                                  np.array([1.0, 2.0], np.float16))


@pytest.mark.parametrize("dtype, field", [(TensorProto.INT64, 7), (TensorProto.INT32, 5)])
def test_varints_wider_than_the_field_keep_its_low_bits_as_protobuf_does(dtype, field):
    # dims [2]; two 10-byte varints with bits set past bit 63
    wide = b"\xff" * 9 + b"\x7f"
    payload = wide + b"\x81\x80\x80\x80\x90\x80\x80\x80\x80\x01"
    data = bytes([0x08, 0x02, 0x10, dtype, (field << 3) | 2, len(payload)]) + payload
    got = decode_typed(data)
    want = _stock(data)
    assert got is not None and got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
