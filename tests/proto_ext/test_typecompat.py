"""The Compatible relation and STRING detection (proto_ext.typecompat)."""
from __future__ import annotations

import pytest
from onnx import TensorProto

from onnxforge.proto_ext.catalogue import Catalogue
from onnxforge.proto_ext.typecompat import compatible, contains_string, type_case
from onnxforge.proto_ext.types import (
    ArrayKind,
    Constant,
    MapType,
    OpaqueType,
    OptionalType,
    SequenceType,
    SparseTensorType,
    StructField,
    StructType,
    TensorType,
)

F, F16, I64, S = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.INT64, TensorProto.STRING


def t(elem: int, *dims) -> TensorType:
    return TensorType(elem, tuple(dims))


def ref(type_id: int) -> StructType:
    return StructType(kind="type_ref", type_ref=type_id)


def decl(*fields: StructField, type_id: int | None = None) -> StructType:
    return StructType(kind="structure", fields=tuple(fields), type_id=type_id)


CATEGORY = StructType()


@pytest.mark.parametrize("a, b", [
    (t(F, 1, 2, "past", 32), t(F, 1, 2, "total", 32)),   # symbolic dims may differ
    (t(F, 1, None, 8), t(F, 1, 16, 8)),                  # unknown vs concrete
    (t(F, 2, 3), TensorType(F, None)),                   # unknown rank
    (SequenceType(t(F, 4)), SequenceType(t(F, "n"))),
    (OptionalType(t(I64)), OptionalType(t(I64))),
    (MapType(I64, t(F, 3)), MapType(I64, t(F, 3))),
    (SparseTensorType(F, (4, 4)), SparseTensorType(F, (4, "k"))),
    (OpaqueType("d", "x"), OpaqueType("d", "x")),
    (ref(7), ref(7)),
    (CATEGORY, StructType(denotation="cache")),
    (decl(StructField("a", t(F, 2), has_type=True)), decl(StructField("a", t(F, 2), has_type=True))),
    (None, None),
])
def test_compatible_pairs(a, b):
    assert compatible(a, b) is None
    assert compatible(b, a) is None


@pytest.mark.parametrize("a, b, words", [
    (t(F, 2, 3), t(F16, 2, 3), "element type FLOAT vs FLOAT16"),
    (t(F, 2, 3), t(F, 2, 3, 1), "rank 2 vs 3"),
    (t(F, 2, 16, 8), t(F, 2, 17, 8), "dimension 1: 16 vs 17"),
    (t(F, 2), SequenceType(t(F, 2)), "tensor vs sequence"),
    (t(F, 2), SparseTensorType(F, (2,)), "tensor vs sparse_tensor"),
    (SequenceType(t(F, 2)), SequenceType(t(I64, 2)), "sequence element: element type"),
    (OptionalType(t(F, 1)), OptionalType(t(F, 2)), "optional element: dimension 0"),
    (MapType(I64, t(F)), MapType(S, t(F)), "map key INT64 vs STRING"),
    (MapType(I64, t(F)), MapType(I64, t(F16)), "map value: element type"),
    (OpaqueType("d", "x"), OpaqueType("d", "y"), "opaque d::x vs d::y"),
    (ref(7), ref(8), "type_ref 7 vs 8"),
    (ref(7), CATEGORY, "type_ref 7 vs a category"),
    (ref(7), decl(), "type_ref 7 vs an inline declaration"),
    (CATEGORY, decl(), "a category vs an inline declaration"),
    (decl(StructField("a", t(F, 2), has_type=True)), decl(StructField("a", t(F, 3), has_type=True)),
     "different inline declarations"),
    (t(F, 2), None, "tensor vs none"),
])
def test_incompatible_pairs_give_a_reason(a, b, words):
    reason = compatible(a, b)
    assert reason is not None and words in reason
    assert compatible(b, a) is not None


def test_type_case_names():
    assert [type_case(x) for x in (t(F), CATEGORY, SequenceType(None), None)] == [
        "tensor", "struct_type", "sequence", "none"]


def _string_constant() -> Constant:
    return Constant(S, (1,), b"", 1)


@pytest.mark.parametrize("ty", [
    t(S, 2),
    SparseTensorType(S, (2,)),
    SequenceType(t(S)),
    OptionalType(SequenceType(t(S, 3))),
    MapType(S, t(F)),                                    # a map key
    MapType(I64, t(S)),                                  # a map value
    decl(StructField("name", t(S), has_type=True)),      # a typed field
    decl(StructField("tag", constant=_string_constant())),  # a constant field
    StructType(kind="array", array=ArrayKind(t(S), 4)),  # array elements
    ref(10),                                             # through a reference
    SequenceType(ref(11)),                               # reference chain 11 -> 10
])
def test_contains_string_finds_it_at_any_depth(ty):
    cat = Catalogue([decl(StructField("s", t(S), has_type=True), type_id=10),
                     decl(StructField("inner", ref(10), has_type=True), type_id=11)])
    assert contains_string(ty, cat) is True


@pytest.mark.parametrize("ty", [
    None, t(F, 2), SequenceType(t(I64)), MapType(I64, t(F)), OpaqueType("d", "x"), CATEGORY,
    decl(StructField("v", t(F, 4), has_type=True), StructField("c", constant=Constant(F, (), b"", 1))),
    ref(20), ref(99),                                    # a clean reference; an unresolved one
    ref(30),                                             # a cycle 30 -> 31 -> 30 terminates
])
def test_contains_string_is_false_without_string(ty):
    cat = Catalogue([decl(StructField("v", t(F, 4), has_type=True), type_id=20),
                     decl(StructField("x", ref(31), has_type=True), type_id=30),
                     decl(StructField("y", ref(30), has_type=True), type_id=31)])
    assert contains_string(ty, cat) is False


def test_contains_string_without_catalogue_does_not_follow_references():
    assert contains_string(ref(10), None) is False
    assert contains_string(SequenceType(t(S)), None) is True
