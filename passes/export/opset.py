"""Choosing the target opset and converting a lowered model to it.

The default target is the model's own default-domain opset, raised to the
lowest opset that has every operator the lowerings emit (21 for blocked
INT4 / UINT4 ``DequantizeLinear``, 23 for ``Attention``, ``RotaryEmbedding``
and ``RMSNormalization``, 24 for ``TensorScatter``, 25 for INT2 / UINT2).

Existing nodes are converted with ``onnx.version_converter``, which drops
unknown (extension) fields, so conversion runs only on the protobuf of an
already-lowered model. The nodes a lowering emitted are written for the
target opset and must not be "converted" from the old one: they are parked in
a private domain (:data:`PENDING_DOMAIN`, which the converter leaves alone)
while the converter runs, then moved back to the default domain::

    mark_pending(ir)                          # emitted nodes -> PENDING_DOMAIN
    proto = serde.to_onnx(ir)
    proto = convert_opset(proto, target)      # converts the others, restores the parked ones
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import onnx
import onnx.version_converter

from onnxforge.proto_ext.errors import ExportError
from onnxforge.graphbuilder.ir.core import Model
from onnxforge.passes.framework.domains import imported_version, is_default_domain
from onnxforge.passes.export.lower_extensions import NEW_NODE

__all__ = [
    "PENDING_DOMAIN",
    "convert_opset",
    "mark_pending",
    "min_ir_version",
    "proto_graphs",
]

PENDING_DOMAIN = "onnxforge.export.pending"
"""Private domain of emitted nodes while ``onnx.version_converter`` runs."""


def mark_pending(model: Model) -> int:
    """Move every emitted default-domain node of ``model`` to :data:`PENDING_DOMAIN`."""
    count = 0
    for g in model.all_graphs():
        for n in g:
            if n.meta.get(NEW_NODE) and is_default_domain(n.domain):
                n.domain = PENDING_DOMAIN
                count += 1
    if count:
        model.opset_imports[PENDING_DOMAIN] = 1
    return count


def proto_graphs(graph: Any, path: str = "graph") -> Iterator[tuple[Any, str]]:
    """``(GraphProto, path)`` of ``graph`` and of every subgraph, depth first."""
    yield graph, path
    for i, node in enumerate(graph.node):
        for a in node.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from proto_graphs(a.g, f"{path}.node[{i}]({node.name!r}).attribute[{a.name!r}].g")
            elif a.type == onnx.AttributeProto.GRAPHS:
                for k, sg in enumerate(a.graphs):
                    yield from proto_graphs(
                        sg, f"{path}.node[{i}]({node.name!r}).attribute[{a.name!r}].graphs[{k}]")


def min_ir_version(proto: onnx.ModelProto) -> int:
    """The lowest IR version that declares every opset the model imports."""
    try:
        return int(onnx.helper.find_min_ir_version_for(list(proto.opset_import), ignore_unknown=True))
    except (ValueError, TypeError):
        return int(proto.ir_version)


def _set_opset(proto: onnx.ModelProto, domain: str, version: int | None) -> None:
    keep = [op for op in proto.opset_import
            if op.domain != domain and not (domain == "" and is_default_domain(op.domain))]
    del proto.opset_import[:]
    if version is not None:
        proto.opset_import.append(onnx.helper.make_opsetid(domain, version))
    proto.opset_import.extend(keep)


def convert_opset(proto: onnx.ModelProto, target: int) -> onnx.ModelProto:
    """Convert the model's default-domain nodes to opset ``target`` and restore the nodes
    parked in :data:`PENDING_DOMAIN` (already written for ``target``)."""
    current = imported_version({op.domain: op.version for op in proto.opset_import}, "")
    if current is None:
        _set_opset(proto, "", target)
    elif current != target:
        try:
            proto = onnx.version_converter.convert_version(proto, target)
        except Exception as exc:  # the converter raises several unrelated exception types
            raise ExportError([("model.opset_import", f"onnx.version_converter cannot convert "
                                                      f"opset {current} to {target}: {exc}")]) from exc
    for g, _ in proto_graphs(proto.graph):
        for n in g.node:
            if n.domain == PENDING_DOMAIN:
                n.domain = ""
    _set_opset(proto, PENDING_DOMAIN, None)
    _set_opset(proto, "", target)
    proto.ir_version = max(int(proto.ir_version), min_ir_version(proto))
    return proto
