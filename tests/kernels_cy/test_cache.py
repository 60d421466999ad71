"""cache_update (ai.onnxforge CacheUpdate): in-place writes, per-row positions, range errors."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from onnxforge.kernels_cy.runtime._buffers import buffer_address
from onnxforge.kernels_cy.cache._cache import cache_update
from onnxforge.kernels_cy.errors import CacheRangeError, KernelDtypeError, KernelError


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16, np.int8, np.uint8])
def test_scalar_position_writes_in_place(dtype):
    rng = np.random.default_rng(0)
    cache = np.zeros((2, 3, 10, 5), dtype)
    values = rng.integers(1, 100, size=(2, 3, 4, 5)).astype(dtype)
    addr = buffer_address(cache)
    assert cache_update(cache, values, 3) == 7
    assert buffer_address(cache) == addr
    expect = np.zeros((2, 3, 10, 5), dtype)
    expect[:, :, 3:7] = values
    np.testing.assert_array_equal(cache, expect)


def test_per_row_positions_and_lengths():
    rng = np.random.default_rng(1)
    cache = np.zeros((3, 2, 8, 4), np.float32)
    values = rng.standard_normal((3, 2, 2, 4)).astype(np.float32)
    lens = np.zeros(3, np.int64)
    assert cache_update(cache, values, np.array([0, 6, 3], np.int32), out_len=lens) == 8
    np.testing.assert_array_equal(lens, [2, 8, 5])
    expect = np.zeros_like(cache)
    for b, p in enumerate([0, 6, 3]):
        expect[b, :, p:p + 2] = values[b]
    np.testing.assert_array_equal(cache, expect)


@pytest.mark.parametrize("axis", [0, 1, 2, -1, -3])
def test_other_axes_match_numpy_slices(axis):
    rng = np.random.default_rng(2)
    cache = rng.standard_normal((4, 5, 6)).astype(np.float32)
    shape = list(cache.shape)
    shape[axis] = 2
    values = rng.standard_normal(shape).astype(np.float32)
    expect = cache.copy()
    idx = [slice(None)] * 3
    idx[axis] = slice(1, 3)
    expect[tuple(idx)] = values
    cache_update(cache, values, np.int64(1), axis=axis)
    np.testing.assert_array_equal(cache, expect)


def test_empty_values_and_zero_capacity():
    cache = np.zeros((1, 2, 4, 3), np.float32)
    assert cache_update(cache, np.zeros((1, 2, 0, 3), np.float32), 4) == 4
    empty = np.zeros((1, 2, 0, 3), np.float32)
    assert cache_update(empty, np.zeros((1, 2, 0, 3), np.float32), 0) == 0
    with pytest.raises(CacheRangeError):
        cache_update(empty, np.zeros((1, 2, 1, 3), np.float32), 0)


@pytest.mark.parametrize("case,exc", [
    ("overflow", CacheRangeError), ("negative", CacheRangeError),
    ("row_overflow", CacheRangeError), ("row_negative", CacheRangeError),
    ("dtype_mismatch", KernelDtypeError), ("unsupported_dtype", KernelDtypeError),
    ("shape", KernelError), ("rank", KernelError), ("axis", KernelError),
    ("readonly", KernelError), ("not_contiguous", KernelError), ("float_position", KernelDtypeError),
    ("positions_len", KernelError), ("float_positions", KernelDtypeError),
])
def test_errors_write_nothing(case, exc):
    rng = np.random.default_rng(3)
    cache = rng.standard_normal((2, 2, 6, 4)).astype(np.float32)
    values = rng.standard_normal((2, 2, 3, 4)).astype(np.float32)
    before = cache.copy()
    position: object = 1
    kw: dict = {}
    if case == "overflow":
        position = 4
    elif case == "negative":
        position = -1
    elif case == "row_overflow":
        position = np.array([0, 4])
    elif case == "row_negative":
        position = np.array([2, -1])
    elif case == "dtype_mismatch":
        values = values.astype(np.float16)
    elif case == "unsupported_dtype":
        cache, values = cache.astype(np.float64), values.astype(np.float64)
        before = cache.copy()
    elif case == "shape":
        values = values[:, :, :, :3].copy()
    elif case == "rank":
        values = values[0]
    elif case == "axis":
        kw["axis"] = 4
    elif case == "readonly":
        cache.flags.writeable = False
    elif case == "not_contiguous":
        cache = np.asfortranarray(cache)
    elif case == "float_position":
        position = 1.5
    elif case == "positions_len":
        position = np.array([0, 1, 2])
    elif case == "float_positions":
        position = np.array([0.0, 1.0])
    with pytest.raises(exc, match="cache_update"):
        cache_update(cache, values, position, **kw)
    np.testing.assert_array_equal(cache, before)
