"""Parameterised activations and the other small elementwise operators: Elu, Selu, Celu,
ThresholdedRelu, HardSigmoid, HardSwish, Mish, Swish, Shrink, Softsign, PRelu, BitShift and
Dropout in its inference form.

Each is a handful of whole-array numpy calls (never a Python loop over elements).
Half-precision inputs (float16, bfloat16) are computed in float32 and rounded once to
their own type; float32 and float64 are computed in their own type."""
from __future__ import annotations

from typing import Any

import numpy as np

from onnxforge.kernels_cy.ops.base import Kernel, NodeSpec, register

__all__ = ["compute_type"]

_F32 = np.dtype(np.float32)


def compute_type(dtype: np.dtype) -> np.dtype:
    """The type an activation computes ``dtype`` in: float32 for the 2-byte floats (and
    integers), else the type itself."""
    if dtype.kind == "f" and dtype.itemsize >= 4:
        return dtype
    return _F32


class _Activation(Kernel):
    """A float activation ``y = f(x)`` computed in :func:`compute_type` and cast back."""

    def run(self, x):
        ct = compute_type(x.dtype)
        xc = x.astype(ct, copy=False)
        with np.errstate(over="ignore", invalid="ignore"):
            y = self.fn(xc)
        return np.asarray(y).astype(x.dtype, copy=False)

    def fn(self, x: np.ndarray) -> np.ndarray:  # pragma: no cover - every subclass overrides it
        raise NotImplementedError


@register("", "Elu")
class Elu(_Activation):
    """``x`` for ``x > 0``, else ``alpha * (exp(x) - 1)``."""

    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.alpha = spec.float("alpha", 1.0)

    def fn(self, x):
        return np.where(x > 0, x, x.dtype.type(self.alpha) * np.expm1(x))


@register("", "Selu")
class Selu(_Activation):
    """``gamma * x`` for ``x > 0``, else ``gamma * alpha * (exp(x) - 1)``."""

    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.alpha = spec.float("alpha", 1.67326319217681884765625)
        self.gamma = spec.float("gamma", 1.05070102214813232421875)

    def fn(self, x):
        t = x.dtype.type
        return t(self.gamma) * np.where(x > 0, x, t(self.alpha) * np.expm1(x))


@register("", "Celu")
class Celu(_Activation):
    """``max(0, x) + min(0, alpha * (exp(x / alpha) - 1))``."""

    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.alpha = spec.float("alpha", 1.0)
        if self.alpha == 0.0:
            raise spec.fail("attribute alpha must not be 0 (Celu divides by it)")

    def fn(self, x):
        a = x.dtype.type(self.alpha)
        return np.where(x > 0, x, a * np.expm1(x / a))


@register("", "ThresholdedRelu")
class ThresholdedRelu(_Activation):
    """``x`` where ``x > alpha``, else 0 (NaN too, as onnxruntime gives)."""

    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.alpha = spec.float("alpha", 1.0)

    def fn(self, x):
        return np.where(x > x.dtype.type(self.alpha), x, x.dtype.type(0))


@register("", "HardSigmoid")
class HardSigmoid(_Activation):
    """``max(0, min(1, alpha * x + beta))`` (NaN stays NaN)."""

    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.alpha = spec.float("alpha", 0.2)
        self.beta = spec.float("beta", 0.5)

    def fn(self, x):
        t = x.dtype.type
        return np.clip(t(self.alpha) * x + t(self.beta), t(0), t(1))


@register("", "HardSwish")
class HardSwish(_Activation):
    """``x * max(0, min(1, x / 6 + 1 / 2))``."""

    def fn(self, x):
        t = x.dtype.type
        return x * np.clip(x * t(1.0 / 6.0) + t(0.5), t(0), t(1))


@register("", "Mish")
class Mish(_Activation):
    """``x * tanh(softplus(x))``, the softplus as ``logaddexp(x, 0)`` (no overflow)."""

    def fn(self, x):
        return x * np.tanh(np.logaddexp(x, x.dtype.type(0)))


@register("", "Swish")
class Swish(_Activation):
    """``x * sigmoid(alpha * x)``."""

    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.alpha = spec.float("alpha", 1.0)

    def fn(self, x):
        t = x.dtype.type
        # sigmoid(z) = exp(-logaddexp(0, -z)): no overflow for either sign of z
        return x * np.exp(-np.logaddexp(t(0), -t(self.alpha) * x))


@register("", "Softsign")
class Softsign(_Activation):
    """``x / (1 + |x|)``."""

    def fn(self, x):
        return x / (x.dtype.type(1) + np.abs(x))


@register("", "Shrink")
class Shrink(Kernel):
    """``x + bias`` where ``x < -lambd``, ``x - bias`` where ``x > lambd``, else 0; floats
    and integers (integers compare and shift in float64, then wrap to their own type as
    onnxruntime does)."""

    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.bias = spec.float("bias", 0.0)
        self.lambd = spec.float("lambd", 0.5)

    def run(self, x):
        if x.dtype.kind == "f":
            xc = x.astype(compute_type(x.dtype), copy=False)
            t = xc.dtype.type
        else:
            xc = x.astype(np.float64)
            t = np.float64
        lo, hi, b = t(-self.lambd), t(self.lambd), t(self.bias)
        y = np.where(xc < lo, xc + b, np.where(xc > hi, xc - b, t(0)))
        if x.dtype.kind in "iu":
            return y.astype(np.int64).astype(x.dtype)
        return y.astype(x.dtype, copy=False)


@register("", "PRelu")
class PRelu(Kernel):
    """``x`` where ``x >= 0`` (or NaN), else ``slope * x``; ``slope`` broadcasts to ``x``
    (before opset 7 a 1-D slope of the channel count applies along axis 1, as the models
    converted from PyTorch then used it)."""

    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.channelwise = spec.opset < 7

    def run(self, x, slope):
        if self.channelwise and slope.ndim == 1 and x.ndim >= 2 and slope.size == x.shape[1] > 1:
            slope = slope.reshape((slope.size,) + (1,) * (x.ndim - 2))
        try:
            shape = np.broadcast_shapes(x.shape, slope.shape)
        except ValueError:
            raise self.error(f"slope of shape {slope.shape} does not broadcast to x of shape {x.shape}") from None
        if shape != x.shape:
            raise self.error(f"slope of shape {slope.shape} does not broadcast to x of shape {x.shape}")
        if x.dtype.kind == "f":
            ct = compute_type(x.dtype)
            xc = x.astype(ct, copy=False)
            y = np.where(xc < 0, xc * slope.astype(ct, copy=False), xc)
            return y.astype(x.dtype, copy=False)
        return np.where(x < 0, x * slope.astype(x.dtype, copy=False), x).astype(x.dtype, copy=False)


@register("", "BitShift")
class BitShift(Kernel):
    """Shifts of integers (BitShift-28 semantics, also right for the unsigned types of
    earlier opsets): a right shift of a signed type is arithmetic; a shift by a negative
    amount or by at least the bit width gives what the sign fill alone gives (-1 for a
    right shift of a negative value, else 0); a signed left shift wraps."""

    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.left = spec.choice("direction", None, ("LEFT", "RIGHT")) == "LEFT"

    def run(self, x, y):
        if x.dtype.kind not in "iu" or y.dtype != x.dtype:
            raise self.error(f"BitShift takes two integer tensors of one type, got {x.dtype} and {y.dtype}")
        bits = x.dtype.itemsize * 8
        x, y = np.broadcast_arrays(x, y)
        udt = np.dtype(f"u{x.dtype.itemsize}")
        bad = (y >= bits) if x.dtype.kind == "u" else ((y < 0) | (y >= bits))
        amount = np.where(bad, 0, y).astype(udt)
        if self.left:
            out = np.left_shift(x.view(udt) if x.dtype.kind == "i" else x, amount).view(x.dtype)
            return np.where(bad, x.dtype.type(0), out)
        out = np.right_shift(x, amount.astype(x.dtype))
        if x.dtype.kind == "i":
            fill = np.where(x < 0, x.dtype.type(-1), x.dtype.type(0))
        else:
            fill = x.dtype.type(0)
        return np.where(bad, fill, out)


@register("", "Dropout")
class Dropout(Kernel):
    """Dropout at inference: the output is a copy of the input and the optional mask is
    all True. Training (a ``training_mode`` input, or ``is_test=0`` before opset 7) drops
    nothing only at ratio 0: a constant true ``training_mode`` with a nonzero ratio, and a
    ``training_mode`` that is not a constant, are refused at plan time."""

    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.mask = spec.n_outputs > 1
        if spec.opset < 7 and spec.int("is_test", 0) == 0:
            raise spec.fail("Dropout in training mode (is_test=0) is not supported: the backend runs inference")
        if spec.has_input(2):
            mode = spec.const(2)
            if mode is None:
                raise spec.fail("a training_mode input that is not a constant is not supported "
                                "(inference only: training-mode Dropout is random)")
            if bool(np.asarray(mode).reshape(-1)[0]):
                ratio = spec.const(1) if spec.has_input(1) else np.float32(0.5)
                if ratio is None or float(np.asarray(ratio).reshape(-1)[0]) != 0.0:
                    raise spec.fail("Dropout with training_mode true and a nonzero (or unknown) ratio "
                                    "is not supported: the backend runs inference")

    def run(self, x, *rest: Any):
        out = np.array(x, copy=True)
        if self.mask:
            return out, np.ones(x.shape, dtype=bool)
        return out
