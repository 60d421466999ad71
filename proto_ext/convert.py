"""Conversion between extended protobuf messages and the records of ``proto_ext.types``.

``*_from_proto`` never raises for malformed content: it records what is on the
wire (also impossible combinations) so that the verifier can report them with a
rule ID. ``*_to_proto`` writes a record back into a message; a round trip
``to_proto(from_proto(m)) == m`` holds for every field the specifications define.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from onnx import TensorProto

from onnxforge.proto_ext.errors import CodecError
from onnxforge.proto_ext import schema
from onnxforge.proto_ext.types import (
    BITS,
    AffineLayout,
    ArrayKind,
    BitPackingKind,
    Component,
    Constant,
    Dim,
    EncodedValue,
    FunctionBlob,
    MapType,
    OpaqueType,
    OptionalType,
    SequenceType,
    SparseTensorType,
    StructField,
    StructType,
    TensorType,
    Type,
    type_name,
)

__all__ = [
    "text",
    "type_from_proto",
    "type_to_proto",
    "struct_from_proto",
    "struct_to_proto",
    "constant_from_proto",
    "dense_to_numpy",
    "function_blob_from_proto",
    "encoded_from_proto",
    "encoded_to_proto",
    "shape_from_proto",
]

Message = Any

_COMPLEX_PAIRS = {TensorProto.COMPLEX64, TensorProto.COMPLEX128}


def text(s: str | bytes) -> str:
    """A string field as text. Protobuf returns a proto2 string that is not valid UTF-8
    as ``bytes``; its bad bytes become backslash escapes (``'\\x80abc'``), so that
    names are always ``str`` (and such a name matches no well-formed one)."""
    return s if isinstance(s, str) else bytes(s).decode("utf-8", "backslashreplace")


def shape_from_proto(shape: Message) -> tuple[tuple[Dim, ...], tuple[str, ...] | None]:
    dims: list[Dim] = []
    dens: list[str] = []
    for d in shape.dim:
        case = d.WhichOneof("value")
        if case == "dim_value":  # a negative dim_value (exporters write -1) is an unknown dimension
            dims.append(d.dim_value if d.dim_value >= 0 else None)
        else:
            dims.append(d.dim_param if case == "dim_param" else None)
        dens.append(d.denotation)
    return tuple(dims), (tuple(dens) if any(dens) else None)


def _shape_to_proto(shape: tuple[Dim, ...], dens: tuple[str, ...] | None, out: Message) -> None:
    for i, d in enumerate(shape):
        pd = out.dim.add()
        if isinstance(d, bool):
            raise TypeError(f"dimension {i} is a bool")
        if isinstance(d, int):
            pd.dim_value = d
        elif isinstance(d, str):
            pd.dim_param = d
        if dens and dens[i]:
            pd.denotation = dens[i]


def type_from_proto(tp: Message) -> Type:
    """Record for a ``TypeProto``; ``None`` when no case is set."""
    case = tp.WhichOneof("value")
    den = tp.denotation
    if case == "tensor_type" or case == "sparse_tensor_type":
        t = getattr(tp, case)
        shape, dens = shape_from_proto(t.shape) if t.HasField("shape") else (None, None)
        cls = TensorType if case == "tensor_type" else SparseTensorType
        return cls(t.elem_type, shape, den, dens)
    if case == "sequence_type":
        elem = type_from_proto(tp.sequence_type.elem_type) if tp.sequence_type.HasField("elem_type") else None
        return SequenceType(elem, den)
    if case == "optional_type":
        elem = type_from_proto(tp.optional_type.elem_type) if tp.optional_type.HasField("elem_type") else None
        return OptionalType(elem, den)
    if case == "map_type":
        value = type_from_proto(tp.map_type.value_type) if tp.map_type.HasField("value_type") else None
        return MapType(tp.map_type.key_type, value, den)
    if case == "opaque_type":
        return OpaqueType(tp.opaque_type.domain, tp.opaque_type.name, den)
    if case == "struct_type":
        st = struct_from_proto(tp.struct_type)
        return replace(st, denotation=den) if den else st
    return None


def type_to_proto(t: Type, out: Message) -> Message:
    """Write record ``t`` into the (empty) ``TypeProto`` message ``out`` and return it."""
    if t is None:
        return out
    if t.denotation:
        out.denotation = t.denotation
    if isinstance(t, (TensorType, SparseTensorType)):
        msg = out.tensor_type if isinstance(t, TensorType) else out.sparse_tensor_type
        msg.elem_type = t.elem_type
        if t.shape is not None:
            msg.shape.SetInParent()
            _shape_to_proto(t.shape, t.dim_denotations, msg.shape)
    elif isinstance(t, SequenceType):
        out.sequence_type.SetInParent()
        if t.elem is not None:
            type_to_proto(t.elem, out.sequence_type.elem_type)
    elif isinstance(t, OptionalType):
        out.optional_type.SetInParent()
        if t.elem is not None:
            type_to_proto(t.elem, out.optional_type.elem_type)
    elif isinstance(t, MapType):
        out.map_type.key_type = t.key_type
        if t.value is not None:
            type_to_proto(t.value, out.map_type.value_type)
    elif isinstance(t, OpaqueType):
        out.opaque_type.SetInParent()
        if t.domain:
            out.opaque_type.domain = t.domain
        if t.name:
            out.opaque_type.name = t.name
    elif isinstance(t, StructType):
        struct_to_proto(t, out.struct_type)
    else:
        raise TypeError(f"not a type record: {t!r}")
    return out


def _packed_elements(nbytes: int, n: int, bits: int) -> int:
    """Elements held by ``nbytes`` packed bytes of ``bits``-bit elements: ``n`` when the
    size is exactly the packed size of ``n`` elements (padding bits included)."""
    return n if nbytes == (n * bits + 7) // 8 else nbytes * 8 // bits


def _stored_elements(t: Message) -> int:
    """Number of elements a TensorProto stores (for rule T6)."""
    dt = t.data_type
    n = math.prod(t.dims)
    bits = BITS.get(dt)
    if t.data_location == TensorProto.EXTERNAL:
        for e in t.external_data:
            if e.key == "length" and e.value.isdigit() and bits:
                return _packed_elements(int(e.value), n, bits)
        return n  # length unknown here; checked when the payload is mapped
    if t.raw_data:
        return _packed_elements(len(t.raw_data), n, bits) if bits else -1
    if dt == TensorProto.STRING:
        return len(t.string_data)
    per = 2 if dt in _COMPLEX_PAIRS else 1
    for name in ("float_data", "int32_data", "int64_data", "double_data", "uint64_data"):
        count = len(getattr(t, name))
        if count:
            if bits and bits < 8 and name == "int32_data":
                return _packed_elements(count, n, bits)
            return count // per
    return 0


def constant_from_proto(t: Message) -> Constant:
    return Constant(t.data_type, tuple(t.dims), t.SerializeToString(), _stored_elements(t), t.name)


def _constant_to_proto(c: Constant, out: Message) -> None:
    out.ParseFromString(c.proto)


def function_blob_from_proto(f: Message) -> FunctionBlob:
    return FunctionBlob(f.SerializeToString(), text(f.name), text(f.domain), tuple(map(text, f.input)),
                        tuple(map(text, f.output)))


def struct_from_proto(st: Message) -> StructType:
    kind = st.WhichOneof("kind")
    fields: tuple[StructField, ...] = ()
    array = bit_packing = None
    type_ref = None
    if kind == "structure":
        fields = tuple(
            StructField(
                text(f.name),
                type_from_proto(f.type) if f.HasField("type") else None,
                constant_from_proto(f.constant) if f.HasField("constant") else None,
                f.doc_string,
                f.HasField("type"),
            )
            for f in st.structure.field
        )
    elif kind == "array":
        a = st.array
        array = ArrayKind(type_from_proto(a.element_type) if a.HasField("element_type") else None,
                          a.dimension)
    elif kind == "bit_packing":
        b = st.bit_packing
        bit_packing = BitPackingKind(tuple(Component(text(c.name), c.bit_width) for c in b.component),
                                     b.dimension)
    elif kind == "type_ref":
        type_ref = st.type_ref
    return StructType(
        kind=kind,
        fields=fields,
        array=array,
        bit_packing=bit_packing,
        type_ref=type_ref,
        decoder=function_blob_from_proto(st.decoder) if st.HasField("decoder") else None,
        encoder=function_blob_from_proto(st.encoder) if st.HasField("encoder") else None,
        name=text(st.name),
        doc_string=st.doc_string,
        metadata=tuple((p.key, p.value) for p in st.metadata_props),
        type_id=st.type_id if st.HasField("type_id") else None,
    )


def struct_to_proto(s: StructType, out: Message) -> Message:
    out.SetInParent()
    if s.kind == "structure":
        out.structure.SetInParent()
        for f in s.fields:
            pf = out.structure.field.add(name=f.name)
            if f.doc_string:
                pf.doc_string = f.doc_string
            if f.constant is not None:
                _constant_to_proto(f.constant, pf.constant)
            elif f.type is not None or f.has_type:
                pf.type.SetInParent()
                type_to_proto(f.type, pf.type)
    elif s.kind == "array":
        out.array.SetInParent()
        if s.array is not None:
            if s.array.element_type is not None:
                type_to_proto(s.array.element_type, out.array.element_type)
            if s.array.dimension:
                out.array.dimension = s.array.dimension
    elif s.kind == "bit_packing":
        out.bit_packing.SetInParent()
        if s.bit_packing is not None:
            for c in s.bit_packing.components:
                out.bit_packing.component.add(name=c.name, bit_width=c.bit_width)
            if s.bit_packing.dimension:
                out.bit_packing.dimension = s.bit_packing.dimension
    elif s.kind == "type_ref":
        out.type_ref = s.type_ref or 0
    if s.decoder is not None:
        out.decoder.ParseFromString(s.decoder.proto)
    if s.encoder is not None:
        out.encoder.ParseFromString(s.encoder.proto)
    if s.name:
        out.name = s.name
    if s.doc_string:
        out.doc_string = s.doc_string
    for k, v in s.metadata:
        out.metadata_props.add(key=k, value=v)
    if s.type_id is not None:
        out.type_id = s.type_id
    return out


def encoded_from_proto(ev: Message, raw_data: bytes | memoryview | None = None) -> EncodedValue:
    """Record for an ``EncodedValueProto``; ``raw_data`` overrides the message's inline
    bytes (used by loaders that map payloads instead of copying them)."""
    layout = ev.WhichOneof("layout")
    affine = None
    if layout == "affine":
        a = ev.affine
        affine = AffineLayout(
            a.storage_type,
            constant_from_proto(a.scale) if a.HasField("scale") else None,
            constant_from_proto(a.zero_point) if a.HasField("zero_point") else None,
            a.axis if a.HasField("axis") else None,
            a.block_size if a.HasField("block_size") else None,
        )
    return EncodedValue(
        name=text(ev.name),
        affine=affine,
        struct_type=struct_from_proto(ev.struct_type) if layout == "struct_type" else None,
        logical_type=type_from_proto(ev.logical_type) if ev.HasField("logical_type") else None,
        raw_data=ev.raw_data if raw_data is None else raw_data,
        external_data=tuple((e.key, e.value) for e in ev.external_data),
        data_location=ev.data_location if ev.HasField("data_location") else None,
        doc_string=ev.doc_string,
        has_logical_type=ev.HasField("logical_type"),
    )


def encoded_to_proto(e: EncodedValue, out: Message | None = None, *,
                     with_payload: bool = True) -> Message:
    out = schema.EncodedValueProto() if out is None else out
    if e.affine is not None:
        a = e.affine
        out.affine.storage_type = a.storage_type
        if a.scale is not None:
            _constant_to_proto(a.scale, out.affine.scale)
        if a.zero_point is not None:
            _constant_to_proto(a.zero_point, out.affine.zero_point)
        if a.axis is not None:
            out.affine.axis = a.axis
        if a.block_size is not None:
            out.affine.block_size = a.block_size
    elif e.struct_type is not None:
        struct_to_proto(e.struct_type, out.struct_type)
    if e.logical_type is not None or e.has_logical_type:
        out.logical_type.SetInParent()
        type_to_proto(e.logical_type, out.logical_type)
    if with_payload and len(e.raw_data):
        out.raw_data = bytes(e.raw_data)
    for k, v in e.external_data:
        out.external_data.add(key=k, value=v)
    if e.data_location is not None:
        out.data_location = e.data_location
    if e.name:
        out.name = e.name
    if e.doc_string:
        out.doc_string = e.doc_string
    return out


def constant_from_numpy(array: Any, name: str = "") -> Constant:
    """A :class:`Constant` record holding ``array`` (packed like TensorProto.raw_data)."""
    import numpy as np
    from onnx import numpy_helper

    arr = np.asarray(array)
    t = numpy_helper.from_array(arr, name)
    return Constant(t.data_type, tuple(t.dims), t.SerializeToString(), int(arr.size), name)


def tensor_proto_to_numpy(data: bytes, *, path: str = "tensor") -> Any:
    """Decode serialized TensorProto bytes, payload inline, to numpy with stock onnx.

    A malformed tensor (dims that do not match the stored elements, an unknown
    data_type...) or an external payload raises :class:`CodecError` naming ``path``;
    external payloads go through :func:`dense_to_numpy`, which maps them safely."""
    import onnx
    from google.protobuf.message import DecodeError
    from onnx import numpy_helper

    from onnxforge.proto_ext.typed_data import decode_typed

    fast = decode_typed(data)  # the common typed layouts, read straight from the bytes
    if fast is not None:
        return fast
    t = onnx.TensorProto()
    try:
        t.ParseFromString(data)
    except DecodeError:
        raise CodecError(f"{path}: malformed TensorProto bytes") from None
    if t.data_location == TensorProto.EXTERNAL:
        raise CodecError(f"{path}: the payload is external data; it is read only through the "
                         "model's folder")
    try:
        return numpy_helper.to_array(t)
    except (ValueError, TypeError, KeyError, IndexError) as exc:
        raise CodecError(f"{path}: cannot decode the {type_name(t.data_type)} tensor of dims "
                         f"{list(t.dims)}: {exc}") from None


def dense_to_numpy(t: Message, model_dir: str | None, path: str) -> Any:
    """The value of a dense ``TensorProto`` message as numpy.

    An external payload is memory-mapped from ``model_dir`` after the checks of
    rules P4 and P5 (:mod:`onnxforge.proto_ext.external`), which raise
    :class:`ExternalDataError`; without a folder it raises :class:`CodecError`."""
    if t.data_location != TensorProto.EXTERNAL:
        return tensor_proto_to_numpy(t.SerializeToString(), path=path)
    from onnxforge.proto_ext.external import map_external, parse_external_entries

    where = f"{path}.external_data"
    if model_dir is None:
        raise CodecError(f"{path}: external payload but the model's folder is unknown")
    ref = parse_external_entries([(e.key, e.value) for e in t.external_data], path=where)
    inline = type(t)()
    inline.CopyFrom(t)
    inline.ClearField("external_data")
    inline.ClearField("data_location")
    inline.raw_data = bytes(map_external(model_dir, ref, path=where))
    return tensor_proto_to_numpy(inline.SerializeToString(), path=path)


def encoded_layout_key(e: EncodedValue) -> bytes:
    """Canonical bytes of an encoded value's layout and logical type (no payload, no name)."""
    header = EncodedValue(name="", affine=e.affine, struct_type=e.struct_type,
                          logical_type=e.logical_type, has_logical_type=e.has_logical_type)
    return encoded_to_proto(header, with_payload=False).SerializeToString(deterministic=True)
