"""Softmax, LogSoftmax, Hardmax, the reductions and ArgMax / ArgMin."""
from __future__ import annotations

from typing import Any

import numpy as np

from onnxforge.kernels_cy.ops import fast
from onnxforge.kernels_cy.ops.base import Kernel, NodeSpec, register
from onnxforge.kernels_cy.ops.shape_ops import checked_axes

F32 = np.dtype(np.float32)

__all__: list[str] = []


def _softmax(x: np.ndarray, axis: int) -> np.ndarray:
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isneginf(m), 0, m).astype(x.dtype, copy=False)
    e = np.exp(x - m)
    s = np.sum(e, axis=axis, keepdims=True)
    e /= s
    return e


class _SoftmaxBase(Kernel):
    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.legacy = spec.opset < 13
        self.axis = spec.int("axis", 1 if self.legacy else -1)
        self.log = spec.op_type == "LogSoftmax"
        self.hard = spec.op_type == "Hardmax"

    def run(self, x):
        if not -max(x.ndim, 1) <= self.axis < max(x.ndim, 1):
            raise self.error(f"axis {self.axis} is out of range for rank {x.ndim}")
        if x.size == 0:
            return np.array(x, copy=True)
        if self.legacy:
            a = self.axis % x.ndim if x.ndim else 0
            shape = x.shape
            x2 = x.reshape(int(np.prod(shape[:a], dtype=np.int64)), -1)
            return self._apply(x2, 1).reshape(shape)
        return self._apply(x, self.axis % x.ndim if x.ndim else 0)

    def _apply(self, x, axis):
        if x.size == 0:
            return np.array(x, copy=True)
        if self.hard:
            idx = np.argmax(x, axis=axis)
            out = np.zeros_like(x)
            np.put_along_axis(out, np.expand_dims(idx, axis), 1, axis=axis)
            return out
        if self.log:
            m = np.max(x, axis=axis, keepdims=True)
            y = x - m
            return y - np.log(np.sum(np.exp(y), axis=axis, keepdims=True))
        if (fast.softmax is not None and x.dtype == F32 and axis == x.ndim - 1 and x.size > 0
                and x.flags.c_contiguous):
            out = np.empty(x.shape, dtype=F32)
            fast.softmax(x.reshape(-1, x.shape[-1]), out.reshape(-1, x.shape[-1]))
            return out
        return _softmax(x, axis)


for _n in ("Softmax", "LogSoftmax", "Hardmax"):
    register("", _n)(_SoftmaxBase)


_REDUCE = {"ReduceSum": np.sum, "ReduceMean": np.mean, "ReduceMax": np.max, "ReduceMin": np.min,
           "ReduceProd": np.prod}
_UFUNC = {"ReduceSum": np.add, "ReduceMax": np.maximum, "ReduceMin": np.minimum, "ReduceProd": np.multiply}
_AXES_AS_INPUT = {"ReduceSum": 13}


class _Reduce(Kernel):
    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.op = spec.op_type
        self.keep = spec.int("keepdims", 1)
        self.noop = spec.int("noop_with_empty_axes", 0)
        self.axes_input = spec.opset >= _AXES_AS_INPUT.get(self.op, 18)
        self.axes = None if self.axes_input else spec.ints("axes")
        if self.axes_input and spec.const(1) is not None:
            self.axes = [int(a) for a in np.ravel(spec.const(1))]

    def _axes(self, x: np.ndarray, axes: Any) -> tuple[int, ...] | None:
        """The reduced axes: none with ``noop_with_empty_axes`` and no axes (the op's
        elementwise part alone), every axis without axes; None for a scalar."""
        ax = self.axes
        if ax is None and axes is not None:
            ax = [int(a) for a in np.ravel(axes)]
        if not ax:
            if self.noop:
                return ()
            ax = list(range(x.ndim))
        if not x.ndim:
            if any(a not in (0, -1) for a in ax):
                raise self.error(f"axes {ax} are out of range for a scalar")
            return None
        return checked_axes(ax, x.ndim, self.op, self.error)

    def run(self, x, axes=None):
        t = self._axes(x, axes)
        if t == ():
            return np.array(x, copy=True)
        if self.op in ("ReduceMax", "ReduceMin") and x.size == 0:
            fill = -np.inf if self.op == "ReduceMax" else np.inf
            shape = [1 if i in t else d for i, d in enumerate(x.shape)] if self.keep else \
                [d for i, d in enumerate(x.shape) if i not in t]
            if x.dtype == np.bool_:
                fill = self.op == "ReduceMin"
            elif x.dtype.kind in "iu":
                info = np.iinfo(x.dtype)
                fill = info.min if self.op == "ReduceMax" else info.max
            return np.full(shape, fill, dtype=x.dtype)
        if self.op == "ReduceMean" and x.dtype.kind == "f":
            # the ufunc and one division (np.mean's wrapper costs more than the reduction)
            n = x.size
            if t is not None:
                n = 1
                for a in t:
                    n *= x.shape[a]
            total = np.asarray(np.add.reduce(x, axis=t, keepdims=bool(self.keep)))
            return np.true_divide(total, x.dtype.type(n)).astype(x.dtype, copy=False)
        uf = _UFUNC.get(self.op)
        if uf is not None and x.dtype != np.bool_:  # the ufunc directly: no wrapper layers
            return np.asarray(uf.reduce(x, axis=t, keepdims=bool(self.keep))).astype(x.dtype, copy=False)
        return np.asarray(_REDUCE[self.op](x, axis=t, keepdims=bool(self.keep))).astype(x.dtype, copy=False)


for _n in _REDUCE:
    register("", _n)(_Reduce)


@register("", "ReduceSumSquare", "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp")
class _ReduceDerived(_Reduce):
    def run(self, x, axes=None):
        t = self._axes(x, axes)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # log(0), log(<0), overflow: IEEE
            return np.asarray(self._reduce(x, t)).astype(x.dtype)

    def _reduce(self, x: np.ndarray, t: tuple[int, ...] | None) -> np.ndarray:
        op = self.op
        k = bool(self.keep)
        xf = x.astype(np.float64) if x.dtype.kind in "iu" else x
        if op == "ReduceSumSquare":
            return np.sum(xf * xf, axis=t, keepdims=k)
        if op == "ReduceL1":
            return np.sum(np.abs(xf), axis=t, keepdims=k)
        if op == "ReduceL2":
            return np.sqrt(np.sum(xf * xf, axis=t, keepdims=k))
        if op == "ReduceLogSum":
            return np.log(np.sum(xf, axis=t, keepdims=k))
        # the shift is the largest finite entry (an infinite one would give inf - inf = NaN)
        m = np.max(np.where(np.isinf(xf), -np.inf, xf), axis=t, keepdims=True) if x.size else np.zeros(1)
        m = np.where(np.isneginf(m), 0, m)  # nothing finite: no shift (inf stays inf, -inf -inf)
        y = np.log(np.sum(np.exp(xf - m), axis=t, keepdims=True)) + m
        return y if k else np.squeeze(y, axis=t)


@register("", "ArgMax", "ArgMin")
class ArgMax(Kernel):
    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.axis = spec.int("axis", 0)
        self.keep = spec.int("keepdims", 1)
        self.last = spec.int("select_last_index", 0)
        self.fn = np.argmax if spec.op_type == "ArgMax" else np.argmin

    def run(self, x):
        a = self.axis % x.ndim
        if self.last:
            y = x.shape[a] - 1 - self.fn(np.flip(x, axis=a), axis=a)
        else:
            y = self.fn(x, axis=a)
        y = y.astype(np.int64)
        return np.expand_dims(y, a) if self.keep else y
