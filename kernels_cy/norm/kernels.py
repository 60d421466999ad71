"""Normalization kernels: RMSNormalization, (Skip)SimplifiedLayerNormalization,
LayerNormalization, com.microsoft SkipLayerNormalization, BatchNormalization (inference)
and InstanceNormalization; float32 operands run the compiled ``_norm`` calls."""
from __future__ import annotations

from typing import Any

import numpy as np

from onnxforge.kernels_cy.ops import fast
from onnxforge.kernels_cy.ops.base import Kernel, NodeSpec, register

F32 = np.dtype(np.float32)

__all__: list[str] = []


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


channel_affine = fast.cython_kernel("norm._norm", "channel_affine")
instance_norm = fast.cython_kernel("norm._norm", "instance_norm")


def _as_param(kernel: Kernel, name: str, v: np.ndarray, shapes: tuple[tuple[int, ...], ...]) -> None:
    if v.shape not in shapes:
        raise kernel.error(f"{name} has shape {list(v.shape)}, expected " + " or ".join(str(list(s)) for s in shapes))


def _channel_view(v: np.ndarray, ndim: int) -> np.ndarray:
    """A per-channel vector [C] (or [C, *spatial]) shaped to broadcast over [N, C, *spatial]."""
    return v.reshape((1,) + v.shape + (1,) * (ndim - 1 - v.ndim))


@register("", "BatchNormalization")
class BatchNormalization(Kernel):
    """BatchNormalization in its inference form at every opset:
    ``y = scale * (x - mean) / sqrt(var + epsilon) + B`` over axis 1 (any rank >= 2).

    Opsets before 9 may set ``spatial=0``: the parameters are then per element of
    ``[C, *spatial]``. The training form (``training_mode=1`` at opset 14+, or the running
    and saved statistics outputs at any opset) is refused at plan time.
    """

    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.eps = spec.float("epsilon", 1e-5)
        if not self.eps >= 0:
            raise spec.fail(f"epsilon={self.eps} must be >= 0")
        if spec.opset >= 14 and spec.choice("training_mode", 0, {0, 1}) == 1:
            raise spec.fail("training_mode=1 (normalizing by the batch's statistics and updating the running "
                            "ones) is not supported: only the inference form runs")
        if any(spec.outputs_used[1:]):
            raise spec.fail("the training outputs (running mean / variance, saved statistics) are not "
                            "supported: only the inference form with the one output Y runs")
        self.spatial = spec.choice("spatial", 1, {0, 1}) == 1 if spec.opset < 9 else True
        self.n_out = spec.n_outputs
        self.threads = spec.threads

    def run(self, x, scale, bias, mean, var):
        if x.ndim < 2:
            raise self.error(f"input of shape {list(x.shape)} must have rank >= 2 (N, C, ...)")
        if x.dtype.kind != "f":
            raise self.error(f"BatchNormalization takes floating-point input, got {x.dtype}")
        c = x.shape[1]
        shapes = ((c,),) if self.spatial else ((c,), tuple(x.shape[1:]))
        for name, v in (("scale", scale), ("B", bias), ("mean", mean), ("var", var)):
            _as_param(self, name, v, shapes)
        if not (scale.shape == bias.shape == mean.shape == var.shape):
            raise self.error("scale, B, mean and var must have one shape")
        with np.errstate(invalid="ignore", divide="ignore"):
            factor = scale.astype(np.float64) / np.sqrt(var.astype(np.float64) + self.eps)
        y = self._normalize(x, mean, factor, bias)
        if self.n_out == 1:
            return y
        # declared but unused training outputs: placeholders of their declared shapes
        return (y, mean.copy(), var.copy(), np.zeros_like(mean), np.zeros_like(var))[:self.n_out]

    def _normalize(self, x: np.ndarray, mean: np.ndarray, factor: np.ndarray, bias: np.ndarray) -> np.ndarray:
        if x.dtype == F32 and channel_affine is not None and mean.ndim == 1:
            n, c = x.shape[0], x.shape[1]
            xc = np.ascontiguousarray(x)
            out = np.empty(x.shape, dtype=F32)
            channel_affine(xc.reshape(n, c, -1), np.ascontiguousarray(mean, dtype=F32), factor.astype(F32),
                           np.ascontiguousarray(bias, dtype=F32), out.reshape(n, c, -1),
                           self.threads if self.threads > 1 else None)
            return out
        acc = np.float64 if x.dtype == np.float64 else np.float32
        y = (x.astype(acc) - _channel_view(mean.astype(acc), x.ndim)) * _channel_view(factor.astype(acc), x.ndim)
        y += _channel_view(bias.astype(acc), x.ndim)
        return y.astype(x.dtype, copy=False)


@register("", "InstanceNormalization")
class InstanceNormalization(Kernel):
    """``y = scale[c] * (x - mean) / sqrt(var + epsilon) + B[c]`` with the mean and (biased)
    variance of each ``[n, c]`` plane over the spatial axes."""

    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.eps = spec.float("epsilon", 1e-5)
        if not self.eps >= 0:
            raise spec.fail(f"epsilon={self.eps} must be >= 0")
        self.threads = spec.threads

    def run(self, x, scale, bias):
        if x.ndim < 3:
            raise self.error(f"input of shape {list(x.shape)} must have rank >= 3 (N, C and spatial axes)")
        if x.dtype.kind != "f":
            raise self.error(f"InstanceNormalization takes floating-point input, got {x.dtype}")
        c = x.shape[1]
        _as_param(self, "scale", scale, ((c,),))
        _as_param(self, "B", bias, ((c,),))
        if x.dtype == F32 and instance_norm is not None:
            n = x.shape[0]
            out = np.empty(x.shape, dtype=F32)
            instance_norm(np.ascontiguousarray(x).reshape(n, c, -1), np.ascontiguousarray(scale, dtype=F32),
                          np.ascontiguousarray(bias, dtype=F32), self.eps, out.reshape(n, c, -1),
                          self.threads if self.threads > 1 else None)
            return out
        acc = np.float64 if x.dtype == np.float64 else np.float32
        xf = x.astype(acc)
        axes = tuple(range(2, x.ndim))
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = np.mean(xf, axis=axes, keepdims=True)
            d = xf - mean
            var = np.mean(d * d, axis=axes, keepdims=True)
            y = d / np.sqrt(var + acc(self.eps)) * _channel_view(scale.astype(acc), x.ndim)
        y += _channel_view(bias.astype(acc), x.ndim)
        return y.astype(x.dtype, copy=False)
