"""Edge cases where a kernel once differed from onnx.reference / onnxruntime: each test runs
one node through the backend and through an oracle on the same model and compares."""
from __future__ import annotations

import itertools
from typing import Any

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import helper

import onnxforge as of
from onnxforge.kernels_cy.errors import KernelError
from tests.fuzz.case import typed_outputs

I64_MAX, I64_MIN = 2**63 - 1, -2**63


def one_node(op: str, feeds: dict[str, np.ndarray | None], n_out: int = 1, *, domain: str = "",
             opset: int = 23, **attrs: Any) -> onnx.ModelProto:
    """A model of one node named ``n0``; a None feed is an omitted optional input."""
    names = [k if v is not None else "" for k, v in feeds.items()]
    inputs = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape))
              for k, v in feeds.items() if v is not None]
    outs = [f"y{i}" for i in range(n_out)]
    node = helper.make_node(op, names, outs, name="n0", domain=domain, **attrs)
    g = helper.make_graph([node], "g", inputs, [helper.make_empty_tensor_value_info(o) for o in outs])
    opsets = [helper.make_opsetid("", opset)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    return typed_outputs(helper.make_model(g, opset_imports=opsets, ir_version=10))


def ours(model: onnx.ModelProto, feeds: dict[str, np.ndarray | None]) -> list[np.ndarray]:
    return of.InferenceSession(model).run(None, {k: v for k, v in feeds.items() if v is not None})


def reference(model: onnx.ModelProto, feeds: dict[str, np.ndarray | None]) -> list[np.ndarray]:
    from onnx.reference import ReferenceEvaluator

    with np.errstate(all="ignore"):
        return [np.asarray(o) for o in ReferenceEvaluator(model).run(None, {k: v for k, v in feeds.items()
                                                                           if v is not None})]


def ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray | None]) -> list[np.ndarray]:
    import onnxruntime as rt

    so = rt.SessionOptions()
    so.graph_optimization_level = rt.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 4
    sess = rt.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, {k: v for k, v in feeds.items() if v is not None})


def same(got: list[np.ndarray], want: list[np.ndarray], rtol: float = 1e-5, atol: float = 1e-6) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, g.dtype, w.shape, w.dtype)
        if g.dtype.kind in "fV" or g.dtype == ml_dtypes.bfloat16:
            g64, w64 = g.astype(np.float64), w.astype(np.float64)
            np.testing.assert_array_equal(np.isnan(g64), np.isnan(w64))
            np.testing.assert_allclose(g64, w64, rtol=rtol, atol=atol, equal_nan=True)
        else:
            np.testing.assert_array_equal(g, w)


def agrees(op: str, feeds: dict[str, np.ndarray | None], n_out: int = 1, oracle: Any = reference,
           **kw: Any) -> list[np.ndarray]:
    m = one_node(op, feeds, n_out, **kw)
    got = ours(m, feeds)
    same(got, oracle(m, feeds))
    return got


def rejects(op: str, feeds: dict[str, np.ndarray | None], n_out: int = 1, match: str | None = None,
            **kw: Any) -> None:
    """The backend raises a typed error naming node n0 (at plan or run time)."""
    m = one_node(op, feeds, n_out, **kw)
    with pytest.raises(of.OnnxforgeError, match=match) as info:
        ours(m, feeds)
    text = str(info.value) + " ".join(getattr(info.value, "__notes__", []))
    assert "n0" in text


X23 = np.arange(6, dtype=np.float32).reshape(2, 3)


# -- Split ---------------------------------------------------------------------------------
@pytest.mark.parametrize("split", [None, np.array([3], np.int64)])
def test_split_with_one_output_keeps_the_rank(split):
    (y,) = agrees("Split", {"x": X23, "s": split}, 1, axis=1, opset=13)
    assert y.shape == (2, 3)


def test_split_with_one_output_from_num_outputs():
    agrees("Split", {"x": X23}, 1, axis=0, num_outputs=1)


@pytest.mark.parametrize("sizes", [[4, -1], [1, 1], [2, 2], [-1, 4]])
def test_split_rejects_bad_sizes(sizes):
    rejects("Split", {"x": X23, "s": np.array(sizes, np.int64)}, 2, axis=1)


def test_split_rejects_a_count_that_does_not_match_the_outputs():
    rejects("Split", {"x": X23, "s": np.array([1, 1, 1], np.int64)}, 2, axis=1)


def test_split_uneven_num_outputs_matches_the_oracle():
    agrees("Split", {"x": np.arange(7, dtype=np.float32)}, 3, num_outputs=3)


# -- GatherElements / GatherND / ScatterND -----------------------------------------------
def test_gather_elements_has_the_indices_shape():
    """Indices smaller than the data off the axis: onnxruntime reads the leading block
    (onnx.reference refuses any difference off the axis)."""
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    idx = np.array([[0, 3], [1, -1]], np.int64)
    (y,) = agrees("GatherElements", {"x": x, "i": idx}, axis=1, oracle=ort)
    assert y.shape == (2, 2)
    agrees("GatherElements", {"x": x, "i": np.array([[2, 0, 1, -3]], np.int64)}, axis=0, oracle=ort)
    agrees("GatherElements", {"x": x, "i": np.array([[2, 0, 1, -3], [0, 0, 0, 0]], np.int64)}, axis=0)


@pytest.mark.parametrize("bad", [3, -4, 100])
def test_gather_elements_rejects_out_of_range_indices(bad):
    rejects("GatherElements", {"x": X23, "i": np.array([[0], [bad]], np.int64)}, axis=1, match="out of range")


def test_gather_elements_rejects_indices_larger_than_the_data():
    rejects("GatherElements", {"x": X23, "i": np.zeros((3, 1), np.int64)}, axis=1)


def test_gather_nd_scalar_result():
    (y,) = agrees("GatherND", {"x": X23, "i": np.array([1, 2], np.int64)})
    assert y.shape == ()
    agrees("GatherND", {"x": X23, "i": np.array([[1, -1], [0, 0]], np.int64)})


def test_gather_nd_batch_dims():
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    agrees("GatherND", {"x": x, "i": np.array([[[1], [-1]], [[0], [2]]], np.int64)}, batch_dims=1)
    agrees("GatherND", {"x": x, "i": np.array([[1, 3], [2, -4]], np.int64)}, batch_dims=1)


def test_gather_nd_rejects_out_of_range_indices():
    rejects("GatherND", {"x": X23, "i": np.array([[1, 3]], np.int64)}, match="out of range")
    x = np.zeros((2, 3), np.float32)
    rejects("GatherND", {"x": x, "i": np.array([[5], [0]], np.int64)}, batch_dims=1, match="out of range")


@pytest.mark.parametrize("bad", [2, -3])
def test_scatter_nd_rejects_out_of_range_indices(bad):
    rejects("ScatterND", {"x": X23, "i": np.array([[bad]], np.int64), "u": np.ones((1, 3), np.float32)},
            match="out of range")


def test_scatter_nd_negative_index_matches_the_oracle():
    agrees("ScatterND", {"x": X23, "i": np.array([[-1]], np.int64), "u": np.ones((1, 3), np.float32)})


def test_scatter_nd_rejects_updates_of_the_wrong_shape():
    rejects("ScatterND", {"x": X23, "i": np.array([[0]], np.int64), "u": np.ones((1, 2), np.float32)})


# -- Slice ---------------------------------------------------------------------------------
def test_slice_clamps_like_the_specification():
    """Every start/end/step combination over a length-5 axis against the oracles. Both
    depart from the specification's clamping somewhere, so each combination is checked
    against the one that follows it: onnx.reference slices with numpy's rules, so a start
    below -n with a negative step gives nothing (the specification clamps it to 0: onnxruntime);
    onnxruntime reads an end of INT32_MAX or INT64_MAX with a negative step as "through
    element 0" (the specification clamps it to n - 1: onnx.reference)."""
    x = np.arange(5, dtype=np.float32)
    vals = [I64_MIN, -2**31, -10, -6, -5, -4, -1, 0, 1, 3, 4, 5, 6, 10, 2**31 - 1, I64_MAX]
    zero = np.zeros(1, np.int64)
    feeds = {"x": x, "s": zero, "e": zero, "a": zero, "t": zero}
    m = one_node("Slice", feeds)
    sess = of.InferenceSession(m)
    import onnxruntime as rt
    from onnx.reference import ReferenceEvaluator

    so = rt.SessionOptions()
    so.graph_optimization_level = rt.GraphOptimizationLevel.ORT_DISABLE_ALL
    osess = rt.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    rsess = ReferenceEvaluator(m)
    checked = 0
    for s, e, st in itertools.product(vals, vals, [I64_MIN, -3, -2, -1, 1, 2, 7, I64_MAX]):
        f = {"x": x, "s": np.array([s]), "e": np.array([e]), "a": zero, "t": np.array([st])}
        got = sess.run(None, f)[0]
        ort_sentinel = st < 0 and e >= 2**31 - 1
        numpy_start = st < 0 and s < -5
        if ort_sentinel and numpy_start:
            want = x[0:0]  # the specification: start 0, end n - 1 walking down: nothing
        elif ort_sentinel:
            want = rsess.run(None, f)[0]
        else:
            want = osess.run(None, f)[0]
        assert got.shape == want.shape and np.array_equal(got, want), (s, e, st, got, want)
        checked += 1
    assert checked == 16 * 16 * 8


def test_slice_negative_steps_on_two_axes_match_the_reference():
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    agrees("Slice", {"x": x, "s": np.array([-1, 10], np.int64), "e": np.array([-10, 1], np.int64),
                     "a": np.array([0, -1], np.int64), "t": np.array([-2, -3], np.int64)})


def test_slice_rejects_an_axis_past_the_rank():
    z = np.zeros(1, np.int64)
    rejects("Slice", {"x": X23, "s": z, "e": z + 1, "a": z + 2})


# -- reductions with noop_with_empty_axes ------------------------------------------------
@pytest.mark.parametrize("op", ["ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp",
                                "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd"])
@pytest.mark.parametrize("oracle", [reference, ort])
def test_reduce_noop_with_empty_axes_applies_the_elementwise_part(op, oracle):
    x = np.array([[-2.0, -1.0, 0.0], [0.5, 1.0, 3.0]], np.float32)
    agrees(op, {"x": x}, oracle=oracle, noop_with_empty_axes=1)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceL2", "ReduceMax"])
def test_reduce_rejects_an_axis_past_the_rank(op):
    rejects(op, {"x": X23, "a": np.array([2], np.int64)})
    rejects(op, {"x": X23, "a": np.array([0, -2], np.int64)})


# -- Sigmoid / Softmax on NaN and inf ------------------------------------------------------
@pytest.mark.parametrize("n", [4, 37])  # below and above a vector's width
def test_sigmoid_keeps_nan(n):
    x = np.linspace(-100, 100, n).astype(np.float32)
    x[1], x[-1], x[2] = np.nan, np.inf, -np.inf
    (y,) = agrees("Sigmoid", {"x": x})
    assert np.isnan(y[1])


@pytest.mark.parametrize("oracle", [reference, ort])
def test_softmax_of_inf_and_nan_rows(oracle):
    x = np.array([[np.inf, 1, 2], [np.inf, np.inf, 0], [-np.inf, -np.inf, -np.inf], [np.nan, 0, 1],
                  [1, 2, 3], [-np.inf, 0, 1]], np.float32)
    (y,) = agrees("Softmax", {"x": x}, oracle=oracle)
    assert np.isnan(y[0]).all() and np.isfinite(y[4]).all()


# -- com.microsoft SkipSimplifiedLayerNormalization ---------------------------------------
@pytest.mark.parametrize("with_bias", [False, True])
def test_skip_simplified_layer_norm_outputs_match_onnxruntime(with_bias):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 8)).astype(np.float32)
    skip = rng.standard_normal((2, 3, 8)).astype(np.float32)
    gamma = rng.standard_normal(8).astype(np.float32)
    bias = rng.standard_normal(8).astype(np.float32) if with_bias else None
    feeds = {"x": x, "s": skip, "g": gamma, "b": bias}
    m = one_node("SkipSimplifiedLayerNormalization", feeds, 4, domain="com.microsoft", epsilon=1e-5)
    got, want = ours(m, feeds), ort(m, feeds)
    same(got, want, rtol=1e-4, atol=1e-5)
    assert got[1].shape == (2, 3, 1) and got[2].shape == (2, 3, 1)


# -- bfloat16 products -----------------------------------------------------------------------
def test_matmul_and_gemm_keep_bfloat16():
    a = (np.arange(6, dtype=np.float32).reshape(2, 3) / 4).astype(ml_dtypes.bfloat16)
    b = (np.arange(12, dtype=np.float32).reshape(3, 4) / 8).astype(ml_dtypes.bfloat16)
    c = np.ones(4, np.float32).astype(ml_dtypes.bfloat16)
    (y,) = agrees("MatMul", {"a": a, "b": b})
    assert y.dtype == ml_dtypes.bfloat16
    (y,) = agrees("Gemm", {"a": a, "b": b, "c": c}, alpha=0.5, beta=2.0)
    assert y.dtype == ml_dtypes.bfloat16
    agrees("Gemm", {"a": a.T.copy(), "b": b, "c": c}, transA=1)


# -- RotaryEmbedding positions -------------------------------------------------------------
@pytest.mark.parametrize("pos", [[[0, 4]], [[0, -1]], [3]])
def test_ms_rotary_rejects_positions_outside_the_cache(pos):
    x = np.zeros((1, 2, 8), np.float32)
    cache = np.zeros((4, 4), np.float32)
    feeds = {"x": x, "p": np.array(pos, np.int64), "c": cache, "s": cache}
    m = one_node("RotaryEmbedding", feeds, domain="com.microsoft")
    with pytest.raises(Exception):
        ort(m, feeds)  # the oracle refuses them too
    rejects("RotaryEmbedding", feeds, domain="com.microsoft", match="outside the cos/sin cache")


def test_ms_rotary_matches_onnxruntime():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 16)).astype(np.float32)
    cache = rng.standard_normal((8, 4)).astype(np.float32)
    sin = rng.standard_normal((8, 4)).astype(np.float32)
    for pos in (np.array([[0, 1, 7], [5, 2, 3]], np.int64), np.array([2], np.int64)):
        agrees("RotaryEmbedding", {"x": x, "p": pos, "c": cache, "s": sin}, oracle=ort, domain="com.microsoft",
               num_heads=2)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_onnx_rotary_rejects_negative_positions(dtype):
    x = np.zeros((1, 1, 2, 8), dtype)
    cache = np.zeros((4, 4), dtype)
    rejects("RotaryEmbedding", {"x": x, "c": cache, "s": cache, "p": np.array([[0, -1]], np.int64)},
            match="outside the cos/sin cache")


# -- Squeeze / Unsqueeze -------------------------------------------------------------------
def test_squeeze_rejects_an_axis_past_the_rank():
    rejects("Squeeze", {"x": X23[None], "a": np.array([3], np.int64)}, match="out of range")
    rejects("Squeeze", {"x": X23[None], "a": np.array([-4], np.int64)}, match="out of range")
    agrees("Squeeze", {"x": X23[None], "a": np.array([-3], np.int64)})


def test_unsqueeze_rejects_repeated_and_out_of_range_axes():
    rejects("Unsqueeze", {"x": X23, "a": np.array([0, 0], np.int64)}, match="repeat")
    rejects("Unsqueeze", {"x": X23, "a": np.array([1, -3], np.int64)}, match="repeat")
    rejects("Unsqueeze", {"x": X23, "a": np.array([4], np.int64)}, match="out of range")
    agrees("Unsqueeze", {"x": X23, "a": np.array([-1, 0], np.int64)})


def test_unsqueeze_constant_repeated_axes_fail_at_plan_time():
    m = one_node("Unsqueeze", {"x": X23, "a": np.array([1, 1], np.int64)})
    m.graph.input.pop()
    m.graph.initializer.append(onnx.numpy_helper.from_array(np.array([1, 1], np.int64), "a"))
    with pytest.raises(of.OnnxforgeError, match="n0"):
        of.InferenceSession(m)


# -- integer Pow -----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_integer_pow_with_negative_exponents_matches_onnxruntime(dtype):
    """onnx.reference refuses negative integer exponents (numpy); onnxruntime truncates the
    double power toward zero, which the backend computes too."""
    a = np.array([2, -2, 1, -1, 3, -3, 5, 0, 7], dtype)
    b = np.array([-1, -1, -5, -3, -2, -4, 0, 0, 2], dtype)
    agrees("Pow", {"a": a, "b": b}, oracle=ort)
    agrees("Pow", {"a": a[a != 0], "b": np.array(-2, np.int64)}, oracle=ort)


def test_integer_pow_of_zero_to_a_negative_power_is_a_typed_error():
    rejects("Pow", {"a": np.array([0, 2], np.int64), "b": np.array([-1, 1], np.int64)}, match="negative power")


def test_kernel_errors_are_kernel_errors():
    with pytest.raises(KernelError):
        ours(one_node("GatherElements", {"x": X23, "i": np.array([[9]], np.int64)}),
             {"x": X23, "i": np.array([[9]], np.int64)})


# -- found by the fuzz harness (tests/fuzz) ---------------------------------------------------
@pytest.mark.parametrize("pads", [[2, -2, 3, -2, -2, -1], [-1, 0, 0, 0, 0, 0], [0, 1, -1, 0, -2, 1]])
def test_pad_crops_after_padding(pads):
    """A negative pad may eat the padding added on the same axis (onnxruntime pads, then crops)."""
    x = np.arange(10, dtype=np.float32).reshape(1, 5, 2)
    agrees("Pad", {"x": x, "p": np.array(pads, np.int64), "v": np.array(3, np.float32)}, oracle=ort)


def test_pad_rejects_a_crop_past_the_axis():
    rejects("Pad", {"x": X23, "p": np.array([-2, 0, -1, 0], np.int64)}, match="crop")


def test_clip_before_opset_11_defaults_to_the_float_range():
    x = np.array([np.inf, -np.inf, 1.0], np.float32)
    agrees("Clip", {"x": x}, opset=6, min=-0.5)
    agrees("Clip", {"x": x}, opset=6)


def test_float16_pow_with_a_float32_exponent_rounds_once():
    a = np.array(1.7, np.float16)
    b = np.linspace(-3, 3, 25).astype(np.float32)
    agrees("Pow", {"a": a, "b": b})


@pytest.mark.parametrize("oracle", [reference, ort])
def test_reduce_log_sum_exp_with_infinities(oracle):
    x = np.array([[np.inf, 1.0, 2.0], [-np.inf, 0.0, 1.0], [np.inf, 0.0, -np.inf]], np.float32)
    agrees("ReduceLogSumExp", {"x": x, "a": np.array([1], np.int64)}, oracle=oracle)


def test_reduce_log_sum_exp_of_an_all_minus_inf_row_is_minus_inf():
    """Rows with no finite entry: log(sum(exp(-inf))) = log(0) = -inf and a row holding +inf
    gives +inf, as onnxruntime computes them (onnx.reference: NaN from -inf - -inf)."""
    x = np.array([[-np.inf, -np.inf], [0.0, 1.0], [np.inf, -np.inf]], np.float32)
    (y,) = agrees("ReduceLogSumExp", {"x": x, "a": np.array([1], np.int64)}, oracle=ort)
    assert y[0, 0] == -np.inf and y[2, 0] == np.inf


def test_reduce_log_sum_exp_of_an_infinite_scalar_matches_onnxruntime():
    agrees("ReduceLogSumExp", {"x": np.array(np.inf, np.float32)}, oracle=ort)


def test_skip_simplified_layer_norm_default_epsilon_is_onnxruntimes():
    x = np.array([[[-0.1], [0.2]]], np.float32)
    feeds = {"x": x, "s": np.zeros_like(x), "g": np.ones(1, np.float32)}
    m = one_node("SkipSimplifiedLayerNormalization", feeds, domain="com.microsoft")
    same(ours(m, feeds), ort(m, feeds))


@pytest.mark.parametrize("op", ["SkipSimplifiedLayerNormalization", "SkipLayerNormalization"])
def test_skip_norms_refuse_the_shapes_onnxruntime_refuses(op):
    x = np.zeros((2, 3, 4), np.float32)
    g = np.ones(4, np.float32)
    rejects(op, {"x": x, "s": np.zeros(4, np.float32), "g": g}, domain="com.microsoft", match="skip shape")
    rejects(op, {"x": x[None], "s": x[None], "g": g}, domain="com.microsoft", match="rank 2 or 3")
    agrees(op, {"x": x, "s": np.ones((3, 4), np.float32), "g": g}, domain="com.microsoft", oracle=ort)


def test_simplified_layer_norm_refuses_an_empty_normalized_axis():
    rejects("SimplifiedLayerNormalization", {"x": np.zeros((2, 0), np.float32), "s": np.zeros(0, np.float32)},
            opset=21, match="no element")


@pytest.mark.parametrize("op,opset", [("LogSoftmax", 23), ("Hardmax", 11), ("Softmax", 11)])
def test_softmax_family_of_an_empty_tensor(op, opset):
    agrees(op, {"x": np.zeros((1, 0, 1, 4), np.float32)}, opset=opset, oracle=ort)


def test_gelu_of_an_empty_tensor_and_float16_sigmoid_of_a_scalar():
    agrees("Gelu", {"x": np.zeros((2, 0), np.float32)})
    agrees("Sigmoid", {"x": np.array(0.5, np.float16)})


def _scan_model(n_inputs: int = 1) -> onnx.ModelProto:
    """A Scan summing each row into a state and emitting the running sum (scan output)."""
    vi = helper.make_tensor_value_info
    body = helper.make_graph(
        [helper.make_node("Add", ["s"] + [f"x{i}" for i in range(n_inputs)][:1], ["s_out"]),
         helper.make_node("Identity", ["s_out"], ["y"])],
        "body", [vi("s", onnx.TensorProto.FLOAT, [3])] + [vi(f"x{i}", onnx.TensorProto.FLOAT, [3])
                                                         for i in range(n_inputs)],
        [vi("s_out", onnx.TensorProto.FLOAT, [3]), vi("y", onnx.TensorProto.FLOAT, [3])])
    xs = [f"xs{i}" for i in range(n_inputs)]
    node = helper.make_node("Scan", ["s0"] + xs, ["s_last", "ys"], name="n0", num_scan_inputs=n_inputs, body=body)
    g = helper.make_graph([node], "g", [vi("s0", onnx.TensorProto.FLOAT, [3])]
                          + [vi(x, onnx.TensorProto.FLOAT, ["t", 3]) for x in xs],
                          [helper.make_empty_tensor_value_info("s_last"), helper.make_empty_tensor_value_info("ys")])
    return typed_outputs(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10))


def test_scan_matches_the_oracles_and_refuses_zero_iterations():
    s0 = np.arange(3, dtype=np.float32)
    xs = np.arange(12, dtype=np.float32).reshape(4, 3)
    model = _scan_model()
    same(ours(model, {"s0": s0, "xs0": xs}), reference(model, {"s0": s0, "xs0": xs}))
    empty = np.zeros((0, 3), np.float32)  # no iteration: no shape for the scan output
    with pytest.raises(KernelError, match="n0.*zero iterations"):
        ours(model, {"s0": s0, "xs0": empty})
    with pytest.raises(Exception):  # onnxruntime refuses it too
        ort(model, {"s0": s0, "xs0": empty})
    two = _scan_model(2)
    with pytest.raises(KernelError, match="n0.*must agree"):
        ours(two, {"s0": s0, "xs0": xs, "xs1": xs[:3]})
