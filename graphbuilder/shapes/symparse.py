"""Reader of ONNX ``dim_param`` strings (see :mod:`onnxforge.graphbuilder.shapes.symbolic`).

:func:`parse_dim` reads a plain name as one symbol and arithmetic as a folded
expression; text it does not understand is kept whole as one symbol. The
grammar is Python's operator precedence over integers, names (bare
identifiers or between backticks) and the functions exporters write
(``floor(s0/2)``, ``ceiling(s0/2)``, ``Mod(s0, 4)``, ``Max(1, s0)``...). True
division is allowed where the result is an integer or feeds ``floor`` /
``ceiling``.

The public names live in :mod:`onnxforge.graphbuilder.shapes.symbolic`.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from functools import lru_cache
from typing import TypeAlias

from onnxforge.graphbuilder.shapes.symexpr import (
    SymbolicError,
    SymbolicZeroDivisionError,
    SymExpr,
    _atom_expr,
    _const,
    _floordiv,
    _minmax,
    _mod,
    ceildiv,
)
from onnxforge.graphbuilder.shapes.symterms import IDENT, MAX, MIN, PLAIN_RE, degree

__all__ = ["parse_dim"]

_TOKEN_RE = re.compile(
    r"\s*(?:(?P<num>\d+)|`(?P<quoted>(?:[^`]|``)*)`|(?P<ident>" + IDENT + r")|(?P<op>\*\*|//|[-+*/%(),]))"
)
_MAX_DEPTH = 100
_MAX_POWER_DEGREE = 64
_MAX_POWER_BITS = 4096


class _ParseFailure(Exception):
    """Internal: the text is not arithmetic this parser understands."""


def _check_power(base: SymExpr, k: int) -> None:
    """Refuse powers whose expansion would be unreasonably large."""
    if k <= 1:
        return
    deg = max((degree(m) for m in base._terms), default=0)
    bits = max((abs(c).bit_length() for c in base._terms.values()), default=0)
    if deg * k > _MAX_POWER_DEGREE or bits * k > _MAX_POWER_BITS:
        raise _ParseFailure("power too large")


class _Ratio:
    """``num / den`` met while parsing true division (``floor(n/2)``)."""

    __slots__ = ("den", "num")

    def __init__(self, num: SymExpr, den: SymExpr):
        if not den._terms:
            raise _ParseFailure("division by zero")
        self.num = num
        self.den = den


_Value: TypeAlias = "SymExpr | _Ratio"


def _ratio(v: _Value) -> _Ratio:
    return v if isinstance(v, _Ratio) else _Ratio(v, _const(1))


def _add(v: _Value, w: _Value, op: str) -> _Value:
    """``v + w`` or ``v - w`` (``op``)."""
    if isinstance(v, SymExpr) and isinstance(w, SymExpr):
        return v + w if op == "+" else v - w
    rv, rw = _ratio(v), _ratio(w)
    num = rv.num * rw.den + rw.num * rv.den if op == "+" else rv.num * rw.den - rw.num * rv.den
    return _Ratio(num, rv.den * rw.den)


def _mul(v: _Value, w: _Value) -> _Value:
    if isinstance(v, SymExpr) and isinstance(w, SymExpr):
        return v * w
    rv, rw = _ratio(v), _ratio(w)
    return _Ratio(rv.num * rw.num, rv.den * rw.den)


def _truediv(v: _Value, w: _Value) -> _Ratio:
    rv, rw = _ratio(v), _ratio(w)
    return _Ratio(rv.num * rw.den, rv.den * rw.num)


def _exact(v: _Value) -> SymExpr:
    if isinstance(v, SymExpr):
        return v
    if v.den == 1:
        return v.num
    q = _floordiv(v.num, v.den)
    if q * v.den != v.num:
        raise _ParseFailure("inexact true division")
    return q


def _fn_floor(args: list[_Value]) -> SymExpr:
    (x,) = args
    return _floordiv(x.num, x.den) if isinstance(x, _Ratio) else x


def _fn_ceil(args: list[_Value]) -> SymExpr:
    (x,) = args
    return ceildiv(x.num, x.den) if isinstance(x, _Ratio) else x


def _fn_floordiv(args: list[_Value]) -> SymExpr:
    a, b = args
    return _floordiv(_exact(a), _exact(b))


def _fn_ceildiv(args: list[_Value]) -> SymExpr:
    a, b = args
    return ceildiv(_exact(a), _exact(b))


def _fn_truediv(args: list[_Value]) -> _Value:
    a, b = args
    return _truediv(a, b)


def _fn_mod(args: list[_Value]) -> SymExpr:
    a, b = args
    return _mod(_exact(a), _exact(b))


def _fn_max(args: list[_Value]) -> SymExpr:
    return _minmax(MAX, [_exact(a) for a in args])


def _fn_min(args: list[_Value]) -> SymExpr:
    return _minmax(MIN, [_exact(a) for a in args])


# Function names as written by exporters (sympy/torch spellings), lower-cased.
_FUNCTIONS: dict[str, Callable[[list[_Value]], _Value]] = {
    "floor": _fn_floor,
    "floortoint": _fn_floor,
    "ceil": _fn_ceil,
    "ceiling": _fn_ceil,
    "ceiltoint": _fn_ceil,
    "floordiv": _fn_floordiv,
    "truediv": _fn_truediv,
    "inttruediv": _fn_truediv,
    "ceildiv": _fn_ceildiv,
    "mod": _fn_mod,
    "pythonmod": _fn_mod,
    "max": _fn_max,
    "sym_max": _fn_max,
    "min": _fn_min,
    "sym_min": _fn_min,
}


class _Parser:
    """Recursive descent over Python operator precedence.

    expr  := term (('+' | '-') term)*
    term  := unary (('*' | '/' | '//' | '%') unary)*
    unary := ('-' | '+') unary | power
    power := atom ('**' unary)?
    atom  := NUMBER | NAME | `QUOTED` | NAME '(' expr (',' expr)* ')' | '(' expr ')'
    """

    def __init__(self, text: str):
        self.tokens: list[tuple[str, str]] = []
        pos, n = 0, len(text)
        while pos < n:
            mt = _TOKEN_RE.match(text, pos)
            if mt is None:
                if text[pos:].strip():
                    raise _ParseFailure(f"unexpected character at {pos}")
                break
            kind = mt.lastgroup or ""
            value = mt.group(kind)
            if kind == "quoted":
                value = value.replace("``", "`")
            self.tokens.append((kind, value))
            pos = mt.end()
        self.i = 0
        self.depth = 0

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take_op(self, *ops: str) -> str | None:
        tok = self.peek()
        if tok is not None and tok[0] == "op" and tok[1] in ops:
            self.i += 1
            return tok[1]
        return None

    def parse(self) -> SymExpr:
        if not self.tokens:
            raise _ParseFailure("empty")
        v = self.expr()
        if self.i != len(self.tokens):
            raise _ParseFailure("trailing tokens")
        return _exact(v)

    def expr(self) -> _Value:
        self.depth += 1
        if self.depth > _MAX_DEPTH:
            raise _ParseFailure("nesting too deep")
        v = self.term()
        while (op := self.take_op("+", "-")) is not None:
            v = _add(v, self.term(), op)
        self.depth -= 1
        return v

    def term(self) -> _Value:
        v = self.unary()
        while (op := self.take_op("*", "/", "//", "%")) is not None:
            w = self.unary()
            if op == "*":
                v = _mul(v, w)
            elif op == "/":
                v = _truediv(v, w)
            elif op == "//":
                v = _floordiv(_exact(v), _exact(w))
            else:
                v = _mod(_exact(v), _exact(w))
        return v

    def unary(self) -> _Value:
        self.depth += 1
        if self.depth > _MAX_DEPTH:
            raise _ParseFailure("nesting too deep")
        op = self.take_op("-", "+")
        if op is None:
            v = self.power()
        else:
            v = self.unary()
            if op == "-":
                v = -v if isinstance(v, SymExpr) else _Ratio(-v.num, v.den)
        self.depth -= 1
        return v

    def power(self) -> _Value:
        base = self.atom()
        if self.take_op("**") is None:
            return base
        k = _exact(self.unary()).constant_value
        if k is None or k < 0:
            raise _ParseFailure("exponent must be a non-negative integer")
        if isinstance(base, _Ratio):
            _check_power(base.num, k)
            _check_power(base.den, k)
            return _Ratio(base.num**k, base.den**k)
        _check_power(base, k)
        return base**k

    def atom(self) -> _Value:
        tok = self.peek()
        if tok is None:
            raise _ParseFailure("unexpected end")
        kind, value = tok
        self.i += 1
        if kind == "num":
            return _const(int(value))
        if kind == "quoted":
            if not value:
                raise _ParseFailure("empty quoted name")
            return _atom_expr(value)
        if kind == "ident":
            if self.take_op("(") is None:
                return _atom_expr(value)
            fn = _FUNCTIONS.get(value.lower())
            if fn is None:
                raise _ParseFailure(f"unknown function {value!r}")
            args = [self.expr()]
            while self.take_op(",") is not None:
                args.append(self.expr())
            if self.take_op(")") is None:
                raise _ParseFailure("missing ')'")
            try:
                return fn(args)
            except ValueError as exc:  # wrong number of arguments
                raise _ParseFailure(str(exc)) from exc
        if kind == "op" and value == "(":
            v = self.expr()
            if self.take_op(")") is None:
                raise _ParseFailure("missing ')'")
            return v
        raise _ParseFailure(f"unexpected {value!r}")


def try_parse(text: str) -> SymExpr | None:
    """Arithmetic in ``text`` as an expression, or ``None`` if it does not parse."""
    try:
        return _Parser(text).parse()
    except (_ParseFailure, SymbolicZeroDivisionError):
        return None


@lru_cache(maxsize=8192)
def parse_dim(text: str) -> SymExpr:
    """Read an ONNX ``dim_param``.

    A plain name (``batch_size``, ``unk__0``, ``encoder/seq``, ``a.b``) is one
    symbol. Arithmetic (``past + seq``, ``2*n``, ``n//2``, ``(a+b)*c``) and the
    functions exporters write (``floor(s0/2)``, ``ceiling(s0/2)``,
    ``Mod(s0, 4)``, ``Max(1, s0)``, ``min``) are parsed. Anything else is kept
    whole as one opaque symbol, never an error. An empty ``dim_param`` carries
    no information and raises :class:`SymbolicError` (see
    :func:`~onnxforge.graphbuilder.shapes.symbolic.dim_from_onnx`).
    """
    if not isinstance(text, str):
        raise TypeError(f"dim_param must be a str, got {type(text).__name__}")
    if not text.strip():
        raise SymbolicError("an empty dim_param names no dimension; use dim_from_onnx() to map it to None")
    if PLAIN_RE.fullmatch(text):
        return _atom_expr(text)
    e = try_parse(text)
    return _atom_expr(text) if e is None else e
