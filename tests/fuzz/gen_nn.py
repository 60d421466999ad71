"""Generators for dense and normalization operators: MatMul, Gemm, the softmax family,
reductions, ArgMax/ArgMin and the (skip, simplified) layer normalizations."""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from tests.fuzz.case import BF16, F16, F32, F64, FLOATS, SIGNED, Case, Draw

__all__ = ["GENERATORS"]

I64 = np.dtype(np.int64)
MS = "com.microsoft"


def matmul(d: Draw) -> Case:
    dt = d.pick(FLOATS + (BF16, np.dtype(np.int64), np.dtype(np.int32)))
    m, k, n = d.dim(), d.dim(), d.dim()
    if d.chance(0.02):
        k = d.int(100, 4000)
    batch = d.shape(hi=2)
    a_shape = (k,) if d.chance(0.1) else batch + (m, k)
    b_shape = (k,) if d.chance(0.1) else (batch[d.int(0, len(batch)):] if d.chance(0.5) else ()) + (k, n)
    if d.chance(0.03):
        b_shape = b_shape[:-2] + (k + 1,) + b_shape[-1:]  # hostile: inner dimensions differ
    a = d.values(dt, a_shape, lo=-2, hi=2)
    b = d.values(dt, b_shape, lo=-2, hi=2)
    case = Case("MatMul", [("a", a), ("b", b)])
    if k > 50:
        case.rtol, case.atol = 1e-4, 1e-4 * k ** 0.5  # summation order over a long inner axis
    if dt == BF16:
        case.oracle = "ort"  # onnx.reference's bfloat16 matmul rounds differently
    return case


def gemm(d: Draw) -> Case:
    dt = d.pick((F32, F32, F64, F16, BF16))
    m, k, n = d.dim(), d.dim(), d.dim()
    ta, tb = d.int(0, 1), d.int(0, 1)
    a = d.values(dt, (k, m) if ta else (m, k), lo=-2, hi=2)
    b = d.values(dt, (n, k) if tb else (k, n), lo=-2, hi=2)
    c = None
    if d.chance(0.7):
        c = d.values(dt, d.pick([(m, n), (n,), (1, n), (m, 1), ()]), lo=-2, hi=2)
    attrs: dict[str, Any] = {"transA": ta, "transB": tb}
    if d.chance(0.5):
        attrs["alpha"] = d.pick([0.5, 2.0, -1.0])
    if d.chance(0.5):
        attrs["beta"] = d.pick([0.0, 0.5, 3.0])
    case = Case("Gemm", [("a", a), ("b", b), ("c", c)], attrs)
    if dt == BF16:
        case.oracle = "ort"
        case.rtol, case.atol = 2e-2, 2e-2
    return case


def softmax(op: str) -> Any:
    def gen(d: Draw) -> Case:
        # Hardmax of a NaN: the order of NaN is unspecified (numpy picks it, onnxruntime skips it)
        opset = d.pick([23, 23, 11])
        dt = F32 if opset < 13 else d.pick(FLOATS)  # onnxruntime, the oracle there, has float32 kernels
        x = d.values(dt, d.shape(lo=1), lo=-20, hi=20, special=0.0 if op == "Hardmax" else 0.05)
        attrs = {"axis": d.int(-x.ndim, x.ndim - 1)} if d.chance(0.7) else {}
        if d.chance(0.03):
            attrs["axis"] = x.ndim
        # before opset 13 onnx.reference applies the per-axis form (known.py)
        return Case(op, [("x", x)], attrs, opset=opset, oracle="ort" if opset < 13 else "reference")
    return gen


REDUCE = ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
          "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp")


def reduce(op: str) -> Any:
    def gen(d: Draw) -> Case:
        types = FLOATS + (SIGNED[:2] if op not in ("ReduceLogSum", "ReduceLogSumExp", "ReduceMean") else ())
        dt = d.pick(types)
        lo, hi = (-3, 3) if dt.kind in "iu" else (-4, 4)
        if op in ("ReduceLogSum",):
            lo = 0.1
        x = d.values(dt, d.shape(), lo=lo, hi=hi)
        if op == "ReduceProd" and dt.kind in "iu":
            x = np.clip(x, -2, 2).astype(dt)
        attrs: dict[str, Any] = {}
        if d.chance(0.5):
            attrs["keepdims"] = d.int(0, 1)
        if d.chance(0.3):
            attrs["noop_with_empty_axes"] = d.int(0, 1)
        axes = None
        if d.chance(0.7) and x.ndim:
            axes = sorted({d.int(-x.ndim, x.ndim - 1) for _ in range(d.int(1, x.ndim))}, key=lambda a: a % x.ndim)
            axes = list({a % x.ndim: a for a in axes}.values())
            if d.chance(0.04):
                axes.append(x.ndim + 1)
        elif d.chance(0.2):
            axes = []
        opset = 18
        ins = [("x", x)]
        if axes is not None:
            ins.append(("axes", np.array(axes, I64)))
        case = Case(op, ins, attrs, opset=opset, consts=frozenset({"axes"}) if d.chance(0.5) else frozenset())
        if op in ("ReduceMax", "ReduceMin") and x.size == 0 and not (axes == [] and attrs.get("noop_with_empty_axes")):
            reduced = range(x.ndim) if not axes else {a % x.ndim for a in axes if -x.ndim <= a < x.ndim}
            if any(x.shape[a] == 0 for a in reduced):
                case.oracle = "ort"  # onnx.reference raises on an empty max/min
        return case
    return gen


def argmax(op: str) -> Any:
    def gen(d: Draw) -> Case:
        x = d.values(d.pick(FLOATS + SIGNED), d.shape(lo=1), lo=-3, hi=3, special=0.0)
        attrs = {"axis": d.int(-x.ndim, x.ndim - 1)}
        if d.chance(0.5):
            attrs["keepdims"] = d.int(0, 1)
        if d.chance(0.5):
            attrs["select_last_index"] = d.int(0, 1)
        case = Case(op, [("x", x)], attrs)
        if x.shape[attrs["axis"]] == 0:
            case.out_of_spec = "argmax-of-empty"
        return case
    return gen


def _norm_inputs(d: Draw, dt: np.dtype, axis_last: bool = False, special: float = 0.05
                 ) -> tuple[np.ndarray, int, tuple[int, ...]]:
    x = d.values(dt, d.shape(lo=1), lo=-3, hi=3, special=special)
    axis = -1 if axis_last or d.chance(0.5) else d.int(-x.ndim, x.ndim - 1)
    return x, axis, x.shape[axis % x.ndim:]


def rms_norm(d: Draw) -> Case:
    dt = d.pick((F32, F32, F16, F64))
    x, axis, norm_shape = _norm_inputs(d, dt)
    scale = d.values(dt, norm_shape[-1:] if d.chance(0.5) else norm_shape)
    attrs: dict[str, Any] = {"axis": axis}
    if d.chance(0.5):
        attrs["epsilon"] = d.pick([1e-5, 1e-6, 0.1])
    case = Case("RMSNormalization", [("x", x), ("scale", scale)], attrs)
    if dt == F16:
        case.rtol, case.atol = 2e-3, 2e-3
    return case


def layer_norm(d: Draw) -> Case:
    dt = d.pick((F32, F32, F16, F64))
    # float16: onnx.reference types Mean/InvStdDev wrongly (known.py), so onnxruntime judges, and
    # it reports a NaN mean for a row holding inf (the reference and the backend: +-inf): finite rows
    x, axis, norm_shape = _norm_inputs(d, dt, special=0.0 if dt == F16 else 0.05)
    scale = d.values(dt, norm_shape)
    bias = d.values(dt, norm_shape) if d.chance(0.6) else None
    attrs: dict[str, Any] = {"axis": axis}
    if d.chance(0.5):
        attrs["epsilon"] = d.pick([1e-5, 0.1])
    case = Case("LayerNormalization", [("x", x), ("scale", scale), ("bias", bias)], attrs, n_out=d.int(1, 3))
    if dt == F16:
        case.rtol, case.atol = 2e-3, 2e-3
        case.oracle = "ort"
    return case


def simplified_norm(domain: str) -> Any:
    def gen(d: Draw) -> Case:
        x, axis, norm_shape = _norm_inputs(d, F32, axis_last=d.chance(0.6))
        scale = d.values(F32, norm_shape)
        attrs: dict[str, Any] = {"axis": axis}
        if d.chance(0.5):
            attrs["epsilon"] = d.pick([1e-5, 0.1])
        case = Case("SimplifiedLayerNormalization", [("x", x), ("scale", scale)], attrs, n_out=d.int(1, 2),
                    domain=domain, oracle="ort", opset=21)
        case.rtol, case.atol = 1e-4, 1e-5
        if domain:  # onnxruntime registers it in the ONNX domain only: the same node there
            case.oracle = _in_onnx_domain(case)
        return case
    return gen


def _in_onnx_domain(case: Case) -> Any:
    def oracle(full: dict[str, np.ndarray]) -> list[np.ndarray]:
        from tests.fuzz.runner import run_ort

        twin = dataclasses.replace(case, domain="", oracle="ort")
        return run_ort(twin, twin.model())
    return oracle


def skip_norm(op: str) -> Any:
    def gen(d: Draw) -> Case:
        hid = d.int(1, 9)
        lead = d.shape(d.int(1, 2))
        x = d.values(F32, lead + (hid,), lo=-3, hi=3, special=0.0)
        shapes = [x.shape, x.shape[-2:]] + ([(1,) + x.shape[1:]] if x.ndim == 3 else [])
        skip = d.values(F32, d.pick(shapes) if d.chance(0.95) else (hid,), lo=-3, hi=3, special=0.0)
        gamma = d.values(F32, (hid,))
        ins: list[tuple[str, np.ndarray | None]] = [("x", x), ("skip", skip), ("gamma", gamma)]
        if op == "SkipLayerNormalization":
            ins.append(("beta", d.values(F32, (hid,)) if d.chance(0.5) else None))
        # the bias enters the row statistics (mean, inverse deviation) as x and skip do, so it is
        # finite like them: with a +inf element onnxruntime gives the mean NaN where it is +inf
        ins.append(("bias", d.values(F32, (hid,), special=0.0) if d.chance(0.5) else None))
        while ins[-1][1] is None:
            ins.pop()
        attrs = {"epsilon": d.pick([1e-5, 1e-12, 0.1])} if d.chance(0.6) else {}
        n_out = d.int(1, 4)
        used = tuple(i for i in range(n_out) if i == 0 or d.chance(0.7))
        case = Case(op, ins, attrs, n_out=n_out, domain=MS, oracle="ort", opset=21, outputs_used=used)
        case.rtol, case.atol = 1e-4, 1e-5
        return case
    return gen


GENERATORS: dict[tuple[str, str], Any] = {
    ("", "MatMul"): matmul, ("", "Gemm"): gemm,
    ("", "RMSNormalization"): rms_norm, ("", "LayerNormalization"): layer_norm,
    ("", "SimplifiedLayerNormalization"): simplified_norm(""),
    (MS, "SimplifiedLayerNormalization"): simplified_norm(MS),
    (MS, "SkipSimplifiedLayerNormalization"): skip_norm("SkipSimplifiedLayerNormalization"),
    (MS, "SkipLayerNormalization"): skip_norm("SkipLayerNormalization"),
}
for _op in ("Softmax", "LogSoftmax", "Hardmax"):
    GENERATORS[("", _op)] = softmax(_op)
for _op in REDUCE:
    GENERATORS[("", _op)] = reduce(_op)
for _op in ("ArgMax", "ArgMin"):
    GENERATORS[("", _op)] = argmax(_op)
del _op
