"""BatchNormalization (inference form) and InstanceNormalization through the backend,
against onnxruntime and float64 numpy (and onnx.reference where it is right).

onnx.reference's BatchNormalization at opsets 9 to 13 normalizes by the batch's own
statistics (the training form) even when the node has the one output Y, which the
specification defines as the inference form (and at opsets 6 to 8 it returns a tuple);
below opset 14 the test checks onnxruntime and float64 numpy only.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import onnxforge.backend as backend
from onnxforge.kernels_cy.errors import KernelError, UnsupportedAttributeError

from .helpers import reference

SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TOL = {np.dtype(np.float32): (1e-5, 1e-5), np.dtype(np.float64): (1e-12, 1e-12),
       np.dtype(np.float16): (2e-3, 2e-3)}


def _model(op: str, arrays: dict[str, np.ndarray], opset: int, n_out: int = 1, **attrs):
    el = helper.np_dtype_to_tensor_dtype(arrays["x"].dtype)
    inputs = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape))
              for k, v in arrays.items()]
    outs = [f"y{i}" for i in range(n_out)]
    node = helper.make_node(op, list(arrays), outs, **attrs)
    outputs = [helper.make_tensor_value_info(o, el, None) for o in outs]
    g = helper.make_graph([node], "g", inputs, outputs)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def _ours(model, feeds: dict[str, np.ndarray], threads: int = 1) -> np.ndarray:
    return np.asarray(backend.prepare(model, "CPU", threads=threads).run(feeds)[0])


def _ort(model, feeds: dict[str, np.ndarray]) -> np.ndarray:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 4
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def _close(got: np.ndarray, want: np.ndarray, dtype: np.dtype, conditioning: float = 0.0) -> None:
    """Within the dtype's tolerance, plus ``conditioning`` (the rounding of the inputs the
    operation amplifies: absolute, in output units)."""
    assert got.dtype == dtype and got.shape == want.shape
    rtol, atol = TOL[dtype]
    np.testing.assert_allclose(got.astype(np.float64), np.asarray(want, np.float64), rtol=rtol,
                               atol=atol + conditioning)


def _bn64(x, scale, bias, mean, var, eps):
    shape = (1,) + scale.shape + (1,) * (x.ndim - 1 - scale.ndim)
    f = [np.asarray(v, np.float64).reshape(shape) for v in (scale, bias, mean, var)]
    eps = float(np.float32(eps))  # the attribute is stored as a float32
    return f[0] * (x.astype(np.float64) - f[2]) / np.sqrt(f[3] + eps) + f[1]


def _bn_feeds(rng, shape, dtype, param_shape=None):
    c = shape[1]
    ps = param_shape or (c,)
    return {"x": rng.normal(3.0, 2.0, shape).astype(dtype),
            "scale": rng.normal(1.0, 0.5, ps).astype(dtype),
            "B": rng.normal(0.0, 1.0, ps).astype(dtype),
            "mean": rng.normal(3.0, 1.0, ps).astype(dtype),
            "var": rng.uniform(0.1, 4.0, ps).astype(dtype)}


@SETTINGS
@given(rank=st.integers(2, 5), opset=st.sampled_from([7, 9, 14, 15]), seed=st.integers(0, 2**31),
       dtype=st.sampled_from(["float32", "float32", "float64", "float16"]), threads=st.sampled_from([1, 2]),
       eps=st.sampled_from([1e-5, 1e-2, 0.0]))
def test_batchnorm_matches_onnxruntime_and_float64(rank, opset, seed, dtype, threads, eps):
    rng = np.random.default_rng(seed)
    shape = tuple(int(v) for v in rng.integers(1, 6, size=rank))
    dtype = np.dtype(dtype)
    feeds = _bn_feeds(rng, shape, dtype)
    model = _model("BatchNormalization", feeds, opset, epsilon=eps)
    got = _ours(model, feeds, threads)
    _close(got, _bn64(*feeds.values(), eps), dtype)
    if dtype != np.float16:
        _close(got, _ort(model, feeds), dtype)
    if opset >= 14:  # onnx.reference: the training form at 9-13, a tuple output at 7
        _close(got, reference(model, feeds)[0], dtype)


def test_batchnorm_mixed_parameter_types_at_opset_15():
    rng = np.random.default_rng(7)
    feeds = _bn_feeds(rng, (2, 3, 4, 4), np.float16)
    feeds["mean"] = feeds["mean"].astype(np.float32)
    feeds["var"] = feeds["var"].astype(np.float32)
    model = _model("BatchNormalization", feeds, 15)
    _close(_ours(model, feeds), _bn64(*feeds.values(), 1e-5), np.dtype(np.float16))


def test_batchnorm_large_planes_run_in_parallel_like_onnxruntime():
    rng = np.random.default_rng(8)
    feeds = _bn_feeds(rng, (2, 16, 64, 64), np.float32)
    model = _model("BatchNormalization", feeds, 15)
    _close(_ours(model, feeds, threads=2), _ort(model, feeds), np.dtype(np.float32))


def test_batchnorm_keeps_precision_when_the_mean_is_far_from_zero():
    # x - mean first, then the scale: exact here in float64. onnxruntime folds the mean into
    # the bias (x * a + (B - mean * a)) and loses the difference to rounding at 1e9
    x = (1000.0 + np.arange(8, dtype=np.float32) * 1e-3).reshape(1, 1, 8)
    one = np.ones(1, np.float32)
    feeds = {"x": x, "scale": one * 1000, "B": one * 0, "mean": one * 1000, "var": one * 0}
    model = _model("BatchNormalization", feeds, 15, epsilon=1e-6)
    _close(_ours(model, feeds), _bn64(*feeds.values(), 1e-6), np.dtype(np.float32))


@pytest.mark.parametrize("opset", [6, 7])
def test_batchnorm_spatial_0_has_per_element_parameters(opset):
    rng = np.random.default_rng(opset)
    shape = (3, 2, 4, 5)
    feeds = _bn_feeds(rng, shape, np.float32, param_shape=shape[1:])
    model = _model("BatchNormalization", feeds, opset, spatial=0, epsilon=1e-3)
    _close(_ours(model, feeds), _bn64(*feeds.values(), 1e-3), np.dtype(np.float32))
    # spatial=0 with per-channel parameters is the spatial form
    feeds = _bn_feeds(rng, shape, np.float32)
    model = _model("BatchNormalization", feeds, opset, spatial=0)
    _close(_ours(model, feeds), _bn64(*feeds.values(), 1e-5), np.dtype(np.float32))


def test_batchnorm_spatial_0_matches_onnxruntime_at_opset_7():
    rng = np.random.default_rng(11)
    shape = (2, 3, 4)
    feeds = _bn_feeds(rng, shape, np.float32, param_shape=shape[1:])
    model = _model("BatchNormalization", feeds, 7, spatial=0)
    _close(_ours(model, feeds), _ort(model, feeds), np.dtype(np.float32))


@pytest.mark.parametrize("opset", [14, 15])
def test_batchnorm_training_mode_is_refused_at_prepare_time(opset):
    feeds = _bn_feeds(np.random.default_rng(0), (2, 3, 4), np.float32)
    with pytest.raises(UnsupportedAttributeError, match="training_mode=1"):
        backend.prepare(_model("BatchNormalization", feeds, opset, n_out=3, training_mode=1))


@pytest.mark.parametrize("opset", [7, 9])
def test_batchnorm_training_outputs_are_refused_at_prepare_time(opset):
    feeds = _bn_feeds(np.random.default_rng(0), (2, 3, 4), np.float32)
    with pytest.raises(UnsupportedAttributeError, match="training outputs"):
        backend.prepare(_model("BatchNormalization", feeds, opset, n_out=5))


def test_batchnorm_parameters_of_the_wrong_shape_are_a_clear_error():
    feeds = _bn_feeds(np.random.default_rng(0), (2, 3, 4), np.float32)
    model = _model("BatchNormalization", feeds, 15)
    feeds["var"] = np.ones(4, np.float32)
    with pytest.raises((KernelError, ValueError), match="var|shape"):
        backend.prepare(model).run(feeds)


# -- InstanceNormalization -----------------------------------------------------------------------
def _in64(x, scale, bias, eps):
    eps = float(np.float32(eps))  # the attribute is stored as a float32
    x64 = x.astype(np.float64)
    axes = tuple(range(2, x.ndim))
    mean = x64.mean(axis=axes, keepdims=True)
    var = ((x64 - mean) ** 2).mean(axis=axes, keepdims=True)
    shape = (1, -1) + (1,) * (x.ndim - 2)
    return (x64 - mean) / np.sqrt(var + eps) * scale.astype(np.float64).reshape(shape) \
        + bias.astype(np.float64).reshape(shape)


@SETTINGS
@given(rank=st.integers(3, 5), seed=st.integers(0, 2**31), opset=st.sampled_from([6, 22]),
       dtype=st.sampled_from(["float32", "float32", "float64", "float16"]), threads=st.sampled_from([1, 2]))
def test_instancenorm_matches_onnxruntime_reference_and_float64(rank, seed, opset, dtype, threads):
    rng = np.random.default_rng(seed)
    shape = tuple(int(v) for v in rng.integers(1, 6, size=rank))
    dtype = np.dtype(dtype)
    feeds = {"x": rng.normal(2.0, 3.0, shape).astype(dtype), "scale": rng.normal(1, 0.5, shape[1]).astype(dtype),
             "B": rng.normal(0, 1, shape[1]).astype(dtype)}
    model = _model("InstanceNormalization", feeds, opset, epsilon=1e-3)
    got = _ours(model, feeds, threads)
    want = _in64(*feeds.values(), 1e-3)
    if dtype == np.float16:
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=1e-2, atol=1e-2)
        return
    # a plane of nearly equal values: x - mean cancels, and dividing by sqrt(var + eps) amplifies
    # each input's rounding (one unit in the last place of max |x|) by |scale| / sqrt(eps)
    x, sc = feeds["x"], feeds["scale"]
    cond = 4 * float(np.finfo(dtype).eps) * float(np.abs(x).max(initial=0)) * float(np.abs(sc).max(initial=0)) / 1e-3 ** 0.5
    _close(got, want, dtype, cond)
    if dtype == np.float32:  # onnxruntime has a float32 kernel only
        _close(got, _ort(model, feeds), dtype, 2 * cond)
    _close(got, reference(model, feeds)[0], dtype, 2 * cond)


def test_instancenorm_large_planes_match_onnxruntime():
    rng = np.random.default_rng(9)
    feeds = {"x": rng.normal(5.0, 2.0, (2, 8, 64, 64)).astype(np.float32),
             "scale": rng.normal(1, 0.5, 8).astype(np.float32), "B": rng.normal(0, 1, 8).astype(np.float32)}
    model = _model("InstanceNormalization", feeds, 22)
    _close(_ours(model, feeds, threads=2), _ort(model, feeds), np.dtype(np.float32))


def test_compiled_calls_check_their_operands():
    from onnxforge.kernels_cy.norm._norm import channel_affine, instance_norm

    x = np.zeros((1, 2, 3), np.float32)
    c2 = np.zeros(2, np.float32)
    with pytest.raises(KernelError, match="channels"):
        channel_affine(x, np.zeros(3, np.float32), c2, c2, np.empty_like(x))
    with pytest.raises(KernelError, match="shape"):
        instance_norm(x, c2, c2, 1e-5, np.empty((1, 2, 4), np.float32))
    with pytest.raises(KernelError, match="eps"):
        instance_norm(x, c2, c2, -1.0, np.empty_like(x))
    # in place over x
    x = np.arange(6, dtype=np.float32).reshape(1, 2, 3)
    instance_norm(x, np.ones(2, np.float32), c2, 0.0, x)
    np.testing.assert_allclose(x, np.tile([-1.2247449, 0.0, 1.2247449], (1, 2, 1)), rtol=1e-6)
