"""Rule L13 of RULES.md: in-place writes must be observationally equal to
functional execution (DESIGN.md, *Semantics of in-place writes*).

A node W that writes the storage of value ``v`` in place (a MUST_ALIAS port, a
call of a local function with an aliased output, or code in its subgraphs that
writes ``v``) consumes the version ``v``. Every other reader of ``v`` (an input,
a subgraph capture, a call argument) must be schedulable before W, and ``v``
is no output of its graph. Values computed from ``v`` (views included) are
distinct values and may be read after W: they mean the pre-write contents.

Check, per graph, subgraph and function body, in O(N + E): add to the data
dependencies an edge ``R -> W`` for every reader R of a version W writes, and
require the result to be acyclic. A reader that depends on its writer closes a
cycle; so do readers that can only run in place all together if each ran
before the other's writer. Only when a cycle exists are the offending pairs
searched for, to name them in the message.

Example (valid)::

    s1 = ReduceSum(cache)           # reads version 0 before the write
    y  = Identity(cache)            # a distinct value holding version 0
    u  = CacheUpdate(cache, v, p)   # writes version 0 in place
    z  = Add(y, ReduceSum(u))       # y means version 0

Invalid: ``z = Add(cache, ReduceSum(u))`` (a reader of ``cache`` depends on the
write), or ``cache`` listed as a graph output.
"""
from __future__ import annotations

from collections import deque

from onnxforge.proto_ext.aliasing import ModelAliases, Scope
from onnxforge.proto_ext.verify.alias_rules import declares_aliases, model_aliases
from onnxforge.proto_ext.verify.core import Report, register
from onnxforge.proto_ext.view import ModelView

__all__ = ["check_inplace"]


@register("inplace")
def check_inplace(view: ModelView, report: Report) -> None:
    """L13 over every scope of the model."""
    if not declares_aliases(view, report):
        return  # nothing is written in place
    a = model_aliases(view, report)  # L1/L2 are reported by the alias rules
    for s in a.scopes:
        _check_scope(a, s, report)


def _check_scope(a: ModelAliases, s: Scope, report: Report) -> None:
    nodes = s.nodes
    writes = [a.writes(s, n) for n in nodes]
    if not any(writes):
        return
    index = {id(n): k for k, n in enumerate(nodes)}
    producer: dict[str, int] = {}
    for name, d in s.defs.items():
        if d.node is not None and id(d.node) in index:
            producer[name] = index[id(d.node)]
    reads = [a.reads(s, n) for n in nodes]
    readers: dict[str, list[int]] = {}
    for k, names in enumerate(reads):
        for name in dict.fromkeys(names):
            readers.setdefault(name, []).append(k)
    outputs = set(s.outputs)
    preds: list[set[int]] = [set() for _ in nodes]
    for k, names in enumerate(reads):
        for name in names:
            p = producer.get(name)
            if p is not None and p != k:
                preds[k].add(p)
    data = [set(p) for p in preds]
    for k, written in enumerate(writes):
        for v in written:
            if v in outputs:
                report.add("L13", f"{s.path}.output[{v!r}]",
                           f"{v!r} is written in place by {nodes[k].path}, so it cannot also be an "
                           f"output of {s.path}: output the new version instead")
            for r in readers.get(v, ()):
                if r != k and v not in writes[r]:  # two writers of one version: rule L9
                    preds[k].add(r)
    if _acyclic(preds):
        return
    _explain(a, s, writes, readers, data, report)


def _acyclic(preds: list[set[int]]) -> bool:
    indegree = [len(p) for p in preds]
    succs: list[list[int]] = [[] for _ in preds]
    for k, ps in enumerate(preds):
        for p in ps:
            succs[p].append(k)
    ready = deque(k for k, d in enumerate(indegree) if d == 0)
    done = 0
    while ready:
        k = ready.popleft()
        done += 1
        for q in succs[k]:
            indegree[q] -= 1
            if indegree[q] == 0:
                ready.append(q)
    return done == len(preds)


def _explain(a: ModelAliases, s: Scope, writes: list[tuple[str, ...]], readers: dict[str, list[int]],
             data: list[set[int]], report: Report) -> None:
    """Name each reader that depends on the writer of the version it reads (only
    reached when the scope is invalid, so its cost does not matter)."""
    nodes = s.nodes
    succs: list[list[int]] = [[] for _ in nodes]
    for k, ps in enumerate(data):
        for p in ps:
            succs[p].append(k)
    found = False
    for w, names in enumerate(writes):
        if not names:
            continue
        reached = {w}
        work = [w]
        while work:
            for q in succs[work.pop()]:
                if q not in reached:
                    reached.add(q)
                    work.append(q)
        for v in names:
            for r in readers.get(v, ()):
                if r != w and r in reached and v not in writes[r]:
                    found = True
                    report.add("L13", nodes[r].path,
                               f"reads {v!r}, which {nodes[w].path} writes in place, but depends on "
                               f"that write's result: no schedule runs it before the write; read a "
                               f"value computed from {v!r} before the write, or the new version")
    if not found:
        pending = [nodes[w].path for w, names in enumerate(writes) if names]
        report.add("L13", s.path,
                   "the readers of the versions written in place cannot all run before their "
                   "writers (each waits for another write): " + ", ".join(pending[:6]))
