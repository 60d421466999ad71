"""The IR's verification view (``proto_ext.view.ModelView``), built without serializing.

Only names, types, alias annotations, encoded-value headers and external-data
references (rule P7) are read; payloads are referenced, never copied. The one
exception: the elements of small integer tensors (initializers and ``Constant``
nodes of at most 64 elements) are read, for static range checks such as rule L12,
as the wire view does.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import replace

from onnx import TensorProto

from onnxforge.proto_ext.errors import CodecError
from onnxforge.graphbuilder.ir.core import AttrType, Function, Graph, Model, Node, Value
from onnxforge.graphbuilder.ir.tensors import EncodedTensor, Tensor
from onnxforge.proto_ext.types import (
    MapType,
    OptionalType,
    SequenceType,
    SparseTensorType,
    StructType,
    TensorType,
    Type,
)
from onnxforge.proto_ext.view import (
    AliasSpec,
    ExternalSpec,
    FunctionView,
    GraphView,
    ModelView,
    NodeView,
    ValueSpec,
    serialized_refs,
)

__all__ = ["model_view", "node_view", "plain_type"]


def plain_type(t: Type) -> Type:
    """The type record with dims int / str / None only, at any depth: a symbolic
    dimension becomes its ``dim_param`` text (``t`` itself when nothing changes)."""
    if isinstance(t, (TensorType, SparseTensorType)):
        if t.shape is not None and any(not (d is None or isinstance(d, (int, str))) for d in t.shape):
            return replace(t, shape=tuple(d if d is None or isinstance(d, (int, str)) else str(d)
                                          for d in t.shape))
        return t
    if isinstance(t, (SequenceType, OptionalType)):
        e = plain_type(t.elem)
        return t if e is t.elem else replace(t, elem=e)
    if isinstance(t, MapType):
        e = plain_type(t.value)
        return t if e is t.value else replace(t, value=e)
    return t


def _alias_name(v: Value) -> str:
    a = v.alias_of
    if a is None:
        return ""
    return a.name if isinstance(a, Value) else str(a)


def _spec(v: Value) -> ValueSpec:
    return ValueSpec(v.name, plain_type(v.type), v.type is not None, v.access, _alias_name(v))


def _node(n: Node, path: str) -> NodeView:
    label = f"{path}({n.name!r})" if n.name else path
    nv = NodeView(  # positionally: path, name, op_type, domain, inputs, outputs, output_alias
        label, n.name, n.op_type, n.domain,
        ["" if v is None else v.name for v in n._inputs],
        [v.name for v in n._outputs],
        [AliasSpec(a.output_index, a.input_index, a.kind) for a in n.output_alias] if n.output_alias else [],
        None, None, n,
    )
    if not n.attributes:
        return nv
    for a in n.attributes.values():
        if a.type == AttrType.GRAPH and a.value is not None:
            nv.subgraphs.append((a.name, _graph(a.value, f"{label}.attribute[{a.name!r}].g", False)))
        elif a.type == AttrType.GRAPHS:
            for k, g in enumerate(a.value or []):
                nv.subgraphs.append((a.name, _graph(g, f"{label}.attribute[{a.name!r}].graphs[{k}]", False)))
        elif a.type in (AttrType.INT, AttrType.FLOAT, AttrType.STRING, AttrType.INTS):
            nv.attributes[a.name] = tuple(a.value) if a.type == AttrType.INTS else a.value
    return nv


def node_view(n: Node, path: str) -> NodeView:
    """The view of one IR node (its subgraphs included), labelled ``path``."""
    return _node(n, path)


def _value_infos(container: Graph | Function) -> list[ValueSpec]:
    out = []
    boundary = {id(v) for v in container.inputs} | {id(v) for v in container.outputs}
    for n in container:
        for v in n._outputs:
            if id(v) not in boundary and (v.has_value_info or v.type is not None or v.alias_of is not None):
                out.append(_spec(v))
    if isinstance(container, Graph):
        for v in container.all_initializers():
            if id(v) not in boundary and v.has_value_info:
                out.append(_spec(v))
    else:
        # a function's formal inputs/outputs carry access / alias_of through value_info
        for v in (*container.inputs, *container.outputs):
            if v.access or v.alias_of is not None:
                out.append(_spec(v))
    return out


_MAX_INT_VALUES = 64  # the wire view (proto_ext.view) reads the same small tensors


def _small_ints(t: Tensor | None) -> tuple[int, ...] | None:
    """Elements of a small INT64/INT32 tensor whose payload is at hand, else None."""
    if t is None or t.dtype not in (TensorProto.INT64, TensorProto.INT32) or t.size > _MAX_INT_VALUES:
        return None
    if t.external is not None and t.raw is None:
        return None
    try:
        return tuple(int(x) for x in t.numpy().reshape(-1).tolist())
    except CodecError:  # a malformed payload: other rules report it
        return None


def _constant_ints(n: Node) -> tuple[int, ...] | None:
    """The value of a ``Constant`` node holding a small integer tensor, else None."""
    for a in n.attributes.values():
        values = None
        if a.name == "value" and a.type == AttrType.TENSOR:
            values = _small_ints(a.value)
        elif a.name == "value_int" and a.type == AttrType.INT:
            values = (int(a.value),)
        elif a.name == "value_ints" and a.type == AttrType.INTS:
            values = tuple(int(x) for x in a.value)
        if values is not None:
            return values
    return None


class _IntValues(Mapping[str, tuple[int, ...]]):
    """:func:`_int_values` of a graph, read on first use: only the alias and paged-cache
    rules ask, and most models declare neither. A view is read while its IR is unchanged
    (verification and storage analysis use it at once)."""

    __slots__ = ("_graph", "_values")

    def __init__(self, g: Graph):
        self._graph: Graph | None = g
        self._values: dict[str, tuple[int, ...]] = {}

    def _read(self) -> dict[str, tuple[int, ...]]:
        if self._graph is not None:
            self._values, self._graph = _int_values(self._graph), None
        return self._values

    def __getitem__(self, name: str) -> tuple[int, ...]:
        return self._read()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._read())

    def __len__(self) -> int:
        return len(self._read())


def _int_values(g: Graph) -> dict[str, tuple[int, ...]]:
    """Small integer initializers and Constant outputs (for static range checks like L12)."""
    out: dict[str, tuple[int, ...]] = {}
    for v in g.initializers.values():
        values = _small_ints(v.const if isinstance(v.const, Tensor) else None)
        if values is not None:
            out[v.name] = values
    for n in g:
        if n.op_type != "Constant" or n.domain not in ("", "ai.onnx") or len(n.outputs) != 1:
            continue
        values = _constant_ints(n)
        if values is not None:
            out.setdefault(n.outputs[0].name, values)
    return out


def _wire_header(t: EncodedTensor):
    """The header as the wire has it: an external payload mapped by the loader is not
    inline data (rule P3 concerns the serialized form)."""
    h = t.header
    if t.external is not None and len(h.raw_data):
        return replace(h, raw_data=b"")
    return h


def _tensor_refs(t: object, path: str) -> list[ExternalSpec]:
    """The external reference of an IR tensor: the one the loader parsed, or the one of a
    TensorProto the IR keeps serialized (typed fields, or inline and external data both)."""
    if not isinstance(t, Tensor):
        return []
    if t.external is not None:
        return [(f"{path}.external_data", tuple(t.external.to_entries()))]
    return serialized_refs(t.proto, path) if t.proto is not None else []


def _sparse_refs(data: object, path: str) -> list[ExternalSpec]:
    """The external references of a sparse tensor the IR keeps as serialized bytes."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        return serialized_refs(data, path, sparse=True)
    return []


_TENSOR_ATTRS = frozenset({AttrType.TENSOR, AttrType.TENSORS, AttrType.SPARSE_TENSOR, AttrType.SPARSE_TENSORS})


def _attribute_refs(nodes: list[Node], views: list[NodeView]) -> Iterator[ExternalSpec]:
    for n, nv in zip(nodes, views):
        for a in n.attributes.values():
            if a.type not in _TENSOR_ATTRS:
                continue
            apath = f"{nv.path}.attribute[{a.name!r}]"
            if a.type == AttrType.TENSOR:
                yield from _tensor_refs(a.value, f"{apath}.t")
            elif a.type == AttrType.TENSORS:
                for k, t in enumerate(a.value or []):
                    yield from _tensor_refs(t, f"{apath}.tensors[{k}]")
            elif a.type == AttrType.SPARSE_TENSOR:
                yield from _sparse_refs(a.value, f"{apath}.sparse_tensor")
            elif a.type == AttrType.SPARSE_TENSORS:
                for k, data in enumerate(a.value or []):
                    yield from _sparse_refs(data, f"{apath}.sparse_tensors[{k}]")


def _external_refs(g: Graph, nodes: list[NodeView], path: str) -> Iterator[ExternalSpec]:
    """External references of the graph's dense and sparse initializers and of its nodes'
    tensor attributes (rule P7); payloads are never read."""
    for name, v in g.initializers.items():
        yield from _tensor_refs(v.const, f"{path}.initializer[{name!r}]")
    for name, data in g.sparse_initializers.items():
        yield from _sparse_refs(data, f"{path}.sparse_initializer[{name!r}]")
    yield from _attribute_refs(list(g), nodes)


def _graph(g: Graph, path: str, is_main: bool) -> GraphView:
    nodes = [_node(n, f"{path}.node[{i}]") for i, n in enumerate(g)]
    return GraphView(
        path=path,
        name=g.name,
        is_main=is_main,
        inputs=[_spec(v) for v in g.inputs],
        outputs=[_spec(v) for v in g.outputs],
        value_infos=_value_infos(g),
        initializers=list(g.initializers),
        sparse_initializers=list(g.sparse_initializers),
        encoded=[_wire_header(v.const) for v in g.encoded_initializers.values()
                 if isinstance(v.const, EncodedTensor)],
        nodes=nodes,
        bindings=[(i.name, o.name) for i, o in g.bindings],
        int_values=_IntValues(g),
        external_refs=list(_external_refs(g, nodes, path)),
        ref=g,
    )


def _function(f: Function) -> FunctionView:
    path = f.path()
    nodes = [_node(n, f"{path}.node[{i}]") for i, n in enumerate(f)]
    return FunctionView(
        path=path, domain=f.domain, name=f.name, overload=f.overload,
        inputs=[v.name for v in f.inputs], outputs=[v.name for v in f.outputs],
        value_infos=_value_infos(f),
        nodes=nodes,
        external_refs=list(_attribute_refs(list(f), nodes)),
        ref=f,
    )


def model_view(model: Model) -> ModelView:
    """Verification view of an IR model."""
    cat: list[StructType] = list(model.struct_types)
    return ModelView(
        struct_types=cat,
        graph=_graph(model.graph, "graph", True),
        functions=[_function(f) for f in model.functions.values()],
        model_dir=model.model_dir,
        opsets=dict(model.opset_imports),
    )
