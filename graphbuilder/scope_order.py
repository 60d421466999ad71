"""Dependency order of the nodes of one graph or function body.

A node with subgraphs depends on the producers of its inputs and of every value
its bodies read from the enclosing scope (at any depth), so that a body is
inferred or run after what it captures.
"""
from __future__ import annotations

import heapq
from collections.abc import Iterator

from onnxforge.graphbuilder.ir import Function, Graph, Node
from onnxforge.proto_ext.errors import OnnxforgeError

__all__ = ["CycleError", "in_order", "in_order_throughout", "outer_producers", "topological_order"]


class CycleError(OnnxforgeError, ValueError):
    """A graph whose nodes depend on each other in a cycle."""


def outer_producers(node: Node, owner: Graph | Function) -> Iterator[Node]:
    """Producers in ``owner`` of the inputs of ``node`` and of values its subgraphs capture."""
    for v in node.inputs:
        if v is not None:
            p = v.producer()
            if p is not None and p.graph is owner:
                yield p
    for sg in node.subgraphs():
        for inner in sg.all_nodes():
            for v in inner.inputs:
                if v is not None:
                    p = v.producer()
                    if p is not None and p.graph is owner:
                        yield p
        for v in sg.outputs:
            p = v.producer()
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


def topological_order(g: Graph | Function) -> list[Node]:
    """Nodes of ``g`` so that producers come first (stable for an already sorted graph)."""
    nodes = list(g)
    if in_order(g):  # the usual case: passes keep the order
        return nodes
    position = {id(n): i for i, n in enumerate(nodes)}
    deps: dict[int, set[int]] = {}
    for i, n in enumerate(nodes):
        if n.attributes and n.subgraphs():
            d = {position[id(p)] for p in outer_producers(n, g)}
        else:  # no body: the producers of its inputs
            d = set()
            for v in n._inputs:
                p = v._producer if v is not None else None
                if p is not None and p.graph is g:
                    d.add(position[id(p)])
        deps[i] = d
    users: dict[int, list[int]] = {i: [] for i in range(len(nodes))}
    indeg = {i: len(d) for i, d in deps.items()}
    for i, d in deps.items():
        for j in d:
            users[j].append(i)
    ready = [i for i, k in indeg.items() if k == 0]
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
        stuck = [nodes[i] for i, k in indeg.items() if k > 0][:3]
        raise CycleError(f"{g.path()}: the graph has a cycle through {stuck}")
    return out
