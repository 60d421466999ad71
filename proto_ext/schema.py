"""Extended ONNX message classes, built once at import time.

onnx's ``.proto`` messages declare no extension ranges, so the extensions of
DESIGN.md's wire table cannot be added with ``extend``. Instead this module
takes the installed onnx file descriptor, renames its package to
``onnxforge_ext`` (so it does not clash with stock ``onnx`` in the default
pool), adds the new messages and fields, and builds the classes from a private
descriptor pool. The wire format is byte-compatible with stock onnx: stock
readers see the extension fields as unknown fields and keep them.

Fixed field numbers (DESIGN.md, values specification):

========================  =========================================  ======
message                   field                                      number
========================  =========================================  ======
TypeProto                 oneof value: StructTypeProto struct_type   1000
GraphProto                repeated EncodedValueProto                 1000
                          encoded_initializer
GraphProto                repeated PersistentBindingProto            1001
                          persistent_bindings
ModelProto                repeated StructTypeProto struct_types      1000
NodeProto                 repeated ValueAliasProto output_alias      1000
ValueInfoProto            Access access                              1000
ValueInfoProto            string alias_of                            1001
========================  =========================================  ======

Use the classes as ``schema.ModelProto`` etc.; convert a stock message with
:func:`from_onnx` and back with :func:`to_onnx` (both go through the wire bytes).
:func:`read_model` turns a path, bytes or a message into an extended ``ModelProto``
with typed errors for files that cannot be read.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import onnx
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError, Message

from onnxforge.proto_ext.errors import ModelFileError, WireError

__all__ = [
    "PACKAGE",
    "TYPE_STRUCT_TYPE",
    "GRAPH_ENCODED_INITIALIZER",
    "GRAPH_PERSISTENT_BINDINGS",
    "MODEL_STRUCT_TYPES",
    "NODE_OUTPUT_ALIAS",
    "VALUE_INFO_ACCESS",
    "VALUE_INFO_ALIAS_OF",
    "READ_ONLY",
    "READ_WRITE",
    "MUST_ALIAS",
    "from_onnx",
    "to_onnx",
    "model_file_error",
    "model_message_bytes",
    "parse_model",
    "read_model",
]

PACKAGE = "onnxforge_ext"

# Field numbers (the only part of this module that is a wire contract).
TYPE_STRUCT_TYPE = 1000
GRAPH_ENCODED_INITIALIZER = 1000
GRAPH_PERSISTENT_BINDINGS = 1001
MODEL_STRUCT_TYPES = 1000
NODE_OUTPUT_ALIAS = 1000
VALUE_INFO_ACCESS = 1000
VALUE_INFO_ALIAS_OF = 1001

_F = descriptor_pb2.FieldDescriptorProto
_OPT, _REP = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED


def _field(
    name: str,
    number: int,
    ftype: int,
    type_name: str = "",
    *,
    repeated: bool = False,
    oneof_index: int | None = None,
) -> descriptor_pb2.FieldDescriptorProto:
    f = _F(name=name, number=number, type=ftype, label=_REP if repeated else _OPT)
    if type_name:
        f.type_name = f".{PACKAGE}.{type_name}"
    if oneof_index is not None:
        f.oneof_index = oneof_index
    return f


def _msg(name: str, fields: list, *, nested: list | None = None, enums: list | None = None,
         oneofs: list[str] | None = None) -> descriptor_pb2.DescriptorProto:
    m = descriptor_pb2.DescriptorProto(name=name)
    m.field.extend(fields)
    m.nested_type.extend(nested or [])
    m.enum_type.extend(enums or [])
    for o in oneofs or []:
        m.oneof_decl.add(name=o)
    return m


def _enum(name: str, values: list[tuple[str, int]]) -> descriptor_pb2.EnumDescriptorProto:
    e = descriptor_pb2.EnumDescriptorProto(name=name)
    for vname, num in values:
        e.value.add(name=vname, number=num)
    return e


def _rename_types(msg: descriptor_pb2.DescriptorProto) -> None:
    for f in msg.field:
        if f.type_name.startswith(".onnx."):
            f.type_name = f".{PACKAGE}." + f.type_name[len(".onnx."):]
    for nested in msg.nested_type:
        _rename_types(nested)


def _new_messages() -> list[descriptor_pb2.DescriptorProto]:
    T = _F
    value_alias = _msg(
        "ValueAliasProto",
        [
            _field("output_index", 1, T.TYPE_INT32),
            _field("input_index", 2, T.TYPE_INT32),
            _field("kind", 3, T.TYPE_ENUM, "ValueAliasProto.Kind"),
        ],
        enums=[_enum("Kind", [("UNDEFINED", 0), ("MUST_ALIAS", 1)])],
    )
    affine = _msg(
        "AffineLayoutProto",
        [
            _field("storage_type", 1, T.TYPE_ENUM, "TensorProto.DataType"),
            _field("scale", 2, T.TYPE_MESSAGE, "TensorProto"),
            _field("zero_point", 3, T.TYPE_MESSAGE, "TensorProto"),
            _field("axis", 4, T.TYPE_INT64),
            _field("block_size", 5, T.TYPE_UINT64),
        ],
    )
    encoded = _msg(
        "EncodedValueProto",
        [
            _field("affine", 1, T.TYPE_MESSAGE, "AffineLayoutProto", oneof_index=0),
            _field("struct_type", 2, T.TYPE_MESSAGE, "StructTypeProto", oneof_index=0),
            _field("logical_type", 3, T.TYPE_MESSAGE, "TypeProto"),
            _field("raw_data", 4, T.TYPE_BYTES),
            _field("external_data", 5, T.TYPE_MESSAGE, "StringStringEntryProto", repeated=True),
            _field("data_location", 6, T.TYPE_ENUM, "TensorProto.DataLocation"),
            _field("name", 7, T.TYPE_STRING),
            _field("doc_string", 8, T.TYPE_STRING),
        ],
        oneofs=["layout"],
    )
    field_msg = _msg(
        "Field",
        [
            _field("name", 1, T.TYPE_STRING),
            _field("type", 2, T.TYPE_MESSAGE, "TypeProto", oneof_index=0),
            _field("doc_string", 3, T.TYPE_STRING),
            _field("constant", 4, T.TYPE_MESSAGE, "TensorProto", oneof_index=0),
        ],
        oneofs=["content"],
    )
    structure = _msg(
        "Structure",
        [_field("field", 1, T.TYPE_MESSAGE, "StructTypeProto.Structure.Field", repeated=True)],
        nested=[field_msg],
    )
    component = _msg(
        "Component",
        [_field("name", 1, T.TYPE_STRING), _field("bit_width", 2, T.TYPE_UINT32)],
    )
    bit_packing = _msg(
        "BitPacking",
        [
            _field("component", 1, T.TYPE_MESSAGE, "StructTypeProto.BitPacking.Component",
                   repeated=True),
            _field("dimension", 2, T.TYPE_UINT64),
        ],
        nested=[component],
    )
    array = _msg(
        "Array",
        [
            _field("element_type", 1, T.TYPE_MESSAGE, "TypeProto"),
            _field("dimension", 2, T.TYPE_UINT64),
        ],
    )
    struct_type = _msg(
        "StructTypeProto",
        [
            _field("array", 1, T.TYPE_MESSAGE, "StructTypeProto.Array", oneof_index=0),
            _field("structure", 2, T.TYPE_MESSAGE, "StructTypeProto.Structure", oneof_index=0),
            _field("bit_packing", 3, T.TYPE_MESSAGE, "StructTypeProto.BitPacking", oneof_index=0),
            _field("type_ref", 4, T.TYPE_UINT64, oneof_index=0),
            _field("decoder", 5, T.TYPE_MESSAGE, "FunctionProto"),
            _field("encoder", 6, T.TYPE_MESSAGE, "FunctionProto"),
            _field("name", 7, T.TYPE_STRING),
            _field("doc_string", 8, T.TYPE_STRING),
            _field("metadata_props", 9, T.TYPE_MESSAGE, "StringStringEntryProto", repeated=True),
            _field("type_id", 10, T.TYPE_UINT64),
        ],
        nested=[structure, bit_packing, array],
        oneofs=["kind"],
    )
    binding = _msg(
        "PersistentBindingProto",
        [_field("input_name", 1, T.TYPE_STRING), _field("output_name", 2, T.TYPE_STRING)],
    )
    return [value_alias, affine, encoded, struct_type, binding]


def _build_file() -> descriptor_pb2.FileDescriptorProto:
    fdp = descriptor_pb2.FileDescriptorProto.FromString(onnx.onnx_ml_pb2.DESCRIPTOR.serialized_pb)
    fdp.name = "onnxforge/onnx_ext.proto"
    fdp.package = PACKAGE
    for m in fdp.message_type:
        _rename_types(m)
    by_name = {m.name: m for m in fdp.message_type}
    T = _F

    type_proto = by_name["TypeProto"]
    value_oneof = [o.name for o in type_proto.oneof_decl].index("value")
    type_proto.field.append(
        _field("struct_type", TYPE_STRUCT_TYPE, T.TYPE_MESSAGE, "StructTypeProto",
               oneof_index=value_oneof))
    by_name["GraphProto"].field.extend([
        _field("encoded_initializer", GRAPH_ENCODED_INITIALIZER, T.TYPE_MESSAGE,
               "EncodedValueProto", repeated=True),
        _field("persistent_bindings", GRAPH_PERSISTENT_BINDINGS, T.TYPE_MESSAGE,
               "PersistentBindingProto", repeated=True),
    ])
    by_name["ModelProto"].field.append(
        _field("struct_types", MODEL_STRUCT_TYPES, T.TYPE_MESSAGE, "StructTypeProto",
               repeated=True))
    by_name["NodeProto"].field.append(
        _field("output_alias", NODE_OUTPUT_ALIAS, T.TYPE_MESSAGE, "ValueAliasProto",
               repeated=True))
    vi = by_name["ValueInfoProto"]
    vi.enum_type.append(_enum("Access", [("READ_ONLY", 0), ("READ_WRITE", 1)]))
    vi.field.extend([
        _field("access", VALUE_INFO_ACCESS, T.TYPE_ENUM, "ValueInfoProto.Access"),
        _field("alias_of", VALUE_INFO_ALIAS_OF, T.TYPE_STRING),
    ])
    fdp.message_type.extend(_new_messages())
    return fdp


_POOL = descriptor_pool.DescriptorPool()
_FILE = _POOL.Add(_build_file())


def _classes() -> dict[str, type[Message]]:
    out: dict[str, type[Message]] = {}
    for name in _FILE.message_types_by_name:
        out[name] = message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"{PACKAGE}.{name}"))
    return out


_CLASSES = _classes()
globals().update(_CLASSES)
__all__ += sorted(_CLASSES)

if TYPE_CHECKING:  # the classes are created dynamically; give type checkers names
    AttributeProto: Any
    EncodedValueProto: Any
    AffineLayoutProto: Any
    FunctionProto: Any
    GraphProto: Any
    ModelProto: Any
    NodeProto: Any
    OperatorSetIdProto: Any
    PersistentBindingProto: Any
    SparseTensorProto: Any
    StringStringEntryProto: Any
    StructTypeProto: Any
    TensorProto: Any
    TensorShapeProto: Any
    TypeProto: Any
    ValueAliasProto: Any
    ValueInfoProto: Any

READ_ONLY = 0
READ_WRITE = 1
MUST_ALIAS = 1


def message_class(name: str) -> type[Message]:
    """The extended class for an onnx message name (``"ModelProto"``, ``"TensorProto"``...)."""
    try:
        return _CLASSES[name]
    except KeyError:
        raise KeyError(f"no extended message named {name!r}") from None


def parse(name: str, data: bytes | bytearray | memoryview) -> Message:
    """Parse wire bytes as the extended message ``name``; malformed bytes raise WireError."""
    cls = message_class(name)
    msg = cls()
    try:
        msg.ParseFromString(bytes(data) if not isinstance(data, bytes) else data)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise WireError(f"cannot parse {name}: {exc or 'malformed protobuf bytes'}") from None
    return msg


def parse_model(data: bytes | bytearray | memoryview) -> Message:
    """Parse extended ``ModelProto`` bytes (raises :class:`WireError` on malformed input)."""
    return parse("ModelProto", data)


def model_file_error(path: str, exc: OSError) -> ModelFileError:
    """The :class:`ModelFileError` for an ``OSError`` raised while opening model file ``path``."""
    if isinstance(exc, FileNotFoundError):
        return ModelFileError(f"no such model file: {path}")
    if isinstance(exc, IsADirectoryError) or os.path.isdir(path):
        return ModelFileError(f"{path} is a directory, not a model file")
    return ModelFileError(f"cannot read model file {path}: {exc.strerror or exc}")


def read_model(source: Any, model_dir: str | os.PathLike[str] | None = None
               ) -> tuple[Message, str | None]:
    """The extended ``ModelProto`` of a model path, serialized bytes, or a stock or extended
    ``ModelProto`` message (an extended one is returned as it is), with the folder that
    external data is relative to: ``model_dir``, else a path's folder, else None.

    Raises :class:`ModelFileError` when a path is missing, a directory or unreadable,
    :class:`WireError` for an empty file or malformed bytes, and ``TypeError`` for any
    other kind of ``source``."""
    folder = None if model_dir is None else os.fspath(model_dir)
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        try:
            with open(path, "rb") as fh:
                data = fh.read()
        except OSError as exc:
            raise model_file_error(path, exc) from None
        if not data:
            raise WireError(f"{path!r} is empty: not an ONNX model")
        return parse_model(data), folder if folder is not None else os.path.dirname(os.path.abspath(path))
    if isinstance(source, (bytes, bytearray, memoryview)):
        return parse_model(source), folder
    full_name = _model_message(source)
    if full_name == f"{PACKAGE}.ModelProto":
        return source, folder
    return from_onnx(source), folder


def _model_message(source: Any) -> str:
    """The full name of ``source``'s class when it is a stock or extended ModelProto;
    ``TypeError`` (a model is a path, bytes or a ModelProto) otherwise."""
    full_name = getattr(getattr(source, "DESCRIPTOR", None), "full_name", None)
    if full_name in (f"{PACKAGE}.ModelProto", "onnx.ModelProto"):
        return full_name
    raise TypeError(f"expected a model path, bytes or a ModelProto, got {type(source).__name__}")


def model_message_bytes(source: Any) -> bytes:
    """The wire bytes of a stock or extended ``ModelProto`` message (what a loader parses);
    ``TypeError``, as :func:`read_model` raises it, for any other object."""
    _model_message(source)
    return source.SerializeToString()


def from_onnx(msg: Message) -> Message:
    """Convert a stock ``onnx`` message (ModelProto, GraphProto...) to its extended class."""
    return parse(msg.DESCRIPTOR.name, msg.SerializeToString())


def to_onnx(msg: Message) -> Message:
    """Convert an extended message back to the stock ``onnx`` class; extensions ride as
    unknown fields, byte-identically."""
    stock = getattr(onnx, msg.DESCRIPTOR.name)()
    stock.ParseFromString(msg.SerializeToString())
    return stock
