"""Generators for the convolutions: Conv (onnx.reference, onnxruntime consulted on a
disagreement; with a non-finite input a float64 definition written here, since
onnx.reference dilates the kernel with zero weights, whose products with an inf the
definition never forms) and ConvTranspose (a float64 definition written here: onnx.reference mixes
up the channels of grouped ConvTranspose, and onnxruntime runs float32 only). Ranks 1-3,
groups and depthwise, strides, dilations, every auto_pad, asymmetric pads,
output_padding, now and then a constant (initializer) W."""
from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import numpy as np

from tests.fuzz.case import F16, F32, F64, Case, Draw

__all__ = ["GENERATORS"]


def _common(d: Draw) -> tuple[int, list[int], list[int], list[int], int, int, int, int, list[int]]:
    """Rank, spatial extents, kernel, strides, group, channels and outputs per group, batch,
    dilations."""
    nd = d.int(1, 3)
    spatial = [d.int(1, 6 if nd < 3 else 4) for _ in range(nd)]
    kernel = [d.int(1, 3) for _ in range(nd)]
    strides = [d.int(1, 3) for _ in range(nd)]
    dilations = [d.pick([1, 1, 2]) for _ in range(nd)]
    kind = d.pick(["plain", "groups", "depthwise"])
    group = 1 if kind == "plain" else d.int(2, 3)
    cg = 1 if kind == "depthwise" else d.int(1, 3)
    mg = d.int(1, 3)
    return nd, spatial, kernel, strides, group, cg, mg, d.dim(), dilations


def _tolerance(case: Case, dt: Any, terms: int) -> Case:
    if dt == F16:
        case.rtol, case.atol = 2e-2, 1e-2 * terms ** 0.5
    elif terms > 20:
        case.rtol, case.atol = 1e-4, 1e-5 * terms ** 0.5
    return case


def _conv_definition(group: int, strides: list[int], dilations: list[int], auto_pad: str,
                     pads: list[int] | None) -> Callable[[dict[str, np.ndarray]], list[np.ndarray]]:
    """``y[n, m, o] = b[m] + sum_{c, k} w[m, c, k] xp[n, g(m) Cg + c, o s + k d]`` in float64,
    ``xp`` the input with its zero padding (SAME_*: output ``ceil(in / s)``, the odd pad at
    the end for SAME_UPPER)."""

    def run(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        x, w = feeds["x"].astype(np.float64), feeds["w"].astype(np.float64)
        nd = x.ndim - 2
        n, c = x.shape[:2]
        m, cg = w.shape[:2]
        mg = m // group
        widths, outs = [], []
        for i in range(nd):
            size, ek = x.shape[2 + i], (w.shape[2 + i] - 1) * dilations[i] + 1
            if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
                out = -(-size // strides[i])
                total = max(0, (out - 1) * strides[i] + ek - size)
                b = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
                widths.append((b, total - b))
            else:
                widths.append((0, 0) if pads is None else (pads[i], pads[nd + i]))
                out = (size + sum(widths[-1]) - ek) // strides[i] + 1
            outs.append(out)
        xp = np.pad(x, [(0, 0), (0, 0)] + widths)
        y = np.zeros((n, m, *outs))
        for tap in itertools.product(*(range(v) for v in w.shape[2:])):
            sl = tuple(slice(t * dl, t * dl + (o - 1) * s + 1, s)
                       for t, dl, o, s in zip(tap, dilations, outs, strides))
            for g in range(group):
                xs = xp[(slice(None), slice(g * cg, (g + 1) * cg)) + sl]  # [n, cg, *outs]
                ws = w[(slice(g * mg, (g + 1) * mg), slice(None)) + tap]  # [mg, cg]
                y[:, g * mg:(g + 1) * mg] += np.einsum("mc,nc...->nm...", ws, xs)
        if feeds.get("b") is not None:
            y += feeds["b"].astype(np.float64).reshape((1, -1) + (1,) * nd)
        return [y.astype(feeds["x"].dtype)]

    return run


def conv(d: Draw) -> Case:
    dt = d.pick((F32, F32, F64, F16))
    nd, spatial, kernel, strides, group, cg, mg, n, dilations = _common(d)
    attrs: dict[str, Any] = {"group": group, "strides": strides, "dilations": dilations}
    auto_pad = d.pick(["NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"])
    ek = [(k - 1) * dl + 1 for k, dl in zip(kernel, dilations)]
    if auto_pad == "NOTSET":
        attrs["pads"] = [d.int(0, e - 1) for e in ek] + [d.int(0, e - 1) for e in ek]
        spatial = [max(s, e - p - q) for s, e, p, q in zip(spatial, ek, attrs["pads"][:nd], attrs["pads"][nd:])]
    else:
        attrs["auto_pad"] = auto_pad
        if auto_pad == "VALID":
            spatial = [max(s, e) for s, e in zip(spatial, ek)]
    if d.chance(0.3):
        attrs["kernel_shape"] = kernel
    x = d.values(dt, (n, cg * group, *spatial), lo=-2, hi=2)
    w = d.values(dt, (mg * group, cg, *kernel), lo=-2, hi=2)
    b = d.values(dt, (mg * group,), lo=-2, hi=2) if d.chance(0.6) else None
    case = Case("Conv", [("x", x), ("w", w), ("b", b)], attrs,
                consts=frozenset({"w"}) if d.chance(0.3) else frozenset())
    if not (np.isfinite(x).all() and np.isfinite(w).all()):
        case.oracle = _conv_definition(group, strides, dilations, auto_pad, attrs.get("pads"))
    terms = cg
    for k in kernel:
        terms *= k
    return _tolerance(case, dt, terms)


def _transpose_definition(group: int, strides: list[int], dilations: list[int], out_pad: list[int],
                          auto_pad: str, pads: list[int] | None) -> Callable[[dict[str, np.ndarray]], list[np.ndarray]]:
    """``y[n, g Mg + m, i s - pad + k d] += w[g Cg + c, m, k] x[n, g Cg + c, i]`` in float64,
    with the spec's pads (explicit, or SAME_*: output ``in * s``, total padding split with
    the odd one at the end for SAME_UPPER; an output past the full extent ends in zeros)."""

    def run(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        x, w = feeds["x"].astype(np.float64), feeds["w"].astype(np.float64)
        nd = x.ndim - 2
        n, c = x.shape[:2]
        cg, mg = c // group, w.shape[1]
        begins, outs = [], []
        for i in range(nd):
            full = strides[i] * (x.shape[2 + i] - 1) + out_pad[i] + (w.shape[2 + i] - 1) * dilations[i] + 1
            if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
                total = max(0, full - x.shape[2 + i] * strides[i])  # longer: zeros at the end
                begins.append(total // 2 if auto_pad == "SAME_UPPER" else total - total // 2)
                outs.append(x.shape[2 + i] * strides[i])
            else:
                b, e = (0, 0) if pads is None else (pads[i], pads[nd + i])
                begins.append(b)
                outs.append(full - b - e)
        y = np.zeros((n, group * mg, *outs))
        for pos in itertools.product(*(range(v) for v in x.shape[2:])):
            for tap in itertools.product(*(range(v) for v in w.shape[2:])):
                o = tuple(p * s - b + t * dl for p, s, b, t, dl in zip(pos, strides, begins, tap, dilations))
                if any(q < 0 or q >= e for q, e in zip(o, outs)):
                    continue
                for g in range(group):
                    xs = x[(slice(None), slice(g * cg, (g + 1) * cg)) + pos]
                    ws = w[(slice(g * cg, (g + 1) * cg), slice(None)) + tap]
                    y[(slice(None), slice(g * mg, (g + 1) * mg)) + o] += xs @ ws
        if feeds.get("b") is not None:
            y += feeds["b"].astype(np.float64).reshape((1, -1) + (1,) * nd)
        return [y.astype(feeds["x"].dtype)]

    return run


def conv_transpose(d: Draw) -> Case:
    dt = d.pick((F32, F32, F64, F16))
    nd, spatial, kernel, strides, group, cg, mg, n, dilations = _common(d)
    attrs: dict[str, Any] = {"group": group, "strides": strides, "dilations": dilations}
    ek = [(k - 1) * dl + 1 for k, dl in zip(kernel, dilations)]
    mode = d.pick(["pads", "pads", "SAME_UPPER", "SAME_LOWER", "VALID"])
    out_pad = [d.int(0, s - 1) for s in strides]
    if any(out_pad):
        attrs["output_padding"] = out_pad
    if mode == "pads":
        full = [s * (i - 1) + op + e for s, i, op, e in zip(strides, spatial, out_pad, ek)]
        begin = [d.int(0, min(2, f - 1)) for f in full]
        attrs["pads"] = begin + [d.int(0, min(2, f - 1 - b)) for f, b in zip(full, begin)]
    else:
        attrs["auto_pad"] = mode
    x = d.values(dt, (n, cg * group, *spatial), lo=-2, hi=2)
    w = d.values(dt, (cg * group, mg, *kernel), lo=-2, hi=2)
    b = d.values(dt, (mg * group,), lo=-2, hi=2) if d.chance(0.6) else None
    oracle = _transpose_definition(group, strides, dilations, out_pad, mode, attrs.get("pads"))
    case = Case("ConvTranspose", [("x", x), ("w", w), ("b", b)], attrs, oracle=oracle,
                consts=frozenset({"w"}) if d.chance(0.3) else frozenset())
    terms = cg
    for k in kernel:
        terms *= k
    return _tolerance(case, dt, terms)


GENERATORS = {("", "Conv"): conv, ("", "ConvTranspose"): conv_transpose}
