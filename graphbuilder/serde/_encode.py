"""IR (:class:`~onnxforge.graphbuilder.ir.core.Model`) -> extended ``ModelProto``.

Where each payload goes is decided by a :class:`PayloadPlan`: inline in the
message, left out of the message and streamed by
:func:`onnxforge.proto_ext.wirescan.write_model` (main-graph initializers and
encoded initializers only), written to an external data file, or kept as a
reference to the external file it was loaded from.
"""
from __future__ import annotations

import os
import re
import uuid
from collections.abc import Callable, Container
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from onnx import AttributeProto as _AP
from onnx import TensorProto

from onnxforge.proto_ext.errors import CodecError, ExternalDataError
from onnxforge.graphbuilder.ir.core import Alias, Attr, Function, Graph, Model, Node, Value
from onnxforge.graphbuilder.serde import _common as C
from onnxforge.graphbuilder.ir.tensors import EncodedTensor, Tensor
from onnxforge.graphbuilder.ir.view import plain_type
from onnxforge.proto_ext import schema
from onnxforge.proto_ext.convert import (
    encoded_from_proto,
    encoded_to_proto,
    struct_from_proto,
    struct_to_proto,
    type_from_proto,
    type_to_proto,
)
from onnxforge.proto_ext.external import ExternalRef, write_external
from onnxforge.proto_ext.types import Type

__all__ = ["Encoder", "PayloadPlan"]

_EXTERNAL = TensorProto.EXTERNAL
_STRING = TensorProto.STRING
_SAFE_NAME = re.compile(r"[^A-Za-z0-9_.-]")
_BATCH_MAX = 1 << 20  # payloads below this size are gathered before writing
_FLUSH_AT = 16 << 20  # gathered bytes that trigger a write


def _nbytes(raw: Any) -> int:
    return raw.nbytes if isinstance(raw, memoryview) else len(raw)


def _meta_dict(entries: Any) -> dict[str, str]:
    return {e.key: e.value for e in entries}


@dataclass
class PayloadPlan:
    """Where payloads go while encoding.

    ``stream_min``: main-graph payloads of at least this many bytes are left out
    of the message and collected in ``streamed`` (``None``: every payload inline).
    ``out_dir``: folder the model is written to (``None``: in-memory encoding,
    external references are kept as they are). ``model_dir``: folder the model's
    external references are relative to. ``location``: write every payload of at
    least ``threshold`` bytes (and every payload that was external) to this
    external file (or, without ``one_file``, to one file per tensor in the
    location's folder). With ``only_external``, ``location`` receives the payloads
    that were external and no others; a reference that already points at
    ``location`` in the folder being written is kept as it is.

    External files are written under temporary names next to their final
    location; :meth:`commit` renames them once the model file is complete and
    :meth:`abort` removes them, so a failed save leaves existing files untouched.
    """

    stream_min: int | None = None
    out_dir: str | None = None
    model_dir: str | None = None
    location: str | None = None
    threshold: int = 1024
    one_file: bool = True
    only_external: bool = False
    streamed: dict[tuple[str, int], Any] = field(default_factory=dict)
    _temps: dict[str, str] = field(default_factory=dict)  # final location -> temporary location
    _kept: dict[str, str] = field(default_factory=dict)  # kept reference location -> object path
    _names: set[str] = field(default_factory=set)
    _keep: bool | None = None
    _sizes: dict[str, int] = field(default_factory=dict)  # temporary location -> bytes planned
    _pending: dict[str, list[Any]] = field(default_factory=dict)  # temporary location -> chunks
    _pending_bytes: int = 0

    @property
    def keep_external(self) -> bool:
        """External references stay as they are (in-memory, or saving next to the data)."""
        if self._keep is None:
            if self.out_dir is None:
                self._keep = True
            elif self.model_dir is None:
                self._keep = False
            else:
                self._keep = os.path.realpath(self.out_dir) == os.path.realpath(self.model_dir)
        return self._keep

    def _may_keep(self, ref: ExternalRef) -> bool:
        """``ref`` may stay a reference to the file it points into."""
        if not self.keep_external:
            return False
        if self.only_external and self.location is not None:
            return os.path.normpath(ref.location) == os.path.normpath(self.location)
        return True

    def _target(self, name: str) -> str:
        if self.location is None:
            raise ExternalDataError("no external data location")
        if self.one_file:
            return self.location
        base = _SAFE_NAME.sub("_", name).lstrip(".") or "tensor"
        loc, k = base, 1
        while loc in self._names:
            k += 1
            loc = f"{base}.{k}"
        self._names.add(loc)
        prefix = os.path.dirname(self.location)
        return os.path.join(prefix, loc) if prefix else loc

    def _write(self, location: str, raw: Any, where: str) -> ExternalRef:
        """Append a payload to ``location`` (through its temporary file); return its place.

        Payloads under 1 MiB are gathered and written together (aligned to 64 bytes),
        larger ones are written on their own (aligned to 4096 bytes), always through
        :func:`write_external`, which checks the location."""
        if self.out_dir is None:
            raise ExternalDataError(f"{where}: cannot write external data without a target folder")
        temp = self._temps.get(location)
        if temp is None:
            temp = self._temps[location] = f"{location}.{uuid.uuid4().hex[:12]}.tmp"
            self._sizes[temp] = 0
            self._pending[temp] = []
        n = _nbytes(raw)
        if n < _BATCH_MAX:
            buf = self._pending[temp]
            size = self._sizes[temp]
            start = -(-size // 64) * 64
            if start > size:
                buf.append(bytes(start - size))
            buf.append(raw)
            self._sizes[temp] = start + n
            self._pending_bytes += start - size + n
            if self._pending_bytes >= _FLUSH_AT:
                self.flush()
            return ExternalRef(location=location, offset=start, length=n)
        self._flush_one(temp)
        ref = write_external(self.out_dir, temp, raw, align=4096, path=where)
        self._sizes[temp] = ref.offset + n
        return ExternalRef(location=location, offset=ref.offset, length=n)

    def _flush_one(self, temp: str) -> None:
        buf = self._pending.get(temp)
        if not buf or self.out_dir is None:
            return
        data = b"".join(buf)
        buf.clear()
        self._pending_bytes -= len(data)
        expected = self._sizes[temp] - len(data)
        ref = write_external(self.out_dir, temp, data, align=1, path=f"external data {temp!r}")
        if ref.offset != expected:
            raise ExternalDataError(f"external data file {temp!r} changed while it was written")

    def flush(self) -> None:
        """Write the gathered small payloads."""
        for temp in self._pending:
            self._flush_one(temp)
        self._pending_bytes = 0

    def _keep_ref(self, out: Any, ref: ExternalRef, where: Callable[[], str]) -> None:
        self._kept.setdefault(ref.location, where())
        _set_external(out, ref)

    def place(self, raw: Any, external: ExternalRef | None, out: Any, key: tuple[str, int] | None,
              name: str, where: Callable[[], str]) -> None:
        """Put one payload (bytes-like or None) into ``out`` (TensorProto / EncodedValueProto)."""
        if raw is None:
            if external is None:
                return
            if self.keep_external if not self.only_external else self._may_keep(external):
                self._keep_ref(out, external, where)
                return
            raise ExternalDataError(
                f"{where()}: external payload {external.location!r} was not mapped (the model was "
                "loaded without its folder); load it with model_dir= to copy its data")
        if self.only_external and external is not None and self._may_keep(external):
            self._keep_ref(out, external, where)
            return
        if self.location is not None and (external is not None or (
                not self.only_external and _nbytes(raw) >= self.threshold)):
            _set_external(out, self._write(self._target(name), raw, where()))
            return
        if external is not None:
            if self.keep_external:
                self._keep_ref(out, external, where)
            else:
                _set_external(out, self._write(external.location, raw, where()))
            return
        if key is not None and self.stream_min is not None and _nbytes(raw) >= self.stream_min:
            self.streamed[key] = raw
            return
        out.raw_data = raw if isinstance(raw, bytes) else bytes(raw)

    @property
    def mixed(self) -> bool:
        """Some payloads kept a reference into a file that this save also writes."""
        return bool(set(self._kept) & set(self._temps))

    def commit(self, then: tuple[str, str] | None = None) -> None:
        """Move the external files written by this plan to their final names, then rename
        ``then`` (``(temporary, final)``: the model file). The renames succeed or fail
        together: a failure puts back the files already replaced."""
        from onnxforge.proto_ext.outputs import replace_all

        self.flush()
        clash = sorted(set(self._kept) & set(self._temps))
        if clash:
            raise ExternalDataError(
                f"{self._kept[clash[0]]}: keeps its payload in {clash[0]!r}, which this save "
                "would overwrite; load the model with its folder so that the payload can be copied")
        folder = self.out_dir
        if folder is None:
            return
        moves = [(os.path.join(folder, temp), os.path.join(folder, location))
                 for location, temp in self._temps.items()]
        try:
            replace_all(moves + ([then] if then is not None else []))
        except OSError as exc:
            failed = next((loc for loc in self._temps if exc.filename2 == os.path.join(folder, loc)
                           or exc.filename == os.path.join(folder, self._temps[loc])), None)
            if failed is None:
                raise
            raise ExternalDataError(
                f"cannot move external data into {failed!r}: {exc.strerror}") from None
        self._temps.clear()

    def abort(self) -> None:
        """Remove the temporary external files of a failed save."""
        if self.out_dir is None:
            return
        for temp in self._temps.values():
            try:
                os.unlink(os.path.join(self.out_dir, temp))
            except OSError:
                pass
        self._temps.clear()


def _set_external(out: Any, ref: ExternalRef) -> None:
    out.ClearField("external_data")
    for k, v in ref.to_entries():
        out.external_data.add(key=k, value=v)
    out.data_location = _EXTERNAL


_NO_DEEP: dict[tuple[str, bytes], bool] = {}


def _merge_extra(out: Any, extra: bytes, deep: dict[str, Callable[[Any], bool]]) -> set[str]:
    """Merge an ``extra`` blob into ``out``; return the deep fields taken from it verbatim.

    A deep field (a modeled sub-message stored verbatim) is taken only while ``same``
    says the IR still holds the value it decodes to; otherwise it is dropped and the
    caller writes the modeled value."""
    key = (out.DESCRIPTOR.name, extra)
    if not deep or _NO_DEEP.get(key):
        out.MergeFromString(extra)
        return set()
    tmp = type(out).FromString(extra)
    taken: set[str] = set()
    found = False
    for name, same in deep.items():
        if C.present(tmp, name):
            found = True
            if same(getattr(tmp, name)):
                taken.add(name)
            else:
                tmp.ClearField(name)
    if not found and len(extra) <= 64 and len(_NO_DEEP) < 4096:
        _NO_DEEP[key] = True
    out.MergeFrom(tmp)
    return taken


class Encoder:
    """Converts an IR :class:`Model` into an extended ``ModelProto``."""

    def __init__(self, plan: PayloadPlan | None = None):
        self.plan = plan or PayloadPlan()
        self._type_bytes: dict[Any, bytes] = {}

    # ------------------------------------------------------------------ model
    def model(self, m: Model) -> Any:
        mp = schema.ModelProto()
        taken: set[str] = set()
        if m.extra:
            taken = _merge_extra(mp, m.extra, {
                "metadata_props": lambda x: _meta_dict(x) == m.metadata,
                "opset_import": lambda x: {o.domain: o.version for o in x} == m.opset_imports,
                "struct_types": lambda x: [struct_from_proto(s) for s in x] == list(m.struct_types),
            })
        has = m.has_fields
        if m.ir_version or "ir_version" in has:
            mp.ir_version = m.ir_version
        if "opset_import" not in taken:
            for d, v in m.opset_imports.items():
                mp.opset_import.add(domain=d, version=v)
        for name in ("producer_name", "producer_version", "domain", "model_version", "doc_string"):
            val = getattr(m, name)
            if val or name in has:
                setattr(mp, name, val)
        g = m.graph
        if ("graph" in has or not has or len(g) or g.inputs or g.outputs or g.name
                or g.initializers or g.encoded_initializers or g.extra):
            self.graph(g, mp.graph, main=True)
        if "metadata_props" not in taken:
            for key, text in m.metadata.items():
                mp.metadata_props.add(key=key, value=text)
        for fn in m.functions.values():
            self.function(fn, mp.functions.add())
        if "struct_types" not in taken:
            for s in m.struct_types:
                struct_to_proto(s, mp.struct_types.add())
        return mp

    # ------------------------------------------------------------------ graphs
    def graph(self, g: Graph, out: Any, *, main: bool = False) -> None:
        verbatim_outputs = None
        taken: set[str] = set()
        if g.extra:
            tmp = schema.GraphProto.FromString(g.extra)
            if len(tmp.output):
                if [vi.name for vi in tmp.output] == [v.name for v in g.outputs]:
                    verbatim_outputs = list(tmp.output)
                tmp.ClearField("output")
            taken = _merge_extra(out, tmp.SerializeToString(), {
                "metadata_props": lambda x: _meta_dict(x) == g.metadata,
                "persistent_bindings": lambda x: [(b.input_name, b.output_name) for b in x]
                == [(i.name, o.name) for i, o in g.bindings],
            })
        if g.name:
            out.name = g.name
        if g.doc_string:
            out.doc_string = g.doc_string
        vi_add = out.input.add
        for v in g.inputs:
            self._vi(v, vi_add)
        self._initializers(g, g.initializers, out.initializer, "initializer", main)
        for blob in g.sparse_initializers.values():
            out.sparse_initializer.add().MergeFromString(blob)
        self._initializers(g, g.encoded_initializers, out.encoded_initializer, "encoded_initializer", main)
        described = self._nodes(g, out.node)
        # outputs: the first output entry of a node output of this graph describes it
        owned: set[int] = set()
        add = out.output.add
        for k, v in enumerate(g.outputs):
            if v._producer is not None and v.graph is g and id(v) not in owned:
                owned.add(id(v))
                self._vi(v, add)
            elif verbatim_outputs is not None:
                add().CopyFrom(verbatim_outputs[k])
            else:  # an input passed through (same descriptor), or an edited graph
                self._vi(v, add)
        self._value_infos(g, out.value_info, owned, described)
        if "metadata_props" not in taken:
            for k2, val in g.metadata.items():
                out.metadata_props.add(key=k2, value=val)
        if "persistent_bindings" not in taken:
            for i, o in g.bindings:
                out.persistent_bindings.add(input_name=i.name, output_name=o.name)

    def _initializers(self, g: Graph, table: dict[str, Value], coll: Any, field_name: str,
                      main: bool) -> None:
        """Write the dense (``initializer``) or encoded (``encoded_initializer``) initializers;
        in the main graph each payload is keyed by its index for streaming."""
        encoded = field_name == "encoded_initializer"
        want, write = (EncodedTensor, self._encoded) if encoded else (Tensor, self._tensor)
        base = len(coll)  # entries the extra blob already put there
        add = coll.add
        for k, v in enumerate(table.values()):
            const = v.const
            if not isinstance(const, want):
                raise CodecError(f"{field_name} {v.name!r} holds {type(const).__name__}, "
                                 f"expected {want.__name__}")
            key = ("encoded" if encoded else "initializer", base + k) if main else None
            write(const, add(), v.name, key, _at(g, field_name, v.name))  # type: ignore[arg-type]

    def _value_infos(self, g: Graph | Function, coll: Any, owned: set[int],
                     described: list[Value]) -> None:
        """value_info entries: values with a description that no input/output entry carries.

        ``described`` lists the node outputs that carry a description (see :meth:`_nodes`)."""
        cands: list[Value] = []
        if isinstance(g, Graph):
            inputs = g._input_set
            for v in g.all_initializers():
                if v.has_value_info and v not in inputs:
                    cands.append(v)
        else:
            for v in g.inputs:
                if v.has_value_info or v.type is not None or v.access or v.alias_of is not None:
                    cands.append(v)
        cands.extend(v for v in described if v.name and id(v) not in owned)
        if not cands:
            return
        order = g.value_info_order
        if order:
            pos = {name: i for i, name in reversed(list(enumerate(order)))}
            last = len(order)
            cands.sort(key=lambda v: pos.get(v.name, last))
        add = coll.add
        seen: set[int] = set()
        for v in cands:
            if id(v) not in seen:
                seen.add(id(v))
                self._vi(v, add)

    # ------------------------------------------------------------------ values
    def type_bytes(self, t: Type) -> bytes:
        """Serialized TypeProto of a type record (cached per record)."""
        try:
            return self._type_bytes[t]
        except KeyError:
            b = self._type_bytes[t] = type_to_proto(plain_type(t), schema.TypeProto()).SerializeToString()
            return b
        except TypeError:  # unhashable record (symbolic dims)
            return type_to_proto(plain_type(t), schema.TypeProto()).SerializeToString()

    def _vi(self, v: Value, add: Callable[..., Any]) -> None:
        taken: Container[str] = ()
        if not v.extra:
            vi = add(name=v.name) if v.name else add()
            if v.type is not None:
                vi.type.MergeFromString(self.type_bytes(v.type))
        else:
            vi = add()
            taken = _merge_extra(vi, v.extra, {
                "type": lambda x: type_from_proto(x) == v.type,
                "metadata_props": lambda x: _meta_dict(x) == v.metadata,
            })
            if v.name:
                vi.name = v.name
            if v.type is not None and "type" not in taken:
                vi.ClearField("type")
                vi.type.MergeFromString(self.type_bytes(v.type))
        if v.doc_string:
            vi.doc_string = v.doc_string
        if "metadata_props" not in taken:
            for k, val in v.metadata.items():
                vi.metadata_props.add(key=k, value=val)
        if v.access:
            vi.access = v.access
        alias = v.alias_of
        if alias is not None:
            name = alias.name if isinstance(alias, Value) else str(alias)
            if name:
                vi.alias_of = name

    # ------------------------------------------------------------------ nodes
    def _nodes(self, owner: Graph | Function, coll: Any) -> list[Value]:
        """Write the nodes of ``owner``; return the outputs that carry a description
        (type, value_info, alias, access, docs), candidates for ``value_info``."""
        add = coll.add
        attr_value = self._attr
        described: list[Value] = []
        for n in owner:
            outs = n._outputs
            for v in outs:
                if (v.type is not None or v.has_value_info or v.alias_of is not None or v.access
                        or v.doc_string or v.metadata):
                    described.append(v)
            if n.extra:
                self._node_slow(n, add())
                continue
            kw: dict[str, Any] = {
                "input": ["" if v is None else v.name for v in n._inputs],
                "output": [v.name for v in outs],
            }
            if n.op_type:
                kw["op_type"] = n.op_type
            if n.name:
                kw["name"] = n.name
            if n.domain:
                kw["domain"] = n.domain
            if n.overload:
                kw["overload"] = n.overload
            if n.doc_string:
                kw["doc_string"] = n.doc_string
            pn = add(**kw)
            if n.attributes:
                aadd = pn.attribute.add
                for a in n.attributes.values():
                    attr_value(a, aadd)
            if n.metadata:
                madd = pn.metadata_props.add
                for k, val in n.metadata.items():
                    madd(key=k, value=val)
            if n.output_alias:
                aladd = pn.output_alias.add
                for al in n.output_alias:
                    aladd(output_index=al.output_index, input_index=al.input_index, kind=al.kind)
        return described

    def _node_slow(self, n: Node, pn: Any) -> None:
        taken = _merge_extra(pn, n.extra, {
            "metadata_props": lambda x: _meta_dict(x) == n.metadata,
            "output_alias": lambda x: [Alias(a.output_index, a.input_index, a.kind) for a in x]
            == list(n.output_alias),
        })
        pn.input.extend(["" if v is None else v.name for v in n._inputs])
        pn.output.extend([v.name for v in n._outputs])
        for name in ("op_type", "name", "domain", "overload", "doc_string"):
            val = getattr(n, name)
            if val:
                setattr(pn, name, val)
        aadd = pn.attribute.add
        for a in n.attributes.values():
            self._attr(a, aadd)
        if "metadata_props" not in taken:
            for k, val in n.metadata.items():
                pn.metadata_props.add(key=k, value=val)
        if "output_alias" not in taken:
            for al in n.output_alias:
                pn.output_alias.add(output_index=al.output_index, input_index=al.input_index,
                                    kind=al.kind)

    # ------------------------------------------------------------------ attributes
    def _attr(self, a: Attr, add: Callable[..., Any]) -> None:
        t = a.type
        val = a.value
        if not a.extra and not a.doc_string and not a.ref_attr_name and a.name and val is not None:
            if t == _AP.INT:
                add(name=a.name, type=t, i=int(val))
                return
            if t == _AP.FLOAT:
                add(name=a.name, type=t, f=float(val))
                return
            if t == _AP.INTS:
                add(name=a.name, type=t, ints=val)
                return
            if t == _AP.STRING:
                add(name=a.name, type=t, s=_bytes(val))
                return
            if t == _AP.FLOATS:
                add(name=a.name, type=t, floats=val)
                return
            if t == _AP.STRINGS:
                add(name=a.name, type=t, strings=[_bytes(s) for s in val])
                return
        pa = add()
        taken: set[str] = set()
        if a.extra:
            taken = _merge_extra(pa, a.extra, {
                "tp": lambda x: type_from_proto(x) == a.value,
                "type_protos": lambda x: [type_from_proto(y) for y in x] == list(a.value or ()),
            })
        if a.name:
            pa.name = a.name
        if a.doc_string:
            pa.doc_string = a.doc_string
        if a.ref_attr_name:
            pa.ref_attr_name = a.ref_attr_name
        if t == 0:
            return
        pa.type = t
        if val is None:
            return
        if t == _AP.INT:
            pa.i = int(val)
        elif t == _AP.FLOAT:
            pa.f = float(val)
        elif t == _AP.STRING:
            pa.s = _bytes(val)
        elif t == _AP.INTS:
            pa.ints.extend(val)
        elif t == _AP.FLOATS:
            pa.floats.extend(val)
        elif t == _AP.STRINGS:
            pa.strings.extend(_bytes(s) for s in val)
        elif t == _AP.TENSOR:
            self._tensor(val, pa.t, val.name, None, lambda: f"attribute {a.name!r}")
        elif t == _AP.TENSORS:
            for x in val:
                self._tensor(x, pa.tensors.add(), x.name, None, lambda: f"attribute {a.name!r}")
        elif t == _AP.GRAPH:
            self.graph(val, pa.g)
        elif t == _AP.GRAPHS:
            for sub in val:
                self.graph(sub, pa.graphs.add())
        elif t == _AP.SPARSE_TENSOR:
            pa.sparse_tensor.MergeFromString(val)
        elif t == _AP.SPARSE_TENSORS:
            for blob in val:
                pa.sparse_tensors.add().MergeFromString(blob)
        elif t == _AP.TYPE_PROTO:
            if "tp" not in taken:
                pa.tp.MergeFromString(self.type_bytes(val))
        elif t == _AP.TYPE_PROTOS:
            if "type_protos" not in taken:
                for x in val:
                    pa.type_protos.add().MergeFromString(self.type_bytes(x))
        else:
            raise CodecError(f"attribute {a.name!r}: unknown attribute type {t}")

    # ------------------------------------------------------------------ tensors
    def _tensor(self, t: Tensor, pt: Any, name: str, key: tuple[str, int] | None,
                where: Callable[[], str]) -> None:
        if t.proto is not None and t.raw is None and t.array is None:
            pt.MergeFromString(t.proto)
            if pt.name != name:
                if name:
                    pt.name = name
                else:
                    pt.ClearField("name")
            if pt.doc_string != t.doc_string:
                pt.doc_string = t.doc_string
            if _meta_dict(pt.metadata_props) != t.metadata:
                pt.ClearField("metadata_props")
                for k, v in t.metadata.items():
                    pt.metadata_props.add(key=k, value=v)
            return
        taken: set[str] = set()
        if t.extra:
            taken = _merge_extra(pt, t.extra, {
                "metadata_props": lambda x: _meta_dict(x) == t.metadata})
        if t.dims:
            pt.dims.extend(t.dims)
        if t.dtype:
            pt.data_type = t.dtype
        if name:
            pt.name = name
        if t.doc_string:
            pt.doc_string = t.doc_string
        if "metadata_props" not in taken:
            for k, v in t.metadata.items():
                pt.metadata_props.add(key=k, value=v)
        raw = t.raw
        if raw is None and t.array is not None:
            if t.dtype == _STRING:
                pt.string_data.extend(_bytes(s) for s in np.asarray(t.array).reshape(-1).tolist())
                return
            raw = t.tobytes()
        self.plan.place(raw, t.external, pt, key, name, where)

    def _encoded(self, et: EncodedTensor, pe: Any, name: str, key: tuple[str, int] | None,
                 where: Callable[[], str]) -> None:
        h = et.header
        verbatim = h.extra.get("verbatim") if h.extra else None
        used = False
        if verbatim is not None:
            old = encoded_from_proto(schema.EncodedValueProto.FromString(verbatim))
            if (old.affine, old.struct_type, old.logical_type, old.doc_string,
                    old.has_logical_type) == (h.affine, h.struct_type, h.logical_type,
                                              h.doc_string, h.has_logical_type):
                pe.MergeFromString(verbatim)
                if name:
                    pe.name = name
                used = True
        if not used:
            bare = replace(h, name=name, raw_data=b"", external_data=(), data_location=None,
                           extra={})
            encoded_to_proto(bare, pe, with_payload=False)
        raw: Any = h.raw_data
        ext = et.external
        if ext is not None and not _nbytes(raw) and ext.length != 0:
            raw = None  # an external payload that was not mapped
        self.plan.place(raw, ext, pe, key, name, where)
        if not pe.HasField("data_location") and h.data_location is not None:
            pe.data_location = h.data_location

    # ------------------------------------------------------------------ functions
    def function(self, f: Function, fp: Any) -> None:
        taken: set[str] = set()
        if f.extra:
            taken = _merge_extra(fp, f.extra, {
                "metadata_props": lambda x: _meta_dict(x) == f.metadata,
                "opset_import": lambda x: {o.domain: o.version for o in x} == f.opset_imports,
            })
        for name in ("name", "domain", "overload", "doc_string"):
            val = getattr(f, name)
            if val:
                setattr(fp, name, val)
        fp.input.extend([v.name for v in f.inputs])
        fp.output.extend([v.name for v in f.outputs])
        fp.attribute.extend(f.attributes)
        for a in f.attribute_defaults.values():
            self._attr(a, fp.attribute_proto.add)
        described = self._nodes(f, fp.node)
        if "opset_import" not in taken:
            for d, v in f.opset_imports.items():
                fp.opset_import.add(domain=d, version=v)
        self._value_infos(f, fp.value_info, set(), described)
        if "metadata_props" not in taken:
            for key, text in f.metadata.items():
                fp.metadata_props.add(key=key, value=text)


def _bytes(s: str | bytes) -> bytes:
    return s.encode("utf-8") if isinstance(s, str) else bytes(s)


def _at(g: Graph, field_name: str, name: str) -> Callable[[], str]:
    return lambda: f"{g.path()}.{field_name}[{name!r}]"
