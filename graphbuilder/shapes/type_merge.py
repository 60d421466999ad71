"""Merging two descriptions of one value's type: the rule by which shape inference learns.

Knowledge only grows. :func:`merge_types` refines what is unknown on one side by
the other (a ``None`` type, element type 0, an unknown rank or dimension), keeps
what both say, and raises :class:`TypeConflict` for what provably differs
(``4`` vs ``5``, ``n`` vs ``n + 1``, ``FLOAT`` vs ``INT64``, rank 3 vs rank 4).
Dimension pairs whose relation cannot be decided (``total`` vs ``past + seq``)
keep the existing one (a number wins over a symbol) and are reported to the
caller, which records them (:attr:`~onnxforge.graphbuilder.shapes.context.ShapesContext.equalities`)::

    merge_types(FLOAT[batch, None], FLOAT[None, 8])     # FLOAT[batch, 8]
    merge_types(FLOAT[4], FLOAT[5])                      # TypeConflict("dimension 0: 4 != 5")

:func:`normalize_type` parses the ``dim_param`` text of declared types into
expressions first, so that both sides compare as expressions.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from onnxforge.graphbuilder.shapes.symbolic import Dim, SymExpr, as_dim, dims_equal
from onnxforge.graphbuilder.shapes.symtensor import ShapeError
from onnxforge.proto_ext.types import (
    MapType,
    OptionalType,
    SequenceType,
    SparseTensorType,
    StructType,
    TensorType,
    Type,
    type_name,
)

__all__ = ["TypeConflict", "format_type", "merge_types", "normalize_type"]


class TypeConflict(Exception):
    """Raised by :func:`merge_types`; ``reason`` says which part of the types disagrees."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def _norm_shape(shape: Sequence[Any] | None) -> tuple[Dim, ...] | None:
    if shape is None:
        return None
    try:
        return tuple(as_dim(d) for d in shape)
    except TypeError as exc:  # e.g. a dim_param that is not UTF-8 text (read as bytes)
        raise ShapeError(f"shape {list(shape)!r}: {exc}") from None


def _normalized(shape: tuple[Any, ...]) -> bool:
    """Whether every dim is as :func:`as_dim` leaves it: an int, None or a non-constant
    expression (the dims the rules make)."""
    for d in shape:
        if not (d is None or type(d) is int or (type(d) is SymExpr and not d.is_constant)):
            return False
    return True


def normalize_type(t: Type) -> Type:
    """The same type with every dimension normalised (``dim_param`` text parsed)."""
    if isinstance(t, TensorType):
        if t.shape is None or _normalized(t.shape):
            return t
        shape = _norm_shape(t.shape)
        return t if shape == t.shape and all(not isinstance(d, str) for d in t.shape) else \
            TensorType(t.elem_type, shape, t.denotation, t.dim_denotations)
    if isinstance(t, SparseTensorType):
        return SparseTensorType(t.elem_type, _norm_shape(t.shape), t.denotation, t.dim_denotations)
    if isinstance(t, SequenceType):
        return SequenceType(normalize_type(t.elem), t.denotation)
    if isinstance(t, OptionalType):
        return OptionalType(normalize_type(t.elem), t.denotation)
    if isinstance(t, MapType):
        return MapType(t.key_type, normalize_type(t.value), t.denotation)
    return t


def format_type(t: Type) -> str:
    """Readable form of a type (``FLOAT[batch, past + seq, 32]``); ``unknown`` for None."""
    return "unknown" if t is None else str(t)


def _merge_dim(a: Dim, b: Dim, where: str, unknown: list[tuple[Dim, Dim]] | None) -> Dim:
    if a is None:
        return b
    if b is None:
        return a
    eq = dims_equal(a, b)
    if eq is True:
        return a if isinstance(a, int) else b
    if eq is False:
        raise TypeConflict(f"{where}: {a} != {b}")
    if isinstance(b, int):  # a symbol meets a number: the number is more precise
        if unknown is not None:
            unknown.append((a, b))
        return b
    if unknown is not None and not isinstance(a, int):
        unknown.append((a, b))
    return a


def merge_types(old: Type, new: Type, unknown: list[tuple[Dim, Dim]] | None = None) -> Type:
    """Merge two descriptions of one value; raises :class:`TypeConflict` on a contradiction.

    ``None`` (unknown type), element type 0, unknown rank and unknown dimensions
    are refined by the other side. Dimension pairs whose relation is undecidable
    keep ``old`` (a number wins over a symbol) and are appended to ``unknown``.
    """
    if old is None:
        return new
    if new is None or old == new:
        return old
    old, new = normalize_type(old), normalize_type(new)
    if isinstance(old, (TensorType, SparseTensorType)) and type(old) is type(new):
        if old.elem_type and new.elem_type and old.elem_type != new.elem_type:
            raise TypeConflict(f"element type {type_name(old.elem_type)} != {type_name(new.elem_type)}")
        elem = old.elem_type or new.elem_type
        if old.shape is None or new.shape is None:
            shape = old.shape if new.shape is None else new.shape
        elif len(old.shape) != len(new.shape):
            raise TypeConflict(f"rank {len(old.shape)} != {len(new.shape)}")
        else:
            shape = tuple(_merge_dim(a, b, f"dimension {i}", unknown)
                          for i, (a, b) in enumerate(zip(old.shape, new.shape)))
        return type(old)(elem, shape, old.denotation or new.denotation,
                         old.dim_denotations or new.dim_denotations)
    if isinstance(old, SequenceType) and isinstance(new, SequenceType):
        return SequenceType(merge_types(old.elem, new.elem, unknown), old.denotation)
    if isinstance(old, OptionalType) and isinstance(new, OptionalType):
        return OptionalType(merge_types(old.elem, new.elem, unknown), old.denotation)
    if isinstance(old, MapType) and isinstance(new, MapType):
        if old.key_type != new.key_type:
            raise TypeConflict(f"map key type {old.key_type} != {new.key_type}")
        return MapType(old.key_type, merge_types(old.value, new.value, unknown), old.denotation)
    if isinstance(old, StructType) and isinstance(new, StructType):
        if old.is_category:
            return new
        if new.is_category:
            return old
        if old.is_reference and new.is_reference and old.type_ref != new.type_ref:
            raise TypeConflict(f"struct type_ref {old.type_ref} != {new.type_ref}")
        return old
    raise TypeConflict(f"{type(old).__name__} vs {type(new).__name__}")
