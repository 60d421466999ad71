"""Topological sort, stable and aware of in-place writes.

Nodes are reordered so that every value is defined before it is used, moving
as little as possible: a graph that is already sorted keeps its order exactly,
and otherwise, among the nodes whose dependencies are placed, the one that came
first in the original order goes next. Dependencies are

* data: the producers of a node's inputs, and of the outer values its
  subgraphs read;
* storage: a node reading a version of aliased storage (a READ_WRITE input
  written in place through MUST_ALIAS ports, also inside subgraphs) keeps its
  original side of every later writer of the same root. A node is never moved
  across a writer of the storage it reads.

A cycle raises :class:`CycleError` naming nodes on it.

Before / after::

    graph(x) -> z                     graph(x) -> z
      z = Neg(y)                        y = Relu(x)
      y = Relu(x)                       z = Neg(y)

Each graph, subgraph and function body is sorted on its own in O((N + E) log N);
an already sorted one is recognised in O(N + E).
"""
from __future__ import annotations

import heapq
import itertools

from onnxforge.errors import OnnxforgeError
from onnxforge.graphbuilder.ir import MUST_ALIAS, Function, Graph, Model, Node, Value
from onnxforge.passes.invariants import containers, owner_in
from onnxforge.passes.manager import Pass, PassResult, register_pass

__all__ = ["CycleError", "TopologicalSortPass", "topological_sort"]

Container = Graph | Function


class CycleError(OnnxforgeError, ValueError):
    """The nodes of a graph depend on each other in a cycle (no valid order exists)."""


def _aliased_outputs(node: Node, index: int) -> list[Value]:
    """Outputs of ``node`` that must alias its input ``index`` (new versions of that storage)."""
    return [node.outputs[a.output_index] for a in node.output_alias
            if a.kind == MUST_ALIAS and a.input_index == index and 0 <= a.output_index < len(node.outputs)]


def _has_writes(node: Node) -> bool:
    if any(a.kind == MUST_ALIAS for a in node.output_alias):
        return True
    if node.attributes:
        for sg in node.subgraphs():
            if any(_has_writes(n) for n in sg):
                return True
    return False


def _storage_edges(c: Container, position: dict[int, int], nodes: list[Node]) -> dict[int, set[int]]:
    """Extra predecessors (by node id) that keep every node in its original place
    relative to the writers of the storage it reads.

    The versions of one storage form a chain: the root (a READ_WRITE input) is
    version 0 and a node writing version k through a MUST_ALIAS port produces
    version k + 1. A node reading version k already follows the writers of
    versions <= k (data); against the later writers it keeps its original side.
    """
    roots: dict[int, Value] = {}
    for n in nodes:
        if not _has_writes(n):
            continue
        stack = [n]
        while stack:
            m = stack.pop()
            ins = m.inputs
            for a in m.output_alias:
                if a.kind == MUST_ALIAS and 0 <= a.input_index < len(ins) and ins[a.input_index] is not None:
                    r = ins[a.input_index].alias_root()
                    roots[id(r)] = r
            if m.attributes:
                for sg in m.subgraphs():
                    stack.extend(sg)
    extra: dict[int, set[int]] = {}
    for root in roots.values():
        writers: dict[int, tuple[int, Node]] = {}  # id(owner) -> (depth of the version it makes, owner)
        reads: list[tuple[Node, int]] = []  # (owner, depth of the version it reads)
        seen: set[int] = set()
        work: list[tuple[Value, int]] = [(root, 0)]
        while work:
            v, depth = work.pop()
            if id(v) in seen:
                continue
            seen.add(id(v))
            for user, i in v.uses():
                made = _aliased_outputs(user, i)
                owner = owner_in(user, c)
                for o in made:
                    work.append((o, depth + 1))
                if owner is None:
                    continue
                if made:
                    old = writers.get(id(owner))
                    if old is None or old[0] < depth + 1:
                        writers[id(owner)] = (depth + 1, owner)
                else:
                    reads.append((owner, depth))
        chain = sorted(writers.values(), key=lambda dw: (dw[0], position[id(dw[1])]))
        for (d1, w1), (d2, w2) in itertools.pairwise(chain):
            if d1 == d2:  # two writers of one version: keep their original order
                extra.setdefault(id(w2), set()).add(id(w1))
        for owner, depth in reads:
            later = [w for d, w in chain if d > depth and w is not owner]
            pos = position[id(owner)]
            prev: Node | None = None
            for w in later:
                if position[id(w)] > pos:
                    extra.setdefault(id(w), set()).add(id(owner))
                    break
                prev = w
            if prev is not None:
                extra.setdefault(id(owner), set()).add(id(prev))
    return extra


def _outer_reads(node: Node) -> list[Value]:
    out: list[Value] = []
    for sg in node.subgraphs():
        for inner in sg.all_nodes():
            out.extend(v for v in inner.inputs if v is not None)
    return out


def _is_sorted(c: Container) -> bool:
    """Every node reads only values defined before it (in ``c`` or outside)."""
    seen: set[int] = set()
    for n in c:
        for v in n.inputs:
            if v is not None:
                p = v.producer()
                if p is not None and p.graph is c and id(p) not in seen:
                    return False
        if n.attributes:
            for v in _outer_reads(n):
                p = v.producer()
                if p is not None and p.graph is c and id(p) not in seen:
                    return False
        seen.add(id(n))
    return True


def _sort(c: Container) -> bool:
    # Storage constraints come from the original order, so a list that already
    # respects every data dependency satisfies them too: nothing moves.
    if _is_sorted(c):
        return False
    nodes = list(c)
    position = {id(n): k for k, n in enumerate(nodes)}
    extra = _storage_edges(c, position, nodes)
    by_id = {id(n): n for n in nodes}
    succs: dict[int, list[Node]] = {}
    indegree: dict[int, int] = {}
    for n in nodes:
        preds: set[int] = set(extra.get(id(n), ()))
        reads = [v for v in n.inputs if v is not None]
        if n.attributes:
            reads.extend(_outer_reads(n))
        for v in reads:
            p = v.producer()
            if p is None:
                continue
            if p.graph is not c:
                p = owner_in(p, c)
                if p is None:
                    continue
            if p is not n:
                preds.add(id(p))
        preds.discard(id(n))
        indegree[id(n)] = len(preds)
        for q in preds:
            succs.setdefault(q, []).append(n)
    ready = [(position[id(n)], id(n)) for n in nodes if not indegree[id(n)]]
    heapq.heapify(ready)
    order: list[Node] = []
    while ready:
        _, key = heapq.heappop(ready)
        n = by_id[key]
        order.append(n)
        for s in succs.get(key, ()):
            indegree[id(s)] -= 1
            if not indegree[id(s)]:
                heapq.heappush(ready, (position[id(s)], id(s)))
    if len(order) != len(nodes):
        stuck = [n for n in nodes if indegree[id(n)]]
        shown = ", ".join(repr(n) for n in stuck[:5])
        raise CycleError(f"{c.path()}: {len(stuck)} node(s) depend on each other in a cycle "
                         f"(data or storage order), e.g. {shown}")
    c.reorder(order)
    return True


def topological_sort(model: Model) -> bool:
    """Sort every graph, subgraph and function body; True if any order changed."""
    changed = False
    for c in list(containers(model)):
        changed = _sort(c) or changed
    return changed


@register_pass
class TopologicalSortPass(Pass):
    """Stable topological sort respecting in-place writes (see the module docstring)."""

    name = "topological_sort"

    def call(self, model: Model) -> PassResult:
        return PassResult(model, topological_sort(model))
