"""Declarative rewrite rules: a table of (pattern -> replacement) pairs and one driver.

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

:func:`apply_rules` drives a table to a fixed point with a worklist: after a
rewrite, the new nodes and the consumers of the replacing values are looked at
again. More than ``max_rewrites`` rewrites (default 10 per node plus 1000)
means the rules do not terminate: :class:`RewriteError` names the rules that
fired most. Nodes with side effects are never matched, inside or at the root
of a pattern. A replacement node goes right before the root; the root and the
matched nodes nobody else uses are removed; a root output that is a graph
output hands its name, type, alias and binding over (or the rule is declined).

Before / after with :data:`DEFAULT_RULES`::

    a = Transpose(x, perm=[1, 0])
    b = Transpose(a, perm=[1, 0])           y = Neg(x)
    c = Mul(b, one)      # one = 1.0
    m = Max(c, c)
    y = Neg(m)
"""
from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cache, partial
from typing import Any

import numpy as np

from onnxforge.proto_ext.errors import OnnxforgeError
from onnxforge.graphbuilder.ir import Function, Graph, Model, Node, Value
from onnxforge.graphbuilder.shapes import ShapesContext
from onnxforge.graphbuilder.tensors import onnx_dtype
from onnxforge.passes.domains import canonical_domain
from onnxforge.passes.fold import constant_value, lift_constants
from onnxforge.passes.effects import Effects, effect_analysis
from onnxforge.passes.stated import stated_dims, stated_elem_type
from onnxforge.passes.invariants import containers
from onnxforge.passes.manager import Pass, PassResult, check_int_option, register_pass
from onnxforge.passes.records import make_attrs
from onnxforge.passes.rename import NameScope, can_replace, erase_node, replace_value
from onnxforge.passes.shape_fold import LazyShapes
from onnxforge.proto_ext.types import TensorType

__all__ = [
    "DEFAULT_RULES",
    "Capture",
    "Const",
    "Match",
    "Pattern",
    "RewriteError",
    "RewritePass",
    "Rule",
    "RuleTable",
    "apply_rules",
]

Container = Graph | Function


class RewriteError(OnnxforgeError, RuntimeError):
    """A rule is malformed, or rewriting did not reach a fixed point (rules undo each
    other or grow without end)."""


# ----------------------------------------------------------------------------- patterns


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


# ----------------------------------------------------------------------------- matching


class _Matcher:
    def __init__(self, effects: Effects):
        self.effects = effects
        # (id(Const pattern), id(value)) -> the constant if it passed the test, else None.
        # Values keep their constness while rewriting, and deduplicated initializers are
        # shared by many nodes, so each test runs once per distinct value.
        self._consts: dict[tuple[int, int], tuple[Value, np.ndarray | None]] = {}

    def node(self, p: Pattern, n: Node, m: Match, c: Container) -> bool:
        if n.op_type != p.op or (n.domain != p.domain
                                 and canonical_domain(n.domain) != canonical_domain(p.domain)):
            return False
        ins = n.inputs
        if len(ins) != len(p.inputs):
            return False
        for name, want in p.attrs.items():
            got = n.attr(name)
            if callable(want):
                if not want(got):
                    return False
            elif got != want and not (isinstance(got, list) and list(want) == got):
                return False
        for pin, v in zip(p.inputs, ins):
            if not self.value(pin, v, m, c):
                return False
        if p.name:
            m.nodes[p.name] = n
        m.matched.append(n)
        return True

    def value(self, pin: Any, v: Value | None, m: Match, c: Container) -> bool:
        if pin is None:
            return v is None
        if v is None:
            return False
        if isinstance(pin, Capture):
            bound = m.values.get(pin.name)
            if bound is not None:
                return bound is v
            if pin.where is not None and not pin.where(v):
                return False
            m.values[pin.name] = v
            return True
        if isinstance(pin, Const):
            bound = m.values.get(pin.name)
            if bound is not None:
                return bound is v
            key = (id(pin), id(v))
            hit = self._consts.get(key)
            if hit is not None and hit[0] is v:
                arr = hit[1]
            else:
                arr = constant_value(v)
                if arr is not None and pin.where is not None and not pin.where(arr):
                    arr = None
                self._consts[key] = (v, arr)  # the value is kept alive: its id stays unique
            if arr is None:
                return False
            m.values[pin.name] = v
            m.consts[pin.name] = arr
            return True
        if isinstance(pin, Pattern):
            p = v.producer()
            if p is None or p.graph is not c or v.index != pin.output:
                return False
            if self.effects.has_side_effects(p):
                return False
            return self.node(pin, p, m, c)
        raise RewriteError(f"pattern input {pin!r} is not a Pattern, Capture, Const or name")


# ----------------------------------------------------------------------------- driver


class _Driver:
    def __init__(self, model: Model, table: RuleTable, shapes: ShapesContext | LazyShapes | None = None,
                 effects: Effects | None = None):
        self.model = model
        self.table = table
        self.shapes = shapes
        self.made_constants = False
        self.effects = effect_analysis(model) if effects is None else effects
        self.matcher = _Matcher(self.effects)
        self.names = cache(partial(NameScope.from_model, model))  # built when a rule first needs it
        self.count = 0
        self.fired: Counter[str] = Counter()

    def run(self, c: Container, limit: int) -> None:
        table = self.table
        queue: deque[Node] = deque(n for n in c if table.rules_for(n))
        queued = {id(n) for n in queue}
        while queue:
            n = queue.popleft()
            queued.discard(id(n))
            if n.graph is not c or self.effects.has_side_effects(n):
                continue
            ins = n.inputs
            arity = len(ins)
            for rule in table.rules_for(n):
                if len(rule.pattern.inputs) != arity or _producers_differ(rule.pattern, ins):
                    continue
                touched = self.apply(c, n, rule)
                if touched is None:
                    continue
                self.count += 1
                self.fired[rule.label] += 1
                if self.count > limit:
                    top = ", ".join(f"{k} x{v}" for k, v in self.fired.most_common(3))
                    raise RewriteError(f"rewriting made {self.count} rewrites without reaching a fixed "
                                       f"point (limit {limit}); most applied rules: {top}")
                for t in touched:
                    if t.graph is c and id(t) not in queued and table.rules_for(t):
                        queue.append(t)
                        queued.add(id(t))
                break

    def apply(self, c: Container, root: Node, rule: Rule) -> list[Node] | None:
        """Rewrite ``root`` (a node of ``c`` without side effects) with ``rule`` if it matches;
        returns the nodes to look at again, or None when the rule does not apply."""
        m = Match(root, self.names, self.shapes)
        if not self.matcher.node(rule.pattern, root, m, c):
            return None
        got = rule.replace(m)
        if got is None:
            m.discard()
            return None
        results = [got] if isinstance(got, Value) else list(got)
        outs = root.outputs
        if len(results) != len(outs) or any(not isinstance(r, Value) for r in results):
            m.discard()
            raise RewriteError(f"rule {rule.label!r} returned {len(results)} value(s) for "
                               f"{len(outs)} output(s) of {root!r}")
        if any(r is o for r, o in zip(results, outs)):
            m.discard()
            return None
        for n in m.new_nodes:  # inserted first: a new node's output may take over a graph output
            c.insert_before(root, n)
        if not all(can_replace(o, r) or (not o.num_uses() and not c.is_output(o))
                   for o, r in zip(outs, results)):
            for n in m.new_nodes:
                c.remove(n, safe=False)
            m.new_nodes.clear()
            return None
        if any(n.op_type == "Constant" for n in m.new_nodes):
            self.made_constants = True
        touched: list[Node] = list(m.new_nodes)
        for o, r in zip(outs, results):
            if r.type is None and o.type is not None:
                r.type = o.type
            for user, _ in o.uses():
                touched.append(user)
            if o.num_uses() or c.is_output(o):
                replace_value(o, r)
        erase_node(root)
        for n in reversed(m.matched):
            if n is root or n.graph is not c:
                continue
            if any(o.num_uses() or c.is_output(o) for o in n.outputs):
                continue
            for v in erase_node(n):
                p = v.producer()
                if p is not None and p.graph is c:
                    touched.append(p)
        for r in results:
            touched.extend(u for u, _ in r.uses())
        return touched


def _producers_differ(p: Pattern, ins: tuple[Value | None, ...]) -> bool:
    """Whether an input of ``p`` that is a nested pattern reads a value no node of that
    operator made (the matcher would refuse it too; this is asked before any Match is made)."""
    for pin, v in zip(p.inputs, ins):
        if isinstance(pin, Pattern):
            prod = v.producer() if v is not None else None
            if prod is None or prod.op_type != pin.op:
                return True
    return False


def _as_table(table: RuleTable | Iterable[Rule] | None) -> RuleTable:
    if table is None:
        return DEFAULT_RULES
    if isinstance(table, RuleTable):
        return table
    if isinstance(table, Iterable) and not isinstance(table, (str, bytes)):
        return RuleTable(table)
    raise RewriteError(f"rules come as a RuleTable or an iterable of Rule objects, "
                       f"not {type(table).__name__}")


def apply_rules(model: Model, table: RuleTable | Iterable[Rule] | None = None, *,
                max_rewrites: int | None = None, shapes: ShapesContext | LazyShapes | None = None,
                lift: bool = False, effects: Effects | None = None) -> int:
    """Apply ``table`` (default :data:`DEFAULT_RULES`) everywhere until no rule applies.

    ``shapes`` (the ``shapes`` analysis of ``model`` before rewriting) answers the
    rules' :meth:`Match.type_of` / :meth:`Match.shape_of`; values made by the rules
    fall back to their ``Value.type``. With ``lift``, the ``Constant`` nodes the rules
    made in graphs become initializers. Returns the number of rewrites; raises
    :class:`RewriteError` past ``max_rewrites`` (default: 10 per node of the model
    plus 1000).
    ``effects``: the model's current :class:`~onnxforge.passes.effects.Effects`
    when the caller has it (default: computed here).
    """
    table = _as_table(table)
    if not len(table):
        return 0
    drv = _Driver(model, table, shapes, effects)
    all_c = list(containers(model))
    limit = max_rewrites if max_rewrites is not None else 10 * sum(len(c) for c in all_c) + 1000
    for c in all_c:
        drv.run(c, limit)
    if lift and drv.made_constants:
        lift_constants(model, effects=drv.effects)
    return drv.count


# ----------------------------------------------------------------------------- default rules


def _all(value: float) -> Callable[[np.ndarray], bool]:
    def test(a: np.ndarray) -> bool:
        return a.dtype.kind in "biuf" and a.size > 0 and bool(np.all(a == value))
    return test


def _zero_for_add(a: np.ndarray) -> bool:
    # x + (-0.0) == x for every float x (also -0.0); x + (+0.0) turns -0.0 into +0.0.
    if a.dtype.kind in "iu":
        return a.size > 0 and not a.any()
    return a.dtype.kind == "f" and a.size > 0 and bool(np.all((a == 0) & np.signbit(a)))


def _zero_for_sub(a: np.ndarray) -> bool:
    # x - (+0.0) == x for every float x; x - (-0.0) turns -0.0 into +0.0.
    if a.dtype.kind in "iu":
        return a.size > 0 and not a.any()
    return a.dtype.kind == "f" and a.size > 0 and bool(np.all((a == 0) & ~np.signbit(a)))


def _static_shape(v: Value) -> tuple[int, ...] | None:
    t = v.type
    if isinstance(t, TensorType) and t.shape is not None and all(type(d) is int for d in t.shape):
        return tuple(t.shape)
    return None


def _rank(v: Value) -> int | None:
    t = v.type
    return len(t.shape) if isinstance(t, TensorType) and t.shape is not None else None


def _broadcast_keeps(x: Value, c: np.ndarray) -> bool:
    """Broadcasting constant ``c`` against ``x`` leaves ``x``'s shape and type unchanged."""
    t = x.type
    if isinstance(t, TensorType):
        try:
            if onnx_dtype(c.dtype) != t.elem_type:
                return False
        except (ValueError, TypeError, KeyError, OnnxforgeError):
            return False
    if c.ndim == 0:
        return True
    if not isinstance(t, TensorType) or t.shape is None or len(t.shape) < c.ndim:
        return False
    for cd, xd in zip(reversed(c.shape), reversed(t.shape)):
        if cd != 1 and not (type(xd) is int and xd == cd):
            return False
    return True


def _identity_if_keeps(cap: str, const: str) -> Replacement:
    def replace(m: Match) -> Value | None:
        return m[cap] if _broadcast_keeps(m[cap], m.const(const)) else None
    replace.__name__ = f"keep_{cap}"
    return replace


def _same(m: Match) -> Value:
    return m["x"]


def _perm(node: Node, x: Value) -> list[int] | None:
    perm = node.attr("perm")
    if perm is not None:
        return [int(p) for p in perm]
    r = _rank(x)
    return None if r is None else list(range(r - 1, -1, -1))


def _compose_transposes(m: Match) -> Value | None:
    inner, outer = m.node("inner"), m.root
    p = _perm(inner, m["x"])
    if p is None:
        return None
    q = _perm(outer, inner.outputs[0])
    if q is None or len(p) != len(q):
        return None
    r = [p[i] for i in q]
    if r == list(range(len(r))):
        return m["x"]
    return m.op.Transpose(m["x"], perm=r)


def _no_copy_zeros(m: Match) -> bool:
    return m.root.attr("allowzero", 0) == 1 or not bool(np.any(m.const("b") == 0))


def _collapse_reshapes(m: Match) -> Value | None:
    if not _no_copy_zeros(m):
        return None
    allowzero = m.root.attr("allowzero")
    return m.op.Reshape(m["x"], m["b"], allowzero=allowzero)


def _reshape_noop(m: Match) -> Value | None:
    shape = _static_shape(m["x"])
    if shape is None:
        return None
    target = [int(d) for d in m.const("s").reshape(-1)]
    if len(target) != len(shape):
        return None
    zero_copies = m.root.attr("allowzero", 0) != 1
    known = [shape[i] if (d == 0 and zero_copies) else d for i, d in enumerate(target)]
    if known.count(-1) == 1:
        rest = [d for d in known if d != -1]
        if all(d > 0 for d in rest) and all(d > 0 for d in shape):
            total = int(np.prod(shape))
            known[known.index(-1)] = total // int(np.prod(rest)) if rest else total
    return m["x"] if tuple(known) == shape else None


def _cast_noop(m: Match) -> Value | None:
    t = m["x"].type
    if isinstance(t, TensorType) and t.elem_type == m.root.attr("to"):
        return m["x"]
    return None


def _axes_of(node: Node, const: np.ndarray | None) -> list[int] | None:
    if const is not None:
        return [int(a) for a in const.reshape(-1)]
    got = node.attr("axes")
    return None if got is None else [int(a) for a in got]


def _squeeze_unsqueeze(m: Match) -> Value | None:
    inner = m.node("inner")
    a = _axes_of(inner, m.consts.get("a"))
    b = _axes_of(m.root, m.consts.get("b"))
    return m["x"] if a is not None and a == b else None


def _cast_noop_typed(m: Match) -> Value | None:
    # the element type the producers fix, when they do: no shape inference needed
    et = stated_elem_type(m["x"])
    if et is None:
        t = m.type_of(m["x"])
        et = t.elem_type if isinstance(t, TensorType) else None
    return m["x"] if et is not None and et == m.root.attr("to") else None


def _unsqueeze_squeeze(m: Match) -> Value | None:
    # Squeeze(x, a) drops dims a of x (each 1); Unsqueeze(., a) puts them back where they
    # were: both normalize a against rank(x), so equal lists restore x exactly.
    a = _axes_of(m.node("inner"), m.consts.get("a"))
    b = _axes_of(m.root, m.consts.get("b"))
    return m["x"] if a and a == b else None


def _merged_unsqueeze_axes(m: Match) -> list[int] | None:
    """Unsqueeze(Unsqueeze(x, a), b) == Unsqueeze(x, c): the outer axes b are final
    positions; inner axis i (counted in the middle rank) is the i-th final position
    that b leaves free; c is both, sorted."""
    a = _axes_of(m.node("inner"), m.consts.get("a"))
    b = _axes_of(m.root, m.consts.get("b"))
    if not a or not b:
        return None
    if any(v < 0 for v in a + b):
        r0 = m.rank_of(m["x"])
        if r0 is None:
            return None
        r1 = r0 + len(a)
        a = [v + r1 if v < 0 else v for v in a]
        b = [v + r1 + len(b) if v < 0 else v for v in b]
    if len(set(a)) != len(a) or len(set(b)) != len(b):
        return None
    taken = set(b)
    free: list[int] = []
    pos = 0
    need = max(a) + 1
    while len(free) < need:
        if pos not in taken:
            free.append(pos)
        pos += 1
    return sorted(taken | {free[i] for i in a})


def _merge_unsqueezes(m: Match) -> Value | None:
    c = _merged_unsqueeze_axes(m)
    if c is None:
        return None
    return m.op.Unsqueeze(m["x"], m.constant(np.array(c, np.int64)))


def _merge_unsqueezes_attr(m: Match) -> Value | None:
    c = _merged_unsqueeze_axes(m)
    return None if c is None else m.op.Unsqueeze(m["x"], axes=c)


def _transpose_identity(m: Match) -> Value | None:
    perm = m.root.attr("perm")
    if perm is None:  # the default reverses the dims: the identity only up to rank 1
        r = m.rank_of(m["x"])
        return m["x"] if r is not None and r <= 1 else None
    return m["x"] if [int(p) for p in perm] == list(range(len(perm))) else None


_BIG = 1 << 31  # ends at or past this are "to the end" for any dimension a tensor can have


def _slice_noop_axes(m: Match, starts: np.ndarray, ends: np.ndarray, axes: np.ndarray | None,
                     steps: np.ndarray | None) -> Value | None:
    """Slice(x, starts, ends, axes, steps) -> x when every sliced axis keeps [0, dim)
    with step 1: start 0 (or <= -dim), end >= dim."""
    x = m["x"]
    st = [int(v) for v in starts.reshape(-1)]
    en = [int(v) for v in ends.reshape(-1)]
    if len(st) != len(en):
        return None
    ax = list(range(len(st))) if axes is None else [int(v) for v in axes.reshape(-1)]
    sp = [1] * len(st) if steps is None else [int(v) for v in steps.reshape(-1)]
    if len(ax) != len(st) or len(sp) != len(st) or any(v != 1 for v in sp) or any(s > 0 for s in st):
        return None  # a start past 0 drops elements of any dimension: no shape needed to say so
    # the dims the graph states (a shape vector's length, a Conv's channels...) when they
    # give every sliced axis; where they do, inference gives the same
    shape: tuple[Any, ...] | None = stated_dims(x)
    if shape is None or any(not -len(shape) <= a < len(shape) or shape[a] is None for a in ax):
        shape = m.shape_of(x)
    for a, s, e in zip(ax, st, en):
        dim = None
        if shape is not None:
            if not -len(shape) <= a < len(shape):
                return None
            d = shape[a]
            dim = d if type(d) is int else None
        elif a < 0:
            return None
        start_ok = s == 0 or (dim is not None and s <= -dim)
        end_ok = e >= _BIG or (dim is not None and e >= dim)
        if not (start_ok and end_ok):
            return None
    return x


def _slice_noop(m: Match) -> Value | None:
    return _slice_noop_axes(m, m.const("s"), m.const("e"), m.consts.get("a"), m.consts.get("p"))


def _slice_noop_attr(m: Match) -> Value | None:
    st, en, ax = m.root.attr("starts"), m.root.attr("ends"), m.root.attr("axes")
    if st is None or en is None:
        return None
    return _slice_noop_axes(m, np.array(st), np.array(en), None if ax is None else np.array(ax), None)


def _pad_noop(m: Match) -> Value | None:
    pads = m.consts["p"] if "p" in m.consts else (
        np.array(m.root.attr("pads")) if m.root.attr("pads") is not None else None)
    return m["x"] if pads is not None and pads.size > 0 and not pads.any() else None


def _expand_noop(m: Match) -> Value | None:
    # Expand(x, s) has shape broadcast(shape(x), s): x itself when s has no more dims than x
    # and each of its dims is 1 or x's (static) dim.
    shape = m.shape_of(m["x"])
    s = [int(d) for d in m.const("s").reshape(-1)]
    if shape is None or len(s) > len(shape):
        return None
    for d, xd in zip(reversed(s), reversed(shape)):
        if d != 1 and not (type(xd) is int and xd == d):
            return None
    return m["x"]


def _tile_noop(m: Match) -> Value | None:
    r = m.const("r")
    return m["x"] if r.size > 0 and bool(np.all(r == 1)) else None


def _bool_identity(value: bool) -> Callable[[np.ndarray], bool]:
    def test(a: np.ndarray) -> bool:
        return a.dtype == np.bool_ and a.size > 0 and bool(np.all(a == value))
    return test


def _rules() -> RuleTable:
    one, zero = _all(1), _zero_for_add
    rules = [
        # x * 1 -> x
        Rule(Pattern("Mul", "x", Const("c", one)), _identity_if_keeps("x", "c"), "mul_by_one"),
        # 1 * x -> x
        Rule(Pattern("Mul", Const("c", one), "x"), _identity_if_keeps("x", "c"), "one_mul"),
        # x / 1 -> x
        Rule(Pattern("Div", "x", Const("c", one)), _identity_if_keeps("x", "c"), "div_by_one"),
        # x + 0 -> x  (integers; floats only for -0.0, the additive identity of IEEE 754)
        Rule(Pattern("Add", "x", Const("c", zero)), _identity_if_keeps("x", "c"), "add_zero"),
        # 0 + x -> x  (same condition)
        Rule(Pattern("Add", Const("c", zero), "x"), _identity_if_keeps("x", "c"), "zero_add"),
        # x - 0 -> x  (integers; floats only for +0.0)
        Rule(Pattern("Sub", "x", Const("c", _zero_for_sub)), _identity_if_keeps("x", "c"), "sub_zero"),
        # Max(x, x) -> x ; Min(x, x) -> x  (idempotent)
        Rule(Pattern("Max", "x", "x"), _same, "max_idempotent"),
        Rule(Pattern("Min", "x", "x"), _same, "min_idempotent"),
        # And(x, x) -> x ; Or(x, x) -> x  (idempotent)
        Rule(Pattern("And", "x", "x"), _same, "and_idempotent"),
        Rule(Pattern("Or", "x", "x"), _same, "or_idempotent"),
        # Neg(Neg(x)) -> x ; Not(Not(x)) -> x  (involutions)
        Rule(Pattern("Neg", Pattern("Neg", "x")), _same, "double_neg"),
        Rule(Pattern("Not", Pattern("Not", "x")), _same, "double_not"),
        # Transpose(Transpose(x, p), q) -> Transpose(x, p∘q), with (p∘q)[i] = p[q[i]];
        # -> x when p∘q is the identity permutation
        Rule(Pattern("Transpose", Pattern("Transpose", "x", name="inner")), _compose_transposes,
             "compose_transposes"),
        # Reshape(Reshape(x, a), b) -> Reshape(x, b)  (b constant, no 0 that copies a dim of a)
        Rule(Pattern("Reshape", Pattern("Reshape", "x", "a"), Const("b")), _collapse_reshapes,
             "collapse_reshapes"),
        # Reshape(x, s) -> x  when the static shape of x already is s
        Rule(Pattern("Reshape", "x", Const("s")), _reshape_noop, "reshape_noop"),
        # Cast(x, T) with x already T -> x
        Rule(Pattern("Cast", "x"), _cast_noop, "cast_noop"),
        # Squeeze(Unsqueeze(x, a), a) -> x  (opset >= 13: axes are inputs)
        Rule(Pattern("Squeeze", Pattern("Unsqueeze", "x", Const("a"), name="inner"), Const("b")),
             _squeeze_unsqueeze, "squeeze_unsqueeze"),
        # Squeeze(Unsqueeze(x, axes=a), axes=a) -> x  (opset < 13: axes are attributes)
        Rule(Pattern("Squeeze", Pattern("Unsqueeze", "x", name="inner")), _squeeze_unsqueeze,
             "squeeze_unsqueeze_attr"),
        # Concat(x) -> x  (a single input)
        Rule(Pattern("Concat", "x"), _same, "concat_single"),
        # Cast(x, T) with x inferred to be T already -> x
        Rule(Pattern("Cast", "x"), _cast_noop_typed, "cast_noop_inferred"),
        # Unsqueeze(Squeeze(x, a), a) -> x  (opset >= 13)
        Rule(Pattern("Unsqueeze", Pattern("Squeeze", "x", Const("a"), name="inner"), Const("b")),
             _unsqueeze_squeeze, "unsqueeze_squeeze"),
        # Unsqueeze(Squeeze(x, axes=a), axes=a) -> x  (opset < 13)
        Rule(Pattern("Unsqueeze", Pattern("Squeeze", "x", name="inner")), _unsqueeze_squeeze,
             "unsqueeze_squeeze_attr"),
        # Unsqueeze(Unsqueeze(x, a), b) -> Unsqueeze(x, b ∪ free_b(a))  (opset >= 13)
        Rule(Pattern("Unsqueeze", Pattern("Unsqueeze", "x", Const("a"), name="inner"), Const("b")),
             _merge_unsqueezes, "merge_unsqueezes"),
        # same, axes as attributes (opset < 13)
        Rule(Pattern("Unsqueeze", Pattern("Unsqueeze", "x", name="inner")), _merge_unsqueezes_attr,
             "merge_unsqueezes_attr"),
        # Transpose(x, perm=[0, 1, ..., r-1]) -> x
        Rule(Pattern("Transpose", "x"), _transpose_identity, "transpose_identity"),
        # And(True, x) -> x ; And(x, True) -> x ; Or(False, x) -> x ; Or(x, False) -> x
        # (identity elements; the constant must not broadcast x to a larger shape)
        Rule(Pattern("And", Const("c", _bool_identity(True)), "x"), _identity_if_keeps("x", "c"),
             "true_and"),
        Rule(Pattern("And", "x", Const("c", _bool_identity(True))), _identity_if_keeps("x", "c"),
             "and_true"),
        Rule(Pattern("Or", Const("c", _bool_identity(False)), "x"), _identity_if_keeps("x", "c"),
             "false_or"),
        Rule(Pattern("Or", "x", Const("c", _bool_identity(False))), _identity_if_keeps("x", "c"),
             "or_false"),
        # Slice(x, 0, >= dim) on every sliced axis, step 1 -> x  (inputs: opset >= 10)
        Rule(Pattern("Slice", "x", Const("s"), Const("e")), _slice_noop, "slice_full"),
        Rule(Pattern("Slice", "x", Const("s"), Const("e"), Const("a")), _slice_noop, "slice_full_axes"),
        Rule(Pattern("Slice", "x", Const("s"), Const("e"), Const("a"), Const("p")), _slice_noop,
             "slice_full_steps"),
        # same, starts/ends/axes as attributes (opset < 10)
        Rule(Pattern("Slice", "x"), _slice_noop_attr, "slice_full_attr"),
        # Pad(x, pads = 0...) -> x  (any mode: nothing is added)
        Rule(Pattern("Pad", "x", Const("p")), _pad_noop, "pad_zero"),
        Rule(Pattern("Pad", "x", Const("p"), "v"), _pad_noop, "pad_zero_value"),
        Rule(Pattern("Pad", "x", Const("p"), None), _pad_noop, "pad_zero_no_value"),
        Rule(Pattern("Pad", "x", Const("p"), "v", "a"), _pad_noop, "pad_zero_axes"),
        Rule(Pattern("Pad", "x", Const("p"), None, "a"), _pad_noop, "pad_zero_axes_no_value"),
        Rule(Pattern("Pad", "x"), _pad_noop, "pad_zero_attr"),
        # Expand(x, s) -> x  when broadcasting shape(x) with s gives shape(x)
        Rule(Pattern("Expand", "x", Const("s")), _expand_noop, "expand_noop"),
        # Tile(x, [1, ..., 1]) -> x
        Rule(Pattern("Tile", "x", Const("r")), _tile_noop, "tile_ones"),
    ]
    return RuleTable(rules)


DEFAULT_RULES: RuleTable = _rules()
"""The default algebraic rules; each is exact (bit for bit) under its stated condition."""


@register_pass
class RewritePass(Pass):
    """Apply a :class:`RuleTable` (default :data:`DEFAULT_RULES`) to a fixed point.

    Before / after: ``b = Transpose(Transpose(x, [1, 0]), [1, 0]); y = Mul(b, 1)``
    becomes ``y = x`` (the uses of ``y`` read ``x``).
    """

    name = "rewrite"
    runs_after = ("inline", "constant_folding")

    def __init__(self, table: RuleTable | Iterable[Rule] | None = None, *,
                 max_rewrites: int | None = None):
        if max_rewrites is not None:
            check_int_option(self.name, "max_rewrites", max_rewrites, 0)
        self.table = _as_table(table)
        self.max_rewrites = max_rewrites
        # the default rules make no storage; a caller's rules may (CacheUpdate, aliases...)
        self.declares_storage = table is not None

    def call(self, model: Model) -> PassResult:
        shapes = LazyShapes(self.analyses, model)
        return PassResult(model, apply_rules(model, self.table, max_rewrites=self.max_rewrites,
                                             shapes=shapes, lift=True,
                                             effects=self.analyses.get("effects", model)) > 0)
