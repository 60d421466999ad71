"""The wire form of paged KV caches: one extended ``ModelProto`` holding whole caches.

A cache value (:class:`PagedCacheValue`) is a page table of ``num_pages``
entries, each missing or ``(format, payload)``, the published ``length`` and the
format policy. Its wire form is a struct value spread over one graph:

* ``model.struct_types``: the page formats' declarations (:mod:`.kvpages`) and
  one ``ONNXFORGE_PAGED_KV_CACHE`` container declaration per geometry and policy::

      ONNXFORGE_PAGED_KV_CACHE (type_id 7004) structure {
          pages: sequence(struct category)       # held pages, each an encoded value
          length: tensor(INT64, [])
          page_shape: constant INT64[4] = [2, H, P, D]
          capacity: constant INT64 = num_pages * P
      }  metadata_props {onnxforge.paged.formats: "float32,int8,int4"}

* ``graph.input[cache]`` typed ``struct_type {type_ref: 7004}``;
* ``graph.encoded_initializer['cache.pages[3]']``: page 3, ``struct_type
  {type_ref: <format's root>}``, logical type ``FLOAT[2, H, P, D]``, the
  payload as ``raw_data`` (a missing page has no entry);
* ``graph.initializer['cache.length']``: INT64 scalar.

``of.verify`` checks such a model (rules K6-K9 of ``verify.paged_rules``), and
:func:`cache_from_proto` refuses one that breaks a rule, so a page whose layout
decodes to another shape or type, an unknown format or an out-of-range page id
never loads. Decoding is identical after the round trip::

    data = cache_to_bytes({"cache.0": value})
    cache_from_bytes(data)["cache.0"].decode(3)  ==  value.decode(3)   (bitwise)
"""
from __future__ import annotations

import re
from collections.abc import Mapping, MutableSequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from onnx import TensorProto

from onnxforge.proto_ext import schema
from onnxforge.proto_ext.codecs.kvpages import (
    FORMAT_OF_STRUCT,
    PageFormatError,
    check_format,
    check_geometry,
    declare_or_reuse,
    declare_page_types,
    decode_page,
    page_encoded_value,
    page_nbytes,
)
from onnxforge.proto_ext.convert import constant_from_numpy, struct_to_proto, type_to_proto
from onnxforge.proto_ext.errors import VerificationError
from onnxforge.proto_ext.types import SequenceType, StructField, StructType, TensorType

__all__ = [
    "CACHE_STRUCT_NAME",
    "FORMATS_KEY",
    "PagedCacheValue",
    "cache_declaration",
    "cache_from_bytes",
    "cache_from_proto",
    "cache_to_bytes",
    "cache_to_proto",
    "declare_cache_types",
    "length_name",
    "page_name",
    "parse_page_name",
]

CACHE_STRUCT_NAME = "ONNXFORGE_PAGED_KV_CACHE"
FORMATS_KEY = "onnxforge.paged.formats"
_PAGE_NAME = re.compile(r"^(?P<cache>.*)\.pages\[(?P<index>0|[1-9][0-9]*)\]$")

Page = tuple[str, bytes]


def page_name(cache: str, index: int) -> str:
    """Name of page ``index`` of cache ``cache`` in the wire form: ``cache.pages[3]``."""
    return f"{cache}.pages[{index}]"


def length_name(cache: str) -> str:
    """Name of the length initializer of cache ``cache``: ``cache.length``."""
    return f"{cache}.length"


def parse_page_name(name: str) -> tuple[str, int] | None:
    """``(cache, index)`` of a page name, or None for any other name."""
    m = _PAGE_NAME.match(name)
    return (m.group("cache"), int(m.group("index"))) if m else None


@dataclass(frozen=True, slots=True)
class PagedCacheValue:
    """One cache: geometry, page table (None = missing page), length and format policy.

    The constructor checks everything a load would: geometry (``D % 32 == 0``,
    ``P % 4 == 0``), a known format and the exact payload length of every page,
    ``0 <= length <= capacity`` and that every page holding tokens below
    ``length`` is present; it raises :class:`PageFormatError` otherwise.
    """

    kv_heads: int
    head_dim: int
    page_size: int
    num_pages: int
    length: int = 0
    pages: tuple[Page | None, ...] = ()
    formats: tuple[str, ...] = ("float32",)

    def __post_init__(self) -> None:
        H, P, D, N = self.kv_heads, self.page_size, self.head_dim, self.num_pages
        check_geometry(H, P, D)
        if isinstance(N, bool) or not isinstance(N, int) or N < 1:
            raise PageFormatError(f"num_pages={N!r} is not a positive integer")
        pages = tuple(self.pages) if self.pages else (None,) * N
        if len(pages) != N:
            raise PageFormatError(f"the page table has {len(pages)} entries, num_pages is {N}")
        norm: list[Page | None] = []
        for i, page in enumerate(pages):
            if page is None:
                norm.append(None)
                continue
            fmt, payload = page
            check_format(fmt)
            data = payload.tobytes() if isinstance(payload, np.ndarray) else bytes(payload)
            want = page_nbytes(fmt, H, P, D)
            if len(data) != want:
                raise PageFormatError(f"page {i}: a {fmt} page of geometry H={H}, P={P}, D={D} has "
                                      f"{want} bytes, the payload has {len(data)}")
            norm.append((fmt, data))
        object.__setattr__(self, "pages", tuple(norm))
        formats = tuple(self.formats)
        if not formats:
            raise PageFormatError("the format policy is empty")
        for fmt in formats:
            check_format(fmt)
        object.__setattr__(self, "formats", formats)
        if isinstance(self.length, bool) or not isinstance(self.length, int) or \
                not 0 <= self.length <= N * P:
            raise PageFormatError(f"length={self.length!r} is not in [0, capacity={N * P}]")
        for i in range(-(-self.length // P)):
            if norm[i] is None:
                raise PageFormatError(f"page {i} holds tokens below length {self.length} but is missing")

    @property
    def capacity(self) -> int:
        return self.num_pages * self.page_size

    def page_formats(self) -> list[str | None]:
        return [None if p is None else p[0] for p in self.pages]

    def decode(self, index: int) -> np.ndarray:
        """float32 ``[2, H, P, D]`` of page ``index`` (PageFormatError if it is missing)."""
        if not 0 <= index < self.num_pages:
            raise PageFormatError(f"page id {index} is outside [0, {self.num_pages})")
        page = self.pages[index]
        if page is None:
            raise PageFormatError(f"page {index} is missing")
        return decode_page(page[0], page[1], self.kv_heads, self.page_size, self.head_dim)

    @classmethod
    def from_cache(cls, cache: Any) -> PagedCacheValue:
        """The value of a runtime cache object offering ``kv_heads``, ``head_dim``,
        ``page_size``, ``num_pages``, ``length``, ``page_formats()``, ``page_payload(i)``
        and its policy as ``formats`` (payloads are copied into bytes)."""
        fmts = list(cache.page_formats())
        pages = tuple(None if f is None else (f, np.asarray(cache.page_payload(i), dtype=np.uint8).tobytes())
                      for i, f in enumerate(fmts))
        return cls(int(cache.kv_heads), int(cache.head_dim), int(cache.page_size), int(cache.num_pages),
                   int(cache.length), pages, tuple(getattr(cache, "formats", ("float32",))))


# -- declarations -------------------------------------------------------------------------------

def cache_declaration(H: int, P: int, D: int, num_pages: int, formats: tuple[str, ...] = ("float32",),
                      type_id: int | None = None) -> StructType:
    """The ``ONNXFORGE_PAGED_KV_CACHE`` container declaration for one geometry and policy."""
    check_geometry(H, P, D)
    for fmt in formats:
        check_format(fmt)
    fields = (
        StructField("pages", SequenceType(StructType()), None, has_type=True),
        StructField("length", TensorType(TensorProto.INT64, ()), None, has_type=True),
        StructField("page_shape", None, constant_from_numpy(np.array([2, H, P, D], dtype=np.int64))),
        StructField("capacity", None, constant_from_numpy(np.array(num_pages * P, dtype=np.int64))),
    )
    return StructType(kind="structure", fields=fields, name=CACHE_STRUCT_NAME, type_id=type_id,
                      doc_string="paged KV cache of one attention layer: held pages (any page format "
                                 "decoding to FLOAT page_shape) and the valid length",
                      metadata=((FORMATS_KEY, ",".join(formats)),))


def declare_cache_types(struct_types: MutableSequence[StructType],
                        value: PagedCacheValue) -> tuple[int, dict[str, int]]:
    """Add the container and the page formats ``value`` uses to a catalogue (reusing
    identical declarations); returns ``(container type_id, {format: root type_id})``."""
    H, P, D = value.kv_heads, value.page_size, value.head_dim
    roots = {fmt: declare_page_types(struct_types, fmt, H, P, D)
             for fmt in dict.fromkeys(f for f in value.page_formats() if f is not None)}
    container = declare_or_reuse(struct_types, lambda i: cache_declaration(H, P, D, value.num_pages,
                                                                           value.formats, i))
    return container, roots


# -- wire form ----------------------------------------------------------------------------------

def cache_to_proto(caches: Mapping[str, PagedCacheValue], *, graph_name: str = "paged_kv_cache") -> Any:
    """An extended ``ModelProto`` holding every cache of ``caches`` (names are the caches'
    graph input names, e.g. the stateful model's cache inputs)."""
    decls: list[StructType] = []
    model = schema.ModelProto(ir_version=10, producer_name="onnxforge")
    model.opset_import.add(domain="", version=21)
    g = model.graph
    g.name = graph_name
    for name, value in caches.items():
        if not isinstance(value, PagedCacheValue):
            raise PageFormatError(f"cache {name!r}: expected a PagedCacheValue, got {type(value).__name__}")
        container, roots = declare_cache_types(decls, value)
        vi = g.input.add(name=name)
        type_to_proto(StructType(kind="type_ref", type_ref=container), vi.type)
        g.initializer.add().CopyFrom(schema.from_onnx(_int64_scalar(length_name(name), value.length)))
        for i, page in enumerate(value.pages):
            if page is not None:
                ev = page_encoded_value(page[0], page[1], value.kv_heads, value.page_size, value.head_dim,
                                        roots[page[0]], page_name(name, i))
                g.encoded_initializer.add().CopyFrom(ev)
    for d in decls:
        struct_to_proto(d, model.struct_types.add())
    return model


def _int64_scalar(name: str, v: int) -> Any:
    from onnx import numpy_helper

    return numpy_helper.from_array(np.array(v, dtype=np.int64), name)


def cache_to_bytes(caches: Mapping[str, PagedCacheValue]) -> bytes:
    """The serialized wire form of ``caches`` (one ``ModelProto`` message)."""
    return bytes(cache_to_proto(caches).SerializeToString())


def cache_from_proto(model: Any) -> dict[str, PagedCacheValue]:
    """The caches of a wire-form model (extended ``ModelProto``, bytes or path).

    Every static rule is checked first: a model that breaks one (a page decoding to
    another shape or type, an unknown format, a bad page id or length...) raises
    :class:`VerificationError` naming the rule and the page."""
    from onnxforge.proto_ext.verify import check
    from onnxforge.proto_ext.view import view_from_proto

    message, folder = schema.read_model(model)
    violations = check(message, folder)
    if violations:
        raise VerificationError(violations)
    view = view_from_proto(message, folder)
    by_id = {s.type_id: s for s in view.struct_types if s.type_id}
    g = view.graph
    out: dict[str, PagedCacheValue] = {}
    for spec in g.inputs:
        t = spec.type
        decl = by_id.get(t.type_ref) if isinstance(t, StructType) and t.kind == "type_ref" else None
        if decl is None or decl.name != CACHE_STRUCT_NAME:
            continue
        consts = {f.name: f.constant.array() for f in decl.fields if f.constant is not None}
        _, H, P, D = (int(v) for v in consts["page_shape"])
        N = int(consts["capacity"]) // P
        meta = dict(decl.metadata)
        formats = tuple(meta.get(FORMATS_KEY, "float32").split(","))
        pages: list[Page | None] = [None] * N
        for ev in g.encoded:
            parsed = parse_page_name(ev.name)
            if parsed is None or parsed[0] != spec.name:
                continue
            root = by_id[ev.struct_type.type_ref]
            pages[parsed[1]] = (FORMAT_OF_STRUCT[root.name], bytes(ev.raw_data))
        length = g.int_values[length_name(spec.name)][0]
        out[spec.name] = PagedCacheValue(H, D, P, N, int(length), tuple(pages), formats)
    return out


def cache_from_bytes(data: bytes | bytearray | memoryview) -> dict[str, PagedCacheValue]:
    """:func:`cache_from_proto` of serialized bytes."""
    return cache_from_proto(schema.parse_model(data))

