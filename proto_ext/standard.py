"""The standard part of a model, as onnx's own checker sees it (rules X1 and X2).

:func:`skeleton` builds, from the verification view (``proto_ext.view``), a stock
``onnx.ModelProto`` without payloads that ``onnx.checker.check_model(full_check=True)``
can judge:

- dense and sparse initializers become main-graph inputs of their type (data type and
  dims, no bytes); small integer initializers, whose elements the view has read
  already (shapes, axes, indices), stay initializers with those elements, so that
  shape inference sees them;
- an encoded initializer becomes a main-graph input of its logical tensor type; one
  without a logical tensor type is a struct value;
- struct-typed values are left out, with the nodes that consume or produce them and
  everything computed from those (a control-flow node whose body loses a node is left
  out whole);
- a ``Constant`` tensor becomes a main-graph input of its type, unless it holds a few
  integers; the value_info of a ``Constant``'s output is not written, since the tensor
  itself types the value (onnxruntime-genai's builder declares its ``[1]`` constants
  as scalars, which onnxruntime ignores and strict inference would reject);
- calls of local functions and default-domain operators that onnx does not define
  (``SimplifiedLayerNormalization`` of onnxruntime-genai) move to the unchecked domain
  ``onnxforge.unchecked``: their outputs are untyped, the rest is checked;
- a main-graph input of unknown rank is left out like a struct value, and an output of
  unknown rank is written as a value_info (stock ONNX wants their shapes; onnxruntime
  and onnxforge do not);
- extension fields (aliases, access, bindings, struct catalogue) are not written.

Each node of the skeleton is named ``__nodeK``; :func:`standard_violations` maps the
checker's and shape inference's messages back to the node's object path and reports
them as rule X1. :func:`required_input_violations` states rule X2 (a standard
operator's required inputs are non-empty names) over every graph and local function.
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import onnx
from onnx import AttributeProto, TensorProto

from onnxforge.proto_ext.convert import type_to_proto
from onnxforge.proto_ext.errors import Violation
from onnxforge.proto_ext.types import MapType, OptionalType, SequenceType, StructType, TensorType, Type
from onnxforge.proto_ext.view import GraphView, ModelView, NodeView

__all__ = ["STANDARD_DOMAINS", "UNCHECKED_DOMAIN", "required_input_violations", "skeleton",
           "standard_violations"]

STANDARD_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml", "ai.onnx.training", "ai.onnx.preview.training"})
UNCHECKED_DOMAIN = "onnxforge.unchecked"
_SMALL = 64
"""A ``Constant`` or tensor attribute of at most this many elements keeps its elements."""
_INTEGERS = frozenset({TensorProto.INT64, TensorProto.INT32})
_TAG = "__node"
_TAG_RE = re.compile(r"__node(\d+)")
_CHECKER_ERRORS: tuple[type[BaseException], ...] = (
    onnx.checker.ValidationError, onnx.shape_inference.InferenceError,
    ValueError)  # what onnx's C++ raises for values it cannot represent (a data type 99)


def _is_struct(t: Type) -> bool:
    """``t`` holds a struct type at some depth (not expressible in stock ONNX)."""
    while True:
        if isinstance(t, StructType):
            return True
        if isinstance(t, (SequenceType, OptionalType)):
            t = t.elem
        elif isinstance(t, MapType):
            t = t.value
        else:
            return False


def _shapeless(t: Type) -> bool:
    """A tensor type of unknown rank (onnx's checker wants a shape on main-graph inputs
    and outputs; onnxruntime and onnxforge take such values)."""
    return isinstance(t, TensorType) and t.shape is None


_schemas: dict[tuple[str, str, int], Any] = {}


def schema_of(op_type: str, domain: str, version: int) -> Any:
    """onnx's schema of a standard operator at opset ``version``, or None."""
    key = (op_type, domain, version)
    if key not in _schemas:
        d = "" if domain == "ai.onnx" else domain
        try:
            _schemas[key] = onnx.defs.get_schema(op_type, version, d)
        except onnx.defs.SchemaError:
            _schemas[key] = None
    return _schemas[key]


def _opset(opsets: dict[str, int], domain: str) -> int | None:
    if domain in ("", "ai.onnx"):
        return opsets.get("", opsets.get("ai.onnx"))
    return opsets.get(domain)


# ------------------------------------------------------------------------ skeleton


def _typed(vi: onnx.ValueInfoProto, t: Type, memo: dict[Any, bytes]) -> None:
    """Write type record ``t`` into ``vi.type`` (serialized once per distinct type)."""
    try:
        data = memo.get(t)
    except TypeError:  # a record holding something unhashable
        type_to_proto(t, vi.type)
        return
    if data is None:
        data = memo[t] = type_to_proto(t, onnx.TypeProto()).SerializeToString()
    vi.type.MergeFromString(data)
    if not data:
        vi.type.SetInParent()


class _Builder:
    def __init__(self, view: ModelView):
        self.view = view
        self.opsets = dict(view.opsets)
        self.local = {(f.domain, f.name) for f in view.functions}
        self.paths: list[str] = []
        self.dropped: set[str] = set()
        self.domains: set[str] = set()
        self.main = onnx.GraphProto()
        self.types: dict[Any, bytes] = {}

    # -- values
    def _hoist(self, name: str, t: Type) -> None:
        _typed(self.main.input.add(name=name), t, self.types)

    def _hoist_in(self, out: onnx.GraphProto, name: str, t: Type, path: str) -> None:
        """Value ``name`` of graph ``out`` as a main-graph input of type ``t``; in a
        subgraph, an Identity of such an input keeps the name local (a subgraph output
        must be made inside it)."""
        if out is self.main:
            self._hoist(name, t)
            return
        tag = f"{_TAG}{len(self.paths)}"
        self._hoist(f"{tag}.value", t)
        out.node.add(op_type="Identity", name=tag, input=[f"{tag}.value"], output=[name])
        self.paths.append(path)

    def _initializer_types(self, g: GraphView) -> dict[str, tuple[int, tuple[int, ...]]]:
        out: dict[str, tuple[int, tuple[int, ...]]] = {}
        if g.proto is not None:
            for t in g.proto.initializer:
                out.setdefault(t.name, (t.data_type, tuple(t.dims)))
            for s in g.proto.sparse_initializer:
                out.setdefault(s.values.name, (s.values.data_type, tuple(s.dims)))
        elif g.ref is not None:
            for name, v in g.ref.initializers.items():
                const = v.const
                if const is not None and hasattr(const, "dims"):
                    out[name] = (const.dtype, tuple(const.dims))
            for name, data in g.ref.sparse_initializers.items():
                sp = onnx.SparseTensorProto()
                sp.ParseFromString(bytes(data))
                out[name] = (sp.values.data_type, tuple(sp.dims))
        return out

    # -- graphs
    def graph(self, g: GraphView, out: onnx.GraphProto) -> bool:
        """Write ``g`` into ``out``; False when something of a subgraph's interface or
        body had to be left out (its control-flow node is then left out whole)."""
        main = g.is_main
        out.name = g.name or "graph"
        struct_names = {v.name for v in (*g.outputs, *g.value_infos) if v.has_type and _is_struct(v.type)}
        encoded = {e.name: e for e in g.encoded if e.name}
        input_names = {v.name for v in g.inputs}
        for v in g.inputs:
            e = encoded.get(v.name)
            t = v.type
            if e is not None and (t is None or _is_struct(t)):
                t = e.logical_type if isinstance(e.logical_type, TensorType) else None
                if t is None:
                    self.dropped.add(v.name)
                    if not main:
                        return False
                    continue
            elif t is not None and (_is_struct(t) or main and _shapeless(t)):
                self.dropped.add(v.name)
                if not main:
                    return False
                continue
            vi = out.input.add(name=v.name)
            if v.has_type:
                _typed(vi, t, self.types)
        types = self._initializer_types(g)
        for name in (*g.initializers, *g.sparse_initializers):
            if not name or name in input_names:
                continue
            dtype, dims = types.get(name, (TensorProto.UNDEFINED, ()))
            values = g.int_values.get(name) if name not in g.sparse_initializers else None
            if values is not None and dtype in (TensorProto.INT64, TensorProto.INT32):
                t = out.initializer.add()
                t.name, t.data_type = name, dtype
                t.dims.extend(dims)
                (t.int64_data if dtype == TensorProto.INT64 else t.int32_data).extend(values)
            else:
                self._hoist_in(out, name, TensorType(dtype, dims), f"{g.path}.initializer[{name!r}]")
        for e in g.encoded:
            if not e.name or e.name in input_names:
                continue
            if isinstance(e.logical_type, TensorType):
                self._hoist_in(out, e.name, e.logical_type, f"{g.path}.encoded_initializer[{e.name!r}]")
            else:
                self.dropped.add(e.name)
        constants = {nv.outputs[0] for nv in g.nodes
                     if nv.op_type == "Constant" and nv.domain in ("", "ai.onnx") and len(nv.outputs) == 1}
        complete = True
        for nv in g.nodes:
            if not self.node(nv, out, struct_names):
                complete = False
        for v in g.outputs:
            if v.name in self.dropped or (v.has_type and _is_struct(v.type)):
                if not main:
                    return False
                continue
            if main and v.type is not None and _shapeless(v.type):
                # stock graph outputs need a shape: the elem type is still checked
                _typed(out.value_info.add(name=v.name), v.type, self.types)
                continue
            vi = out.output.add(name=v.name)
            if v.has_type and v.type is not None:
                _typed(vi, v.type, self.types)
        for v in g.value_infos:
            if (v.name in self.dropped or not v.has_type or v.type is None or _is_struct(v.type)
                    or v.name in constants):
                continue
            _typed(out.value_info.add(name=v.name), v.type, self.types)
        return complete or main

    def _drop(self, nv: NodeView) -> bool:
        self.dropped.update(o for o in nv.outputs if o)
        return False

    def node(self, nv: NodeView, out: onnx.GraphProto, struct_names: set[str]) -> bool:
        dropped = self.dropped
        if dropped and any(i in dropped for i in nv.inputs if i) or \
                struct_names and any(o in struct_names for o in nv.outputs):
            return self._drop(nv)
        domain = nv.domain
        standard = domain in STANDARD_DOMAINS
        if standard:
            version = _opset(self.opsets, domain)
            if (domain, nv.op_type) in self.local or \
                    version is not None and schema_of(nv.op_type, domain, version) is None:
                domain, standard = UNCHECKED_DOMAIN, False
            elif nv.op_type == "Constant" and self._large_constant(nv, out):
                return True
        elif (domain, nv.op_type) in self.local:
            domain = UNCHECKED_DOMAIN
        node = out.node.add(op_type=nv.op_type, domain=domain, name=f"{_TAG}{len(self.paths)}",
                            input=nv.inputs, output=nv.outputs)
        if not standard:
            self.domains.add(domain)
        elif not self._attributes(nv, node):
            del out.node[-1]
            return self._drop(nv)
        self.paths.append(nv.path)
        return True

    # -- attributes
    def _large_constant(self, nv: NodeView, out: onnx.GraphProto) -> bool:
        """A Constant tensor becomes an input of its type unless it holds at most
        ``_SMALL`` integers (what shape inference reads: shapes, axes, indices)."""
        for kind, dtype, dims in self._tensor_attrs(nv):
            if kind in ("value", "sparse_value") and len(nv.outputs) == 1:
                size = 1
                for d in dims:
                    size *= d
                if kind == "sparse_value" or size > _SMALL or dtype not in _INTEGERS:
                    self._hoist_in(out, nv.outputs[0], TensorType(dtype, dims), nv.path)
                    return True
        return False

    def _tensor_attrs(self, nv: NodeView) -> Iterable[tuple[str, int, tuple[int, ...]]]:
        if nv.proto is not None:
            for a in nv.proto.attribute:
                if a.type == AttributeProto.TENSOR:
                    yield a.name, a.t.data_type, tuple(a.t.dims)
                elif a.type == AttributeProto.SPARSE_TENSOR:
                    yield a.name, a.sparse_tensor.values.data_type, tuple(a.sparse_tensor.dims)
        elif nv.ref is not None:
            for a in nv.ref.attributes.values():
                if a.type == AttributeProto.TENSOR and a.value is not None:
                    yield a.name, a.value.dtype, tuple(a.value.dims)
                elif a.type == AttributeProto.SPARSE_TENSOR and a.value is not None:
                    sp = onnx.SparseTensorProto()
                    sp.ParseFromString(bytes(a.value))
                    yield a.name, sp.values.data_type, tuple(sp.dims)

    def _attributes(self, nv: NodeView, node: onnx.NodeProto) -> bool:
        graphs: dict[str, list[GraphView]] = {}
        for aname, sub in nv.subgraphs:
            graphs.setdefault(aname, []).append(sub)
        if nv.proto is not None:
            for a in nv.proto.attribute:
                if a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS):
                    continue
                node.attribute.add().ParseFromString(a.SerializeToString())
        elif nv.ref is not None:
            for a in nv.ref.attributes.values():
                if a.type not in (AttributeProto.GRAPH, AttributeProto.GRAPHS):
                    _ir_attribute(a, node.attribute.add())
        ref_types = self._graph_attr_types(nv) if graphs else {}
        for aname, subs in graphs.items():
            attr = node.attribute.add()
            attr.name = aname
            if ref_types.get(aname, AttributeProto.GRAPH) == AttributeProto.GRAPHS:
                attr.type = AttributeProto.GRAPHS
                for sub in subs:
                    if not self.graph(sub, attr.graphs.add()):
                        return False
            else:
                attr.type = AttributeProto.GRAPH
                if not self.graph(subs[0], attr.g):
                    return False
        return True

    @staticmethod
    def _graph_attr_types(nv: NodeView) -> dict[str, int]:
        if nv.proto is not None:
            return {a.name: a.type for a in nv.proto.attribute
                    if a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS)}
        if nv.ref is not None:
            return {a.name: a.type for a in nv.ref.attributes.values()
                    if a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS)}
        return {}


def _ir_tensor(t: Any, out: TensorProto) -> None:
    """An IR tensor's header and (when small) elements into ``out``."""
    if getattr(t, "proto", None) is not None:
        out.ParseFromString(bytes(t.proto))
        return
    out.data_type = t.dtype
    out.dims.extend(t.dims)
    if t.name:
        out.name = t.name
    size = 1
    for d in t.dims:
        size *= d
    if t.raw is not None:
        out.raw_data = bytes(t.raw)
    elif getattr(t, "array", None) is not None:
        out.CopyFrom(onnx.numpy_helper.from_array(t.array, t.name))
    elif size:
        out.raw_data = bytes(t.numpy().tobytes())


def _ir_attribute(a: Any, out: AttributeProto) -> None:
    """An IR attribute (``graphbuilder.ir.core.Attr``: name, type code, value) into ``out``."""
    out.name, out.type = a.name, a.type
    if a.ref_attr_name:
        out.ref_attr_name = a.ref_attr_name
        return
    v, k = a.value, a.type
    if v is None:
        return
    if k == AttributeProto.FLOAT:
        out.f = v
    elif k == AttributeProto.INT:
        out.i = v
    elif k == AttributeProto.STRING:
        out.s = v.encode() if isinstance(v, str) else bytes(v)
    elif k == AttributeProto.FLOATS:
        out.floats.extend(v)
    elif k == AttributeProto.INTS:
        out.ints.extend(v)
    elif k == AttributeProto.STRINGS:
        out.strings.extend(s.encode() if isinstance(s, str) else bytes(s) for s in v)
    elif k == AttributeProto.TENSOR:
        _ir_tensor(v, out.t)
    elif k == AttributeProto.TENSORS:
        for t in v:
            _ir_tensor(t, out.tensors.add())
    elif k == AttributeProto.SPARSE_TENSOR:
        out.sparse_tensor.ParseFromString(bytes(v))
    elif k == AttributeProto.SPARSE_TENSORS:
        for data in v:
            out.sparse_tensors.add().ParseFromString(bytes(data))
    elif k == AttributeProto.TYPE_PROTO:
        type_to_proto(v, out.tp)
    elif k == AttributeProto.TYPE_PROTOS:
        for t in v:
            type_to_proto(t, out.type_protos.add())


def skeleton(view: ModelView) -> tuple[onnx.ModelProto, list[str]]:
    """The payload-free standard part of ``view`` and the object path of each node
    (the node named ``__nodeK`` is ``paths[K]``)."""
    b = _Builder(view)
    b.graph(view.graph, b.main)
    model = onnx.ModelProto()
    model.ir_version = onnx.IR_VERSION
    for domain, version in view.opsets.items():
        op = model.opset_import.add()
        op.domain, op.version = domain, version
    for domain in sorted(b.domains - set(view.opsets)):
        op = model.opset_import.add()
        op.domain, op.version = domain, 1
    model.graph.CopyFrom(b.main)
    return model, b.paths


# ------------------------------------------------------------------------ rule X1


def _message(text: str, paths: list[str]) -> tuple[str, str]:
    """(object path, message) of one checker error: the innermost node it names."""
    body = text.split("==> Context:")[0].strip() or text.strip()
    tags = _TAG_RE.findall(text)
    path = "graph"
    if tags:
        k = int(tags[-1])
        if k < len(paths):
            path = paths[k]

    def named(m: re.Match[str]) -> str:
        k = int(m.group(1))
        return paths[k] if k < len(paths) else m.group(0)

    body = _TAG_RE.sub(named, " ".join(body.split()))
    return path, body


def standard_violations(view: ModelView) -> list[Violation]:
    """Rule X1: the standard part of the model passes ``onnx.checker.check_model`` with
    ``full_check=True`` (type and shape inference in strict mode)."""
    model, paths = skeleton(view)
    try:
        onnx.checker.check_model(model, full_check=True)
    except _CHECKER_ERRORS as exc:
        path, message = _message(str(exc), paths)
        return [Violation("X1", path, f"onnx.checker (full_check): {message}")]
    return []


# ------------------------------------------------------------------------ rule X2


def _node_required(nv: NodeView, opsets: dict[str, int]) -> Iterable[str]:
    """Why node ``nv`` lacks a required input (nothing when it does not)."""
    if nv.domain not in STANDARD_DOMAINS:
        return
    version = _opset(opsets, nv.domain)
    schema = None if version is None else schema_of(nv.op_type, nv.domain, version)
    if schema is None:
        return
    formals = schema.inputs
    variadic = onnx.defs.OpSchema.FormalParameterOption.Variadic
    optional = onnx.defs.OpSchema.FormalParameterOption.Optional
    n = len(nv.inputs)
    for k, p in enumerate(formals):
        if p.option == variadic:
            given = [x for x in nv.inputs[k:] if x]
            if len(given) < p.min_arity:
                yield (f"{nv.op_type} needs at least {p.min_arity} non-empty input(s) for its "
                       f"variadic {p.name!r}, got {len(given)}")
            break
        if p.option == optional:
            continue
        if k >= n or not nv.inputs[k]:
            got = "missing" if k >= n else "the empty name"
            yield f"{nv.op_type} input {k} ({p.name!r}) is required but is {got}"
    if n > schema.max_input:
        yield f"{nv.op_type} takes at most {schema.max_input} input(s), got {n}"


def required_input_violations(view: ModelView, graphs: Iterable[GraphView]) -> list[Violation]:
    """Rule X2 over ``graphs`` and the local functions of ``view``."""
    out: list[Violation] = []
    bodies: list[Iterable[NodeView]] = [g.nodes for g in graphs]
    bodies.extend(f.nodes for f in view.functions)
    for nodes in bodies:
        for nv in nodes:
            for message in _node_required(nv, view.opsets):
                out.append(Violation("X2", nv.path, message))
    return out
