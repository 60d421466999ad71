"""Per-axis tap tables of ONNX ``Resize``: for each output index along one axis, the input
indices it reads and their weights.

Resize is separable: every mode (nearest, linear, cubic, with or without antialiasing)
and every coordinate transformation acts on each axis alone, so an N-D resize is a chain
of 1-D resizes, each described by an ``[out, K]`` index table and an ``[out, K]`` weight
table. Indices are clamped into the axis (the specification's edge padding).

Source coordinates are computed in float32 with the operator specification's formulas in
the order onnxruntime evaluates them, so that the ties of nearest rounding and the
borders of ``tf_crop_and_resize`` fall where onnxruntime puts them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["AxisTaps", "CTM_MODES", "NEAREST_MODES", "axis_taps", "source_coords"]

F32 = np.float32
CTM_MODES = frozenset({"half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
                       "asymmetric", "tf_crop_and_resize", "tf_half_pixel_for_nn"})
NEAREST_MODES = frozenset({"round_prefer_floor", "round_prefer_ceil", "floor", "ceil", "simple"})


@dataclass(frozen=True, slots=True)
class AxisTaps:
    """``out[o] = sum_k weight[o, k] * in[index[o, k]]``; where ``outside[o]`` (only for
    ``tf_crop_and_resize``) the output is the extrapolation value instead. ``identity``:
    the axis maps every output index onto the same input index (nothing to do)."""

    index: np.ndarray  # int64 [out, K]
    weight: np.ndarray  # float32 [out, K]
    outside: np.ndarray | None  # bool [out] or None
    identity: bool
    copy: bool  # one tap of weight 1 per output (a gather, exact for every dtype)


def source_coords(ctm: str, out_len: int, in_len: int, scale: float, roi_start: float = 0.0,
                  roi_end: float = 1.0) -> np.ndarray:
    """float32 source coordinate of each output index (the ``coordinate_transformation_mode``
    formulas; ``scale`` is the axis scale, ``out_len`` the integer output length)."""
    o = np.arange(out_len, dtype=F32)
    s = F32(scale)
    half = F32(0.5)
    fin, fout = F32(in_len), F32(out_len)
    if ctm == "half_pixel":
        return (o + half) / s - half
    if ctm == "half_pixel_symmetric":
        adjustment = fout / (s * fin)
        offset = (fin / F32(2)) * (F32(1) - adjustment)
        return offset + (o + half) / s - half
    if ctm == "pytorch_half_pixel":
        return (o + half) / s - half if out_len > 1 else np.zeros(out_len, F32)
    if ctm == "align_corners":
        return o * (fin - F32(1)) / (fout - F32(1)) if out_len > 1 else np.zeros(out_len, F32)
    if ctm == "asymmetric":
        return o / s
    if ctm == "tf_half_pixel_for_nn":
        return (o + half) / s
    if ctm == "tf_crop_and_resize":
        r0, r1 = F32(roi_start), F32(roi_end)
        if out_len > 1:
            return r0 * (fin - F32(1)) + (o * (r1 - r0) * (fin - F32(1))) / (fout - F32(1))
        return np.full(out_len, 0.5 * (float(r0) + float(r1)) * (in_len - 1), dtype=F32)
    raise ValueError(f"unknown coordinate_transformation_mode {ctm!r}")


def _nearest(x: np.ndarray, mode: str, downscale: bool) -> np.ndarray:
    x64 = x.astype(np.float64)
    if mode == "round_prefer_floor":
        r = np.ceil(x64 - 0.5)
    elif mode == "round_prefer_ceil":
        r = np.floor(x64 + 0.5)
    elif mode == "floor":
        r = np.floor(x64)
    elif mode == "ceil":
        r = np.ceil(x64)
    else:  # "simple" (Resize-10 and Upsample): ceil when downscaling, else truncation
        r = np.ceil(x64) if downscale else np.trunc(x64)
    return r.astype(np.int64)


def _cubic(d: np.ndarray, a: float) -> np.ndarray:
    """Keys' cubic convolution kernel of parameter ``a`` at distances ``d`` (float64)."""
    d = np.abs(d)
    d2, d3 = d * d, d * d * d
    near = (a + 2) * d3 - (a + 3) * d2 + 1
    far = a * d3 - 5 * a * d2 + 8 * a * d - 4 * a
    return np.where(d <= 1, near, np.where(d < 2, far, 0.0))


def axis_taps(mode: str, ctm: str, in_len: int, out_len: int, scale: float, *, nearest_mode: str = "round_prefer_floor",
              cubic_a: float = -0.75, exclude_outside: bool = False, antialias: bool = False,
              roi_start: float = 0.0, roi_end: float = 1.0) -> AxisTaps:
    """The tap table of one axis resized from ``in_len`` to ``out_len`` (``in_len >= 1``)."""
    x = source_coords(ctm, out_len, in_len, scale, roi_start, roi_end)
    outside = None
    if ctm == "tf_crop_and_resize":
        out_mask = (x < 0) | (x > F32(in_len - 1))
        outside = out_mask if out_mask.any() else None
    identity = (out_len == in_len and outside is None and np.array_equal(x, np.arange(out_len, dtype=F32)))
    last = in_len - 1
    if mode == "nearest":
        idx = np.clip(_nearest(x, nearest_mode, scale < 1), 0, last)[:, None]
        return AxisTaps(idx, np.ones((out_len, 1), F32), outside, identity, True)
    x64 = x.astype(np.float64)
    if mode == "linear" and not (antialias and scale < 1):
        xc = np.clip(x64, 0.0, float(last))
        i0 = np.floor(xc).astype(np.int64)
        t = xc - i0
        idx = np.stack([i0, np.minimum(i0 + 1, last)], axis=1)
        w = np.stack([1.0 - t, t], axis=1)
        return AxisTaps(idx, w.astype(F32), outside, identity, False)
    # cubic, and antialiased linear: a kernel of support ``half`` input pixels around x,
    # stretched by 1/scale when antialiasing a downscale
    stretch = 1.0 / scale if antialias and scale < 1 else 1.0
    half = (1.0 if mode == "linear" else 2.0) * stretch
    reach = int(math.ceil(half))
    base = np.floor(x64).astype(np.int64)
    offs = np.arange(-reach, reach + 2, dtype=np.int64)
    raw = base[:, None] + offs[None, :]
    d = (raw - x64[:, None]) / stretch
    if mode == "linear":
        w = np.clip(1.0 - np.abs(d), 0.0, 1.0)
    else:
        w = _cubic(d, cubic_a)
    if stretch != 1.0:
        w = w / w.sum(axis=1, keepdims=True)
    if exclude_outside:
        w = np.where((raw < 0) | (raw > last), 0.0, w)
        total = w.sum(axis=1, keepdims=True)
        w = w / np.where(total == 0, 1.0, total)
    keep = np.any(w != 0, axis=0)  # drop the table columns no output uses
    if not keep.any():
        keep[0] = True
    idx = np.clip(raw[:, keep], 0, last)
    return AxisTaps(idx, w[:, keep].astype(F32), outside, identity, False)
