"""The narrow read-only view that static verification works on.

Both an extended ``ModelProto`` (:func:`view_from_proto`) and the IR
(``graphbuilder``) provide this view, so ``verify`` states every rule once and
the pass manager can check invariants without serializing anything.

Paths (``GraphView.path``, ``NodeView.path``) are the human-readable object
paths used in error messages: ``graph``, ``graph.node[3]('attn')``,
``graph.node[5].attribute['then_branch'].g``, ``functions['pkg::f']``.
"""
from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from onnx import AttributeProto, TensorProto

from onnxforge.proto_ext import schema
from onnxforge.proto_ext.convert import encoded_from_proto, struct_from_proto, text, type_from_proto
from onnxforge.proto_ext.types import EncodedValue, StructType, Type

__all__ = [
    "AliasSpec",
    "ExternalSpec",
    "ValueSpec",
    "NodeView",
    "GraphView",
    "FunctionView",
    "ModelView",
    "function_path",
    "serialized_refs",
    "view_from_proto",
]


@dataclass(slots=True)
class AliasSpec:
    """One ``ValueAliasProto`` of a node: output port ``output_index`` must alias input
    port ``input_index``; ``kind`` 1 is MUST_ALIAS."""

    output_index: int
    input_index: int
    kind: int


ExternalSpec = tuple[str, tuple[tuple[str, str], ...]]
"""One tensor payload stored outside the model file: the object path of its
``external_data`` field (``graph.initializer['w'].external_data``) and its
``(key, value)`` entries, as the wire has them (rule P7)."""


@dataclass(slots=True)
class ValueSpec:
    """A graph input/output/value_info (or a function value_info)."""

    name: str
    type: Type = None
    has_type: bool = False
    access: int = 0
    alias_of: str = ""


@dataclass(slots=True)
class NodeView:
    path: str
    name: str
    op_type: str
    domain: str
    inputs: list[str]
    outputs: list[str]
    output_alias: list[AliasSpec] = field(default_factory=list)
    subgraphs: list[tuple[str, "GraphView"]] = field(default_factory=list)
    attributes: dict[str, Any] = field(default_factory=dict)  # scalar ints/floats/strings only
    ref: Any = None  # the IR Node this view was built from (None for a wire view)
    proto: Any = None  # the NodeProto a wire view was built from (None for the IR's view)

    def __init__(self, path: str, name: str, op_type: str, domain: str, inputs: list[str],
                 outputs: list[str], output_alias: list[AliasSpec] | None = None,
                 subgraphs: list[tuple[str, GraphView]] | None = None,
                 attributes: dict[str, Any] | None = None, ref: Any = None, proto: Any = None):
        # the generated one, written out: this module is compiled, and a view has one per node
        self.path, self.name, self.op_type, self.domain = path, name, op_type, domain
        self.inputs, self.outputs, self.ref, self.proto = inputs, outputs, ref, proto
        self.output_alias = [] if output_alias is None else output_alias
        self.subgraphs = [] if subgraphs is None else subgraphs
        self.attributes = {} if attributes is None else attributes


@dataclass(slots=True)
class GraphView:
    path: str
    name: str
    is_main: bool
    inputs: list[ValueSpec]
    outputs: list[ValueSpec]
    value_infos: list[ValueSpec]
    initializers: list[str]
    sparse_initializers: list[str]
    encoded: list[EncodedValue]
    nodes: list[NodeView]
    bindings: list[tuple[str, str]] = field(default_factory=list)
    # Values of small integer initializers and Constant outputs (for static range checks).
    # (the IR's view reads them on first use: any mapping)
    int_values: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    ref: Any = None  # the IR Graph this view was built from (None for a wire view)
    # External references of dense and sparse initializers and of the tensor attributes of
    # this graph's own nodes (a subgraph's are in its view; encoded values are in ``encoded``).
    external_refs: list[ExternalSpec] = field(default_factory=list)
    proto: Any = None  # the GraphProto a wire view was built from (None for the IR's view)


@dataclass(slots=True)
class FunctionView:
    path: str
    domain: str
    name: str
    overload: str
    inputs: list[str]
    outputs: list[str]
    value_infos: list[ValueSpec]
    nodes: list[NodeView]
    # External references of the tensor attributes of the body's nodes (see GraphView).
    external_refs: list[ExternalSpec] = field(default_factory=list)
    ref: Any = None  # the IR Function this view was built from (None for a wire view)


@dataclass(slots=True)
class ModelView:
    struct_types: list[StructType]
    graph: GraphView
    functions: list[FunctionView] = field(default_factory=list)
    model_dir: str | None = None
    opsets: dict[str, int] = field(default_factory=dict)
    # every graph view in walk order, listed on the first walk (``verify.core.iter_graphs``:
    # most rules walk them all; a view is not edited while it is checked)
    walk: list[GraphView] | None = field(default=None, repr=False, compare=False)


def _texts(values: Any) -> list[str]:
    return [s if type(s) is str else text(s) for s in values]


def _value_spec(vi: Any) -> ValueSpec:
    has = vi.HasField("type")
    return ValueSpec(text(vi.name), type_from_proto(vi.type) if has else None, has, vi.access,
                     text(vi.alias_of))


def _node_view(node: Any, path: str) -> NodeView:
    name = text(node.name)
    label = f"{path}({name!r})" if name else path
    nv = NodeView(
        path=label,
        name=name,
        op_type=text(node.op_type),
        domain=text(node.domain),
        inputs=_texts(node.input),
        outputs=_texts(node.output),
        output_alias=[AliasSpec(a.output_index, a.input_index, a.kind) for a in node.output_alias],
        proto=node,
    )
    for attr in node.attribute:
        aname = text(attr.name)
        if attr.type == AttributeProto.GRAPH:
            nv.subgraphs.append((aname, _graph_view(attr.g, f"{label}.attribute[{aname!r}].g", False)))
        elif attr.type == AttributeProto.GRAPHS:
            for i, g in enumerate(attr.graphs):
                nv.subgraphs.append(
                    (aname, _graph_view(g, f"{label}.attribute[{aname!r}].graphs[{i}]", False)))
        elif attr.type == AttributeProto.INT:
            nv.attributes[aname] = attr.i
        elif attr.type == AttributeProto.FLOAT:
            nv.attributes[aname] = attr.f
        elif attr.type == AttributeProto.STRING:
            nv.attributes[aname] = attr.s
        elif attr.type == AttributeProto.INTS:
            nv.attributes[aname] = tuple(attr.ints)
    return nv


_INT_DTYPES = {TensorProto.INT64: ("<i8", "int64_data"), TensorProto.INT32: ("<i4", "int32_data")}
_MAX_INT_VALUES = 64


def _small_ints(t: Any) -> tuple[int, ...] | None:
    """Elements of a small inline INT64/INT32 TensorProto, else None."""
    spec = _INT_DTYPES.get(t.data_type)
    if spec is None or t.data_location == TensorProto.EXTERNAL or math.prod(t.dims) > _MAX_INT_VALUES:
        return None
    if t.raw_data:
        dtype = np.dtype(spec[0])
        if len(t.raw_data) % dtype.itemsize:
            return None
        values = tuple(int(v) for v in np.frombuffer(t.raw_data, dtype=dtype))
    else:
        values = tuple(getattr(t, spec[1]))
    return values if len(values) == math.prod(t.dims) else None


def _int_values(g: Any) -> dict[str, tuple[int, ...]]:
    out: dict[str, tuple[int, ...]] = {}
    for t in g.initializer:
        values = _small_ints(t)
        if values is not None:
            out.setdefault(text(t.name), values)
    for n in g.node:
        if n.op_type != "Constant" or n.domain not in ("", "ai.onnx") or len(n.output) != 1:
            continue
        for attr in n.attribute:
            values = None
            if attr.name == "value" and attr.type == AttributeProto.TENSOR:
                values = _small_ints(attr.t)
            elif attr.name == "value_int" and attr.type == AttributeProto.INT:
                values = (attr.i,)
            elif attr.name == "value_ints" and attr.type == AttributeProto.INTS:
                values = tuple(attr.ints)
            if values is not None:
                out.setdefault(text(n.output[0]), values)
    return out


def _tensor_refs(t: Any, path: str) -> Iterator[ExternalSpec]:
    """The external reference of TensorProto ``t`` (object path ``path``), if it has one."""
    if t.data_location == TensorProto.EXTERNAL:
        yield (f"{path}.external_data", tuple((text(e.key), text(e.value)) for e in t.external_data))


def _sparse_refs(s: Any, path: str) -> Iterator[ExternalSpec]:
    """The external references of SparseTensorProto ``s``: values, then indices."""
    yield from _tensor_refs(s.values, f"{path}.values")
    yield from _tensor_refs(s.indices, f"{path}.indices")


def serialized_refs(data: bytes | bytearray | memoryview, path: str, *,
                    sparse: bool = False) -> list[ExternalSpec]:
    """The external references of a serialized TensorProto (a SparseTensorProto with
    ``sparse``), for holders that keep the message as bytes."""
    msg = schema.parse("SparseTensorProto" if sparse else "TensorProto", data)
    return list(_sparse_refs(msg, path) if sparse else _tensor_refs(msg, path))


def _attribute_refs(nodes: Any, views: list[NodeView]) -> Iterator[ExternalSpec]:
    """External references of the tensor attributes of ``nodes`` (paths from their views)."""
    for n, nv in zip(nodes, views):
        for attr in n.attribute:
            apath = f"{nv.path}.attribute[{text(attr.name)!r}]"
            if attr.HasField("t"):
                yield from _tensor_refs(attr.t, f"{apath}.t")
            for i, t in enumerate(attr.tensors):
                yield from _tensor_refs(t, f"{apath}.tensors[{i}]")
            if attr.HasField("sparse_tensor"):
                yield from _sparse_refs(attr.sparse_tensor, f"{apath}.sparse_tensor")
            for i, sp in enumerate(attr.sparse_tensors):
                yield from _sparse_refs(sp, f"{apath}.sparse_tensors[{i}]")


def _graph_refs(g: Any, nodes: list[NodeView], path: str) -> Iterator[ExternalSpec]:
    for t in g.initializer:
        yield from _tensor_refs(t, f"{path}.initializer[{text(t.name)!r}]")
    for sp in g.sparse_initializer:
        yield from _sparse_refs(sp, f"{path}.sparse_initializer[{text(sp.values.name)!r}]")
    yield from _attribute_refs(g.node, nodes)


def function_path(domain: str, name: str) -> str:
    """Object path of the local function ``domain::name``."""
    return f"functions[{domain + '::' + name!r}]"


def _graph_view(g: Any, path: str, is_main: bool) -> GraphView:
    nodes = [_node_view(n, f"{path}.node[{i}]") for i, n in enumerate(g.node)]
    return GraphView(
        path=path,
        name=text(g.name),
        is_main=is_main,
        inputs=[_value_spec(v) for v in g.input],
        outputs=[_value_spec(v) for v in g.output],
        value_infos=[_value_spec(v) for v in g.value_info],
        initializers=_texts(t.name for t in g.initializer),
        sparse_initializers=_texts(s.values.name for s in g.sparse_initializer),
        encoded=[encoded_from_proto(e) for e in g.encoded_initializer],
        nodes=nodes,
        bindings=[(text(b.input_name), text(b.output_name)) for b in g.persistent_bindings],
        int_values=_int_values(g),
        external_refs=list(_graph_refs(g, nodes, path)),
        proto=g,
    )


def view_from_proto(model: Any, model_dir: str | None = None) -> ModelView:
    """Build the verification view of an extended ``ModelProto`` message."""
    functions = []
    for f in model.functions:
        domain, name = text(f.domain), text(f.name)
        fpath = function_path(domain, name)
        nodes = [_node_view(n, f"{fpath}.node[{i}]") for i, n in enumerate(f.node)]
        functions.append(FunctionView(
            path=fpath,
            domain=domain,
            name=name,
            overload=text(f.overload),
            inputs=_texts(f.input),
            outputs=_texts(f.output),
            value_infos=[_value_spec(v) for v in f.value_info],
            nodes=nodes,
            external_refs=list(_attribute_refs(f.node, nodes)),
        ))
    return ModelView(
        struct_types=[struct_from_proto(s) for s in model.struct_types],
        graph=_graph_view(model.graph, "graph", True),
        functions=functions,
        model_dir=model_dir,
        opsets={text(o.domain): o.version for o in model.opset_import},
    )
