"""Dependency order of the nodes of one graph or function body, and the values a body
reads from the scopes around it.

This module is the IR's one definition of both facts; the passes, shape inference and
the backend all ask it:

* :func:`captured_values`: what a subgraph (or a body nested in it) reads or returns
  that is defined outside it. The backend feeds these to a sub-plan as extra inputs;
  liveness counts them as uses by the owning node.
* :func:`topological_order`: a node with subgraphs depends on the producers of its
  inputs and of every value its bodies capture (at any depth), so that a body is
  inferred or run after what it captures. The order is stable: among the nodes whose
  dependencies are placed, the one listed first goes next, and an already sorted body
  keeps its order. A caller adds ordering constraints of its own as extra predecessors
  (the sort pass adds "every reader of a version before its in-place writer", rule L13).
* :class:`CycleError`: the one error for a body that has no such order.
"""
from __future__ import annotations

import heapq
from collections.abc import Iterator, Mapping, Set

from onnxforge.graphbuilder.ir.core import Function, Graph, Node, Value
from onnxforge.proto_ext.errors import OnnxforgeError

__all__ = ["CycleError", "captured_reads", "captured_values", "in_order", "in_order_throughout",
           "outer_producers", "topological_order"]


class CycleError(OnnxforgeError, ValueError):
    """The nodes of a graph depend on each other in a cycle (no valid order exists)."""


def captured_reads(graph: Graph) -> Iterator[Value]:
    """Each read of a value defined outside ``graph`` by a node of ``graph`` or of a body
    nested in it, and each such value one of those graphs returns: graph by graph (depth
    first), a graph's node inputs in order and then its outputs; a value read twice comes
    twice (:func:`captured_values` lists each once)."""
    graphs = list(graph.all_graphs())
    inner = {id(g) for g in graphs}
    for g in graphs:
        for n in g:
            for v in n._inputs:
                if v is not None and (v.graph is None or id(v.graph) not in inner):
                    yield v
        for v in g.outputs:
            if v.graph is None or id(v.graph) not in inner:
                yield v


def captured_values(graph: Graph) -> list[Value]:
    """Values used inside ``graph`` (or its subgraphs) but defined outside it, each once,
    in the order of their first use (:func:`captured_reads`)."""
    seen: dict[int, Value] = {}
    for v in captured_reads(graph):
        if id(v) not in seen:
            seen[id(v)] = v
    return list(seen.values())


def outer_producers(node: Node, owner: Graph | Function) -> Iterator[Node]:
    """Producers in ``owner`` of the inputs of ``node`` and of values its subgraphs capture."""
    for v in node.inputs:
        if v is not None:
            p = v.producer()
            if p is not None and p.graph is owner:
                yield p
    for sg in node.subgraphs():
        for v in captured_reads(sg):
            p = v._producer
            if p is not None and p.graph is owner:
                yield p


def in_order_throughout(g: Graph | Function) -> bool:
    """Whether ``g`` and every graph nested in it are each in dependency order, so that
    :func:`topological_order` keeps each as it is; one walk of all of them. (A node is
    visited after its bodies, so a producer is "done" when it comes before the reader or
    before the node whose body holds the reader.)"""
    return _walk_in_order(g, set())


def _walk_in_order(g: Graph | Function, done: set[int]) -> bool:
    n = g._head
    while n is not None:
        for v in n._inputs:
            p = v._producer if v is not None else None
            if p is not None and id(p) not in done:
                return False
        if n.attributes:
            for sg in n.subgraphs():
                if not _walk_in_order(sg, done):
                    return False
                for v in sg.outputs:
                    p = v._producer
                    if p is not None and id(p) not in done:
                        return False
        done.add(id(n))
        n = n._next
    return True


def in_order(g: Graph | Function) -> bool:
    """Whether every node of ``g`` comes after the producers in ``g`` of what it reads
    and of what its bodies read (:func:`topological_order` then keeps ``g`` as it is)."""
    done: set[int] = set()
    for n in g:
        for v in n._inputs:
            p = v._producer if v is not None else None
            if p is not None and p.graph is g and id(p) not in done:
                return False
        if n.attributes and n.subgraphs():
            for p in outer_producers(n, g):
                if id(p) not in done:
                    return False
        done.add(id(n))
    return True


def topological_order(g: Graph | Function,
                      extra: Mapping[int, Set[int]] | None = None) -> list[Node]:
    """Nodes of ``g`` so that producers come first (stable for an already sorted graph).

    ``extra``: more predecessors, ``{id(node): {id(node that must come before it)}}``,
    all nodes of ``g``; given by a caller that orders storage (rule L13).
    :class:`CycleError` when no order satisfies every dependency."""
    nodes = list(g)
    if not extra and in_order(g):  # the usual case: passes keep the order
        return nodes
    position = {id(n): i for i, n in enumerate(nodes)}
    users: list[list[int]] = [[] for _ in nodes]
    indeg = [0] * len(nodes)
    for i, n in enumerate(nodes):
        if n.attributes and n.subgraphs():
            d = {position[id(p)] for p in outer_producers(n, g)}
        else:  # no body: the producers of its inputs
            d = set()
            for v in n._inputs:
                p = v._producer if v is not None else None
                if p is not None and p.graph is g:
                    d.add(position[id(p)])
        if extra:
            d.update(position[k] for k in extra.get(id(n), ()))
        indeg[i] = len(d)
        for j in d:
            users[j].append(i)
    ready = [i for i, k in enumerate(indeg) if k == 0]
    heapq.heapify(ready)
    out: list[Node] = []
    while ready:
        i = heapq.heappop(ready)
        out.append(nodes[i])
        for u in users[i]:
            indeg[u] -= 1
            if indeg[u] == 0:
                heapq.heappush(ready, u)
    if len(out) != len(nodes):
        stuck = [nodes[i] for i, k in enumerate(indeg) if k > 0]
        why = (" (data, or a reader of a version that depends on its in-place writer: rule L13)"
               if extra else "")
        shown = ", ".join(repr(n) for n in stuck[:5])
        raise CycleError(f"{g.path()}: {len(stuck)} node(s) depend on each other in a cycle"
                         f"{why}, e.g. {shown}")
    return out
