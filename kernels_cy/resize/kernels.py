"""ONNX ``Resize`` (opsets 10-19) and ``Upsample`` (opsets 7-9).

The output shape comes from ``scales`` (``floor(in * scale)`` in float32, as onnxruntime
computes it) or ``sizes`` (with ``axes`` and ``keep_aspect_ratio_policy``); each resized
axis then gets a tap table (:mod:`.taps`). float32 inputs whose resized axes are among
the last two run the compiled plane resize (``_resize.resize_planes``: NCHW images);
everything else runs the same tables one axis at a time in numpy. Plans are
shape-free: the tables are built per call from the shapes of that call.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from onnxforge.kernels_cy.ops.base import Kernel, NodeSpec, register
from onnxforge.kernels_cy.resize.taps import CTM_MODES, NEAREST_MODES, AxisTaps, axis_taps

try:
    from onnxforge.kernels_cy.resize._resize import resize_planes
except ImportError:  # pragma: no cover - a source tree without the compiled extension
    resize_planes = None

__all__ = ["Resize", "Upsample", "apply_taps"]

F32 = np.dtype(np.float32)
_FLOATS = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16))


def _work_dtype(dtype: np.dtype) -> np.dtype:
    return np.dtype(np.float64) if dtype == np.float64 else F32


def _cast_back(y: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """The interpolated values in the input's dtype: integers round half to even and saturate."""
    if y.dtype == dtype:
        return y
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return np.clip(np.rint(y), info.min, info.max).astype(dtype)
    return y.astype(dtype)


def apply_taps(x: np.ndarray, axis: int, taps: AxisTaps) -> np.ndarray:
    """Resize ``x`` along ``axis`` with one tap table (numpy; any dtype: a copy table
    gathers, others interpolate in float32, or float64 for float64 input)."""
    if taps.copy:
        return np.take(x, taps.index[:, 0], axis=axis)
    wd = _work_dtype(x.dtype)
    g = np.take(x, taps.index, axis=axis).astype(wd, copy=False)
    shape = [1] * g.ndim
    shape[axis], shape[axis + 1] = taps.weight.shape
    return (g * taps.weight.astype(wd).reshape(shape)).sum(axis=axis + 1)


class _ResizeBase(Kernel):
    """The shared machinery; subclasses parse their inputs into output sizes and scales."""

    def _setup(self, spec: NodeSpec, mode: str, ctm: str, nearest_mode: str) -> None:
        self.mode = mode
        self.ctm = ctm
        self.nearest_mode = nearest_mode
        self.cubic_a = spec.float("cubic_coeff_a", -0.75)
        self.exclude_outside = bool(spec.int("exclude_outside", 0))
        self.extrapolation = spec.float("extrapolation_value", 0.0)
        self.antialias = bool(spec.int("antialias", 0))
        if self.antialias and mode == "nearest":
            raise spec.fail("antialias applies to the linear and cubic modes only, not to nearest")
        self.threads = spec.threads

    def _resize(self, x: np.ndarray, out_shape: list[int], scales: list[float],
                roi: list[tuple[float, float]] | None) -> np.ndarray:
        if any(o < 0 for o in out_shape):
            raise self.error(f"the output shape {out_shape} has a negative extent")
        tables: dict[int, AxisTaps] = {}
        for a, (n_in, n_out) in enumerate(zip(x.shape, out_shape)):
            lo, hi = roi[a] if roi is not None else (0.0, 1.0)
            if n_out == 0:
                tables[a] = AxisTaps(np.zeros((0, 1), np.int64), np.ones((0, 1), F32), None, False, True)
                continue
            if n_in == 0:
                raise self.error(f"axis {a} has no element to resize to {n_out}")
            t = axis_taps(self.mode, self.ctm, n_in, n_out, scales[a], nearest_mode=self.nearest_mode,
                          cubic_a=self.cubic_a, exclude_outside=self.exclude_outside, antialias=self.antialias,
                          roi_start=lo, roi_end=hi)
            if not t.identity:
                tables[a] = t
        if not tables:
            return x.copy()
        if 0 in out_shape:
            return np.empty(out_shape, dtype=x.dtype)
        r = x.ndim
        if resize_planes is not None and x.dtype == F32 and r >= 2 and all(a >= r - 2 for a in tables):
            y = self._planes(x, out_shape, tables)
        else:
            y = x
            for a in sorted(tables, key=lambda a: out_shape[a] / max(x.shape[a], 1)):  # shrink first
                y = apply_taps(y, a, tables[a])
            y = _cast_back(y, x.dtype)
        for a, t in tables.items():
            if t.outside is not None:
                sel: list[Any] = [slice(None)] * r
                sel[a] = t.outside
                y[tuple(sel)] = self.extrapolation
        return y

    def _planes(self, x: np.ndarray, out_shape: list[int], tables: dict[int, AxisTaps]) -> np.ndarray:
        r = x.ndim
        h, w = x.shape[-2], x.shape[-1]
        oh, ow = out_shape[-2], out_shape[-1]
        ty = tables.get(r - 2)
        tx = tables.get(r - 1)
        iy, wy = (ty.index, ty.weight) if ty is not None else (np.arange(h, dtype=np.int64)[:, None], np.ones((h, 1), F32))
        ix, wx = (tx.index, tx.weight) if tx is not None else (np.arange(w, dtype=np.int64)[:, None], np.ones((w, 1), F32))
        xs = np.ascontiguousarray(x).reshape(-1, h, w)
        out = np.empty(out_shape, dtype=F32)
        work = out.size * (iy.shape[1] + ix.shape[1])
        threads = self.threads if self.threads > 1 and work >= (1 << 18) else None
        resize_planes(xs, np.ascontiguousarray(iy), np.ascontiguousarray(wy), np.ascontiguousarray(ix),
                      np.ascontiguousarray(wx), out.reshape(-1, oh, ow), threads)
        return out


def _floats(v: np.ndarray | None) -> list[float] | None:
    """A 1-D float input, or None when it is absent or empty."""
    if v is None or v.size == 0:
        return None
    return [float(f) for f in np.asarray(v, dtype=F32).reshape(-1)]


@register("", "Resize")
class Resize(_ResizeBase):
    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.opset = spec.opset
        mode = spec.choice("mode", "nearest", {"nearest", "linear", "cubic"} if spec.opset >= 11 else {"nearest", "linear"})
        if spec.opset < 11:
            ctm, nearest = "asymmetric", "simple"
        else:
            modes = set(CTM_MODES)
            if spec.opset >= 13:
                modes.discard("tf_half_pixel_for_nn")
            if spec.opset < 18:
                modes.discard("half_pixel_symmetric")
            ctm = spec.choice("coordinate_transformation_mode", "half_pixel", modes)
            nearest = spec.choice("nearest_mode", "round_prefer_floor", NEAREST_MODES - {"simple"})
        self._setup(spec, mode, ctm, nearest)
        axes = spec.ints("axes") if spec.opset >= 18 else None
        if axes is not None and len(set(axes)) != len(axes):
            raise spec.fail(f"axes {axes} repeat an axis")
        self.axes = axes
        self.policy = spec.choice("keep_aspect_ratio_policy", "stretch", {"stretch", "not_larger", "not_smaller"})

    def _axes(self, r: int) -> list[int]:
        if self.axes is None:
            return list(range(r))
        out = []
        for a in self.axes:
            if not -r <= a < r:
                raise self.error(f"axis {a} is out of range for rank {r}")
            out.append(a % r)
        if len(set(out)) != len(out):
            raise self.error(f"axes {self.axes} repeat an axis of rank {r}")
        return out

    def run(self, x, roi=None, scales=None, sizes=None):
        if self.opset < 11:  # Resize-10: (X, scales)
            roi, scales, sizes = None, roi, None
        r = x.ndim
        axes = self._axes(r)
        sc = _floats(scales)
        sz = None if sizes is None or sizes.size == 0 else [int(v) for v in np.asarray(sizes).reshape(-1)]
        if sc is not None and sz is not None:
            raise self.error("only one of scales and sizes may be given")
        if sc is None and sz is None:
            raise self.error("one of scales and sizes must be given")
        given = sc if sc is not None else sz
        if len(given) != len(axes):
            raise self.error(f"{'scales' if sc is not None else 'sizes'} has {len(given)} values, "
                             f"expected one per resized axis ({len(axes)})")
        out_shape = list(x.shape)
        ax_scales = [1.0] * r
        if sc is not None:
            for a, s in zip(axes, sc):
                if not s > 0:
                    raise self.error(f"scale {s} of axis {a} must be positive")
                ax_scales[a] = s
                out_shape[a] = int(np.float32(x.shape[a]) * np.float32(s))
        else:
            if any(v < 0 for v in sz):
                raise self.error(f"sizes {sz} has a negative value")
            if self.policy != "stretch":
                ratios = [np.float32(v) / np.float32(x.shape[a]) for a, v in zip(axes, sz)]
                s = min(ratios) if self.policy == "not_larger" else max(ratios)
                for a in axes:
                    ax_scales[a] = float(s)
                    out_shape[a] = int(np.floor(np.float32(s) * np.float32(x.shape[a]) + np.float32(0.5)))
            else:
                for a, v in zip(axes, sz):
                    out_shape[a] = v
                    ax_scales[a] = float(np.float32(v) / np.float32(x.shape[a])) if x.shape[a] else 1.0
        rois = None
        if self.ctm == "tf_crop_and_resize":
            rv = _floats(roi)
            if rv is None:
                raise self.error("coordinate_transformation_mode tf_crop_and_resize needs the roi input")
            k = len(axes)
            if len(rv) == 2 * k:
                rois = [(0.0, 1.0)] * r
                for i, a in enumerate(axes):
                    rois[a] = (rv[i], rv[k + i])
            elif len(rv) == 2 * r:
                rois = [(rv[a], rv[r + a]) for a in range(r)]
            else:
                raise self.error(f"roi has {len(rv)} values, expected {2 * k}")
        return self._resize(x, out_shape, ax_scales, rois)


@register("", "Upsample")
class Upsample(_ResizeBase):
    """Upsample (deprecated since opset 10): ``scales`` as an attribute (opset 7) or an
    input (opset 9), modes nearest and linear, asymmetric coordinates."""

    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        mode = spec.choice("mode", "nearest", {"nearest", "linear", "bilinear"})
        self._setup(spec, "linear" if mode == "bilinear" else mode, "asymmetric", "simple")
        self.scales_attr = [float(s) for s in spec.attrs["scales"]] if "scales" in spec.attrs else None
        if spec.opset < 9 and self.scales_attr is None:
            raise spec.fail("attribute 'scales' is required")

    def run(self, x, scales=None):
        sc = self.scales_attr if scales is None else _floats(scales)
        if sc is None or len(sc) != x.ndim:
            raise self.error(f"scales must hold one value per axis of the rank-{x.ndim} input, got {sc}")
        if any(not s >= 1 for s in sc):
            raise self.error(f"Upsample scales {sc} must all be >= 1")
        out_shape = [int(np.float32(n) * np.float32(s)) for n, s in zip(x.shape, sc)]
        return self._resize(x, out_shape, sc, None)
