"""Bad input gets a typed error with a clear message: never a crash, a hang or silent acceptance."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, numpy_helper

import onnxforge as of
from onnxforge.errors import CodecError, OnnxforgeError, WireError
from onnxforge.proto_ext import schema
from tests.proto_ext.test_schema import _every_extension_model


def _affine_model(dims, payload, storage=TensorProto.INT8):
    m = schema.ModelProto(ir_version=10)
    m.opset_import.add(domain="", version=21)
    e = m.graph.encoded_initializer.add(name="q")
    e.affine.storage_type = storage
    e.affine.scale.CopyFrom(schema.from_onnx(numpy_helper.from_array(np.float32(0.5), "")))
    e.logical_type.tensor_type.elem_type = TensorProto.FLOAT
    for d in dims:
        e.logical_type.tensor_type.shape.dim.add(dim_value=d)
    e.raw_data = payload
    return m


def test_dims_that_overflow_are_a_violation_not_a_wrap():
    m = _affine_model([2**62, 2**62, 16], b"\x00" * 4)
    violations = of.check(m)
    assert violations and {v.rule for v in violations} <= {"A8", "S2", "P6", "A2"}
    with pytest.raises(OnnxforgeError):
        of.decode_value(m, "q")


@pytest.mark.parametrize("payload", [b"\x01\x02\x03", b"\x01\x02\x03\x04\x05"])
def test_payload_shorter_or_longer_than_declared(payload):
    m = _affine_model([4], payload)
    assert [v.rule for v in of.check(m)] == ["A8"]
    with pytest.raises(CodecError, match="4 INT8 codes|need exactly 4"):
        of.decode_value(m, "q")


def test_unknown_enum_values_are_reported():
    m = _every_extension_model(True)
    data = bytearray(m.SerializeToString())
    # rewrite ValueAliasProto.kind = 1 (bytes 18 01) to kind = 9
    alias = schema.ValueAliasProto(output_index=0, input_index=0, kind=1).SerializeToString()
    bad = alias[:-1] + b"\x09"
    assert data.count(alias) == 1
    data = data.replace(alias, bad)
    violations = of.check(bytes(data))
    assert any(v.rule == "W1" and "kind" in v.path and "9" in v.message for v in violations)


def test_verify_raises_verification_error_with_rule_and_path():
    m = _affine_model([4], b"\x01\x02\x03")
    with pytest.raises(of.VerificationError) as info:
        of.verify(m)
    assert info.value.rules == ["A8"]
    assert "graph.encoded_initializer['q']" in str(info.value)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_mutated_bytes_never_crash(data):
    base = _every_extension_model(False).SerializeToString()
    buf = bytearray(base)
    for _ in range(data.draw(st.integers(1, 6))):
        op = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        pos = data.draw(st.integers(0, max(0, len(buf) - 1)))
        if op == "flip" and buf:
            buf[pos] = data.draw(st.integers(0, 255))
        elif op == "cut":
            del buf[pos:pos + data.draw(st.integers(1, 8))]
        else:
            buf[pos:pos] = bytes(data.draw(st.lists(st.integers(0, 255), min_size=1, max_size=4)))
    try:
        violations = of.check(bytes(buf))
    except (WireError, OnnxforgeError):
        return
    for v in violations:
        assert v.rule and v.path and v.message
    for name in ("w", "q"):
        try:
            of.decode_value(bytes(buf), name)
        except OnnxforgeError:
            pass
