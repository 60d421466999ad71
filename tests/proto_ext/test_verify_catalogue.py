"""Rules C1-C8 (catalogue and identity) and T1-T7 (struct type structure)."""
from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as hst
from onnx import AttributeProto
from onnx import TensorProto as T

from onnxforge.proto_ext import schema
from onnxforge.proto_ext.verify import check
from tests.proto_ext.helpers import (
    array_type,
    bit_packing_type,
    category_type,
    constant,
    decoder_function,
    encoded,
    model_with,
    ref,
    ref_type,
    rules_of,
    spec_catalogue,
    struct_decl,
    struct_type,
    tensor_type,
)

FLOAT_SCALAR = tensor_type(T.FLOAT, [])


def one_input(tp, **kw):
    """A model whose single graph input is typed ``tp``."""
    return model_with(inputs=[("x", tp)], **kw)


def spec_values():
    fl = lambda n: tensor_type(T.FLOAT, [n])  # noqa: E731
    return [
        encoded("blocks_a", type_ref=2001, raw_data=bytes(2560), logical=fl(4096)),
        encoded("blocks_b", type_ref=2001, raw_data=bytes(5120), logical=fl(8192)),
        encoded("weight_a", type_ref=1003, raw_data=bytes(64), logical=fl(128)),
        encoded("weight_b", type_ref=1003, raw_data=bytes(64), logical=fl(128)),
        encoded("weight_c", type_ref=1002, raw_data=bytes(76), logical=fl(128)),
        encoded("cb_one", type_ref=1102, raw_data=bytes.fromhex("e4" * 8 + "00000040"), logical=fl(32)),
        encoded("cb_many", type_ref=1102, raw_data=bytes(1536), logical=fl(4096)),
    ]


# -- valid models ------------------------------------------------------------------------------


def test_spec_catalogue_and_values_verify_clean():
    m = model_with(struct_types=spec_catalogue(), encoded=spec_values(),
                   inputs=[("blk", ref_type(2001)), ("any", category_type())])
    assert check(m) == []


def test_stock_model_verifies_clean():
    m = model_with(inputs=[("x", tensor_type(T.FLOAT, ["n", 3]))])
    assert check(m) == []


def test_runtime_struct_types_are_valid_types():
    seq = schema.TypeProto()
    seq.sequence_type.elem_type.CopyFrom(category_type())
    cache = struct_decl(3000, "Cache", [("blocks", seq), ("length", tensor_type(T.INT64, [])),
                                        ("keys", tensor_type(T.FLOAT16, ["b", "h", "s", 64]))])
    assert check(one_input(ref_type(3000), struct_types=[cache])) == []


# -- C1-C7 -------------------------------------------------------------------------------------


def test_c1_reference_entry():
    entry = ref(2001)
    entry.type_id = 7
    m = model_with(struct_types=[*spec_catalogue(), entry])
    violations = check(m)
    assert {v.rule for v in violations} == {"C1"}
    assert violations[0].path == "struct_types[5](type_id=7)"


def test_c1_category_entry():
    entry = schema.StructTypeProto(name="free")
    assert rules_of(model_with(struct_types=[entry])) == {"C1"}


def test_c1_declaration_without_type_id():
    assert rules_of(model_with(struct_types=[struct_decl(None, "x", [("v", FLOAT_SCALAR)])])) == {"C1"}
    assert rules_of(model_with(struct_types=[struct_decl(0, "x", [("v", FLOAT_SCALAR)])])) == {"C1"}


def test_c2_duplicate_type_id():
    a = struct_decl(5, "a", [("v", FLOAT_SCALAR)])
    b = struct_decl(5, "b", [("v", tensor_type(T.UINT8, []))])
    m = model_with(struct_types=[a, b], encoded=[encoded("w", type_ref=5, raw_data=bytes(4))])
    violations = check(m)
    assert [v.rule for v in violations] == ["C2"]
    assert "type_id=5" in violations[0].message


def test_c3_unresolved_reference_in_graph_input():
    violations = check(one_input(ref_type(2001)))
    assert [v.rule for v in violations] == ["C3"]
    assert violations[0].path == "graph.input['x'].type.struct_type.type_ref"
    assert "type_ref=2001" in violations[0].message


def test_c3_reported_once_for_an_encoded_value():
    violations = check(model_with(encoded=[encoded("w", type_ref=2001, raw_data=bytes(20))]))
    assert [(v.rule, v.path) for v in violations] == [
        ("C3", "graph.encoded_initializer['w'].struct_type.type_ref")]


def test_c3_inside_a_catalogue_field():
    decl = struct_decl(10, "outer", [("inner", ref_type(11))])
    violations = check(model_with(struct_types=[decl]))
    assert [(v.rule, v.path) for v in violations] == [
        ("C3", "struct_types[0](type_id=10).structure.field['inner'].type.struct_type.type_ref")]


def test_c3_type_ref_zero():
    assert rules_of(one_input(ref_type(0), struct_types=spec_catalogue())) == {"C3"}


def test_c4_reference_with_extra_content():
    for extra in ("name", "doc_string", "decoder", "metadata", "type_id"):
        st = ref(2001)
        if extra == "decoder":
            st.decoder.CopyFrom(decoder_function(["codes", "scale"]))
        elif extra == "metadata":
            st.metadata_props.add(key="k", value="v")
        elif extra == "type_id":
            st.type_id = 2001
        else:
            setattr(st, extra, "x")
        assert rules_of(one_input(struct_type(st), struct_types=spec_catalogue())) == {"C4"}, extra


def test_c5_inline_declaration_with_type_id():
    inline = struct_decl(77, "", [("v", FLOAT_SCALAR)])
    violations = check(one_input(struct_type(inline)))
    assert [(v.rule, v.path) for v in violations] == [("C5", "graph.input['x'].type.struct_type.type_id")]


def test_c5_nested_declaration_in_catalogue():
    nested = struct_decl(78, "", [("v", FLOAT_SCALAR)])
    outer = struct_decl(10, "outer", [("n", struct_type(nested))])
    assert rules_of(model_with(struct_types=[outer])) == {"C5"}


def test_c5_inline_encoded_layout_with_type_id():
    inline = struct_decl(77, "", [("v", FLOAT_SCALAR)])
    assert rules_of(model_with(encoded=[encoded("w", struct=inline, raw_data=bytes(8))])) == {"C5"}


def test_c6_category_with_decoder():
    cat = category_type()
    cat.struct_type.decoder.CopyFrom(decoder_function(["a"]))
    assert rules_of(one_input(cat)) == {"C6"}


def test_c6_category_with_encoder_in_a_sequence_member():
    cat = category_type()
    cat.struct_type.encoder.CopyFrom(decoder_function(["a"]))
    seq = schema.TypeProto()
    seq.sequence_type.elem_type.CopyFrom(cat)
    violations = check(one_input(seq))
    assert [(v.rule, v.path) for v in violations] == [
        ("C6", "graph.input['x'].type.sequence_type.elem_type.struct_type")]


def test_c7_self_reference():
    decl = struct_decl(5, "me", [("v", FLOAT_SCALAR), ("next", ref_type(5))])
    m = model_with(struct_types=[decl], encoded=[encoded("w", type_ref=5, raw_data=bytes(4))])
    violations = check(m)
    assert [v.rule for v in violations] == ["C7"]


def test_c7_cycle_through_arrays_and_sequences():
    seq = schema.TypeProto()
    seq.sequence_type.elem_type.CopyFrom(ref_type(1))
    a = struct_decl(1, "a", [("b", array_type(ref_type(2), 2))])
    b = struct_decl(2, "b", [("c", ref_type(3))])
    c = struct_decl(3, "c", [("items", seq)])
    violations = check(model_with(struct_types=[a, b, c]))
    assert [v.rule for v in violations] == ["C7"]
    assert "[1, 2, 3]" in violations[0].message


def test_c_rules_in_subgraphs_and_functions():
    then_graph = schema.GraphProto(name="then")
    then_graph.node.add(op_type="Identity", input=["x"], output=["t"])
    out = then_graph.output.add(name="t")
    out.type.CopyFrom(ref_type(404))
    else_graph = schema.GraphProto(name="else")
    else_graph.node.add(op_type="Identity", input=["x"], output=["e"])
    else_graph.output.add(name="e").type.CopyFrom(ref_type(2001))
    node = schema.NodeProto(op_type="If", input=["cond"], output=["y"])
    node.attribute.add(name="then_branch", type=AttributeProto.GRAPH).g.CopyFrom(then_graph)
    node.attribute.add(name="else_branch", type=AttributeProto.GRAPH).g.CopyFrom(else_graph)

    fn = schema.FunctionProto(name="F", domain="local", input=["a"], output=["b"])
    fn.node.add(op_type="Identity", input=["a"], output=["b"])
    fn.opset_import.add(domain="", version=23)
    fn.value_info.add(name="a").type.CopyFrom(ref_type(505))

    m = model_with(struct_types=spec_catalogue(), nodes=[node], functions=[fn],
                   inputs=[("cond", tensor_type(T.BOOL, [])), ("x", ref_type(2001))])
    violations = check(m)
    assert sorted((v.rule, v.path) for v in violations) == [
        ("C3", "functions['local::F'].value_info['a'].type.struct_type.type_ref"),
        ("C3", "graph.node[0].attribute['then_branch'].g.output['t'].type.struct_type.type_ref"),
    ]


# -- C8 ----------------------------------------------------------------------------------------


def test_c8_every_order_of_the_spec_catalogue_verifies_clean():
    entries = spec_catalogue()
    values = spec_values()
    for order in itertools.permutations(entries):
        assert check(model_with(struct_types=order, encoded=values)) == [], order


def _messy_catalogue():
    return [
        *spec_catalogue(),
        struct_decl(7, "dup-a", [("v", FLOAT_SCALAR)]),
        struct_decl(7, "dup-b", [("v", tensor_type(T.UINT8, []))]),
        struct_decl(8, "uses-dup", [("d", ref_type(7))]),
        struct_decl(9, "cyc", [("again", ref_type(9))]),
        struct_decl(10, "dangling", [("nowhere", ref_type(99))]),
        struct_decl(11, "bad-width", [("q", bit_packing_type([("a", 70)], 1))]),
    ]


def _messy_values():
    return [*spec_values(),
            encoded("d7", type_ref=7, raw_data=bytes(4)),
            encoded("d8", type_ref=8, raw_data=bytes(1)),
            encoded("bad", type_ref=1102, raw_data=bytes(13))]


def _verdict(entries):
    violations = check(model_with(struct_types=entries, encoded=_messy_values()))
    return sorted((v.rule, v.path) for v in violations if not v.path.startswith("struct_types["))


@settings(max_examples=40, deadline=None)
@given(hst.permutations(range(len(_messy_catalogue()))))
def test_c8_shuffling_never_changes_the_verdict(order):
    entries = _messy_catalogue()
    baseline = check(model_with(struct_types=entries, encoded=_messy_values()))
    shuffled = check(model_with(struct_types=[entries[i] for i in order], encoded=_messy_values()))
    assert sorted(v.rule for v in shuffled) == sorted(v.rule for v in baseline)
    assert _verdict([entries[i] for i in order]) == _verdict(entries)
    assert {v.rule for v in baseline} == {"C2", "C3", "C7", "T5", "S5"}


# -- T1-T7 -------------------------------------------------------------------------------------


def test_t1_empty_field_name():
    decl = struct_decl(5, "x", [("", FLOAT_SCALAR)])
    violations = check(model_with(struct_types=[decl]))
    assert [(v.rule, v.path) for v in violations] == [("T1", "struct_types[0](type_id=5).structure.field[0]")]


def test_t1_duplicate_field_names():
    decl = struct_decl(5, "x", [("a", FLOAT_SCALAR), ("a", FLOAT_SCALAR)])
    assert [v.rule for v in check(model_with(struct_types=[decl]))] == ["T1"]


def test_t1_dotted_field_name():
    decl = struct_decl(5, "x", [("a.b", FLOAT_SCALAR)])
    assert rules_of(model_with(struct_types=[decl])) == {"T1"}


def test_t1_component_names():
    for comps in ([("", 2)], [("i", 2), ("i", 2)], [("i.j", 2)]):
        decl = struct_decl(5, "x", [("q", bit_packing_type(comps, 4))])
        assert rules_of(model_with(struct_types=[decl])) == {"T1"}, comps


def test_t2_field_without_content():
    decl = struct_decl(5, "x", [("v", FLOAT_SCALAR), ("empty", None)])
    m = model_with(struct_types=[decl], encoded=[encoded("w", type_ref=5, raw_data=bytes(4))])
    violations = check(m)
    assert [(v.rule, v.path) for v in violations] == [
        ("T2", "struct_types[0](type_id=5).structure.field['empty']")]


def test_t3_undefined_elem_type():
    decl = struct_decl(5, "x", [("v", tensor_type(T.UNDEFINED, []))])
    m = model_with(struct_types=[decl], encoded=[encoded("w", type_ref=5, raw_data=bytes(4))])
    assert rules_of(m) == {"T3"}


def test_t3_type_without_case():
    decl = struct_decl(5, "x", [("v", schema.TypeProto())])
    assert rules_of(model_with(struct_types=[decl])) == {"T3"}


def test_t3_recursive_member_and_array_element():
    seq = schema.TypeProto()
    seq.sequence_type.elem_type.CopyFrom(tensor_type(T.UNDEFINED, None))
    assert rules_of(model_with(struct_types=[struct_decl(5, "x", [("s", seq)])])) == {"T3"}
    arr = array_type(tensor_type(T.UNDEFINED, []), 3)
    assert rules_of(model_with(struct_types=[struct_decl(5, "x", [("a", arr)])])) == {"T3"}


def test_t4_array_dimension_zero():
    decl = struct_decl(5, "x", [("a", array_type(T.INT8, 0)), ("b", tensor_type(T.INT8, []))])
    m = model_with(struct_types=[decl], encoded=[encoded("w", type_ref=5, raw_data=bytes(1))])
    assert rules_of(m) == {"T4"}


def test_t4_array_without_element_type():
    tp = schema.TypeProto()
    tp.struct_type.array.dimension = 4
    assert rules_of(model_with(struct_types=[struct_decl(5, "x", [("a", tp)])])) == {"T4"}


def test_t5_bit_packing():
    cases = [bit_packing_type([], 4), bit_packing_type([("a", 0)], 4),
             bit_packing_type([("a", 65)], 4), bit_packing_type([("a", 8)], 0)]
    for tp in cases:
        decl = struct_decl(5, "x", [("q", tp), ("v", tensor_type(T.UINT8, []))])
        m = model_with(struct_types=[decl], encoded=[encoded("w", type_ref=5, raw_data=bytes(4))])
        assert rules_of(m) == {"T5"}, tp


def test_t6_constants():
    bad_count = schema.TensorProto(data_type=T.FLOAT, dims=[3], float_data=[1.0, 2.0])
    undefined = schema.TensorProto(data_type=T.UNDEFINED, dims=[1])
    negative = schema.TensorProto(data_type=T.FLOAT, dims=[-1])
    for c in (bad_count, undefined, negative):
        decl = struct_decl(5, "x", [("v", tensor_type(T.UINT8, [])), ("c", c)])
        violations = check(model_with(struct_types=[decl]))
        assert [(v.rule, v.path) for v in violations] == [
            ("T6", "struct_types[0](type_id=5).structure.field['c'].constant")], c


def test_t6_valid_constants():
    decl = struct_decl(5, "x", [("v", tensor_type(T.UINT8, [])),
                                ("a", constant(T.FLOAT, [2, 2], [1, 2, 3, 4])),
                                ("b", constant(T.INT4, [3], [1, -2, 3])),
                                ("c", constant(T.FLOAT16, [2], [1, 2], raw=True)),
                                ("d", constant(T.INT64, [0], []))])
    assert check(model_with(struct_types=[decl])) == []


def test_t7_decoder_inputs_out_of_order():
    entries = spec_catalogue()
    entries[4].decoder.ClearField("input")
    entries[4].decoder.input.extend(["scale", "quantized.codes.index", "quantized.codebook"])
    violations = check(model_with(struct_types=entries))
    assert [(v.rule, v.path) for v in violations] == [
        ("T7", "struct_types[4](type_id=1102).decoder.input[0]")]


def test_t7_decoder_input_count():
    decl = struct_decl(5, "x", [("codes", bit_packing_type([("i", 2), ("j", 2)], 2)),
                                ("c", constant(T.FLOAT, [], [1.0]))],
                       decoder=decoder_function(["codes", "c"]))
    violations = check(model_with(struct_types=[decl]))
    assert [v.rule for v in violations] == ["T7"]
    assert "['codes.i', 'codes.j', 'c']" in violations[0].message


def test_t7_decoder_outputs():
    decl = struct_decl(5, "x", [("v", tensor_type(T.UINT8, []))],
                       decoder=decoder_function(["v"], outputs=["y", "z"]))
    assert rules_of(model_with(struct_types=[decl])) == {"T7"}


def test_t7_array_of_structs_is_flattened():
    pair = struct_decl(6, "pair", [("k", tensor_type(T.INT8, [])), ("s", FLOAT_SCALAR)])
    ok = struct_decl(5, "x", [("pairs", array_type(ref_type(6), 4))],
                     decoder=decoder_function(["pairs.k", "pairs.s"]))
    assert check(model_with(struct_types=[pair, ok])) == []
    bad = struct_decl(5, "x", [("pairs", array_type(ref_type(6), 4))],
                      decoder=decoder_function(["pairs"]))
    assert rules_of(model_with(struct_types=[pair, bad])) == {"T7"}


def test_t7_skipped_when_a_reference_does_not_resolve():
    decl = struct_decl(5, "x", [("inner", ref_type(404))], decoder=decoder_function(["whatever"]))
    assert rules_of(model_with(struct_types=[decl])) == {"C3"}
