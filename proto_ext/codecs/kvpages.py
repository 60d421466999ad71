"""Page formats of the paged KV cache: struct declarations, decoders and reference encoders.

A page of one attention layer's cache holds keys and values of ``P`` tokens:
its logical value is float32 ``[2, H, P, D]`` (0 = keys, 1 = values; ``H`` kv
heads, ``D`` head size; row-major ``(kv, h, t, d)``). Each page picks one of
seven byte layouts; every layout is a byte-encodable struct type whose ``name``
is the format identity a decoder is registered under (DESIGN.md "Decoder
registry"):

=========  ===========================  ==========================================
format     struct name                  record (bytes per page)
=========  ===========================  ==========================================
float32    ONNXFORGE_KV_F32_PAGE        {values: FLOAT[D]} per row (2HPD*4)
float16    ONNXFORGE_KV_F16_PAGE        {values: FLOAT16[D]} per row (2HPD*2)
int8       ONNXFORGE_KV_INT8_PAGE       {scale: FLOAT, codes: INT8[D]} per row (2HP(4+D))
int4       ONNXFORGE_KV_INT4_PAGE       {scale: FLOAT16, codes: 4 bits x32} per 32 values (2HP(D/32)18)
fp8        ONNXFORGE_KV_FP8_PAGE        {scale: FLOAT, codes: FLOAT8E4M3FN[D]} per row (2HP(4+D))
int2       ONNXFORGE_KV_INT2_PAGE       one record per page: keys per channel, values per
                                        32-value block (HD(4+P/4) + HP(D/32)12)
codebook   ONNXFORGE_KV_CODEBOOK2_PAGE  {block: SCALED_CODEBOOK2_BLOCK_32} per 32 values
                                        (2HP(D/32)12)
=========  ===========================  ==========================================

A row is ``(kv, h, t)``; records follow row-major order, 32-value blocks
fastest. Sub-byte codes are packed least-significant bits first, multi-byte
numbers are little-endian, fields are consecutive without padding (RULES S3).
The int2 record nests arrays of records: ``keys: array(array(KEY_CHANNEL, D),
H)`` with ``KEY_CHANNEL = {scale: FLOAT16, min: FLOAT16, codes: 2 bits xP}``,
then ``values: array(array(array(VALUE_BLOCK, D/32), P), H)`` with
``VALUE_BLOCK = {scale: FLOAT16, min: FLOAT16, codes: 2 bits x32}``; the codebook
record reuses the values specification's ``CODEBOOK2_BLOCK_32`` (whose constant
table is ``[-1, -0.25, 0.25, 1]``) through ``SCALED_CODEBOOK2_BLOCK_32``.

Example: one int4 record is 18 bytes, the float16 scale (0.5 = ``00 38``) then
32 codes, element 2k in the low nibble of byte k::

    00 38 | 98 ba dc fe 10 32 54 76 | 98 ba dc fe 10 32 54 76
    codes 8, 9, ..., 15, 0, 1, ..., 7 (twice) -> 0.5 * (code - 8)
          = [0.0, 0.5, ..., 3.5, -4.0, -3.5, ..., -0.5] (twice)

Encoders round half to even, then clamp; decoders compute in float32 and are
exact given the bytes. Geometry: ``D % 32 == 0`` and ``P % 4 == 0`` for every
format.

This module is the one catalogue of the formats: their names in code order
(:data:`FORMATS`, :data:`FORMAT_CODES`: the codes the backend's compiled page
kernels switch on), the bytes of a page (:func:`page_nbytes`), the geometry rule
(:func:`check_geometry`) and format policies (:func:`parse_policy`). The backend's
``PagedKVCache`` and the ``make_stateful`` pass take them from here.
"""
from __future__ import annotations

import functools
import math
from dataclasses import replace
from collections.abc import Callable, MutableSequence, Sequence
from typing import Any

import ml_dtypes
import numpy as np
from onnx import TensorProto

from onnxforge.proto_ext import schema
from onnxforge.proto_ext.catalogue import Catalogue
from onnxforge.proto_ext.codecs.registry import register_decoder
from onnxforge.proto_ext.convert import constant_from_numpy, encoded_to_proto, struct_to_proto
from onnxforge.proto_ext.errors import CodecError
from onnxforge.proto_ext.sizes import RecordLayout
from onnxforge.proto_ext.types import (
    ArrayKind,
    BitPackingKind,
    Component,
    EncodedValue,
    StructField,
    StructType,
    TensorType,
    Type,
)

__all__ = [
    "CODEBOOK_BLOCK_NAME",
    "CODEBOOK_TABLE",
    "FORMATS",
    "FORMAT_CODES",
    "FORMAT_OF_STRUCT",
    "PageFormatError",
    "SCALED_CODEBOOK_NAME",
    "STRUCT_NAMES",
    "check_format",
    "check_geometry",
    "codebook_block_declaration",
    "declare_or_reuse",
    "declare_page_types",
    "declared_elements",
    "format_code",
    "int2_geometry",
    "page_declaration",
    "decode_page",
    "encode_page",
    "page_declarations",
    "page_encoded_value",
    "page_logical_type",
    "page_nbytes",
    "page_struct_types",
    "parse_policy",
    "scaled_codebook_declaration",
]

FORMATS: tuple[str, ...] = ("float32", "float16", "int8", "int4", "fp8", "int2", "codebook")
FORMAT_CODES: dict[str, int] = {name: code for code, name in enumerate(FORMATS)}
"""Format name -> code; the backend's compiled page kernels number the formats the same way."""
STRUCT_NAMES: dict[str, str] = {
    "float32": "ONNXFORGE_KV_F32_PAGE",
    "float16": "ONNXFORGE_KV_F16_PAGE",
    "int8": "ONNXFORGE_KV_INT8_PAGE",
    "int4": "ONNXFORGE_KV_INT4_PAGE",
    "fp8": "ONNXFORGE_KV_FP8_PAGE",
    "int2": "ONNXFORGE_KV_INT2_PAGE",
    "codebook": "ONNXFORGE_KV_CODEBOOK2_PAGE",
}
FORMAT_OF_STRUCT: dict[str, str] = {v: k for k, v in STRUCT_NAMES.items()}
CODEBOOK_BLOCK_NAME = "CODEBOOK2_BLOCK_32"
SCALED_CODEBOOK_NAME = "SCALED_CODEBOOK2_BLOCK_32"
CODEBOOK_TABLE = np.array([-1.0, -0.25, 0.25, 1.0], dtype=np.float32)
FIRST_TYPE_ID = 7001
"""Smallest type_id :func:`declare_page_types` allocates in an empty catalogue."""

FLOAT, FLOAT16, INT8, UINT8 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.INT8, TensorProto.UINT8
FP8 = TensorProto.FLOAT8E4M3FN
_F32, _F16 = np.dtype("<f4"), np.dtype("<f2")


class PageFormatError(CodecError):
    """An unknown page format name, a geometry the formats do not support, or a payload
    whose length is not the format's page size."""


# -- geometry -----------------------------------------------------------------------------

def format_code(fmt: Any) -> int:
    """The code of format ``fmt`` (its index in :data:`FORMATS`), else :class:`PageFormatError`."""
    code = FORMAT_CODES.get(fmt) if isinstance(fmt, str) else None
    if code is None:
        raise PageFormatError(f"unknown page format {fmt!r}; the formats are {', '.join(FORMATS)}")
    return code


def check_format(fmt: str) -> str:
    """``fmt`` if it names a page format, else :class:`PageFormatError`."""
    format_code(fmt)
    return fmt


def parse_policy(formats: str | Sequence[str], *, fold_case: bool = False) -> tuple[str, ...]:
    """A format policy, newest page first, the last format repeating for older pages::

        parse_policy("float32, int8,int4")       -> ("float32", "int8", "int4")
        parse_policy(["INT8"], fold_case=True)    -> ("int8",)

    A string is split at commas; names are stripped (and lower-cased with
    ``fold_case``). An empty policy, an empty name or an unknown one is a
    :class:`PageFormatError`.
    """
    items = formats.split(",") if isinstance(formats, str) else list(formats)
    names = tuple((n.strip().lower() if fold_case else n.strip()) if isinstance(n, str) else n
                  for n in items)
    if not names or any(isinstance(n, str) and not n for n in names):
        raise PageFormatError(f"the format policy is empty or has an empty name; give one or more of "
                              f"{', '.join(FORMATS)}, newest page first")
    for n in names:
        format_code(n)
    return names


def check_geometry(H: int, P: int, D: int) -> None:
    """Positive integers with ``D % 32 == 0`` and ``P % 4 == 0`` (PAGED_FORMATS requirements)."""
    for name, v in (("kv_heads", H), ("page_size", P), ("head_dim", D)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise PageFormatError(f"{name}={v!r} is not a positive integer")
    if D % 32:
        raise PageFormatError(f"head_dim={D} is not a multiple of 32 (every page format packs "
                              "32-value blocks)")
    if P % 4:
        raise PageFormatError(f"page_size={P} is not a multiple of 4 (int2 key channels pack P codes "
                              "four to a byte)")


def page_nbytes(fmt: str, H: int, P: int, D: int) -> int:
    """Bytes of one page of format ``fmt`` (the table of the module docstring)."""
    check_format(fmt)
    check_geometry(H, P, D)
    rows, blocks = 2 * H * P, D // 32
    return {
        "float32": rows * D * 4,
        "float16": rows * D * 2,
        "int8": rows * (4 + D),
        "int4": rows * blocks * 18,
        "fp8": rows * (4 + D),
        "int2": H * D * (4 + P // 4) + H * P * blocks * 12,
        "codebook": rows * blocks * 12,
    }[fmt]


def page_logical_type(H: int, P: int, D: int) -> TensorType:
    """The logical type of every page: ``FLOAT[2, H, P, D]``."""
    return TensorType(FLOAT, (2, H, P, D))


# -- declarations -------------------------------------------------------------------------

def _tensor(elem: int, dims: tuple[int, ...] = ()) -> TensorType:
    return TensorType(elem, dims)


def _field(name: str, t: Type) -> StructField:
    return StructField(name, t, None, has_type=True)


def _codes(width: int, n: int, component: str = "code") -> StructType:
    return StructType(kind="bit_packing", bit_packing=BitPackingKind((Component(component, width),), n))


def _array(elem: Type, n: int) -> StructType:
    return StructType(kind="array", array=ArrayKind(elem, n))


def _structure(fields: list[StructField], name: str = "", type_id: int | None = None,
               doc: str = "") -> StructType:
    return StructType(kind="structure", fields=tuple(fields), name=name, type_id=type_id, doc_string=doc)


def _ref(type_id: int) -> StructType:
    return StructType(kind="type_ref", type_ref=type_id)


def codebook_block_declaration(type_id: int) -> StructType:
    """The values specification's ``CODEBOOK2_BLOCK_32``: 32 two-bit indices and a constant table."""
    return _structure([_field("codes", _codes(2, 32, "index")),
                       StructField("codebook", None, constant_from_numpy(CODEBOOK_TABLE))],
                      CODEBOOK_BLOCK_NAME, type_id)


def scaled_codebook_declaration(type_id: int, block_id: int) -> StructType:
    """``SCALED_CODEBOOK2_BLOCK_32``: a ``CODEBOOK2_BLOCK_32`` and a per-block FLOAT scale."""
    return _structure([_field("quantized", _ref(block_id)), _field("scale", _tensor(FLOAT))],
                      SCALED_CODEBOOK_NAME, type_id)


def _group(P_or_32: int, name: str) -> StructType:
    return _structure([_field("scale", _tensor(FLOAT16)), _field("min", _tensor(FLOAT16)),
                       _field("codes", _codes(2, P_or_32))], name)


def page_declaration(fmt: str, H: int, P: int, D: int, type_id: int,
                     scaled_codebook_id: int | None = None) -> StructType:
    """The root declaration of format ``fmt`` for geometry ``(H, P, D)``.

    The codebook format refers to a ``SCALED_CODEBOOK2_BLOCK_32`` declaration
    (``scaled_codebook_id``); :func:`page_declarations` builds the whole closure.
    """
    check_format(fmt)
    check_geometry(H, P, D)
    name = STRUCT_NAMES[fmt]
    if fmt in ("float32", "float16"):
        fields = [_field("values", _tensor(FLOAT if fmt == "float32" else FLOAT16, (D,)))]
    elif fmt in ("int8", "fp8"):
        fields = [_field("scale", _tensor(FLOAT)), _field("codes", _tensor(INT8 if fmt == "int8" else FP8, (D,)))]
    elif fmt == "int4":
        fields = [_field("scale", _tensor(FLOAT16)), _field("codes", _codes(4, 32))]
    elif fmt == "int2":
        keys = _array(_array(_group(P, "ONNXFORGE_KV_INT2_KEY_CHANNEL"), D), H)
        values = _array(_array(_array(_group(32, "ONNXFORGE_KV_INT2_VALUE_BLOCK"), D // 32), P), H)
        fields = [_field("keys", keys), _field("values", values)]
    else:
        if scaled_codebook_id is None:
            raise PageFormatError("the codebook page declaration needs the type_id of its "
                                  f"{SCALED_CODEBOOK_NAME} declaration")
        fields = [_field("block", _ref(scaled_codebook_id))]
    return _structure(fields, name, type_id, f"paged KV cache page, format {fmt}")


def page_declarations(fmt: str, H: int, P: int, D: int, first_id: int = FIRST_TYPE_ID) -> list[StructType]:
    """Every declaration format ``fmt`` needs, dependencies first and the root last, with
    consecutive type_ids from ``first_id``."""
    if check_format(fmt) != "codebook":
        return [page_declaration(fmt, H, P, D, first_id)]
    return [codebook_block_declaration(first_id), scaled_codebook_declaration(first_id + 1, first_id),
            page_declaration(fmt, H, P, D, first_id + 2, first_id + 1)]


def page_struct_types(fmt: str, H: int, P: int, D: int, first_id: int = FIRST_TYPE_ID) -> list[Any]:
    """:func:`page_declarations` as ``StructTypeProto`` messages (for ``ModelProto.struct_types``)."""
    return [struct_to_proto(d, schema.StructTypeProto()) for d in page_declarations(fmt, H, P, D, first_id)]


def _anonymous(st: StructType) -> StructType:
    return replace(st, type_id=None)


def _find(entries: MutableSequence[StructType], want: StructType) -> int | None:
    """type_id of an entry equal to ``want`` up to its type_id."""
    key = _anonymous(want)
    for e in entries:
        if e.type_id and _anonymous(e) == key:
            return e.type_id
    return None


def declare_or_reuse(entries: MutableSequence[StructType], build: Callable[[int], StructType]) -> int:
    """The type_id of an entry equal (up to type_id) to ``build(0)``, else of ``build(new_id)``
    appended with the smallest id above every entry's (at least :data:`FIRST_TYPE_ID`)."""
    probe = build(0)
    found = _find(entries, probe)
    if found is not None:
        return found
    new_id = max([FIRST_TYPE_ID - 1] + [e.type_id or 0 for e in entries]) + 1
    entries.append(build(new_id))
    return new_id


def declare_page_types(struct_types: MutableSequence[StructType], fmt: str, H: int, P: int, D: int) -> int:
    """Add format ``fmt``'s declarations for ``(H, P, D)`` to a catalogue (a model's
    ``struct_types`` list of records) unless identical ones are there; returns the root's
    type_id. Identity is the declaration's content: names, fields and constants."""
    check_format(fmt)
    check_geometry(H, P, D)
    if fmt != "codebook":
        return declare_or_reuse(struct_types, lambda i: page_declaration(fmt, H, P, D, i))
    block = declare_or_reuse(struct_types, codebook_block_declaration)
    scaled = declare_or_reuse(struct_types, lambda i: scaled_codebook_declaration(i, block))
    return declare_or_reuse(struct_types, lambda i: page_declaration(fmt, H, P, D, i, scaled))


# -- decoders (registered under the struct names) ---------------------------------------------

def _f32(a: np.ndarray) -> np.ndarray:
    return np.asarray(a).astype(np.float32)


DecodeFn = Callable[[dict[str, np.ndarray], int, RecordLayout], np.ndarray]


def _ieee(fn: DecodeFn) -> DecodeFn:
    """Decode with IEEE semantics and no warnings: payload bytes may hold inf or NaN scales,
    which decode to inf or NaN values like the backend's kernels do."""
    @functools.wraps(fn)
    def run(fields: dict[str, np.ndarray], n: int, layout: RecordLayout) -> np.ndarray:
        with np.errstate(over="ignore", invalid="ignore"):
            return fn(fields, n, layout)
    return run


def _dense(fields: dict[str, np.ndarray], n: int, layout: RecordLayout) -> np.ndarray:
    # value = the stored float, widened to float32
    return _f32(fields["values"]).reshape(-1)


register_decoder(STRUCT_NAMES["float32"], {"values": (FLOAT, None)})(_ieee(_dense))
register_decoder(STRUCT_NAMES["float16"], {"values": (FLOAT16, None)})(_ieee(_dense))


def _scaled_rows(fields: dict[str, np.ndarray], n: int, layout: RecordLayout) -> np.ndarray:
    # value[r, d] = float32(scale[r]) * float32(code[r, d])   (int8 codes, or e4m3fn values)
    return (_f32(fields["scale"]).reshape(n, 1) * _f32(fields["codes"]).reshape(n, -1)).reshape(-1)


register_decoder(STRUCT_NAMES["int8"], {"scale": (FLOAT, ()), "codes": (INT8, None)})(_ieee(_scaled_rows))
register_decoder(STRUCT_NAMES["fp8"], {"scale": (FLOAT, ()), "codes": (FP8, None)})(_ieee(_scaled_rows))


@register_decoder(STRUCT_NAMES["int4"], {"scale": (FLOAT16, ()), "codes.code": (UINT8, (32,))})
@_ieee
def _int4(fields: dict[str, np.ndarray], n: int, layout: RecordLayout) -> np.ndarray:
    # value[block, i] = float32(scale_f16[block]) * (code[block, i] - 8)
    codes = fields["codes.code"].astype(np.float32) - np.float32(8)
    return (_f32(fields["scale"]).reshape(n, 1) * codes).reshape(-1)


_INT2_LEAVES = ("keys.scale", "keys.min", "keys.codes.code", "values.scale", "values.min", "values.codes.code")


@register_decoder(STRUCT_NAMES["int2"], {"keys.scale": (FLOAT16, None), "keys.min": (FLOAT16, None),
                                         "keys.codes.code": (UINT8, None), "values.scale": (FLOAT16, None),
                                         "values.min": (FLOAT16, None), "values.codes.code": (UINT8, None)})
@_ieee
def _int2(fields: dict[str, np.ndarray], n: int, layout: RecordLayout) -> np.ndarray:
    # keys[h, t, d] = min[h, d] + scale[h, d] * code[h, d, t]       (one group per channel)
    # values[h, t, b*32 + i] = min[h, t, b] + scale[h, t, b] * code[h, t, b, i]
    H, P, D = int2_geometry(layout)
    ks, km = _f32(fields["keys.scale"]).reshape(n, H, D, 1), _f32(fields["keys.min"]).reshape(n, H, D, 1)
    kc = fields["keys.codes.code"].reshape(n, H, D, P).astype(np.float32)
    keys = (km + ks * kc).transpose(0, 1, 3, 2)
    vs = _f32(fields["values.scale"]).reshape(n, H, P, D // 32, 1)
    vm = _f32(fields["values.min"]).reshape(n, H, P, D // 32, 1)
    vc = fields["values.codes.code"].reshape(n, H, P, D // 32, 32).astype(np.float32)
    values = (vm + vs * vc).reshape(n, H, P, D)
    return np.stack([keys, values], axis=1).reshape(-1)


def int2_geometry(layout: RecordLayout) -> tuple[int, int, int]:
    """``(H, P, D)`` an int2 page declaration encodes (from its leaf shapes)."""
    shapes = {leaf.path: leaf.shape for leaf in layout.leaves}
    try:
        H, D = shapes["keys.scale"]
        H2, D2, P = shapes["keys.codes.code"]
        H3, P3, B, w = shapes["values.codes.code"]
    except (KeyError, ValueError):
        raise CodecError(f"{STRUCT_NAMES['int2']}: the declaration does not have the int2 page "
                         f"structure (leaves {sorted(shapes)})") from None
    if (H2, D2) != (H, D) or (H3, P3) != (H, P) or w != 32 or B * 32 != D or \
            shapes.get("keys.min") != (H, D) or shapes.get("values.scale") != (H, P, B) or \
            shapes.get("values.min") != (H, P, B):
        raise CodecError(f"{STRUCT_NAMES['int2']}: inconsistent key/value group shapes {shapes}")
    return H, P, D


@register_decoder(STRUCT_NAMES["codebook"], {"block.quantized.codes.index": (UINT8, (32,)),
                                             "block.quantized.codebook": (FLOAT, (4,)),
                                             "block.scale": (FLOAT, ())})
@_ieee
def _codebook(fields: dict[str, np.ndarray], n: int, layout: RecordLayout) -> np.ndarray:
    # value[block, i] = scale[block] * codebook[index[block, i]]   (the table is the type's constant)
    table = _f32(fields["block.quantized.codebook"])
    idx = fields["block.quantized.codes.index"].astype(np.intp)
    return (table[idx] * _f32(fields["block.scale"]).reshape(n, 1)).reshape(-1)


# -- decode / encode one page -----------------------------------------------------------------

def _payload_array(payload: Any, what: str) -> np.ndarray:
    if isinstance(payload, np.ndarray):
        if payload.dtype != np.uint8:
            raise PageFormatError(f"{what}: a payload array must be uint8, got {payload.dtype}")
        return payload.reshape(-1)
    try:
        return np.frombuffer(payload, dtype=np.uint8)
    except TypeError:
        raise PageFormatError(f"{what}: a payload is bytes-like or a uint8 array, got "
                              f"{type(payload).__name__}") from None


@functools.lru_cache(maxsize=64)
def _local_catalogue(fmt: str, H: int, P: int, D: int) -> tuple[Catalogue, int]:
    decls = page_declarations(fmt, H, P, D)
    return Catalogue(decls), decls[-1].type_id or 0


def decode_page(fmt: str, payload: Any, H: int, P: int, D: int) -> np.ndarray:
    """The float32 ``[2, H, P, D]`` value of one page (through the registered decoder)."""
    from onnxforge.proto_ext.codecs.decode import decode_encoded  # decode imports the registry, which imports this

    want = page_nbytes(fmt, H, P, D)
    buf = _payload_array(payload, f"{fmt} page")
    if buf.size != want:
        raise PageFormatError(f"a {fmt} page of geometry H={H}, P={P}, D={D} has {want} bytes, "
                              f"the payload has {buf.size}")
    catalogue, root = _local_catalogue(fmt, H, P, D)
    header = EncodedValue(name="page", struct_type=_ref(root), logical_type=page_logical_type(H, P, D),
                          raw_data=buf.data, has_logical_type=True)
    out = decode_encoded(header, catalogue, path=f"{fmt} page")
    return np.asarray(out, dtype=np.float32)


def _rows(x: np.ndarray) -> np.ndarray:
    return x.reshape(-1, x.shape[-1])


def _pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """Pack the last axis of uint8 ``codes`` LSB first: ``[..., n] -> [..., n*bits/8]``."""
    per = 8 // bits
    c = codes.astype(np.uint8).reshape(*codes.shape[:-1], codes.shape[-1] // per, per)
    out = np.zeros(c.shape[:-1], dtype=np.uint8)
    for j in range(per):
        out |= (c[..., j] << np.uint8(j * bits)).astype(np.uint8)
    return out


def _bytes_of(a: np.ndarray) -> np.ndarray:
    """A little-endian array's bytes as uint8 ``[..., itemsize * last]``."""
    a = np.ascontiguousarray(a)
    return a.view(np.uint8).reshape(*a.shape[:-1], -1) if a.ndim else a.reshape(1).view(np.uint8)


def _enc_scaled_rows(x: np.ndarray, qmax: float, fp8: bool) -> bytes:
    # scale = amax / qmax (0 -> codes 0); int8: code = clamp(rint(x / scale), -127, 127);
    # fp8: code = e4m3fn(clip(x / scale, -448, 448)) rounded to nearest even
    rows = _rows(x)
    amax = np.max(np.abs(rows), axis=1)
    scale = (amax / np.float32(qmax)).astype(_F32)
    safe = np.where(scale == 0, np.float32(1), scale)[:, None]
    q = rows / safe
    if fp8:
        codes = np.clip(q, -448.0, 448.0).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    else:
        codes = np.clip(np.rint(q), -127, 127).astype(np.int8).view(np.uint8)
    codes = np.where((scale == 0)[:, None], np.uint8(0), codes)
    return np.concatenate([_bytes_of(scale[:, None]), codes], axis=1).tobytes()


def _enc_int4(x: np.ndarray) -> bytes:
    # m = the value of largest |x| (first on ties); d = m / -8; id = 1/d (0 if d == 0);
    # code = clamp(rint(x * id) + 8, 0, 15); scale stored as float16(d)
    blocks = x.reshape(-1, 32)
    m = blocks[np.arange(blocks.shape[0]), np.argmax(np.abs(blocks), axis=1)]
    d = (m / np.float32(-8)).astype(_F32)
    inv = np.where(d == 0, np.float32(0), np.float32(1) / np.where(d == 0, np.float32(1), d)).astype(_F32)
    codes = np.clip(np.rint(blocks * inv[:, None]) + 8, 0, 15).astype(np.uint8)
    return np.concatenate([_bytes_of(d.astype(_F16)[:, None]), _pack(codes, 4)], axis=1).tobytes()


def _int2_groups(g: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    # lo = min(g), hi = max(g); scale = (hi - lo) / 3 (0 if hi == lo); both stored as float16;
    # code = clamp(rint((x - f32(min_f16)) / f32(scale_f16)), 0, 3), 0 when scale_f16 == 0
    lo, hi = g.min(axis=-1), g.max(axis=-1)
    scale = np.where(hi == lo, np.float32(0), (hi - lo) / np.float32(3)).astype(_F32)
    s16, m16 = scale.astype(_F16), lo.astype(_F16)
    s32, m32 = s16.astype(np.float32)[..., None], m16.astype(np.float32)[..., None]
    q = np.rint((g - m32) / np.where(s32 == 0, np.float32(1), s32))
    codes = np.where(s32 == 0, 0, np.clip(q, 0, 3)).astype(np.uint8)
    return s16, m16, codes


def _enc_int2(x: np.ndarray) -> bytes:
    _, H, P, D = x.shape
    ks, km, kc = _int2_groups(x[0].transpose(0, 2, 1))          # groups [H, D] over the P tokens
    vs, vm, vc = _int2_groups(x[1].reshape(H, P, D // 32, 32))  # groups [H, P, D/32] of 32 values
    k = np.concatenate([_bytes_of(ks[..., None]), _bytes_of(km[..., None]), _pack(kc, 2)], axis=-1)
    v = np.concatenate([_bytes_of(vs[..., None]), _bytes_of(vm[..., None]), _pack(vc, 2)], axis=-1)
    return k.tobytes() + v.tobytes()


def _enc_codebook(x: np.ndarray) -> bytes:
    # scale = amax over the block (0 -> codes 0); code = argmin_k |x / scale - table[k]| (lowest k)
    blocks = x.reshape(-1, 32)
    scale = np.max(np.abs(blocks), axis=1).astype(_F32)
    q = blocks / np.where(scale == 0, np.float32(1), scale)[:, None]
    codes = np.argmin(np.abs(q[..., None] - CODEBOOK_TABLE), axis=-1).astype(np.uint8)
    codes = np.where((scale == 0)[:, None], np.uint8(0), codes)
    return np.concatenate([_pack(codes, 2), _bytes_of(scale[:, None])], axis=1).tobytes()


def encode_page(fmt: str, x: Any) -> bytes:
    """The payload of format ``fmt`` for the float page ``x`` ``[2, H, P, D]`` (the math of
    PAGED_FORMATS.md; tokens not yet written are zeros in ``x``)."""
    check_format(fmt)
    arr = np.asarray(x)
    if arr.ndim != 4 or arr.shape[0] != 2 or arr.dtype.kind != "f":
        raise PageFormatError(f"a page is a float array [2, H, P, D], got {arr.dtype} {list(arr.shape)}")
    _, H, P, D = arr.shape
    check_geometry(H, P, D)
    x32 = np.ascontiguousarray(arr, dtype=np.float32)
    if fmt == "float32":
        out = x32.astype(_F32).tobytes()
    elif fmt == "float16":
        out = x32.astype(_F16).tobytes()
    elif fmt in ("int8", "fp8"):
        out = _enc_scaled_rows(x32, 448.0 if fmt == "fp8" else 127.0, fmt == "fp8")
    elif fmt == "int4":
        out = _enc_int4(x32)
    elif fmt == "int2":
        out = _enc_int2(x32)
    else:
        out = _enc_codebook(x32)
    if len(out) != page_nbytes(fmt, H, P, D):  # a defect of this module, never of the input
        raise PageFormatError(f"{fmt} encoder produced {len(out)} bytes, the format has "
                              f"{page_nbytes(fmt, H, P, D)}")
    return out


def page_encoded_value(fmt: str, payload: Any, H: int, P: int, D: int, type_ref: int,
                       name: str = "") -> Any:
    """An ``EncodedValueProto`` holding one page: ``struct_type {type_ref}``, logical type
    ``FLOAT[2, H, P, D]`` and the payload as ``raw_data`` (its length checked)."""
    want = page_nbytes(fmt, H, P, D)
    buf = _payload_array(payload, f"{fmt} page")
    if buf.size != want:
        raise PageFormatError(f"a {fmt} page of geometry H={H}, P={P}, D={D} has {want} bytes, "
                              f"the payload has {buf.size}")
    header = EncodedValue(name=name, struct_type=_ref(type_ref), logical_type=page_logical_type(H, P, D),
                          raw_data=buf.tobytes(), has_logical_type=True)
    return encoded_to_proto(header)


def declared_elements(fmt: str, layout: RecordLayout) -> tuple[int, dict[str, int]]:
    """Logical elements one record of ``fmt`` decodes to, and the geometry the declaration
    fixes (``{"D": ...}`` for row formats, ``{"H", "P", "D"}`` for int2, nothing for the
    32-value block formats). Raises :class:`CodecError` for a malformed int2 declaration."""
    check_format(fmt)
    if fmt == "int2":
        H, P, D = int2_geometry(layout)
        return 2 * H * P * D, {"H": H, "P": P, "D": D}
    if fmt in ("int4", "codebook"):
        return 32, {}
    path = "values" if fmt in ("float32", "float16") else "codes"
    D = math.prod(layout.leaf(path).shape)
    return D, {"D": D}
