"""Dense and normalization kernels: MatMul / Gemm (BLAS through numpy, no copies),
Softmax, reductions, RMS / layer normalization and their com.microsoft variants."""
from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from onnxforge.kernels_cy.ops import fast
from onnxforge.kernels_cy.ops.base import Kernel, NodeSpec, register
from onnxforge.kernels_cy.ops.shape_ops import checked_axes
from onnxforge.kernels_cy.threads import BLAS

F32 = np.dtype(np.float32)
_WIDENED = frozenset(np.dtype(t) for t in (ml_dtypes.bfloat16,))

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
        if a.ndim == 0 or b.ndim == 0:
            raise self.error(f"MatMul operands must have rank >= 1, got shapes {list(a.shape)} and {list(b.shape)}")
        BLAS.for_work(a.size * b.shape[-1], b.nbytes)
        if a.dtype in _WIDENED:  # bfloat16: products and sums in float32, rounded once
            return np.matmul(a.astype(F32), b.astype(F32)).astype(a.dtype)
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
        if a.ndim != 2 or b.ndim != 2:
            raise self.error(f"Gemm operands must be matrices, got shapes {list(a.shape)} and {list(b.shape)}")
        dtype = a.dtype
        if dtype in _WIDENED:  # bfloat16: computed in float32, rounded once at the end
            a, b = a.astype(F32), b.astype(F32)
            c = None if c is None else c.astype(F32)
        a = a.T if self.ta else a
        b = b.T if self.tb else b
        BLAS.for_work(a.size * b.shape[-1], b.nbytes)
        y = np.matmul(a, b)
        if self.alpha != 1.0:
            y *= y.dtype.type(self.alpha)
        if c is not None:
            y += (c * c.dtype.type(self.beta)) if self.beta != 1.0 else c
        return y.astype(dtype, copy=False)


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
        if not -x.ndim <= self.axis < x.ndim:
            raise self.error(f"axis {self.axis} is out of range for rank {x.ndim}")
        a = self.axis % x.ndim
        if not int(np.prod(x.shape[a:], dtype=np.int64)):  # as onnxruntime: nothing to normalize over
            raise self.error(f"the normalized dimensions {list(x.shape[a:])} hold no element")
        axes = tuple(range(a, x.ndim))
        xf = x.astype(np.float32, copy=False)
        ms = np.mean(np.square(xf), axis=axes, keepdims=True)
        inv = 1.0 / np.sqrt(ms + np.float32(self.eps))
        y = (xf * inv) * scale
        y = y.astype(x.dtype, copy=False)
        if self.n_out == 1:
            return y
        return (y, inv.astype(np.float32))


def _rank_of(spec: NodeSpec, index: int) -> int | None:
    """The declared rank of input ``index`` (None when unknown)."""
    t = spec.input_types[index] if index < len(spec.input_types) else None
    shape = getattr(t, "shape", None)
    return None if shape is None else len(shape)


def _check_skip(kernel: Kernel, x: np.ndarray, skip: np.ndarray, gamma: np.ndarray, **vectors: Any) -> None:
    """The operand shapes onnxruntime accepts for the skip normalizations: input [B, S, H] or
    [S, H]; skip of the input's shape, [1, S, H] or [S, H]; gamma, beta and bias [H]."""
    if x.ndim not in (2, 3):
        raise kernel.error(f"input must have rank 2 or 3, got shape {list(x.shape)}")
    h = x.shape[-1]
    if not (skip.shape == x.shape or skip.shape == x.shape[-2:]
            or (x.ndim == 3 and skip.shape == (1,) + x.shape[1:])):
        raise kernel.error(f"skip shape {list(skip.shape)} must be {list(x.shape)}, [1, S, H] or [S, H]")
    for name, v in (("gamma", gamma), *vectors.items()):
        if v is not None and v.shape != (h,):
            raise kernel.error(f"{name} shape {list(v.shape)} must be [{h}]")


@register("com.microsoft", "SkipSimplifiedLayerNormalization")
class SkipSimplifiedLayerNormalization(Kernel):
    """Outputs: normalized, mean (zeros of shape [..., 1], as onnxruntime gives it: a
    simplified norm subtracts no mean), inv_std_var [..., 1], input + skip (+ bias)."""

    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.eps = spec.float("epsilon", 1e-12)  # the com.microsoft schema's default
        self.n_out = spec.n_outputs
        self.stats_used = any(spec.outputs_used[1:3])
        if (fast.SkipRowNorm is not None and not self.stats_used and self.n_out in (1, 4) and self.eps >= 0
                and _rank_of(spec, 0) in (2, 3)):  # the compiled call checks all but the rank
            self.run = fast.SkipRowNorm(self.eps, self.n_out, self._run)  # type: ignore[method-assign]

    def run(self, x, skip, gamma, bias=None):
        return self._run(x, skip, gamma, bias)

    def _run(self, x, skip, gamma, bias=None):
        _check_skip(self, x, skip, gamma, bias=bias)
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
        inv = inv.astype(np.float32)
        outs = [y, np.zeros(inv.shape, dtype=np.float32), inv, s]  # mean: 0, as onnxruntime gives it
        return tuple(outs[:self.n_out])


@register("", "LayerNormalization")
class LayerNormalization(Kernel):
    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.axis = spec.int("axis", -1)
        self.eps = spec.float("epsilon", 1e-5)
        self.n_out = spec.n_outputs

    def run(self, x, scale, bias=None):
        if not -x.ndim <= self.axis < x.ndim:
            raise self.error(f"axis {self.axis} is out of range for rank {x.ndim}")
        a = self.axis % x.ndim
        if not int(np.prod(x.shape[a:], dtype=np.int64)):  # as onnxruntime: nothing to normalize over
            raise self.error(f"the normalized dimensions {list(x.shape[a:])} hold no element")
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
        _check_skip(self, x, skip, gamma, beta=beta, bias=bias)
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
