"""Checks that only the wire shows: enum values outside the declared range.

onnx's enums are closed (proto2): an unknown value read from the wire leaves the
field unset and lands in the unknown-field set. For the enum fields that the
extensions add, such a value is a hard error (rule W1), never a silent default.
"""
from __future__ import annotations

from typing import Any

from google.protobuf.unknown_fields import UnknownFieldSet

from onnxforge.proto_ext.errors import Violation
from onnxforge.proto_ext.convert import text
from onnxforge.proto_ext.view import function_path

__all__ = ["wire_violations"]

# (message full name suffix) -> {field number: field name} of enum fields to police.
_ENUM_FIELDS = {
    "ValueInfoProto": {1000: "access"},
    "ValueAliasProto": {3: "kind"},
    "EncodedValueProto": {6: "data_location"},
    "AffineLayoutProto": {1: "storage_type"},
}


def _unknown_enum(msg: Any, path: str, out: list[Violation]) -> None:
    fields = _ENUM_FIELDS.get(msg.DESCRIPTOR.name)
    if not fields:
        return
    for uf in UnknownFieldSet(msg):
        name = fields.get(uf.field_number)
        if name is not None:
            out.append(Violation("W1", f"{path}.{name}",
                                 f"unknown enum value {uf.data} for {msg.DESCRIPTOR.name}.{name}"))


def _nodes(nodes: Any, path: str, out: list[Violation]) -> None:
    for i, n in enumerate(nodes):
        npath = f"{path}.node[{i}]"
        for j, a in enumerate(n.output_alias):
            _unknown_enum(a, f"{npath}.output_alias[{j}]", out)
        for attr in n.attribute:
            if attr.HasField("g"):
                _graph(attr.g, f"{npath}.attribute[{attr.name!r}].g", out)
            for k, sub in enumerate(attr.graphs):
                _graph(sub, f"{npath}.attribute[{attr.name!r}].graphs[{k}]", out)


def _graph(g: Any, path: str, out: list[Violation]) -> None:
    for kind in ("input", "output", "value_info"):
        for i, vi in enumerate(getattr(g, kind)):
            _unknown_enum(vi, f"{path}.{kind}[{i}]", out)
    _nodes(g.node, path, out)
    for i, e in enumerate(g.encoded_initializer):
        epath = f"{path}.encoded_initializer[{e.name!r}]"
        _unknown_enum(e, epath, out)
        if e.HasField("affine"):
            _unknown_enum(e.affine, f"{epath}.affine", out)


def wire_violations(model: Any) -> list[Violation]:
    """W1 for every extension enum field of the model: main graph, subgraphs and local
    functions (their bodies' subgraphs included)."""
    out: list[Violation] = []
    _graph(model.graph, "graph", out)
    for f in model.functions:
        fpath = function_path(text(f.domain), text(f.name))
        for i, vi in enumerate(f.value_info):
            _unknown_enum(vi, f"{fpath}.value_info[{i}]", out)
        _nodes(f.node, fpath, out)
    return out
