"""Wire helpers shared by the decoder and the encoder of :mod:`onnxforge.graphbuilder.serde`.

The IR models most ONNX fields; what it does not model rides in the ``extra``
slot of the owning IR object as serialized bytes of the same message kind:

* unknown fields (extensions of other writers, closed-enum values out of range),
  re-encoded from ``UnknownFieldSet`` without copying the message;
* known fields the IR has no slot for (``NodeProto.device_configurations``,
  ``ModelProto.training_info``, ``TensorProto.segment``...);
* string and enum fields that are present on the wire with their default
  value (``domain: ""``): the IR cannot tell them from absent ones;
* "verbatim" copies of modeled sub-messages that the IR's records cannot
  reproduce byte for byte (a ``TypeProto`` with unknown fields inside, a
  metadata list with a repeated key...). The encoder uses such a copy only
  while the IR still holds the value decoded from it, so an edit made by a
  pass always wins over the stored copy.

The encoder merges ``extra`` into the fresh message before it writes the
modeled fields, so modeled scalars override stale presence markers.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from google.protobuf.message import Message
from google.protobuf.unknown_fields import UnknownFieldSet

from onnxforge.proto_ext import schema

__all__ = [
    "EMPTY",
    "copy_fields",
    "empty_marker",
    "encode_unknown",
    "has_unknown",
    "has_unknown_deep",
    "join_extra",
    "meta_exact",
    "present",
    "unmodeled_fields",
]

_LEN, _VARINT, _I64, _I32, _SGROUP, _EGROUP = 2, 0, 1, 5, 3, 4


def _varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _wire_type(fd: Any) -> int:
    t = fd.type
    if t in (fd.TYPE_STRING, fd.TYPE_BYTES, fd.TYPE_MESSAGE):
        return _LEN
    if t in (fd.TYPE_FLOAT, fd.TYPE_FIXED32, fd.TYPE_SFIXED32):
        return _I32
    if t in (fd.TYPE_DOUBLE, fd.TYPE_FIXED64, fd.TYPE_SFIXED64):
        return _I64
    return _VARINT


def empty_marker(cls: type[Message], field: str) -> bytes:
    """Wire bytes of ``field`` present with its default value (``""``, 0, 0.0)."""
    fd = cls.DESCRIPTOR.fields_by_name[field]
    wt = _wire_type(fd)
    value = {_LEN: b"\x00", _VARINT: b"\x00", _I32: bytes(4), _I64: bytes(8)}[wt]
    return _varint((fd.number << 3) | wt) + value


def _markers() -> dict[str, dict[str, bytes]]:
    out: dict[str, dict[str, bytes]] = {}
    for kind in ("ModelProto", "GraphProto", "NodeProto", "AttributeProto", "TensorProto",
                 "ValueInfoProto", "FunctionProto", "EncodedValueProto"):
        cls = schema.message_class(kind)
        out[kind] = {fd.name: empty_marker(cls, fd.name) for fd in cls.DESCRIPTOR.fields
                     if not fd.is_repeated and fd.type != fd.TYPE_MESSAGE}
    return out


EMPTY: dict[str, dict[str, bytes]] = _markers()
"""Per message kind and scalar field: the bytes of that field present with its default."""


def unmodeled_fields(kind: str, modeled: Iterable[str]) -> tuple[str, ...]:
    """Known fields of ``kind`` (extended schema) that are not in ``modeled``."""
    names = set(modeled)
    cls = schema.message_class(kind)
    missing = names - set(cls.DESCRIPTOR.fields_by_name)
    if missing:
        raise KeyError(f"{kind} has no field(s) {sorted(missing)}")
    return tuple(fd.name for fd in cls.DESCRIPTOR.fields if fd.name not in names)


def has_unknown(msg: Message) -> bool:
    """True if ``msg`` itself (not its sub-messages) carries unknown fields."""
    return len(UnknownFieldSet(msg)) > 0


def has_unknown_deep(msg: Message) -> bool:
    """True if ``msg`` or any sub-message carries unknown fields."""
    probe = type(msg)()
    probe.CopyFrom(msg)
    before = probe.ByteSize()
    probe.DiscardUnknownFields()
    return probe.ByteSize() != before


def _encode_set(fields: Any, out: list[bytes]) -> None:
    for f in fields:
        num, wt, data = f.field_number, f.wire_type, f.data
        out.append(_varint((num << 3) | wt))
        if wt == _VARINT:
            out.append(_varint(data))
        elif wt == _I64:
            out.append(int(data).to_bytes(8, "little", signed=False))
        elif wt == _I32:
            out.append(int(data).to_bytes(4, "little", signed=False))
        elif wt == _LEN:
            out.append(_varint(len(data)))
            out.append(bytes(data))
        elif wt == _SGROUP:
            _encode_set(data, out)
            out.append(_varint((num << 3) | _EGROUP))


def encode_unknown(msg: Message) -> bytes:
    """The unknown fields of ``msg`` (top level) re-encoded as wire bytes, in order."""
    out: list[bytes] = []
    _encode_set(UnknownFieldSet(msg), out)
    return b"".join(out)


def copy_fields(msg: Message, names: Iterable[str]) -> bytes:
    """Serialized message of ``msg``'s kind holding only the fields ``names`` of ``msg``."""
    names = list(names)
    if not names:
        return b""
    rest = type(msg)()
    for name in names:
        fd = msg.DESCRIPTOR.fields_by_name[name]
        src = getattr(msg, name)
        if fd.is_repeated:
            getattr(rest, name).extend(src)
        elif fd.type == fd.TYPE_MESSAGE:
            if msg.HasField(name):
                getattr(rest, name).CopyFrom(src)
        elif msg.HasField(name):
            setattr(rest, name, src)
    return rest.SerializeToString()


def join_extra(msg: Message, kind: str, *, copy: Iterable[str] = (), presence: Iterable[str] = (),
               unknown: bool = False) -> bytes:
    """Build an ``extra`` blob: fields copied from ``msg``, default-valued presence markers
    and (with ``unknown``) the unknown fields of ``msg``."""
    parts = [copy_fields(msg, copy)]
    marks = EMPTY[kind]
    parts.extend(marks[p] for p in presence)
    if unknown:
        parts.append(encode_unknown(msg))
    return b"".join(parts)


def meta_exact(props: Any, clean: bool) -> tuple[dict[str, str], bool]:
    """``metadata_props`` entries as a dict, and whether re-encoding the dict reproduces
    them (no repeated key, no absent key or value read as "", no unknown fields; with
    ``clean`` no message of the model has unknown fields)."""
    out = {e.key: e.value for e in props}
    exact = len(out) == len(props)
    if exact and ("" in out or "" in out.values()):
        exact = all(e.HasField("key") and e.HasField("value") for e in props)
    if exact and not clean:
        exact = not any(has_unknown(e) for e in props)
    return out, exact


def present(msg: Message, name: str) -> bool:
    """Presence of a field of either cardinality."""
    fd = msg.DESCRIPTOR.fields_by_name[name]
    if fd.is_repeated:
        return len(getattr(msg, name)) > 0
    return msg.HasField(name)

