"""Model summaries for ``onnxforge inspect``: a JSON-able dict and its text rendering.

The summary is computed from the verification view (which both an extended
``ModelProto`` and the IR provide) plus initializer byte counts, so it never
reads payload bytes.
"""
from __future__ import annotations

from collections import Counter
from typing import Any

from onnxforge.proto_ext.schema import MUST_ALIAS, READ_WRITE
from onnxforge.proto_ext.types import (
    MapType,
    OptionalType,
    SequenceType,
    StructType,
    TensorType,
    Type,
    type_name,
)
from onnxforge.proto_ext.view import GraphView, ModelView

__all__ = ["summarize", "render_text", "format_type"]


def format_type(t: Type) -> str:
    """Readable type: ``FLOAT[batch, past + seq, 32]``, ``seq(...)``, ``struct(type_ref=7)``."""
    if t is None:
        return "?"
    if isinstance(t, (TensorType, SequenceType, OptionalType, MapType, StructType)):
        return str(t)
    return type(t).__name__


def _walk_nodes(g: GraphView):
    for n in g.nodes:
        yield n
        for _, sg in n.subgraphs:
            yield from _walk_nodes(sg)


def _struct_entry(st: StructType) -> dict[str, Any]:
    entry: dict[str, Any] = {"type_id": st.type_id, "name": st.name, "kind": st.kind}
    if st.kind == "structure":
        entry["fields"] = [
            {"name": f.name, "constant": f.constant is not None,
             "type": None if f.constant is not None else format_type(f.type)}
            for f in st.fields
        ]
    elif st.kind == "array" and st.array is not None:
        entry["element_type"] = format_type(st.array.element_type)
        entry["dimension"] = st.array.dimension
    elif st.kind == "bit_packing" and st.bit_packing is not None:
        entry["components"] = [(c.name, c.bit_width) for c in st.bit_packing.components]
        entry["dimension"] = st.bit_packing.dimension
    entry["decoder"] = st.decoder.name if st.decoder is not None else None
    return entry


def summarize(view: ModelView, initializer_bytes: dict[str, int]) -> dict[str, Any]:
    """A JSON-able summary: opsets, op histogram, inputs/outputs, initializers,
    struct catalogue, encoded initializers, bindings and aliases."""
    g = view.graph
    hist = Counter(f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in _walk_nodes(g))
    aliases = []
    for n in _walk_nodes(g):
        for a in n.output_alias:
            out = n.outputs[a.output_index] if 0 <= a.output_index < len(n.outputs) else "?"
            inp = n.inputs[a.input_index] if 0 <= a.input_index < len(n.inputs) else "?"
            aliases.append({"node": n.path, "output": out, "input": inp,
                            "kind": "MUST_ALIAS" if a.kind == MUST_ALIAS else str(a.kind)})
    value_aliases = [
        {"value": v.name, "alias_of": v.alias_of}
        for v in [*g.inputs, *g.outputs, *g.value_infos] if v.alias_of
    ]
    encoded = []
    for e in g.encoded:
        if e.affine is not None:
            layout = f"affine {type_name(e.affine.storage_type)}"
            if e.affine.axis is not None:
                layout += f" axis={e.affine.axis}"
            if e.affine.block_size is not None:
                layout += f" block={e.affine.block_size}"
        elif e.struct_type is not None:
            layout = str(e.struct_type)
        else:
            layout = "?"
        encoded.append({
            "name": e.name,
            "layout": layout,
            "logical_type": format_type(e.logical_type),
            "bytes": initializer_bytes.get(e.name, len(e.raw_data)),
            "external": e.is_external,
        })
    dense_bytes = sum(initializer_bytes.get(n, 0) for n in g.initializers)
    return {
        "graph": g.name,
        "opsets": dict(sorted(view.opsets.items())),
        "nodes": sum(hist.values()),
        "op_histogram": dict(sorted(hist.items(), key=lambda kv: (-kv[1], kv[0]))),
        "inputs": [{"name": v.name, "type": format_type(v.type),
                    "access": "READ_WRITE" if v.access == READ_WRITE else "READ_ONLY"} for v in g.inputs],
        "outputs": [{"name": v.name, "type": format_type(v.type)} for v in g.outputs],
        "initializers": {"count": len(g.initializers), "bytes": dense_bytes},
        "struct_types": [_struct_entry(s) for s in view.struct_types],
        "encoded_initializers": encoded,
        "persistent_bindings": [{"input": i, "output": o} for i, o in g.bindings],
        "aliases": aliases,
        "value_aliases": value_aliases,
        "functions": [f"{f.domain}::{f.name}" for f in view.functions],
    }


def render_text(s: dict[str, Any]) -> str:
    """Human-readable rendering of :func:`summarize`'s result."""
    lines = [f"graph {s['graph']!r}: {s['nodes']} nodes"]
    lines.append("opsets: " + ", ".join(f"{d or 'ai.onnx'}={v}" for d, v in s["opsets"].items()))
    lines.append("ops:")
    for op, count in s["op_histogram"].items():
        lines.append(f"  {count:6d}  {op}")
    lines.append("inputs:")
    for v in s["inputs"]:
        rw = "  (READ_WRITE)" if v["access"] == "READ_WRITE" else ""
        lines.append(f"  {v['name']}: {v['type']}{rw}")
    lines.append("outputs:")
    for v in s["outputs"]:
        lines.append(f"  {v['name']}: {v['type']}")
    ini = s["initializers"]
    lines.append(f"initializers: {ini['count']} ({ini['bytes']:,} bytes)")
    if s["struct_types"]:
        lines.append("struct types:")
        for st in s["struct_types"]:
            lines.append(f"  type_id={st['type_id']} {st['name']!r} ({st['kind']})"
                         + (f" decoder={st['decoder']}" if st.get("decoder") else ""))
            for f in st.get("fields", []):
                lines.append(f"    {f['name']}: {'constant' if f['constant'] else f['type']}")
    if s["encoded_initializers"]:
        lines.append("encoded initializers:")
        for e in s["encoded_initializers"]:
            ext = " external" if e["external"] else ""
            lines.append(f"  {e['name']}: {e['layout']} -> {e['logical_type']}, {e['bytes']:,} bytes{ext}")
    if s["persistent_bindings"]:
        lines.append("persistent bindings:")
        for b in s["persistent_bindings"]:
            lines.append(f"  {b['input']} <- {b['output']}")
    if s["aliases"] or s["value_aliases"]:
        lines.append("aliases:")
        for a in s["aliases"]:
            lines.append(f"  {a['output']} must alias {a['input']} ({a['node']})")
        for a in s["value_aliases"]:
            lines.append(f"  {a['value']}.alias_of = {a['alias_of']}")
    if s["functions"]:
        lines.append("local functions: " + ", ".join(s["functions"]))
    return "\n".join(lines)
