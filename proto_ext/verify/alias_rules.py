"""Alias and access rules of RULES.md (L1-L12), over the alias resolution of
``proto_ext.aliasing`` (where the alias model is described). Rule L13 (in-place
semantics) lives in ``inplace_rules``.

Example (the stateful cache; every rule holds)::

    graph input  cache: FLOAT[2, 16, 8]  access: READ_WRITE
    node[0]      upd = ai.onnxforge.CacheUpdate(cache, values, position)
                 output_alias {output_index: 0, input_index: 0, kind: MUST_ALIAS}
    graph output upd: FLOAT[2, 16, 8]    alias_of: "cache"
    persistent_bindings: cache <- upd

``upd`` -> ``cache`` is one chain; its root is a main-graph READ_WRITE input (L7).
"""
from __future__ import annotations

from onnx import TensorProto

from onnxforge.proto_ext.aliasing import (
    Edge,
    ModelAliases,
    Root,
    Scope,
    is_control_flow,
    root_text,
    rw_root,
    type_of,
)
from onnxforge.proto_ext.schema import MUST_ALIAS, READ_WRITE
from onnxforge.proto_ext.typecompat import compatible, type_case
from onnxforge.proto_ext.types import TensorType, type_name
from onnxforge.proto_ext.verify.core import Report, iter_graphs, register
from onnxforge.proto_ext.view import GraphView, ModelView, NodeView

__all__ = ["CACHE_UPDATE_DOMAIN", "CACHE_UPDATE_TYPES", "check_aliases", "declares_aliases", "model_aliases"]

CACHE_UPDATE_DOMAIN = "ai.onnxforge"
CACHE_UPDATE_TYPES = frozenset({TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16,
                                TensorProto.INT8, TensorProto.UINT8})

def declares_aliases(view: ModelView, report: Report | None = None) -> bool:
    """Whether anything in ``view`` that rules L1-L13 read is there: an ``output_alias``, an
    ``alias_of``, a READ_WRITE value, a CacheUpdate node or a local function. Without any,
    every alias rule holds (there is no edge, root, writer or call to check)."""
    if report is not None and "declares_aliases" in report.shared:
        return report.shared["declares_aliases"]
    found = bool(view.functions) or any(_graph_declares(g) for g in iter_graphs(view))
    if report is not None:
        report.shared["declares_aliases"] = found
    return found


def _graph_declares(g: GraphView) -> bool:
    for specs in (g.inputs, g.outputs, g.value_infos):
        for v in specs:
            if v.alias_of or v.access:
                return True
    for node in g.nodes:
        if node.output_alias or (node.op_type == "CacheUpdate" and node.domain == CACHE_UPDATE_DOMAIN):
            return True
    return False


def model_aliases(view: ModelView, report: Report) -> ModelAliases:
    """The alias resolution of ``view``, built once per report (L1 and L2 are reported by
    the check that builds it first with the report, :func:`check_aliases`)."""
    a = report.shared.get("aliases")
    if a is None:
        a = report.shared["aliases"] = ModelAliases(view)
    return a


@register("aliases")
def check_aliases(view: ModelView, report: Report) -> None:
    """L1-L12: output_alias / alias_of / access annotations and CacheUpdate."""
    if not declares_aliases(view, report):
        return
    a = ModelAliases(view, report)  # reports L1 and L2
    report.shared["aliases"] = a
    for s in a.scopes:
        _port_agreement(a, s, report)
        _cycles(a, s, report)
        _alias_types(a, s, report)
        _chains(a, s, report)
        _access(s, report)
        _single_writer(a, s, report)
        for node in s.nodes:
            if is_control_flow(node):
                _control_flow(a, s, node, report)
            if (node.domain, node.op_type) in a.functions:
                _call(a, s, node, report)
            if node.domain == CACHE_UPDATE_DOMAIN and node.op_type == "CacheUpdate":
                _cache_update(a, s, node, report)


def _port_agreement(a: ModelAliases, s: Scope, report: Report) -> None:
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


def _cycles(a: ModelAliases, s: Scope, report: Report) -> None:
    # L5: alias edges among the scope's own names form no cycle.
    succ: dict[str, list[Edge]] = {}
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


def _alias_types(a: ModelAliases, s: Scope, report: Report) -> None:
    # L6: an aliased output is compatible with its input.
    for name, d in s.defs.items():
        done: set[str] = set()
        for e in a.edges(s, name, d):
            if e.target in done:
                continue
            done.add(e.target)
            ta, tb = type_of(s, name), type_of(s, e.target)
            if ta is None or tb is None:
                continue
            reason = compatible(ta, tb)
            if reason is not None:
                report.add("L6", e.path, f"{name!r} ({ta}) aliases {e.target!r} ({tb}) but the "
                                         f"types are not compatible ({reason})")


def _chains(a: ModelAliases, s: Scope, report: Report) -> None:
    # L7: every chain ends at a READ_WRITE main-graph input (in a function: formal input).
    reported: set[tuple[int, str]] = set()
    for name, d in s.defs.items():
        e = a.edge(s, name, d)
        if e is None:
            continue
        r = a.root(s, name)
        if r is None or rw_root(r) or r.key in reported:
            continue
        reported.add(r.key)
        want = "a READ_WRITE formal input" if s.kind == "function" else "a main-graph READ_WRITE input"
        report.add("L7", e.path, f"the alias chain from {name!r} ends at {root_text(r)}, not at {want}")


def _access(s: Scope, report: Report) -> None:
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


def _single_writer(a: ModelAliases, s: Scope, report: Report) -> None:
    # L9: a value is the aliased input of at most one MUST_ALIAS port in its graph.
    first: dict[str, str] = {}
    for node in s.nodes:
        for idx, al in a.valid.get(id(node), ()):
            name, path = node.inputs[al.input_index], f"{node.path}.output_alias[{idx}]"
            if name in first:
                report.add("L9", path, f"{name!r} is already the aliased input of {first[name]}")
            else:
                first[name] = path


def _control_flow(a: ModelAliases, s: Scope, node: NodeView, report: Report) -> None:
    # L10: an aliased control-flow output resolves to one root in every branch.
    for k, out in enumerate(node.outputs):
        if not out:
            continue
        entries = a.branch_roots(s, node, k, set())
        d = s.defs.get(out)
        own = a.edge(s, out, d) if d is not None and d.node is node else None
        if not entries or not (own is not None or any(e[3] for e in entries)):
            continue
        roots: list[tuple[str, Root | None]] = [(f"{b.path}.output[{name!r}]", r)
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


def _call(a: ModelAliases, s: Scope, node: NodeView, report: Report) -> None:
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
        if r is not None and not rw_root(r):
            report.add("L11", f"{node.path}.input[{j}]",
                       f"{node.inputs[j]!r} feeds READ_WRITE formal input {formal!r} of {fname} but "
                       f"its root is {root_text(r)}")


def _ints_of(s: Scope | None, name: str) -> tuple[int, ...] | None:
    while s is not None:
        if name in s.defs:
            return s.ints.get(name)
        s = s.parent
    return None


def _cache_update(a: ModelAliases, s: Scope, node: NodeView, report: Report) -> None:
    # L12: the CacheUpdate contract (DESIGN.md "ai.onnxforge operators").
    p = node.path
    if len(node.inputs) != 3 or len(node.outputs) != 1 or not all(node.inputs) or not node.outputs[0]:
        report.add("L12", p, "CacheUpdate takes inputs (cache, values, position) and one output")
        return
    if not any(al.output_index == 0 and al.input_index == 0 and al.kind == MUST_ALIAS
               for al in node.output_alias):
        report.add("L12", f"{p}.output_alias",
                   "CacheUpdate needs output_alias {output_index: 0, input_index: 0, kind: MUST_ALIAS}")
    cache, values, position = (type_of(s, n) for n in node.inputs)
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


def _cache_shapes(s: Scope, node: NodeView, cache: TensorType, values: TensorType,
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
