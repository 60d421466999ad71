"""softmax against float64 numpy."""
from __future__ import annotations

import numpy as np
import pytest

from onnxforge.kernels_cy.ops._softmax import softmax
from onnxforge.kernels_cy.errors import KernelDtypeError, KernelError

from . import reference as ref


@pytest.mark.parametrize("rows,n", [(1, 1), (5, 17), (0, 8), (4, 0), (33, 1000)])
def test_softmax_matches_float64(rows, n):
    rng = np.random.default_rng(rows * 7 + n)
    x = (rng.standard_normal((rows, n)) * 10).astype(np.float32)
    out = np.empty_like(x)
    softmax(x, out, num_threads=2)
    np.testing.assert_allclose(out, ref.softmax(x) if x.size else x, atol=1e-7, rtol=2e-6)


def test_large_and_masked_values_are_stable():
    x = np.array([[1e30, 1e30 - 1, -np.inf, 0.0], [-1e4, -1e4, -np.inf, -np.inf],
                  [88.0, -88.0, 0.0, 3.0]], np.float32)
    out = np.empty_like(x)
    softmax(x, out)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, ref.softmax(x), atol=1e-7, rtol=2e-6)
    softmax(x, x)                                   # in place
    np.testing.assert_array_equal(x, out)


def test_all_masked_row_is_nan_like_onnxruntime():
    x = np.full((1, 3), -np.inf, np.float32)
    out = np.empty_like(x)
    softmax(x, out)
    assert np.isnan(out).all()


@pytest.mark.parametrize("bad", ["dtype", "shape", "rank"])
def test_errors_raise_before_writing(bad):
    x = np.zeros((2, 3), np.float32)
    out = np.full((2, 3), 9.0, np.float32)
    if bad == "dtype":
        x = x.astype(np.float64)
    elif bad == "shape":
        out = np.full((2, 4), 9.0, np.float32)
    else:
        x = x.reshape(6)
    with pytest.raises(KernelDtypeError if bad == "dtype" else KernelError, match="softmax"):
        softmax(x, out)
    assert (out == 9.0).all()
