"""Wire-level scanning of serialized ModelProtos: hold large inline payloads without copies.

Protobuf's Python parser copies every inline ``raw_data`` when it parses a message
(and again on each attribute access), also when parsing from a memory map. This
module avoids that for the payloads that matter:

* :func:`strip_payloads` walks the protobuf wire format of a serialized
  ``ModelProto`` (for example a read-only ``mmap`` of a ``.onnx`` file) and
  removes the ``raw_data`` fields of the main graph's initializers. It returns a
  small *skeleton* (a valid serialized ModelProto without those fields, with
  every enclosing length prefix re-encoded) and one :class:`PayloadRef` per
  removed payload, recording its byte range in the input. Payload bytes are never
  copied: the skeleton is assembled from memoryview slices of the non-payload
  bytes only.
* :func:`payload_views` turns those references into read-only memoryviews of the
  input (zero copy).
* :func:`write_model` streams a complete ModelProto to a binary file: the skeleton
  with given payloads re-inserted as ``raw_data`` where protobuf's own serializer
  places that field. Payloads are handed to ``fh.write`` as they are and never
  concatenated with other bytes.
* :func:`external_locations` lists the ``location`` of every external-data reference
  of a serialized model (the data files it needs), reading only the messages that can
  hold a tensor: no payload is read, no protobuf object is built.
* :func:`map_model_file` memory-maps a model file for these functions, and
  :func:`release_map` closes such a map unless a payload view still pins it.

Scope. Only two paths are rewritten:

* ``ModelProto.graph`` (7) -> ``GraphProto.initializer`` (5) ->
  ``TensorProto.raw_data`` (9), kind ``"initializer"``;
* ``ModelProto.graph`` (7) -> ``GraphProto.encoded_initializer`` (1000) ->
  ``EncodedValueProto.raw_data`` (4), kind ``"encoded"``.

Initializers of subgraphs (graph attributes of nodes), of functions, sparse
initializers and ``Constant`` node values stay inline in the skeleton. Nodes and
every other field are copied as opaque byte ranges without being descended into,
which also means they are not validated here: protobuf validates them when the
skeleton is parsed. The levels that are scanned (the model, the main graph, and
every main-graph initializer large enough to hold a payload of ``min_size``
bytes) are validated: a truncated varint or field, a length beyond the enclosing
message, a field number 0 and the group wire types 3 and 4 raise
:class:`~onnxforge.errors.WireError`.

Round trip. Fields keep their order, so parsing the skeleton and setting each
stripped ``raw_data`` back gives exactly the message parsed from the input. When
the input was written by protobuf's serializer (fields in number order, minimal
varints), ``write_model(fh, stripped.skeleton, payload_views(data, stripped))``
reproduces it byte for byte.

Keeping views. A memoryview into an ``mmap`` pins the mapping: release the views
(``view.release()`` or dropping every reference) before closing the map.
"""
from __future__ import annotations

import mmap
import os
from bisect import bisect_left
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import IO, Final, Literal, Union

from onnxforge.proto_ext.errors import WireError

__all__ = [
    "KIND_ENCODED",
    "KIND_INITIALIZER",
    "PayloadKind",
    "PayloadRef",
    "StrippedModel",
    "external_locations",
    "map_model_file",
    "payload_views",
    "release_map",
    "strip_payloads",
    "write_model",
]

PayloadKind = Literal["initializer", "encoded"]
KIND_INITIALIZER: Final = "initializer"
KIND_ENCODED: Final = "encoded"

BytesLike = Union[bytes, bytearray, memoryview, mmap.mmap]

# Field numbers on the scanned path (ONNX and DESIGN.md's fixed extension numbers).
_MODEL_GRAPH: Final = 7
_GRAPH_INITIALIZER: Final = 5
_GRAPH_ENCODED_INITIALIZER: Final = 1000
_TENSOR_RAW_DATA: Final = 9
_ENCODED_RAW_DATA: Final = 4

# Wire types.
_VARINT, _I64, _LEN, _SGROUP, _EGROUP, _I32 = 0, 1, 2, 3, 4, 5
_MAX_FIELD: Final = (1 << 29) - 1

# Graph-level keys (field << 3 | LEN) of the two descended repeated fields.
_KEY_INITIALIZER: Final = (_GRAPH_INITIALIZER << 3) | _LEN
_KEY_ENCODED: Final = (_GRAPH_ENCODED_INITIALIZER << 3) | _LEN
_KEY_GRAPH: Final = (_MODEL_GRAPH << 3) | _LEN
# kind -> (graph-level key, raw_data field number inside the value message)
_KINDS: Final[dict[str, tuple[int, int]]] = {
    KIND_INITIALIZER: (_KEY_INITIALIZER, _TENSOR_RAW_DATA),
    KIND_ENCODED: (_KEY_ENCODED, _ENCODED_RAW_DATA),
}
_KIND_OF_KEY: Final[dict[int, str]] = {
    _KEY_INITIALIZER: KIND_INITIALIZER,
    _KEY_ENCODED: KIND_ENCODED,
}


@dataclass(frozen=True, slots=True)
class PayloadRef:
    """One payload removed by :func:`strip_payloads`.

    ``kind`` is ``"initializer"`` (``GraphProto.initializer[index].raw_data``) or
    ``"encoded"`` (``GraphProto.encoded_initializer[index].raw_data``) of the main
    graph; ``offset`` and ``length`` give the payload's byte range in the scanned
    input."""

    kind: PayloadKind
    index: int
    offset: int
    length: int

    @property
    def key(self) -> tuple[str, int]:
        """``(kind, index)``, the key used by :func:`payload_views` and :func:`write_model`."""
        return (self.kind, self.index)


@dataclass(frozen=True, slots=True)
class StrippedModel:
    """A serialized ModelProto without its large main-graph payloads.

    ``skeleton`` is a valid serialized ModelProto (the removed ``raw_data`` fields
    are absent); ``payloads`` lists the removed payloads in input order."""

    skeleton: bytes
    payloads: list[PayloadRef]

    @property
    def payload_bytes(self) -> int:
        """Total size of the removed payloads."""
        return sum(p.length for p in self.payloads)


# --------------------------------------------------------------------------- varints


def _varint(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    """Decode the varint at ``pos`` (bounded by ``end``); return (value, next position)."""
    result = 0
    shift = 0
    start = pos
    while True:
        if pos >= end:
            raise WireError(f"truncated varint at byte {start}")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise WireError(f"varint longer than 10 bytes at byte {start}")


def _encode_varint(value: int) -> bytes:
    """Minimal varint encoding of a non-negative integer."""
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_Piece = Union[tuple[int, int], bytes]
"""A piece of output: a byte range ``(start, end)`` of the scanned buffer, or new bytes."""


def _join(buf: memoryview, pieces: list[_Piece]) -> bytes:
    """Concatenate pieces; ranges become memoryview slices only for the join itself."""
    parts = [p if isinstance(p, bytes) else buf[p[0]:p[1]] for p in pieces]
    try:
        return b"".join(parts)
    finally:
        for part in parts:
            if isinstance(part, memoryview):
                part.release()


def _skip(buf: memoryview, key: int, kstart: int, pos: int, end: int) -> int:
    """Skip the value of a field whose key (starting at ``kstart``) ended at ``pos``.

    Return the position after the value (for LEN fields the caller handles the
    length itself; this serves the other wire types)."""
    wt = key & 7
    if key >> 3 == 0:
        raise WireError(f"field number 0 at byte {kstart}")
    if key >> 3 > _MAX_FIELD:
        raise WireError(f"field number {key >> 3} out of range at byte {kstart}")
    if wt == _VARINT:
        return _varint(buf, pos, end)[1]
    if wt == _I64:
        pos += 8
    elif wt == _I32:
        pos += 4
    elif wt == _SGROUP or wt == _EGROUP:
        raise WireError(f"group wire type {wt} (field {key >> 3}) at byte {kstart} "
                        "is not supported")
    else:
        raise WireError(f"invalid wire type {wt} (field {key >> 3}) at byte {kstart}")
    if pos > end:
        raise WireError(f"truncated fixed-width field {key >> 3} at byte {kstart}")
    return pos


def _scan(buf: memoryview, start: int, end: int) -> Iterator[tuple[int, int, int, int, int]]:
    """Every field of the message in ``[start, end)``, in order, as (key, key start, key
    end, value start, value end): the one reader of a field's key and length prefix.

    For LEN fields the value starts after the length prefix; for the others right
    after the key (value start == key end). Raises :class:`WireError` for a malformed or
    truncated field. One- and two-byte varints are read inline: the loops over every
    node of the main graph (:func:`_strip_graph`, :func:`_fill_graph`) spend most of
    their time here."""
    pos = start
    while pos < end:
        kstart = pos
        key = buf[pos]
        pos += 1
        if key >= 0x80:
            key, pos = _varint(buf, kstart, end)
        kend = pos
        if key & 7 != _LEN or key < 8:
            pos = _skip(buf, key, kstart, pos, end)
            yield key, kstart, kend, kend, pos
            continue
        if pos < end and buf[pos] < 0x80:
            n = buf[pos]
            pos += 1
        elif pos + 1 < end and buf[pos + 1] < 0x80:
            n = (buf[pos] & 0x7F) | (buf[pos + 1] << 7)
            pos += 2
        else:
            n, pos = _varint(buf, pos, end)
        vend = pos + n
        if vend > end:
            raise WireError(f"field {key >> 3} at byte {kstart}: length {n} runs past the end "
                            f"of its message (byte {end})")
        yield key, kstart, kend, pos, vend
        pos = vend


def _next_field(buf: memoryview, pos: int, end: int) -> tuple[int, int, int]:
    """The field whose key starts at ``pos`` (< ``end``): (key, value start, value end)
    (see :func:`_scan`)."""
    for key, _, _, vstart, vend in _scan(buf, pos, end):
        return key, vstart, vend
    raise WireError(f"no field at byte {pos} (the message ends at byte {end})")


def _fields(buf: memoryview, start: int, end: int) -> list[tuple[int, int, int, int]]:
    """All fields of the message in ``[start, end)`` as (key, key start, value start, value end)
    (see :func:`_scan`)."""
    return [(key, kstart, vstart, vend) for key, kstart, _, vstart, vend in _scan(buf, start, end)]


# --------------------------------------------------------------------------- scanning


def _strip_value(buf: memoryview, start: int, end: int, raw_field: int, min_size: int
                 ) -> tuple[list[tuple[int, int]], int, int] | None:
    """Find the payload of a TensorProto / EncodedValueProto in ``[start, end)``.

    Return (byte ranges of every raw_data field to remove, payload offset, payload
    length), or None when nothing qualifies. Protobuf keeps the last occurrence of
    a scalar field that appears more than once, so the last one is the payload and
    earlier ones are removed with it."""
    raw_key = (raw_field << 3) | _LEN
    occurrences: list[tuple[int, int, int]] = []
    pos = start
    while pos < end:
        kstart = pos
        key, vstart, pos = _next_field(buf, pos, end)
        if key == raw_key:
            occurrences.append((kstart, vstart, pos))
    if not occurrences:
        return None
    _, vstart, vend = occurrences[-1]
    if vend - vstart < min_size:
        return None
    return [(k, e) for k, _, e in occurrences], vstart, vend - vstart


def _strip_graph(buf: memoryview, start: int, end: int, min_size: int,
                 counters: dict[str, int], refs: list[PayloadRef]
                 ) -> tuple[list[_Piece], int] | None:
    """Strip the main graph in ``[start, end)``; return (pieces, new length) or None if unchanged.

    The hot loop: nodes and every other field are skipped with their length
    prefix, without being descended into."""
    pieces: list[_Piece] = []
    run = start  # start of the current stretch of bytes copied unchanged
    changed = False
    new_len = 0
    key_init, key_enc = _KEY_INITIALIZER, _KEY_ENCODED
    for key, _, kend, pos, vend in _scan(buf, start, end):
        if key == key_init or key == key_enc:
            n = vend - pos
            kind = _KIND_OF_KEY[key]
            index = counters[kind]
            counters[kind] = index + 1
            if n >= min_size:  # a shorter value cannot hold a payload of min_size bytes
                found = _strip_value(buf, pos, vend, _KINDS[kind][1], min_size)
                if found is not None:
                    removed, off, length = found
                    refs.append(PayloadRef(kind, index, off, length))  # type: ignore[arg-type]
                    value_len = n - sum(e - s for s, e in removed)
                    lenbytes = _encode_varint(value_len)
                    pieces.append((run, kend))
                    pieces.append(lenbytes)
                    cur = pos
                    for s, e in removed:
                        pieces.append((cur, s))
                        cur = e
                    pieces.append((cur, vend))
                    new_len += (kend - run) + len(lenbytes) + value_len
                    run = vend
                    changed = True
    if not changed:
        return None
    pieces.append((run, end))
    new_len += end - run
    return pieces, new_len


def _as_view(data: BytesLike) -> memoryview:
    """A flat unsigned-byte memoryview of ``data``."""
    try:
        view = memoryview(data)
    except TypeError:
        raise TypeError(f"expected bytes, bytearray, memoryview or mmap, got {type(data).__name__}"
                        ) from None
    if not view.c_contiguous:
        view.release()
        raise TypeError("a non-contiguous buffer cannot be scanned as protobuf bytes")
    if view.format != "B" or view.ndim != 1:
        flat = view.cast("B")
        view.release()
        return flat
    return view


def strip_payloads(data: BytesLike, *, min_size: int = 1024) -> StrippedModel:
    """Remove the main graph's inline payloads of at least ``min_size`` bytes from a
    serialized ModelProto, without copying them.

    ``data`` is the serialized model (bytes, bytearray, memoryview or an ``mmap``).
    The removed fields are ``TensorProto.raw_data`` of ``graph.initializer[i]`` and
    ``EncodedValueProto.raw_data`` of ``graph.encoded_initializer[i]``; subgraph and
    function initializers stay inline. The returned skeleton holds only the other
    bytes (with the enclosing length prefixes re-encoded, field order kept), and
    each :class:`PayloadRef` gives a payload's byte range in ``data``.

    Raises :class:`WireError` for malformed or truncated protobuf bytes on the
    scanned path, including group wire types; ``ValueError`` for a negative
    ``min_size``."""
    if isinstance(min_size, bool) or not isinstance(min_size, int):
        raise TypeError(f"min_size must be an int, got {type(min_size).__name__}")
    if min_size < 0:
        raise ValueError(f"min_size must be >= 0, got {min_size}")
    buf = _as_view(data)
    try:
        end = len(buf)
        refs: list[PayloadRef] = []
        counters = {KIND_INITIALIZER: 0, KIND_ENCODED: 0}
        pieces: list[_Piece] = []
        run = 0
        for key, kstart, vstart, vend in _fields(buf, 0, end):
            if key != _KEY_GRAPH:
                continue
            graph = _strip_graph(buf, vstart, vend, min_size, counters, refs)
            if graph is None:
                continue
            gpieces, glen = graph
            pieces.append((run, kstart))
            pieces.append(bytes((_KEY_GRAPH,)))
            pieces.append(_encode_varint(glen))
            pieces.extend(gpieces)
            run = vend
        if not pieces:
            # nothing removed: the skeleton is the model itself
            skeleton = data if type(data) is bytes else bytes(buf)
        else:
            pieces.append((run, end))
            skeleton = _join(buf, pieces)
    finally:
        buf.release()
    return StrippedModel(skeleton, refs)


def payload_views(data: BytesLike, stripped: StrippedModel) -> dict[tuple[str, int], memoryview]:
    """Read-only memoryviews into ``data`` for each payload of ``stripped`` (zero copy).

    ``data`` must be the object that was scanned. Keys are ``(kind, index)``. A view
    into an ``mmap`` keeps the map open: release the views before closing it."""
    whole = _as_view(data)
    try:
        ro = whole.toreadonly()
    finally:
        whole.release()
    size = len(ro)
    out: dict[tuple[str, int], memoryview] = {}
    for ref in stripped.payloads:
        if ref.offset < 0 or ref.length < 0 or ref.offset + ref.length > size:
            ro.release()
            for v in out.values():
                v.release()
            raise WireError(f"payload {ref.kind}[{ref.index}] at bytes [{ref.offset}, "
                            f"{ref.offset + ref.length}) lies outside the data ({size} bytes)")
        out[ref.key] = ro[ref.offset:ref.offset + ref.length]
    ro.release()
    return out


# --------------------------------------------------------------------------- external references

# The messages on the paths from a ModelProto to its tensors, and for each the fields
# that lead on: {kind: {field number: kind of that field's message}} (onnx.proto and
# DESIGN.md's extension numbers). Nothing else is descended into.
_MODEL, _TRAINING, _GRAPH, _NODE, _FUNCTION, _ATTRIBUTE, _SPARSE, _TENSOR = range(8)
_ENCODED, _AFFINE, _STRUCT, _STRUCTURE, _FIELD, _ENTRY = range(8, 14)
_LEADS: Final[dict[int, dict[int, int]]] = {
    _MODEL: {7: _GRAPH, 20: _TRAINING, 25: _FUNCTION, 1000: _STRUCT},
    _TRAINING: {1: _GRAPH, 2: _GRAPH},  # initialization, algorithm
    _GRAPH: {1: _NODE, 5: _TENSOR, 15: _SPARSE, _GRAPH_ENCODED_INITIALIZER: _ENCODED},
    _NODE: {5: _ATTRIBUTE},
    _FUNCTION: {7: _NODE, 11: _ATTRIBUTE},  # node, attribute_proto (default values)
    _ATTRIBUTE: {5: _TENSOR, 6: _GRAPH, 10: _TENSOR, 11: _GRAPH, 22: _SPARSE, 23: _SPARSE},
    _SPARSE: {1: _TENSOR, 2: _TENSOR},  # values, indices
    _TENSOR: {13: _ENTRY},  # external_data
    _ENCODED: {1: _AFFINE, 2: _STRUCT, 5: _ENTRY},  # affine, struct_type, external_data
    _AFFINE: {2: _TENSOR, 3: _TENSOR},  # scale, zero_point
    _STRUCT: {2: _STRUCTURE, 5: _FUNCTION, 6: _FUNCTION},  # structure, decoder, encoder
    _STRUCTURE: {1: _FIELD},
    _FIELD: {4: _TENSOR},  # constant
}
_LOCATION: Final = b"location"


def _offsets(data: BytesLike, word: bytes) -> list[int] | None:
    """Where ``word`` starts in ``data``, in order (a C-speed search); None when ``data``
    cannot be searched without a copy (a memoryview)."""
    find = getattr(data, "find", None)
    if find is None:
        return None
    out: list[int] = []
    at = find(word)
    while at >= 0:
        out.append(at)
        at = find(word, at + 1)
    return out


def _spells(hits: list[int], start: int, end: int) -> bool:
    """Whether one of the offsets ``hits`` lies in ``[start, end)``: only a message whose
    bytes spell ``location`` can hold an external reference."""
    i = bisect_left(hits, start)
    return i < len(hits) and hits[i] < end


def _entry(buf: memoryview, start: int, end: int) -> tuple[bytes, bytes]:
    """``(key, value)`` of a StringStringEntryProto (the last of a repeated field wins)."""
    key = value = b""
    pos = start
    while pos < end:
        k, vstart, pos = _next_field(buf, pos, end)
        if k == (1 << 3) | _LEN:
            key = bytes(buf[vstart:pos])
        elif k == (2 << 3) | _LEN:
            value = bytes(buf[vstart:pos])
    return key, value


def external_locations(data: BytesLike) -> list[str]:
    """The ``location`` of every external-data reference of a serialized ModelProto: the
    data files it needs, relative to its folder, each once, in the order they appear.

    Every tensor that can refer to external data is read: initializers (dense, sparse,
    encoded, and an encoded value's affine scale and zero point), tensor attributes of
    nodes, in the main graph, its subgraphs, local functions, training graphs and struct
    types' constants and codec functions. Only those messages are descended into, and
    only when their bytes spell ``location`` (found by one search of ``data`` first,
    unless it is a memoryview): other fields and every payload are skipped by their
    length, and no protobuf object is built. A model whose bytes never spell
    ``location`` is answered by that search alone::

        external_locations(mapping)   # ['model.onnx.data']

    Raises :class:`WireError` for malformed bytes on the scanned path."""
    hits = _offsets(data, _LOCATION)
    if hits is not None and not hits:
        return []
    buf = _as_view(data)
    found: dict[str, None] = {}
    try:
        stack = [(_MODEL, 0, len(buf))]
        while stack:
            kind, pos, end = stack.pop()
            if kind == _ENTRY:
                name, value = _entry(buf, pos, end)
                if name == _LOCATION:
                    found.setdefault(value.decode("utf-8", "surrogateescape"), None)
                continue
            leads = _LEADS[kind]
            children: list[tuple[int, int, int]] = []
            while pos < end:
                key, vstart, pos = _next_field(buf, pos, end)
                child = leads.get(key >> 3) if key & 7 == _LEN else None
                if child is not None and (hits is None or _spells(hits, vstart, pos)):
                    children.append((child, vstart, pos))
            stack.extend(reversed(children))  # depth first, in wire order
    finally:
        buf.release()
    return list(found)


# --------------------------------------------------------------------------- writing


class _Payload:
    """A marker wrapping a caller's payload in the write plan."""

    __slots__ = ("view",)

    def __init__(self, view: memoryview) -> None:
        self.view = view


def _insert_point(skel: memoryview, start: int, end: int, raw_field: int) -> int:
    """Where protobuf's serializer puts field ``raw_field`` in the message ``[start, end)``:
    before the first field with a larger number, else at the end. Returns -1 when the
    message already holds the field."""
    at = -2
    for key, kstart, _, _ in _fields(skel, start, end):
        number = key >> 3
        if number == raw_field and key & 7 == _LEN:
            return -1
        if at == -2 and number > raw_field:
            at = kstart
    return end if at == -2 else at


def _check_payloads(payloads: Mapping[tuple[str, int], object]
                    ) -> dict[tuple[str, int], memoryview]:
    """Validate the keys and take a flat byte memoryview of every payload."""
    views: dict[tuple[str, int], memoryview] = {}
    try:
        for k, p in payloads.items():
            if (not isinstance(k, tuple) or len(k) != 2 or k[0] not in _KINDS
                    or isinstance(k[1], bool) or not isinstance(k[1], int) or k[1] < 0):
                raise ValueError(f"payload key {k!r} is not ('initializer' | 'encoded', "
                                 "index >= 0)")
            try:
                v = memoryview(p)  # type: ignore[arg-type]
            except TypeError:
                raise TypeError(f"payload {k!r} is not bytes-like ({type(p).__name__})") from None
            if not v.c_contiguous:
                v.release()
                raise TypeError(f"payload {k!r} is not a contiguous buffer")
            if v.format != "B" or v.ndim != 1:
                flat = v.cast("B")
                v.release()
                v = flat
            views[k] = v
    except BaseException:
        for v in views.values():
            v.release()
        raise
    return views


def write_model(fh: IO[bytes], skeleton_model_bytes: BytesLike,
                payloads: Mapping[tuple[str, int], BytesLike]) -> int:
    """Write a complete serialized ModelProto to the binary file object ``fh``.

    ``skeleton_model_bytes`` is a serialized ModelProto whose main-graph
    initializers named by ``payloads`` have no ``raw_data`` (the field absent);
    ``payloads`` maps ``(kind, index)`` (see :class:`PayloadRef`) to a bytes-like
    payload. Each payload becomes the ``raw_data`` field of
    ``graph.initializer[index]`` (kind ``"initializer"``) or
    ``graph.encoded_initializer[index]`` (kind ``"encoded"``), placed where
    protobuf's serializer places it (before the first field with a higher number),
    and every enclosing length prefix is re-encoded. Payloads are passed to
    ``fh.write`` unchanged, one call each. Returns the number of bytes written.

    Raises :class:`WireError` when the skeleton is malformed, has no such
    initializer, or the initializer already holds ``raw_data``; ``ValueError`` /
    ``TypeError`` for bad keys or non-bytes-like payloads. Nothing is written when
    an error is raised."""
    views = _check_payloads(payloads)
    skel = _as_view(skeleton_model_bytes)
    plan: list[_Piece | _Payload] = []
    try:
        end = len(skel)
        counters = {KIND_INITIALIZER: 0, KIND_ENCODED: 0}
        seen: set[tuple[str, int]] = set()
        run = 0
        for key, kstart, vstart, vend in (_fields(skel, 0, end) if views else ()):
            if key != _KEY_GRAPH:
                continue
            gplan, glen = _fill_graph(skel, vstart, vend, views, counters, seen)
            if gplan is None:
                continue
            plan.append((run, kstart))
            plan.append(bytes((_KEY_GRAPH,)) + _encode_varint(glen))
            plan.extend(gplan)
            run = vend
        missing = sorted(set(views) - seen)
        if missing:
            raise WireError("the skeleton's main graph has no " + ", ".join(
                f"{kind}[{index}]" for kind, index in missing)
                + f" (it has {counters[KIND_INITIALIZER]} initializer(s) and "
                f"{counters[KIND_ENCODED]} encoded initializer(s))")
        plan.append((run, end))
        return _write_plan(fh, skel, plan)
    finally:
        skel.release()
        for v in views.values():
            v.release()


def _fill_graph(skel: memoryview, start: int, end: int, views: dict[tuple[str, int], memoryview],
                counters: dict[str, int], seen: set[tuple[str, int]]
                ) -> tuple[list[_Piece | _Payload] | None, int]:
    """Plan the main graph in ``[start, end)`` with payloads inserted; (None, 0) if unchanged."""
    plan: list[_Piece | _Payload] = []
    run = start
    new_len = 0
    for key, kstart, _, pos, vend in _scan(skel, start, end):
        kind = _KIND_OF_KEY.get(key)
        if kind is not None:
            n = vend - pos
            index = counters[kind]
            counters[kind] = index + 1
            payload = views.get((kind, index))
            if payload is not None:
                seen.add((kind, index))
                raw_field = _KINDS[kind][1]
                at = _insert_point(skel, pos, vend, raw_field)
                if at < 0:
                    raise WireError(f"{kind}[{index}] of the skeleton already holds raw_data; "
                                    "a payload cannot be inserted twice")
                raw_head = _encode_varint((raw_field << 3) | _LEN) + _encode_varint(payload.nbytes)
                value_len = n + len(raw_head) + payload.nbytes
                head = _encode_varint(key) + _encode_varint(value_len)
                plan.append((run, kstart))
                plan.append(head)
                plan.append((pos, at))
                plan.append(raw_head)
                plan.append(_Payload(payload))
                plan.append((at, vend))
                new_len += (kstart - run) + len(head) + value_len
                run = vend
    if not plan:
        return None, 0
    plan.append((run, end))
    new_len += end - run
    return plan, new_len


def _write_all(fh: IO[bytes], chunk: memoryview | bytes) -> int:
    """Write ``chunk`` completely (raw files may accept fewer bytes per call)."""
    size = len(chunk) if isinstance(chunk, bytes) else chunk.nbytes
    written = fh.write(chunk)
    if written is None or written >= size:
        return size
    with memoryview(chunk) as rest:
        while written < size:
            n = fh.write(rest[written:])
            if n is None:
                break
            if n <= 0:
                raise OSError(f"write made no progress after {written} of {size} bytes")
            written += n
    return size


def _write_plan(fh: IO[bytes], skel: memoryview, plan: list[_Piece | _Payload]) -> int:
    """Write the plan: consecutive skeleton pieces in one call, each payload in its own."""
    total = 0
    pending: list[_Piece] = []
    for item in plan:
        if isinstance(item, _Payload):
            if pending:
                total += _write_all(fh, _join(skel, pending))
                pending.clear()
            if item.view.nbytes:
                total += _write_all(fh, item.view)
        else:
            pending.append(item)
    if pending:
        total += _write_all(fh, _join(skel, pending))
    return total


# --------------------------------------------------------------------------- files


def map_model_file(path: str | os.PathLike[str]) -> mmap.mmap:
    """A read-only memory map of the model file at ``path``, for :func:`strip_payloads`
    and :func:`external_locations`; close it with :func:`release_map`.

    Raises :class:`WireError` for an empty file (it holds no model and cannot be
    mapped) and ``OSError`` as ``open`` and ``mmap`` raise it: callers say which file
    it was in their own terms."""
    path = os.fspath(path)
    with open(path, "rb") as fh:
        if os.fstat(fh.fileno()).st_size == 0:
            raise WireError(f"{path!r} is empty: not an ONNX model")
        return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)


def release_map(mapping: mmap.mmap) -> None:
    """Close ``mapping`` unless a view into it (a payload of a loaded model) is still
    alive; the map is then unmapped with the last view."""
    try:
        mapping.close()
    except BufferError:
        pass
