"""Erf, Gelu and the parameterised activations (Elu ... Swish, Shrink, PRelu), BitShift and
inference Dropout: one node through the backend against onnxruntime, onnx.reference and,
for Erf and Gelu, float64 ``math.erf`` applied element by element."""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import onnxforge as of
from onnxforge.kernels_cy.errors import UnsupportedAttributeError

from .test_oracle_edges import one_node, ort, ours, reference, same

EDGES = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30, -1e-30, 1e-45, 3.0, -3.0, 6.0, -6.0, 40.0, -40.0, 1e4, -1e4]


def _values(dtype, n: int = 257, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = np.concatenate([np.array(EDGES), rng.standard_normal(n) * 4])
    return x.astype(dtype)


def _erf64(x: np.ndarray) -> np.ndarray:
    return np.array([math.erf(v) for v in x.astype(np.float64).reshape(-1)]).reshape(x.shape)


def _gelu64(x: np.ndarray) -> np.ndarray:
    # erfc(-z) = 1 + erf(z) without the cancellation of 1 + erf(z) for negative z
    v = x.astype(np.float64).reshape(-1)
    with np.errstate(invalid="ignore"):
        y = np.array([0.5 * t * math.erfc(-t / math.sqrt(2.0)) for t in v])  # -inf * 0: NaN
    return y.reshape(x.shape)


# -- Erf and exact Gelu ------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_erf_matches_float64_math_erf(dtype):
    x = _values(dtype, 1000).reshape(8, -1)
    (got,) = ours(one_node("Erf", {"x": x}), {"x": x})
    assert got.dtype == x.dtype and got.shape == x.shape
    tol = dict(rtol=2e-7, atol=1e-38) if dtype == np.float32 else dict(rtol=1e-15, atol=1e-300)
    np.testing.assert_allclose(got.astype(np.float64), _erf64(x), equal_nan=True, **tol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gelu_matches_float64_math_erf(dtype):
    x = _values(dtype, 1000).reshape(8, -1)
    (got,) = ours(one_node("Gelu", {"x": x}, opset=20), {"x": x})
    assert got.dtype == x.dtype
    want = _gelu64(x)
    # float64: erfc(z) for z ~ 6 turns one ulp of its argument into ~2 z^2 ulp of its value
    tol = dict(rtol=2e-7, atol=1e-38) if dtype == np.float32 else dict(rtol=2e-13, atol=1e-300)
    np.testing.assert_allclose(got.astype(np.float64), want, equal_nan=True, **tol)


@pytest.mark.parametrize("op", ["Erf", "Gelu"])
def test_erf_and_gelu_match_onnxruntime(op):
    x = _values(np.float32, 2999).reshape(3, 1, -1)
    m = one_node(op, {"x": x}, opset=20)
    same(ours(m, {"x": x}), ort(m, {"x": x}), rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("op", ["Erf", "Gelu"])
@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_erf_and_gelu_of_half_types_round_once_from_float32(op, dtype):
    x = _values(np.float32, 200).astype(dtype)
    (got,) = ours(one_node(op, {"x": x}, opset=20), {"x": x})
    want = (_erf64(x) if op == "Erf" else _gelu64(x)).astype(np.float32).astype(dtype)
    assert got.dtype == x.dtype
    np.testing.assert_array_equal(got.astype(np.float64), want.astype(np.float64))


def test_erf_on_a_large_tensor_in_parallel_matches_one_thread():
    # above the parallel threshold: the pool's blocks cover the whole flat array
    x = np.random.default_rng(3).standard_normal((3, 70001)).astype(np.float32) * 3
    m = one_node("Erf", {"x": x})
    got = of.InferenceSession(m, threads=2).run(None, {"x": x})[0]
    np.testing.assert_allclose(got.astype(np.float64), _erf64(x), rtol=2e-7, atol=1e-38)


@settings(max_examples=40, deadline=None)
@given(hnp.arrays(np.float32, hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5),
                  elements=st.floats(width=32, allow_nan=True, allow_infinity=True)),
       st.sampled_from(["Erf", "Gelu"]))
def test_erf_and_gelu_hypothesis_against_math_erf(x, op):
    xs = x.T if x.ndim > 1 else x  # a non-contiguous feed too
    xs = np.asarray(xs)
    (got,) = ours(one_node(op, {"x": xs}, opset=20), {"x": xs})
    want = _erf64(xs) if op == "Erf" else _gelu64(xs)
    assert got.shape == xs.shape
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=2e-7, atol=1e-38, equal_nan=True)


# -- the parameterised activations -------------------------------------------------------------
ACTS = [
    ("Elu", {}), ("Elu", {"alpha": 0.3}), ("Selu", {}), ("Selu", {"alpha": 2.0, "gamma": 0.5}),
    ("Celu", {}), ("Celu", {"alpha": 2.5}), ("ThresholdedRelu", {}), ("ThresholdedRelu", {"alpha": -1.5}),
    ("HardSigmoid", {}), ("HardSigmoid", {"alpha": 0.7, "beta": -0.1}), ("HardSwish", {}), ("Mish", {}),
    ("Softsign", {}), ("Shrink", {}), ("Shrink", {"bias": 1.5, "lambd": 1.0}),
]


@pytest.mark.parametrize(("op", "attrs"), ACTS)
def test_activation_matches_onnxruntime_float32(op, attrs):
    x = _values(np.float32, 500).reshape(3, -1)
    m = one_node(op, {"x": x}, opset=22, **attrs)
    same(ours(m, {"x": x}), ort(m, {"x": x}), rtol=3e-6, atol=1e-7)


@pytest.mark.parametrize(("op", "attrs"), ACTS + [("Swish", {}), ("Swish", {"alpha": -0.7})])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_activation_matches_the_reference(op, attrs, dtype):
    x = _values(dtype, 300)
    if dtype == np.float16:  # the reference computes in float16; compare at its precision
        x = x[np.abs(x.astype(np.float64)) < 1e4]
    m = one_node(op, {"x": x}, opset=28 if op == "Celu" else 24, **attrs)
    tol = dict(rtol=2e-3, atol=2e-3) if dtype == np.float16 else dict(rtol=3e-6, atol=1e-7)
    same(ours(m, {"x": x}), reference(m, {"x": x}), **tol)


@settings(max_examples=30, deadline=None)
@given(hnp.arrays(np.float32, hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4),
                  elements=st.floats(-50, 50, width=32) | st.sampled_from([np.nan, np.inf, -np.inf])),
       st.sampled_from(ACTS))
def test_activation_hypothesis_against_onnxruntime(x, act):
    op, attrs = act
    m = one_node(op, {"x": x}, opset=22, **attrs)
    same(ours(m, {"x": x}), ort(m, {"x": x}), rtol=3e-6, atol=1e-7)


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint8])
def test_shrink_of_integers_matches_onnxruntime(dtype):
    # onnxruntime shifts in float: compare where that is exact and cannot overflow
    info = np.iinfo(dtype)
    lo, hi = max(int(info.min) + 2, -(2**24)), min(int(info.max) - 2, 2**24)
    x = np.array([v for v in (lo, lo + 1, -3, -2, -1, 0, 1, 2, 3, hi - 1, hi) if lo <= v <= hi], dtype)
    m = one_node("Shrink", {"x": x}, opset=22, bias=1.0, lambd=1.5)
    same(ours(m, {"x": x}), ort(m, {"x": x}))


def test_celu_rejects_alpha_zero():
    x = np.ones(3, np.float32)
    with pytest.raises(UnsupportedAttributeError, match="alpha"):
        ours(one_node("Celu", {"x": x}, alpha=0.0), {"x": x})


# -- PRelu -------------------------------------------------------------------------------------
@pytest.mark.parametrize(("xshape", "sshape"), [((2, 3, 4), (1,)), ((2, 3, 4), (4,)), ((2, 3, 4), (3, 1)),
                                                ((2, 3, 4), (2, 3, 4)), ((0, 3), (3,)), ((5,), ())])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
def test_prelu_matches_onnxruntime(xshape, sshape, dtype):
    rng = np.random.default_rng(1)
    x = np.asarray((rng.standard_normal(xshape) * 5).astype(dtype))
    s = np.asarray((rng.standard_normal(sshape) * 2).astype(dtype))
    if dtype == np.float32 and x.size:
        x.reshape(-1)[0] = np.nan
    m = one_node("PRelu", {"x": x, "slope": s}, opset=16)
    same(ours(m, {"x": x, "slope": s}), ort(m, {"x": x, "slope": s}))


def test_prelu_rejects_a_slope_that_does_not_broadcast_to_x():
    x, s = np.ones((2, 3), np.float32), np.ones((2, 3, 1), np.float32)
    m = one_node("PRelu", {"x": x, "slope": s}, opset=16)
    with pytest.raises(of.OnnxforgeError):
        ours(m, {"x": x, "slope": s})


# -- BitShift ----------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32, np.uint64])
@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
def test_bitshift_unsigned_matches_onnxruntime(dtype, direction):
    rng = np.random.default_rng(2)
    bits = np.iinfo(dtype).bits
    x = rng.integers(0, np.iinfo(dtype).max, (4, 5), dtype=dtype, endpoint=True)
    y = rng.integers(0, bits - 1, (5,), dtype=dtype, endpoint=True)  # in range: onnxruntime's C shifts
    m = one_node("BitShift", {"x": x, "y": y}, opset=11, direction=direction)
    same(ours(m, {"x": x, "y": y}), ort(m, {"x": x, "y": y}))


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint32, np.uint64]),
       st.sampled_from(["LEFT", "RIGHT"]), st.data())
def test_bitshift_hypothesis_against_the_reference_incl_negative_and_wide_shifts(dtype, direction, data):
    info = np.iinfo(dtype)
    shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=2, min_side=0, max_side=4))
    x = data.draw(hnp.arrays(dtype, shape, elements=st.integers(int(info.min), int(info.max))))
    lo = max(int(info.min), -3)
    y = data.draw(hnp.arrays(dtype, shape[-1:], elements=st.integers(lo, min(int(info.max), info.bits + 3))))
    m = one_node("BitShift", {"x": x, "y": y}, opset=28, direction=direction)
    same(ours(m, {"x": x, "y": y}), reference(m, {"x": x, "y": y}))


# -- Dropout -----------------------------------------------------------------------------------
@pytest.mark.parametrize("n_out", [1, 2])
def test_dropout_at_inference_copies_and_masks_all_true(n_out):
    x = np.random.default_rng(4).standard_normal((3, 4)).astype(np.float32)
    r = np.array(0.75, np.float32)
    m = one_node("Dropout", {"x": x, "r": r}, n_out, opset=22)
    got = ours(m, {"x": x, "r": r})
    same(got, ort(m, {"x": x, "r": r}))
    np.testing.assert_array_equal(got[0], x)
    if n_out == 2:
        assert got[1].dtype == np.bool_ and got[1].all()


def test_dropout_refuses_a_training_mode_that_is_not_a_constant():
    x, r, t = np.ones((2, 2), np.float32), np.array(0.5, np.float32), np.array(True)
    m = one_node("Dropout", {"x": x, "r": r, "t": t}, opset=22)
    with pytest.raises(UnsupportedAttributeError, match="training_mode"):
        ours(m, {"x": x, "r": r, "t": t})


def _dropout_with_constant_mode(ratio: float, mode: bool):
    from onnx import TensorProto, helper

    from tests.fuzz.case import typed_outputs

    nodes = [helper.make_node("Constant", [], ["r"], value=helper.make_tensor("rv", TensorProto.FLOAT, [], [ratio])),
             helper.make_node("Constant", [], ["t"], value=helper.make_tensor("tv", TensorProto.BOOL, [], [mode])),
             helper.make_node("Dropout", ["x", "r", "t"], ["y0", "y1"], name="n0")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_empty_tensor_value_info("y0"), helper.make_empty_tensor_value_info("y1")])
    return typed_outputs(helper.make_model(g, opset_imports=[helper.make_opsetid("", 22)], ir_version=10))


@pytest.mark.parametrize(("ratio", "mode"), [(0.5, False), (0.0, True)])
def test_dropout_with_constant_training_mode_that_drops_nothing(ratio, mode):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    m = _dropout_with_constant_mode(ratio, mode)
    got = ours(m, {"x": x})
    same(got, reference(m, {"x": x}))


def test_dropout_refuses_a_constant_training_mode_with_a_nonzero_ratio():
    m = _dropout_with_constant_mode(0.5, True)
    with pytest.raises(UnsupportedAttributeError, match="training_mode"):
        ours(m, {"x": np.ones((2, 3), np.float32)})
