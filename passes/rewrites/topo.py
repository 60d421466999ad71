"""Topological sort, stable and aware of in-place writes.

Nodes are reordered so that every value is defined before it is used, moving
as little as possible: a graph that is already sorted keeps its order exactly,
and otherwise, among the nodes whose dependencies are placed, the one that came
first in the original order goes next. Dependencies are

* data: the producers of a node's inputs, and of the outer values its
  subgraphs read;
* storage: every reader of a version of in-place storage (a READ_WRITE input
  written through MUST_ALIAS ports, local-function calls or subgraphs) runs
  before the node that writes that version (rule L13). A graph where a reader
  depends on its writer has no such order: :class:`CycleError`.

The data order, the sort itself and :class:`CycleError` (raised naming nodes on a
cycle, re-exported here) are the IR's, in :mod:`onnxforge.graphbuilder.ir.scope_order`;
this pass adds the storage edges and reorders the bodies.

Before / after::

    graph(x) -> z                     graph(x) -> z
      z = Neg(y)                        y = Relu(x)
      y = Relu(x)                       z = Neg(y)

Each graph, subgraph and function body is sorted on its own in O((N + E) log N);
an already sorted one is recognised in O(N + E).
"""
from __future__ import annotations

from onnxforge.graphbuilder.ir.core import Function, Graph, Model, Node
from onnxforge.graphbuilder.ir.scope_order import CycleError, in_order, in_order_throughout, topological_order
from onnxforge.graphbuilder.ir.storage import Storage
from onnxforge.passes.framework.invariants import containers, owner_in
from onnxforge.passes.framework.pass_manager import ALL, Pass, PassResult, register_pass

__all__ = ["CycleError", "TopologicalSortPass", "schedule", "topological_sort"]

Container = Graph | Function


def _storage_edges(c: Container, storage: Storage) -> dict[int, set[int]]:
    """Extra predecessors (by node id): every reader of a version written in place
    runs before the node that writes it (DESIGN.md, *Semantics of in-place writes*).

    The readers of ``v`` are the nodes of ``c`` that read it directly or through a
    subgraph; a second writer of ``v`` is not a reader (rule L9 rejects it)."""
    extra: dict[int, set[int]] = {}
    if storage.stateless:  # nothing is written in place
        return extra
    for n in c:
        for v in storage.writes(n):
            for user, _i in v.uses():
                owner = owner_in(user, c)
                if owner is None or owner is n or v in storage.writes(owner):
                    continue
                extra.setdefault(id(n), set()).add(id(owner))
    return extra


def schedule(c: Container, storage: Storage) -> list[Node]:
    """The order the sort gives ``c`` (data dependencies, and every reader of a version
    before its in-place writer; stable), without reordering anything. The backend
    schedules its plans with it. The IR's order
    (:func:`~onnxforge.graphbuilder.ir.scope_order.topological_order`) with the storage
    edges added."""
    return topological_order(c, _storage_edges(c, storage))


def _sort(c: Container, storage: Storage) -> bool:
    extra = _storage_edges(c, storage)
    if not extra and in_order(c):
        return False
    order = topological_order(c, extra)
    if all(a is b for a, b in zip(order, c)):
        return False
    c.reorder(order)
    return True


def topological_sort(model: Model, *, storage: Storage | None = None) -> bool:
    """Sort every graph, subgraph and function body; True if any order changed.
    ``storage``: the model's current :class:`~onnxforge.graphbuilder.ir.storage.Storage` (or
    :class:`~onnxforge.passes.analyses.effects.Effects`) when the caller has it (default: built
    here)."""
    changed = False
    if storage is None:
        storage = Storage(model)
    if storage.stateless and in_order_throughout(model.graph) and all(
            in_order_throughout(f) for f in model.functions.values()):
        return False  # the usual case, recognised in one walk of every graph
    for c in list(containers(model)):
        changed = _sort(c, storage) or changed
    return changed


@register_pass
class TopologicalSortPass(Pass):
    """Stable topological sort respecting in-place writes (see the module docstring)."""

    name = "topological_sort"
    # a new order: schedules change, and inference numbers its fresh symbols in it
    invalidates = ALL
    preserves = ()
    declares_storage = False

    def call(self, model: Model) -> PassResult:
        return PassResult(model, topological_sort(model, storage=self.analyses.get("effects", model)))
