"""Generators for the resampling operators: Resize, Upsample and GridSample, on the
configurations onnxruntime implements (4-D NCHW inputs resized on H and W) and where it
follows the specification (tests/kernels_cy/test_resize.py names the places it does not).
Values are finite: whether an infinity or NaN reaches an output through a tap of weight
zero depends on which taps an implementation reads, which the specification leaves open."""
from __future__ import annotations

from typing import Any

import numpy as np

from tests.fuzz.case import F32, Case, Draw

__all__ = ["GENERATORS"]

_CTM = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric")
_SCALES = (0.5, 0.6, 0.75, 1.0, 1.5, 2.0, 3.0)


def resize(d: Draw) -> Case:
    shape = (d.int(0, 2), d.int(1, 3), d.int(1, 6), d.int(1, 6))
    x = d.values(F32, shape, lo=-2, hi=2, special=0)
    mode = d.pick(("nearest", "linear", "cubic"))
    attrs: dict[str, Any] = {"mode": mode, "coordinate_transformation_mode": d.pick(_CTM)}
    if mode == "nearest":
        # exact ties of floor/ceil under half_pixel_symmetric fall either way in float32
        if attrs["coordinate_transformation_mode"] != "half_pixel_symmetric":
            attrs["nearest_mode"] = d.pick(("round_prefer_floor", "round_prefer_ceil", "floor", "ceil"))
    else:
        attrs["antialias"] = d.int(0, 1)
    if mode == "cubic":
        attrs["exclude_outside"] = d.int(0, 1)
        attrs["cubic_coeff_a"] = d.pick((-0.75, -0.5))
    if d.chance(0.5):
        scales = np.array([1, 1, d.pick(_SCALES), d.pick(_SCALES)], np.float32)
        inputs = [("x", x), ("roi", None), ("scales", scales)]
    else:
        sizes = np.array([shape[0], shape[1], d.int(1, 9), d.int(1, 9)], np.int64)
        inputs = [("x", x), ("roi", None), ("scales", None), ("sizes", sizes)]
    case = Case("Resize", inputs, attrs, opset=19, oracle="ort")
    case.rtol, case.atol = 1e-4, 1e-4
    return case


def upsample(d: Draw) -> Case:
    x = d.values(F32, (d.int(1, 2), d.int(1, 2), d.int(1, 5), d.int(1, 5)), lo=-2, hi=2, special=0)
    scales = np.array([1, 1, d.pick((1.0, 2.0, 2.5, 3.0)), d.pick((1.0, 1.5, 2.0))], np.float32)
    case = Case("Upsample", [("x", x), ("scales", scales)], {"mode": d.pick(("nearest", "linear"))},
                opset=9, oracle="ort")
    case.rtol, case.atol = 1e-4, 1e-4
    return case


def grid_sample(d: Draw) -> Case:
    n = d.int(1, 2)
    x = d.values(F32, (n, d.int(1, 3), d.int(1, 6), d.int(1, 6)), lo=-2, hi=2, special=0)
    grid = d.values(F32, (n, d.int(1, 5), d.int(1, 5), 2), lo=-1.5, hi=1.5, special=0)
    attrs = {"mode": d.pick(("linear", "nearest", "cubic")),
             "padding_mode": d.pick(("zeros", "border", "reflection")), "align_corners": d.int(0, 1)}
    case = Case("GridSample", [("x", x), ("grid", grid)], attrs, opset=20, oracle="ort")
    case.rtol, case.atol = 1e-4, 1e-4
    return case


GENERATORS: dict[tuple[str, str], Any] = {
    ("", "Resize"): resize, ("", "Upsample"): upsample, ("", "GridSample"): grid_sample,
}
