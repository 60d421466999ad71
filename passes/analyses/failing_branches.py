"""Constants that hold on every run that returns: the branch whose types make the model fail.

An ``If`` whose branches give an output different types (a rank, a dimension)
leaves the ``shapes`` analysis with their join, so whatever depends on that
type stays unknown. When the types of one branch make a later node of the same
graph fail (an operator given inputs it cannot take, in a node that runs
whenever the graph runs), every run that returns outputs took the other branch,
and what the analysis computes from the other branch's types holds on all of
them. :func:`branch_constants` finds those results; ``shape_folding`` folds
them like any other shape computation it knows.

torch.onnx exports ``squeeze(-1)`` of a dimension it cannot see as an ``If``,
and ``LSTMCell``'s "is the input batched" test as ``Size(Shape(v)) == 2``::

    v = If(Equal(Gather(Shape(x), -1), 1),     # x: [n, 128, t]
           then: Squeeze(x, [-1]),             # [n, 128]
           else: Identity(x))                  # [n, 128, t]
    b = Not(Equal(Size(Shape(v)), 2))          # unknown: v has rank 2 or 3
    u = If(b, then: Unsqueeze(v, [0]), else: Identity(v))
    y = LSTM(Unsqueeze(u, [0]), W, R, ...)     # X must be 3-D

With the else branch's type, ``b`` is True and X has rank 5, so the LSTM fails:
every run that returns took the then branch, where ``Size(Shape(v))`` is 2 and
``b`` is False. ``b`` becomes the constant False, ``If(b)`` gives way to its
else branch and the rank test goes; ``v``'s own ``If`` stays (it is what makes
a ``t != 1`` input fail).

Soundness:

* Only a rule's error counts, in a node that runs whenever its graph runs: one
  that the graph's outputs depend on or that has side effects (a dead node may
  be skipped at run time). An error in a loop body, in a branch of an ``If``
  whose condition is unknown or in a local function's body decides nothing
  (:class:`~onnxforge.graphbuilder.shapes.speculation.Undecided`); a known condition infers
  only the branch that runs. Declared value_info never makes a run fail.
* Constants are taken only after the ``If`` in its graph (bodies included), and
  only where the analysis without the assumption does not know the result.
* Inputs that fail still fail: with the constants in place of their nodes, the
  failing branch's types must still make a node fail, or nothing is folded.
* Outputs of an ``If`` that alias storage are left alone.
"""
from __future__ import annotations

from collections.abc import Callable, Container, Iterator
from functools import cached_property

import numpy as np
from onnxforge.graphbuilder.ir.core import Graph, Model, Node, Value
from onnxforge.graphbuilder.ir.scope_order import topological_order
from onnxforge.graphbuilder.shapes.context import ShapesContext
from onnxforge.graphbuilder.shapes.speculation import Undecided
from onnxforge.graphbuilder.shapes.symtensor import ShapeError, SymTensor
from onnxforge.graphbuilder.ir.tensors import Tensor
from onnxforge.passes.framework.domains import DEFAULT_DOMAINS
from onnxforge.passes.analyses.effects import Effects
from onnxforge.proto_ext.types import TensorType, Type

__all__ = ["branch_constants", "live_nodes"]

_TYPE_READERS = frozenset({"Shape", "Size"})
"""The operators whose results come from their input's type, not its contents: a known
result downstream of an ``If`` starts at one of them."""

Known = Callable[[ShapesContext, Node], "list[np.ndarray] | None"]


def live_nodes(model: Model, effects: Effects) -> frozenset[Node]:
    """The nodes that run whenever their graph runs: what the main graph's outputs depend
    on, side effects included, and the same in the bodies of those nodes."""
    live: set[Node] = set()
    _visit(model.graph, live, effects)
    return frozenset(live)


class _LiveNodes(Container[Node]):
    """Membership in :func:`live_nodes`, decided per node asked (a speculation asks only
    about the node that failed): forward from the node, through its readers, to an output
    or a side effect of its graph, and then the same for the node owning that graph."""

    def __init__(self, model: Model, effects: Effects):
        self._model, self._effects = model, effects
        self._known: dict[Node, bool] = {}

    def __contains__(self, node: object) -> bool:
        return isinstance(node, Node) and self._live(node)

    def _live(self, n: Node) -> bool:
        known = self._known
        hit = known.get(n)
        if hit is not None:
            return hit
        known[n] = False  # what is being decided (a graph is acyclic: never asked again)
        g = n.graph
        if g is self._model.graph:
            owner_live = True
        else:  # a body runs when its owner does; a function's body is never visited
            owner = g.parent if isinstance(g, Graph) else None
            owner_live = owner is not None and self._live(owner)
        live = owner_live and (self._effects.has_side_effects(n) or self._read(n, g))
        known[n] = live
        return live

    def _read(self, n: Node, g: Graph | object) -> bool:
        """An output of ``n`` is an output of ``g`` or is read by a live node (in ``g`` or
        in a body nested in it)."""
        for o in n._outputs:
            if isinstance(g, Graph) and g.is_output(o):
                return True
            for m, _i in o._uses:
                if self._live(m):
                    return True
        return False


def _visit(g: Graph, live: set[Node], effects: Effects) -> set[Value]:
    """Mark the live nodes of ``g`` (and of their bodies); return the values they read
    from outside ``g``."""
    outer: set[Value] = set()
    stack: list[Node] = [n for n in g if effects.has_side_effects(n)]
    for v in g.outputs:
        p = v.producer()
        if p is not None and p.graph is g:
            stack.append(p)
        else:
            outer.add(v)
    while stack:
        n = stack.pop()
        if n in live:
            continue
        live.add(n)
        reads = [v for v in n.inputs if v is not None]
        for sg in n.subgraphs() if n.attributes else ():
            reads.extend(_visit(sg, live, effects))
        for v in reads:
            p = v.producer()
            if p is not None and p.graph is g:
                stack.append(p)
            else:
                outer.add(v)
    return outer


def _graphs(ctx: ShapesContext, g: Graph) -> Iterator[Graph]:
    """``g`` and its bodies, but for the branch of an ``If`` that never runs."""
    yield g
    for n in g:
        if n.attributes:
            taken = ctx.condition_of(n) if n.op_type == "If" else None
            for sg in n.subgraphs() if taken is None else [n.attr("then_branch" if taken else "else_branch")]:
                if isinstance(sg, Graph):
                    yield from _graphs(ctx, sg)


def _nested(nodes: list[Node]) -> Iterator[Node]:
    """``nodes`` and the nodes of their bodies, at any depth."""
    for n in nodes:
        yield n
        if n.attributes:
            for sg in n.subgraphs():
                yield from sg.all_nodes()


def _made_by(nodes: list[Node]) -> Iterator[Value]:
    """Every value ``nodes`` produce, their bodies' inputs and values included."""
    for n in nodes:
        yield from n.outputs
        if n.attributes:
            for sg in n.subgraphs():
                yield from sg.inputs
                yield from _made_by(list(sg))


class _Cone:
    """What an assumption about the outputs of ``order[at]`` (an ``If``) can change: the
    nodes after it that read those outputs, directly or not, at any depth (``nodes``:
    these are inferred again; every other node keeps its result) and the values they make
    (``values``); ``cone`` is those of ``order`` in order. ``reads_type``: a ``Shape`` or
    ``Size`` reads one of the values (only then can a content become known)."""

    def __init__(self, order: list[Node], at: int):
        self.values: set[Value] = set(order[at].outputs)
        self.nodes: set[Node] = set()
        self.reads_type = False
        self.cone = [n for n in order[at + 1:] if self._spread(n)]

    @cached_property
    def kept(self) -> frozenset[Node]:
        """The nodes of the cone and of its bodies that read nothing the assumption changes
        (both branches' speculations keep their results)."""
        return frozenset(m for m in _nested(self.cone) if m not in self.nodes)

    def _spread(self, n: Node) -> bool:
        dirty = self.values
        touched = any(v in dirty for v in n.inputs if v is not None)
        if n.attributes and n.subgraphs():
            if n.op_type == "If":  # branches take no inputs: follow the values
                for sg in n.subgraphs():
                    for m in sg:
                        touched = self._spread(m) or touched
                    touched = touched or any(v in dirty for v in sg.outputs)
            else:  # a body's inputs and carried values derive from the node's inputs
                inner = list(_nested([m for sg in n.subgraphs() for m in sg]))
                if touched or any(v in dirty for m in inner for v in m.inputs if v is not None):
                    touched = True
                    self.nodes.update(inner)
                    dirty.update(_made_by([n]))
                    self.reads_type = self.reads_type or any(m.op_type in _TYPE_READERS for m in inner)
        if touched:
            if n.op_type in _TYPE_READERS and any(v in dirty for v in n.inputs if v is not None):
                self.reads_type = True
            dirty.update(n.outputs)
            self.nodes.add(n)
        return touched


def _branch_outputs(ctx: ShapesContext, node: Node, attr: str) -> tuple[list[Type], list[SymTensor | None]]:
    branch = node.attr(attr)
    return [ctx.type_of(o) for o in branch.outputs], [ctx.value_of(o) for o in branch.outputs]


def _candidate(ctx: ShapesContext, node: Node) -> bool:
    """An ``If`` whose condition is unknown and whose branches type an output differently."""
    if node.op_type != "If" or node.domain not in DEFAULT_DOMAINS or not node.inputs:
        return False
    then_g, else_g = node.attr("then_branch"), node.attr("else_branch")
    if not isinstance(then_g, Graph) or not isinstance(else_g, Graph):
        return False
    if len(then_g.outputs) != len(node.outputs) or len(else_g.outputs) != len(node.outputs):
        return False
    if ctx.condition_of(node) is not None:
        return False
    if any(ctx.alias_root(o) is not o for o in node.outputs):
        return False
    t_then = [ctx.type_of(o) for o in then_g.outputs]
    t_else = [ctx.type_of(o) for o in else_g.outputs]
    return t_then != t_else and all(isinstance(t, TensorType) for t in (*t_then, *t_else))


class _Speculation:
    """The types of one branch of ``order[at]`` (an ``If``) assumed for its outputs."""

    def __init__(self, ctx: ShapesContext, live: Container[Node], node: Node, cone: _Cone,
                 made: list[Value], attr: str):
        self.ctx, self.live, self.node, self.cone = ctx, live, node, cone
        self.types, self.values = _branch_outputs(ctx, node, attr)
        self.made = made
        self.kept = cone.kept

    def run(self, pins: dict[Node, list[np.ndarray]]) -> tuple[bool | None, ShapesContext]:
        """(True when a node that runs fails, False when none does, None when undecided;
        the context). Nodes in ``pins`` take those contents instead of being inferred."""
        pinned = {m: [SymTensor.of(Tensor.from_numpy(a).dtype, a) for a in arrays] for m, arrays in pins.items()}
        s = self.ctx.speculation(self.live, pinned, self.kept)
        node = self.node
        s.forget([*node.outputs, *self.made])
        try:
            for o, t, c in zip(node.outputs, self.types, self.values):
                if c is not None:
                    s.set_value(o, c, "speculation")
                else:
                    s.set_type(o, t, "speculation")
            for m in self.cone.cone:
                s.infer_node(m)
        except Undecided:
            return None, s
        except ShapeError:
            return True, s
        return False, s


def _aliased(ctx: ShapesContext, values: list[Value]) -> bool:
    return any(ctx.alias_root(v) is not v for v in values)


def branch_constants(model: Model, ctx: ShapesContext, effects: Effects, known: Known,
                     foldable: Callable[[Node], bool]) -> dict[Node, list[np.ndarray]]:
    """Nodes whose outputs have these contents on every run that returns outputs, found by
    the failing-branch argument of the module docstring.

    ``known(ctx, node)`` gives a node's exact output contents under a context (or None);
    ``foldable(node)`` says whether the caller would fold the node. Only foldable nodes
    whose contents ``ctx`` does not know are returned."""
    live = _LiveNodes(model, effects)
    pins: dict[Node, list[np.ndarray]] = {}
    failing: list[tuple[_Speculation, list[Node]]] = []
    for g in _graphs(ctx, model.graph):
        order: list[Node] | None = None
        for node in list(g):
            if not _candidate(ctx, node) or node.inputs[0].producer() in pins:
                continue  # (a condition found constant already: the If goes)
            if order is None:
                order = topological_order(g)
            cone = _Cone(order, order.index(node))
            if not cone.reads_type:
                continue  # no content after it can become known
            dirty = cone.values
            made = [v for v in dirty if v not in node.outputs]
            if _aliased(ctx, made):
                continue
            specs = [_Speculation(ctx, live, node, cone, made, a) for a in ("then_branch", "else_branch")]
            first, s_first = specs[0].run({})
            if first is None:
                continue
            second, s_second = specs[1].run({})
            if second is None or second == first:
                continue  # both run, both fail, or undecided
            s_ok, failing_spec = (s_second, specs[0]) if first else (s_first, specs[1])
            found: list[Node] = []
            for m in _nested(cone.cone):
                if m in pins or not any(o in dirty for o in m.outputs) or not foldable(m) \
                        or known(ctx, m) is not None:
                    continue
                got = known(s_ok, m)
                if got is not None:
                    pins[m] = got
                    found.append(m)
            if found:
                failing.append((failing_spec, found))
    # inputs that fail must still fail with every constant in place
    while failing:
        still = [sp.run(pins)[0] is True for sp, _found in failing]
        if all(still):
            break
        for (_sp, found), ok in zip(failing, still):
            if not ok:
                for m in found:
                    del pins[m]
        failing = [f for f, ok in zip(failing, still) if ok]
    return pins
