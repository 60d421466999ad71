"""``TensorProto`` / ``EncodedValueProto`` -> IR :class:`Tensor` / :class:`EncodedTensor`.

Payloads are never copied: a raw payload stays the bytes protobuf parsed (or
the view the loader put in its place), an external payload becomes a
bounds-checked slice of one read-only mapping per file, checked once (rule P5)
and mapped once per load. Tensors held in typed fields (``float_data``...),
string tensors and tensors without data keep their whole serialized message.
What the IR does not model rides in ``extra`` (see :mod:`._common`).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from onnxforge.proto_ext.errors import ExternalDataError
from onnxforge.graphbuilder.serde import _common as C
from onnxforge.graphbuilder.ir.tensors import EncodedTensor, Tensor
from onnxforge.proto_ext import schema
from onnxforge.proto_ext.convert import encoded_from_proto, encoded_to_proto
from onnxforge.proto_ext.external import ExternalDataCache, ExternalRef, parse_external_entries

__all__ = ["TensorDecoder", "Where"]

Where = Callable[[], str]
"""Builds the object path of a message for an error (only when one is raised)."""

_EXTERNAL = 1  # TensorProto.EXTERNAL
_TYPED_DATA = frozenset({4, 5, 6, 7, 10, 11})  # TensorProto *_data field numbers


class TensorDecoder:
    """Decodes the tensors of one model.

    ``clean`` promises that no message carries unknown fields; ``cache`` maps
    external data (without it, external payloads stay unmapped references).
    """

    __slots__ = ("cache", "clean", "_files")

    def __init__(self, *, clean: bool, cache: ExternalDataCache | None):
        self.clean = clean
        self.cache = cache
        self._files: dict[str, memoryview] = {}

    def _map(self, ref: ExternalRef, where: Where) -> memoryview | None:
        """Read-only view of an external payload; None without a model folder."""
        if self.cache is None:
            return None
        whole = self._files.get(ref.location)
        if whole is None:
            whole = self._files[ref.location] = self.cache.map(
                ExternalRef(ref.location, 0, None), where())
        size = whole.nbytes
        offset = ref.offset
        length = size - offset if ref.length is None else ref.length
        if offset > size or offset + length > size:
            raise ExternalDataError(
                f"[P5] {where()}: offset {offset} + length {length} = {offset + length} exceeds "
                f"the size of {ref.location!r} ({size} bytes)")
        return whole[offset:offset + length]

    def tensor(self, tp: Any, where: Where, payload: memoryview | None = None) -> Tensor:
        """The IR tensor of ``tp``; ``payload`` replaces a ``raw_data`` the loader stripped."""
        dims: tuple[int, ...] = ()
        dtype = 0
        name = doc = ""
        raw: Any = None
        typed = False
        location = None
        meta: dict[str, str] = {}
        presence: list[str] = []
        copy: list[str] = []
        for fd, v in tp.ListFields():
            n = fd.number
            if n == 1:
                dims = tuple(v)
            elif n == 2:
                dtype = v
                if not v:
                    presence.append("data_type")
            elif n == 8:
                name = v
                if not v:
                    presence.append("name")
            elif n == 9:
                raw = v
            elif n == 14:
                location = v
            elif n == 13:
                pass
            elif n == 12:
                doc = v
                if not v:
                    presence.append("doc_string")
            elif n == 16:
                meta, exact = C.meta_exact(v, self.clean)
                if not exact:
                    copy.append("metadata_props")
            elif n in _TYPED_DATA:
                typed = True
            else:
                copy.append(fd.name)
        if payload is not None:
            raw = payload
        if location == _EXTERNAL:
            entries = [(e.key, e.value) for e in tp.external_data]
            ref = parse_external_entries(entries, path=where() + ".external_data")
            if raw is not None:  # an inline payload next to an external one: keep both
                return Tensor(dtype, dims, name=name, proto=_with_raw(tp, payload), doc_string=doc,
                              metadata=meta)
            if typed:
                copy.extend(fd.name for fd, _ in tp.ListFields() if fd.number in _TYPED_DATA)
            view = self._map(ref, where)
            t = Tensor(dtype, dims, name=name, raw=view, external=ref, doc_string=doc, metadata=meta)
        elif raw is None or typed:
            # typed fields (float_data...), strings, or no data at all: keep the whole message
            return Tensor(dtype, dims, name=name, proto=_with_raw(tp, payload), doc_string=doc,
                          metadata=meta)
        else:
            if location is not None:
                presence.append("data_location")
            if len(tp.external_data):
                copy.append("external_data")
            t = Tensor(dtype, dims, name=name, raw=raw, doc_string=doc, metadata=meta)
        unknown = not self.clean and C.has_unknown(tp)
        if presence or copy or unknown:
            t.extra = C.join_extra(tp, "TensorProto", copy=copy, presence=presence, unknown=unknown)
        return t

    def encoded(self, ev: Any, where: Where, payload: memoryview | None = None) -> EncodedTensor:
        """The IR encoded tensor of ``ev``; its header keeps a verbatim copy when the
        record cannot reproduce the message."""
        ref = None
        raw: Any = payload
        if ev.HasField("data_location") and ev.data_location == _EXTERNAL:
            entries = [(e.key, e.value) for e in ev.external_data]
            ref = parse_external_entries(entries, path=where() + ".external_data")
            raw = self._map(ref, where)
            if raw is None:
                raw = b""
        header = encoded_from_proto(ev, raw_data=raw)
        probe = schema.EncodedValueProto()
        probe.CopyFrom(ev)
        for f in ("raw_data", "external_data", "data_location"):
            probe.ClearField(f)
        wire = probe.SerializeToString()
        bare = replace(header, raw_data=b"", external_data=(), data_location=None, extra={})
        if encoded_to_proto(bare, with_payload=False).SerializeToString() != wire:
            header.extra["verbatim"] = wire
        return EncodedTensor(header, external=ref)


def _with_raw(tp: Any, payload: memoryview | None) -> bytes:
    """Serialized TensorProto, with a stripped payload put back."""
    if payload is None:
        return tp.SerializeToString()
    full = schema.TensorProto()
    full.CopyFrom(tp)
    full.raw_data = bytes(payload)
    return full.SerializeToString()
