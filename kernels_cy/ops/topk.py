"""TopK: the ``k`` largest (or smallest) entries along one axis and their indices.

Entries that compare equal keep their index order (the lower index first), as
onnxruntime orders them, in both directions; NaN counts as larger than every number.
The selection is one stable numpy sort along the axis (the ``sorted=0`` form returns the
same, sorted, order: any order is allowed there)."""
from __future__ import annotations

import numpy as np

from onnxforge.kernels_cy.ops.base import Kernel, NodeSpec, register

__all__ = ["top_k"]


def top_k(x: np.ndarray, k: int, axis: int, largest: bool) -> tuple[np.ndarray, np.ndarray]:
    """``(values, int64 indices)`` of the top ``k`` along ``axis`` (normalised, in range);
    ties go to the lower index."""
    n = x.shape[axis]
    if largest:
        # a stable ascending sort of the reversed axis, read backwards, is descending by value
        # with equal values in ascending index order
        rev = np.flip(x, axis=axis)
        order = np.argsort(rev, axis=axis, kind="stable")
        order = np.flip(order, axis=axis)
        idx = (n - 1) - np.take(order, np.arange(k), axis=axis)
    else:
        order = np.argsort(x, axis=axis, kind="stable")
        idx = np.take(order, np.arange(k), axis=axis)
    idx = idx.astype(np.int64, copy=False)
    return np.take_along_axis(x, idx, axis=axis), idx


@register("", "TopK")
class TopK(Kernel):
    """TopK-1 (``k`` attribute), -10 (``k`` input) and -11 (``largest``, ``sorted``)."""

    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.axis = spec.int("axis", -1)
        self.largest = bool(spec.int("largest", 1))
        spec.int("sorted", 1)  # any order is valid for sorted=0; the sorted order is returned
        self.k_attr = spec.int("k") if spec.opset < 10 else None

    def run(self, x, k=None):
        if self.k_attr is not None:
            kk = self.k_attr
        else:
            if k is None or k.size != 1 or k.dtype.kind not in "iu":
                raise self.error(f"K must be one integer, got {None if k is None else (k.dtype, k.shape)}")
            kk = int(k.reshape(-1)[0])
        if x.ndim == 0:
            raise self.error("TopK takes a tensor of rank at least 1, got a scalar")
        axis = self.axis + x.ndim if self.axis < 0 else self.axis
        if not 0 <= axis < x.ndim:
            raise self.error(f"axis {self.axis} is out of range for rank {x.ndim}")
        if not 0 <= kk <= x.shape[axis]:
            raise self.error(f"K={kk} is out of range for axis {axis} of length {x.shape[axis]}")
        return top_k(x, kk, axis, self.largest)
