"""Type relations used by the binding and alias rules.

``compatible(a, b)`` is the *Compatible* relation of RULES.md "Terms" (DESIGN.md
"Binding compatibility"): a persistent binding's input and output, or an aliased
output and its input, must be compatible. ``contains_string(t, catalogue)``
answers whether a value type holds STRING anywhere (rule B5), following struct
references through the model's catalogue.

Example::

    past = TensorType(TensorProto.FLOAT, (1, 2, "past", 32))
    present = TensorType(TensorProto.FLOAT, (1, 2, "total", 32))
    compatible(past, present)          # None: symbolic dims may differ
    compatible(past, TensorType(TensorProto.FLOAT16, (1, 2, "past", 32)))
    # 'element type FLOAT vs FLOAT16'
"""
from __future__ import annotations

from dataclasses import replace

from onnx import TensorProto

from onnxforge.proto_ext.catalogue import Catalogue
from onnxforge.proto_ext.types import (
    MapType,
    OpaqueType,
    OptionalType,
    SequenceType,
    SparseTensorType,
    StructType,
    TensorType,
    Type,
    type_name,
)

__all__ = ["compatible", "contains_string", "type_case"]

_CASES: dict[type, str] = {
    TensorType: "tensor",
    SparseTensorType: "sparse_tensor",
    SequenceType: "sequence",
    OptionalType: "optional",
    MapType: "map",
    OpaqueType: "opaque",
    StructType: "struct_type",
}


def type_case(t: Type) -> str:
    """The TypeProto case a type record stands for (``"tensor"``, ``"struct_type"``...);
    ``"none"`` for a missing type."""
    return "none" if t is None else _CASES.get(type(t), type(t).__name__)


def compatible(a: Type, b: Type) -> str | None:
    """None when ``a`` and ``b`` are Compatible, else a short reason.

    Same TypeProto case; tensors (and sparse tensors): same elem_type, same rank
    when both ranks are known, dims equal where both are concrete (symbolic or
    unknown dims may differ); sequence, optional and map members alike (map keys
    equal); opaque types equal; struct types: the same type_ref, both categories,
    or equal inline declarations. Two missing types are compatible, one is not.
    """
    if a is None or b is None:
        return None if a is b else f"{type_case(a)} vs {type_case(b)}"
    if type(a) is not type(b):
        return f"{type_case(a)} vs {type_case(b)}"
    if isinstance(a, (TensorType, SparseTensorType)) and isinstance(b, (TensorType, SparseTensorType)):
        return _tensor_reason(a, b)
    if isinstance(a, (SequenceType, OptionalType)):
        reason = compatible(a.elem, b.elem)
        return None if reason is None else f"{type_case(a)} element: {reason}"
    if isinstance(a, MapType):
        if a.key_type != b.key_type:
            return f"map key {type_name(a.key_type)} vs {type_name(b.key_type)}"
        reason = compatible(a.value, b.value)
        return None if reason is None else f"map value: {reason}"
    if isinstance(a, OpaqueType):
        if (a.domain, a.name) != (b.domain, b.name):
            return f"opaque {a.domain}::{a.name} vs {b.domain}::{b.name}"
        return None
    if isinstance(a, StructType) and isinstance(b, StructType):
        return _struct_reason(a, b)
    return None if a == b else f"{a} vs {b}"


def _tensor_reason(a: TensorType | SparseTensorType, b: TensorType | SparseTensorType) -> str | None:
    if a.elem_type != b.elem_type:
        return f"element type {type_name(a.elem_type)} vs {type_name(b.elem_type)}"
    if a.shape is None or b.shape is None:
        return None
    if len(a.shape) != len(b.shape):
        return f"rank {len(a.shape)} vs {len(b.shape)}"
    for i, (x, y) in enumerate(zip(a.shape, b.shape)):
        if isinstance(x, int) and isinstance(y, int) and x != y:
            return f"dimension {i}: {x} vs {y}"
    return None


def _struct_label(s: StructType) -> str:
    if s.is_reference:
        return f"type_ref {s.type_ref}"
    if s.is_category:
        return "a category"
    return "an inline declaration"


def _struct_reason(a: StructType, b: StructType) -> str | None:
    if a.is_reference and b.is_reference:
        return None if a.type_ref == b.type_ref else f"type_ref {a.type_ref} vs {b.type_ref}"
    if a.is_category and b.is_category:
        return None
    if a.is_reference or b.is_reference or a.is_category or b.is_category:
        return f"{_struct_label(a)} vs {_struct_label(b)}"
    # Two inline declarations (or malformed kinds): equal apart from TypeProto.denotation.
    if replace(a, denotation="") == replace(b, denotation=""):
        return None
    return "different inline declarations"


def contains_string(t: Type, catalogue: Catalogue | None = None) -> bool:
    """True if a value of type ``t`` holds STRING at any depth.

    Follows tensor element types, sequence/optional elements, map keys and values,
    struct fields (typed and constant), array elements and references (resolved in
    ``catalogue``; an unresolved or cyclic reference contributes nothing).
    """
    return _has_string(t, catalogue, set())


def _has_string(t: Type, catalogue: Catalogue | None, seen: set[int]) -> bool:
    if isinstance(t, (TensorType, SparseTensorType)):
        return t.elem_type == TensorProto.STRING
    if isinstance(t, (SequenceType, OptionalType)):
        return _has_string(t.elem, catalogue, seen)
    if isinstance(t, MapType):
        return t.key_type == TensorProto.STRING or _has_string(t.value, catalogue, seen)
    if isinstance(t, StructType):
        return _struct_has_string(t, catalogue, seen)
    return False


def _struct_has_string(st: StructType, catalogue: Catalogue | None, seen: set[int]) -> bool:
    if st.is_reference:
        if catalogue is None or st.type_ref is None or st.type_ref in seen:
            return False
        seen.add(st.type_ref)
        target = catalogue.get(st.type_ref)
        return target is not None and _struct_has_string(target, catalogue, seen)
    for f in st.fields:
        if f.constant is not None and f.constant.data_type == TensorProto.STRING:
            return True
        if _has_string(f.type, catalogue, seen):
            return True
    return st.array is not None and _has_string(st.array.element_type, catalogue, seen)
