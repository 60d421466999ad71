"""The rewrite engine: one fixed-point driver for every rule table, and the ``rewrite`` pass.

:func:`apply_rules` drives a table (of :mod:`onnxforge.passes.rewrites.patterns`) to a
fixed point with a worklist: after a rewrite, the new nodes and the consumers of the
replacing values are looked at again. More than ``max_rewrites`` rewrites (default 10
per node plus 1000) means the rules do not terminate:
:class:`~onnxforge.passes.rewrites.patterns.RewriteError` names the rules that fired
most. Nodes with side effects are never matched, inside or at the root of a pattern.
A replacement node goes right before the root; the root and the matched nodes nobody
else uses are removed; a root output that is a graph output hands its name, type,
alias and binding over (or the rule is declined).

Before / after with :data:`~onnxforge.passes.rewrites.default_rules.DEFAULT_RULES`
(the table of the ``rewrite`` pass, :class:`RewritePass`)::

    a = Transpose(x, perm=[1, 0])
    b = Transpose(a, perm=[1, 0])           y = Neg(x)
    c = Mul(b, one)      # one = 1.0
    m = Max(c, c)
    y = Neg(m)
"""
from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable
from functools import cache, partial
from typing import Any

import numpy as np

from onnxforge.graphbuilder.ir.core import Function, Graph, Model, Node, Value
from onnxforge.graphbuilder.shapes.context import ShapesContext
from onnxforge.passes.analyses.effects import Effects, effect_analysis
from onnxforge.passes.framework.domains import canonical_domain
from onnxforge.passes.framework.invariants import containers
from onnxforge.passes.framework.pass_manager import ALL, Pass, PassResult, check_int_option, register_pass
from onnxforge.passes.rewrites.default_rules import DEFAULT_RULES
from onnxforge.passes.rewrites.fold import constant_value, lift_constants
from onnxforge.passes.rewrites.patterns import Capture, Const, Match, Pattern, RewriteError, Rule, RuleTable
from onnxforge.passes.rewrites.rename import NameScope, can_replace, erase_node, replace_value
from onnxforge.passes.rewrites.shape_fold import LazyShapes

__all__ = ["RewritePass", "apply_rules"]

Container = Graph | Function


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
    """Apply ``table`` (default
    :data:`~onnxforge.passes.rewrites.default_rules.DEFAULT_RULES`) everywhere until no
    rule applies.

    ``shapes`` (the ``shapes`` analysis of ``model`` before rewriting) answers the
    rules' :meth:`~onnxforge.passes.rewrites.patterns.Match.type_of` /
    :meth:`~onnxforge.passes.rewrites.patterns.Match.shape_of`; values made by the rules
    fall back to their ``Value.type``. With ``lift``, the ``Constant`` nodes the rules
    made in graphs become initializers. Returns the number of rewrites; raises
    :class:`~onnxforge.passes.rewrites.patterns.RewriteError` past ``max_rewrites``
    (default: 10 per node of the model plus 1000).
    ``effects``: the model's current :class:`~onnxforge.passes.analyses.effects.Effects`
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



@register_pass
class RewritePass(Pass):
    """Apply a :class:`RuleTable` (default :data:`DEFAULT_RULES`) to a fixed point.

    Before / after: ``b = Transpose(Transpose(x, [1, 0]), [1, 0]); y = Mul(b, 1)``
    becomes ``y = x`` (the uses of ``y`` read ``x``).
    """

    name = "rewrite"
    invalidates = ALL
    preserves = ()
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
