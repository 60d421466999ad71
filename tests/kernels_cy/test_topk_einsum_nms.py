"""TopK, Einsum and NonMaxSuppression: one node through the backend against onnxruntime,
onnx.reference and float64 numpy, with ties, NaN, empty tensors, k=0 and k=len."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import onnxforge as of
from onnxforge.kernels_cy.errors import UnsupportedAttributeError
from onnxforge.kernels_cy.ops.einsum import parse_equation
from onnxforge.proto_ext.errors import VerificationError

from .test_oracle_edges import one_node, ort, ours, reference, same


# -- TopK --------------------------------------------------------------------------------------
def _topk(x: np.ndarray, k: int, **attrs) -> tuple[list[np.ndarray], dict]:
    feeds = {"x": x, "k": np.array([k], np.int64)}
    m = one_node("TopK", feeds, 2, opset=11, **attrs)
    return ours(m, feeds), {"model": m, "feeds": feeds}


@pytest.mark.parametrize("largest", [0, 1])
@pytest.mark.parametrize("axis", [0, 1, -1, -3])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64, np.uint8])
def test_topk_with_ties_matches_onnxruntime(largest, axis, dtype):
    # few distinct values: many ties, which go to the lower index in both directions
    x = np.random.default_rng(axis + 3 + 7 * largest).integers(0, 4, (3, 5, 6)).astype(dtype)
    for k in (0, 1, 3, x.shape[axis]):
        got, ctx = _topk(x, k, axis=axis, largest=largest)
        same(got, ort(ctx["model"], ctx["feeds"]))
        same(got, reference(ctx["model"], ctx["feeds"]))


def test_topk_of_an_empty_tensor_and_of_size_one_axes():
    for shape, axis in (((0, 4), 1), ((3, 1), 1), ((1, 1, 1), 0)):
        x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
        got, ctx = _topk(x, min(1, shape[axis]), axis=axis)
        same(got, ort(ctx["model"], ctx["feeds"]))


def test_topk_puts_nan_first_when_largest_like_the_reference():
    x = np.array([[1.0, np.nan, 3.0, -np.inf, np.inf, 3.0]], np.float32)
    got, ctx = _topk(x, 6)
    same(got, reference(ctx["model"], ctx["feeds"]))


def test_topk_rejects_k_past_the_axis():
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(of.OnnxforgeError, match="K=4"):
        _topk(x, 4)


def test_topk_before_opset_10_takes_k_as_an_attribute():
    x = np.array([[3.0, 1.0, 2.0, 3.0]], np.float32)
    m = one_node("TopK", {"x": x}, 2, opset=9, k=2)
    same(ours(m, {"x": x}), ort(m, {"x": x}))


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_topk_hypothesis_against_onnxruntime(data):
    x = data.draw(hnp.arrays(np.float32, hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=6),
                             elements=st.sampled_from([-2.0, -0.5, 0.0, 1.0, 1.5, np.inf, -np.inf])))
    axis = data.draw(st.integers(-x.ndim, x.ndim - 1))
    k = data.draw(st.integers(0, x.shape[axis]))
    largest = data.draw(st.sampled_from([0, 1]))
    got, ctx = _topk(x, k, axis=axis, largest=largest)
    same(got, ort(ctx["model"], ctx["feeds"]))


# -- Einsum ------------------------------------------------------------------------------------
EINSUMS = [
    ("ij,jk->ik", [(3, 4), (4, 5)]), ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]), ("i,i", [(7,), (7,)]),
    ("ij->ji", [(3, 4)]), ("ii->i", [(4, 4)]), ("...ii->...i", [(2, 3, 3)]), ("ij->", [(3, 4)]),
    ("i,j->ij", [(3,), (4,)]), ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]), ("...j,j->...", [(2, 3, 4), (4,)]),
    ("ij", [(3, 4)]), ("ji", [(3, 4)]), ("ab,ab->ab", [(0, 3), (0, 3)]), ("i j , j k -> i k", [(2, 3), (3, 2)]),
    ("bhqd,bhkd->bhqk", [(1, 2, 3, 4), (1, 2, 5, 4)]),
]


@pytest.mark.parametrize(("equation", "shapes"), EINSUMS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_einsum_matches_float64_numpy_and_the_reference(equation, shapes, dtype):
    rng = np.random.default_rng(len(equation))
    xs = [np.asarray((rng.standard_normal(s) * 3).astype(dtype)) for s in shapes]
    feeds = {f"x{i}": x for i, x in enumerate(xs)}
    m = one_node("Einsum", feeds, opset=12, equation=equation)
    got = ours(m, feeds)
    want = np.einsum(equation.replace(" ", ""), *[x.astype(np.float64) for x in xs])
    assert got[0].dtype == xs[0].dtype and got[0].shape == want.shape
    np.testing.assert_allclose(got[0].astype(np.float64), want, rtol=1e-5, atol=1e-5)
    same(got, reference(m, feeds), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("equation", "shapes"), EINSUMS[:10])
def test_einsum_matches_onnxruntime(equation, shapes):
    rng = np.random.default_rng(1)
    xs = [np.asarray(rng.standard_normal(s).astype(np.float32)) for s in shapes]
    feeds = {f"x{i}": x for i, x in enumerate(xs)}
    m = one_node("Einsum", feeds, opset=12, equation=equation)
    same(ours(m, feeds), ort(m, feeds), rtol=1e-5, atol=1e-5)


def test_einsum_output_is_not_a_view_of_its_input():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    got = ours(one_node("Einsum", {"x": x}, opset=12, equation="ij->ji"), {"x": x})[0]
    assert not np.may_share_memory(got, x)
    np.testing.assert_array_equal(got, x.T)


@pytest.mark.parametrize("equation", ["i.j->ij", "......i->i", ".i->i", "i->i->i"])
def test_einsum_equation_parser_rejects_stray_dots(equation):
    # not through a model: onnx's own shape inference does not return on these
    with pytest.raises(ValueError):
        parse_equation(equation)


@pytest.mark.parametrize("equation", ["ij,jk->ik->i", "i1,j->ij", "ij,jk->iq", "ij,jk->i,k", "ij->ii",
                                      "ij->...i", "ij,jk"])
def test_einsum_rejects_a_malformed_equation_at_plan_time(equation):
    xs = {"a": np.ones((2, 2), np.float32), "b": np.ones((2, 2), np.float32)}
    if equation == "ij,jk":  # two terms for one input
        xs = {"a": xs["a"]}
    # onnx's checker, run when the model is loaded, catches most; the kernel the rest
    with pytest.raises((UnsupportedAttributeError, VerificationError)):
        ours(one_node("Einsum", xs, opset=12, equation=equation), xs)
    if equation != "ij,jk":
        with pytest.raises(ValueError):
            parse_equation(equation)


@pytest.mark.parametrize(("equation", "shapes"), [("ij,jk->ik", [(2, 3), (4, 5)]), ("ijk->i", [(2, 3)])])
def test_einsum_rejects_operands_that_do_not_fit(equation, shapes):
    feeds = {f"x{i}": np.ones(s, np.float32) for i, s in enumerate(shapes)}
    with pytest.raises(of.OnnxforgeError):
        ours(one_node("Einsum", feeds, opset=12, equation=equation), feeds)


# -- NonMaxSuppression -------------------------------------------------------------------------
def _nms_feeds(boxes, scores, max_out=None, iou=None, score=None) -> dict:
    feeds = {"boxes": boxes.astype(np.float32), "scores": scores.astype(np.float32)}
    feeds["m"] = None if max_out is None else np.array([max_out], np.int64)
    feeds["iou"] = None if iou is None else np.array([iou], np.float32)
    feeds["st"] = None if score is None else np.array([score], np.float32)
    while feeds and list(feeds.values())[-1] is None:  # trailing omitted inputs are left off
        feeds.popitem()
    return feeds


def _random_boxes(rng, batches, n, center):
    if center:
        xy = rng.uniform(0, 10, (batches, n, 2))
        wh = rng.uniform(0, 4, (batches, n, 2))
        return np.concatenate([xy, wh], axis=2)
    a = rng.uniform(0, 10, (batches, n, 2))
    b = a + rng.uniform(-4, 4, (batches, n, 2))  # flipped corners too
    return np.concatenate([a, b], axis=2)[..., [0, 1, 2, 3]]


@pytest.mark.parametrize("center", [0, 1])
@pytest.mark.parametrize(("max_out", "iou", "score"), [(3, 0.5, None), (100, 0.3, 0.2), (0, 0.5, 0.0),
                                                       (2, 0.0, None), (5, 1.0, 0.5), (None, None, None)])
def test_nms_matches_onnxruntime(center, max_out, iou, score):
    rng = np.random.default_rng(center * 10 + (max_out or 0))
    boxes = _random_boxes(rng, 2, 30, center)
    scores = np.round(rng.uniform(0, 1, (2, 3, 30)), 1)  # rounded: equal scores happen
    feeds = _nms_feeds(boxes, scores, max_out, iou, score)
    m = one_node("NonMaxSuppression", feeds, opset=11, center_point_box=center)
    got = ours(m, feeds)
    assert got[0].dtype == np.int64 and got[0].ndim == 2 and got[0].shape[1] == 3
    same(got, ort(m, feeds))
    if max_out is not None:  # onnx.reference cannot run the form without the optional inputs
        same(got, reference(m, feeds))


def test_nms_with_no_boxes_and_identical_boxes():
    boxes = np.zeros((1, 0, 4), np.float32)
    feeds = _nms_feeds(boxes, np.zeros((1, 2, 0)), 5, 0.5)
    m = one_node("NonMaxSuppression", feeds, opset=11)
    same(ours(m, feeds), ort(m, feeds))
    boxes = np.tile(np.array([0, 0, 1, 1], np.float32), (1, 6, 1))
    feeds = _nms_feeds(boxes, np.full((1, 1, 6), 0.9), 5, 0.5)
    m = one_node("NonMaxSuppression", feeds, opset=11)
    same(ours(m, feeds), ort(m, feeds))


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_nms_hypothesis_against_onnxruntime(data):
    batches, classes, n = (data.draw(st.integers(1, 2)), data.draw(st.integers(1, 3)), data.draw(st.integers(0, 12)))
    center = data.draw(st.sampled_from([0, 1]))
    coord = st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.0, 4.5])
    boxes = data.draw(hnp.arrays(np.float32, (batches, n, 4), elements=coord))
    scores = data.draw(hnp.arrays(np.float32, (batches, classes, n), elements=st.sampled_from([0.1, 0.5, 0.9])))
    max_out = data.draw(st.integers(0, 6))
    iou = data.draw(st.sampled_from([0.0, 0.25, 0.5, 1.0]))
    score = data.draw(st.sampled_from([None, 0.1, 0.5]))
    feeds = _nms_feeds(boxes, scores, max_out, iou, score)
    m = one_node("NonMaxSuppression", feeds, opset=11, center_point_box=center)
    same(ours(m, feeds), ort(m, feeds))


def test_nms_rejects_boxes_of_the_wrong_shape():
    feeds = _nms_feeds(np.zeros((1, 3, 5)), np.zeros((1, 1, 3)), 2)
    with pytest.raises(of.OnnxforgeError, match="boxes"):
        ours(one_node("NonMaxSuppression", feeds, opset=11), feeds)
