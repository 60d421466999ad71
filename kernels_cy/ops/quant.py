"""QuantizeLinear / DequantizeLinear: per-tensor, per-axis and blocked affine forms for
the integer (int2/4/8/16, uint2/4/8/16) and float8/float4 element types."""
from __future__ import annotations

import ml_dtypes
import numpy as np

from onnxforge.kernels_cy.ops.base import Kernel, NodeSpec, register
from onnxforge.proto_ext.dtypes import np_dtype
from onnxforge.proto_ext.errors import CodecError

__all__ = ["expand_params"]


def expand_params(p: np.ndarray, x_shape: tuple[int, ...], axis: int, block: int) -> np.ndarray:
    """Broadcast a scale / zero point to ``x_shape`` (per tensor, per axis or blocked)."""
    if p.ndim == 0 or p.size == 1 and p.ndim <= 1 and not block:
        return p.reshape(())
    r = len(x_shape)
    a = axis % r
    if p.ndim == 1 and not block:
        shape = [1] * r
        shape[a] = p.shape[0]
        return p.reshape(shape)
    if block:
        rep = np.repeat(p, block, axis=a)
        idx = [slice(None)] * r
        idx[a] = slice(0, x_shape[a])
        return rep[tuple(idx)]
    return p


def _int_range(dt: np.dtype) -> tuple[float, float] | None:
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return float(info.min), float(info.max)
    name = dt.name
    for low in ("int4", "uint4", "int2", "uint2"):
        if name == low:
            low_info = ml_dtypes.iinfo(dt)
            return float(low_info.min), float(low_info.max)
    return None


def _output_dtype(spec: NodeSpec) -> np.dtype | None:
    """The ``output_dtype`` attribute as a numpy dtype (None when unset), checked at plan time."""
    od = spec.int("output_dtype", 0)
    if not od:
        return None
    try:
        return np_dtype(od)
    except CodecError:
        raise spec.fail(f"output_dtype={od} names no supported element type") from None


@register("", "QuantizeLinear")
class QuantizeLinear(Kernel):
    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.axis = spec.int("axis", 1)
        self.block = spec.int("block_size", 0)
        self.saturate = spec.int("saturate", 1)
        self.out_dtype = _output_dtype(spec)

    def run(self, x, scale, zp=None):
        dt = zp.dtype if zp is not None else (self.out_dtype or np.dtype(np.uint8))
        s = expand_params(np.asarray(scale), x.shape, self.axis, self.block).astype(np.float32)
        y = x.astype(np.float32) / s
        rng = _int_range(dt)
        if rng is not None:
            y = np.rint(y)
            if zp is not None:
                y = y + expand_params(zp, x.shape, self.axis, self.block).astype(np.float32)
            y = np.clip(y, rng[0], rng[1])
            return y.astype(np.int64).astype(dt)
        if zp is not None:
            y = y + expand_params(zp, x.shape, self.axis, self.block).astype(np.float32)
        if self.saturate and "float8" in dt.name:
            info = ml_dtypes.finfo(dt)
            y = np.where(np.isinf(y), np.sign(y) * float(info.max), y) if "fn" in dt.name else y
            y = np.clip(y, float(info.min), float(info.max))
        return y.astype(dt)


@register("", "DequantizeLinear")
class DequantizeLinear(Kernel):
    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.axis = spec.int("axis", 1)
        self.block = spec.int("block_size", 0)
        self.out_dtype = _output_dtype(spec)

    def run(self, x, scale, zp=None):
        s = expand_params(np.asarray(scale), x.shape, self.axis, self.block)
        xf = x.astype(np.float32)
        if zp is not None:
            xf = xf - expand_params(zp, x.shape, self.axis, self.block).astype(np.float32)
        y = xf * s.astype(np.float32)
        out = self.out_dtype or np.asarray(scale).dtype
        return y.astype(out)
