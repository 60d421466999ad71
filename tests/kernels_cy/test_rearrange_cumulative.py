"""CumSum, CumProd, DepthToSpace, SpaceToDepth, BitCast, EyeLike, OneHot, Compress and
NonZero: one node through the backend against onnxruntime and onnx.reference."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import onnxforge as of

from .test_oracle_edges import one_node, ort, ours, reference, same


# -- CumSum / CumProd --------------------------------------------------------------------------
@pytest.mark.parametrize("op", ["CumSum", "CumProd"])
@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
def test_cumulative_matches_the_reference(op, exclusive, reverse, dtype):
    x = np.asarray(np.random.default_rng(5).integers(-3, 4, (2, 3, 4)).astype(dtype))
    for axis in (0, 1, 2, -1, -3):
        feeds = {"x": x, "axis": np.array(axis, np.int64)}
        m = one_node(op, feeds, opset=26, exclusive=exclusive, reverse=reverse)
        same(ours(m, feeds), reference(m, feeds))


@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
def test_cumsum_matches_onnxruntime(exclusive, reverse):
    x = np.random.default_rng(6).standard_normal((3, 5)).astype(np.float32)
    for axis in (0, 1, -1):
        feeds = {"x": x, "axis": np.array(axis, np.int32)}
        m = one_node("CumSum", feeds, opset=14, exclusive=exclusive, reverse=reverse)
        same(ours(m, feeds), ort(m, feeds))


@settings(max_examples=50, deadline=None)
@given(st.data())
def test_cumsum_hypothesis_against_float64_numpy(data):
    x = data.draw(hnp.arrays(np.float64, hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=5),
                             elements=st.floats(-100, 100)))
    axis = data.draw(st.integers(-x.ndim, x.ndim - 1))
    exclusive, reverse = data.draw(st.booleans()), data.draw(st.booleans())
    feeds = {"x": x, "axis": np.array(axis, np.int64)}
    got = ours(one_node("CumSum", feeds, opset=14, exclusive=int(exclusive), reverse=int(reverse)), feeds)[0]
    v = np.flip(x, axis) if reverse else x
    want = np.cumsum(v, axis=axis)
    if exclusive:
        want = want - v
    want = np.flip(want, axis) if reverse else want
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-9)


def test_cumsum_rejects_an_axis_past_the_rank():
    feeds = {"x": np.ones((2, 3), np.float32), "axis": np.array(2, np.int64)}
    with pytest.raises(of.OnnxforgeError, match="axis"):
        ours(one_node("CumSum", feeds, opset=14), feeds)


# -- DepthToSpace / SpaceToDepth ---------------------------------------------------------------
@pytest.mark.parametrize("mode", ["DCR", "CRD"])
@pytest.mark.parametrize("block", [1, 2, 3])
def test_depth_to_space_and_back_match_the_oracles(mode, block):
    x = np.arange(2 * 18 * 2 * 3, dtype=np.float32).reshape(2, 18, 2, 3)
    if block == 2:
        x = x[:, :16]
    x = np.ascontiguousarray(x)
    m = one_node("DepthToSpace", {"x": x}, opset=13, blocksize=block, mode=mode)
    got = ours(m, {"x": x})
    same(got, ort(m, {"x": x}))
    y = got[0]
    m2 = one_node("SpaceToDepth", {"y": y}, opset=28, blocksize=block, mode=mode)
    back = ours(m2, {"y": y})
    same(back, reference(m2, {"y": y}))
    np.testing.assert_array_equal(back[0], x)  # SpaceToDepth undoes DepthToSpace in one mode


def test_space_to_depth_matches_onnxruntime():
    x = np.random.default_rng(7).standard_normal((1, 3, 4, 6)).astype(np.float32)
    m = one_node("SpaceToDepth", {"x": x}, opset=13, blocksize=2)
    same(ours(m, {"x": x}), ort(m, {"x": x}))


def test_space_to_depth_rejects_sizes_that_do_not_divide():
    x = np.ones((1, 1, 3, 4), np.float32)
    with pytest.raises(of.OnnxforgeError, match="blocksize"):
        ours(one_node("SpaceToDepth", {"x": x}, opset=13, blocksize=2), {"x": x})


# -- BitCast, EyeLike, OneHot, Compress, NonZero -----------------------------------------------
@pytest.mark.parametrize(("src", "to", "dst"), [(np.float32, 6, np.int32), (np.int64, 11, np.float64),
                                                (np.uint16, 5, np.int16), (np.bool_, 2, np.uint8)])
@pytest.mark.parametrize("shape", [(), (0,), (3, 2)])
def test_bitcast_matches_the_reference(src, to, dst, shape):
    x = np.asarray(np.random.default_rng(8).integers(0, 2, shape).astype(src))
    m = one_node("BitCast", {"x": x}, opset=26, to=to)
    got = ours(m, {"x": x})
    same(got, reference(m, {"x": x}))
    assert got[0].dtype == dst and got[0].shape == x.shape


@pytest.mark.parametrize("shape", [(3, 3), (2, 5), (4, 1), (0, 3)])
@pytest.mark.parametrize("k", [-2, 0, 1, 7])
def test_eyelike_matches_onnxruntime(shape, k):
    x = np.zeros(shape, np.float32)
    for dtype in (None, 7):
        attrs = {"k": k} if dtype is None else {"k": k, "dtype": dtype}
        m = one_node("EyeLike", {"x": x}, opset=9, **attrs)
        same(ours(m, {"x": x}), ort(m, {"x": x}))


@pytest.mark.parametrize("axis", [-1, 0, 1, -2])
@pytest.mark.parametrize("idx_dtype", [np.int64, np.float32])
def test_onehot_matches_onnxruntime(axis, idx_dtype):
    indices = np.array([[0, 3, -1], [5, -4, 2]], idx_dtype)  # 5 and -4 are out of range for depth 4
    feeds = {"i": indices, "d": np.array(4, np.int64), "v": np.array([-1.5, 2.0], np.float32)}
    m = one_node("OneHot", feeds, opset=11, axis=axis)
    # onnxruntime takes integer indices only; float ones truncate, as onnx.reference does
    same(ours(m, feeds), (ort if idx_dtype == np.int64 else reference)(m, feeds))


@pytest.mark.parametrize("axis", [None, 0, 1, -1])
@pytest.mark.parametrize("cond", [[True, False, True], [False, False, False], [True], []])
def test_compress_matches_onnxruntime(axis, cond):
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    feeds = {"x": x, "c": np.array(cond, dtype=bool)}
    m = one_node("Compress", feeds, opset=11, **({} if axis is None else {"axis": axis}))
    same(ours(m, feeds), ort(m, feeds))


def test_compress_rejects_a_condition_longer_than_the_axis():
    feeds = {"x": np.ones((2, 2), np.float32), "c": np.ones(3, bool)}
    with pytest.raises(of.OnnxforgeError, match="condition"):
        ours(one_node("Compress", feeds, opset=11, axis=0), feeds)


@settings(max_examples=40, deadline=None)
@given(hnp.arrays(np.int32, hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=4),
                  elements=st.integers(-1, 1)))
def test_nonzero_hypothesis_against_onnxruntime(x):
    m = one_node("NonZero", {"x": x}, opset=13)
    same(ours(m, {"x": x}), ort(m, {"x": x}))


# -- ReverseSequence, ScatterElements, windows -------------------------------------------------
@pytest.mark.parametrize(("batch_axis", "time_axis"), [(0, 1), (1, 0)])
def test_reverse_sequence_matches_onnxruntime(batch_axis, time_axis):
    x = np.arange(4 * 5 * 2, dtype=np.float32).reshape(4, 5, 2)
    if batch_axis == 1:
        x = np.ascontiguousarray(x.transpose(1, 0, 2))  # [time=5, batch=4, 2]
    lens = np.array([0, 1, 5, 3], np.int64)
    feeds = {"x": x, "lens": lens}
    m = one_node("ReverseSequence", feeds, opset=10, batch_axis=batch_axis, time_axis=time_axis)
    same(ours(m, feeds), ort(m, feeds))


def test_reverse_sequence_rejects_a_length_past_the_time_axis():
    feeds = {"x": np.ones((3, 2), np.float32), "lens": np.array([1, 4], np.int64)}
    with pytest.raises(of.OnnxforgeError, match="sequence_lens"):
        ours(one_node("ReverseSequence", feeds, opset=10), feeds)


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_scatter_elements_with_duplicates_and_negative_indices_matches_onnxruntime(reduction, axis):
    rng = np.random.default_rng(9)
    data = rng.standard_normal((4, 5)).astype(np.float32)
    n = data.shape[axis]
    indices = rng.integers(-n, n, (3, 4)).astype(np.int64)
    if reduction == "none":  # onnxruntime leaves the winner of duplicates unspecified: no duplicates
        indices = np.stack([rng.permutation(n)[:4] for _ in range(3)]) if axis != 0 else \
            np.stack([rng.permutation(n)[:3] for _ in range(4)], axis=1)
    updates = rng.standard_normal(indices.shape).astype(np.float32)
    feeds = {"data": data, "indices": indices, "updates": updates}
    m = one_node("ScatterElements", feeds, opset=18, axis=axis, reduction=reduction)
    same(ours(m, feeds), ort(m, feeds))
    same(ours(m, feeds), reference(m, feeds))


def test_scatter_elements_rejects_an_index_out_of_range():
    feeds = {"data": np.zeros((2, 2), np.float32), "indices": np.array([[2]], np.int64),
             "updates": np.ones((1, 1), np.float32)}
    with pytest.raises(of.OnnxforgeError, match="out of range"):
        ours(one_node("ScatterElements", feeds, opset=18), feeds)


@pytest.mark.parametrize("op", ["HannWindow", "HammingWindow", "BlackmanWindow"])
@pytest.mark.parametrize("periodic", [0, 1])
@pytest.mark.parametrize("size", [1, 2, 10, 33])
def test_windows_match_onnxruntime(op, periodic, size):
    feeds = {"size": np.array(size, np.int64)}
    m = one_node(op, feeds, opset=17, periodic=periodic)
    same(ours(m, feeds), ort(m, feeds), rtol=1e-6, atol=1e-7)
