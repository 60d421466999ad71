"""Symbolic dimension algebra: integer polynomials over named symbols.

A :class:`SymExpr` is a polynomial with integer coefficients. Its variables
("atoms") are named symbols (ONNX ``dim_param`` strings) or opaque terms for
the operations a polynomial cannot express: floor division, modulo, maximum
and minimum. An opaque term behaves like a symbol inside a polynomial and
compares structurally, after folding rules have brought it to a canonical
shape (``(n - 1)//2 + 1 -> (n + 1)//2``, ``(n % 8) % 4 -> n % 4``).

The algebra makes no assumption about the sign of a symbol. Divisors are
assumed to be non-zero (``a//a`` folds to 1); a zero constant divisor raises
:class:`SymbolicZeroDivisionError`. Equality is structural on the canonical
form, so ``n + 1 == 1 + n`` while ``(n + 1)//2 == n - n//2`` is not
recognised; :func:`dims_equal` answers ``None`` in such cases.

``str()`` gives a readable form that :func:`parse_dim` reads back into an
equal expression (``n//2``, ``(n + 1)//2``, ``3*(n % 4)``, ``max(m, n)``);
when every symbol name is a Python identifier, Python evaluates it to the
same integer. Symbol names that are not identifiers are written between
backticks inside larger expressions; a lone symbol is written verbatim, so a
``dim_param`` kept whole comes back unchanged.

This module is the public surface. The algebra and its folding rules are in
:mod:`~onnxforge.graphbuilder.shapes.symexpr`, the term representation and text form in
:mod:`~onnxforge.graphbuilder.shapes.symterms` and the ``dim_param`` reader in
:mod:`~onnxforge.graphbuilder.shapes.symparse`; the :data:`Dim` helpers are here.

Example::

    >>> past, seq = parse_dim("past"), parse_dim("seq")
    >>> str(past + seq)
    'past + seq'
    >>> dims_equal(parse_dim("past + seq"), seq + past)
    True
    >>> dim_to_onnx((2 * seq + 1) // 2)
    (None, 'seq')
"""
from __future__ import annotations

import operator
from collections.abc import Callable, Iterable
from typing import Any, TypeAlias

from onnxforge.graphbuilder.shapes.symexpr import (
    SymbolicError,
    SymbolicZeroDivisionError,
    SymExpr,
    UnboundSymbolError,
    _is_index,
    _to_expr,
    ceildiv,
    floordiv,
    mod,
    sym_max,
    sym_min,
    symbol,
)
from onnxforge.graphbuilder.shapes.symparse import parse_dim

__all__ = [
    "Dim",
    "SymExpr",
    "SymbolicError",
    "SymbolicZeroDivisionError",
    "UnboundSymbolError",
    "as_dim",
    "ceildiv",
    "dim_from_onnx",
    "dim_to_onnx",
    "dims_equal",
    "floordiv",
    "mod",
    "parse_dim",
    "product",
    "sum_dims",
    "sym_max",
    "sym_min",
    "symbol",
]

Dim: TypeAlias = int | SymExpr | None
"""A tensor dimension: a known size, a symbolic size, or unknown (``None``)."""


def as_dim(x: int | SymExpr | str | None) -> Dim:
    """Normalise a dimension: constant expressions become ``int``, strings are parsed."""
    if x is None:
        return None
    if type(x) is int:
        return x
    if isinstance(x, SymExpr):
        v = x.constant_value
        return x if v is None else v
    if isinstance(x, str):
        return as_dim(parse_dim(x))
    if _is_index(x):
        return operator.index(x)  # type: ignore[arg-type]
    raise TypeError(f"a dimension is an int, SymExpr, str or None, got {type(x).__name__}")


def dim_from_onnx(dim_value: int | None, dim_param: str | None) -> Dim:
    """The :data:`Dim` of an ONNX ``TensorShapeProto.Dimension``.

    Pass ``None`` (or ``""``) for the member of the oneof that is not set;
    neither set (or a blank ``dim_param``) gives ``None``.
    """
    has_param = bool(dim_param and dim_param.strip())
    if dim_value is not None and has_param:
        raise SymbolicError(
            f"a dimension holds either dim_value or dim_param, got both ({dim_value!r}, {dim_param!r})"
        )
    if has_param:
        return as_dim(parse_dim(dim_param))  # type: ignore[arg-type]
    if dim_value is None:
        return None
    return operator.index(dim_value)


def dim_to_onnx(d: Dim) -> tuple[int | None, str | None]:
    """``(dim_value, dim_param)`` for a dimension; at most one is not ``None``."""
    d = as_dim(d)
    if d is None:
        return (None, None)
    if isinstance(d, int):
        return (d, None)
    return (None, str(d))


def dims_equal(a: Dim, b: Dim) -> bool | None:
    """True if provably equal, False if provably different, None if unknown.

    Two dimensions are provably different when they differ by a non-zero
    constant (``3`` vs ``4``, ``n`` vs ``n + 1``).
    """
    if a is None or b is None:
        return None
    if type(a) is int and type(b) is int:
        return a == b
    diff = _to_expr(a, "dimension") - _to_expr(b, "dimension")  # type: ignore[arg-type]
    v = diff.constant_value
    if v is None:
        return None
    return v == 0


def product(dims: Iterable[Dim]) -> Dim:
    """Product of dimensions: ``int`` when constant, ``None`` if any is unknown."""
    return _fold_dims(dims, operator.mul, 1)


def sum_dims(dims: Iterable[Dim]) -> Dim:
    """Sum of dimensions: ``int`` when constant, ``None`` if any is unknown."""
    return _fold_dims(dims, operator.add, 0)


def _fold_dims(dims: Iterable[Dim], combine: Callable[[Any, Any], Any], unit: int) -> Dim:
    """Combine the numbers among ``dims`` apart, then once with the symbolic ones."""
    acc_int = unit
    acc: SymExpr | None = None
    for d in dims:
        if d is None:
            return None
        if type(d) is int:
            acc_int = combine(acc_int, d)
        else:
            e = _to_expr(d, "dimension")
            acc = e if acc is None else combine(acc, e)
    if acc is None:
        return acc_int
    return as_dim(combine(acc, acc_int))
