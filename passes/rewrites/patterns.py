"""The language of declarative rewrites: patterns, matches, rules and rule tables.

A :class:`Pattern` matches a node by operator, inputs and attributes; an input
is a sub-pattern (the value's producer must match it), a :class:`Capture`
(any value, bound by name; a name used twice must bind the same value) or a
:class:`Const` (a known constant, bound with its numpy value). A
:class:`Rule` pairs a pattern with a function of the :class:`Match` that
returns the replacement value(s), or None to decline. Tables compose with
``+``::

    # x * 1 -> x  (scalar 1: broadcasting leaves x unchanged)
    mul_by_one = Rule(Pattern("Mul", "x", Const("one", lambda c: c.ndim == 0 and c == 1)),
                      lambda m: m["x"], "mul_by_one")

    table = DEFAULT_RULES + RuleTable([mul_by_one])
    apply_rules(model, table)

One driver applies every table: :func:`~onnxforge.passes.rewrites.engine.apply_rules`
(:mod:`onnxforge.passes.rewrites.engine`). The default algebraic rules are data in
:mod:`onnxforge.passes.rewrites.default_rules`; the fusions keep their tables beside
their passes (:mod:`~onnxforge.passes.rewrites.fusion`,
:mod:`~onnxforge.passes.rewrites.attention_fusion`, :mod:`~onnxforge.passes.rewrites.opset23`).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from onnxforge.proto_ext.errors import OnnxforgeError
from onnxforge.graphbuilder.ir.core import Node, Value
from onnxforge.graphbuilder.shapes.context import ShapesContext
from onnxforge.passes.framework.domains import canonical_domain
from onnxforge.passes.framework.records import make_attrs
from onnxforge.passes.rewrites.rename import NameScope
from onnxforge.passes.rewrites.shape_fold import LazyShapes
from onnxforge.proto_ext.types import TensorType

__all__ = [
    "Capture",
    "Const",
    "Match",
    "Pattern",
    "Replacement",
    "RewriteError",
    "Rule",
    "RuleTable",
]


class RewriteError(OnnxforgeError, RuntimeError):
    """A rule is malformed, or rewriting did not reach a fixed point (rules undo each
    other or grow without end)."""


@dataclass(frozen=True, slots=True)
class Capture:
    """Matches any (present) value and binds it to ``name``; ``where`` filters it."""

    name: str
    where: Callable[[Value], bool] | None = None


@dataclass(frozen=True, slots=True)
class Const:
    """Matches a known dense constant, bound to ``name``; ``where`` tests its numpy value."""

    name: str
    where: Callable[[np.ndarray], bool] | None = None


@dataclass(frozen=True, eq=False, init=False)
class Pattern:
    """Matches a node: ``op`` in ``domain``, inputs matching ``inputs`` one by one.

    ``attrs`` maps an attribute name to a required value or a predicate of its
    value (None when absent). ``output`` is the port a sub-pattern's value must
    come from; ``name`` binds the matched node in the :class:`Match`. A string
    input is shorthand for ``Capture(name)``.
    """

    op: str
    inputs: tuple[Any, ...]
    domain: str
    attrs: Mapping[str, Any]
    name: str | None
    output: int

    def __init__(self, op: str, *inputs: Any, domain: str = "", attrs: Mapping[str, Any] | None = None,
                 name: str | None = None, output: int = 0):
        object.__setattr__(self, "op", op)
        object.__setattr__(self, "inputs", tuple(Capture(i) if isinstance(i, str) else i for i in inputs))
        object.__setattr__(self, "domain", domain)
        object.__setattr__(self, "attrs", dict(attrs or {}))
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "output", output)


class _Ops:
    """``m.op.Name(*inputs, **attrs)``: creates a replacement node, returns its output(s)."""

    __slots__ = ("_domain", "_match")

    def __init__(self, match: Match, domain: str = ""):
        self._match = match
        self._domain = domain

    def __getitem__(self, domain: str) -> _Ops:
        return _Ops(self._match, domain)

    def __getattr__(self, op_type: str) -> Callable[..., Any]:
        if op_type.startswith("_"):
            raise AttributeError(op_type)

        def make(*inputs: Value | None, _outputs: int = 1, **attrs: Any) -> Any:
            return self._match.make_node(self._domain, op_type, inputs, _outputs, attrs)

        return make


class Match:
    """A successful match: ``m["x"]`` captured values, ``m.const("c")`` constants,
    ``m.node("t")`` named nodes, ``m.root``; ``m.op.X(...)`` builds replacement nodes."""

    __slots__ = ("_scope", "_shapes", "consts", "matched", "new_nodes", "nodes", "root", "values")

    def __init__(self, root: Node, scope: Callable[[], NameScope], shapes: ShapesContext | LazyShapes | None = None):
        self.root = root
        self._shapes = shapes
        self.values: dict[str, Value] = {}
        self.consts: dict[str, np.ndarray] = {}
        self.nodes: dict[str, Node] = {}
        self.matched: list[Node] = []
        self.new_nodes: list[Node] = []
        self._scope = scope

    @property
    def op(self) -> _Ops:
        # Made on access: a Match holding its own _Ops would be a reference cycle, and one
        # Match per attempted rewrite would leave the cyclic collector that much garbage.
        return _Ops(self)

    def __getitem__(self, name: str) -> Value:
        return self.values[name]

    def const(self, name: str) -> np.ndarray:
        return self.consts[name]

    def node(self, name: str) -> Node:
        return self.nodes[name]

    def type_of(self, v: Value | None) -> Any:
        """The type of ``v``: inferred by the shapes analysis when the driver has one,
        else ``v.type``."""
        if v is None:
            return None
        if self._shapes is not None:
            t = self._shapes.type_of(v)
            if t is not None:
                return t
        return v.type

    def shape_of(self, v: Value | None) -> tuple[Any, ...] | None:
        """The (possibly symbolic) shape of tensor ``v``, None for an unknown rank."""
        t = self.type_of(v)
        return tuple(t.shape) if isinstance(t, TensorType) and t.shape is not None else None

    def rank_of(self, v: Value | None) -> int | None:
        shape = self.shape_of(v)
        return None if shape is None else len(shape)

    def static_shape(self, v: Value | None) -> tuple[int, ...] | None:
        """The shape of ``v`` when every dimension is a known int."""
        shape = self.shape_of(v)
        if shape is None or not all(type(d) is int and d >= 0 for d in shape):
            return None
        return shape

    def make_node(self, domain: str, op_type: str, inputs: Sequence[Value | None], outputs: int,
                  attrs: Mapping[str, Any]) -> Any:
        scope = self._scope()
        base = self.root.name or op_type
        outs = [Value(scope.fresh(f"{base}_{op_type}")) for _ in range(outputs)]
        node = Node(domain, op_type, list(inputs), outs, name=scope.fresh(f"{base}_{op_type}"),
                    attributes=make_attrs(attrs, RewriteError, f"replacement {op_type} node"))
        self.new_nodes.append(node)
        return outs[0] if outputs == 1 else tuple(outs)

    def constant(self, array: Any) -> Value:
        """A new ``Constant`` node holding ``array``; rules see its output as a constant
        (``constant_folding``, when it runs afterwards, lifts it to an initializer)."""
        return self.make_node("", "Constant", [], 1, {"value": np.asarray(array)})

    def discard(self) -> None:
        for n in self.new_nodes:
            n.detach_inputs()
        self.new_nodes.clear()


Replacement = Callable[[Match], "Value | Sequence[Value] | None"]


@dataclass(frozen=True)
class Rule:
    """``pattern`` -> ``replace(match)``; ``name`` labels the rule in reports and errors."""

    pattern: Pattern
    replace: Replacement
    name: str = ""

    @property
    def label(self) -> str:
        return self.name or getattr(self.replace, "__name__", self.pattern.op)


class RuleTable:
    """An ordered collection of rules, indexed by root operator; ``a + b`` concatenates."""

    def __init__(self, rules: Iterable[Rule] = ()):
        self.rules: tuple[Rule, ...] = tuple(rules)
        self.index: dict[tuple[str, str], list[Rule]] = {}
        for r in self.rules:
            if not isinstance(r, Rule):
                raise RewriteError(f"a RuleTable holds Rule objects, got {type(r).__name__}")
            self.index.setdefault((canonical_domain(r.pattern.domain), r.pattern.op), []).append(r)

    def __add__(self, other: RuleTable | Iterable[Rule]) -> RuleTable:
        more = other.rules if isinstance(other, RuleTable) else tuple(other)
        return RuleTable(self.rules + more)

    def __iter__(self) -> Iterator[Rule]:
        return iter(self.rules)

    def __len__(self) -> int:
        return len(self.rules)

    def rules_for(self, node: Node) -> list[Rule]:
        return self.index.get((canonical_domain(node.domain), node.op_type), [])
