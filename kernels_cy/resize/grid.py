"""ONNX ``GridSample`` (opsets 16 and 20): sample ``X [N, C, D1, ..., Dr]`` at the normalized
locations of ``grid [N, O1, ..., Or, r]`` (last grid axis in reversed axis order: x is the
width) into ``Y [N, C, O1, ..., Or]``.

Vectorized over every output location: each spatial axis yields, per location, the input
indices of its taps (1 nearest, 2 linear, 4 cubic) and their weights, already passed
through the padding mode; the output is the sum over the tap combinations of the weight
products times the gathered pixels. The rules follow the specification and onnxruntime:
coordinates are unnormalized in float32, nearest rounds half to even, ``border`` and
``reflection`` first move an outside location inside, then every tap outside the input
reads 0 (zeros), the nearest edge pixel (border) or its mirror image (reflection). Cubic
sampling with ``border`` clamps each of its taps but not the location itself, as
onnxruntime (and PyTorch) do; onnx.reference clamps the location first.
"""
from __future__ import annotations

import itertools

import numpy as np

from onnxforge.kernels_cy.ops.base import Kernel, NodeSpec, register

__all__ = ["GridSample", "grid_sample"]

F32 = np.float32
_MODES = {"bilinear": "linear", "linear": "linear", "nearest": "nearest", "bicubic": "cubic", "cubic": "cubic"}


def _reflect(v: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Mirror ``v`` at the borders ``lo`` and ``hi`` until it lies between them."""
    rng = hi - lo
    if rng <= 0:
        return np.full_like(v, lo)
    below, above = v < lo, v > hi
    dx = np.where(below, lo - v, v - hi)
    n = np.trunc(dx / rng)
    r = dx - n * rng
    even = np.fmod(n, 2) == 0
    from_lo, from_hi = lo + r, hi - r
    moved = np.where(below, np.where(even, from_lo, from_hi), np.where(even, from_hi, from_lo))
    return np.where(below | above, moved, v)


def _cubic_weights(t: np.ndarray) -> np.ndarray:
    a = -0.75
    t1, t2 = t + 1.0, 1.0 - t
    t3 = t2 + 1.0
    return np.stack([((a * t1 - 5 * a) * t1 + 8 * a) * t1 - 4 * a,
                     ((a + 2) * t - (a + 3)) * t * t + 1,
                     ((a + 2) * t2 - (a + 3)) * t2 * t2 + 1,
                     ((a * t3 - 5 * a) * t3 + 8 * a) * t3 - 4 * a], axis=-1)


def _axis_taps(g: np.ndarray, size: int, mode: str, padding: str, align: bool) -> tuple[np.ndarray, np.ndarray]:
    """Tap indices (int64, clamped into the axis) and weights (float64, 0 for a zeros-padded
    tap outside) of one spatial axis at the normalized coordinates ``g``."""
    g = g.astype(F32)
    one, two = F32(1), F32(2)
    if align:
        c = (g + one) / two * F32(size - 1)
        lo, hi = 0.0, float(size - 1)
    else:
        c = ((g + one) * F32(size) - one) / two
        lo, hi = -0.5, size - 0.5
    c = c.astype(np.float64)
    if mode == "nearest":
        c = np.rint(c)
    if padding == "border" and mode != "cubic":  # cubic clamps each tap instead (onnxruntime, PyTorch)
        c = np.where((c < lo) | (c > hi), np.clip(c, 0, size - 1), c)
    elif padding == "reflection":
        c = _reflect(c, lo, hi)
    if mode == "nearest":
        raw = np.trunc(c).astype(np.int64)[..., None]
        w = np.ones(raw.shape)
    else:
        base = np.floor(c)
        t = c - base
        if mode == "linear":
            raw = base.astype(np.int64)[..., None] + np.arange(2)
            w = np.stack([1.0 - t, t], axis=-1)
        else:
            raw = base.astype(np.int64)[..., None] + np.arange(-1, 3)
            w = _cubic_weights(t)
    if padding == "zeros":
        w = np.where((raw < 0) | (raw >= size), 0.0, w)
    elif padding == "reflection":
        raw = np.trunc(_reflect(raw.astype(np.float64), lo, hi)).astype(np.int64)
    return np.clip(raw, 0, size - 1), w


def grid_sample(x: np.ndarray, grid: np.ndarray, mode: str, padding: str, align: bool) -> np.ndarray:
    """``GridSample`` of ``x`` at ``grid`` (see the module docstring); numpy, any float dtype."""
    n, c = x.shape[:2]
    sizes = x.shape[2:]
    r = len(sizes)
    out_sp = grid.shape[1:-1]
    wd = np.float64 if x.dtype == np.float64 else F32
    if n * c * int(np.prod(out_sp, dtype=np.int64)) == 0:
        return np.zeros((n, c, *out_sp), dtype=x.dtype)
    if any(s == 0 for s in sizes):
        if padding == "zeros":
            return np.zeros((n, c, *out_sp), dtype=x.dtype)
        raise ValueError(f"GridSample: the input has an empty spatial axis, shape {list(x.shape)}")
    taps = [_axis_taps(grid[..., r - 1 - i], sizes[i], mode, padding, align) for i in range(r)]
    nn = np.arange(n).reshape((n,) + (1,) * len(out_sp))
    acc = np.zeros((n, *out_sp, c), dtype=np.float64 if wd == np.float64 else F32)
    xw = x.astype(wd, copy=False)
    for combo in itertools.product(*(range(t[0].shape[-1]) for t in taps)):
        w = taps[0][1][..., combo[0]]
        for i in range(1, r):
            w = w * taps[i][1][..., combo[i]]
        if not w.any():
            continue
        idx = tuple(taps[i][0][..., combo[i]] for i in range(r))
        vals = xw[(nn, slice(None)) + idx]  # [N, *out, C]
        acc += vals * w[..., None].astype(acc.dtype)
    y = np.moveaxis(acc, -1, 1)
    return np.ascontiguousarray(y).astype(x.dtype, copy=False)


@register("", "GridSample")
class GridSample(Kernel):
    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        names = {"bilinear", "nearest", "bicubic"} if spec.opset < 20 else {"linear", "nearest", "cubic"}
        self.mode = _MODES[spec.choice("mode", "bilinear" if spec.opset < 20 else "linear", names)]
        self.padding = spec.choice("padding_mode", "zeros", {"zeros", "border", "reflection"})
        self.align = bool(spec.int("align_corners", 0))
        self.opset = spec.opset

    def run(self, x, grid):
        if x.ndim < 3 or grid.ndim != x.ndim or grid.shape[-1] != x.ndim - 2 or grid.shape[0] != x.shape[0]:
            raise self.error(f"grid shape {list(grid.shape)} does not fit input shape {list(x.shape)}: "
                             f"expected [{x.shape[0] if x.ndim else '?'}, ..., {x.ndim - 2}] of rank {x.ndim}")
        if self.opset < 20 and x.ndim != 4:
            raise self.error(f"GridSample-{self.opset} takes a 4-D input, got rank {x.ndim}")
        try:
            return grid_sample(x, grid, self.mode, self.padding, self.align)
        except ValueError as e:
            raise self.error(str(e)) from None
