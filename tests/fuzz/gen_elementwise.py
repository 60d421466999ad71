"""Generators for elementwise operators: unary math, binary arithmetic with broadcasting,
comparisons and logic, the variadic ones, Clip, Where, Cast and CastLike.

The tables say which element types each operator takes and which value range keeps it
inside its specification (integer overflow is undefined in ONNX, so integer operands
stay small)."""
from __future__ import annotations

from typing import Any

import numpy as np

from tests.fuzz.case import BF16, F16, F32, F64, FLOATS, INTS, NUMERIC, SIGNED, Case, Draw

__all__ = ["GENERATORS"]

BOOL = np.dtype(np.bool_)

# op -> (element types, keyword arguments for Draw.values)
UNARY: dict[str, tuple[tuple[np.dtype, ...], dict[str, Any]]] = {
    "Abs": (FLOATS + SIGNED, {}), "Neg": (FLOATS + SIGNED, {}), "Sign": (FLOATS + SIGNED, {}),
    "Sqrt": (FLOATS, {}), "Exp": (FLOATS, {}), "Log": (FLOATS, {}), "Reciprocal": (FLOATS, {}),
    "Sin": (FLOATS, {}), "Cos": (FLOATS, {}), "Tan": (FLOATS, {}), "Tanh": (FLOATS, {}),
    "Floor": (FLOATS, {}), "Ceil": (FLOATS, {}), "Round": (FLOATS, {}),
    "Asin": (FLOATS, {"lo": -1.2, "hi": 1.2}), "Acos": (FLOATS, {"lo": -1.2, "hi": 1.2}),
    "Atan": (FLOATS, {}), "Sinh": (FLOATS, {}), "Cosh": (FLOATS, {}), "Asinh": (FLOATS, {}),
    "Acosh": (FLOATS, {"lo": 0.5, "hi": 5}), "Atanh": (FLOATS, {"lo": -1.2, "hi": 1.2}),
    "Erf": (FLOATS, {}), "Relu": (FLOATS + SIGNED, {}), "Sigmoid": (FLOATS, {"lo": -30, "hi": 30}),
    "Softplus": (FLOATS, {"lo": -30, "hi": 30}), "IsNaN": (FLOATS, {}), "Not": ((BOOL,), {}),
    "BitwiseNot": (INTS, {}),
}
UNARY_ATTRS: dict[str, Any] = {
    "LeakyRelu": (FLOATS, lambda d: {"alpha": d.pick([0.01, 0.2, -1.5])} if d.chance(0.7) else {}),
    "IsInf": (FLOATS, lambda d: {"detect_negative": d.int(0, 1), "detect_positive": d.int(0, 1)}),
    "Gelu": (FLOATS, lambda d: {"approximate": d.pick(["none", "tanh"])} if d.chance(0.7) else {}),
    "Elu": (FLOATS, lambda d: {"alpha": d.pick([0.5, 1.0, 2.0])} if d.chance(0.7) else {}),
    "Selu": (FLOATS, lambda d: {"alpha": d.pick([1.5, 1.67326]), "gamma": d.pick([1.0, 1.0507])}
             if d.chance(0.7) else {}),
    "Celu": ((np.dtype(np.float32),), lambda d: {"alpha": d.pick([0.5, 1.0, 2.0])} if d.chance(0.7) else {}),
    "ThresholdedRelu": (FLOATS, lambda d: {"alpha": d.pick([0.0, 1.0, -0.5])} if d.chance(0.7) else {}),
    # float32 only (float64: the float32 default alpha 0.2 against 0.2 exact shows through the
    # cancellation in alpha * x + beta near x = -2.5; onnx.reference refuses float64 Softsign scalars)
    "HardSigmoid": ((np.dtype(np.float32),), lambda d: {"alpha": d.pick([0.2, 0.5]), "beta": d.pick([0.5, 0.1])}
                    if d.chance(0.7) else {}),
    # float32 only: onnx.reference's float64 HardSwish takes alpha = 1/6 rounded to float32, and near
    # x = -3 the cancellation in alpha * x + 1/2 makes that a 1e-6 relative difference from 1/6 exact
    "HardSwish": ((np.dtype(np.float32),), lambda d: {}),
    "Mish": (FLOATS, lambda d: {}),
    "Softsign": ((np.dtype(np.float32),), lambda d: {}),
    "Shrink": (FLOATS, lambda d: {"bias": d.pick([0.0, 0.5]), "lambd": d.pick([0.5, 1.0])}
               if d.chance(0.7) else {}),
}

# op -> (element types, value keyword arguments for the second operand)
BINARY: dict[str, tuple[tuple[np.dtype, ...], dict[str, Any]]] = {
    "Add": (NUMERIC, {}), "Sub": (NUMERIC, {}), "Mul": (NUMERIC, {}),
    "Div": (FLOATS + SIGNED, {"positive": True}),
    "Mod": (FLOATS + SIGNED, {"positive": True}),
    "Pow": (FLOATS + (np.dtype(np.int64), np.dtype(np.int32)), {"lo": -3, "hi": 3}),
    "Equal": (NUMERIC + (BOOL,), {}), "Less": (NUMERIC, {}), "LessOrEqual": (NUMERIC, {}),
    "Greater": (NUMERIC, {}), "GreaterOrEqual": (NUMERIC, {}),
    "And": ((BOOL,), {}), "Or": ((BOOL,), {}), "Xor": ((BOOL,), {}),
    "BitwiseAnd": (INTS, {}), "BitwiseOr": (INTS, {}), "BitwiseXor": (INTS, {}),
}


def unary(op: str) -> Any:
    def gen(d: Draw) -> Case:
        if op in UNARY:
            types, kw = UNARY[op]
            attrs = {}
        else:
            types, make = UNARY_ATTRS[op]
            kw, attrs = {}, make(d)
        dt = d.pick(types)
        x = d.values(dt, d.shape(), **kw)
        case = Case(op, [("x", x)], attrs)
        if op == "Gelu" and dt == F64:
            case.oracle = gelu64(attrs.get("approximate", "none"))  # onnx.reference's float64 Gelu is good to 1e-6 only; no onnxruntime kernel
        return case
    return gen


def gelu64(approximate: str) -> Any:
    """A float64 Gelu oracle (math.erf or math.tanh, element by element)."""
    import math

    c = math.sqrt(2 / math.pi)

    def exact(v: float) -> float:
        return 0.5 * v * (1 + math.erf(v / math.sqrt(2)))

    def tanh(v: float) -> float:
        with np.errstate(all="ignore"):
            return 0.5 * v * (1 + math.tanh(c * (v + 0.044715 * v ** 3))) if math.isfinite(v) else \
                (v if v > 0 else 0.0 if v < 0 else v)

    fn = tanh if approximate == "tanh" else exact

    def oracle(full: dict[str, np.ndarray]) -> list[np.ndarray]:
        x = full["x"]
        return [np.vectorize(fn, otypes=[np.float64])(x) if x.size else x.copy()]
    return oracle


def binary(op: str) -> Any:
    def gen(d: Draw) -> Case:
        types, kw = BINARY[op]
        dt = d.pick(types)
        sa, sb = d.broadcast_pair()
        a = d.values(dt, sa, lo=-9 if op == "Pow" and dt.kind in "iu" else -4)
        if op == "Pow" and dt.kind in "iu":
            a = np.asarray(np.clip(a, -9, 9)).astype(dt)
        b = d.values(d.pick((dt, F32)) if op == "Pow" else dt, sb, **kw)
        attrs: dict[str, Any] = {}
        case = Case(op, [("a", a), ("b", b)], attrs)
        if op == "Mod":
            attrs["fmod"] = 1 if dt.kind == "f" else d.int(0, 1)
        if op in ("Div", "Mod") and dt.kind in "iu" and not (b != 0).all():
            case.out_of_spec = "integer-division-by-zero"
        if op == "Pow" and dt.kind in "iu" and b.dtype.kind in "iu":
            ab = np.broadcast_arrays(a, b) if _broadcasts(a.shape, b.shape) else (a, b)
            if ab[0].shape == ab[1].shape and ((ab[0] == 0) & (ab[1] < 0)).any():
                case.out_of_spec = "integer-pow-zero-negative"
            if ab[0].shape == ab[1].shape and (ab[1] < 0).any():
                case.oracle = "ort"  # onnx.reference refuses negative integer exponents (numpy)
        return case
    return gen


def _broadcasts(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    try:
        np.broadcast_shapes(a, b)
        return True
    except ValueError:
        return False


def variadic(op: str) -> Any:
    def gen(d: Draw) -> Case:
        dt = d.pick(FLOATS + (SIGNED if op != "Mean" else ()))
        n = d.int(1, 4)
        base = d.shape()
        shapes = [base] + [d.broadcast_pair()[0] if d.chance(0.2) else base[d.int(0, len(base)):]
                           for _ in range(n - 1)]
        case = Case(op, [(f"x{i}", d.values(dt, s)) for i, s in enumerate(shapes)])
        if len({s for s in shapes}) > 1 and _broadcasts_all(shapes):
            case.oracle = variadic_numpy(op)  # onnx.reference accumulates into the first input (known.py)
        return case
    return gen


def _broadcasts_all(shapes: list[tuple[int, ...]]) -> bool:
    try:
        np.broadcast_shapes(*shapes)
        return True
    except ValueError:
        return False


def variadic_numpy(op: str) -> Any:
    def oracle(full: dict[str, np.ndarray]) -> list[np.ndarray]:
        xs = list(full.values())
        fn = {"Max": np.maximum, "Min": np.minimum}.get(op, np.add)
        out = xs[0]
        for x in xs[1:]:
            out = fn(out, x)
        if op == "Mean":
            out = (out / len(xs)).astype(xs[0].dtype)
        return [np.asarray(out)]
    return oracle


def clip(d: Draw) -> Case:
    dt = d.pick(FLOATS + SIGNED)
    x = d.values(dt, d.shape())
    lo = d.values(dt, ()) if d.chance(0.7) else None
    hi = d.values(dt, ()) if d.chance(0.7) else None
    if d.chance(0.2):
        opset = 6
        attrs = {k: float(v) for k, v in (("min", lo), ("max", hi)) if v is not None}
        if dt != F32:
            x = x.astype(F32)
        return Case("Clip", [("x", x)], attrs, opset=opset)
    return Case("Clip", [("x", x), ("min", lo), ("max", hi)])


def where(d: Draw) -> Case:
    dt = d.pick(NUMERIC + (BOOL,))
    sa, sb = d.broadcast_pair()
    sc = d.pick([sa, sb, sa[1:] if sa else sa])
    return Case("Where", [("c", d.values(BOOL, sc)), ("a", d.values(dt, sa)), ("b", d.values(dt, sb))])


CAST_TYPES = (F32, F16, F64, BF16, BOOL) + INTS


def cast(d: Draw) -> Case:
    src, dst = d.pick(CAST_TYPES), d.pick(CAST_TYPES)
    # float -> int of a value outside the target's range is undefined (C++ cast): keep inside
    x = d.values(src, d.shape(), lo=0 if dst.kind == "u" else -100, hi=100,
                 special=0.0 if dst.kind in "iub" else 0.05)
    from tests.fuzz.case import onnx_type

    to = onnx_type(np.zeros(0, dst))
    case = Case("Cast", [("x", x)], {"to": to})
    if src == BF16 or dst == BF16:
        case.oracle = "ort"  # onnx.reference casts bfloat16 through its own table
    return case


def cast_like(d: Draw) -> Case:
    src, dst = d.pick((F32, F16, F64) + SIGNED), d.pick((F32, F16, F64) + SIGNED)
    x = d.values(src, d.shape(), lo=-100, hi=100, special=0.0 if dst.kind in "iu" else 0.05)
    return Case("CastLike", [("x", x), ("like", np.zeros(d.shape(1), dst))])


GENERATORS: dict[tuple[str, str], Any] = {}
for _op in list(UNARY) + list(UNARY_ATTRS):
    GENERATORS[("", _op)] = unary(_op)
for _op in BINARY:
    GENERATORS[("", _op)] = binary(_op)
for _op in ("Max", "Min", "Sum", "Mean"):
    GENERATORS[("", _op)] = variadic(_op)
GENERATORS[("", "Clip")] = clip
GENERATORS[("", "Where")] = where
GENERATORS[("", "Cast")] = cast
GENERATORS[("", "CastLike")] = cast_like
del _op
_ = (F16, F64)
