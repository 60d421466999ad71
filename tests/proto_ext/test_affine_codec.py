"""The affine codec against onnx.reference DequantizeLinear / QuantizeLinear.

The code tensors are packed by ``onnx.numpy_helper`` and the reference runs the
standard operators, so every expected value comes from onnx, not from the codec.
"""
from __future__ import annotations

import zlib
from typing import Optional

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from onnxforge.errors import CodecError
from onnxforge.proto_ext.codecs.affine import (
    STORAGE_BITS,
    affine_decode,
    affine_encode,
    choose_affine_params,
    dequantize_codes,
    quantize_codes,
    storage_range,
)

STORAGE_TYPES = [
    TensorProto.INT8,
    TensorProto.UINT8,
    TensorProto.INT4,
    TensorProto.UINT4,
    TensorProto.INT2,
    TensorProto.UINT2,
]
NP_STORAGE = {
    TensorProto.INT8: np.int8,
    TensorProto.UINT8: np.uint8,
    TensorProto.INT4: ml_dtypes.int4,
    TensorProto.UINT4: ml_dtypes.uint4,
    TensorProto.INT2: ml_dtypes.int2,
    TensorProto.UINT2: ml_dtypes.uint2,
}
RANGES = {
    TensorProto.INT8: (-128, 127),
    TensorProto.UINT8: (0, 255),
    TensorProto.INT4: (-8, 7),
    TensorProto.UINT4: (0, 15),
    TensorProto.INT2: (-2, 1),
    TensorProto.UINT2: (0, 3),
}
# (shape, axis, block_size); odd element counts leave padding bits in the last byte.
LAYOUTS = {
    "per_tensor": ((3, 5, 7), None, None),
    "per_axis": ((3, 5, 7), 1, None),
    "per_axis_negative": ((4, 3, 5), -1, None),
    "blocked_exact": ((6, 8), 1, 4),
    "blocked_partial": ((3, 11, 3), 1, 4),
    "blocked_partial_negative": ((7, 5), -2, 3),
}


def _seed(*parts: object) -> int:
    return zlib.crc32(repr(parts).encode())


def _opset(storage_type: int) -> int:
    return 25 if storage_type in (TensorProto.INT2, TensorProto.UINT2) else 21


def _param_shape(shape: tuple[int, ...], axis: Optional[int], block_size: Optional[int]) -> tuple[int, ...]:
    if axis is None:
        return ()
    if block_size is None:
        return (shape[axis],)
    dims = list(shape)
    dims[axis] = -(-dims[axis] // block_size)
    return tuple(dims)


def _expand(param: np.ndarray, shape: tuple[int, ...], axis: Optional[int], block_size: Optional[int]) -> np.ndarray:
    """The per-element parameter (test-side, from the layout definition)."""
    if axis is None:
        return np.broadcast_to(param, shape)
    a = axis % len(shape)
    if block_size is None:
        return np.broadcast_to(param.reshape([-1 if i == a else 1 for i in range(len(shape))]), shape)
    idx = np.arange(shape[a]) // block_size
    return np.take(param, idx, axis=a)


def _attrs(axis: Optional[int], block_size: Optional[int]) -> dict[str, int]:
    attrs: dict[str, int] = {}
    if axis is not None:
        attrs["axis"] = axis
    if block_size is not None:
        attrs["block_size"] = block_size
    return attrs


def _run_dequantize(
    codes: np.ndarray,
    scale: np.ndarray,
    zero_point: Optional[np.ndarray],
    axis: Optional[int],
    block_size: Optional[int],
    opset: int,
) -> tuple[bytes, np.ndarray]:
    """Return (onnx's packed raw_data of the codes, reference DequantizeLinear output)."""
    x_tensor = numpy_helper.from_array(codes, "x")
    inits = [x_tensor, numpy_helper.from_array(scale, "s")]
    inputs = ["x", "s"]
    if zero_point is not None:
        inits.append(numpy_helper.from_array(zero_point, "z"))
        inputs.append("z")
    node = helper.make_node("DequantizeLinear", inputs, ["y"], **_attrs(axis, block_size))
    out_type = helper.np_dtype_to_tensor_dtype(scale.dtype)
    graph = helper.make_graph([node], "dq", [], [helper.make_tensor_value_info("y", out_type, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    (y,) = ReferenceEvaluator(model).run(None, {})
    return x_tensor.raw_data, y


def _run_quantize(
    x: np.ndarray,
    storage_type: int,
    scale: np.ndarray,
    zero_point: Optional[np.ndarray],
    axis: Optional[int],
    block_size: Optional[int],
    opset: int,
) -> np.ndarray:
    inits = [numpy_helper.from_array(scale, "s")]
    inputs = ["x", "s"]
    attrs = _attrs(axis, block_size)
    if zero_point is not None:
        inits.append(numpy_helper.from_array(zero_point, "z"))
        inputs.append("z")
    else:
        attrs["output_dtype"] = storage_type
    node = helper.make_node("QuantizeLinear", inputs, ["y"], **attrs)
    in_type = helper.np_dtype_to_tensor_dtype(x.dtype)
    graph = helper.make_graph(
        [node],
        "q",
        [helper.make_tensor_value_info("x", in_type, x.shape)],
        [helper.make_tensor_value_info("y", storage_type, x.shape)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    (y,) = ReferenceEvaluator(model).run(None, {"x": x})
    return y


def _bits_equal(a: np.ndarray, b: np.ndarray) -> None:
    assert a.dtype == b.dtype, (a.dtype, b.dtype)
    assert a.shape == b.shape, (a.shape, b.shape)
    uint = {2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
    np.testing.assert_array_equal(np.ascontiguousarray(a).view(uint), np.ascontiguousarray(b).view(uint))


def _params(rng: np.random.Generator, storage_type: int, pshape: tuple[int, ...], with_zp: bool, dtype=np.float32):
    scale = rng.uniform(0.01, 3.0, size=pshape) * rng.choice([1.0, -1.0], size=pshape, p=[0.85, 0.15])
    scale = np.asarray(scale).astype(dtype)
    zp = None
    if with_zp:
        lo, hi = RANGES[storage_type]
        zp = np.asarray(rng.integers(lo, hi + 1, size=pshape)).astype(NP_STORAGE[storage_type])
    return scale, zp


# ---- decode --------------------------------------------------------------------------


@pytest.mark.parametrize("with_zp", [False, True], ids=["no_zp", "zp"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("storage_type", STORAGE_TYPES, ids=lambda t: TensorProto.DataType.Name(t))
def test_decode_matches_reference(storage_type: int, layout: str, with_zp: bool) -> None:
    shape, axis, block_size = LAYOUTS[layout]
    rng = np.random.default_rng(_seed(storage_type, layout, with_zp))
    lo, hi = RANGES[storage_type]
    codes = rng.integers(lo, hi + 1, size=shape).astype(NP_STORAGE[storage_type])
    scale, zp = _params(rng, storage_type, _param_shape(shape, axis, block_size), with_zp)
    payload, expected = _run_dequantize(codes, scale, zp, axis, block_size, _opset(storage_type))
    assert len(payload) == -(-codes.size * STORAGE_BITS[storage_type] // 8)
    got = affine_decode(payload, storage_type, shape, scale, zp, axis, block_size)
    _bits_equal(got, expected)
    # the same payload as a memoryview and as a uint8 array
    got_mv = affine_decode(memoryview(payload), storage_type, shape, scale, zp, axis, block_size)
    got_np = affine_decode(np.frombuffer(payload, np.uint8), storage_type, shape, scale, zp, axis, block_size)
    _bits_equal(got_mv, expected)
    _bits_equal(got_np, expected)
    # unpacked codes give the same values, also as int64
    _bits_equal(dequantize_codes(codes.astype(np.int64), storage_type, scale, zp, axis, block_size), expected)


@pytest.mark.parametrize("scale_dtype", [np.float16, ml_dtypes.bfloat16, np.float64], ids=str)
@pytest.mark.parametrize("storage_type", [TensorProto.INT4, TensorProto.UINT8, TensorProto.INT2], ids=str)
def test_decode_other_scale_dtypes_match_reference(storage_type: int, scale_dtype: type) -> None:
    shape, axis, block_size = LAYOUTS["blocked_partial"]
    rng = np.random.default_rng(5)
    lo, hi = RANGES[storage_type]
    codes = rng.integers(lo, hi + 1, size=shape).astype(NP_STORAGE[storage_type])
    scale, zp = _params(rng, storage_type, _param_shape(shape, axis, block_size), True, scale_dtype)
    payload, expected = _run_dequantize(codes, scale, zp, axis, block_size, _opset(storage_type))
    got = affine_decode(payload, storage_type, shape, scale, zp, axis, block_size)
    assert got.dtype == np.dtype(scale_dtype)
    _bits_equal(got, expected)


def test_decode_out_dtype_matches_reference_output_dtype() -> None:
    rng = np.random.default_rng(9)
    shape = (4, 6)
    codes = rng.integers(-8, 8, size=shape).astype(ml_dtypes.int4)
    scale = rng.uniform(0.1, 2.0, size=(4, 2)).astype(np.float32)
    x_tensor = numpy_helper.from_array(codes, "x")
    node = helper.make_node(
        "DequantizeLinear", ["x", "s"], ["y"], axis=1, block_size=3, output_dtype=TensorProto.FLOAT16
    )
    graph = helper.make_graph(
        [node], "dq", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT16, None)],
        [x_tensor, numpy_helper.from_array(scale, "s")],
    )
    (expected,) = ReferenceEvaluator(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])).run(None, {})
    got = affine_decode(x_tensor.raw_data, TensorProto.INT4, shape, scale, axis=1, block_size=3, out_dtype=np.float16)
    _bits_equal(got, expected)


def test_decode_known_values() -> None:
    # int4 [1, -2, 3, -8, 7] (raw bytes e1 83 07), scale 0.5, zero point -1: (q + 1) * 0.5
    got = affine_decode(bytes.fromhex("e18307"), TensorProto.INT4, (5,), np.float32(0.5), np.int8(-1))
    assert got.tolist() == [1.0, -0.5, 2.0, -3.5, 4.0]
    # uint2 [0, 1, 2, 3, 3, 2, 1, 0] (e4 1b) per-axis over [2, 4], scales [1, 10]
    got = affine_decode(bytes.fromhex("e41b"), TensorProto.UINT2, (2, 4), np.array([1.0, 10.0]), axis=0)
    assert got.dtype == np.float64
    assert got.tolist() == [[0.0, 1.0, 2.0, 3.0], [30.0, 20.0, 10.0, 0.0]]


@pytest.mark.parametrize("storage_type", [TensorProto.INT4, TensorProto.UINT2, TensorProto.INT8], ids=str)
def test_rank0_tensor_matches_reference(storage_type: int) -> None:
    lo, _ = RANGES[storage_type]
    code = np.array(lo + 1).astype(NP_STORAGE[storage_type])
    scale, zp = np.float32(0.75), np.array(lo).astype(NP_STORAGE[storage_type])
    payload, expected = _run_dequantize(code, np.asarray(scale), zp, None, None, _opset(storage_type))
    got = affine_decode(payload, storage_type, (), scale, zp)
    assert got.shape == () and float(got) == 0.75
    _bits_equal(got, expected)
    x = np.array(2.6, np.float32)
    expected_q = _run_quantize(x, storage_type, np.asarray(scale), zp, None, None, _opset(storage_type))
    assert affine_encode(x, storage_type, scale, zp) == numpy_helper.from_array(expected_q).raw_data


def test_decode_empty_tensor() -> None:
    got = affine_decode(b"", TensorProto.INT4, (0, 3), np.ones((3,), np.float32), axis=1)
    assert got.shape == (0, 3) and got.dtype == np.float32


# ---- encode --------------------------------------------------------------------------


def _encode_inputs(rng, storage_type, shape, axis, block_size, with_zp, pow2_scale):
    pshape = _param_shape(shape, axis, block_size)
    scale, zp = _params(rng, storage_type, pshape, with_zp)
    if pow2_scale:
        # power-of-two scales make x / scale exact, so .5 fractions are exact ties
        scale = (2.0 ** rng.integers(-5, 3, size=pshape)).astype(np.float32)
    lo, hi = RANGES[storage_type]
    zp_full = 0 if zp is None else _expand(zp.astype(np.int64), shape, axis, block_size)
    q = rng.integers(lo - 5, hi + 6, size=shape) - zp_full
    frac = rng.choice([0.0, 0.5, -0.5, 1.5, -1.5, 0.25, -0.75, 0.49], size=shape)
    x = ((q + frac) * _expand(scale.astype(np.float64), shape, axis, block_size)).astype(np.float32)
    # far out-of-range values on both sides (still inside int32 after division)
    flat = x.reshape(-1)
    signs = np.sign(_expand(scale, shape, axis, block_size)).reshape(-1)
    at = rng.choice(flat.size, size=3, replace=False)
    flat[at] = np.float32([1e5, -1e5, 3e3]) * signs[at]
    return x, scale, zp


@pytest.mark.parametrize("pow2_scale", [True, False], ids=["ties", "random_scale"])
@pytest.mark.parametrize("with_zp", [False, True], ids=["no_zp", "zp"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("storage_type", STORAGE_TYPES, ids=lambda t: TensorProto.DataType.Name(t))
def test_encode_matches_reference(storage_type: int, layout: str, with_zp: bool, pow2_scale: bool) -> None:
    shape, axis, block_size = LAYOUTS[layout]
    rng = np.random.default_rng(_seed(storage_type, layout, with_zp, pow2_scale))
    x, scale, zp = _encode_inputs(rng, storage_type, shape, axis, block_size, with_zp, pow2_scale)
    expected = _run_quantize(x, storage_type, scale, zp, axis, block_size, _opset(storage_type))
    assert expected.dtype == np.dtype(NP_STORAGE[storage_type])
    got = affine_encode(x, storage_type, scale, zp, axis, block_size)
    assert got == numpy_helper.from_array(expected).raw_data
    codes = quantize_codes(x, storage_type, scale, zp, axis, block_size)
    assert codes.shape == x.shape
    np.testing.assert_array_equal(codes.astype(np.int64), expected.astype(np.int64))
    lo, hi = RANGES[storage_type]
    assert codes.min() == lo and codes.max() == hi  # saturation reached both ends


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float64], ids=str)
def test_encode_other_float_types_match_reference(dtype: type) -> None:
    rng = np.random.default_rng(21)
    shape, axis, block_size = LAYOUTS["blocked_partial"]
    x, scale, zp = _encode_inputs(rng, TensorProto.INT4, shape, axis, block_size, True, False)
    x = x.astype(np.float32).clip(-1000, 1000).astype(dtype)
    scale = scale.astype(dtype)
    expected = _run_quantize(x, TensorProto.INT4, scale, zp, axis, block_size, 21)
    assert affine_encode(x, TensorProto.INT4, scale, zp, axis, block_size) == numpy_helper.from_array(expected).raw_data


def test_encode_rounds_half_to_even_and_saturates() -> None:
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5, 7.5, 100.0, -100.0, np.inf, -np.inf], np.float32)
    codes = quantize_codes(x, TensorProto.INT4, np.float32(1.0))
    assert codes.tolist() == [0, 2, 2, 0, -2, -2, 4, 7, 7, -8, 7, -8]
    codes = quantize_codes(x, TensorProto.UINT4, np.float32(1.0), np.uint8(8))
    assert codes.tolist() == [8, 10, 10, 8, 6, 6, 12, 15, 15, 0, 15, 0]


# ---- properties ----------------------------------------------------------------------


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_roundtrip_within_half_scale(data: st.DataObject) -> None:
    storage_type = data.draw(st.sampled_from(STORAGE_TYPES))
    lo, hi = storage_range(storage_type)
    scale = data.draw(st.floats(1e-3, 1e3))
    zp = data.draw(st.integers(lo, hi))
    low, high = (lo - zp) * scale, (hi - zp) * scale
    x = data.draw(
        hnp.arrays(np.float64, st.integers(0, 40), elements=st.floats(low, high, allow_nan=False))
    )
    s = np.float64(scale)
    payload = affine_encode(x, storage_type, s, np.int16(zp))
    y = affine_decode(payload, storage_type, x.shape, s, np.int16(zp))
    assert np.all(np.abs(y - x) <= scale / 2 * (1 + 1e-9))


@settings(max_examples=60, deadline=None)
@given(
    storage_type=st.sampled_from(STORAGE_TYPES),
    symmetric=st.booleans(),
    x=hnp.arrays(np.float64, (4, 6), elements=st.floats(-1e3, 1e3, allow_nan=False)),
)
def test_chosen_params_cover_the_data(storage_type: int, symmetric: bool, x: np.ndarray) -> None:
    scale, zp = choose_affine_params(x, storage_type, axis=1, block_size=4, symmetric=symmetric)
    assert scale.shape == (4, 2) and scale.dtype == np.float64
    assert (zp is None) == (symmetric and storage_type in (TensorProto.INT8, TensorProto.INT4, TensorProto.INT2))
    y = affine_decode(affine_encode(x, storage_type, scale, zp, 1, 4), storage_type, x.shape, scale, zp, 1, 4)
    tol = _expand(scale, x.shape, 1, 4) / 2 * (1 + 1e-9)
    assert np.all(np.abs(y - x) <= tol)


def test_choose_affine_params_formulas() -> None:
    x = np.array([[-1.0, 0.5, 2.0], [0.0, 0.0, 0.0]], np.float32)
    s, z = choose_affine_params(x, TensorProto.INT8, axis=0)
    assert z is None and s.dtype == np.float32
    np.testing.assert_array_equal(s, np.float32([2.0 / 127, 1.0]))
    s, z = choose_affine_params(x, TensorProto.UINT4)
    assert s.shape == () and z.shape == () and int(z) == 8
    assert s == np.float32(2.0 / 7)
    s, z = choose_affine_params(x, TensorProto.UINT8, symmetric=False)
    assert s == np.float32(3.0 / 255) and int(z) == round(0 - (-1.0) / float(s))
    s, z = choose_affine_params(np.array([1.0, 3.0]), TensorProto.INT4, symmetric=False)
    assert z is not None and int(z) == -8  # min clamps to 0, zero maps to lo
    with pytest.raises(CodecError, match="NaN"):
        choose_affine_params(np.array([np.nan]), TensorProto.INT8)


# ---- errors --------------------------------------------------------------------------


def test_short_or_long_payload_raises() -> None:
    scale = np.float32(1.0)
    with pytest.raises(CodecError, match="need exactly 3"):
        affine_decode(b"\x00\x00", TensorProto.INT4, (5,), scale)
    with pytest.raises(CodecError, match="need exactly 3"):
        affine_decode(b"\x00" * 4, TensorProto.INT4, (5,), scale)
    with pytest.raises(CodecError, match="need exactly 2"):
        affine_decode(np.zeros(1, np.uint8), TensorProto.UINT2, (2, 3), scale)


def test_nonzero_padding_raises_r9() -> None:
    with pytest.raises(CodecError, match="R9"):
        affine_decode(bytes.fromhex("e18317"), TensorProto.INT4, (5,), np.float32(1.0))
    with pytest.raises(CodecError, match="R9"):
        affine_decode(bytes([0xE4, 0x1B, 0x10]), TensorProto.UINT2, (9,), np.float32(1.0))


def test_wrong_scale_or_zero_point_shape_raises() -> None:
    payload = bytes(12)  # 24 int4 codes
    with pytest.raises(CodecError, match=r"scale has shape \(4,\), expected \(6,\)"):
        affine_decode(payload, TensorProto.INT4, (4, 6), np.ones(4, np.float32), axis=1)
    with pytest.raises(CodecError, match=r"expected \(4, 2\)"):
        affine_decode(payload, TensorProto.INT4, (4, 6), np.ones((4, 3), np.float32), axis=1, block_size=4)
    with pytest.raises(CodecError, match=r"expected \(\)"):
        affine_decode(payload, TensorProto.INT4, (4, 6), np.ones(1, np.float32))
    with pytest.raises(CodecError, match="zero_point has shape"):
        affine_decode(payload, TensorProto.INT4, (4, 6), np.ones(6, np.float32), np.zeros(4, np.int8), axis=1)
    with pytest.raises(CodecError, match="outside the INT4 range"):
        affine_decode(payload, TensorProto.INT4, (4, 6), np.float32(1.0), np.int8(9))
    with pytest.raises(CodecError, match="integers"):
        affine_decode(payload, TensorProto.INT4, (4, 6), np.float32(1.0), np.float32(0.0))
    with pytest.raises(CodecError, match="scale must be float"):
        affine_decode(payload, TensorProto.INT4, (4, 6), np.int32(1))


def test_bad_layout_arguments_raise() -> None:
    payload = bytes(12)
    with pytest.raises(CodecError, match="out of range"):
        affine_decode(payload, TensorProto.INT4, (4, 6), np.ones(6, np.float32), axis=2)
    with pytest.raises(CodecError, match="needs an axis"):
        affine_decode(payload, TensorProto.INT4, (4, 6), np.float32(1.0), block_size=2)
    with pytest.raises(CodecError, match="block_size"):
        affine_decode(payload, TensorProto.INT4, (4, 6), np.ones((4, 6), np.float32), axis=1, block_size=0)
    with pytest.raises(CodecError, match="not an affine storage type"):
        affine_decode(payload, TensorProto.FLOAT, (4, 6), np.float32(1.0))
    with pytest.raises(CodecError, match="not an affine storage type"):
        storage_range(TensorProto.INT16)
    with pytest.raises(CodecError, match="outside the INT2 range"):
        dequantize_codes(np.array([2]), TensorProto.INT2, np.float32(1.0))


def test_encode_rejects_nan_and_zero_scale() -> None:
    with pytest.raises(CodecError, match="NaN"):
        affine_encode(np.array([1.0, np.nan], np.float32), TensorProto.INT8, np.float32(1.0))
    with pytest.raises(CodecError, match="nonzero"):
        affine_encode(np.array([1.0], np.float32), TensorProto.INT8, np.float32(0.0))
    with pytest.raises(CodecError, match="x must be float"):
        affine_encode(np.array([1, 2]), TensorProto.INT8, np.float32(1.0))


def test_storage_table() -> None:
    assert {t: storage_range(t) for t in STORAGE_TYPES} == RANGES
    assert STORAGE_BITS == {t: (8 if t in (TensorProto.INT8, TensorProto.UINT8) else 4 if t in (
        TensorProto.INT4, TensorProto.UINT4) else 2) for t in STORAGE_TYPES}
