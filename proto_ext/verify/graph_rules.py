"""Graph rules of RULES.md: names and initializers (N1-N5) and persistent bindings
(B1-B5). The alias rules (L1-L12) live in ``alias_rules``.
"""
from __future__ import annotations

from collections.abc import Iterator

from onnx import TensorProto

from onnxforge.proto_ext.typecompat import compatible, contains_string
from onnxforge.proto_ext.types import StructType, TensorType
from onnxforge.proto_ext.verify.core import Report, iter_graphs, register
from onnxforge.proto_ext.view import (
    FunctionView,
    GraphView,
    ModelView,
    NodeView,
    ValueSpec,
)

__all__ = ["check_bindings", "check_names"]
_STANDARD = ("", "ai.onnx")
_CONTROL_FLOW = {"If": ("then_branch", "else_branch"), "Loop": ("body",), "Scan": ("body",)}


def _initializer_lists(g: GraphView) -> tuple[tuple[str, list[str]], ...]:
    """(field name, names) of the graph's three initializer lists."""
    return (("initializer", g.initializers), ("sparse_initializer", g.sparse_initializers),
            ("encoded_initializer", [e.name for e in g.encoded]))


def _value_specs(g: GraphView) -> Iterator[tuple[str, ValueSpec]]:
    for kind, specs in (("input", g.inputs), ("output", g.outputs), ("value_info", g.value_infos)):
        for v in specs:
            yield kind, v


# --------------------------------------------------------------------------- names


@register("names")
def check_names(view: ModelView, report: Report) -> None:
    """N1-N5: initializer names, SSA and scoping, types of values named like encoded
    initializers, valid value types."""
    for g in iter_graphs(view):
        _initializer_names(g, report)
        _encoded_value_types(g, report)
        _value_types(g, report)
    _ssa_graph(view.graph, (), (), report)
    for f in view.functions:
        _ssa_function(f, report)


def _initializer_names(g: GraphView, report: Report) -> None:
    # N1: encoded initializers are named; N2: no name repeats across the three lists.
    seen: dict[str, str] = {}
    for kind, names in _initializer_lists(g):
        for i, name in enumerate(names):
            if not name:
                if kind == "encoded_initializer":
                    report.add("N1", f"{g.path}.encoded_initializer[{i}]",
                               "an encoded initializer must have a non-empty name")
                continue
            path = f"{g.path}.{kind}[{name!r}]"
            if name in seen:
                report.add("N2", path, f"name {name!r} is already used by {seen[name]}")
            else:
                seen[name] = path


def _encoded_value_types(g: GraphView, report: Report) -> None:
    # N4: a value named like an encoded initializer is typed struct_type accordingly,
    # or (so that stock readers see a well-formed graph) by the value's logical type.
    encoded = {e.name: e for e in g.encoded if e.name}
    if not encoded:
        return
    for kind, v in _value_specs(g):
        e = encoded.get(v.name)
        if e is None:
            continue
        path = f"{g.path}.{kind}[{v.name!r}].type"
        t = v.type
        if (isinstance(t, TensorType) and isinstance(e.logical_type, TensorType)
                and compatible(t, e.logical_type) is None):
            continue
        if not isinstance(t, StructType):
            report.add("N4", path, f"names encoded initializer {v.name!r} but is typed "
                                   f"{t or 'nothing'}, neither TypeProto.struct_type nor its "
                                   f"logical type {e.logical_type}")
            continue
        layout = e.struct_type
        if layout is not None and layout.is_reference:
            if not (t.is_category or (t.is_reference and t.type_ref == layout.type_ref)):
                report.add("N4", path, f"encoded initializer {v.name!r} has type_ref "
                                       f"{layout.type_ref}; the value must be typed by that "
                                       f"type_ref or a category, not {t}")
        elif (layout is not None or e.affine is not None) and not t.is_category:
            what = "an affine" if e.affine is not None else "an inline"
            report.add("N4", path, f"encoded initializer {v.name!r} has {what} layout; the "
                                   f"value must be typed by a category (struct_type with no "
                                   f"kind), not {t}")


def _value_types(g: GraphView, report: Report) -> None:
    # N5: struct_type alone is a valid type. Like onnx's checker, only main-graph inputs
    # and outputs must be typed, by a recognized case (tensors with a defined element
    # type); value_info entries and subgraph inputs and outputs may be untyped, with no
    # TypeProto or an empty one (``type {}``).
    if not g.is_main:
        return
    for kind, specs in (("input", g.inputs), ("output", g.outputs)):
        for v in specs:
            path = f"{g.path}.{kind}[{v.name!r}].type"
            if not v.has_type:
                report.add("N5", path, f"main-graph {kind} {v.name!r} has no type")
            elif v.type is None:
                report.add("N5", path, f"main-graph {kind} {v.name!r}: the TypeProto holds no "
                                       f"recognized case")
            elif isinstance(v.type, TensorType) and v.type.elem_type == TensorProto.UNDEFINED:
                report.add("N5", path, f"main-graph {kind} {v.name!r} has elem_type UNDEFINED")


def _visible(name: str, defined: set[str], outer: tuple[set[str], ...]) -> bool:
    return name in defined or any(name in s for s in outer)


def _ssa_nodes(nodes: list[NodeView], defined: set[str], outer: tuple[set[str], ...],
               later: tuple[set[str], ...], report: Report) -> None:
    for node in nodes:
        for i, name in enumerate(node.inputs):
            if name and not _visible(name, defined, outer):
                why = "is used before its definition" if any(name in s for s in later) else "is not defined"
                report.add("N3", f"{node.path}.input[{i}]", f"{name!r} {why}")
        for _attr, sub in node.subgraphs:
            # ``defined`` is live: the subgraph sees exactly the names defined so far.
            _ssa_graph(sub, (*outer, defined), later, report)
        for k, name in enumerate(node.outputs):
            if not name:
                continue
            if name in defined:
                report.add("N3", f"{node.path}.output[{k}]", f"{name!r} is already defined")
            elif any(name in s for s in outer):
                report.add("N3", f"{node.path}.output[{k}]", f"{name!r} shadows an outer-scope name")
            defined.add(name)


def _ssa_graph(g: GraphView, outer: tuple[set[str], ...], outer_later: tuple[set[str], ...],
               report: Report) -> None:
    # N3 for one graph: single definitions, no shadowing, definition before use.
    defined: set[str] = set()
    for v in g.inputs:
        path = f"{g.path}.input[{v.name!r}]"
        if v.name in defined:
            report.add("N3", path, f"graph input {v.name!r} is declared twice")
        elif any(v.name in s for s in outer):
            report.add("N3", path, f"graph input {v.name!r} shadows an outer-scope name")
        defined.add(v.name)
    for kind, names in _initializer_lists(g):
        for name in names:
            if name and any(name in s for s in outer):
                report.add("N3", f"{g.path}.{kind}[{name!r}]", f"{name!r} shadows an outer-scope name")
            if name:
                defined.add(name)
    later = (*outer_later, {o for n in g.nodes for o in n.outputs if o})
    _ssa_nodes(g.nodes, defined, outer, later, report)
    for v in g.outputs:
        if not v.name or not _visible(v.name, defined, outer):
            report.add("N3", f"{g.path}.output[{v.name!r}]",
                       f"graph output {v.name!r} names no value defined in scope")


def _ssa_function(f: FunctionView, report: Report) -> None:
    defined: set[str] = set()
    for i, name in enumerate(f.inputs):
        if name in defined:
            report.add("N3", f"{f.path}.input[{i}]", f"formal input {name!r} is declared twice")
        defined.add(name)
    later = ({o for n in f.nodes for o in n.outputs if o},)
    _ssa_nodes(f.nodes, defined, (), later, report)
    for i, name in enumerate(f.outputs):
        if not name or name not in defined:
            report.add("N3", f"{f.path}.output[{i}]", f"function output {name!r} is not defined")


# ------------------------------------------------------------------------ bindings


@register("bindings")
def check_bindings(view: ModelView, report: Report) -> None:
    """B1-B5: persistent bindings live in the main graph, name exact inputs and
    outputs once each, join compatible types and hold no STRING."""
    for g in iter_graphs(view):
        if g is not view.graph:
            for i, (iname, oname) in enumerate(g.bindings):
                report.add("B1", f"{g.path}.persistent_bindings[{i}]",
                           f"binding {iname!r} <- {oname!r}: persistent bindings are allowed "
                           f"only in the main graph")
    g = view.graph
    inputs: dict[str, ValueSpec] = {}
    outputs: dict[str, ValueSpec] = {}
    for v in g.inputs:
        inputs.setdefault(v.name, v)
    for v in g.outputs:
        outputs.setdefault(v.name, v)
    first_in: dict[str, int] = {}
    first_out: dict[str, int] = {}
    for i, (iname, oname) in enumerate(g.bindings):
        path = f"graph.persistent_bindings[{i}]"
        vin, vout = inputs.get(iname), outputs.get(oname)
        if vin is None:
            report.add("B2", f"{path}.input_name", _unknown_end(iname, "input", inputs))
        if vout is None:
            report.add("B2", f"{path}.output_name", _unknown_end(oname, "output", outputs))
        for end, name, first in (("input_name", iname, first_in), ("output_name", oname, first_out)):
            if name in first:
                report.add("B3", f"{path}.{end}",
                           f"{name!r} is already bound by persistent_bindings[{first[name]}]")
            else:
                first[name] = i
        if vin is None or vout is None:
            continue
        if vin.type is None or vout.type is None:
            untyped = [n for n, v in ((iname, vin), (oname, vout)) if v.type is None]
            report.add("B4", path, f"binding {iname!r} <- {oname!r}: {', '.join(map(repr, untyped))} "
                                   f"has no type")
        else:
            reason = compatible(vin.type, vout.type)
            if reason is not None:
                report.add("B4", path, f"binding {iname!r} <- {oname!r}: input {vin.type} and output "
                                       f"{vout.type} are not compatible ({reason})")
        for end, v in (("input_name", vin), ("output_name", vout)):
            if contains_string(v.type, report.catalogue):
                report.add("B5", f"{path}.{end}", f"{v.name!r} of type {v.type} holds STRING; "
                                                  f"string values cannot be persistent")


def _unknown_end(name: str, kind: str, names: dict[str, ValueSpec]) -> str:
    msg = f"{name!r} is not a main-graph {kind} name"
    for sep in (".", "\\"):
        head = name.rpartition(sep)[0]
        while head:
            if head in names:
                return msg + f" (names are exact: {head!r} is a {kind}, field paths are not supported)"
            head = head.rpartition(sep)[0]
    return msg
