"""Dense and normalization kernels: MatMul / Gemm (BLAS through numpy, no copies),
Softmax, reductions, RMS / layer normalization and their com.microsoft variants."""
from __future__ import annotations

import numpy as np

from onnxforge.kernels_cy.ops import fast
from onnxforge.kernels_cy.ops.base import Kernel, NodeSpec, register
from onnxforge.kernels_cy.threads import BLAS

F32 = np.dtype(np.float32)

__all__: list[str] = []


@register("", "MatMul")
class MatMul(Kernel):
    """One float32 row times a matrix: the pool's streaming product (``_gemv.OneRowMatMul``,
    installed as ``run``); otherwise numpy's matmul (BLAS, no copy of C- or F-ordered
    operands), a small product running BLAS on one thread (``threads.BLAS``)."""

    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        if fast.OneRowMatMul is not None:  # the compiled call, falling back to BLAS below
            self.run = fast.OneRowMatMul(spec.threads, self._blas)  # type: ignore[method-assign]

    def run(self, a, b):
        return self._blas(a, b)

    def _blas(self, a, b):
        BLAS.for_work(a.size * b.shape[-1], b.nbytes)
        return np.matmul(a, b)


@register("", "Gemm")
class Gemm(Kernel):
    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.alpha = spec.float("alpha", 1.0)
        self.beta = spec.float("beta", 1.0)
        self.ta = spec.int("transA", 0)
        self.tb = spec.int("transB", 0)

    def run(self, a, b, c=None):
        a = a.T if self.ta else a
        b = b.T if self.tb else b
        BLAS.for_work(a.size * b.shape[-1], b.nbytes)
        y = np.matmul(a, b)
        if self.alpha != 1.0:
            y *= y.dtype.type(self.alpha)
        if c is not None:
            y += (c * c.dtype.type(self.beta)) if self.beta != 1.0 else c
        return y


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
        if self.legacy:
            a = self.axis % x.ndim if x.ndim else 0
            shape = x.shape
            x2 = x.reshape(int(np.prod(shape[:a], dtype=np.int64)), -1)
            return self._apply(x2, 1).reshape(shape)
        return self._apply(x, self.axis % x.ndim if x.ndim else 0)

    def _apply(self, x, axis):
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

    def run(self, x, axes=None):
        ax = self.axes
        if ax is None and axes is not None:
            ax = [int(a) for a in np.ravel(axes)]
        if not ax:
            if self.noop:
                return np.array(x, copy=True)
            ax = list(range(x.ndim))
        t = tuple(a % x.ndim for a in ax) if x.ndim else None
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
        op = self.op
        ax = self.axes if self.axes is not None else (None if axes is None else [int(a) for a in np.ravel(axes)])
        if not ax:
            if self.noop:
                return np.array(x, copy=True)
            ax = list(range(x.ndim))
        t = tuple(a % x.ndim for a in ax) if x.ndim else None
        k = bool(self.keep)
        xf = x.astype(np.float64) if x.dtype.kind in "iu" else x
        if op == "ReduceSumSquare":
            y = np.sum(xf * xf, axis=t, keepdims=k)
        elif op == "ReduceL1":
            y = np.sum(np.abs(xf), axis=t, keepdims=k)
        elif op == "ReduceL2":
            y = np.sqrt(np.sum(xf * xf, axis=t, keepdims=k))
        elif op == "ReduceLogSum":
            y = np.log(np.sum(xf, axis=t, keepdims=k))
        else:
            m = np.max(xf, axis=t, keepdims=True) if x.size else np.zeros(1)
            y = np.log(np.sum(np.exp(xf - m), axis=t, keepdims=True)) + m
            if not k:
                y = np.squeeze(y, axis=t)
        return np.asarray(y).astype(x.dtype)


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


def _rms(x: np.ndarray, scale: np.ndarray, axis: int, eps: float) -> np.ndarray:
    a = axis % x.ndim
    axes = tuple(range(a, x.ndim))
    xf = x if x.dtype == np.float32 or x.dtype == np.float64 else x.astype(np.float32)
    ms = np.mean(np.square(xf), axis=axes, keepdims=True)
    ms += xf.dtype.type(eps)
    inv = 1.0 / np.sqrt(ms)
    y = xf * inv
    y *= scale
    return y.astype(x.dtype, copy=False)


@register("", "RMSNormalization")
class RMSNormalization(Kernel):
    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.axis = spec.int("axis", -1)
        self.eps = spec.float("epsilon", 1e-5)
        spec.choice("stash_type", 1, {1})
        if fast.RowNorm is not None and self.axis == -1 and self.eps >= 0:
            self.run = fast.RowNorm(self.eps, self._run)  # type: ignore[method-assign]

    def run(self, x, scale):
        return self._run(x, scale)

    def _run(self, x, scale):
        if fast.rms_norm is not None and _fast_rows(x, scale, self.axis):
            out = np.empty(x.shape, dtype=F32)
            fast.rms_norm(x.reshape(-1, x.shape[-1]), scale, self.eps, out.reshape(-1, x.shape[-1]))
            return out
        return _rms(x, scale, self.axis, self.eps)


def _fast_rows(x: np.ndarray, scale: np.ndarray, axis: int) -> bool:
    """float32 normalization over the last axis only, with a 1-D float32 scale."""
    return (x.dtype == F32 and x.ndim >= 1 and axis % x.ndim == x.ndim - 1 and x.flags.c_contiguous
            and scale.dtype == F32 and scale.ndim == 1 and scale.shape[0] == x.shape[-1] and x.size > 0)


@register("", "SimplifiedLayerNormalization")
@register("com.microsoft", "SimplifiedLayerNormalization")
class SimplifiedLayerNormalization(Kernel):
    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.axis = spec.int("axis", -1)
        self.eps = spec.float("epsilon", 1e-5)
        self.n_out = spec.n_outputs
        if fast.RowNorm is not None and self.n_out == 1 and self.axis == -1 and self.eps >= 0:
            self.run = fast.RowNorm(self.eps, self._run)  # type: ignore[method-assign]

    def run(self, x, scale):
        return self._run(x, scale)

    def _run(self, x, scale):
        if self.n_out == 1 and fast.rms_norm is not None and _fast_rows(x, scale, self.axis):
            out = np.empty(x.shape, dtype=F32)
            fast.rms_norm(x.reshape(-1, x.shape[-1]), scale, self.eps, out.reshape(-1, x.shape[-1]))
            return out
        a = self.axis % x.ndim
        axes = tuple(range(a, x.ndim))
        xf = x.astype(np.float32, copy=False)
        ms = np.mean(np.square(xf), axis=axes, keepdims=True)
        inv = 1.0 / np.sqrt(ms + np.float32(self.eps))
        y = (xf * inv) * scale
        y = y.astype(x.dtype, copy=False)
        if self.n_out == 1:
            return y
        return (y, inv.astype(np.float32))


@register("com.microsoft", "SkipSimplifiedLayerNormalization")
class SkipSimplifiedLayerNormalization(Kernel):
    """Outputs: normalized, mean (unused, empty), inv_std_var, input + skip (+ bias)."""

    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.eps = spec.float("epsilon", 1e-5)
        self.n_out = spec.n_outputs
        self.stats_used = any(spec.outputs_used[1:3])
        if fast.SkipRowNorm is not None and not self.stats_used and self.n_out in (1, 4) and self.eps >= 0:
            self.run = fast.SkipRowNorm(self.eps, self.n_out, self._run)  # type: ignore[method-assign]

    def run(self, x, skip, gamma, bias=None):
        return self._run(x, skip, gamma, bias)

    def _run(self, x, skip, gamma, bias=None):
        if (fast.skip_rms_norm is not None and not self.stats_used and self.n_out in (1, 4) and x.shape == skip.shape
                and _fast_rows(x, gamma, -1) and skip.dtype == F32 and skip.flags.c_contiguous
                and (bias is None or bias.dtype == F32)):
            h = x.shape[-1]
            out = np.empty(x.shape, dtype=F32)
            total = np.empty(x.shape, dtype=F32) if self.n_out == 4 else None
            fast.skip_rms_norm(x.reshape(-1, h), skip.reshape(-1, h), bias, gamma, self.eps,
                               out.reshape(-1, h), None if total is None else total.reshape(-1, h))
            if self.n_out == 1:
                return out
            return (out, np.empty(0, dtype=F32), np.empty(0, dtype=F32), total)
        s = np.add(x, skip)
        if bias is not None:
            s += bias
        ms = np.mean(np.square(s), axis=-1, keepdims=True)
        inv = 1.0 / np.sqrt(ms + s.dtype.type(self.eps))
        y = (s * inv) * gamma
        if self.n_out == 1:
            return y
        outs = [y, np.empty(0, dtype=np.float32), inv.astype(np.float32), s]
        return tuple(outs[:self.n_out])


@register("", "LayerNormalization")
class LayerNormalization(Kernel):
    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.axis = spec.int("axis", -1)
        self.eps = spec.float("epsilon", 1e-5)
        self.n_out = spec.n_outputs

    def run(self, x, scale, bias=None):
        a = self.axis % x.ndim
        axes = tuple(range(a, x.ndim))
        xf = x.astype(np.float32) if x.dtype != np.float64 else x
        mean = np.mean(xf, axis=axes, keepdims=True)
        d = xf - mean
        var = np.mean(d * d, axis=axes, keepdims=True)
        inv = 1.0 / np.sqrt(var + self.eps)
        y = d * inv * scale
        if bias is not None:
            y = y + bias
        y = y.astype(x.dtype)
        outs = (y, mean.astype(np.float32 if x.dtype != np.float64 else x.dtype),
                inv.astype(np.float32 if x.dtype != np.float64 else x.dtype))
        return y if self.n_out == 1 else outs[:self.n_out]


@register("com.microsoft", "SkipLayerNormalization")
class SkipLayerNormalization(Kernel):
    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.eps = spec.float("epsilon", 1e-12)
        self.n_out = spec.n_outputs

    def run(self, x, skip, gamma, beta=None, bias=None):
        s = x + skip
        if bias is not None:
            s = s + bias
        mean = np.mean(s, axis=-1, keepdims=True)
        d = s - mean
        inv = 1.0 / np.sqrt(np.mean(d * d, axis=-1, keepdims=True) + s.dtype.type(self.eps))
        y = d * inv * gamma
        if beta is not None:
            y = y + beta
        if self.n_out == 1:
            return y
        return (y, mean, inv, s)[:self.n_out]
