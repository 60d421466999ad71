"""Alias resolution over the read-only model view, defined once.

Every consumer of alias facts reads them from here: the static rules L1-L13
(``proto_ext.verify``), the IR (``graphbuilder.ir.storage``), the passes and the
backend. The resolution works on the narrow view of ``proto_ext.view`` that
both an extended ``ModelProto`` and the IR provide.

Alias model. In every graph and local function, a value may alias another one
through an edge: a node's ``output_alias`` entry (port edge), a call of a local
function whose output k aliases its formal input j (call edge), or a value's
``alias_of`` (declared edge). Following edges, across scopes where a subgraph
names an outer value, ends at a *root*. Two more hops make roots exact:

* a Loop body's carried input (a Scan body's state input) stands for the node's
  matching input, so a chain that reaches it continues in the outer graph;
* an If/Loop/Scan output whose branches all alias one root resolves to it.

Writes. A node *writes* a value ``v`` of its scope (consumes that version of
the storage, DESIGN.md *Semantics of in-place writes*) when a MUST_ALIAS port
or a call edge aliases one of its outputs to ``v``, or when code in one of its
subgraphs writes ``v`` (a captured outer value, or the owner's input that a
Loop-carried / Scan-state body input stands for). :meth:`ModelAliases.writes`
lists them; :meth:`ModelAliases.has_side_effects` is the one effect analysis.

Example (the stateful cache)::

    graph input  cache: FLOAT[2, 16, 8]  access: READ_WRITE
    node[0]      upd = ai.onnxforge.CacheUpdate(cache, values, position)
                 output_alias {output_index: 0, input_index: 0, kind: MUST_ALIAS}
    graph output upd: FLOAT[2, 16, 8]    alias_of: "cache"
    persistent_bindings: cache <- upd

    a = ModelAliases(view)
    a.root(a.main, "upd").name == "cache";  a.writes(a.main, node[0]) == ["cache"]
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from onnxforge.proto_ext.schema import MUST_ALIAS, READ_WRITE
from onnxforge.proto_ext.types import Type
from onnxforge.proto_ext.view import AliasSpec, FunctionView, GraphView, ModelView, NodeView, ValueSpec

__all__ = [
    "CONTROL_FLOW",
    "STANDARD_DOMAINS",
    "Def",
    "Edge",
    "ModelAliases",
    "Root",
    "Scope",
    "branch_index",
    "is_control_flow",
    "lookup",
    "root_text",
    "rw_root",
    "type_of",
]

STANDARD_DOMAINS = ("", "ai.onnx")
CONTROL_FLOW = {"If": ("then_branch", "else_branch"), "Loop": ("body",), "Scan": ("body",)}


class Sink(Protocol):
    """Where rule violations found while resolving go (a ``verify.core.Report``)."""

    def add(self, rule: str, path: str, message: str) -> None: ...


class _Discard:
    def add(self, rule: str, path: str, message: str) -> None:
        pass


def _value_specs(g: GraphView):
    for kind, specs in (("input", g.inputs), ("output", g.outputs), ("value_info", g.value_infos)):
        for v in specs:
            yield kind, v



@dataclass(slots=True)
class Def:
    """How a name is defined in its scope."""

    kind: str  # input | formal | initializer | constant | output | control
    access: int = 0
    node: NodeView | None = None
    port: int = -1
    outer: str = ""  # a Loop-carried / Scan-state body input: the owner's matching input


@dataclass(slots=True)
class Edge:
    target: str
    path: str


@dataclass(slots=True, eq=False)
class Scope:
    """A graph or local function, with the facts the alias rules need."""

    path: str
    kind: str  # main | graph | function
    parent: Scope | None
    nodes: list[NodeView]
    outputs: list[str]
    defs: dict[str, Def] = field(default_factory=dict)
    types: dict[str, Type] = field(default_factory=dict)
    specs: dict[str, list[tuple[str, str, ValueSpec]]] = field(default_factory=dict)
    ports: dict[str, Edge] = field(default_factory=dict)
    declared: dict[str, Edge] = field(default_factory=dict)
    subs: dict[int, list[tuple[str, Scope]]] = field(default_factory=dict)
    ints: dict[str, tuple[int, ...]] = field(default_factory=dict)
    bound: frozenset[str] = frozenset()  # outputs that feed a persistent binding (main graph)
    ref: object = None  # the object the view was built from (an IR Graph / Function), if any


@dataclass(frozen=True, slots=True, eq=False)
class Root:
    scope: Scope
    name: str
    d: Def

    @property
    def key(self) -> tuple[int, str]:
        return id(self.scope), self.name


_PLAIN = object()  # a control-flow output none of whose branches alias
_AMBIGUOUS = object()  # branches alias different roots, or only some branches alias


def lookup(s: Scope | None, name: str) -> tuple[Scope, Def] | None:
    while s is not None:
        d = s.defs.get(name)
        if d is not None:
            return s, d
        s = s.parent
    return None


def type_of(s: Scope | None, name: str) -> Type:
    while s is not None:
        t = s.types.get(name)
        if t is not None:
            return t
        s = s.parent
    return None


def is_control_flow(node: NodeView) -> bool:
    return node.op_type in CONTROL_FLOW and node.domain in STANDARD_DOMAINS


def scan_states(node: NodeView) -> int:
    """Number of state variables of a Scan node (inputs before the scanned ones)."""
    scanned = node.attributes.get("num_scan_inputs", 0)
    return len(node.inputs) - (scanned if isinstance(scanned, int) else 0)


def branch_index(node: NodeView, k: int) -> int | None:
    """Index of the branch/body output that feeds the node's output ``k``."""
    if node.op_type == "If":
        return k
    if node.op_type == "Loop":
        return k + 1 if k < len(node.inputs) - 2 else None
    return k if k < scan_states(node) else None


def outer_input(owner: NodeView | None, i: int) -> str:
    """The owner's input that a body input ``i`` stands for (Loop carried, Scan state)."""
    if owner is None or not is_control_flow(owner):
        return ""
    if owner.op_type == "Loop" and 2 <= i < len(owner.inputs):
        return owner.inputs[i]
    if owner.op_type == "Scan" and i < scan_states(owner):
        return owner.inputs[i]
    return ""


class ModelAliases:
    """Scopes, edges and roots of one model; reports L1 and L2 while building."""

    def __init__(self, view: ModelView, report: Sink | None = None):
        self.report: Sink = _Discard() if report is None else report
        self.functions: dict[tuple[str, str], FunctionView] = {}
        for f in view.functions:
            self.functions.setdefault((f.domain, f.name), f)
        self.valid: dict[int, list[tuple[int, AliasSpec]]] = {}
        self.scopes: list[Scope] = []
        self.fscopes: dict[tuple[str, str], Scope] = {}
        self._fmaps: dict[tuple[str, str], dict[int, int] | None] = {}
        self._fwrites: dict[tuple[str, str], frozenset[int]] = {}
        self._feffects: dict[tuple[str, str], bool] = {}
        self._writes: dict[int, tuple[str, ...]] = {}
        self._free: dict[int, frozenset[str]] = {}
        self.main = self._graph_scope(view.graph, None, None)
        for f in view.functions:
            self.fscopes.setdefault((f.domain, f.name), self._function_scope(f))

    # -- building

    def _graph_scope(self, g: GraphView, parent: Scope | None, owner: NodeView | None) -> Scope:
        s = Scope(g.path, "main" if parent is None else "graph", parent, g.nodes,
                  [v.name for v in g.outputs], ints=dict(g.int_values),
                  bound=frozenset(o for _i, o in g.bindings), ref=g.ref)
        self.scopes.append(s)
        for i, v in enumerate(g.inputs):
            s.defs.setdefault(v.name, Def("input", v.access, outer=outer_input(owner, i)))
        for name in (*g.initializers, *g.sparse_initializers, *(e.name for e in g.encoded)):
            if name:
                s.defs[name] = Def("initializer")
        for v in g.inputs:
            s.ints.pop(v.name, None)  # an initializer that is also an input is only a default
        for kind, v in _value_specs(g):
            self._add_spec(s, kind, f"{g.path}.{kind}[{v.name!r}]", v)
        self._add_nodes(s)
        self._declared_edges(s)
        return s

    def _function_scope(self, f: FunctionView) -> Scope:
        s = Scope(f.path, "function", None, f.nodes, list(f.outputs), ref=f.ref)
        self.scopes.append(s)
        access: dict[str, int] = {}
        for v in f.value_infos:
            access.setdefault(v.name, v.access)
        for name in f.inputs:
            s.defs.setdefault(name, Def("formal", access.get(name, 0)))
        for v in f.value_infos:
            kind = "input" if v.name in f.inputs else "value_info"
            self._add_spec(s, kind, f"{f.path}.value_info[{v.name!r}]", v)
        self._add_nodes(s)
        self._declared_edges(s)
        return s

    def _add_spec(self, s: Scope, kind: str, path: str, v: ValueSpec) -> None:
        s.specs.setdefault(v.name, []).append((kind, path, v))
        if v.type is not None:
            s.types.setdefault(v.name, v.type)

    def _add_nodes(self, s: Scope) -> None:
        for node in s.nodes:
            self._add_node(s, node)

    def _add_node(self, s: Scope, node: NodeView) -> None:
        if node.subgraphs:
            s.subs[id(node)] = [(attr, self._graph_scope(sub, s, node)) for attr, sub in node.subgraphs]
        if node.op_type == "Constant" and node.domain in STANDARD_DOMAINS:
            kind = "constant"
            for key in ("value_int", "value_ints"):
                if key in node.attributes and node.outputs:
                    value = node.attributes[key]
                    s.ints.setdefault(node.outputs[0], value if isinstance(value, tuple) else (value,))
        else:
            kind = "control" if is_control_flow(node) else "output"
        for k, name in enumerate(node.outputs):
            if name:
                s.defs.setdefault(name, Def(kind, node=node, port=k))
        for idx, a in self._output_alias(node):
            s.ports.setdefault(node.outputs[a.output_index],
                               Edge(node.inputs[a.input_index], f"{node.path}.output_alias[{idx}]"))

    def add_node(self, s: Scope, node: NodeView) -> None:
        """Register ``node``, made after this resolution was built, in scope ``s`` (its
        outputs, ports and subgraphs), so that every question can be asked about it."""
        if any(n is node for n in s.nodes):
            return
        s.nodes.append(node)
        self._add_node(s, node)

    def _output_alias(self, node: NodeView) -> list[tuple[int, AliasSpec]]:
        # L1: in-range, non-empty ports, MUST_ALIAS, no repeated index.
        valid: list[tuple[int, AliasSpec]] = []
        outs: set[int] = set()
        ins: set[int] = set()
        for idx, a in enumerate(node.output_alias):
            problems = []
            if a.kind != MUST_ALIAS:
                problems.append(f"kind is {a.kind}, not MUST_ALIAS (1)")
            for what, index, ports in (("output", a.output_index, node.outputs),
                                       ("input", a.input_index, node.inputs)):
                if not 0 <= index < len(ports):
                    problems.append(f"{what}_index {index} is out of range [0, {len(ports)})")
                elif not ports[index]:
                    problems.append(f"{what} {index} is empty")
            if a.output_index in outs:
                problems.append(f"output_index {a.output_index} repeats")
            if a.input_index in ins:
                problems.append(f"input_index {a.input_index} repeats")
            outs.add(a.output_index)
            ins.add(a.input_index)
            if problems:
                self.report.add("L1", f"{node.path}.output_alias[{idx}]", "; ".join(problems))
            else:
                valid.append((idx, a))
        self.valid[id(node)] = valid
        return valid

    def _declared_edges(self, s: Scope) -> None:
        # L2: alias_of names another visible value, never on a graph input or initializer.
        for name, specs in s.specs.items():
            for kind, path, v in specs:
                if not v.alias_of:
                    continue
                where = f"{path}.alias_of"
                d = s.defs.get(name)
                if kind == "input":
                    self.report.add("L2", where, f"alias_of is set on input {name!r}")
                elif d is not None and d.kind == "initializer":
                    self.report.add("L2", where, f"alias_of is set on initializer {name!r}")
                elif v.alias_of == name:
                    self.report.add("L2", where, f"{name!r} names itself")
                elif lookup(s, v.alias_of) is None:
                    self.report.add("L2", where, f"{v.alias_of!r} names no value visible in scope")
                elif d is not None:
                    s.declared.setdefault(name, Edge(v.alias_of, where))

    # -- edges and roots

    def function_aliases(self, f: FunctionView) -> dict[int, int]:
        """{output k: formal input j} for each output of ``f`` whose chain ends at input j."""
        key = (f.domain, f.name)
        if key in self._fmaps:
            return self._fmaps[key] or {}
        self._fmaps[key] = None  # a recursive call sees no alias while this one resolves
        s = self.fscopes.get(key)
        out: dict[int, int] = {}
        for k, name in enumerate(f.outputs):
            hit = lookup(s, name) if s is not None else None
            if hit is None or self.edge(s, name, hit[1]) is None:
                continue
            r = self.root(s, name)
            if r is not None and r.scope is s and r.d.kind == "formal":
                out[k] = f.inputs.index(r.name)
        self._fmaps[key] = out
        return out

    def call_edge(self, d: Def) -> Edge | None:
        f = self.functions.get((d.node.domain, d.node.op_type)) if d.kind == "output" else None
        j = self.function_aliases(f).get(d.port) if f is not None else None
        if j is None or j >= len(d.node.inputs) or not d.node.inputs[j]:
            return None
        return Edge(d.node.inputs[j], f"{d.node.path} (call of {d.node.domain}::{d.node.op_type})")

    def edges(self, s: Scope, name: str, d: Def) -> list[Edge]:
        """Every alias edge out of ``name``: port, call, declared (in that priority)."""
        found = [s.ports.get(name), self.call_edge(d), s.declared.get(name)]
        return [e for e in found if e is not None]

    def edge(self, s: Scope, name: str, d: Def) -> Edge | None:
        e = s.ports.get(name) or self.call_edge(d)
        return e if e is not None else s.declared.get(name)

    def root(self, s: Scope, name: str, seen: set[tuple[int, str]] | None = None) -> Root | None:
        """Where the alias chain from ``name`` ends; None when it cannot be resolved
        (unknown name, cycle, or branches that disagree)."""
        seen = set() if seen is None else seen
        while True:
            hit = lookup(s, name)
            if hit is None:
                return None
            s, d = hit
            if (id(s), name) in seen:
                return None
            seen.add((id(s), name))
            e = self.edge(s, name, d)
            if e is not None:
                name = e.target
                continue
            if d.kind == "control":
                r = self.control_root(s, d, seen)
                if r is _AMBIGUOUS:
                    return None
                if isinstance(r, Root):
                    return r
            elif d.kind == "input" and d.outer and s.parent is not None:
                s, name = s.parent, d.outer
                continue
            return Root(s, name, d)

    def branch_roots(self, s: Scope, node: NodeView, k: int,
                     seen: set[tuple[int, str]]) -> list[tuple[str, Scope, str, bool, Root | None]]:
        """(attribute, branch, output name, aliased, root) of each branch for output ``k``."""
        idx = branch_index(node, k)
        out: list[tuple[str, Scope, str, bool, Root | None]] = []
        if idx is None:
            return out
        wanted = CONTROL_FLOW[node.op_type]
        for attr, b in s.subs.get(id(node), ()):
            if attr not in wanted or idx >= len(b.outputs):
                continue
            name = b.outputs[idx]
            aliased = self.aliased(b, name, seen)
            out.append((attr, b, name, aliased, self.root(b, name, set(seen)) if aliased else None))
        return out

    def aliased(self, b: Scope, name: str, seen: set[tuple[int, str]]) -> bool:
        """Whether ``name``, defined in ``b`` itself, aliases something."""
        d = b.defs.get(name)
        if d is None:
            return False  # an outer value passed through is not an alias
        if self.edge(b, name, d) is not None:
            return True
        if d.kind == "control" and (id(b), name) not in seen:
            return self.control_root(b, d, seen | {(id(b), name)}) is not _PLAIN
        return False

    def control_root(self, s: Scope, d: Def, seen: set[tuple[int, str]]) -> object:
        entries = self.branch_roots(s, d.node, d.port, seen)
        if not any(e[3] for e in entries):
            return _PLAIN
        roots = [e[4] for e in entries]
        if not all(e[3] for e in entries) or any(r is None for r in roots):
            return _AMBIGUOUS
        return roots[0] if len({r.key for r in roots}) == 1 else _AMBIGUOUS


    # -- writes, reads and effects

    def writes(self, s: Scope, node: NodeView) -> tuple[str, ...]:
        """Names, visible in ``s``, whose storage ``node`` writes in place: the aliased
        inputs of its MUST_ALIAS ports, the arguments of a called local function's
        written or aliased formals, and what code in its subgraphs writes outside them
        (captured values; the node's input that a Loop-carried or Scan-state body input
        stands for)."""
        key = id(node)
        got = self._writes.get(key)
        if got is None:
            self._writes[key] = ()  # a recursive call writes nothing more
            got = tuple(dict.fromkeys(self._node_writes(s, node)))
            self._writes[key] = got
        return got

    def _node_writes(self, s: Scope, node: NodeView):
        for _idx, al in self.valid.get(id(node), ()):
            yield node.inputs[al.input_index]
        f = self.functions.get((node.domain, node.op_type))
        if f is not None:
            for j in sorted(self.function_writes(f)):
                if j < len(node.inputs) and node.inputs[j]:
                    yield node.inputs[j]
        for _attr, b in s.subs.get(id(node), ()):
            for m in b.nodes:
                for w in self.writes(b, m):
                    d = b.defs.get(w)
                    if d is None:
                        yield w  # an outer value, captured and written
                    elif d.kind == "input" and d.outer:
                        yield d.outer

    def function_writes(self, f: FunctionView) -> frozenset[int]:
        """Indices of the formal inputs of ``f`` whose storage a call writes (or returns
        aliased): a call consumes the versions it passes there."""
        key = (f.domain, f.name)
        got = self._fwrites.get(key)
        if got is not None:
            return got
        self._fwrites[key] = frozenset()  # recursion guard
        s = self.fscopes.get(key)
        out = set(self.function_aliases(f).values())
        if s is not None:
            for m in s.nodes:
                for w in self.writes(s, m):
                    r = self.root(s, w)
                    if r is not None and r.scope is s and r.d.kind == "formal" and r.name in f.inputs:
                        out.add(f.inputs.index(r.name))
        got = frozenset(out)
        self._fwrites[key] = got
        return got

    def free_names(self, b: Scope) -> frozenset[str]:
        """Names that code in ``b`` (nested subgraphs included) reads from outside ``b``."""
        got = self._free.get(id(b))
        if got is None:
            names: set[str] = set(b.outputs)
            for m in b.nodes:
                names.update(n for n in m.inputs if n)
                for _attr, sb in b.subs.get(id(m), ()):
                    names |= self.free_names(sb)
            got = frozenset(n for n in names if n not in b.defs)
            self._free[id(b)] = got
        return got

    def reads(self, s: Scope, node: NodeView) -> list[str]:
        """Every name of an outer or this scope that ``node`` reads: its inputs and the
        values its subgraphs capture."""
        out = [n for n in node.inputs if n]
        for _attr, b in s.subs.get(id(node), ()):
            out.extend(self.free_names(b))
        return out

    def has_side_effects(self, s: Scope, node: NodeView) -> bool:
        """The one effect analysis: ``node`` writes storage in place, produces an output
        that is aliased (``alias_of``) or bound, calls a local function with side
        effects, or owns a subgraph that has some. Such a node is never dead, never
        merged, never moved across another writer of the same storage."""
        if self.writes(s, node):
            return True
        for o in node.outputs:
            if o and (o in s.declared or o in s.bound):
                return True
        f = self.functions.get((node.domain, node.op_type))
        if f is not None and self.function_has_side_effects(f):
            return True
        for _attr, b in s.subs.get(id(node), ()):
            if any(self.has_side_effects(b, m) for m in b.nodes):
                return True
        return False

    def function_has_side_effects(self, f: FunctionView) -> bool:
        """A READ_WRITE formal, a written or aliased formal, or a body node with effects."""
        key = (f.domain, f.name)
        got = self._feffects.get(key)
        if got is not None:
            return got
        self._feffects[key] = False  # recursion guard: a cycle adds no effect
        s = self.fscopes.get(key)
        got = bool(self.function_writes(f)) or (s is not None and (
            any(d.kind == "formal" and d.access == READ_WRITE for d in s.defs.values())
            or any(o in s.declared for o in s.outputs)
            or any(self.has_side_effects(s, m) for m in s.nodes)))
        self._feffects[key] = got
        return got


def rw_root(r: Root) -> bool:
    if r.d.access != READ_WRITE:
        return False
    return (r.d.kind == "input" and r.scope.kind == "main") or r.d.kind == "formal"


def root_text(r: Root) -> str:
    d = r.d
    if d.kind == "input":
        if r.scope.kind == "main":
            return f"READ_ONLY main-graph input {r.name!r}"
        return f"input {r.name!r} of subgraph {r.scope.path}"
    if d.kind == "formal":
        return f"READ_ONLY formal input {r.name!r} of {r.scope.path}"
    if d.kind == "initializer":
        return f"initializer {r.name!r}"
    if d.kind == "constant":
        return f"{r.name!r}, the output of Constant node {d.node.path}"
    if d.kind == "control":
        return f"{r.name!r}, an output of {d.node.path} that no branch aliases"
    return f"{r.name!r}, a plain output of {d.node.path}"
