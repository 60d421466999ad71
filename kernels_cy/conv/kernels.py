"""ONNX Conv and ConvTranspose, 1-D to 3-D, any group, float16/bfloat16/float32/float64.

float32 (float16 and bfloat16 computed in float32 and rounded once): Conv is a compiled
im2col of a band of output rows followed by a BLAS product with the weights (numpy's
matmul writing straight into the output); a 1x1 kernel with unit strides and no padding
skips the im2col; depthwise convolutions (group == channels) run a direct compiled loop.
ConvTranspose is a BLAS product of the transposed weights with a band of input rows
followed by a compiled col2im. Bands bound the column scratch to about
:data:`COL_BYTES`. float64 goes through :mod:`.numpy_path`. Nothing about the input size
is fixed at plan time: the geometry (:mod:`.geometry`) is worked out per call.
Without the compiled extension every dtype takes the numpy path.
"""
from __future__ import annotations

from collections.abc import Callable

import ml_dtypes
import numpy as np

from onnxforge.kernels_cy.conv import numpy_path
from onnxforge.kernels_cy.conv.geometry import ConvAttrs, Geometry, conv_geometry, parse, size, transpose_geometry
from onnxforge.kernels_cy.ops.base import Kernel, NodeSpec, register
from onnxforge.kernels_cy.ops.fast import cython_kernel
from onnxforge.kernels_cy.runtime.threads import BLAS

__all__ = ["COL_BYTES", "Conv", "ConvTranspose"]

F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)
_WIDENED = frozenset({np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)})  # computed in float32
# the compiled loops (None without the extension: every dtype then takes the numpy path)
im2col = cython_kernel("conv._conv", "im2col")
col2im = cython_kernel("conv._conv", "col2im")
depthwise = cython_kernel("conv._conv", "depthwise")
COMPILED = im2col is not None and col2im is not None and depthwise is not None
COL_BYTES = 8 << 20  # column scratch per band: large enough for BLAS, small enough for the cache levels


def _band(rows: int, row_elems: int) -> int:
    """Rows per band so that a band's columns take about :data:`COL_BYTES`."""
    return max(1, min(rows, COL_BYTES // max(1, 4 * row_elems)))


class _ConvBase(Kernel):
    """Shared: attributes, dtype checks, float16/bfloat16 widened to float32 and back."""

    transpose = False

    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.attrs: ConvAttrs = parse(spec, self.transpose)
        self.threads_for: Callable[[int], int | None] = spec.threads_for
        self.op = spec.op_type

    def _dtypes(self, x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> None:
        if w.dtype != x.dtype or (b is not None and b.dtype != x.dtype):
            raise self.error(f"{self.op} operands must share one dtype, got X {x.dtype}, W {w.dtype}"
                             + ("" if b is None else f", B {b.dtype}"))
        if x.dtype != F32 and x.dtype != F64 and x.dtype not in _WIDENED:
            raise self.error(f"{self.op} does not take {x.dtype} (float16, bfloat16, float32, float64)")

    def _bias(self, b: np.ndarray | None, m: int) -> None:
        if b is not None and b.shape != (m,):
            raise self.error(f"B has shape {list(b.shape)}, expected [{m}] (one value per output channel)")

    def run(self, x, w, b=None):
        self._dtypes(x, w, b)
        dtype = x.dtype
        if dtype in _WIDENED:
            x, w = x.astype(F32), w.astype(F32)
            b = None if b is None else b.astype(F32)
            return self._run(x, w, b).astype(dtype)
        return self._run(x, w, b)

    def _run(self, x, w, b):  # pragma: no cover - each operator overrides it
        raise NotImplementedError


@register("", "Conv")
class Conv(_ConvBase):
    """``Y = conv(X, W) + B``: X [N, C, *in], W [M, C / group, *kernel], B [M]."""

    def _run(self, x, w, b):
        if x.ndim < 3 or w.ndim != x.ndim:
            raise self.error(f"Conv takes X of rank 3 to 5 and W of the same rank, got shapes "
                             f"{list(x.shape)} and {list(w.shape)}")
        n, c = x.shape[:2]
        m, cg = w.shape[:2]
        group = self.attrs.group
        if c % group or m % group:
            raise self.error(f"group={group} must divide X's {c} channels and W's {m} output channels")
        if cg != c // group:
            raise self.error(f"W has {cg} input channels per group (shape {list(w.shape)}), X has "
                             f"{c} channels in {group} group(s): expected {c // group}")
        self._bias(b, m)
        geo = conv_geometry(self.attrs, x.shape, w.shape, self.error)
        if x.dtype != F32 or not COMPILED:
            lifted = geo.lift()
            y = numpy_path.conv(x.reshape(n, c, *lifted[0]), w.reshape(m, cg, *lifted[2]),
                                group, *lifted).reshape(n, m, *geo.outs)
        else:
            direct = group == c and group > 1 and bool(np.isfinite(w).all())
            y = self._f32(np.ascontiguousarray(x), np.ascontiguousarray(w), b, geo, group, direct)
            b = None if direct else b  # the depthwise loop adds it
        if b is not None:
            y += b.reshape((1, m) + (1,) * len(geo.outs))
        return y

    def _f32(self, x: np.ndarray, w: np.ndarray, b: np.ndarray | None, geo: Geometry,
             group: int, direct: bool) -> np.ndarray:
        """``direct``: the depthwise loop, which skips the taps over padding; with a non-finite
        weight the product path runs instead, so that ``inf * 0`` there is NaN as the
        definition (zero padding) says."""
        n, c = x.shape[:2]
        m, cg = w.shape[:2]
        ins, outs, kernel, strides, dilations, pads = geo.lift()
        k, s_out, s_in = size(kernel), size(outs), size(ins)
        if direct:  # depthwise: one input channel per group
            y = np.empty((n, m, *geo.outs), F32)
            bias = None if b is None else np.ascontiguousarray(b)
            return depthwise(x, w, bias, y, n, m // c, (c,) + ins, outs, kernel, strides,
                                   dilations, pads, num_threads=self.threads_for(n * m * s_out * k))
        if n * m * s_out == 0 or cg == 0:
            return np.zeros((n, m, *geo.outs), F32)
        mg = m // group
        y = np.empty((n, group, mg, s_out), F32)
        wr = w.reshape(group, mg, cg * k)
        BLAS.for_work(n * m * cg * k * s_out, w.nbytes)
        if k == 1 and outs == ins and not any(pads) and strides == (1, 1, 1):  # a plain product
            np.matmul(wr, x.reshape(n, group, cg, s_in), out=y)
            return y.reshape(n, m, *geo.outs)
        rows, ow = outs[0] * outs[1], outs[2]
        band = _band(rows, cg * k * ow)
        col = np.empty(cg * k * band * ow, F32)
        xg = x.reshape(n, group, cg * s_in)
        nt = self.threads_for(cg * k * band * ow)
        for i in range(n):
            for g in range(group):
                for r0 in range(0, rows, band):
                    r1 = min(rows, r0 + band)
                    cols = col[:cg * k * (r1 - r0) * ow].reshape(cg * k, (r1 - r0) * ow)
                    im2col(xg[i, g], cols, (cg,) + ins, outs, kernel, strides, dilations,
                                 pads, r0, r1, num_threads=nt)
                    np.matmul(wr[g], cols, out=y[i, g, :, r0 * ow:r1 * ow])
        return y.reshape(n, m, *geo.outs)


@register("", "ConvTranspose")
class ConvTranspose(_ConvBase):
    """``Y = conv_transpose(X, W) + B``: X [N, C, *in], W [C, M / group, *kernel], B [M]."""

    transpose = True

    def _run(self, x, w, b):
        if x.ndim < 3 or w.ndim != x.ndim:
            raise self.error(f"ConvTranspose takes X of rank 3 to 5 and W of the same rank, got "
                             f"shapes {list(x.shape)} and {list(w.shape)}")
        n, c = x.shape[:2]
        group = self.attrs.group
        mg = w.shape[1]
        m = mg * group
        if c % group:
            raise self.error(f"group={group} must divide X's {c} channels")
        if w.shape[0] != c:
            raise self.error(f"W has shape {list(w.shape)}: its first axis must be X's {c} channels")
        self._bias(b, m)
        geo = transpose_geometry(self.attrs, x.shape, w.shape, self.error)
        lifted = geo.lift()
        if x.dtype != F32 or not COMPILED:
            y = numpy_path.conv_transpose(x.reshape(n, c, *lifted[0]), w.reshape(c, mg, *lifted[2]),
                                          group, *lifted).reshape(n, m, *geo.outs)
        else:
            y = self._f32(np.ascontiguousarray(x), np.ascontiguousarray(w), geo, group)
        if b is not None:
            y += b.reshape((1, m) + (1,) * len(geo.outs))
        return y

    def _f32(self, x: np.ndarray, w: np.ndarray, geo: Geometry, group: int) -> np.ndarray:
        n, c = x.shape[:2]
        mg = w.shape[1]
        ins, outs, kernel, strides, dilations, pads = geo.lift()
        k, s_in = size(kernel), size(ins)
        cg = c // group
        y = np.zeros((n, group, mg, *outs), F32)
        if n * mg * size(outs) == 0 or cg == 0:
            return y.reshape(n, group * mg, *geo.outs)
        wt = np.swapaxes(w.reshape(group, cg, mg * k), 1, 2)  # [G, Mg*K, Cg], a view
        BLAS.for_work(n * c * mg * k * s_in, w.nbytes)
        rows, iw = ins[0] * ins[1], ins[2]
        band = _band(rows, mg * k * iw)
        col = np.empty(mg * k * band * iw, F32)
        xg = x.reshape(n, group, cg, s_in)
        nt = self.threads_for(mg * k * band * iw)
        for i in range(n):
            for g in range(group):
                for r0 in range(0, rows, band):
                    r1 = min(rows, r0 + band)
                    cols = col[:mg * k * (r1 - r0) * iw].reshape(mg * k, (r1 - r0) * iw)
                    np.matmul(wt[g], xg[i, g, :, r0 * iw:r1 * iw], out=cols)
                    col2im(cols, y[i, g], (mg,) + ins, outs, kernel, strides, dilations,
                                 pads, r0, r1, num_threads=nt)
        return y.reshape(n, group * mg, *geo.outs)
