"""ScatterElements (and the older Scatter): ``updates`` written into a copy of ``data`` at
the positions ``indices`` names along ``axis`` (other axes by position), replacing or
combined by ``reduction`` (add, mul, max, min). Duplicate positions without a reduction
keep the last update, as onnxruntime does; with one, every update is applied
(``numpy.ufunc.at``)."""
from __future__ import annotations

import numpy as np

from onnxforge.kernels_cy.ops.base import Kernel, NodeSpec, register

__all__ = ["scatter_elements"]

_REDUCE = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def scatter_elements(data: np.ndarray, indices: np.ndarray, updates: np.ndarray, axis: int,
                     reduction: str) -> np.ndarray:
    """The scattered copy of ``data``; ``indices`` already in ``[0, data.shape[axis])``."""
    out = np.array(data, copy=True)
    if indices.size == 0:
        return out
    grid: list[np.ndarray] = list(np.indices(indices.shape, sparse=True))
    grid[axis] = indices
    where = tuple(grid)
    if reduction == "none":
        out[where] = updates
    else:
        _REDUCE[reduction].at(out, where, updates)
    return out


@register("", "ScatterElements", "Scatter")
class ScatterElements(Kernel):
    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.axis = spec.int("axis", 0)
        self.reduction = spec.choice("reduction", "none", ("none", "add", "mul", "max", "min"))

    def run(self, data, indices, updates):
        r = data.ndim
        if not -r <= self.axis < r:
            raise self.error(f"axis {self.axis} is out of range for rank {r}")
        axis = self.axis % r
        if indices.ndim != r or updates.shape != indices.shape:
            raise self.error(f"indices {indices.shape} and updates {updates.shape} must have one shape "
                             f"of data's rank {r}")
        if any(i > d for i, d in zip(indices.shape, data.shape)):
            raise self.error(f"indices of shape {indices.shape} exceed data of shape {data.shape}")
        n = data.shape[axis]
        idx = indices.astype(np.int64, copy=False)
        if idx.size and (idx.min() < -n or idx.max() >= n):
            raise self.error(f"an index is out of range [-{n}, {n - 1}] along axis {axis}")
        idx = np.where(idx < 0, idx + n, idx)
        return scatter_elements(data, idx, updates.astype(data.dtype, copy=False), axis, self.reduction)
