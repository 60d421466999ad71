"""CumSum and CumProd along one axis, inclusive or exclusive, forward or reversed (one
numpy ``cumsum``/``cumprod`` each, accumulating in the input's own type)."""
from __future__ import annotations

import numpy as np

from onnxforge.kernels_cy.ops.base import Kernel, NodeSpec, register

__all__ = ["cumulate"]


def cumulate(x: np.ndarray, axis: int, exclusive: bool, reverse: bool, product: bool) -> np.ndarray:
    """The running sum (or product) of ``x`` along ``axis`` (in range); ``exclusive`` starts
    from the identity, ``reverse`` runs from the end of the axis."""
    fn = np.cumprod if product else np.cumsum
    if reverse:
        x = np.flip(x, axis=axis)
    if exclusive:
        out = (np.ones if product else np.zeros)(x.shape, dtype=x.dtype)
        n = x.shape[axis]
        if n > 1:
            head = [slice(None)] * x.ndim
            tail = [slice(None)] * x.ndim
            head[axis] = slice(0, n - 1)
            tail[axis] = slice(1, n)
            out[tuple(tail)] = fn(x[tuple(head)], axis=axis, dtype=x.dtype)
    else:
        out = fn(x, axis=axis, dtype=x.dtype)
    if reverse:
        out = np.ascontiguousarray(np.flip(out, axis=axis))
    return out


@register("", "CumSum", "CumProd")
class Cumulative(Kernel):
    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.exclusive = bool(spec.int("exclusive", 0))
        self.reverse = bool(spec.int("reverse", 0))
        self.product = spec.op_type == "CumProd"

    def run(self, x, axis):
        if axis.size != 1 or axis.dtype.kind not in "iu":
            raise self.error(f"axis must be one integer, got {axis.dtype} of shape {axis.shape}")
        a = int(axis.reshape(-1)[0])
        if x.ndim == 0 or not -x.ndim <= a < x.ndim:
            raise self.error(f"axis {a} is out of range for rank {x.ndim}")
        return cumulate(x, a % x.ndim, self.exclusive, self.reverse, self.product)
