"""The numpy evaluators of constant folding give onnx.reference's results, op by op."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

from onnxforge.graphbuilder.ir.core import Attr, AttrType, Node, Value
from onnxforge.graphbuilder.ir.tensors import Tensor
from onnxforge.passes.rewrites.fold_eval import _reference
from onnxforge.passes.rewrites.fold_eval import evaluate

I64_MAX, I64_MIN = np.iinfo(np.int64).max, np.iinfo(np.int64).min
RNG = np.random.default_rng(3)
DATA = RNG.standard_normal((4, 6, 5)).astype(np.float32)
IDATA = np.arange(24, dtype=np.int64).reshape(2, 3, 4)


def _node(op: str, n_in: int, n_out: int = 1, **attrs) -> Node:
    made = []
    for k, v in attrs.items():
        if isinstance(v, Tensor):
            made.append(Attr(k, AttrType.TENSOR, v))
        elif isinstance(v, list):
            made.append(Attr(k, AttrType.INTS, v))
        else:
            made.append(Attr(k, AttrType.INT, v))
    return Node("", op, [Value(f"i{k}") for k in range(n_in)], n_out, attributes=made)


def _i64(*xs) -> np.ndarray:
    return np.array(xs, np.int64)


def _check(node: Node, arrays: list, opset: int) -> None:
    with np.errstate(all="ignore"):  # as constant folding evaluates
        want = _reference(node, arrays, {"": opset})
        got = evaluate(node, arrays, opset)
    if want is None:
        assert got is None  # refused here too, so the caller asks the reference
        return
    assert got is not None, "the evaluator declined a case the reference folds"
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)


SLICES = [
    (DATA, _i64(1), _i64(3), _i64(1), None),
    (DATA, _i64(0, -3), _i64(I64_MAX, -1), _i64(2, 0), _i64(2, 1)),
    (DATA, _i64(-1), _i64(I64_MIN), _i64(1), _i64(-1)),
    (DATA, _i64(4), _i64(1), _i64(-1), _i64(-2)),
    (DATA, _i64(1, 2), _i64(3, 5), None, None),
    (DATA, _i64(0), _i64(10), None, _i64(3)),
    (DATA, _i64(7), _i64(9), _i64(0), None),  # empty
    (IDATA, _i64(1), _i64(-1), _i64(2), None),
    (IDATA, np.array([0], np.int32), np.array([2], np.int32), np.array([1], np.int32), None),
    (IDATA, _i64(0), _i64(1), _i64(5), None),  # axis out of range: refused
]


@pytest.mark.parametrize("case", range(len(SLICES)))
def test_slice(case):
    data, starts, ends, axes, steps = SLICES[case]
    arrays = [data, starts, ends, axes, steps]
    while arrays[-1] is None:
        arrays.pop()
    _check(_node("Slice", len(arrays)), arrays, 13)


@pytest.mark.parametrize("opset, axis, split, outs, num_outputs", [
    (13, 1, _i64(2, 4), 2, None),
    (13, -1, None, 5, None),
    (13, 0, None, 3, None),  # 4 rows in 3: uneven
    (11, 2, [1, 1, 3], 3, None),
    (11, 1, None, 2, None),
    (18, 1, None, 4, 4),  # 6 in 4
    (18, 0, _i64(1, 3), 2, None),
    (13, 1, _i64(2, 2), 2, None),  # does not cover the axis: the reference gives what it gives
])
def test_split(opset, axis, split, outs, num_outputs):
    attrs = {"axis": axis}
    arrays = [DATA]
    if opset >= 13 and split is not None:
        arrays.append(split)
    elif split is not None:
        attrs["split"] = split
    if num_outputs is not None:
        attrs["num_outputs"] = num_outputs
    _check(_node("Split", len(arrays), outs, **attrs), arrays, opset)


@pytest.mark.parametrize("x, indices, axis", [
    (IDATA, _i64(0, 2), 2),
    (IDATA, np.array(1, np.int64), 1),
    (IDATA, _i64(-1), 0),
    (DATA, np.array([[0, 3], [5, 1]], np.int32), 1),
    (IDATA.reshape(-1), _i64(3), None),
    (IDATA, _i64(9), 1),  # out of range: refused
])
def test_gather(x, indices, axis):
    attrs = {} if axis is None else {"axis": axis}
    _check(_node("Gather", 2, **attrs), [x, indices], 13)


@pytest.mark.parametrize("to", [TensorProto.FLOAT, TensorProto.INT64, TensorProto.INT32, TensorProto.BOOL,
                                TensorProto.FLOAT16, TensorProto.UINT8, TensorProto.DOUBLE, TensorProto.INT8])
@pytest.mark.parametrize("x", [
    np.array([1.7, -2.5, 0.0, 3e9, np.inf, np.nan], np.float32),
    np.array([0, 1, -7, 300, 2**40], np.int64),
    np.array([0, 5, -1], np.int32),
    np.array([True, False]),
])
def test_cast(x, to):
    _check(_node("Cast", 1, to=to), [x], 19)


def test_cast_to_string_or_float8_is_left_to_the_reference():
    assert evaluate(_node("Cast", 1, to=TensorProto.STRING), [_i64(1)], 19) is None
    assert evaluate(_node("Cast", 1, to=TensorProto.FLOAT8E4M3FN), [np.ones(2, np.float32)], 19) is None


@pytest.mark.parametrize("shape, value", [
    (_i64(2, 3), None),
    (_i64(4), Tensor.from_numpy(np.array([7], np.int64))),
    (_i64(2, 1, 2), Tensor.from_numpy(np.array([1.5], np.float32))),
    (_i64(), Tensor.from_numpy(np.array([2], np.int32))),
    (_i64(0, 3), Tensor.from_numpy(np.array([True]))),
    (_i64(-1), None),  # negative: refused
])
def test_constant_of_shape(shape, value):
    attrs = {} if value is None else {"value": value}
    _check(_node("ConstantOfShape", 1, **attrs), [shape], 21)
