"""Pooling kernels: MaxPool (with its Indices output), AveragePool, LpPool and
GlobalAveragePool, GlobalMaxPool, GlobalLpPool.

float32 inputs with 1 to 3 spatial axes run the compiled windows of ``_pool`` (planes in
parallel on the backend's pool); every other dtype or rank runs the numpy windows of
:mod:`.windows`. The window geometry is resolved per input shape by
:mod:`.geometry`.
"""
from __future__ import annotations

import numpy as np

from onnxforge.kernels_cy.ops.base import Kernel, NodeSpec, register
from onnxforge.kernels_cy.ops.fast import cython_kernel
from onnxforge.kernels_cy.pool import windows
from onnxforge.kernels_cy.pool.geometry import Axes, Window, window_from_spec

__all__: list[str] = []

F32 = np.dtype(np.float32)
_pool_nd = cython_kernel("pool._pool", "pool_nd")
_global_pool = cython_kernel("pool._pool", "global_pool")
MAX, AVG, LP = 0, 1, 2


def _lp_exponent(spec: NodeSpec) -> float:
    """LpPool's ``p``: a float at opset 1, an int after; it must be positive."""
    p = spec.float("p", 2.0)
    if not p > 0:
        raise spec.fail(f"p={p} must be positive")
    return p


class _WindowPool(Kernel):
    """A sliding-window pooling node; subclasses set ``mode`` and the attributes."""

    mode: int = MAX

    def __init__(self, spec: NodeSpec, window: Window):
        super().__init__(spec)
        self.window = window
        self.threads = spec.threads
        self.include_pad = False
        self.p = 2.0
        self.storage_order = 0

    def _axes(self, x: np.ndarray) -> Axes:
        if x.ndim != self.window.rank + 2:
            raise self.error(f"input of shape {list(x.shape)} must have rank {self.window.rank + 2} "
                             f"(N, C and the {self.window.rank} axes of kernel_shape)")
        return self.window.resolve(tuple(x.shape[2:]))

    def _pool(self, x: np.ndarray, want_indices: bool) -> tuple[np.ndarray, np.ndarray | None]:
        g = self._axes(x)
        if x.dtype == F32 and _pool_nd is not None and 1 <= len(g.out) <= 3:
            xc = np.ascontiguousarray(x)
            y = np.empty(x.shape[:2] + g.out, dtype=F32)
            idx = np.empty(y.shape, dtype=np.int64) if want_indices else None
            threads = self.threads if self.threads > 1 else None
            _pool_nd(xc, y, idx, self.mode, g.kernel, g.strides, g.dilations, g.pad_begin, g.pad_end,
                     self.include_pad, self.p, self.storage_order, threads)
            return y, idx
        if self.mode == MAX:
            return windows.max_pool(x, g, self.storage_order, want_indices)
        if self.mode == AVG:
            return windows.avg_pool(x, g, self.include_pad), None
        return windows.lp_pool(x, g, self.p), None


@register("", "MaxPool")
class MaxPool(_WindowPool):
    """MaxPool at every opset; output 1 (opset 8+) gives each maximum's flat input index."""

    mode = MAX

    def __init__(self, spec: NodeSpec):
        super().__init__(spec, window_from_spec(spec, dilations=spec.opset >= 10, ceil_mode=spec.opset >= 10))
        self.storage_order = spec.choice("storage_order", 0, {0, 1})
        self.n_out = spec.n_outputs
        if self.n_out > 2:
            raise spec.fail(f"MaxPool has at most 2 outputs, the node has {self.n_out}")
        self.want_indices = self.n_out == 2 and (not spec.outputs_used or spec.outputs_used[1])

    def run(self, x):
        if x.dtype.kind not in "fiu":
            raise self.error(f"MaxPool does not take {x.dtype} input")
        y, idx = self._pool(x, self.want_indices)
        if self.n_out == 1:
            return y
        if idx is None:  # the indices are not used: a placeholder of the right shape
            idx = np.zeros(y.shape, dtype=np.int64)
        return y, idx


@register("", "AveragePool")
class AveragePool(_WindowPool):
    """AveragePool; ``count_include_pad`` (opset 7+), ``ceil_mode`` (10+), ``dilations`` (19+)."""

    mode = AVG

    def __init__(self, spec: NodeSpec):
        super().__init__(spec, window_from_spec(spec, dilations=spec.opset >= 19, ceil_mode=spec.opset >= 10))
        self.include_pad = bool(spec.choice("count_include_pad", 0, {0, 1}))

    def run(self, x):
        if x.dtype.kind != "f":
            raise self.error(f"AveragePool takes floating-point input, got {x.dtype}")
        return self._pool(x, False)[0]


@register("", "LpPool")
class LpPool(_WindowPool):
    """LpPool: ``(sum |x|**p) ** (1/p)`` per window; ``ceil_mode`` and ``dilations`` (18+)."""

    mode = LP

    def __init__(self, spec: NodeSpec):
        super().__init__(spec, window_from_spec(spec, dilations=spec.opset >= 18, ceil_mode=spec.opset >= 18))
        self.p = _lp_exponent(spec)

    def run(self, x):
        if x.dtype.kind != "f":
            raise self.error(f"LpPool takes floating-point input, got {x.dtype}")
        return self._pool(x, False)[0]


class _GlobalPool(Kernel):
    """Reduce every spatial axis (input rank >= 3) to length 1."""

    mode: int = AVG

    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.threads = spec.threads
        self.p = _lp_exponent(spec) if self.mode == LP else 2.0

    def run(self, x):
        if x.ndim < 3:
            raise self.error(f"input of shape {list(x.shape)} must have rank >= 3 (N, C and spatial axes)")
        if x.dtype.kind != "f" and not (self.mode == MAX and x.dtype.kind in "iu"):
            raise self.error(f"{type(self).__name__} does not take {x.dtype} input")
        out_shape = x.shape[:2] + (1,) * (x.ndim - 2)
        rows = x.shape[0] * x.shape[1]
        n = int(np.prod(x.shape[2:], dtype=np.int64))
        if self.mode == MAX and n == 0 and rows > 0:
            raise self.error(f"the maximum over empty spatial axes {list(x.shape[2:])} is undefined")
        if x.dtype == F32 and _global_pool is not None:
            y = np.empty(rows, dtype=F32)
            threads = self.threads if self.threads > 1 else None
            _global_pool(np.ascontiguousarray(x).reshape(rows, n), y, self.mode, self.p, threads)
            return y.reshape(out_shape)
        return self._numpy(x.reshape(rows, n)).reshape(out_shape)

    def _numpy(self, x2: np.ndarray) -> np.ndarray:
        acc = np.float64 if x2.dtype == np.float64 else np.float32
        if self.mode == MAX:
            return np.max(x2, axis=1) if x2.shape[0] else np.empty(0, x2.dtype)
        if self.mode == AVG:
            with np.errstate(invalid="ignore", divide="ignore"):
                return np.mean(x2, axis=1, dtype=acc).astype(x2.dtype)
        a = np.abs(x2.astype(acc))
        return np.power(np.sum(np.power(a, self.p), axis=1), 1.0 / self.p).astype(x2.dtype)


@register("", "GlobalAveragePool")
class GlobalAveragePool(_GlobalPool):
    mode = AVG


@register("", "GlobalMaxPool")
class GlobalMaxPool(_GlobalPool):
    """The maximum over all spatial axes; a NaN anywhere in a plane gives NaN."""

    mode = MAX


@register("", "GlobalLpPool")
class GlobalLpPool(_GlobalPool):
    mode = LP

