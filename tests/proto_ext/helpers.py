"""Small builders for extended test models (``schema.*`` messages).

Every builder returns extended protobuf messages, so the results can be
combined freely and passed to ``onnxforge.proto_ext.verify.check``. Stock
``onnx`` messages are accepted wherever a message is expected and converted
through their wire bytes.

Example::

    m = model_with(
        struct_types=[struct_decl(2001, "Int4Block",
                                  [("codes", array_type(TensorProto.INT4, 32)),
                                   ("scale", tensor_type(TensorProto.FLOAT, []))])],
        encoded=[encoded("w", type_ref=2001, raw_data=bytes(2560),
                         logical=tensor_type(TensorProto.FLOAT, [4096]))],
    )
    assert rules_of(m) == set()
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Union

import numpy as np
from onnx import TensorProto, helper

from onnxforge.proto_ext import schema
from onnxforge.proto_ext.verify import check

__all__ = [
    "Dims",
    "FieldSpec",
    "affine_layout",
    "array_type",
    "bit_packing_type",
    "category_type",
    "constant",
    "decoder_function",
    "encoded",
    "ext",
    "model_with",
    "ref",
    "ref_type",
    "rules_of",
    "spec_catalogue",
    "struct_decl",
    "struct_type",
    "tensor_type",
    "value_info",
]

Dims = Union[Sequence[Union[int, str, None]], None]
FieldSpec = tuple[str, Any]  # (name, TypeProto | TensorProto)


def ext(msg: Any, name: str | None = None) -> Any:
    """The extended-schema copy of ``msg`` (a stock or extended message)."""
    cls_name = name or msg.DESCRIPTOR.name
    if msg.DESCRIPTOR.full_name == f"{schema.PACKAGE}.{cls_name}":
        return msg
    out = schema.message_class(cls_name)()
    out.ParseFromString(msg.SerializeToString())
    return out


def tensor_type(elem: int, dims: Dims = ()) -> Any:
    """``TypeProto.tensor_type``; ``dims=None`` leaves the shape unset (unknown rank).

    A dim is an int (``dim_value``), a str (``dim_param``) or None (unknown)."""
    tp = schema.TypeProto()
    tp.tensor_type.elem_type = elem
    if dims is not None:
        tp.tensor_type.shape.SetInParent()
        for d in dims:
            pd = tp.tensor_type.shape.dim.add()
            if isinstance(d, int):
                pd.dim_value = d
            elif isinstance(d, str):
                pd.dim_param = d
    return tp


def struct_type(st: Any) -> Any:
    """``TypeProto`` whose case is ``struct_type`` = ``st`` (a StructTypeProto)."""
    tp = schema.TypeProto()
    tp.struct_type.CopyFrom(st)
    return tp


def ref(type_id: int) -> Any:
    """A reference ``StructTypeProto{type_ref: type_id}``."""
    st = schema.StructTypeProto()
    st.type_ref = type_id
    return st


def ref_type(type_id: int) -> Any:
    """``TypeProto{struct_type{type_ref: type_id}}``."""
    return struct_type(ref(type_id))


def category_type() -> Any:
    """``TypeProto{struct_type{}}``: the unconstrained category (no kind)."""
    tp = schema.TypeProto()
    tp.struct_type.SetInParent()
    return tp


def array_type(elem: Any, dimension: int) -> Any:
    """``TypeProto{struct_type{array{element_type, dimension}}}``.

    ``elem`` is a TypeProto, or a TensorProto data type code meaning a scalar
    element (``tensor_type{elem_type, shape []}``)."""
    tp = schema.TypeProto()
    arr = tp.struct_type.array
    arr.SetInParent()
    arr.element_type.CopyFrom(tensor_type(elem, []) if isinstance(elem, int) else ext(elem, "TypeProto"))
    arr.dimension = dimension
    return tp


def bit_packing_type(components: Iterable[tuple[str, int]], dimension: int) -> Any:
    """``TypeProto{struct_type{bit_packing{component..., dimension}}}``."""
    tp = schema.TypeProto()
    bp = tp.struct_type.bit_packing
    bp.SetInParent()
    for name, width in components:
        bp.component.add(name=name, bit_width=width)
    bp.dimension = dimension
    return tp


def constant(elem: int, dims: Sequence[int], values: Sequence[Any], *, raw: bool = False) -> Any:
    """An extended ``TensorProto`` constant (``onnx.helper.make_tensor``); ``raw=True``
    stores the values in ``raw_data``."""
    vals: Any = list(values)
    if raw:
        vals = np.asarray(vals, dtype=helper.tensor_dtype_to_np_dtype(elem))
    return ext(helper.make_tensor("", elem, list(dims), vals, raw=raw), "TensorProto")


def decoder_function(inputs: Sequence[str], outputs: Sequence[str] = ("y",), *,
                     name: str = "Decode", domain: str = "test.decoders") -> Any:
    """A decoder ``FunctionProto`` with the given signature and an Identity body."""
    f = schema.FunctionProto(name=name, domain=domain)
    f.input.extend(inputs)
    f.output.extend(outputs)
    if inputs and outputs:
        f.node.add(op_type="Identity", input=[inputs[0]], output=[outputs[0]])
    f.opset_import.add(domain="", version=23)
    return f


def struct_decl(type_id: int | None, name: str = "", fields: Iterable[FieldSpec] = (), *,
                decoder: Any = None, encoder: Any = None) -> Any:
    """A structure declaration; each field is ``(name, TypeProto)`` or ``(name, TensorProto)``
    (a constant). ``type_id=None`` leaves type_id unset (an inline declaration)."""
    st = schema.StructTypeProto()
    st.structure.SetInParent()
    for fname, content in fields:
        f = st.structure.field.add(name=fname)
        if content is None:
            continue
        kind = content.DESCRIPTOR.name
        if kind == "TensorProto":
            f.constant.CopyFrom(ext(content, "TensorProto"))
        elif kind == "TypeProto":
            f.type.CopyFrom(ext(content, "TypeProto"))
        else:
            raise TypeError(f"field {fname!r}: expected a TypeProto or TensorProto, got {kind}")
    if type_id is not None:
        st.type_id = type_id
    if name:
        st.name = name
    if decoder is not None:
        st.decoder.CopyFrom(ext(decoder, "FunctionProto"))
    if encoder is not None:
        st.encoder.CopyFrom(ext(encoder, "FunctionProto"))
    return st


def affine_layout(storage: int, scale: Any, zero_point: Any = None, *, axis: int | None = None,
                  block_size: int | None = None) -> Any:
    """An ``AffineLayoutProto``; ``scale``/``zero_point`` are TensorProtos (or None)."""
    a = schema.AffineLayoutProto(storage_type=storage)
    if scale is not None:
        a.scale.CopyFrom(ext(scale, "TensorProto"))
    if zero_point is not None:
        a.zero_point.CopyFrom(ext(zero_point, "TensorProto"))
    if axis is not None:
        a.axis = axis
    if block_size is not None:
        a.block_size = block_size
    return a


def encoded(name: str, *, type_ref: int | None = None, struct: Any = None, affine: Any = None,
            logical: Any = None, raw_data: bytes = b"",
            external: Iterable[tuple[str, str]] | None = None,
            data_location: int | None = None) -> Any:
    """An ``EncodedValueProto``. Layout: ``type_ref`` (a reference), ``struct`` (a
    StructTypeProto, e.g. an inline declaration) or ``affine`` (AffineLayoutProto).
    ``external`` pairs set ``external_data`` and, unless ``data_location`` is given,
    ``data_location = EXTERNAL``."""
    ev = schema.EncodedValueProto(name=name)
    if type_ref is not None:
        ev.struct_type.CopyFrom(ref(type_ref))
    elif struct is not None:
        ev.struct_type.CopyFrom(ext(struct, "StructTypeProto"))
        ev.struct_type.SetInParent()  # an empty StructTypeProto (a category) stays present
    elif affine is not None:
        ev.affine.CopyFrom(affine)
    if logical is not None:
        ev.logical_type.CopyFrom(ext(logical, "TypeProto"))
    if raw_data:
        ev.raw_data = raw_data
    if external is not None:
        for k, v in external:
            ev.external_data.add(key=k, value=v)
        if data_location is None:
            data_location = TensorProto.EXTERNAL
    if data_location is not None:
        ev.data_location = data_location
    return ev


def value_info(name: str, tp: Any = None, *, access: int = 0, alias_of: str = "") -> Any:
    """``ValueInfoProto(name, type)``; ``tp=None`` leaves the type unset; ``access`` and
    ``alias_of`` set the alias fields when given."""
    vi = schema.ValueInfoProto(name=name)
    if tp is not None:
        vi.type.CopyFrom(ext(tp, "TypeProto"))
    if access:
        vi.access = access
    if alias_of:
        vi.alias_of = alias_of
    return vi


def _value_infos(items: Iterable[Any]) -> list[Any]:
    out = []
    for item in items:
        if isinstance(item, tuple):
            out.append(value_info(*item))
        else:
            out.append(ext(item, "ValueInfoProto"))
    return out


def model_with(*, struct_types: Iterable[Any] = (), encoded: Iterable[Any] = (),
               inputs: Iterable[Any] = (), outputs: Iterable[Any] = (),
               value_infos: Iterable[Any] = (), nodes: Iterable[Any] = (),
               initializers: Iterable[Any] = (), functions: Iterable[Any] = (),
               bindings: Iterable[tuple[str, str]] = (), opset: int = 23,
               graph_name: str = "g") -> Any:
    """An extended ``ModelProto`` holding one graph.

    ``inputs``/``outputs``/``value_infos`` take ValueInfoProtos or ``(name, TypeProto)``
    tuples; ``nodes``, ``initializers`` (TensorProtos) and ``functions`` may be stock
    or extended messages; ``bindings`` are ``(input_name, output_name)`` pairs."""
    m = schema.ModelProto(ir_version=10, producer_name="onnxforge-tests")
    m.opset_import.add(domain="", version=opset)
    g = m.graph
    g.name = graph_name
    g.input.extend(_value_infos(inputs))
    g.output.extend(_value_infos(outputs))
    g.value_info.extend(_value_infos(value_infos))
    g.node.extend(ext(n, "NodeProto") for n in nodes)
    g.initializer.extend(ext(t, "TensorProto") for t in initializers)
    g.encoded_initializer.extend(ext(e, "EncodedValueProto") for e in encoded)
    for i, o in bindings:
        g.persistent_bindings.add(input_name=i, output_name=o)
    m.struct_types.extend(ext(s, "StructTypeProto") for s in struct_types)
    m.functions.extend(ext(f, "FunctionProto") for f in functions)
    return m


def rules_of(model: Any, model_dir: str | None = None) -> set[str]:
    """The set of rule IDs that ``check`` reports for ``model``."""
    return {v.rule for v in check(model, model_dir)}


def spec_catalogue() -> list[Any]:
    """The worked-example declarations of the values specification:
    2001 Int4Block (20 bytes), 1003 (64 bytes), 1002 (76 bytes),
    1101 codebook subtype (8 bytes) and 1102 scaled codebook (12 bytes)."""
    fp, i4, i64 = TensorProto.FLOAT, TensorProto.INT4, TensorProto.INT64
    linear_inputs = ["values", "scale", "zero_point"]
    return [
        struct_decl(2001, "Int4Block", [("codes", array_type(i4, 32)),
                                        ("scale", tensor_type(fp, []))]),
        struct_decl(1003, "LINEAR_INT4_128_FIXED_PARAMETERS",
                    [("values", array_type(i4, 128)),
                     ("scale", constant(fp, [], [0.25])),
                     ("zero_point", constant(i64, [], [-2]))],
                    decoder=decoder_function(linear_inputs, name="DecodeLinearInt4")),
        struct_decl(1002, "LINEAR_INT4_128_WITH_PARAMETERS",
                    [("values", array_type(i4, 128)),
                     ("scale", tensor_type(fp, [])),
                     ("zero_point", tensor_type(i64, []))],
                    decoder=decoder_function(linear_inputs, name="DecodeLinearInt4")),
        struct_decl(1101, "CODEBOOK2_BLOCK_32",
                    [("codes", bit_packing_type([("index", 2)], 32)),
                     ("codebook", constant(fp, [4], [-1.0, -0.25, 0.25, 1.0]))]),
        struct_decl(1102, "SCALED_CODEBOOK2_BLOCK_32",
                    [("quantized", ref_type(1101)),
                     ("scale", tensor_type(fp, []))],
                    decoder=decoder_function(["quantized.codes.index", "quantized.codebook", "scale"],
                                             name="DecodeScaledCodebookBlocks")),
    ]

