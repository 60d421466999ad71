"""The pooling kernels (``kernels_cy/pool``) through the backend, against onnxruntime,
onnx.reference and a float64 brute force written from the operator specification.

Where the oracles disagree with the specification the test says which one it trusts:

* onnxruntime pads ``auto_pad=SAME_*`` as if the kernel had no dilation, and with a stride
  longer than the kernel it computes a negative padding (refused, or misread) where the
  specification pads by ``max(0, ...)``; it also applies ``ceil_mode`` to
  ``auto_pad=VALID``. Those forms are checked against the specification's brute force
  (and onnx.reference) instead.
* onnxruntime's MaxPool without the Indices output (its vectorized path) treats a NaN in a
  window by the order of its vector lanes; with the Indices output (its general path) it
  keeps the window's first valid value and replaces it by a strictly greater one, which is
  also onnx.reference's rule and ours: NaN cases are checked against that path.
* onnx.reference's GlobalMaxPool reduces the wrong axes for rank 3 and onnxruntime's leaves
  NaN to vector-lane order: GlobalMaxPool is checked against onnxruntime without NaN and
  against numpy's float64 maximum (NaN propagates) with NaN.
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import onnxforge.backend as backend
from onnxforge.kernels_cy.errors import KernelDtypeError, KernelError, UnsupportedAttributeError
from onnxforge.proto_ext.errors import VerificationError

from .helpers import reference

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# -- models and oracles --------------------------------------------------------------------------
def _model(op: str, x: np.ndarray, n_out: int = 1, opset: int = 22, **attrs):
    el = helper.np_dtype_to_tensor_dtype(x.dtype)
    outs = [f"y{i}" for i in range(n_out)]
    node = helper.make_node(op, ["x"], outs, **attrs)
    outputs = [helper.make_tensor_value_info(o, el if i == 0 else TensorProto.INT64, None)
               for i, o in enumerate(outs)]
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", el, list(x.shape))], outputs)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def _ours(model, x: np.ndarray, threads: int = 1) -> list[np.ndarray]:
    return [np.asarray(o) for o in backend.prepare(model, "CPU", threads=threads).run([x])]


def _ort(model, x: np.ndarray) -> list[np.ndarray]:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    so.log_severity_level = 4
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})


def _spec_axis(size: int, k: int, s: int, d: int, pb: int, pe: int, auto_pad: str, ceil: bool):
    """Output length and effective pads of one axis, as the operator specification gives them."""
    ek = (k - 1) * d + 1
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out = math.ceil(size / s)
        total = max(0, (out - 1) * s + ek - size)
        pb = total // 2 if auto_pad == "SAME_UPPER" else (total + 1) // 2
        return out, pb, total - pb
    if auto_pad == "VALID":
        return math.ceil((size - ek + 1) / s), 0, 0
    span = (size + pb + pe - ek) / s
    out = (math.ceil(span) if ceil else math.floor(span)) + 1
    if ceil and (out - 1) * s >= size + pb:  # the last window must start inside input or begin padding
        out -= 1
    return out, pb, pe


def _brute(x: np.ndarray, kind: str, kernel, strides, dil, pads, auto_pad="NOTSET", ceil=False,
           include_pad=False, p=2.0, storage_order=0):
    """Every window of every output position in float64 (``kind``: max, avg or lp)."""
    n = len(kernel)
    spatial = x.shape[2:]
    geo = [_spec_axis(spatial[a], kernel[a], strides[a], dil[a], pads[a], pads[a + n], auto_pad, ceil)
           for a in range(n)]
    out = tuple(g[0] for g in geo)
    y = np.zeros(x.shape[:2] + out, np.float64)
    idx = np.full(y.shape, -1, np.int64)
    plane = int(np.prod(spatial))
    xf = x.astype(np.float64)
    lowest = float((np.finfo if x.dtype.kind == "f" else np.iinfo)(x.dtype).min)
    for b, c in itertools.product(range(x.shape[0]), range(x.shape[1])):
        for o in itertools.product(*(range(v) for v in out)):
            best, bi, acc, cnt = None, -1, 0.0, 0
            for j in itertools.product(*(range(k) for k in kernel)):
                t = [o[a] * strides[a] - geo[a][1] + j[a] * dil[a] for a in range(n)]
                inside = all(0 <= t[a] < spatial[a] for a in range(n))
                padded = all(-geo[a][1] <= t[a] < spatial[a] + geo[a][2] for a in range(n))
                cnt += inside or (include_pad and padded)
                if not inside:
                    continue
                v = xf[(b, c, *t)]
                if kind == "max":
                    if best is None or v > best:
                        best = v
                        if storage_order == 0:
                            bi = int(np.ravel_multi_index((b, c, *t), x.shape))
                        else:
                            bi = (b * x.shape[1] + c) * plane + sum(t[a] * int(np.prod(spatial[:a])) for a in range(n))
                elif kind == "avg":
                    acc += v
                else:
                    acc += abs(v) ** p
            if kind == "max":  # no tap inside the input: the lowest value, as onnxruntime gives
                y[(b, c, *o)] = lowest if best is None else best
                idx[(b, c, *o)] = bi
            elif kind == "avg":
                y[(b, c, *o)] = acc / cnt if cnt else 0.0
            else:
                y[(b, c, *o)] = acc ** (1.0 / p)
    return y, idx


def _close(got: np.ndarray, want: np.ndarray, dtype: np.dtype) -> None:
    assert got.dtype == dtype and got.shape == want.shape, (got.dtype, got.shape, want.shape)
    tol = {np.dtype(np.float16): (2e-3, 2e-3), np.dtype(np.float64): (1e-12, 1e-12)}.get(dtype, (1e-5, 1e-6))
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol[0], atol=tol[1])


# -- random configurations -----------------------------------------------------------------------
@st.composite
def windows(draw, *, dilations: bool = True, max_rank: int = 3):
    n = draw(st.integers(1, max_rank))
    kernel = [draw(st.integers(1, 4 if n < 3 else 3)) for _ in range(n)]
    strides = [draw(st.integers(1, 3)) for _ in range(n)]
    dil = [draw(st.integers(1, 3)) if dilations else 1 for _ in range(n)]
    auto_pad = draw(st.sampled_from(["NOTSET", "NOTSET", "NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"]))
    pads = [draw(st.integers(0, kernel[a % n] - 1)) for a in range(2 * n)] if auto_pad == "NOTSET" else [0] * 2 * n
    ceil = draw(st.booleans()) if auto_pad == "NOTSET" else False
    spatial = [draw(st.integers(1, 7 if n < 3 else 5)) for _ in range(n)]
    batch = (draw(st.integers(1, 2)), draw(st.integers(1, 3)))
    geo = [_spec_axis(spatial[a], kernel[a], strides[a], dil[a], pads[a], pads[a + n], auto_pad, ceil)
           for a in range(n)]
    assume(all(g[0] >= 1 for g in geo))
    return {"shape": batch + tuple(spatial), "kernel": kernel, "strides": strides, "dil": dil,
            "auto_pad": auto_pad, "pads": pads, "ceil": ceil}


def _attrs(w: dict, *, dilations: bool = True) -> dict:
    attrs = {"kernel_shape": w["kernel"], "strides": w["strides"], "auto_pad": w["auto_pad"]}
    if w["auto_pad"] == "NOTSET":
        attrs["pads"] = w["pads"]
        attrs["ceil_mode"] = int(w["ceil"])
    if dilations:
        attrs["dilations"] = w["dil"]
    return attrs


def _ort_trusted(w: dict) -> bool:
    """onnxruntime follows the specification here (see the module docstring)."""
    if not w["auto_pad"].startswith("SAME"):
        return True
    return all(d == 1 and s <= k for d, s, k in zip(w["dil"], w["strides"], w["kernel"]))


def _values(rng: np.random.Generator, dtype: np.dtype, shape) -> np.ndarray:
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, endpoint=True, dtype=dtype)
    # distinct values: the maximum (and its index) is unique
    return (rng.permutation(int(np.prod(shape))).reshape(shape) * 0.37 - 40.0).astype(dtype)


# -- MaxPool -------------------------------------------------------------------------------------
@SETTINGS
@given(w=windows(), dtype=st.sampled_from(["float32", "float32", "float64", "float16", "int8", "uint8"]),
       indices=st.booleans(), storage_order=st.integers(0, 1), seed=st.integers(0, 2**31))
def test_maxpool_matches_onnxruntime_and_the_specification(w, dtype, indices, storage_order, seed):
    dtype = np.dtype(dtype)
    x = _values(np.random.default_rng(seed), dtype, w["shape"])
    attrs = _attrs(w)
    if indices:
        attrs["storage_order"] = storage_order
    model = _model("MaxPool", x, 2 if indices else 1, **attrs)
    got = _ours(model, x)
    y, idx = _brute(x, "max", w["kernel"], w["strides"], w["dil"], w["pads"], w["auto_pad"], w["ceil"],
                    storage_order=storage_order if indices else 0)
    assert got[0].dtype == dtype
    np.testing.assert_array_equal(got[0], y.astype(dtype))  # a maximum is exact
    if indices:
        np.testing.assert_array_equal(got[1], idx)
    if _ort_trusted(w) and dtype != np.float16:
        ort = _ort(model, x)
        np.testing.assert_array_equal(got[0], ort[0])
        if indices:  # a window with no tap inside the input: onnxruntime's index is -1 - 1 per axis
            np.testing.assert_array_equal(got[1][idx >= 0], ort[1][idx >= 0])


@SETTINGS
@given(w=windows(), seed=st.integers(0, 2**31), threads=st.sampled_from([1, 2]))
def test_maxpool_nan_follows_the_first_valid_then_strictly_greater_rule(w, seed, threads):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(w["shape"]).astype(np.float32)
    x[rng.random(x.shape) < 0.3] = np.nan
    model = _model("MaxPool", x, 2, **_attrs(w))
    got = _ours(model, x, threads)
    y, idx = _brute(x, "max", w["kernel"], w["strides"], w["dil"], w["pads"], w["auto_pad"], w["ceil"])
    np.testing.assert_array_equal(got[0], y.astype(np.float32))
    np.testing.assert_array_equal(got[1], idx)
    if _ort_trusted(w):  # onnxruntime's general (index-producing) path
        ort_y, ort_idx = _ort(model, x)
        np.testing.assert_array_equal(got[0], ort_y)
        np.testing.assert_array_equal(got[1][idx >= 0], ort_idx[idx >= 0])


def test_maxpool_agrees_with_onnx_reference_on_a_plain_window():
    x = np.random.default_rng(3).standard_normal((2, 3, 9, 8)).astype(np.float32)
    model = _model("MaxPool", x, 1, kernel_shape=[3, 2], strides=[2, 2], pads=[1, 0, 1, 1])
    np.testing.assert_array_equal(_ours(model, x)[0], reference(model, {"x": x})[0])


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_maxpool_8bit_with_padding_never_takes_the_padding(dtype):
    info = np.iinfo(dtype)
    x = np.full((1, 2, 4, 4), info.min, dtype=dtype)  # every value is the type's minimum
    model = _model("MaxPool", x, 2, kernel_shape=[3, 3], pads=[2, 2, 2, 2], strides=[2, 2])
    y, idx = _ours(model, x)
    ort_y, ort_idx = _ort(model, x)
    np.testing.assert_array_equal(y, ort_y)
    np.testing.assert_array_equal(idx, ort_idx)
    assert (y == info.min).all()


def test_valid_padding_ignores_ceil_mode_as_the_specification_says():
    # onnxruntime adds a window here (output 3); the specification's formula and
    # onnx.reference give 2
    x = np.arange(6, dtype=np.float32).reshape(1, 1, 6)
    model = _model("MaxPool", x, 1, kernel_shape=[3], strides=[2], ceil_mode=1, auto_pad="VALID")
    got = _ours(model, x)[0]
    np.testing.assert_array_equal(got, reference(model, {"x": x})[0])
    assert got.tolist() == [[[2.0, 4.0]]]


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize("opset", [12, 19, 22])
def test_ceil_mode_drops_a_last_window_that_would_start_in_the_end_padding(op, opset):
    # size 5, kernel 2, stride 2, pads 1/1: ceil((5 + 2 - 2) / 2) + 1 = 4 windows, but the
    # fourth would start at padded position 6 >= 5 + 1, in the end padding; onnxruntime and
    # onnx.reference drop it at every opset (onnx's shape inference only from opset 22)
    x = np.arange(1, 6, dtype=np.float32).reshape(1, 1, 5)
    model = _model(op, x, 1, opset=opset, kernel_shape=[2], strides=[2], pads=[1, 1], ceil_mode=1)
    got = _ours(model, x)[0]
    assert got.shape == (1, 1, 3)
    np.testing.assert_allclose(got, _ort(model, x)[0], rtol=1e-6)
    np.testing.assert_allclose(got, reference(model, {"x": x})[0], rtol=1e-6)


def test_a_spatial_rank_of_four_runs_in_numpy():
    rng = np.random.default_rng(5)
    x = _values(rng, np.dtype(np.float32), (1, 2, 3, 4, 3, 4))
    kernel, strides, dil, pads = [2, 3, 1, 2], [1, 2, 1, 2], [1, 1, 2, 1], [1, 0, 0, 1, 0, 1, 0, 0]
    model = _model("MaxPool", x, 2, kernel_shape=kernel, strides=strides, dilations=dil, pads=pads)
    y, idx = _ours(model, x)
    want, want_idx = _brute(x, "max", kernel, strides, dil, pads)
    np.testing.assert_array_equal(y, want.astype(np.float32))
    np.testing.assert_array_equal(idx, want_idx)
    model = _model("AveragePool", x, 1, kernel_shape=kernel, strides=strides, dilations=dil, pads=pads,
                   count_include_pad=1)
    _close(_ours(model, x)[0], _brute(x, "avg", kernel, strides, dil, pads, include_pad=True)[0], x.dtype)


def test_empty_batch_gives_an_empty_output():
    x = np.zeros((0, 3, 5, 5), np.float32)
    model = _model("MaxPool", x, 2, kernel_shape=[2, 2])
    y, idx = _ours(model, x)
    assert y.shape == idx.shape == (0, 3, 4, 4)


# -- AveragePool and LpPool ----------------------------------------------------------------------
@SETTINGS
@given(w=windows(), dtype=st.sampled_from(["float32", "float32", "float64", "float16"]),
       include_pad=st.booleans(), seed=st.integers(0, 2**31), threads=st.sampled_from([1, 2]))
def test_averagepool_matches_onnxruntime_and_the_specification(w, dtype, include_pad, seed, threads):
    dtype = np.dtype(dtype)
    x = np.random.default_rng(seed).uniform(-3, 3, w["shape"]).astype(dtype)
    model = _model("AveragePool", x, 1, count_include_pad=int(include_pad), **_attrs(w))
    got = _ours(model, x, threads)[0]
    want = _brute(x, "avg", w["kernel"], w["strides"], w["dil"], w["pads"], w["auto_pad"], w["ceil"],
                  include_pad=include_pad)[0]
    _close(got, want, dtype)
    if _ort_trusted(w) and dtype == np.float32:
        _close(got, _ort(model, x)[0], dtype)


def test_averagepool_propagates_nan_like_onnxruntime():
    x = np.array([[[1.0, np.nan, 3.0, 4.0]]], np.float32)
    model = _model("AveragePool", x, 1, kernel_shape=[2])
    np.testing.assert_array_equal(_ours(model, x)[0], _ort(model, x)[0])  # [nan, nan, 3.5]


@pytest.mark.parametrize("opset", [7, 10, 11, 19])
def test_averagepool_older_opsets_match_onnxruntime(opset):
    x = np.random.default_rng(opset).standard_normal((2, 2, 7, 6)).astype(np.float32)
    attrs = {"kernel_shape": [3, 2], "strides": [2, 1], "pads": [1, 0, 1, 1], "count_include_pad": 1}
    if opset >= 10:
        attrs["ceil_mode"] = 1
    model = _model("AveragePool", x, 1, opset=opset, **attrs)
    _close(_ours(model, x)[0], _ort(model, x)[0], x.dtype)


@SETTINGS
@given(w=windows(), dtype=st.sampled_from(["float32", "float32", "float64"]), p=st.sampled_from([1, 2, 3]),
       seed=st.integers(0, 2**31))
def test_lppool_matches_onnxruntime_and_the_specification(w, dtype, p, seed):
    dtype = np.dtype(dtype)
    x = np.random.default_rng(seed).uniform(-3, 3, w["shape"]).astype(dtype)
    model = _model("LpPool", x, 1, p=p, **_attrs(w))
    got = _ours(model, x)[0]
    want = _brute(x, "lp", w["kernel"], w["strides"], w["dil"], w["pads"], w["auto_pad"], w["ceil"], p=p)[0]
    _close(got, want, dtype)
    if _ort_trusted(w) and dtype == np.float32:
        _close(got, _ort(model, x)[0], dtype)


# -- global pools --------------------------------------------------------------------------------
@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
@pytest.mark.parametrize("shape", [(2, 3, 5), (1, 4, 3, 6), (2, 2, 3, 1, 4), (1, 1, 1, 1), (3, 2, 7)])
@pytest.mark.parametrize("dtype", [np.float32])  # onnxruntime has float32 global pools only
def test_global_pools_match_onnxruntime(op, shape, dtype):
    x = np.random.default_rng(len(shape)).standard_normal(shape).astype(dtype)
    model = _model(op, x, 1, opset=22)
    got = _ours(model, x, threads=2)[0]
    _close(got, _ort(model, x)[0], np.dtype(dtype))
    assert got.shape == shape[:2] + (1,) * (len(shape) - 2)


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"])
@SETTINGS
@given(rank=st.integers(3, 6), seed=st.integers(0, 2**31), nan=st.booleans(),
       dtype=st.sampled_from(["float32", "float64", "float16"]))
def test_global_pools_match_float64_numpy(op, rank, seed, nan, dtype):
    rng = np.random.default_rng(seed)
    shape = tuple(int(v) for v in rng.integers(1, 5, size=rank))
    x = rng.standard_normal(shape).astype(dtype)
    if nan:
        x[rng.random(shape) < 0.2] = np.nan
    attrs = {"p": 3} if op == "GlobalLpPool" else {}
    got = _ours(_model(op, x, 1, opset=22 if op != "GlobalLpPool" else 2, **attrs), x)[0]
    x64 = x.astype(np.float64).reshape(shape[:2] + (-1,))
    want = {"GlobalAveragePool": lambda: x64.mean(axis=2), "GlobalMaxPool": lambda: x64.max(axis=2),
            "GlobalLpPool": lambda: (np.abs(x64) ** 3).sum(axis=2) ** (1 / 3)}[op]()
    _close(got, want.reshape(shape[:2] + (1,) * (rank - 2)), np.dtype(dtype))


# -- refusals and the compiled calls --------------------------------------------------------------
@pytest.mark.parametrize("attrs", [
    {},                                                          # no kernel_shape
    {"kernel_shape": [2, 2], "pads": [1, 1]},                    # pads of the wrong length
    {"kernel_shape": [2, 2], "pads": [0, -1, 0, 0]},              # a negative pad
    {"kernel_shape": [2, 0]},                                    # an empty kernel axis
    {"kernel_shape": [2, 2], "strides": [1, 0]},                 # a zero stride
    {"kernel_shape": [2, 2], "auto_pad": "SAME", "pads": [0, 0, 0, 0]},
    {"kernel_shape": [2, 2], "auto_pad": "SAME_UPPER", "pads": [1, 0, 0, 0]},
    {"kernel_shape": [2, 2], "storage_order": 2},
])
def test_bad_window_attributes_are_refused_at_prepare_time(attrs):
    # onnx's checker (run when the model is loaded) refuses most; the kernel checks again
    x = np.zeros((1, 1, 4, 4), np.float32)
    with pytest.raises((UnsupportedAttributeError, VerificationError), match="MaxPool|kernel_shape"):
        backend.prepare(_model("MaxPool", x, 1, opset=22, **attrs))


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_a_kernel_longer_than_the_padded_input_follows_the_output_formula(op):
    # floor((2 - 3) / 2 + 1) = 0 windows (onnx.reference: empty; onnxruntime's integer
    # division makes it 1); with ceil_mode ceil(0.5) = 1 window, holding input taps only
    x = np.array([[[1.0, 2.0]]], np.float32)
    model = _model(op, x, 1, kernel_shape=[3], strides=[2])
    assert _ours(model, x)[0].shape == reference(model, {"x": x})[0].shape == (1, 1, 0)
    model = _model(op, x, 1, kernel_shape=[3], strides=[2], ceil_mode=1)
    got = _ours(model, x)[0]
    np.testing.assert_array_equal(got, _ort(model, x)[0])
    np.testing.assert_array_equal(got, reference(model, {"x": x})[0])


def test_pool_nd_checks_its_operands():
    from onnxforge.kernels_cy.pool._pool import MODE_MAX, global_pool, pool_nd

    x = np.zeros((1, 1, 4), np.float32)
    y = np.zeros((1, 1, 3), np.float32)
    with pytest.raises(KernelDtypeError, match="float32"):
        pool_nd(x.astype(np.float64), y, None, MODE_MAX, [2], [1], [1], [0], [0])
    with pytest.raises(KernelError, match="kernel"):
        pool_nd(x, y, None, MODE_MAX, [2, 2], [1], [1], [0], [0])
    with pytest.raises(KernelError, match="idx"):
        pool_nd(x, y, np.zeros((1, 1, 3), np.int32), MODE_MAX, [2], [1], [1], [0], [0])
    with pytest.raises(KernelError, match="past the input"):
        pool_nd(x, np.zeros((1, 1, 9), np.float32), None, MODE_MAX, [1], [1], [1], [0], [5])
    with pytest.raises(KernelError, match="empty row"):
        global_pool(np.zeros((2, 0), np.float32), np.zeros(2, np.float32), MODE_MAX)


@pytest.mark.parametrize(("op", "attrs"), [
    ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ("AveragePool", {"kernel_shape": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1], "count_include_pad": 1}),
    ("LpPool", {"kernel_shape": [2, 2], "strides": [2, 2], "p": 2}),
    ("GlobalAveragePool", {}),
])
def test_large_planes_run_in_parallel_like_onnxruntime(op, attrs):
    x = np.random.default_rng(4).standard_normal((2, 16, 48, 40)).astype(np.float32)
    model = _model(op, x, 1, **attrs)
    _close(_ours(model, x, threads=2)[0], _ort(model, x)[0], x.dtype)


@pytest.mark.parametrize("shape", [(2, 3, 41), (2, 3, 5, 37), (1, 2, 3, 4, 29)])
@pytest.mark.parametrize("stride", [1, 2, 3])
def test_long_rows_without_indices_match_the_indexed_path_with_nan(shape, stride):
    # a long last axis runs its inner windows as one pass per row; with NaN its maxima must
    # still follow the indexed path's rule (onnxruntime's general path, asked for indices)
    rng = np.random.default_rng(stride)
    x = rng.standard_normal(shape).astype(np.float32)
    x[rng.random(shape) < 0.2] = np.nan
    n = len(shape) - 2
    attrs = {"kernel_shape": [2] * (n - 1) + [3], "strides": [1] * (n - 1) + [stride],
             "pads": [1] * n + [0] * (n - 1) + [2], "dilations": [1] * (n - 1) + [2 if stride == 3 else 1]}
    y = _ours(_model("MaxPool", x, 1, **attrs), x)[0]
    np.testing.assert_array_equal(y, _ort(_model("MaxPool", x, 2, **attrs), x)[0])
    for op, extra in (("AveragePool", {"count_include_pad": 1}), ("AveragePool", {}), ("LpPool", {"p": 3})):
        xf = np.nan_to_num(x)
        model = _model(op, xf, 1, **attrs, **extra)
        _close(_ours(model, xf)[0], _ort(model, xf)[0], xf.dtype)
