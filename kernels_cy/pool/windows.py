"""Pooling windows in numpy for any dtype and any number of spatial axes: the path the
compiled float32 windows (``_pool``) do not take (float16, float64, int8, uint8, more than
three spatial axes, or no compiled module).

Each kernel tap is one strided view of the zero-padded input over every output position;
a tap's validity (inside the input, or inside input + padding for ``count_include_pad``)
is the outer product of one boolean per axis, so the work is ``prod(kernel)`` vectorized
passes over the output.

MaxPool keeps the window's first valid value and replaces it by each later value that is
strictly greater (taps in row-major order): the rule of the operator's reference
implementation and of onnxruntime's general pooling path, which fixes what a NaN does (a
NaN first in its window stays; a NaN later is skipped). A window with no valid tap (dilated taps that all fall in the
padding) gives, as onnxruntime does, the type's lowest finite value and index -1 for
MaxPool and 0 for AveragePool and LpPool.
"""
from __future__ import annotations

import itertools

import numpy as np

from onnxforge.kernels_cy.pool.geometry import Axes

__all__ = ["avg_pool", "lp_pool", "max_pool"]


def _padded(x: np.ndarray, g: Axes, dtype: np.dtype) -> np.ndarray:
    """``x`` (as ``dtype``) in a zero array long enough for every tap of every window."""
    shape = list(x.shape[:2])
    for a in range(len(g.inp)):
        need = (g.out[a] - 1) * g.strides[a] + (g.kernel[a] - 1) * g.dilations[a] + 1
        shape.append(max(need, g.pad_begin[a] + g.inp[a]))
    p = np.zeros(shape, dtype=dtype)
    p[(slice(None), slice(None)) + tuple(slice(pb, pb + i) for pb, i in zip(g.pad_begin, g.inp))] = x
    return p


def _tap(p: np.ndarray, g: Axes, tap: tuple[int, ...]) -> np.ndarray:
    return p[(slice(None), slice(None)) + tuple(
        slice(j * d, j * d + (o - 1) * s + 1, s) for j, d, o, s in zip(tap, g.dilations, g.out, g.strides))]


def _coords(g: Axes, a: int, j: int) -> np.ndarray:
    """Input coordinate of tap ``j`` of axis ``a`` for each output position on that axis."""
    return np.arange(g.out[a], dtype=np.int64) * g.strides[a] - g.pad_begin[a] + j * g.dilations[a]


def _bcast(v: np.ndarray, a: int, n: int) -> np.ndarray:
    """A 1-D per-axis vector shaped to broadcast over ``[N, C, *out]`` along axis ``a``."""
    return v.reshape((1, 1) + tuple(-1 if b == a else 1 for b in range(n)))


def _count(g: Axes, include_pad: bool) -> np.ndarray:
    """Valid taps of each window: the product of the per-axis counts."""
    n = len(g.inp)
    total = np.ones((1, 1) + (1,) * n, dtype=np.int64)
    for a in range(n):
        lo, hi = (-g.pad_begin[a], g.inp[a] + g.pad_end[a]) if include_pad else (0, g.inp[a])
        c = sum(((t >= lo) & (t < hi)).astype(np.int64) for t in (_coords(g, a, j) for j in range(g.kernel[a])))
        total = total * _bcast(np.asarray(c, dtype=np.int64), a, n)
    return total


def _acc_dtype(dtype: np.dtype) -> np.dtype:
    return np.dtype(np.float64) if dtype == np.float64 else np.dtype(np.float32)


def avg_pool(x: np.ndarray, g: Axes, include_pad: bool) -> np.ndarray:
    """AveragePool: the sum of the valid taps over their count (padding counted as zeros
    when ``include_pad``); NaN propagates, a window with no tap gives 0."""
    acc = _acc_dtype(x.dtype)
    p = _padded(x, g, acc)
    total = np.zeros(x.shape[:2] + g.out, dtype=acc)
    for tap in itertools.product(*(range(k) for k in g.kernel)):
        total += _tap(p, g, tap)
    y = total / np.maximum(_count(g, include_pad), 1).astype(acc)  # no tap: a sum of 0 over 1
    return y.astype(x.dtype, copy=False)


def lp_pool(x: np.ndarray, g: Axes, p: float) -> np.ndarray:
    """LpPool: ``(sum |x|**p) ** (1/p)`` over the valid taps (padding adds nothing)."""
    acc = _acc_dtype(x.dtype)
    a = np.abs(_padded(x, g, acc))
    a = a * a if p == 2.0 else (a if p == 1.0 else np.power(a, acc.type(p)))
    total = np.zeros(x.shape[:2] + g.out, dtype=acc)
    for tap in itertools.product(*(range(k) for k in g.kernel)):
        total += _tap(a, g, tap)
    y = np.sqrt(total) if p == 2.0 else (total if p == 1.0 else np.power(total, acc.type(1.0 / p)))
    return y.astype(x.dtype, copy=False)


def max_pool(x: np.ndarray, g: Axes, storage_order: int, want_indices: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """MaxPool and, when ``want_indices``, the flat input index of each maximum (row-major
    over ``[N, C, *spatial]``; column-major over the spatial axes when ``storage_order``
    is 1)."""
    n = len(g.inp)
    out_shape = x.shape[:2] + g.out
    p = _padded(x, g, x.dtype)
    best = np.zeros(out_shape, dtype=x.dtype)
    have = np.zeros(out_shape, dtype=bool)
    idx = np.full(out_shape, -1, dtype=np.int64) if want_indices else None
    if want_indices:
        plane = int(np.prod(g.inp, dtype=np.int64))
        nc = x.shape[0] * x.shape[1]
        base = (np.arange(nc, dtype=np.int64) * plane).reshape(x.shape[:2] + (1,) * n)
        weights = []  # the flat-index weight of each spatial axis
        for a in range(n):
            if storage_order == 1:
                weights.append(int(np.prod(g.inp[:a], dtype=np.int64)))
            else:
                weights.append(int(np.prod(g.inp[a + 1:], dtype=np.int64)))
    for tap in itertools.product(*(range(k) for k in g.kernel)):
        valid = np.ones((1, 1) + (1,) * n, dtype=bool)
        flat = base if want_indices else None
        for a, j in enumerate(tap):
            t = _coords(g, a, j)
            valid = valid & _bcast((t >= 0) & (t < g.inp[a]), a, n)
            if want_indices:
                flat = flat + _bcast(t * weights[a], a, n)
        v = _tap(p, g, tap)
        with np.errstate(invalid="ignore"):
            upd = valid & (~have | (v > best))
        np.copyto(best, v, where=upd)
        if want_indices:
            np.copyto(idx, np.broadcast_to(flat, out_shape), where=upd)
        have |= valid
    if not have.all():
        empty = np.finfo(x.dtype).min if np.issubdtype(x.dtype, np.floating) else np.iinfo(x.dtype).min
        best[~have] = empty
    return best, idx
