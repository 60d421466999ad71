"""Protobuf-free records for ONNX value types, struct types and encoded-value headers.

These records are the vocabulary shared by every layer: the verifier states its
rules over them, the IR stores them as value types, ShapesContext refines them.
``proto_ext.convert`` turns extended protobuf messages into records and back,
losslessly for every field the specifications define.

A dimension (:data:`Dim`) is an ``int`` (``dim_value``), a ``str``
(``dim_param``) or ``None`` (unknown). A shape of ``None`` means unknown rank.
Shape inference in the IR layer also stores its symbolic expressions as
dimensions, which this layer cannot name: hence ``Dim`` is typed ``Any``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Union

from onnx import TensorProto

__all__ = [
    "Dim",
    "TensorType",
    "SparseTensorType",
    "SequenceType",
    "OptionalType",
    "MapType",
    "OpaqueType",
    "StructType",
    "StructField",
    "ArrayKind",
    "BitPackingKind",
    "Component",
    "Constant",
    "FunctionBlob",
    "Type",
    "AffineLayout",
    "EncodedValue",
    "BITS",
    "ELEM_TYPES",
    "FLOAT_TYPES",
    "bits_of",
    "type_name",
]

Dim = Any  # int | str | None on the wire; graphbuilder's SymExpr after shape inference

# bits(T) of RULES.md "Terms"; STRING and UNDEFINED have none.
BITS: dict[int, int] = {
    TensorProto.INT2: 2, TensorProto.UINT2: 2,
    TensorProto.INT4: 4, TensorProto.UINT4: 4, TensorProto.FLOAT4E2M1: 4,
    TensorProto.BOOL: 8, TensorProto.INT8: 8, TensorProto.UINT8: 8,
    TensorProto.FLOAT8E4M3FN: 8, TensorProto.FLOAT8E4M3FNUZ: 8, TensorProto.FLOAT8E5M2: 8,
    TensorProto.FLOAT8E5M2FNUZ: 8, TensorProto.FLOAT8E8M0: 8,
    TensorProto.INT16: 16, TensorProto.UINT16: 16, TensorProto.FLOAT16: 16,
    TensorProto.BFLOAT16: 16,
    TensorProto.INT32: 32, TensorProto.UINT32: 32, TensorProto.FLOAT: 32,
    TensorProto.INT64: 64, TensorProto.UINT64: 64, TensorProto.DOUBLE: 64,
    TensorProto.COMPLEX64: 64,
    TensorProto.COMPLEX128: 128,
}

FLOAT_TYPES = frozenset(
    {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE})

# Every defined element type (UNDEFINED and codes outside the enum excluded).
ELEM_TYPES = frozenset(TensorProto.DataType.values()) - {TensorProto.UNDEFINED}


def bits_of(elem_type: int) -> int | None:
    """Width in bits of one element of ``elem_type``; None for STRING / UNDEFINED / unknown."""
    return BITS.get(elem_type)


def type_name(elem_type: int) -> str:
    """``TensorProto.DataType`` name of a code, or ``"<code N>"`` for an unknown code."""
    try:
        return TensorProto.DataType.Name(elem_type)
    except ValueError:
        return f"<code {elem_type}>"


@dataclass(frozen=True, slots=True)
class TensorType:
    """``tensor(elem_type, shape)``; ``dim_denotations`` keeps per-dim denotations if any."""

    elem_type: int
    shape: tuple[Dim, ...] | None = None
    denotation: str = ""
    dim_denotations: tuple[str, ...] | None = None

    def __init__(self, elem_type: int, shape: tuple[Dim, ...] | None = None, denotation: str = "",
                 dim_denotations: tuple[str, ...] | None = None):
        # the generated one, written out through the slots (below the class): this module
        # is compiled, and shape inference makes a type at every step
        _TENSOR_SLOTS[0](self, elem_type)
        _TENSOR_SLOTS[1](self, shape)
        _TENSOR_SLOTS[2](self, denotation)
        _TENSOR_SLOTS[3](self, dim_denotations)

    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)

    def __str__(self) -> str:
        dims = "?" if self.shape is None else ", ".join("?" if d is None else str(d) for d in self.shape)
        return f"{type_name(self.elem_type)}[{dims}]"



_TENSOR_SLOTS = tuple(TensorType.__dict__[f].__set__ for f in ("elem_type", "shape", "denotation", "dim_denotations"))
"""Setters of :class:`TensorType`'s slots (a frozen record is written only when made)."""

@dataclass(frozen=True, slots=True)
class SparseTensorType:
    elem_type: int
    shape: tuple[Dim, ...] | None = None
    denotation: str = ""
    dim_denotations: tuple[str, ...] | None = None

    def __str__(self) -> str:
        return f"sparse_{TensorType(self.elem_type, self.shape)}"


@dataclass(frozen=True, slots=True)
class SequenceType:
    elem: "Type"
    denotation: str = ""

    def __str__(self) -> str:
        return f"seq({self.elem})"


@dataclass(frozen=True, slots=True)
class OptionalType:
    elem: "Type"
    denotation: str = ""

    def __str__(self) -> str:
        return f"optional({self.elem})"


@dataclass(frozen=True, slots=True)
class MapType:
    key_type: int
    value: "Type"
    denotation: str = ""

    def __str__(self) -> str:
        return f"map({type_name(self.key_type)}, {self.value})"


@dataclass(frozen=True, slots=True)
class OpaqueType:
    domain: str = ""
    name: str = ""
    denotation: str = ""


@dataclass(frozen=True, slots=True)
class Constant:
    """A TensorProto constant kept as its serialized bytes (lossless) plus a header.

    ``stored`` is the number of elements actually stored in the proto (used by
    rule T6); ``array(path)`` decodes it with stock onnx (a malformed constant
    raises :class:`~onnxforge.errors.CodecError` naming ``path``).
    """

    data_type: int
    dims: tuple[int, ...]
    proto: bytes
    stored: int
    name: str = ""

    def array(self, path: str = "constant") -> Any:  # np.ndarray
        from onnxforge.proto_ext.convert import tensor_proto_to_numpy

        return tensor_proto_to_numpy(self.proto, path=path)


@dataclass(frozen=True, slots=True)
class FunctionBlob:
    """A FunctionProto (decoder/encoder) kept serialized, with its signature for checks."""

    proto: bytes
    name: str
    domain: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Component:
    name: str
    bit_width: int


@dataclass(frozen=True, slots=True)
class ArrayKind:
    element_type: "Type"
    dimension: int


@dataclass(frozen=True, slots=True)
class BitPackingKind:
    components: tuple[Component, ...]
    dimension: int


@dataclass(frozen=True, slots=True)
class StructField:
    """A structure field: exactly one of ``type`` and ``constant`` should be set (rule T2)."""

    name: str
    type: "Type" = None
    constant: Constant | None = None
    doc_string: str = ""
    has_type: bool = False  # True when a type message was present (even if empty)


@dataclass(frozen=True, slots=True)
class StructType:
    """A StructTypeProto: a declaration (``kind`` structure/array/bit_packing), a
    reference (``kind == "type_ref"``) or a category (``kind is None``)."""

    kind: str | None = None
    fields: tuple[StructField, ...] = ()
    array: ArrayKind | None = None
    bit_packing: BitPackingKind | None = None
    type_ref: int | None = None
    decoder: FunctionBlob | None = None
    encoder: FunctionBlob | None = None
    name: str = ""
    doc_string: str = ""
    metadata: tuple[tuple[str, str], ...] = ()
    type_id: int | None = None
    denotation: str = ""  # TypeProto.denotation when used as a value type

    @property
    def is_reference(self) -> bool:
        return self.kind == "type_ref"

    @property
    def is_category(self) -> bool:
        return self.kind is None

    @property
    def is_declaration(self) -> bool:
        return self.kind in ("structure", "array", "bit_packing")

    def __str__(self) -> str:
        if self.kind == "type_ref":
            return f"struct(type_ref={self.type_ref})"
        if self.kind is None:
            return "struct(*)"
        label = self.name or (f"type_id={self.type_id}" if self.type_id else "inline")
        return f"struct({self.kind} {label})"


Type = Union[TensorType, SparseTensorType, SequenceType, OptionalType, MapType, OpaqueType,
             StructType, None]


@dataclass(frozen=True, slots=True)
class AffineLayout:
    storage_type: int
    scale: Constant | None = None
    zero_point: Constant | None = None
    axis: int | None = None
    block_size: int | None = None


@dataclass(slots=True)
class EncodedValue:
    """Header of an EncodedValueProto plus a handle on its payload bytes.

    ``raw_data`` is inline payload (bytes or a read-only memoryview into a mapped
    file); ``external_data`` the raw key/value entries; ``data_location`` 0/1 or
    None when unset. Exactly one of ``affine`` and ``struct_type`` should be set
    (rule P1): the wire's ``layout`` oneof keeps at most one, so both set only
    happens to records built in memory. ``has_logical_type`` is True when a
    ``logical_type`` message was present, even an empty one. ``extra`` holds what
    a loader attaches for a lossless save (``"verbatim"``: the header's wire bytes
    when the record cannot reproduce them).
    """

    name: str
    affine: AffineLayout | None = None
    struct_type: StructType | None = None
    logical_type: Type = None
    raw_data: bytes | memoryview = b""
    external_data: tuple[tuple[str, str], ...] = ()
    data_location: int | None = None
    doc_string: str = ""
    has_logical_type: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def is_external(self) -> bool:
        return self.data_location == TensorProto.EXTERNAL or bool(self.external_data)

    def inline_nbytes(self) -> int:
        return len(self.raw_data)
