"""The rule interface: registry, the per-node view rules work on, shared helpers.

A rule is a function ``rule(op: NodeInference) -> None`` registered for one or
more ``(domain, op_type)`` pairs. It reads input types, shapes and known
constant contents through ``op`` and records outputs with ``op.set(...)`` /
``op.set_value(...)``, which merge into the :class:`ShapesContext` (so a
contradiction with a declared type raises :class:`ShapeError`). A rule that
cannot decide something leaves it unknown; it never guesses.

Broadcasting with symbolic dimensions (:func:`broadcast_dim`):

* equal dimensions (``n`` and ``n``) give that dimension;
* ``1`` and ``d`` give ``d``;
* a number ``k != 1`` and a symbol give ``k`` (the symbol must be 1 or ``k``);
* two different numbers, neither 1, raise :class:`ShapeError`;
* two symbols whose relation is unknown (``a`` vs ``b``) give a *fresh symbol*
  (``_b0``): the result is a fixed but unknown size, distinct from both;
* an unknown dimension with anything but a number other than 1 gives ``None``.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import numpy as np
from onnx import TensorProto
from onnxforge.graphbuilder.ir.core import Node, Value
from onnxforge.graphbuilder.shapes.context import ShapesContext, _node_label
from onnxforge.graphbuilder.shapes.symtensor import ShapeError, SymTensor
from onnxforge.graphbuilder.shapes.symbolic import (
    Dim,
    SymbolicError,
    SymExpr,
    as_dim,
    dims_equal,
)
from onnxforge.proto_ext.types import SparseTensorType, TensorType, Type

__all__ = [
    "INT_TYPES",
    "NodeInference",
    "Rule",
    "broadcast_dim",
    "broadcast_shapes",
    "lookup",
    "map_elements",
    "register",
    "registered",
]

Rule = Callable[["NodeInference"], None]

INT_TYPES = frozenset({
    TensorProto.INT8, TensorProto.INT16, TensorProto.INT32, TensorProto.INT64,
    TensorProto.UINT8, TensorProto.UINT16, TensorProto.UINT32, TensorProto.UINT64,
})

_RULES: dict[tuple[str, str], Rule] = {}


def _dom(domain: str) -> str:
    return "" if domain in ("", "ai.onnx") else domain


def register(*op_types: str, domain: str = "") -> Callable[[Rule], Rule]:
    """Decorator: register a rule for ``op_types`` of ``domain`` (``""`` = ai.onnx)."""
    def deco(fn: Rule) -> Rule:
        for op in op_types:
            _RULES[(_dom(domain), op)] = fn
        return fn
    return deco


def lookup(domain: str, op_type: str) -> Rule | None:
    """The rule of an operator, or ``None``."""
    return _RULES.get((_dom(domain), op_type))


def registered() -> list[tuple[str, str]]:
    """Every ``(domain, op_type)`` that has a rule."""
    return sorted(_RULES)


class NodeInference:
    """One node as a rule sees it: typed access to inputs, attributes and outputs."""

    __slots__ = ("_ins", "_label", "ctx", "node")

    def __init__(self, ctx: ShapesContext, node: Node):
        self.ctx = ctx
        self.node = node
        self._ins = node.inputs
        self._label: str | None = None

    # -- node --------------------------------------------------------------------------
    @property
    def label(self) -> str:
        if self._label is None:
            self._label = _node_label(self.node)
        return self._label

    @property
    def version(self) -> int:
        """Opset version of the node's domain."""
        return self.ctx.opset(self.node.domain)

    @property
    def n_inputs(self) -> int:
        return len(self._ins)

    @property
    def n_outputs(self) -> int:
        return len(self.node.outputs)

    def fail(self, message: str) -> NoReturn:
        raise ShapeError(f"{self.label}: {message}")

    def attr(self, name: str, default: Any = None) -> Any:
        """Attribute value (references to function attributes resolved), or ``default``
        when the attribute is absent or carries no value."""
        a = self.node.attributes.get(name)
        if a is not None and a.ref_attr_name:
            a = self.ctx._attr_env.get(a.ref_attr_name)
        if a is None or a.value is None:
            return default
        return a.value

    def int_attr(self, name: str, default: int | None = None) -> int | None:
        """An integer attribute, or ``default``; a value that is no integer fails."""
        return self._attr_as(name, default, int, "an integer")

    def ints_attr(self, name: str, default: list[int] | None = None) -> list[int] | None:
        """An integer-list attribute, or ``default``; a value that is no such list fails."""
        return self._attr_as(name, default, lambda v: [int(x) for x in _sequence(v)], "a list of integers")

    def float_attr(self, name: str, default: float | None = None) -> float | None:
        """A float attribute, or ``default``; a value that is no number fails."""
        return self._attr_as(name, default, float, "a number")

    def floats_attr(self, name: str, default: list[float] | None = None) -> list[float] | None:
        """A float-list attribute, or ``default``; a value that is no such list fails."""
        return self._attr_as(name, default, lambda v: [float(x) for x in _sequence(v)], "a list of numbers")

    def _attr_as(self, name: str, default: Any, convert: Callable[[Any], Any], what: str) -> Any:
        v = self.attr(name, default)
        if v is None:
            return None
        try:
            return convert(v)
        except (TypeError, ValueError):
            self.fail(f"attribute {name!r} must be {what}, got {v!r:.60}")

    # -- inputs ------------------------------------------------------------------------
    def input(self, i: int) -> Value | None:
        ins = self._ins
        return ins[i] if 0 <= i < len(ins) else None

    def has(self, i: int) -> bool:
        """True when input ``i`` is given (not omitted)."""
        return self.input(i) is not None

    def type(self, i: int) -> Type:
        ins = self._ins  # (input(i), inlined: rules ask for types all the time)
        return self.ctx.type_of(ins[i]) if 0 <= i < len(ins) else None

    def tensor(self, i: int) -> TensorType | SparseTensorType | None:
        t = self.type(i)
        return t if isinstance(t, (TensorType, SparseTensorType)) else None

    def elem(self, i: int) -> int:
        """Element type of input ``i`` (0 when unknown)."""
        t = self.tensor(i)
        return t.elem_type if t is not None else 0

    def shape(self, i: int) -> tuple[Dim, ...] | None:
        t = self.tensor(i)
        return None if t is None else t.shape

    def rank(self, i: int) -> int | None:
        s = self.shape(i)
        if s is not None:
            return len(s)
        v = self.value(i)
        return None if v is None else len(v.shape)

    def value(self, i: int) -> SymTensor | None:
        ins = self._ins
        return self.ctx.value_of(ins[i]) if 0 <= i < len(ins) else None

    def ints(self, i: int) -> list[Any] | None:
        """Elements of a known scalar or 1-D integer input (each ``int``, ``SymExpr`` or ``None``)."""
        v = self.value(i)
        return None if v is None else v.integers()

    def const_ints(self, i: int) -> list[int] | None:
        """Elements of a fully known scalar or 1-D integer input, else ``None``."""
        v = self.ints(i)
        if v is None or any(not isinstance(x, int) for x in v):
            return None
        return v

    def axes(self, attr: str = "axes", index: int = 1) -> list[int] | None:
        """Axes from an attribute (older opsets) or else from input ``index``."""
        a = self.ints_attr(attr)
        if a is not None:
            return a
        if self.has(index):
            return self.const_ints(index)
        return []

    # -- outputs -----------------------------------------------------------------------
    def has_output(self, i: int) -> bool:
        return 0 <= i < len(self.node.outputs) and bool(self.node.outputs[i].name)

    def output(self, i: int) -> Value:
        return self.node.outputs[i]

    def set(self, i: int, elem: int | None, shape: Sequence[Dim] | None) -> None:
        """Record output ``i`` as a tensor (``elem`` 0/None = unknown, ``shape`` None = unknown rank)."""
        outs = self.node._outputs
        if i >= len(outs) or (not elem and shape is None):
            return
        if shape is not None:
            shape = tuple(shape)
            for d in shape:
                if type(d) is not int:  # what as_dim changes: symbols, strings, numpy ints
                    shape = tuple(as_dim(d) for d in shape)
                    break
        self.ctx.set_type(outs[i], TensorType(elem or 0, shape), self.label)

    def set_type(self, i: int, t: Type) -> None:
        if i < len(self.node.outputs) and t is not None:
            self.ctx.set_type(self.node.outputs[i], t, self.label)

    def set_value(self, i: int, value: SymTensor | None) -> None:
        if value is not None and i < len(self.node.outputs):
            self.ctx.set_value(self.node.outputs[i], value, self.label)

    def same_as_input(self, out: int = 0, inp: int = 0, elem: int | None = None) -> None:
        """Output ``out`` has the shape of input ``inp`` (element type ``elem`` if given)."""
        t = self.tensor(inp)
        if t is None:
            if elem:
                self.set(out, elem, None)
            return
        self.set(out, elem or t.elem_type, t.shape)

    # -- helpers -----------------------------------------------------------------------
    def norm_axis(self, axis: int, rank: int, what: str = "axis") -> int:
        """``axis`` in ``[-rank, rank)`` normalised to ``[0, rank)``."""
        if not -rank <= axis < rank:
            self.fail(f"{what} {axis} is out of range for rank {rank}")
        return axis + rank if axis < 0 else axis

    def fresh(self, hint: str = "s") -> SymExpr:
        return self.ctx.fresh_symbol(hint)

    def alias(self, out: int, inp: int) -> None:
        """Operator-level alias: output ``out`` shares storage (and type) with input ``inp``."""
        if out < len(self.node.outputs) and self.has(inp):
            self.ctx.add_alias(self.node.outputs[out], self._ins[inp], f"operator rule of {self.label}")

    def check_dims(self, a: Dim, b: Dim, what: str) -> None:
        """Fail when ``a`` and ``b`` are provably different."""
        if dims_equal(a, b) is False:
            self.fail(f"{what}: {a} != {b}")


def _sequence(v: Any) -> Any:
    if isinstance(v, (str, bytes)):  # iterable, but not a list attribute
        raise TypeError("a string is not a list")
    return v


def broadcast_dim(a: Dim, b: Dim, op: NodeInference) -> Dim:
    """Numpy-style broadcast of two dimensions (see the module docstring)."""
    if a == 1 and isinstance(a, int):
        return b
    if b == 1 and isinstance(b, int):
        return a
    if a is None or b is None:
        other = b if a is None else a
        return other if isinstance(other, int) else None
    eq = dims_equal(a, b)
    if eq:
        return a if isinstance(a, int) else b
    if isinstance(a, int) and isinstance(b, int):
        op.fail(f"cannot broadcast dimensions {a} and {b}")
    if isinstance(a, int):
        return a
    if isinstance(b, int):
        return b
    return op.fresh("b")


def broadcast_shapes(op: NodeInference, *shapes: Sequence[Dim] | None) -> tuple[Dim, ...] | None:
    """Multidirectional broadcast; ``None`` if any rank is unknown."""
    if any(s is None for s in shapes):
        return None
    rank = max((len(s) for s in shapes), default=0)
    out: list[Dim] = []
    for k in range(rank):
        d: Dim = 1
        for s in shapes:
            j = k - (rank - len(s))
            if j >= 0:
                d = broadcast_dim(d, s[j], op)
        out.append(d)
    return tuple(out)


def map_elements(fn: Callable[..., Any], elem_type: int, *values: SymTensor | None) -> SymTensor | None:
    """Apply ``fn`` element by element (numpy broadcasting) to known contents.

    ``None`` elements propagate; an element ``fn`` cannot compute (it raises
    ``TypeError``, ``ZeroDivisionError``, ``ValueError``, ``OverflowError`` or a
    symbolic error) becomes ``None``.
    """
    if any(v is None for v in values):
        return None
    try:
        arrays = np.broadcast_arrays(*(v.data for v in values))
    except ValueError:
        return None
    shape = arrays[0].shape if arrays else ()
    if int(np.prod(shape, dtype=np.int64)) > 4096:
        return None
    flat = [a.reshape(-1) for a in arrays]
    out = np.empty(len(flat[0]) if flat else 1, dtype=object)
    for k in range(out.size):
        args = [f[k] for f in flat]
        if any(x is None for x in args):
            out[k] = None
            continue
        try:
            out[k] = fn(*args)
        except (TypeError, ZeroDivisionError, ValueError, OverflowError, SymbolicError):
            out[k] = None
    return SymTensor.of(elem_type, out.reshape(shape))
