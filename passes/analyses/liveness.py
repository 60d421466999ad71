"""Liveness: the schedule of a container, the last use of every value and the
values whose storage each step may release.

For one container (the main graph, a control-flow body or a local function
body), :func:`liveness` takes the container's node order as its schedule (the
IR keeps it topological) and computes:

* ``last_use[v]``: the index in ``order`` of the last step that reads ``v``
  (-1 when no step does). A node owning subgraphs reads, at its own step,
  every outer value its bodies read (at any depth) or return;
* ``storage[v]``: the value owning ``v``'s storage when ``v`` owns none:
  an output written in place (a MUST_ALIAS port, resolved by
  :class:`~onnxforge.passes.analyses.effects.Effects`) or a view (:func:`view_source`);
* ``release_after[i]``: the values whose storage may be released once step
  ``i`` has run. Storage is released once, after the last step that reads
  any value sharing it (a view keeps its source alive), and never when it is
  a container output, an initializer, a container input, an outer value, or
  state that outlives the run (its root is READ_WRITE or persistently bound,
  :meth:`Effects.is_state`). Unnamed outputs (optional outputs a node does not
  produce) own nothing and are never listed.

Views. The output of Identity, Reshape, Squeeze, Unsqueeze, Flatten, or Slice
whose ``steps`` are absent or constant ones, shares its first input's storage,
unless that input is a version some node later overwrites in place
(``Effects.writer(input)`` is set): such a snapshot is materialized into a
buffer of its own at its step (DESIGN.md, *Semantics of in-place writes*).
:func:`may_view` is this rule for one node, the one definition of views: the
backend's planner asks it (a view kernel at a node it rejects copies), so the
backend keeps exactly these views, and the memory plan counts them as zero.

Example::

    t = Relu(x); r = Reshape(t, s); y = Neg(r)     order = (Relu, Reshape, Neg)
    live = liveness(graph)                         live.last_use[t] == 1
                                                   live.storage[r] is t
                                                   live.release_after == ((), (), (t, r))

Linear in the size of the container and of the bodies it owns.
"""
from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from onnxforge.graphbuilder.ir.core import Function, Graph, Model, Node, Value
from onnxforge.graphbuilder.ir.scope_order import captured_values
from onnxforge.graphbuilder.ir.tensors import EncodedTensor
from onnxforge.passes.framework.analysis_manager import Analysis, AnalysisManager, register_analysis
from onnxforge.passes.analyses.effects import Effects, effect_analysis
from onnxforge.passes.framework.invariants import containers

__all__ = [
    "VIEW_OPS",
    "Liveness",
    "LivenessAnalysis",
    "ModelLiveness",
    "liveness",
    "may_view",
    "view_source",
]

Container = Graph | Function

VIEW_OPS = frozenset({"Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Slice"})
"""Default-domain operators whose output may share its first input's storage."""


@dataclass(frozen=True, slots=True, eq=False)
class Liveness:
    """Schedule, last uses, storage sharing and release lists of one container."""

    container: Container
    order: tuple[Node, ...]
    last_use: Mapping[Value, int]
    release_after: tuple[tuple[Value, ...], ...]
    storage: Mapping[Value, Value]

    def storage_of(self, v: Value) -> Value:
        """The value owning ``v``'s storage (``v`` itself when it owns it)."""
        return self.storage.get(v, v)

    def step_of(self, node: Node) -> int:
        """Index of ``node`` in :attr:`order` (O(N); plans build their own index)."""
        for i, n in enumerate(self.order):
            if n is node:
                return i
        raise KeyError(f"{node!r} is not a step of {self.container.path()}")


def _unit_steps(node: Node) -> bool:
    ins = node.inputs
    if len(ins) < 5 or ins[4] is None:
        return True
    c = ins[4].const
    if c is None or isinstance(c, EncodedTensor):
        return False
    try:
        return bool((c.numpy() == 1).all())
    except (ValueError, TypeError):
        return False


def may_view(node: Node) -> bool:
    """Whether ``node``'s only output may share its first input's storage: the one
    definition of views, which the backend's planner asks too. An output for which it
    is False is a buffer of its own in every backend (a kernel may copy where this
    allows a view, never the reverse)."""
    if node.op_type not in VIEW_OPS or node.domain not in ("", "ai.onnx"):
        return False
    if len(node.outputs) != 1 or not node.inputs or node.inputs[0] is None:
        return False
    return node.op_type != "Slice" or _unit_steps(node)


def view_source(node: Node, effects: Effects) -> Value | None:
    """The value whose storage ``node``'s only output views, or None when the output
    gets a buffer of its own (see the module docstring for the rule)."""
    if not may_view(node):
        return None
    src = node.inputs[0]
    if effects.writer(src) is not None:  # a snapshot of a version overwritten later
        return None
    return src


def _captured(g: Graph, memo: dict[Graph, tuple[Value, ...]]) -> tuple[Value, ...]:
    """:func:`~onnxforge.graphbuilder.ir.scope_order.captured_values` of ``g``, once per graph."""
    got = memo.get(g)
    if got is None:
        got = memo[g] = tuple(captured_values(g))
    return got


def _model_of(c: Container) -> Model:
    """A model around the main graph holding ``c`` (or around a function body), for the
    effect analysis when the caller gives none."""
    top: Container = c
    while isinstance(top, Graph) and top.parent is not None and top.parent.graph is not None:
        top = top.parent.graph
    if isinstance(top, Function):
        return Model(Graph("main"), functions={top.id: top})
    return Model(top)


def liveness(container: Container, effects: Effects | None = None, *,
             _memo: dict[Graph, tuple[Value, ...]] | None = None) -> Liveness:
    """The :class:`Liveness` of ``container`` (its node order is the schedule).

    ``effects``: the model's :class:`Effects`. When omitted they are computed for
    a model around the main graph holding ``container`` (or around the function
    body), which knows no other local function: give the model's effects when
    calls of local functions write in place."""
    fx = effect_analysis(_model_of(container)) if effects is None else effects
    memo = {} if _memo is None else _memo
    order = tuple(container)
    last_use: dict[Value, int] = {v: -1 for v in container.inputs}
    if isinstance(container, Graph):
        for v in container.all_initializers():
            last_use[v] = -1
    defined_at: dict[Value, int] = {}
    storage: dict[Value, Value] = {}
    for i, n in enumerate(order):
        for v in n.inputs:
            if v is not None:
                last_use[v] = i
        if n.attributes:
            for sg in n.subgraphs():
                for v in _captured(sg, memo):
                    last_use[v] = i
        view = view_source(n, fx)
        for k, o in enumerate(n.outputs):
            last_use.setdefault(o, -1)
            if not o.name:
                continue
            defined_at[o] = i
            root = fx.root(o)
            base = root if root is not o else (view if k == 0 else None)
            if base is not None:
                storage[o] = storage.get(base, base)
    release = _release_lists(container, order, last_use, defined_at, storage, fx)
    return Liveness(container, order, MappingProxyType(last_use), release, MappingProxyType(storage))


def _release_lists(container: Container, order: tuple[Node, ...], last_use: dict[Value, int],
                   defined_at: dict[Value, int], storage: dict[Value, Value],
                   fx: Effects) -> tuple[tuple[Value, ...], ...]:
    outputs = set(container.outputs)
    end: dict[Value, int] = {}
    members: dict[Value, list[Value]] = {}
    pinned: set[Value] = set()
    for o, i in defined_at.items():  # definition order
        s = storage.get(o, o)
        members.setdefault(s, []).append(o)
        end[s] = max(end.get(s, -1), i, last_use.get(o, -1))
        if o in outputs or fx.is_state(o):
            pinned.add(s)
    lists: list[list[Value]] = [[] for _ in order]
    for s, vals in members.items():
        if s in pinned or s not in defined_at or s in outputs or fx.is_state(s):
            continue  # returned, state, or storage this container does not own
        lists[end[s]].extend(vals)
    return tuple(tuple(x) for x in lists)


@dataclass(frozen=True, slots=True, eq=False)
class ModelLiveness:
    """The :class:`Liveness` of every container of a model."""

    model: Model
    by_container: Mapping[Container, Liveness]

    def of(self, container: Container) -> Liveness:
        try:
            return self.by_container[container]
        except KeyError:
            raise KeyError(f"{container!r} is not a container of this model") from None

    @property
    def main(self) -> Liveness:
        return self.by_container[self.model.graph]


@register_analysis
class LivenessAnalysis(Analysis[ModelLiveness]):
    """Liveness of the main graph, every control-flow body and every function body."""

    name = "liveness"

    def compute(self, model: Model, analyses: AnalysisManager) -> ModelLiveness:
        fx: Effects = analyses.get("effects", model)
        memo: dict[Graph, tuple[Value, ...]] = {}
        out = {c: liveness(c, fx, _memo=memo) for c in containers(model)}
        return ModelLiveness(model, MappingProxyType(out))

    def fingerprint(self, result: ModelLiveness) -> Hashable:
        """Per container: the schedule, the releases after each step, every last use and
        every storage owner."""
        return tuple(sorted((id(c), _liveness_key(live)) for c, live in result.by_container.items()))


def _liveness_key(live: Liveness) -> Hashable:
    return (tuple(id(n) for n in live.order),
            tuple(tuple(id(v) for v in step) for step in live.release_after),
            frozenset((id(v), i) for v, i in live.last_use.items()),
            frozenset((id(v), id(s)) for v, s in live.storage.items()))
