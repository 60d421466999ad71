"""Storage facts of an IR model, read from the one alias resolution.

The IR, the shape inference, the passes and the backend ask the same questions
about in-place state; :class:`Storage` answers them for IR objects by building
the model's verification view once (``graphbuilder.ir.view``, O(N), no payload
read) and asking :class:`~onnxforge.proto_ext.aliasing.ModelAliases`, the
resolution that rules L1-L13 use. Nothing here defines an alias rule of its
own.

* ``root(v)``: the value owning ``v``'s storage (``v`` when it aliases nothing);
* ``version(v)``: how many in-place writes lie between ``root(v)`` and ``v``;
* ``writer(v)``: the node of ``v``'s own graph that writes ``v`` in place
  (consumes that version), or None;
* ``has_side_effects(n)``: writes storage in place, produces an aliased or bound
  output, or calls / owns code that does.

A Storage is a snapshot: it describes the model as it was when built. Nodes
added later are registered on first use; a pass that rewires values builds a
new one.

Example::

    st = Storage(model)
    u = CacheUpdate(cache, v, p)        st.root(u) is cache; st.version(u) == 1
                                        st.writer(cache) is the CacheUpdate node
"""
from __future__ import annotations

from collections.abc import Iterator

from onnxforge.graphbuilder.ir.core import Function, Graph, Model, Node, Value
from onnxforge.graphbuilder.ir.view import model_view, node_view
from onnxforge.proto_ext.aliasing import ModelAliases, Root, Scope, lookup
from onnxforge.proto_ext.view import GraphView, ModelView, NodeView

__all__ = ["Storage", "container_of", "declares_state"]

Container = Graph | Function


def container_of(v: Value) -> Container | None:
    """The graph or function body that defines ``v``."""
    p = v.producer()
    return p.graph if p is not None else v.graph


def _bodies(model: Model) -> Iterator[Container]:
    yield from model.graph.all_graphs()
    for f in model.functions.values():
        yield f
        yield from f.all_graphs()


def declares_state(model: Model) -> bool:
    """Whether anything in ``model`` can alias or write storage: a port alias, an
    ``alias_of``, a READ_WRITE input or a persistent binding (one walk, no allocation
    per node). Without any, every value owns its storage and no node has effects."""
    if model.graph.bindings:
        return True
    for c in _bodies(model):
        for v in c.inputs:
            if v.access or v.alias_of is not None:
                return True
        for v in c.outputs:
            if v.alias_of is not None:
                return True
        for n in c:
            if n.output_alias:
                return True
            for o in n._outputs:
                if o.alias_of is not None:
                    return True
    return False


_EMPTY_VIEW = ModelView(struct_types=[], graph=GraphView("graph", "", True, [], [], [], [], [], [], []))


class Storage:
    """Alias roots, storage versions, in-place writers and side effects of one IR model."""

    def __init__(self, model: Model):
        self.model = model
        self._foreign: set[int] = set()  # containers found in no rebuild (detached)
        self._build()

    def _build(self) -> None:
        self.stateless = not declares_state(self.model)
        self.aliases = ModelAliases(_EMPTY_VIEW if self.stateless else model_view(self.model))
        self._scopes: dict[int, Scope] = {}
        self._nodes: dict[Node, tuple[Scope, NodeView]] = {}
        self._names: dict[int, dict[str, Value]] = {}
        self._writers: dict[Value, Node] = {}
        for s in self.aliases.scopes:
            if s.ref is not None:
                self._scopes[id(s.ref)] = s
            for nv in s.nodes:
                if nv.ref is not None:
                    self._nodes[nv.ref] = (s, nv)
        for s in self.aliases.scopes:
            for nv in s.nodes:
                for w in self.aliases.writes(s, nv):
                    hit = lookup(s, w)
                    if hit is not None and hit[0] is s:
                        v = self._value(s, w)
                        if v is not None:
                            self._writers.setdefault(v, nv.ref)

    # -- mapping between the view and the IR ----------------------------------------

    def _scope(self, c: Container | None) -> Scope | None:
        if c is None or self.stateless:
            return None
        s = self._scopes.get(id(c))
        if s is None and id(c) not in self._foreign:
            self._build()  # a container made after this snapshot
            s = self._scopes.get(id(c))
            if s is None:
                self._foreign.add(id(c))
        return s

    def _value(self, s: Scope, name: str) -> Value | None:
        c = s.ref  # the IR container the view scope was built from
        if not isinstance(c, (Graph, Function)):
            return None
        names = self._names.get(id(c))
        if names is None:
            names = {}
            for v in c.inputs:
                names.setdefault(v.name, v)
            if isinstance(c, Graph):
                for v in c.all_initializers():
                    names.setdefault(v.name, v)
            for n in c:
                for o in n.outputs:
                    names.setdefault(o.name, o)
            self._names[id(c)] = names
        return names.get(name)

    def _root_of(self, v: Value) -> tuple[Scope, Root] | None:
        s = self._scope(container_of(v))
        if s is None or not v.name:
            return None
        if lookup(s, v.name) is None or self._value(s, v.name) is not v and v.graph is s.ref:
            self._build()  # a value made after this snapshot
            s = self._scope(container_of(v))
            if s is None:
                return None
        r = self.aliases.root(s, v.name)
        return None if r is None else (s, r)

    # -- questions ------------------------------------------------------------------

    def root(self, v: Value) -> Value:
        """The value owning ``v``'s storage (``v`` itself when it aliases nothing, or when
        the chain cannot be resolved: rules L2/L5/L10 report why)."""
        hit = self._root_of(v)
        if hit is None:
            return v
        got = self._value(hit[1].scope, hit[1].name)
        return v if got is None else got

    def is_aliased(self, v: Value) -> bool:
        return self.root(v) is not v

    def version(self, v: Value) -> int:
        """In-place writes between ``root(v)`` and ``v``: one per MUST_ALIAS port, call
        edge or aliased control-flow output on the chain (``alias_of`` restating a port
        adds none)."""
        s = self._scope(container_of(v))
        if s is None:
            return 0
        a, name, depth = self.aliases, v.name, 0
        seen: set[tuple[int, str]] = set()
        while True:
            hit = lookup(s, name)
            if hit is None or (id(hit[0]), name) in seen:
                return depth
            s, d = hit
            seen.add((id(s), name))
            port = s.ports.get(name) or a.call_edge(d)
            e = port if port is not None else s.declared.get(name)
            if e is not None:
                depth += port is not None
                name = e.target
            elif d.kind == "control":
                r = a.root(s, name)
                if r is None or (r.scope is s and r.name == name):
                    return depth
                depth += 1
                s, name = r.scope, r.name
            elif d.kind == "input" and d.outer and s.parent is not None:
                s, name = s.parent, d.outer
            else:
                return depth

    def writer(self, v: Value) -> Node | None:
        """The node of ``v``'s graph that writes ``v``'s storage in place, if any."""
        return self._writers.get(v)

    def writers(self) -> dict[Value, Node]:
        """Every written version mapped to the node that writes it."""
        return dict(self._writers)

    def _node(self, n: Node) -> tuple[Scope, NodeView] | None:
        hit = self._nodes.get(n)
        if hit is None:
            s = self._scope(n.graph)
            if s is None:
                return None
            hit = self._nodes.get(n)  # a rebuild may have found it
            if hit is None:
                nv = node_view(n, f"{s.path}.node({n.name!r})")
                self.aliases.add_node(s, nv)
                hit = (s, nv)
                self._nodes[n] = hit
        return hit

    def writes(self, n: Node) -> list[Value]:
        """The values whose storage ``n`` writes in place (visible in ``n``'s graph)."""
        hit = self._node(n)
        if hit is None:
            return []
        s, nv = hit
        out = []
        for w in self.aliases.writes(s, nv):
            found = lookup(s, w)
            v = self._value(found[0], w) if found is not None else None
            if v is not None:
                out.append(v)
        return out

    def has_side_effects(self, n: Node) -> bool:
        """``n`` writes in place, produces an aliased or bound output, or calls / owns
        code that does: never dead, never merged, never moved across a writer."""
        if self.stateless:
            if not n.output_alias:
                for o in n._outputs:
                    if o.alias_of is not None:
                        break
                else:
                    return False
            self._build()  # an aliasing node made after a stateless snapshot
        hit = self._node(n)
        if hit is None:
            return bool(n.output_alias)
        return self.aliases.has_side_effects(*hit)

    def function_has_side_effects(self, fn: Function) -> bool:
        f = next((f for (d, name), f in self.aliases.functions.items()
                  if d == fn.domain and name == fn.name), None)
        return f is not None and self.aliases.function_has_side_effects(f)
