"""Checked size arithmetic and record layouts (proto_ext.sizes)."""
from __future__ import annotations

import pytest
from onnx import TensorProto as T

from onnxforge.errors import VerificationError
from onnxforge.proto_ext import schema
from onnxforge.proto_ext.catalogue import Catalogue
from onnxforge.proto_ext.convert import struct_from_proto
from onnxforge.proto_ext.sizes import (
    UINT64_MAX,
    LayoutCache,
    SizeError,
    element_bytes,
    leaf_count,
    leaf_paths,
    record_count,
    record_layout,
    struct_bits,
)
from onnxforge.proto_ext.types import StructType
from tests.proto_ext.helpers import (
    array_type,
    bit_packing_type,
    category_type,
    constant,
    ref,
    ref_type,
    spec_catalogue,
    struct_decl,
    tensor_type,
)


def records(*protos) -> list[StructType]:
    return [struct_from_proto(p) for p in protos]


def inline(fields) -> StructType:
    return struct_from_proto(struct_decl(None, "", fields))


def spec() -> Catalogue:
    return Catalogue(records(*spec_catalogue()))


def rule_of(exc_info) -> str:
    return exc_info.value.rule


# -- the specification's worked examples -------------------------------------------------------


@pytest.mark.parametrize("type_id, nbytes", [(2001, 20), (1003, 64), (1002, 76), (1101, 8), (1102, 12)])
def test_spec_example_sizes(type_id, nbytes):
    cat = spec()
    st = struct_from_proto(ref(type_id))
    assert element_bytes(st, cat) == nbytes
    assert struct_bits(st, cat) == nbytes * 8
    assert record_layout(st, cat).bytes == nbytes


def test_int4_block_record_counts():
    cat = spec()
    eb = element_bytes(struct_from_proto(ref(2001)), cat)
    assert record_count(2560, eb) == 128
    assert record_count(5120, eb) == 256


def test_codebook_record_counts():
    eb = element_bytes(struct_from_proto(ref(1102)), spec())
    assert record_count(12, eb) == 1
    assert record_count(1536, eb) == 128


def test_int4_then_float_is_twenty_bytes_without_padding():
    st = inline([("codes", array_type(T.INT4, 32)), ("scale", tensor_type(T.FLOAT, []))])
    layout = record_layout(st, Catalogue([]))
    assert layout.bits == 160
    assert layout.element_bytes == 20
    assert [(leaf.path, leaf.bit_offset) for leaf in layout.leaves] == [("codes", 0), ("scale", 128)]


def test_int64_at_unaligned_offset_in_type_1002():
    layout = record_layout(struct_from_proto(ref(1002)), spec())
    zp = layout.leaf("zero_point")
    assert zp.bit_offset == 68 * 8
    assert (zp.kind, zp.elem_type, zp.dims, zp.bit_width) == ("tensor", T.INT64, (), 64)


def test_fields_start_at_any_bit_offset():
    st = inline([("a", tensor_type(T.INT2, [])), ("b", tensor_type(T.INT4, [3])),
                 ("c", tensor_type(T.UINT2, []))])
    layout = record_layout(st, Catalogue([]))
    assert [leaf.bit_offset for leaf in layout.leaves] == [0, 2, 14]
    assert layout.bits == 16


# -- leaves ------------------------------------------------------------------------------------


def test_codebook_leaves_are_flattened_through_the_reference():
    layout = record_layout(struct_from_proto(ref(1102)), spec())
    assert layout.paths == ["quantized.codes.index", "quantized.codebook", "scale"]
    index, codebook, scale = layout.leaves
    assert (index.kind, index.bit_offset, index.dims, index.bit_width, index.elem_type) == (
        "bitfield", 0, (32,), 2, T.UINT8)
    assert (index.component, index.components) == (0, 1)
    assert codebook.kind == "constant" and not codebook.is_physical
    assert codebook.dims == (4,) and codebook.bit_width == 0
    assert list(codebook.constant.array()) == [-1.0, -0.25, 0.25, 1.0]
    assert (scale.bit_offset, scale.elem_type) == (64, T.FLOAT)


def test_constants_contribute_zero_bits():
    layout = record_layout(struct_from_proto(ref(1003)), spec())
    assert layout.bits == 512
    assert [leaf.kind for leaf in layout.leaves] == ["tensor", "constant", "constant"]
    assert layout.leaf("values").dims == (128,)


def test_bit_packing_components_interleave():
    st = inline([("q", bit_packing_type([("lo", 3), ("hi", 5), ("flag", 1)], 4)),
                 ("pad", tensor_type(T.UINT8, [])), ("tail", tensor_type(T.UINT4, [1]))])
    layout = record_layout(st, Catalogue([]))
    lo, hi, flag = layout.leaves[:3]
    assert (lo.bit_offset, hi.bit_offset, flag.bit_offset) == (0, 3, 8)
    assert {lo.stride_bits, hi.stride_bits, flag.stride_bits} == {9}
    assert hi.strides_bits == (9,) and hi.count == 4
    assert flag.elem_type == T.UINT8 and [leaf.component for leaf in (lo, hi, flag)] == [0, 1, 2]
    assert layout.bits == 36 + 8 + 4


def test_wide_bit_packing_components_pick_wider_unsigned_types():
    st = inline([("q", bit_packing_type([("a", 9), ("b", 17), ("c", 33), ("d", 5)], 1))])
    layout = record_layout(st, Catalogue([]))
    assert [leaf.elem_type for leaf in layout.leaves] == [T.UINT16, T.UINT32, T.UINT64, T.UINT8]
    assert layout.bits == 64


def test_array_of_tensors_prepends_its_dimension():
    st = inline([("m", array_type(tensor_type(T.FLOAT16, [2, 3]), 4)),
                 ("n", array_type(array_type(T.INT8, 5), 2))])
    layout = record_layout(st, Catalogue([]))
    m, n = layout.leaves
    assert m.dims == (4, 2, 3) and m.repeat == () and m.strides_bits == (96, 48, 16)
    assert n.dims == (2, 5) and n.bit_offset == 4 * 6 * 16
    assert layout.bits == 4 * 6 * 16 + 10 * 8


def test_array_of_structures_adds_a_repeat_axis():
    pair = struct_decl(7, "Pair", [("k", tensor_type(T.INT8, [2])), ("s", tensor_type(T.FLOAT16, [])),
                                   ("c", constant(T.FLOAT, [], [1.0]))])
    cat = Catalogue(records(pair))
    st = inline([("head", tensor_type(T.UINT8, [])), ("pairs", array_type(ref_type(7), 3))])
    layout = record_layout(st, cat)
    assert layout.paths == ["head", "pairs.k", "pairs.s", "pairs.c"]
    k, s, c = layout.leaves[1:]
    assert (k.bit_offset, k.repeat, k.dims, k.shape, k.strides_bits) == (8, ((3, 32),), (2,), (3, 2), (32, 8))
    assert (s.bit_offset, s.shape) == (24, (3,))
    assert c.repeat == () and c.kind == "constant"
    assert layout.bits == 8 + 3 * 32


def test_nested_arrays_of_structures_stack_repeat_axes():
    inner = struct_decl(None, "", [("x", tensor_type(T.INT4, [])), ("y", tensor_type(T.INT4, []))])
    elem = schema.TypeProto()
    elem.struct_type.CopyFrom(inner)
    st = inline([("grid", array_type(array_type(elem, 3), 2))])
    layout = record_layout(st, Catalogue([]))
    x, y = layout.leaves
    assert x.repeat == ((2, 24), (3, 8)) and x.shape == (2, 3)
    assert y.bit_offset == 4 and y.strides_bits == (24, 8)


def test_array_of_bit_packings_stays_contiguous():
    st = inline([("codes", array_type(bit_packing_type([("i", 2), ("j", 2)], 4), 2))])
    (i, j) = record_layout(st, Catalogue([])).leaves
    assert i.dims == (2, 4) and i.repeat == () and i.strides_bits == (16, 4)
    assert j.bit_offset == 2


def test_root_array_declaration():
    arr = schema.StructTypeProto()
    arr.array.element_type.CopyFrom(tensor_type(T.UINT16, []))
    arr.array.dimension = 3
    layout = record_layout(struct_from_proto(arr), Catalogue([]))
    assert layout.bytes == 6 and layout.paths == [""] and layout.leaves[0].dims == (3,)


def test_layout_cache_memoizes_declarations():
    cache = LayoutCache(spec())
    assert cache.declaration_bits(1101) == 64
    first = cache.record_layout(struct_from_proto(ref(1102)))
    second = cache.record_layout(struct_from_proto(ref(1102)))
    assert first == second and first.bits == 96


def test_long_reference_chains_do_not_exhaust_the_stack():
    n = 1500  # deeper than the interpreter's default recursion limit
    decls = [struct_decl(1, "leaf", [("v", tensor_type(T.UINT8, []))])]
    decls += [struct_decl(i, f"t{i}", [("inner", ref_type(i - 1))]) for i in range(2, n + 1)]
    cat = Catalogue(records(*decls))
    layout = record_layout(struct_from_proto(ref(n)), cat)
    assert layout.bytes == 1
    assert layout.paths == [".".join(["inner"] * (n - 1) + ["v"])]
    assert leaf_count(struct_from_proto(ref(n)), cat) == 1


# -- leaf paths without a fixed size -----------------------------------------------------------


def test_leaf_paths_of_a_runtime_struct():
    seq = schema.TypeProto()
    seq.sequence_type.elem_type.CopyFrom(tensor_type(T.FLOAT, None))
    st = inline([("blocks", seq), ("length", tensor_type(T.INT64, [])), ("any", category_type()),
                 ("inner", ref_type(1102))])
    assert leaf_paths(st, spec()) == ["blocks", "length", "any", "inner.quantized.codes.index",
                                      "inner.quantized.codebook", "inner.scale"]
    assert leaf_count(st, spec()) == 6


# -- failures ----------------------------------------------------------------------------------


def _seq(elem):
    tp = schema.TypeProto()
    tp.sequence_type.elem_type.CopyFrom(elem)
    return tp


def _map():
    tp = schema.TypeProto()
    tp.map_type.key_type = T.INT64
    tp.map_type.value_type.CopyFrom(tensor_type(T.FLOAT, []))
    return tp


def _optional():
    tp = schema.TypeProto()
    tp.optional_type.elem_type.CopyFrom(tensor_type(T.FLOAT, []))
    return tp


def _sparse():
    tp = schema.TypeProto()
    tp.sparse_tensor_type.elem_type = T.FLOAT
    tp.sparse_tensor_type.shape.dim.add().dim_value = 4
    return tp


@pytest.mark.parametrize("field_type", [
    _seq(tensor_type(T.FLOAT, [])),
    _map(),
    _optional(),
    _sparse(),
    category_type(),
    tensor_type(T.STRING, []),
    tensor_type(T.FLOAT, None),
    tensor_type(T.FLOAT, ["n"]),
    tensor_type(T.FLOAT, [None]),
    array_type(tensor_type(T.INT8, None), 4),
], ids=["sequence", "map", "optional", "sparse", "category", "string", "no-shape", "symbolic",
        "unknown-dim", "array-of-unshaped"])
def test_non_fixed_size_content_is_s1(field_type):
    st = inline([("ok", tensor_type(T.FLOAT, [])), ("bad", field_type)])
    with pytest.raises(SizeError) as info:
        record_layout(st, Catalogue([]))
    assert rule_of(info) == "S1"
    assert "field['bad']" in info.value.path


@pytest.mark.parametrize("field_type", [
    tensor_type(T.FLOAT, [2**40, 2**40]),
    array_type(tensor_type(T.FLOAT, [2**31]), 2**31),
    bit_packing_type([("a", 64)], 2**58),
    array_type(array_type(T.DOUBLE, 2**32), 2**26),
], ids=["dims", "array", "bit-packing", "nested-array"])
def test_overflow_is_s2_never_a_wrap(field_type):
    st = inline([("x", field_type)])
    with pytest.raises(SizeError) as info:
        struct_bits(st, Catalogue([]))
    assert rule_of(info) == "S2"
    assert isinstance(info.value, VerificationError) and info.value.rules == ["S2"]


def test_sum_of_fields_overflows():
    big = tensor_type(T.UINT8, [2**60])
    st = inline([("a", big), ("b", big)])
    with pytest.raises(SizeError) as info:
        struct_bits(st, Catalogue([]))
    assert rule_of(info) == "S2"


def test_largest_representable_size_is_accepted():
    st = inline([("x", bit_packing_type([("a", 1)], UINT64_MAX))])
    assert struct_bits(st, Catalogue([])) == UINT64_MAX


@pytest.mark.parametrize("fields, bits", [
    ([("c", constant(T.FLOAT, [], [1.0]))], 0),
    ([], 0),
    ([("x", tensor_type(T.INT4, [3]))], 12),
    ([("x", tensor_type(T.FLOAT, [0]))], 0),
])
def test_root_must_be_positive_whole_bytes(fields, bits):
    st = inline(fields)
    assert struct_bits(st, Catalogue([])) == bits
    with pytest.raises(SizeError) as info:
        record_layout(st, Catalogue([]))
    assert rule_of(info) == "S4"


def test_nested_constant_only_struct_contributes_zero_bytes():
    const_only = struct_decl(5, "K", [("k", constant(T.FLOAT, [2], [1.0, 2.0]))])
    st = inline([("k", ref_type(5)), ("v", tensor_type(T.INT8, []))])
    layout = record_layout(st, Catalogue(records(const_only)))
    assert layout.bytes == 1 and layout.paths == ["k.k", "v"]


def test_unresolved_reference_is_c3():
    with pytest.raises(SizeError) as info:
        record_layout(inline([("x", ref_type(42))]), spec())
    assert rule_of(info) == "C3"
    assert info.value.path.endswith("type_ref")


def test_self_reference_is_c7():
    cat = Catalogue(records(struct_decl(5, "", [("me", ref_type(5))])))
    with pytest.raises(SizeError) as info:
        element_bytes(struct_from_proto(ref(5)), cat)
    assert rule_of(info) == "C7"


def test_mutual_reference_cycle_is_c7():
    cat = Catalogue(records(
        struct_decl(1, "", [("v", tensor_type(T.UINT8, [])), ("b", ref_type(2))]),
        struct_decl(2, "", [("a", array_type(ref_type(3), 2))]),
        struct_decl(3, "", [("a", ref_type(1))]),
    ))
    for tid in (1, 2, 3):
        with pytest.raises(SizeError) as info:
            record_layout(struct_from_proto(ref(tid)), cat)
        assert rule_of(info) == "C7"
    with pytest.raises(SizeError) as info:
        leaf_paths(struct_from_proto(ref(2)), cat)
    assert rule_of(info) == "C7"


def test_duplicate_declaration_is_c2():
    cat = Catalogue(records(struct_decl(5, "a", [("x", tensor_type(T.UINT8, []))]),
                            struct_decl(5, "b", [("x", tensor_type(T.FLOAT, []))])))
    with pytest.raises(SizeError) as info:
        element_bytes(struct_from_proto(ref(5)), cat)
    assert rule_of(info) == "C2"


def test_reference_to_a_non_declaration_is_c1():
    cat = Catalogue([StructType(kind="type_ref", type_ref=9, type_id=5)])
    with pytest.raises(SizeError) as info:
        element_bytes(struct_from_proto(ref(5)), cat)
    assert rule_of(info) == "C1"


@pytest.mark.parametrize("fields, rule", [
    ([("x", None)], "T2"),
    ([("x", tensor_type(T.UNDEFINED, []))], "T3"),
    ([("x", array_type(T.INT8, 0))], "T4"),
    ([("x", bit_packing_type([("a", 0)], 1))], "T5"),
    ([("x", bit_packing_type([], 1))], "T5"),
    ([("x", bit_packing_type([("a", 8)], 0))], "T5"),
])
def test_malformed_declarations_name_their_structural_rule(fields, rule):
    with pytest.raises(SizeError) as info:
        struct_bits(inline(fields), Catalogue([]))
    assert rule_of(info) == rule


def test_category_root_is_p2():
    with pytest.raises(SizeError) as info:
        element_bytes(StructType(), Catalogue([]))
    assert rule_of(info) == "P2"


# -- record counts -----------------------------------------------------------------------------


def test_record_count():
    assert record_count(0, 20) == 0
    assert record_count(40, 20) == 2
    with pytest.raises(SizeError) as info:
        record_count(41, 20, "graph.encoded_initializer['w']")
    assert rule_of(info) == "S5" and info.value.path == "graph.encoded_initializer['w']"
    for bad in (0, -4):
        with pytest.raises(SizeError) as info:
            record_count(8, bad)
        assert rule_of(info) == "S4"
    with pytest.raises(SizeError) as info:
        record_count(-1, 4)
    assert rule_of(info) == "S5"
