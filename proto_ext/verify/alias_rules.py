"""Alias and access rules of RULES.md (L1-L12).

Alias model. In every graph and local function, a value may alias another one
through an edge: a node's ``output_alias`` entry (port edge), a call of a local
function whose output k aliases its formal input j (call edge), or a value's
``alias_of`` (declared edge). Following edges, across scopes where a subgraph
names an outer value, ends at a *root*. Two more hops make roots exact:

* a Loop body's carried input (a Scan body's state input) stands for the node's
  matching input, so a chain that reaches it continues in the outer graph;
* an If/Loop/Scan output whose branches all alias one root resolves to it.

Example (the stateful cache; every rule holds)::

    graph input  cache: FLOAT[2, 16, 8]  access: READ_WRITE
    node[0]      upd = ai.onnxforge.CacheUpdate(cache, values, position)
                 output_alias {output_index: 0, input_index: 0, kind: MUST_ALIAS}
    graph output upd: FLOAT[2, 16, 8]    alias_of: "cache"
    persistent_bindings: cache <- upd

``upd`` -> ``cache`` is one chain; its root is a main-graph READ_WRITE input (L7).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from onnx import TensorProto

from onnxforge.proto_ext.schema import MUST_ALIAS, READ_WRITE
from onnxforge.proto_ext.typecompat import compatible, type_case
from onnxforge.proto_ext.types import TensorType, Type, type_name
from onnxforge.proto_ext.verify.core import Report, register
from onnxforge.proto_ext.verify.graph_rules import _CONTROL_FLOW, _STANDARD, _value_specs
from onnxforge.proto_ext.view import (
    AliasSpec,
    FunctionView,
    GraphView,
    ModelView,
    NodeView,
    ValueSpec,
)

__all__ = ["CACHE_UPDATE_DOMAIN", "CACHE_UPDATE_TYPES", "check_aliases"]

CACHE_UPDATE_DOMAIN = "ai.onnxforge"
CACHE_UPDATE_TYPES = frozenset({TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16,
                                TensorProto.INT8, TensorProto.UINT8})

# ------------------------------------------------------------------------- aliases


@dataclass(slots=True)
class _Def:
    """How a name is defined in its scope."""

    kind: str  # input | formal | initializer | constant | output | control
    access: int = 0
    node: NodeView | None = None
    port: int = -1
    outer: str = ""  # a Loop-carried / Scan-state body input: the owner's matching input


@dataclass(slots=True)
class _Edge:
    target: str
    path: str


@dataclass(slots=True, eq=False)
class _Scope:
    """A graph or local function, with the facts the alias rules need."""

    path: str
    kind: str  # main | graph | function
    parent: _Scope | None
    nodes: list[NodeView]
    outputs: list[str]
    defs: dict[str, _Def] = field(default_factory=dict)
    types: dict[str, Type] = field(default_factory=dict)
    specs: dict[str, list[tuple[str, str, ValueSpec]]] = field(default_factory=dict)
    ports: dict[str, _Edge] = field(default_factory=dict)
    declared: dict[str, _Edge] = field(default_factory=dict)
    subs: dict[int, list[tuple[str, _Scope]]] = field(default_factory=dict)
    ints: dict[str, tuple[int, ...]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, eq=False)
class _Root:
    scope: _Scope
    name: str
    d: _Def

    @property
    def key(self) -> tuple[int, str]:
        return id(self.scope), self.name


_PLAIN = object()  # a control-flow output none of whose branches alias
_AMBIGUOUS = object()  # branches alias different roots, or only some branches alias


def _lookup(s: _Scope | None, name: str) -> tuple[_Scope, _Def] | None:
    while s is not None:
        d = s.defs.get(name)
        if d is not None:
            return s, d
        s = s.parent
    return None


def _type_of(s: _Scope | None, name: str) -> Type:
    while s is not None:
        t = s.types.get(name)
        if t is not None:
            return t
        s = s.parent
    return None


def _is_control_flow(node: NodeView) -> bool:
    return node.op_type in _CONTROL_FLOW and node.domain in _STANDARD


def _scan_states(node: NodeView) -> int:
    """Number of state variables of a Scan node (inputs before the scanned ones)."""
    scanned = node.attributes.get("num_scan_inputs", 0)
    return len(node.inputs) - (scanned if isinstance(scanned, int) else 0)


def _branch_index(node: NodeView, k: int) -> int | None:
    """Index of the branch/body output that feeds the node's output ``k``."""
    if node.op_type == "If":
        return k
    if node.op_type == "Loop":
        return k + 1 if k < len(node.inputs) - 2 else None
    return k if k < _scan_states(node) else None


def _outer_input(owner: NodeView | None, i: int) -> str:
    """The owner's input that a body input ``i`` stands for (Loop carried, Scan state)."""
    if owner is None or not _is_control_flow(owner):
        return ""
    if owner.op_type == "Loop" and 2 <= i < len(owner.inputs):
        return owner.inputs[i]
    if owner.op_type == "Scan" and i < _scan_states(owner):
        return owner.inputs[i]
    return ""


class _Aliases:
    """Scopes, edges and roots of one model; reports L1 and L2 while building."""

    def __init__(self, view: ModelView, report: Report):
        self.report = report
        self.functions: dict[tuple[str, str], FunctionView] = {}
        for f in view.functions:
            self.functions.setdefault((f.domain, f.name), f)
        self.valid: dict[int, list[tuple[int, AliasSpec]]] = {}
        self.scopes: list[_Scope] = []
        self.fscopes: dict[tuple[str, str], _Scope] = {}
        self._fmaps: dict[tuple[str, str], dict[int, int] | None] = {}
        self._graph_scope(view.graph, None, None)
        for f in view.functions:
            self.fscopes.setdefault((f.domain, f.name), self._function_scope(f))

    # -- building

    def _graph_scope(self, g: GraphView, parent: _Scope | None, owner: NodeView | None) -> _Scope:
        s = _Scope(g.path, "main" if parent is None else "graph", parent, g.nodes,
                   [v.name for v in g.outputs], ints=dict(g.int_values))
        self.scopes.append(s)
        for i, v in enumerate(g.inputs):
            s.defs.setdefault(v.name, _Def("input", v.access, outer=_outer_input(owner, i)))
        for name in (*g.initializers, *g.sparse_initializers, *(e.name for e in g.encoded)):
            if name:
                s.defs[name] = _Def("initializer")
        for v in g.inputs:
            s.ints.pop(v.name, None)  # an initializer that is also an input is only a default
        for kind, v in _value_specs(g):
            self._add_spec(s, kind, f"{g.path}.{kind}[{v.name!r}]", v)
        self._add_nodes(s)
        self._declared_edges(s)
        return s

    def _function_scope(self, f: FunctionView) -> _Scope:
        s = _Scope(f.path, "function", None, f.nodes, list(f.outputs))
        self.scopes.append(s)
        access = {}
        for v in f.value_infos:
            access.setdefault(v.name, v.access)
        for name in f.inputs:
            s.defs.setdefault(name, _Def("formal", access.get(name, 0)))
        for v in f.value_infos:
            kind = "input" if v.name in f.inputs else "value_info"
            self._add_spec(s, kind, f"{f.path}.value_info[{v.name!r}]", v)
        self._add_nodes(s)
        self._declared_edges(s)
        return s

    def _add_spec(self, s: _Scope, kind: str, path: str, v: ValueSpec) -> None:
        s.specs.setdefault(v.name, []).append((kind, path, v))
        if v.type is not None:
            s.types.setdefault(v.name, v.type)

    def _add_nodes(self, s: _Scope) -> None:
        for node in s.nodes:
            if node.subgraphs:
                s.subs[id(node)] = [(attr, self._graph_scope(sub, s, node)) for attr, sub in node.subgraphs]
            if node.op_type == "Constant" and node.domain in _STANDARD:
                kind = "constant"
                for key in ("value_int", "value_ints"):
                    if key in node.attributes and node.outputs:
                        value = node.attributes[key]
                        s.ints.setdefault(node.outputs[0], value if isinstance(value, tuple) else (value,))
            else:
                kind = "control" if _is_control_flow(node) else "output"
            for k, name in enumerate(node.outputs):
                if name:
                    s.defs.setdefault(name, _Def(kind, node=node, port=k))
            for idx, a in self._output_alias(node):
                s.ports.setdefault(node.outputs[a.output_index],
                                   _Edge(node.inputs[a.input_index], f"{node.path}.output_alias[{idx}]"))

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

    def _declared_edges(self, s: _Scope) -> None:
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
                elif _lookup(s, v.alias_of) is None:
                    self.report.add("L2", where, f"{v.alias_of!r} names no value visible in scope")
                elif d is not None:
                    s.declared.setdefault(name, _Edge(v.alias_of, where))

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
            hit = _lookup(s, name) if s is not None else None
            if hit is None or self.edge(s, name, hit[1]) is None:
                continue
            r = self.root(s, name)
            if r is not None and r.scope is s and r.d.kind == "formal":
                out[k] = f.inputs.index(r.name)
        self._fmaps[key] = out
        return out

    def call_edge(self, d: _Def) -> _Edge | None:
        f = self.functions.get((d.node.domain, d.node.op_type)) if d.kind == "output" else None
        j = self.function_aliases(f).get(d.port) if f is not None else None
        if j is None or j >= len(d.node.inputs) or not d.node.inputs[j]:
            return None
        return _Edge(d.node.inputs[j], f"{d.node.path} (call of {d.node.domain}::{d.node.op_type})")

    def edges(self, s: _Scope, name: str, d: _Def) -> list[_Edge]:
        """Every alias edge out of ``name``: port, call, declared (in that priority)."""
        found = [s.ports.get(name), self.call_edge(d), s.declared.get(name)]
        return [e for e in found if e is not None]

    def edge(self, s: _Scope, name: str, d: _Def) -> _Edge | None:
        e = s.ports.get(name) or self.call_edge(d)
        return e if e is not None else s.declared.get(name)

    def root(self, s: _Scope, name: str, seen: set[tuple[int, str]] | None = None) -> _Root | None:
        """Where the alias chain from ``name`` ends; None when it cannot be resolved
        (unknown name, cycle, or branches that disagree)."""
        seen = set() if seen is None else seen
        while True:
            hit = _lookup(s, name)
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
                if isinstance(r, _Root):
                    return r
            elif d.kind == "input" and d.outer and s.parent is not None:
                s, name = s.parent, d.outer
                continue
            return _Root(s, name, d)

    def branch_roots(self, s: _Scope, node: NodeView, k: int,
                     seen: set[tuple[int, str]]) -> list[tuple[str, _Scope, str, bool, _Root | None]]:
        """(attribute, branch, output name, aliased, root) of each branch for output ``k``."""
        idx = _branch_index(node, k)
        out = []
        if idx is None:
            return out
        wanted = _CONTROL_FLOW[node.op_type]
        for attr, b in s.subs.get(id(node), ()):
            if attr not in wanted or idx >= len(b.outputs):
                continue
            name = b.outputs[idx]
            aliased = self.aliased(b, name, seen)
            out.append((attr, b, name, aliased, self.root(b, name, set(seen)) if aliased else None))
        return out

    def aliased(self, b: _Scope, name: str, seen: set[tuple[int, str]]) -> bool:
        """Whether ``name``, defined in ``b`` itself, aliases something."""
        d = b.defs.get(name)
        if d is None:
            return False  # an outer value passed through is not an alias
        if self.edge(b, name, d) is not None:
            return True
        if d.kind == "control" and (id(b), name) not in seen:
            return self.control_root(b, d, seen | {(id(b), name)}) is not _PLAIN
        return False

    def control_root(self, s: _Scope, d: _Def, seen: set[tuple[int, str]]) -> object:
        entries = self.branch_roots(s, d.node, d.port, seen)
        if not any(e[3] for e in entries):
            return _PLAIN
        roots = [e[4] for e in entries]
        if not all(e[3] for e in entries) or any(r is None for r in roots):
            return _AMBIGUOUS
        return roots[0] if len({r.key for r in roots}) == 1 else _AMBIGUOUS


def _rw_root(r: _Root) -> bool:
    if r.d.access != READ_WRITE:
        return False
    return (r.d.kind == "input" and r.scope.kind == "main") or r.d.kind == "formal"


def _root_text(r: _Root) -> str:
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


@register("aliases")
def check_aliases(view: ModelView, report: Report) -> None:
    """L1-L12: output_alias / alias_of / access annotations and CacheUpdate."""
    a = _Aliases(view, report)  # reports L1 and L2
    for s in a.scopes:
        _port_agreement(a, s, report)
        _cycles(a, s, report)
        _alias_types(a, s, report)
        _chains(a, s, report)
        _access(s, report)
        _single_writer(a, s, report)
        for node in s.nodes:
            if _is_control_flow(node):
                _control_flow(a, s, node, report)
            if (node.domain, node.op_type) in a.functions:
                _call(a, s, node, report)
            if node.domain == CACHE_UPDATE_DOMAIN and node.op_type == "CacheUpdate":
                _cache_update(a, s, node, report)


def _port_agreement(a: _Aliases, s: _Scope, report: Report) -> None:
    # L3: output_alias and alias_of name the same input; L4: aliased outputs say so.
    for node in s.nodes:
        for idx, al in a.valid.get(id(node), ()):
            out, target = node.outputs[al.output_index], node.inputs[al.input_index]
            specs = s.specs.get(out, ())
            for _kind, path, v in specs:
                if v.alias_of and v.alias_of != target:
                    report.add("L3", f"{path}.alias_of",
                               f"alias_of {v.alias_of!r} disagrees with {node.path}.output_alias[{idx}], "
                               f"which aliases {out!r} to input {al.input_index} ({target!r})")
            carrier = "value_info" if s.kind == "function" else "output"
            if out in s.outputs and not any(v.alias_of for kind, _p, v in specs if kind == carrier):
                report.add("L4", f"{s.path}.output[{out!r}]",
                           f"output {out!r} comes from MUST_ALIAS port {node.path}.output_alias[{idx}] "
                           f"and must carry alias_of {target!r}")


def _cycles(a: _Aliases, s: _Scope, report: Report) -> None:
    # L5: alias edges among the scope's own names form no cycle.
    succ: dict[str, list[_Edge]] = {}
    for name, d in s.defs.items():
        local = [e for e in a.edges(s, name, d) if e.target in s.defs and e.target != name]
        if local:
            succ[name] = local
    state: dict[str, int] = {}
    for start in succ:
        if start in state:
            continue
        state[start] = 1
        trail = [start]
        stack = [iter(succ[start])]
        while stack:
            e = next(stack[-1], None)
            if e is None:
                state[trail.pop()] = 2
                stack.pop()
                continue
            seen = state.get(e.target)
            if seen is None:
                state[e.target] = 1
                trail.append(e.target)
                stack.append(iter(succ.get(e.target, ())))
            elif seen == 1:
                cycle = trail[trail.index(e.target):] + [e.target]
                report.add("L5", e.path, "alias cycle " + " -> ".join(map(repr, cycle)))


def _alias_types(a: _Aliases, s: _Scope, report: Report) -> None:
    # L6: an aliased output is compatible with its input.
    for name, d in s.defs.items():
        done: set[str] = set()
        for e in a.edges(s, name, d):
            if e.target in done:
                continue
            done.add(e.target)
            ta, tb = _type_of(s, name), _type_of(s, e.target)
            if ta is None or tb is None:
                continue
            reason = compatible(ta, tb)
            if reason is not None:
                report.add("L6", e.path, f"{name!r} ({ta}) aliases {e.target!r} ({tb}) but the "
                                         f"types are not compatible ({reason})")


def _chains(a: _Aliases, s: _Scope, report: Report) -> None:
    # L7: every chain ends at a READ_WRITE main-graph input (in a function: formal input).
    reported: set[tuple[int, str]] = set()
    for name, d in s.defs.items():
        e = a.edge(s, name, d)
        if e is None:
            continue
        r = a.root(s, name)
        if r is None or _rw_root(r) or r.key in reported:
            continue
        reported.add(r.key)
        want = "a READ_WRITE formal input" if s.kind == "function" else "a main-graph READ_WRITE input"
        report.add("L7", e.path, f"the alias chain from {name!r} ends at {_root_text(r)}, not at {want}")


def _access(s: _Scope, report: Report) -> None:
    # L8: READ_WRITE only on main-graph inputs and formal inputs, none an initializer.
    for name, specs in s.specs.items():
        for kind, path, v in specs:
            if v.access != READ_WRITE:
                continue
            d = s.defs.get(name)
            if s.kind == "main" and kind == "input" and d is not None and d.kind == "initializer":
                report.add("L8", f"{path}.access", f"READ_WRITE input {name!r} is named like an initializer")
            elif kind != "input" or s.kind == "graph":
                report.add("L8", f"{path}.access", f"READ_WRITE on {kind} {name!r} of {s.path}: only "
                                                   f"main-graph inputs and local-function formal inputs "
                                                   f"may be READ_WRITE")


def _single_writer(a: _Aliases, s: _Scope, report: Report) -> None:
    # L9: a value is the aliased input of at most one MUST_ALIAS port in its graph.
    first: dict[str, str] = {}
    for node in s.nodes:
        for idx, al in a.valid.get(id(node), ()):
            name, path = node.inputs[al.input_index], f"{node.path}.output_alias[{idx}]"
            if name in first:
                report.add("L9", path, f"{name!r} is already the aliased input of {first[name]}")
            else:
                first[name] = path


def _control_flow(a: _Aliases, s: _Scope, node: NodeView, report: Report) -> None:
    # L10: an aliased control-flow output resolves to one root in every branch.
    for k, out in enumerate(node.outputs):
        if not out:
            continue
        entries = a.branch_roots(s, node, k, set())
        d = s.defs.get(out)
        own = a.edge(s, out, d) if d is not None and d.node is node else None
        if not entries or not (own is not None or any(e[3] for e in entries)):
            continue
        roots: list[tuple[str, _Root | None]] = [(f"{b.path}.output[{name!r}]", r)
                                                 for _attr, b, name, aliased, r in entries if aliased]
        plain = [f"{b.path}.output[{name!r}]" for _attr, b, name, aliased, _r in entries if not aliased]
        if own is not None:
            roots.append((own.path, a.root(s, out)))
        if any(r is None for _where, r in roots):
            continue  # an unresolvable chain is reported by L2/L5/L10 elsewhere
        keys = {r.key for _where, r in roots}
        if plain or len(keys) > 1:
            parts = [f"{where} -> {r.name!r}" for where, r in roots] + [f"{where} aliases nothing"
                                                                       for where in plain]
            report.add("L10", f"{node.path}.output[{k}]",
                       f"aliased output {out!r} must resolve to one root in every branch: " + "; ".join(parts))


def _call(a: _Aliases, s: _Scope, node: NodeView, report: Report) -> None:
    # L11: call sites agree with the function's aliases and READ_WRITE formals.
    f = a.functions[(node.domain, node.op_type)]
    fmap = a.function_aliases(f)
    declared = {al.output_index: (idx, al.input_index) for idx, al in a.valid.get(id(node), ())}
    fname = f"{f.domain}::{f.name}"
    for k, j in fmap.items():
        if k >= len(node.outputs) or not node.outputs[k] or j >= len(node.inputs):
            continue
        have = declared.get(k)
        if have is None:
            report.add("L11", f"{node.path}.output_alias",
                       f"{fname} output {k} aliases its input {j}; the call needs output_alias "
                       f"{{output_index: {k}, input_index: {j}, kind: MUST_ALIAS}}")
        elif have[1] != j:
            report.add("L11", f"{node.path}.output_alias[{have[0]}]",
                       f"aliases output {k} to input {have[1]}, but {fname} aliases it to input {j}")
    for k, (idx, j) in declared.items():
        if k not in fmap:
            report.add("L11", f"{node.path}.output_alias[{idx}]",
                       f"aliases output {k} to input {j}, but output {k} of {fname} aliases no input")
    formals = a.fscopes[(f.domain, f.name)].defs
    for j, formal in enumerate(f.inputs):
        if formals[formal].access != READ_WRITE or j >= len(node.inputs) or not node.inputs[j]:
            continue
        r = a.root(s, node.inputs[j])
        if r is not None and not _rw_root(r):
            report.add("L11", f"{node.path}.input[{j}]",
                       f"{node.inputs[j]!r} feeds READ_WRITE formal input {formal!r} of {fname} but "
                       f"its root is {_root_text(r)}")


def _ints_of(s: _Scope | None, name: str) -> tuple[int, ...] | None:
    while s is not None:
        if name in s.defs:
            return s.ints.get(name)
        s = s.parent
    return None


def _cache_update(a: _Aliases, s: _Scope, node: NodeView, report: Report) -> None:
    # L12: the CacheUpdate contract (DESIGN.md "ai.onnxforge operators").
    p = node.path
    if len(node.inputs) != 3 or len(node.outputs) != 1 or not all(node.inputs) or not node.outputs[0]:
        report.add("L12", p, "CacheUpdate takes inputs (cache, values, position) and one output")
        return
    if not any(al.output_index == 0 and al.input_index == 0 and al.kind == MUST_ALIAS
               for al in node.output_alias):
        report.add("L12", f"{p}.output_alias",
                   "CacheUpdate needs output_alias {output_index: 0, input_index: 0, kind: MUST_ALIAS}")
    cache, values, position = (_type_of(s, n) for n in node.inputs)
    for i, t in ((0, cache), (1, values)):
        if t is None:
            continue
        if not isinstance(t, TensorType):
            report.add("L12", f"{p}.input[{i}]", f"{node.inputs[i]!r} must be a tensor, not {type_case(t)}")
        elif t.elem_type not in CACHE_UPDATE_TYPES:
            report.add("L12", f"{p}.input[{i}]", f"{node.inputs[i]!r} has element type "
                                                 f"{type_name(t.elem_type)}; T must be FLOAT, FLOAT16, "
                                                 f"BFLOAT16, INT8 or UINT8")
    if position is not None and not (isinstance(position, TensorType)
                                     and position.elem_type == TensorProto.INT64
                                     and (position.shape is None or len(position.shape) <= 1)):
        report.add("L12", f"{p}.input[2]", f"position {node.inputs[2]!r} must be INT64 [] or [batch], "
                                           f"not {position}")
    if isinstance(cache, TensorType) and isinstance(values, TensorType):
        _cache_shapes(s, node, cache, values, report)


def _cache_shapes(s: _Scope, node: NodeView, cache: TensorType, values: TensorType,
                  report: Report) -> None:
    p = node.path
    if cache.elem_type != values.elem_type:
        report.add("L12", f"{p}.input[1]", f"values {values} and cache {cache} differ in element type")
    if cache.shape is None or values.shape is None:
        return
    rank = len(cache.shape)
    if rank != len(values.shape):
        report.add("L12", f"{p}.input[1]", f"values {values} and cache {cache} differ in rank")
        return
    axis = node.attributes.get("axis", -2)
    ax = axis + rank if isinstance(axis, int) and axis < 0 else axis
    if not isinstance(ax, int) or not 0 <= ax < rank:
        report.add("L12", f"{p}.attribute['axis']", f"axis {axis} is out of range for rank {rank}")
        return
    for i, (c, v) in enumerate(zip(cache.shape, values.shape)):
        if i != ax and isinstance(c, int) and isinstance(v, int) and c != v:
            report.add("L12", f"{p}.input[1]", f"values dimension {i} is {v}, cache has {c} "
                                               f"(only axis {ax} may differ)")
    n, capacity = values.shape[ax], cache.shape[ax]
    positions = _ints_of(s, node.inputs[2])
    if positions and isinstance(n, int) and isinstance(capacity, int):
        bad = [q for q in positions if q < 0 or q + n > capacity]
        if bad:
            report.add("L12", f"{p}.input[2]", f"position {bad[0]} + {n} values does not fit capacity "
                                               f"{capacity} on axis {ax}")
