"""Cast and CastLike to FLOAT8E8M0 (Cast-25's ``round_mode``) against onnx.reference, on
random magnitudes across the whole float32 exponent range, both signs, zeros,
subnormals, exact powers of two, halves, infinities and NaN, from float32, float16 and
bfloat16."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import onnxforge as of
from onnxforge.kernels_cy.errors import UnsupportedAttributeError


def _inputs() -> np.ndarray:
    rng = np.random.default_rng(7)
    random = (rng.standard_normal(400) * np.exp2(rng.integers(-140, 128, 400))).astype(np.float32)
    powers = np.exp2(np.arange(-149, 128, dtype=np.float64)).astype(np.float32)
    halves = (powers[:-1] * 1.5).astype(np.float32)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45,
                        np.finfo(np.float32).max, np.finfo(np.float32).tiny], np.float32)
    return np.concatenate([random, powers, -powers, halves, special])


def _model(op: str, round_mode: str, saturate: int, dtype: int) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", dtype, [None])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT8E8M0, [None])
    if op == "Cast":
        node = helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT8E8M0, saturate=saturate,
                                round_mode=round_mode)
        inits = []
    else:
        node = helper.make_node("CastLike", ["x", "like"], ["y"], saturate=saturate, round_mode=round_mode)
        inits = [helper.make_tensor("like", TensorProto.FLOAT8E8M0, [1], [127])]
    graph = helper.make_graph([node], "g", [x], [y], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 25)])


@pytest.mark.parametrize("op", ["Cast", "CastLike"])
@pytest.mark.parametrize("round_mode", ["up", "down", "nearest"])
@pytest.mark.parametrize("saturate", [1, 0])
@pytest.mark.parametrize("dtype", [TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16])
def test_e8m0_codes_equal_onnx_reference(op, round_mode, saturate, dtype):
    x = _inputs()
    if dtype != TensorProto.FLOAT:
        with np.errstate(over="ignore"):
            x = x.astype(np.float16 if dtype == TensorProto.FLOAT16 else ml_dtypes.bfloat16)
    model = _model(op, round_mode, saturate, dtype)
    # onnx.reference's CastLike takes no round_mode: its Cast is the oracle for both
    (expect,) = ReferenceEvaluator(_model("Cast", round_mode, saturate, dtype)).run(None, {"x": x})
    (got,) = of.InferenceSession(model).run(None, {"x": x})
    assert got.dtype == expect.dtype
    mismatch = np.flatnonzero(got.view(np.uint8) != expect.view(np.uint8))
    assert mismatch.size == 0, [(float(x[i]), int(got.view(np.uint8)[i]), int(expect.view(np.uint8)[i]))
                                for i in mismatch[:5]]


def test_an_unknown_round_mode_is_refused_naming_the_node():
    with pytest.raises(UnsupportedAttributeError, match="round_mode='sideways'"):
        of.InferenceSession(_model("Cast", "sideways", 1, TensorProto.FLOAT))
