"""Small data-movement and construction operators: DepthToSpace, SpaceToDepth, BitCast,
EyeLike, OneHot, Compress, NonZero and ReverseSequence (whole-array numpy reshapes, views,
masks and gathers)."""
from __future__ import annotations

import numpy as np

from onnxforge.kernels_cy.ops.base import Kernel, NodeSpec, register
from onnxforge.proto_ext.dtypes import np_dtype
from onnxforge.proto_ext.errors import CodecError

__all__ = ["depth_to_space", "space_to_depth"]


def depth_to_space(x: np.ndarray, b: int, crd: bool) -> np.ndarray:
    """``[N, C, H, W] -> [N, C / b^2, H * b, W * b]``; the channel splits as ``(b, b, C')``
    (DCR) or ``(C', b, b)`` (CRD)."""
    n, c, h, w = x.shape
    if crd:
        t = x.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    else:
        t = x.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
    return np.ascontiguousarray(t).reshape(n, c // (b * b), h * b, w * b)


def space_to_depth(x: np.ndarray, b: int, crd: bool) -> np.ndarray:
    """The inverse of :func:`depth_to_space`: ``[N, C, H, W] -> [N, C * b^2, H / b, W / b]``."""
    n, c, h, w = x.shape
    t = x.reshape(n, c, h // b, b, w // b, b)
    t = t.transpose(0, 1, 3, 5, 2, 4) if crd else t.transpose(0, 3, 5, 1, 2, 4)
    return np.ascontiguousarray(t).reshape(n, c * b * b, h // b, w // b)


@register("", "DepthToSpace", "SpaceToDepth")
class DepthSpace(Kernel):
    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.block = spec.int("blocksize")
        if self.block < 1:
            raise spec.fail(f"attribute blocksize must be positive, got {self.block}")
        self.to_space = spec.op_type == "DepthToSpace"
        self.crd = spec.choice("mode", "DCR", ("DCR", "CRD")) == "CRD"

    def run(self, x):
        b = self.block
        if x.ndim != 4:
            raise self.error(f"input must have rank 4, got shape {x.shape}")
        if self.to_space and x.shape[1] % (b * b):
            raise self.error(f"channels {x.shape[1]} are not a multiple of blocksize^2 = {b * b}")
        if not self.to_space and (x.shape[2] % b or x.shape[3] % b):
            raise self.error(f"height and width {x.shape[2:]} are not multiples of blocksize {b}")
        return depth_to_space(x, b, self.crd) if self.to_space else space_to_depth(x, b, self.crd)


def _dtype_attr(spec: NodeSpec, name: str) -> np.dtype | None:
    to = spec.attrs.get(name)
    if to is None:
        return None
    try:
        return np_dtype(int(to))
    except CodecError:
        raise spec.fail(f"attribute {name}={to} names no supported element type") from None


@register("", "BitCast")
class BitCast(Kernel):
    """The same bytes read as another type of the same width."""

    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.dtype = _dtype_attr(spec, "to")
        if self.dtype is None:
            raise spec.fail("attribute 'to' is required")
        if self.dtype.kind in "OUS":
            raise spec.fail("BitCast to STRING is not supported")

    def run(self, x):
        if x.dtype.itemsize != self.dtype.itemsize or x.dtype.kind in "OUS":
            raise self.error(f"BitCast from {x.dtype} to {self.dtype}: the widths differ")
        return np.array(x, copy=True, order="C").view(self.dtype)


@register("", "EyeLike")
class EyeLike(Kernel):
    """Ones on the ``k``-th diagonal of a matrix shaped like the 2-D input (its type, or
    ``dtype``)."""

    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.dtype = _dtype_attr(spec, "dtype")
        self.k = spec.int("k", 0)

    def run(self, x):
        if x.ndim != 2:
            raise self.error(f"input must have rank 2, got shape {x.shape}")
        return np.eye(x.shape[0], x.shape[1], k=self.k, dtype=self.dtype or x.dtype)


@register("", "OneHot")
class OneHot(Kernel):
    """``values[1]`` where an index (negative ones count from ``depth``) names the position
    along the new axis, ``values[0]`` elsewhere (out-of-range indices give a row of off
    values)."""

    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.axis = spec.int("axis", -1)

    def run(self, indices, depth, values):
        if depth.size != 1:
            raise self.error(f"depth must hold one value, got shape {depth.shape}")
        d = int(depth.reshape(-1)[0])
        if d < 1:
            raise self.error(f"depth must be positive, got {d}")
        if values.size != 2:
            raise self.error(f"values must hold [off, on], got shape {values.shape}")
        r = indices.ndim
        axis = self.axis + r + 1 if self.axis < 0 else self.axis
        if not 0 <= axis <= r:
            raise self.error(f"axis {self.axis} is out of range for an output of rank {r + 1}")
        idx = indices.astype(np.int64) if indices.dtype.kind in "iu" else np.trunc(indices).astype(np.int64)
        idx = np.where(idx < 0, idx + d, idx)
        hot = np.expand_dims(idx, axis) == np.arange(d).reshape((d,) + (1,) * (r - axis))
        off, on = values.reshape(-1)
        return np.where(hot, on, off).astype(values.dtype, copy=False)


@register("", "Compress")
class Compress(Kernel):
    """The slices along ``axis`` (of the flattened input without one) where ``condition``
    is true; a condition shorter than the axis leaves the rest out."""

    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.axis = spec.attrs.get("axis")

    def run(self, x, condition):
        cond = condition.reshape(-1).astype(bool)
        if self.axis is None:
            data, axis = x.reshape(-1), 0
        else:
            axis = int(self.axis)
            if not -x.ndim <= axis < x.ndim:
                raise self.error(f"axis {axis} is out of range for rank {x.ndim}")
            data, axis = x, axis % x.ndim
        if cond.size > data.shape[axis]:
            raise self.error(f"condition of length {cond.size} is longer than axis {axis} ({data.shape[axis]})")
        return np.compress(cond, data, axis=axis)


@register("", "NonZero")
class NonZero(Kernel):
    """int64 ``[rank, count]``: the coordinates of the nonzero entries, in row-major order."""

    def run(self, x):
        if x.ndim == 0:
            return np.zeros((0, int(bool(x))), dtype=np.int64)
        return np.array(np.nonzero(x), dtype=np.int64).reshape(x.ndim, -1)


@register("", "ReverseSequence")
class ReverseSequence(Kernel):
    """For each batch entry ``b``, its first ``sequence_lens[b]`` steps along ``time_axis``
    reversed, the rest kept (one gather with a per-batch index map)."""

    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.batch_axis = spec.int("batch_axis", 1)
        self.time_axis = spec.int("time_axis", 0)
        if {self.batch_axis, self.time_axis} != {0, 1}:
            raise spec.fail(f"batch_axis={self.batch_axis} and time_axis={self.time_axis} must be 0 and 1")

    def run(self, x, lens):
        if x.ndim < 2:
            raise self.error(f"input must have rank at least 2, got shape {x.shape}")
        batch, steps = x.shape[self.batch_axis], x.shape[self.time_axis]
        if lens.shape != (batch,):
            raise self.error(f"sequence_lens must have shape [{batch}], got {lens.shape}")
        n = lens.astype(np.int64)
        if n.size and (n.min() < 0 or n.max() > steps):
            raise self.error(f"sequence_lens must lie in [0, {steps}]")
        t = np.arange(steps)
        src = np.where(t[None, :] < n[:, None], n[:, None] - 1 - t[None, :], t[None, :])  # [batch, steps]
        xb = np.moveaxis(x, (self.batch_axis, self.time_axis), (0, 1))
        out = np.take_along_axis(xb, src.reshape(src.shape + (1,) * (x.ndim - 2)), axis=1)
        return np.ascontiguousarray(np.moveaxis(out, (0, 1), (self.batch_axis, self.time_axis)))
