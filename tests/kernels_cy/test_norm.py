"""rms_norm / skip_rms_norm against float64 numpy and onnxruntime's normalization contrib ops."""
from __future__ import annotations

import numpy as np
import pytest

from onnxforge.kernels_cy.norm._norm import rms_norm, skip_rms_norm
from onnxforge.kernels_cy.errors import KernelDtypeError, KernelError

from . import reference as ref
from .oracles import run_ort_node


@pytest.mark.parametrize("rows,hidden", [(1, 128), (7, 33), (0, 16), (3, 1), (64, 512)])
def test_rms_norm_matches_float64(rows, hidden):
    rng = np.random.default_rng(rows + hidden)
    x = rng.standard_normal((rows, hidden)).astype(np.float32)
    w = rng.standard_normal(hidden).astype(np.float32)
    out = np.empty_like(x)
    rms_norm(x, w, 1e-6, out, num_threads=2)
    np.testing.assert_allclose(out, ref.rms_norm(x, w, 1e-6), atol=2e-6, rtol=1e-5)
    rms_norm(x, w, 1e-6, x)                        # in place
    np.testing.assert_array_equal(x, out)


def test_rms_norm_matches_onnxruntime_simplified_layer_norm():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 5, 48)).astype(np.float32)
    w = rng.standard_normal(48).astype(np.float32)
    (expect,) = run_ort_node("SimplifiedLayerNormalization", [("x", x), ("w", w)], 1, domain="",
                             epsilon=1e-5, axis=-1)
    out = np.empty((10, 48), np.float32)
    rms_norm(x.reshape(10, 48), w, 1e-5, out)
    np.testing.assert_allclose(out.reshape(x.shape), expect, atol=1e-6)


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("skip_rows", ["same", "broadcast"])
def test_skip_rms_norm_matches_float64_and_onnxruntime(with_bias, skip_rows):
    rng = np.random.default_rng(2)
    B, S, H = 3, 4, 40
    x = rng.standard_normal((B, S, H)).astype(np.float32)
    skip = rng.standard_normal((B, S, H) if skip_rows == "same" else (S, H)).astype(np.float32)
    bias = rng.standard_normal(H).astype(np.float32) if with_bias else None
    w = rng.standard_normal(H).astype(np.float32)
    out, total = np.empty((B * S, H), np.float32), np.empty((B * S, H), np.float32)
    skip_rms_norm(x.reshape(-1, H), skip.reshape(-1, H), bias, w, 1e-6, out, total, num_threads=2)
    s64 = x.astype(np.float64) + skip.astype(np.float64) + (0 if bias is None else bias)
    np.testing.assert_allclose(total.reshape(x.shape), s64, atol=1e-6)
    np.testing.assert_allclose(out.reshape(x.shape), ref.rms_norm(s64, w, 1e-6), atol=2e-6, rtol=1e-5)
    feeds = [("input", x), ("skip", skip), ("gamma", w), ("bias", bias)]
    outs = run_ort_node("SkipSimplifiedLayerNormalization", feeds, 4, epsilon=1e-6)
    np.testing.assert_allclose(out.reshape(x.shape), outs[0], atol=1e-6)
    np.testing.assert_allclose(total.reshape(x.shape), outs[3], atol=1e-6)
    # without the sum output, and in place over x
    xs = x.reshape(-1, H).copy()
    skip_rms_norm(xs, skip.reshape(-1, H), bias, w, 1e-6, xs)
    np.testing.assert_allclose(xs, out, atol=1e-6)


@pytest.mark.parametrize("case,exc", [
    ("weight_len", KernelError), ("float64", KernelDtypeError), ("float16", KernelDtypeError),
    ("rank", KernelError), ("not_contiguous", KernelError), ("out_shape", KernelError),
    ("skip_rows", KernelError), ("bias_len", KernelError), ("readonly", KernelError),
    ("negative_eps", KernelError), ("not_array", KernelDtypeError),
])
def test_errors_raise_before_writing(case, exc):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 8)).astype(np.float32)
    skip = rng.standard_normal((4, 8)).astype(np.float32)
    w = np.ones(8, np.float32)
    bias = None
    out = np.full((4, 8), 5.0, np.float32)
    eps = 1e-6
    if case == "weight_len":
        w = np.ones(7, np.float32)
    elif case == "float64":
        x = x.astype(np.float64)
    elif case == "float16":
        x = x.astype(np.float16)
    elif case == "rank":
        x = x.reshape(4, 2, 4)
    elif case == "not_contiguous":
        x = np.asfortranarray(x)
    elif case == "out_shape":
        out = np.full((4, 9), 5.0, np.float32)
    elif case == "skip_rows":
        skip = skip[:3].copy()
    elif case == "bias_len":
        bias = np.ones(9, np.float32)
    elif case == "readonly":
        out.flags.writeable = False
    elif case == "negative_eps":
        eps = -1.0
    elif case == "not_array":
        x = x.tolist()
    before = out.copy()
    with pytest.raises(exc, match="skip_rms_norm"):
        skip_rms_norm(x, skip, bias, w, eps, out)
    np.testing.assert_array_equal(out, before)
    if case not in ("skip_rows", "bias_len"):
        with pytest.raises(exc, match="rms_norm"):
            rms_norm(x, w, eps, out)
        np.testing.assert_array_equal(out, before)
