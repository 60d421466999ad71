"""Lowerings of onnxforge's extensions: encoded initializers (affine and struct with a
decoder function), CacheUpdate, bindings and aliases. Oracles: float64 numpy from the
encoded bytes, and onnx.reference."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from onnxforge.graphbuilder.builder.graph_builder import READ_WRITE, GraphBuilder, tensor_type
from onnxforge.passes.export import non_standard_nodes, read_feedback, to_standard_onnx
from onnxforge.proto_ext.codecs.affine import choose_affine_params
from onnxforge.proto_ext.types import ArrayKind, StructType, TensorType

FLOAT, FLOAT16, INT64 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.INT64
INT8, UINT8, INT4, UINT4, INT2, UINT2 = (TensorProto.INT8, TensorProto.UINT8, TensorProto.INT4,
                                         TensorProto.UINT4, TensorProto.INT2, TensorProto.UINT2)
_BITS = {INT8: 8, UINT8: 8, INT4: 4, UINT4: 4, INT2: 2, UINT2: 2}
_SIGNED = {INT8, INT4, INT2}


def _session(proto: onnx.ModelProto) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _unpack(raw: bytes, bits: int, count: int, signed: bool) -> np.ndarray:
    """Codes packed least-significant bits first, as float64."""
    b = np.frombuffer(bytes(raw), dtype=np.uint8).astype(np.int64)
    per = 8 // bits
    codes = np.stack([(b >> (bits * i)) & ((1 << bits) - 1) for i in range(per)], axis=-1).reshape(-1)
    codes = codes[:count]
    if signed:
        codes = np.where(codes >= 1 << (bits - 1), codes - (1 << bits), codes)
    return codes.astype(np.float64)


def _affine_reference(header) -> np.ndarray:
    a = header.affine
    shape = tuple(header.logical_type.shape)
    codes = _unpack(header.raw_data, _BITS[a.storage_type], int(np.prod(shape)),
                    a.storage_type in _SIGNED).reshape(shape)
    scale = np.asarray(a.scale.array(), np.float64)
    zp = np.zeros_like(scale) if a.zero_point is None else \
        np.asarray(a.zero_point.array()).astype(np.int64).astype(np.float64)
    if a.axis is None:
        return (codes - zp) * scale
    axis = a.axis % len(shape)
    if a.block_size:
        idx = np.arange(shape[axis]) // a.block_size
        scale, zp = np.take(scale, idx, axis=axis), np.take(zp, idx, axis=axis)
    else:
        bshape = [1] * len(shape)
        bshape[axis] = -1
        scale, zp = scale.reshape(bshape), zp.reshape(bshape)
    return (codes - zp) * scale


@pytest.mark.parametrize("storage,axis,block,symmetric", [
    (INT8, None, None, True),
    (UINT8, 1, None, True),
    (INT8, 0, None, False),
    (INT4, 0, 8, True),
    (UINT4, 1, 16, True),
    (INT4, 1, 16, False),
    (INT2, 0, 8, True),
    (UINT2, 1, 4, False),
])
def test_affine_encoded_initializer(storage: int, axis: int | None, block: int | None,
                                    symmetric: bool) -> None:
    rng = np.random.default_rng(storage * 10 + (axis or 0))
    values = rng.standard_normal((24, 32)).astype(np.float32)
    scale, zp = choose_affine_params(values, storage, axis=axis, block_size=block, symmetric=symmetric)
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [3, 24])
    w = g.encoded_initializer("w", values, storage_type=storage, scale=scale, zero_point=zp,
                              axis=axis, block_size=block)
    g.output(g.op.Identity(w), "w_out")
    g.output(g.op.MatMul(x, w), "y")
    model = g.to_model()
    proto = to_standard_onnx(model)
    onnx.checker.check_model(proto, full_check=True)
    assert non_standard_nodes(proto) == []
    dq = [n for n in proto.graph.node if n.op_type == "DequantizeLinear"]
    assert len(dq) == 1 and dq[0].output[0] == "w"
    q_init = next(t for t in proto.graph.initializer if t.name == dq[0].input[0])
    assert q_init.data_type == storage and list(q_init.dims) == [24, 32]
    opset = proto.opset_import[0].version
    assert opset == (25 if storage in (INT2, UINT2) else 21)
    expected = _affine_reference(model.graph.encoded_initializers["w"].const.header)
    xv = rng.standard_normal((3, 24)).astype(np.float32)
    w_out, y = _session(proto).run(None, {"x": xv})
    assert np.abs(w_out - expected).max() <= 1e-6
    assert np.abs(y - xv.astype(np.float64) @ expected).max() <= 1e-4
    w_ref, _ = ReferenceEvaluator(proto).run(None, {"x": xv})
    assert np.abs(w_ref - expected).max() <= 1e-6


def _lin4_model():
    """A struct layout with a UINT4 array, a constant zero point and a FLOAT16 scale, and a
    decoder written for opset 21."""
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [2, 16])
    nodes = [
        helper.make_node("Cast", ["codes"], ["cf"], to=FLOAT),
        helper.make_node("Cast", ["zero"], ["zf"], to=FLOAT),
        helper.make_node("Sub", ["cf", "zf"], ["centered"]),
        helper.make_node("Cast", ["scale"], ["sf"], to=FLOAT),
        helper.make_node("Unsqueeze", ["sf", "ax"], ["scol"]),
        helper.make_node("Mul", ["centered", "scol"], ["value"]),
    ]
    nodes.insert(4, helper.make_node("Constant", [], ["ax"], value_ints=[1]))
    decoder = helper.make_function("test.decoders", "Lin4", ["codes", "zero", "scale"], ["value"],
                                   nodes, [helper.make_opsetid("", 21)])
    ref = g.declare_struct_type("Lin4", [
        ("codes", StructType(kind="array", array=ArrayKind(TensorType(UINT4, ()), 16))),
        ("zero", np.array(8, np.uint8)),
        ("scale", tensor_type(FLOAT16, [])),
    ], decoder=decoder)
    rng = np.random.default_rng(5)
    records = 16 * 12 // 16  # 12 records of 16 codes: a [16, 12] weight
    codes = rng.integers(0, 16, size=(records, 16)).astype(np.uint8)
    scales = (rng.random(records) * 0.2 + 0.05).astype(np.float16)
    payload = b"".join((codes[r, 0::2] | (codes[r, 1::2] << 4)).astype(np.uint8).tobytes()
                       + scales[r].tobytes() for r in range(records))
    w = g.encoded_initializer("w", struct_type=ref, codes=payload,
                              logical_type=tensor_type(FLOAT, [16, 12]))
    g.output(g.op.MatMul(x, w), "y")
    g.output(g.op.Identity(w), "w_out")
    expected = ((codes.astype(np.float64) - 8) * scales.astype(np.float64)[:, None]).reshape(16, 12)
    return g.to_model(), expected


@pytest.mark.parametrize("target", [None, 24, 19])
def test_struct_encoded_initializer_with_decoder_function(target: int | None) -> None:
    model, expected = _lin4_model()
    proto = to_standard_onnx(model, target_opset=target)
    onnx.checker.check_model(proto, full_check=True)
    assert non_standard_nodes(proto) == [] and len(proto.functions) == 0
    assert proto.opset_import[0].version == (target or 21)
    leaves = {t.name: t for t in proto.graph.initializer}
    codes = leaves["w.codes"]
    # packed UINT4 storage where Cast from UINT4 exists (opset 21), uint8 below
    assert codes.data_type == (UINT4 if (target or 21) >= 21 else UINT8)
    assert list(codes.dims) == [12, 16]
    x = np.random.default_rng(0).standard_normal((2, 16)).astype(np.float32)
    y, w_out = _session(proto).run(None, {"x": x})
    assert np.abs(w_out - expected).max() <= 1e-6
    assert np.abs(y - x.astype(np.float64) @ expected).max() <= 1e-5


def _cache_model(axis: int, cache_shape: list[int], values_shape: list, position_shape: list):
    g = GraphBuilder(opset=23)
    cache = g.input("cache", FLOAT, cache_shape, access=READ_WRITE)
    values = g.input("values", FLOAT, values_shape)
    pos = g.input("position", INT64, position_shape)
    out = g.op.CacheUpdate(cache, values, pos, axis=axis)
    g.output(out, "updated", type=cache.type)
    g.bind("cache", "updated")
    return g.to_model()


def _cache_reference(cache, values, position, axis):
    out = cache.copy()
    pos = np.broadcast_to(np.asarray(position).reshape(-1), (cache.shape[0],))
    n = values.shape[axis]
    for b in range(cache.shape[0]):
        idx = [slice(None)] * cache.ndim
        idx[0] = b
        idx[axis] = slice(int(pos[b]), int(pos[b]) + n)
        src = [slice(None)] * cache.ndim
        src[0] = b
        out[tuple(idx)] = values[tuple(src)]
    return out


@pytest.mark.parametrize("target,expect_op", [(24, "TensorScatter"), (23, "ScatterElements")])
@pytest.mark.parametrize("axis,cache_shape,values_shape,position", [
    (-2, [2, 3, 10, 4], [2, 3, 3, 4], np.array(4, np.int64)),
    (-2, [2, 3, 10, 4], [2, 3, 2, 4], np.array([1, 6], np.int64)),
    (1, [2, 10, 3, 4], [2, 1, 3, 4], np.array([9, 0], np.int64)),
])
def test_cache_update(target, expect_op, axis, cache_shape, values_shape, position) -> None:
    model = _cache_model(axis, cache_shape, ["B"] + values_shape[1:], list(position.shape))
    proto = to_standard_onnx(model, target_opset=target)
    onnx.checker.check_model(proto, full_check=True)
    types = [n.op_type for n in proto.graph.node]
    assert expect_op in types and "CacheUpdate" not in types
    assert read_feedback(proto) == {"cache": "updated"}
    assert [o.name for o in proto.graph.output] == ["updated"]
    rng = np.random.default_rng(2)
    cache = rng.standard_normal(cache_shape).astype(np.float32)
    values = rng.standard_normal(values_shape).astype(np.float32)
    (out,) = _session(proto).run(None, {"cache": cache, "values": values, "position": position})
    np.testing.assert_array_equal(out, _cache_reference(cache, values, position, axis))
    (ref,) = ReferenceEvaluator(proto).run(None, {"cache": cache, "values": values, "position": position})
    np.testing.assert_array_equal(ref, out)


def test_aliases_and_access_are_stripped() -> None:
    from onnxforge.graphbuilder import serde

    model = _cache_model(-2, [1, 2, 8, 4], [1, 2, 1, 4], [])
    proto = to_standard_onnx(model)
    again = serde.load(proto)
    assert all(v.access == 0 for v in again.graph.inputs)
    assert all(v.alias_of is None for v in again.graph.outputs)
    assert all(not n.output_alias for n in again.graph)
    assert not again.graph.bindings and not again.struct_types
    assert {op.domain for op in proto.opset_import} == {""}
