"""Element-wise operators: unary maps, broadcasting binary/variadic operators, Where,
Clip, Cast, CastLike, Identity, Dropout.

Known contents are propagated for the integer arithmetic that shape computations
use (``Add Sub Mul Div Mod Neg Abs Max Min``, comparisons, logic, ``Where``,
``Cast``, ``Identity``). Integer ``Div`` truncates toward zero on numbers; on
symbolic operands it is floor division, exact for the non-negative sizes shape
arithmetic manipulates.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from types import NoneType
from typing import Any

from onnx import TensorProto
from onnxforge.graphbuilder.shapes.infer._base import (
    INT_TYPES,
    NodeInference,
    broadcast_shapes,
    map_elements,
    register,
)
from onnxforge.graphbuilder.shapes.symbolic import SymExpr, dims_equal, sym_max, sym_min
from onnxforge.proto_ext.types import TensorType

__all__: list[str] = []

BOOL = TensorProto.BOOL

_UNARY_SAME = (
    "Abs", "Acos", "Acosh", "Asin", "Asinh", "Atan", "Atanh", "BitwiseNot", "Ceil", "Celu", "Cos",
    "Cosh", "Elu", "Erf", "Exp", "Floor", "Gelu", "HardSigmoid", "HardSwish", "Hardmax", "LeakyRelu",
    "Log", "LogSoftmax", "Mish", "Neg", "Reciprocal", "Relu", "Round", "Selu", "Shrink", "Sigmoid",
    "Sign", "Sin", "Sinh", "Softmax", "Softplus", "Softsign", "Sqrt", "Swish", "Tan", "Tanh",
    "ThresholdedRelu", "Identity", "Clip", "Trilu", "CumSum", "LRN",
)


def _is_sym(x: Any) -> bool:
    return isinstance(x, SymExpr)


def _neg(a: Any) -> Any:
    return -a


def _abs(a: Any) -> Any:
    if _is_sym(a):
        raise TypeError("sign of a symbol is unknown")
    return abs(a)


_UNARY_VALUES: dict[str, Callable[[Any], Any]] = {"Neg": _neg, "Abs": _abs, "Identity": lambda a: a}


@register(*_UNARY_SAME)
def _unary(op: NodeInference) -> None:
    if op.node.op_type == "Identity" and not isinstance(op.type(0), (TensorType, NoneType)):
        op.set_type(0, op.type(0))  # sequences, optionals, maps pass through
        return
    op.same_as_input()
    fn = _UNARY_VALUES.get(op.node.op_type)
    if fn is not None and (op.node.op_type == "Identity" or op.elem(0) in INT_TYPES):
        op.set_value(0, map_elements(fn, op.elem(0), op.value(0)))


@register("IsNaN", "IsInf", "Not")
def _unary_bool(op: NodeInference) -> None:
    op.same_as_input(elem=BOOL)
    if op.node.op_type == "Not":
        op.set_value(0, map_elements(lambda a: not a, BOOL, op.value(0)))


def _int_div(a: Any, b: Any) -> Any:
    if _is_sym(a) or _is_sym(b):
        return a // b
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _true_div(a: Any, b: Any) -> Any:
    return a / b


def _mod(a: Any, b: Any) -> Any:
    return a % b


def _fmod(a: Any, b: Any) -> Any:
    if _is_sym(a) or _is_sym(b):
        raise TypeError("fmod of symbols")
    r = math.fmod(a, b)
    return int(r) if isinstance(a, int) and isinstance(b, int) else r


def _pow(a: Any, b: Any) -> Any:
    if _is_sym(b) or (isinstance(b, int) and b < 0 and not isinstance(a, float)):
        raise TypeError("symbolic or negative integer exponent")
    return a ** b


def _compare(kind: str) -> Callable[[Any, Any], bool]:
    def cmp(a: Any, b: Any) -> bool:
        if _is_sym(a) or _is_sym(b):
            if kind == "Equal":
                eq = dims_equal(a, b)
                if eq is None:
                    raise TypeError("undecidable")
                return eq
            diff = (a - b)
            d = diff.constant_value if _is_sym(diff) else diff
            if d is None:
                raise TypeError("undecidable")
            a, b = d, 0
        if kind == "Equal":
            return a == b
        if kind == "Less":
            return a < b
        if kind == "LessOrEqual":
            return a <= b
        if kind == "Greater":
            return a > b
        return a >= b
    return cmp


_ARITH: dict[str, Callable[[Any, Any], Any]] = {
    "Add": lambda a, b: a + b,
    "Sub": lambda a, b: a - b,
    "Mul": lambda a, b: a * b,
    "Pow": _pow,
}


@register("Add", "Sub", "Mul", "Div", "Mod", "Pow", "BitShift", "BitwiseAnd", "BitwiseOr",
          "BitwiseXor", "PRelu")
def _binary(op: NodeInference) -> None:
    elem = op.elem(0) or (op.elem(1) if op.node.op_type not in ("Pow", "PRelu") else 0)
    op.set(0, elem, broadcast_shapes(op, op.shape(0), op.shape(1)))
    kind = op.node.op_type
    fn = _ARITH.get(kind)
    if kind == "Div":
        fn = _int_div if elem in INT_TYPES else _true_div
    elif kind == "Mod":
        fn = _fmod if op.int_attr("fmod", 0) else _mod
    if fn is not None and elem:
        op.set_value(0, map_elements(fn, elem, op.value(0), op.value(1)))


@register("Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual")
def _comparison(op: NodeInference) -> None:
    op.set(0, BOOL, broadcast_shapes(op, op.shape(0), op.shape(1)))
    op.set_value(0, map_elements(_compare(op.node.op_type), BOOL, op.value(0), op.value(1)))


_LOGIC: dict[str, Callable[[Any, Any], bool]] = {
    "And": lambda a, b: bool(a) and bool(b),
    "Or": lambda a, b: bool(a) or bool(b),
    "Xor": lambda a, b: bool(a) != bool(b),
}


@register("And", "Or", "Xor")
def _logic(op: NodeInference) -> None:
    op.set(0, BOOL, broadcast_shapes(op, op.shape(0), op.shape(1)))
    op.set_value(0, map_elements(_LOGIC[op.node.op_type], BOOL, op.value(0), op.value(1)))


def _max(*xs: Any) -> Any:
    if any(_is_sym(x) for x in xs):
        return sym_max(*xs)
    return max(xs)


def _min(*xs: Any) -> Any:
    if any(_is_sym(x) for x in xs):
        return sym_min(*xs)
    return min(xs)


@register("Max", "Min", "Sum", "Mean")
def _variadic(op: NodeInference) -> None:
    idx = [i for i in range(op.n_inputs) if op.has(i)]
    elem = next((op.elem(i) for i in idx if op.elem(i)), 0)
    op.set(0, elem, broadcast_shapes(op, *(op.shape(i) for i in idx)))
    fn = {"Max": _max, "Min": _min, "Sum": lambda *xs: sum(xs[1:], xs[0])}.get(op.node.op_type)
    if fn is not None and elem:
        op.set_value(0, map_elements(fn, elem, *(op.value(i) for i in idx)))


def _where(c: Any, a: Any, b: Any) -> Any:
    return a if c else b


@register("Where")
def _where_rule(op: NodeInference) -> None:
    elem = op.elem(1) or op.elem(2)
    op.set(0, elem, broadcast_shapes(op, op.shape(0), op.shape(1), op.shape(2)))
    if elem:
        op.set_value(0, map_elements(_where, elem, op.value(0), op.value(1), op.value(2)))


_FLOATS = frozenset({TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BFLOAT16})


def _caster(to: int) -> Callable[[Any], Any]:
    def cast(a: Any) -> Any:
        if to == BOOL:
            if _is_sym(a):
                raise TypeError("truth of a symbol")
            return bool(a)
        if to in _FLOATS:
            if _is_sym(a):
                raise TypeError("symbol as float")
            return float(a)
        if to in INT_TYPES:
            if isinstance(a, float):
                if not math.isfinite(a):
                    raise ValueError("non-finite")
                return int(a)
            return int(a) if isinstance(a, bool) else a
        raise TypeError("untracked target type")
    return cast


def _cast_to(op: NodeInference, to: int) -> None:
    op.same_as_input(elem=to)
    if to:
        op.set_value(0, map_elements(_caster(to), to, op.value(0)))


@register("Cast")
def _cast(op: NodeInference) -> None:
    _cast_to(op, op.int_attr("to", 0) or 0)


@register("CastLike")
def _cast_like(op: NodeInference) -> None:
    _cast_to(op, op.elem(1))


@register("Dropout")
def _dropout(op: NodeInference) -> None:
    op.same_as_input()
    if op.has_output(1):  # the mask is boolean from opset 10, of the input's type before
        op.same_as_input(1, 0, elem=BOOL if op.version >= 10 else None)
