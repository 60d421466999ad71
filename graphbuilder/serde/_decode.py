"""Extended ``ModelProto`` -> IR (:class:`~onnxforge.graphbuilder.ir.core.Model`).

One :class:`Decoder` converts one model. Names become Values through scopes:
a graph's scope holds its inputs, initializers and node outputs, and a
subgraph's scope chains to the scope of the graph that owns it, so a subgraph
node input naming an outer value points at that outer :class:`Value`. A name
that no scope defines becomes a free-standing Value (no producer, no graph),
shared by every use of that name in the same top-level graph or function.

Nodes are created in file order with inputs looked up in the local scope;
inputs that are not defined yet (a graph that is not topologically sorted, or
an outer value) are bound once every node of the graph exists. Subgraphs are
converted after their owner's nodes, so they see the complete outer scope.
Tensors and encoded values are converted by :mod:`._tensors`.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from onnx import AttributeProto as _AP

from onnxforge.proto_ext.errors import VerificationError, Violation
from onnxforge.graphbuilder.ir.core import Alias, Attr, Function, Graph, Model, Node, Value
from onnxforge.graphbuilder.serde import _common as C
from onnxforge.graphbuilder.serde._tensors import TensorDecoder, Where
from onnxforge.graphbuilder.ir.tensors import EncodedTensor, Tensor
from onnxforge.proto_ext import schema
from onnxforge.proto_ext.convert import struct_from_proto, struct_to_proto, type_from_proto, type_to_proto
from onnxforge.proto_ext.external import ExternalDataCache
from onnxforge.proto_ext.types import StructType, TensorType, Type

__all__ = ["Decoder", "fast_objects"]

Payloads = Mapping[tuple[str, int], memoryview]

# AttributeProto: attribute type -> field number / name of its value field.
_VALUE_FIELD_NUMBER = {_AP.FLOAT: 2, _AP.INT: 3, _AP.STRING: 4, _AP.TENSOR: 5, _AP.GRAPH: 6,
                       _AP.FLOATS: 7, _AP.INTS: 8, _AP.STRINGS: 9, _AP.TENSORS: 10, _AP.GRAPHS: 11,
                       _AP.TYPE_PROTO: 14, _AP.TYPE_PROTOS: 15, _AP.SPARSE_TENSOR: 22,
                       _AP.SPARSE_TENSORS: 23}
_VALUE_FIELD_NAME: dict[int, str] = {t: schema.AttributeProto.DESCRIPTOR.fields_by_number[n].name
                     for t, n in _VALUE_FIELD_NUMBER.items()}
_LIST_TYPES = frozenset({_AP.FLOATS, _AP.INTS, _AP.STRINGS, _AP.TENSORS, _AP.GRAPHS,
                         _AP.TYPE_PROTOS, _AP.SPARSE_TENSORS})

_NODE_UNMODELED = C.unmodeled_fields("NodeProto", (
    "input", "output", "name", "op_type", "domain", "overload", "attribute", "doc_string",
    "metadata_props", "output_alias"))
_NODE_UNMODELED_REPEATED = tuple(f for f in _NODE_UNMODELED
                                 if schema.NodeProto.DESCRIPTOR.fields_by_name[f].is_repeated)
_NODE_UNMODELED_SINGLE = tuple(f for f in _NODE_UNMODELED if f not in _NODE_UNMODELED_REPEATED)
_GRAPH_UNMODELED = C.unmodeled_fields("GraphProto", (
    "node", "name", "initializer", "sparse_initializer", "doc_string", "input", "output",
    "value_info", "metadata_props", "encoded_initializer", "persistent_bindings"))
_MODEL_UNMODELED = C.unmodeled_fields("ModelProto", (
    "ir_version", "opset_import", "producer_name", "producer_version", "domain", "model_version",
    "doc_string", "graph", "metadata_props", "functions", "struct_types"))
_MODEL_SCALARS = ("ir_version", "producer_name", "producer_version", "domain", "model_version",
                  "doc_string")

# --------------------------------------------------------------------------- fast object creation
# Node and Value are created by the hundred thousand on large models; filling their
# slots directly is about twice as fast as the constructors. The layout is checked at
# import time: if ir.py changes the slots, the constructors are used instead.
_VALUE_LAYOUT = ("name", "type", "_producer", "_index", "_uses", "graph", "doc_string", "metadata",
                 "access", "alias_of", "const", "has_value_info", "extra", "meta", "__weakref__")
_NODE_LAYOUT = ("domain", "op_type", "overload", "name", "_inputs", "_outputs", "attributes",
                "doc_string", "metadata", "output_alias", "graph", "_prev", "_next", "extra",
                "meta", "__weakref__")


def fast_objects() -> bool:
    """True when Node/Value have the slot layout the fast constructors fill and node
    lists keep the head/tail/count fields that the fast linking sets."""
    if Value.__slots__ != _VALUE_LAYOUT or Node.__slots__ != _NODE_LAYOUT:
        return False
    probe = Graph()
    return all(hasattr(probe, a) for a in ("_head", "_tail", "_count"))


_FAST = fast_objects()
_new = object.__new__


def _make_node(domain: str, op_type: str, inputs: list[Value | None], out_names: Any, name: str,
               attributes: dict[str, Attr], overload: str, doc: str, metadata: dict[str, str],
               aliases: list[Alias], extra: bytes) -> Node:
    if not _FAST:
        node = Node(domain, op_type, inputs, list(out_names), name=name, attributes=attributes,
                    overload=overload, doc_string=doc, output_alias=aliases)
        node.metadata = metadata
        node.extra = extra
        return node
    node = _new(Node)
    node.domain = domain
    node.op_type = op_type
    node.overload = overload
    node.name = name
    node.attributes = attributes
    node.doc_string = doc
    node.metadata = metadata
    node.output_alias = aliases
    node.graph = None
    node._prev = None
    node._next = None
    node.extra = extra
    node.meta = {}
    node._inputs = inputs
    j = 0
    for v in inputs:
        if v is not None:
            v._uses[(node, j)] = None
        j += 1
    outs = []
    j = 0
    for nm in out_names:
        v = _new(Value)
        v.name = nm
        v.type = None
        v._producer = node
        v._index = j
        v._uses = {}
        v.graph = None
        v.doc_string = ""
        v.metadata = {}
        v.access = 0
        v.alias_of = None
        v.const = None
        v.has_value_info = False
        v.extra = b""
        v.meta = {}
        outs.append(v)
        j += 1
    node._outputs = outs
    return node


def _text(b: bytes) -> str | bytes:
    """An attribute string as ``str`` when it is UTF-8, else the raw bytes."""
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return b


class _Scope:
    """Names visible in one graph or function body; ``parent`` is the enclosing scope."""

    __slots__ = ("names", "parent", "owner", "free")

    def __init__(self, owner: Graph | Function, parent: _Scope | None):
        self.names: dict[str, Value] = {}
        self.parent = parent
        self.owner = owner
        self.free: dict[str, Value] = parent.free if parent is not None else {}

    def lookup(self, name: str) -> Value | None:
        s: _Scope | None = self
        while s is not None:
            v = s.names.get(name)
            if v is not None:
                return v
            s = s.parent
        return None

    def resolve(self, name: str) -> Value:
        """The visible Value named ``name``, or the free Value standing for an undefined name."""
        v = self.lookup(name)
        if v is None:
            v = self.free.get(name)
            if v is None:
                v = self.free[name] = Value(name)
        return v


def _opsets_exact(entries: Any, clean: bool) -> tuple[dict[str, int], bool]:
    out: dict[str, int] = {}
    exact = True
    for o in entries:
        d = o.domain
        if d in out:
            exact = False
        out[d] = o.version
        if not (o.HasField("domain") and o.HasField("version")):
            exact = False
        if not clean and C.has_unknown(o):
            exact = False
    return out, exact


class Decoder:
    """Converts one extended ``ModelProto`` into an IR :class:`Model`.

    ``clean`` promises that no message of the model carries unknown fields (the
    loader checks it once for the whole model), which skips the per-message
    unknown-field probes. ``payloads`` maps ``("initializer" | "encoded", index)``
    of the main graph to payload views that replace stripped ``raw_data``.
    ``cache`` maps external data; without it external payloads stay unmapped.
    """

    def __init__(self, *, clean: bool = False, payloads: Payloads | None = None,
                 cache: ExternalDataCache | None = None, model_dir: str | None = None):
        self.clean = clean
        self.payloads: Payloads = payloads or {}
        self.tensors = TensorDecoder(clean=clean, cache=cache)
        self.model_dir = model_dir
        self._types: dict[bytes, tuple[Type, bool]] = {}
        self._tensor_types: dict[tuple[int, tuple[int, ...]], TensorType] = {}
        self._aliases: list[tuple[Value, _Scope]] = []

    # ------------------------------------------------------------------ model
    def model(self, mp: Any) -> Model:
        has: set[str] = {f for f in _MODEL_SCALARS if mp.HasField(f)}
        copy: list[str] = [f for f in _MODEL_UNMODELED if C.present(mp, f)]
        parts: list[bytes] = []
        ops, exact = _opsets_exact(mp.opset_import, self.clean)
        if not exact:
            copy.append("opset_import")
        meta, exact = C.meta_exact(mp.metadata_props, self.clean)
        if not exact:
            copy.append("metadata_props")
        structs = []
        exact = True
        for sp in mp.struct_types:
            rec = struct_from_proto(sp)
            structs.append(rec)
            if exact and struct_to_proto(rec, schema.StructTypeProto()).SerializeToString() \
                    != sp.SerializeToString():
                exact = False
        if not exact:
            copy.append("struct_types")
        functions: dict[tuple[str, str, str], Function] = {}
        dup_functions = schema.ModelProto()
        for k, fp in enumerate(mp.functions):
            fn = self.function(fp, f"functions[{k}]")
            if fn.id in functions:
                dup_functions.functions.add().CopyFrom(fp)
            else:
                functions[fn.id] = fn
        if len(dup_functions.functions):
            parts.append(dup_functions.SerializeToString())
        if mp.HasField("graph"):
            has.add("graph")
            graph = self.graph(mp.graph, None, "graph", main=True)
        else:
            graph = Graph()
        unknown = not self.clean and C.has_unknown(mp)
        extra = b""
        if copy or unknown or parts:
            extra = C.join_extra(mp, "ModelProto", copy=copy, unknown=unknown) + b"".join(parts)
        return Model(
            graph=graph, opset_imports=ops, ir_version=mp.ir_version,
            producer_name=mp.producer_name, producer_version=mp.producer_version,
            domain=mp.domain, model_version=mp.model_version, doc_string=mp.doc_string,
            metadata=meta, functions=functions, struct_types=structs,
            model_dir=self.model_dir, extra=extra, has_fields=has)

    # ------------------------------------------------------------------ graphs
    def graph(self, gp: Any, parent: _Scope | None, path: str, *, main: bool = False) -> Graph:
        g = Graph(gp.name, doc_string=gp.doc_string)
        presence: list[str] = []
        if not g.name and gp.HasField("name"):
            presence.append("name")
        if not g.doc_string and gp.HasField("doc_string"):
            presence.append("doc_string")
        copy: list[str] = [f for f in _GRAPH_UNMODELED if C.present(gp, f)]
        keep = schema.GraphProto()  # repeated entries the IR cannot hold (duplicates, orphans)
        scope = _Scope(g, parent)
        local = scope.names
        vi_bytes: dict[int, bytes] = {}

        for vi in gp.input:
            v = Value(vi.name)
            self._value_info(v, vi, scope)
            g.add_input(v)
            if v.name:
                local[v.name] = v

        payloads = self.payloads if main else {}
        tensor = self.tensors.tensor
        for k, tp in enumerate(gp.initializer):
            name = tp.name
            payload = payloads.get(("initializer", k))
            if name in g.initializers or name in g.encoded_initializers:
                _keep_duplicate(keep.initializer, tp, payload)
                continue
            t = tensor(tp, _at(path, "initializer", k), payload)
            _add_initializer(g, local, name, t, self._tensor_type(t.dtype, t.dims))

        for sp in gp.sparse_initializer:
            name = sp.values.name
            if name in g.sparse_initializers:
                keep.sparse_initializer.add().CopyFrom(sp)
                continue
            g.sparse_initializers[name] = sp.SerializeToString()
            v = local.get(name)
            if v is None or v not in g._input_set:
                v = Value(name)
                v.graph = g
                local[name] = v

        for k, ev in enumerate(gp.encoded_initializer):
            name = ev.name
            payload = payloads.get(("encoded", k))
            if name in g.initializers or name in g.encoded_initializers:
                _keep_duplicate(keep.encoded_initializer, ev, payload)
                continue
            et = self.tensors.encoded(ev, _at(path, "encoded_initializer", k), payload)
            h = et.header
            # what consumers see: the logical type, else the layout (or a category)
            seen_as = h.logical_type if h.logical_type is not None else (
                h.struct_type if h.struct_type is not None else StructType())
            _add_initializer(g, local, name, et, seen_as)

        self._body(g, gp.node, scope, path)

        # graph outputs: a node output of this graph is described by its (first) output entry
        claimed: set[int] = set()
        verbatim_outputs = False
        for vi in gp.output:
            v = scope.resolve(vi.name)
            if v._producer is not None and v.graph is g and id(v) not in claimed:
                claimed.add(id(v))
                self._value_info(v, vi, scope)
            elif not verbatim_outputs:
                if v in g._input_set and id(v) not in claimed:
                    # an input passed through: same descriptor as the input?
                    if not vi_bytes:
                        pairs = zip(g.inputs, gp.input, strict=True)
                        vi_bytes = {id(x): y.SerializeToString() for x, y in pairs}
                    verbatim_outputs = vi_bytes.get(id(v)) != vi.SerializeToString()
                    claimed.add(id(v))
                else:
                    verbatim_outputs = True
            g.outputs.append(v)
        if verbatim_outputs:
            keep.output.extend(gp.output)

        order: list[str] = []
        for vi in gp.value_info:
            v = local.get(vi.name)
            if (v is not None and v.graph is g and not v.has_value_info and id(v) not in claimed
                    and (v._producer is not None or v.const is not None) and v not in g._input_set):
                self._value_info(v, vi, scope)
                v.has_value_info = True
                order.append(v.name)
            else:
                keep.value_info.add().CopyFrom(vi)
        g.value_info_order = order

        if len(gp.persistent_bindings):
            if not self._bindings(g, gp.persistent_bindings, path):
                copy.append("persistent_bindings")
        self._finish(g, gp, "GraphProto", scope, presence, copy, keep)
        return g

    def _finish(self, owner: Graph | Function, msg: Any, kind: str, scope: _Scope, presence: list[str],
                copy: list[str], keep: Any) -> None:
        """Close a graph or function body: metadata, ``alias_of`` names, and the ``extra``
        blob (unmodeled fields, presence markers, unknown fields, entries kept verbatim)."""
        if len(msg.metadata_props):
            owner.metadata, exact = C.meta_exact(msg.metadata_props, self.clean)
            if not exact:
                copy.append("metadata_props")
        self._resolve_aliases(scope)
        unknown = not self.clean and C.has_unknown(msg)
        kept = keep.ByteSize()
        if presence or copy or unknown or kept:
            owner.extra = C.join_extra(msg, kind, copy=copy, presence=presence,
                                       unknown=unknown) + (keep.SerializeToString() if kept else b"")

    def _bindings(self, g: Graph, bindings: Any, path: str) -> bool:
        """Resolve persistent bindings (rule B2); return whether re-encoding is exact."""
        exact = True
        ins = {v.name: v for v in reversed(g.inputs)}
        outs = {v.name: v for v in reversed(g.outputs)}
        for k, b in enumerate(bindings):
            i_name, o_name = b.input_name, b.output_name
            iv, ov = ins.get(i_name), outs.get(o_name)
            if iv is None or ov is None:
                what = (f"input_name {i_name!r} names no graph input" if iv is None
                        else f"output_name {o_name!r} names no graph output")
                raise VerificationError(Violation("B2", f"{path}.persistent_bindings[{k}]", what))
            g.bindings.append((iv, ov))
            if not (b.HasField("input_name") and b.HasField("output_name")) or (
                    not self.clean and C.has_unknown(b)):
                exact = False
        return exact

    # ------------------------------------------------------------------ node lists
    def _body(self, owner: Graph | Function, nodes: Any, scope: _Scope, path: str) -> None:
        """Create ``nodes`` in ``owner`` (linked in order), bind inputs, convert subgraphs."""
        local = scope.names
        get = local.get
        pending: list[tuple[Node, int, str]] = []
        deferred: list[tuple[Attr, int, Any, str, Node]] = []
        clean = self.clean
        prev: Node | None = owner._tail
        count = 0
        for k, pn in enumerate(nodes):
            names = pn.input
            ins = list(map(get, names))
            op = pn.op_type
            dom = pn.domain
            name = pn.name
            presence: list[str] | None = None
            if not dom and pn.HasField("domain"):
                presence = ["domain"]
            if not name and pn.HasField("name"):
                presence = (presence or []) + ["name"]
            if not op and pn.HasField("op_type"):
                presence = (presence or []) + ["op_type"]
            overload = doc = ""
            if pn.HasField("overload"):
                overload = pn.overload
                if not overload:
                    presence = (presence or []) + ["overload"]
            if pn.HasField("doc_string"):
                doc = pn.doc_string
                if not doc:
                    presence = (presence or []) + ["doc_string"]
            copy: list[str] | None = None
            meta: dict[str, str]
            if len(pn.metadata_props):
                meta, exact = C.meta_exact(pn.metadata_props, clean)
                if not exact:
                    copy = ["metadata_props"]
            else:
                meta = {}
            aliases: list[Alias] = []
            if len(pn.output_alias):
                exact = True
                for a in pn.output_alias:
                    aliases.append(Alias(a.output_index, a.input_index, a.kind))
                    if len(a.ListFields()) != 3 or (not clean and C.has_unknown(a)):
                        exact = False
                if not exact:
                    copy = (copy or []) + ["output_alias"]
            for f in _NODE_UNMODELED_REPEATED:
                if len(getattr(pn, f)):
                    copy = (copy or []) + [f]
            for f in _NODE_UNMODELED_SINGLE:
                if pn.HasField(f):
                    copy = (copy or []) + [f]
            attrs: dict[str, Attr] = {}
            dup_attrs: bytes = b""
            mark = len(deferred)
            if len(pn.attribute):
                for pa in pn.attribute:
                    before = len(deferred)
                    a = self._attr(pa, deferred, path, k)
                    if a.name in attrs:  # a repeated attribute name: the later one stays verbatim
                        del deferred[before:]  # its subgraphs are not part of the IR
                        dup = schema.NodeProto()
                        dup.attribute.add().CopyFrom(pa)
                        dup_attrs += dup.SerializeToString()
                        continue
                    attrs[a.name] = a
            extra = b""
            unknown = not clean and C.has_unknown(pn)
            if presence or copy or unknown:
                extra = C.join_extra(pn, "NodeProto", copy=copy or (), presence=presence or (),
                                     unknown=unknown)
            extra += dup_attrs
            node = _make_node(dom, op, ins, pn.output, name, attrs, overload, doc, meta, aliases,
                              extra)
            for j in range(mark, len(deferred)):
                deferred[j] = deferred[j][:4] + (node,)
            if None in ins:
                j = 0
                for nm in names:
                    if nm and ins[j] is None:
                        pending.append((node, j, nm))
                    j += 1
            # link into owner and register outputs
            if _FAST:
                node.graph = owner  # type: ignore[assignment]
                node._prev = prev
                if prev is None:
                    owner._head = node
                else:
                    prev._next = node
                prev = node
                count += 1
                for v in node._outputs:
                    v.graph = owner  # type: ignore[assignment]
                    if v.name:
                        local[v.name] = v
            else:
                owner.append(node)
                for v in node._outputs:
                    if v.name:
                        local[v.name] = v
        if _FAST and count:
            owner._tail = prev
            owner._count += count
        for node, j, nm in pending:
            node.set_input(j, scope.resolve(nm))
        for attr, slot, sub, where, node in deferred:
            g = self.graph(sub, scope, where)
            g.parent = node
            if slot < 0:
                attr.value = g
            else:
                attr.value[slot] = g

    # ------------------------------------------------------------------ attributes
    def _attr(self, pa: Any, deferred: list, path: str, k: int) -> Attr:
        fl = pa.ListFields()
        if len(fl) == 3:
            (f0, name), (f1, val), (f2, atype) = fl
            if (f0.number == 1 and f2.number == 20 and name
                    and _VALUE_FIELD_NUMBER.get(atype) == f1.number
                    and atype != _AP.TYPE_PROTO and atype != _AP.TYPE_PROTOS
                    and (self.clean or not C.has_unknown(pa))):
                a = Attr(name, atype)
                a.value = self._attr_value(a, atype, val, deferred, path, k)
                return a
        return self._attr_general(pa, fl, deferred, path, k)

    def _attr_value(self, a: Attr, atype: int, val: Any, deferred: list, path: str, k: int) -> Any:
        if atype == _AP.INT or atype == _AP.FLOAT:
            return val
        if atype == _AP.INTS or atype == _AP.FLOATS:
            return list(val)
        if atype == _AP.STRING:
            return _text(val)
        if atype == _AP.STRINGS:
            return [_text(s) for s in val]
        where = (f"{path}.node[{k}].attribute[{a.name!r}]" if k >= 0
                 else f"{path}.attribute_proto[{a.name!r}]")
        if atype == _AP.TENSOR:
            return self.tensors.tensor(val, lambda: where + ".t")
        if atype == _AP.TENSORS:
            return [self.tensors.tensor(t, lambda j=j: f"{where}.tensors[{j}]")  # type: ignore[misc]
                    for j, t in enumerate(val)]
        if atype == _AP.GRAPH:
            deferred.append((a, -1, val, where + ".g", None))
            return None
        if atype == _AP.GRAPHS:
            for j, gp in enumerate(val):
                deferred.append((a, j, gp, f"{where}.graphs[{j}]", None))
            return [None] * len(val)
        if atype == _AP.SPARSE_TENSOR:
            return val.SerializeToString()
        if atype == _AP.SPARSE_TENSORS:
            return [s.SerializeToString() for s in val]
        if atype == _AP.TYPE_PROTO:
            return self._type(val)[0]
        if atype == _AP.TYPE_PROTOS:
            return [self._type(t)[0] for t in val]
        return None

    def _attr_general(self, pa: Any, fl: list, deferred: list, path: str, k: int) -> Attr:
        name = doc = ref = ""
        atype = 0
        presence: list[str] = []
        values: dict[str, Any] = {}
        for fd, v in fl:
            n = fd.number
            if n == 1:
                name = v
                if not v:
                    presence.append("name")
            elif n == 20:
                atype = v
                if not v:
                    presence.append("type")
            elif n == 13:
                doc = v
                if not v:
                    presence.append("doc_string")
            elif n == 21:
                ref = v
                if not v:
                    presence.append("ref_attr_name")
            else:
                values[fd.name] = v
        a = Attr(name, atype, doc_string=doc, ref_attr_name=ref)
        main = _VALUE_FIELD_NAME.get(atype)
        copy: list[str]
        if main is None:
            # untyped (legacy) or unknown attribute type: everything but the name stays verbatim
            a.type = 0
            copy = [fd.name for fd, _ in fl if fd.number not in (1, 13, 21)]
            presence = [p for p in presence if p != "type"]
        else:
            if main in values:
                a.value = self._attr_value(a, atype, values.pop(main), deferred, path, k)
                if atype == _AP.TYPE_PROTO:
                    if not self._type(getattr(pa, main))[1]:
                        values[main] = None
                elif atype == _AP.TYPE_PROTOS:
                    if not all(self._type(t)[1] for t in getattr(pa, main)):
                        values[main] = None
            else:
                a.value = [] if atype in _LIST_TYPES else None
            copy = list(values)
        unknown = not self.clean and C.has_unknown(pa)
        if copy or presence or unknown:
            a.extra = C.join_extra(pa, "AttributeProto", copy=copy, presence=presence,
                                   unknown=unknown)
        return a

    # ------------------------------------------------------------------ values
    def _type(self, tp: Any) -> tuple[Type, bool]:
        """Type record of a TypeProto and whether re-encoding it reproduces the bytes."""
        key = tp.SerializeToString()
        hit = self._types.get(key)
        if hit is None:
            rec = type_from_proto(tp)
            exact = rec is not None and \
                type_to_proto(rec, schema.TypeProto()).SerializeToString() == key
            hit = self._types[key] = (rec, exact)
        return hit

    def _tensor_type(self, dtype: int, dims: tuple[int, ...]) -> TensorType:
        key = (dtype, dims)
        t = self._tensor_types.get(key)
        if t is None:
            t = self._tensor_types[key] = TensorType(dtype, dims)
        return t

    def _value_info(self, v: Value, vi: Any, scope: _Scope) -> None:
        """Apply a ValueInfoProto to ``v`` (type, docs, metadata, access, alias_of)."""
        presence: list[str] = []
        copy: list[str] = []
        for fd, x in vi.ListFields():
            n = fd.number
            if n == 2:
                v.type, exact = self._type(x)
                if not exact:
                    copy.append("type")
            elif n == 1:
                if not x:
                    presence.append("name")
            elif n == 3:
                v.doc_string = x
                if not x:
                    presence.append("doc_string")
            elif n == 4:
                v.metadata, exact = C.meta_exact(x, self.clean)
                if not exact:
                    copy.append("metadata_props")
            elif n == 1000:
                v.access = x
                if not x:
                    presence.append("access")
            elif n == 1001:
                if x:
                    v.alias_of = x
                    self._aliases.append((v, scope))
                else:
                    presence.append("alias_of")
            else:
                copy.append(fd.name)
        unknown = not self.clean and C.has_unknown(vi)
        if presence or copy or unknown:
            v.extra = C.join_extra(vi, "ValueInfoProto", copy=copy, presence=presence,
                                   unknown=unknown)

    def _resolve_aliases(self, scope: _Scope) -> None:
        """Point ``alias_of`` names at their Values once ``scope`` is complete."""
        rest = []
        for v, s in self._aliases:
            if s is scope:
                target = scope.lookup(v.alias_of) if isinstance(v.alias_of, str) else None
                if target is not None:
                    v.alias_of = target
            else:
                rest.append((v, s))
        self._aliases = rest

    # ------------------------------------------------------------------ functions
    def function(self, fp: Any, path: str) -> Function:
        f = Function(fp.domain, fp.name, overload=fp.overload, doc_string=fp.doc_string)
        presence = [p for p in ("name", "domain", "overload", "doc_string")
                    if not getattr(fp, p) and fp.HasField(p)]
        copy: list[str] = []
        keep = schema.FunctionProto()
        scope = _Scope(f, None)
        local = scope.names
        for nm in fp.input:
            v = f.add_input(Value(nm))
            if nm:
                local[nm] = v
        f.attributes = list(fp.attribute)
        deferred: list = []
        for pa in fp.attribute_proto:
            a = self._attr(pa, deferred, path, -1)
            if a.name in f.attribute_defaults:
                keep.attribute_proto.add().CopyFrom(pa)
            else:
                f.attribute_defaults[a.name] = a
        self._body(f, fp.node, scope, path)
        for attr, slot, sub, where, _ in deferred:
            g = self.graph(sub, scope, where)
            if slot < 0:
                attr.value = g
            else:
                attr.value[slot] = g
        for nm in fp.output:
            f.outputs.append(scope.resolve(nm))
        order: list[str] = []
        for vi in fp.value_info:
            v = local.get(vi.name)
            if v is not None and v.graph is f and not v.has_value_info:
                self._value_info(v, vi, scope)
                v.has_value_info = True
                order.append(v.name)
            else:
                keep.value_info.add().CopyFrom(vi)
        f.value_info_order = order
        f.opset_imports, exact = _opsets_exact(fp.opset_import, self.clean)
        if not exact:
            copy.append("opset_import")
        self._finish(f, fp, "FunctionProto", scope, presence, copy, keep)
        return f


def _at(path: str, field: str, k: int) -> Where:
    return lambda: f"{path}.{field}[{k}]"


def _keep_duplicate(coll: Any, msg: Any, payload: memoryview | None) -> None:
    """Keep a second initializer of an existing name verbatim (with its stripped payload)."""
    dup = coll.add()
    dup.CopyFrom(msg)
    if payload is not None:
        dup.raw_data = bytes(payload)


def _add_initializer(g: Graph, local: dict[str, Value], name: str, const: Tensor | EncodedTensor,
                     type: Type) -> None:
    """Register an initializer: on the graph input of that name, else on a new Value of ``type``."""
    v = local.get(name)
    if v is None or v not in g._input_set or v.const is not None:
        v = Value(name)
        v.type = type
    g.add_initializer(v, const)
    local[name] = v
