"""Rules P1-P6 (payloads), S1-S6 (sizes) and A1-A8 (affine layouts); wire compatibility."""
from __future__ import annotations

import onnx
import pytest
from onnx import AttributeProto
from onnx import TensorProto as T

from onnxforge.proto_ext import schema
from onnxforge.proto_ext.verify import check, verify
from onnxforge.errors import VerificationError
from tests.proto_ext.helpers import (
    affine_layout,
    array_type,
    bit_packing_type,
    category_type,
    constant,
    encoded,
    model_with,
    ref_type,
    rules_of,
    spec_catalogue,
    struct_decl,
    tensor_type,
)


def fl(*dims):
    return tensor_type(T.FLOAT, list(dims))


def block_model(*values):
    return model_with(struct_types=spec_catalogue(), encoded=list(values))


def inline_layout(fields):
    return struct_decl(None, "", fields)


def scalar(value=0.5, elem=T.FLOAT):
    return constant(elem, [], [value])


def affine_model(**kw):
    kw.setdefault("logical", fl(4, 6))
    return model_with(encoded=[encoded("q", **kw)])


# -- valid payloads ----------------------------------------------------------------------------


def test_spec_values_with_exact_lengths_verify_clean():
    m = block_model(
        encoded("a", type_ref=2001, raw_data=bytes(2560), logical=fl(4096)),
        encoded("b", type_ref=2001, raw_data=bytes(5120), logical=fl(8192)),
        encoded("c", type_ref=1003, raw_data=bytes(64), logical=fl(128)),
        encoded("d", type_ref=1002, raw_data=bytes(76), logical=fl(128)),
        encoded("e", type_ref=1102, raw_data=bytes(12), logical=fl(32)),
        encoded("f", type_ref=1102, raw_data=bytes(1536), logical=fl(4096)),
    )
    assert check(m) == []
    verify(m)


def test_s6_values_sharing_a_type_differ_in_length_and_may_be_empty():
    m = block_model(encoded("one", type_ref=2001, raw_data=bytes(20)),
                    encoded("many", type_ref=2001, raw_data=bytes(20 * 37)),
                    encoded("none", type_ref=2001))
    assert check(m) == []


def test_inline_declaration_layout():
    layout = inline_layout([("codes", array_type(T.INT4, 32)), ("scale", tensor_type(T.FLOAT16, []))])
    assert check(model_with(encoded=[encoded("w", struct=layout, raw_data=bytes(18 * 3))])) == []


def test_struct_logical_type_without_tensor_semantics():
    m = block_model(encoded("w", type_ref=2001, raw_data=bytes(20), logical=ref_type(2001)))
    assert check(m) == []


@pytest.mark.parametrize("storage, logical, scale, zp, axis, block, nbytes", [
    (T.INT8, fl(4, 6), scalar(), None, None, None, 24),
    (T.UINT8, fl(4, 6), scalar(), constant(T.UINT8, [], [3]), None, None, 24),
    (T.INT4, fl(4, 6), constant(T.FLOAT, [6], [1] * 6), None, 1, None, 12),
    (T.INT4, fl(4, 6), constant(T.FLOAT16, [4], [1] * 4), constant(T.INT4, [4], [0] * 4), -2, None, 12),
    (T.UINT4, fl(4, 6), constant(T.FLOAT, [4, 2], [1] * 8), None, 1, 4, 12),
    (T.INT2, fl(5), scalar(), None, None, None, 2),
    (T.UINT2, tensor_type(T.DOUBLE, [3, 7]), constant(T.FLOAT, [3, 1], [1] * 3), None, 1, 7, 6),
    (T.INT8, fl(0), scalar(), None, None, None, 0),
])
def test_valid_affine_values(storage, logical, scale, zp, axis, block, nbytes):
    a = affine_layout(storage, scale, zp, axis=axis, block_size=block)
    assert check(affine_model(affine=a, logical=logical, raw_data=bytes(nbytes))) == []


# -- P1-P6 -------------------------------------------------------------------------------------


def test_p1_no_layout():
    violations = check(model_with(encoded=[encoded("w", raw_data=bytes(4), logical=fl(1))]))
    assert [(v.rule, v.path) for v in violations] == [("P1", "graph.encoded_initializer['w']")]


def test_p2_category_layout():
    m = model_with(encoded=[encoded("w", struct=schema.StructTypeProto(), raw_data=bytes(4))])
    violations = check(m)
    assert [(v.rule, v.path) for v in violations] == [("P2", "graph.encoded_initializer['w'].struct_type")]


def test_p3_inline_and_external_payload():
    ev = encoded("w", type_ref=2001, external=[("location", "w.bin"), ("length", "20")])
    ev.raw_data = bytes(20)
    assert rules_of(block_model(ev)) == {"P3"}


@pytest.mark.parametrize("entries, location", [
    ([("location", "w.bin")], T.EXTERNAL),                                   # no length
    ([("length", "20")], T.EXTERNAL),                                        # no location
    ([("location", ""), ("length", "20")], T.EXTERNAL),                      # empty location
    ([("location", "w.bin"), ("length", "-20")], T.EXTERNAL),                # negative length
    ([("location", "w.bin"), ("length", "20"), ("offset", "x")], T.EXTERNAL),
    ([("location", "w.bin"), ("length", "20"), ("length", "20")], T.EXTERNAL),  # repeated key
    ([("location", "w.bin"), ("length", "20"), ("owner", "me")], T.EXTERNAL),   # unknown key
    ([("location", "w.bin"), ("length", "20")], T.DEFAULT),                  # DEFAULT with entries
    ([], T.EXTERNAL),                                                        # EXTERNAL without entries
])
def test_p4_external_entries(entries, location):
    ev = encoded("w", type_ref=2001, external=entries, data_location=location)
    assert rules_of(block_model(ev)) == {"P4"}


@pytest.mark.parametrize("location", ["../w.bin", "/abs/w.bin", "a/../../w.bin", "C:\\w.bin", "..\\w.bin"])
def test_p5_location_must_stay_inside_the_model_directory(location):
    ev = encoded("w", type_ref=2001, external=[("location", location), ("length", "20")])
    assert rules_of(block_model(ev)) == {"P5"}


def test_p5_file_checks_with_a_model_directory(tmp_path):
    (tmp_path / "w.bin").write_bytes(bytes(64))
    ok = encoded("w", type_ref=2001, external=[("location", "w.bin"), ("offset", "24"), ("length", "40")])
    assert check(block_model(ok), model_dir=str(tmp_path)) == []
    assert check(block_model(ok)) == []  # unknown directory: no file checks
    short = encoded("w", type_ref=2001, external=[("location", "w.bin"), ("offset", "40"), ("length", "40")])
    assert rules_of(block_model(short), model_dir=str(tmp_path)) == {"P5"}
    missing = encoded("w", type_ref=2001, external=[("location", "nope.bin"), ("length", "20")])
    assert rules_of(block_model(missing), model_dir=str(tmp_path)) == {"P5"}


def test_p5_model_path_supplies_the_directory(tmp_path):
    (tmp_path / "w.bin").write_bytes(bytes(20))
    ev = encoded("w", type_ref=2001, external=[("location", "w.bin"), ("length", "40")])
    path = tmp_path / "m.onnx"
    path.write_bytes(block_model(ev).SerializeToString())
    assert rules_of(str(path)) == {"P5"}
    (tmp_path / "w.bin").write_bytes(bytes(40))
    assert check(str(path)) == []


def test_external_length_counts_records():
    ev = encoded("w", type_ref=1102, external=[("location", "w.bin"), ("length", "25")])
    assert rules_of(block_model(ev)) == {"S5"}


@pytest.mark.parametrize("logical", [fl("n"), tensor_type(T.FLOAT, None), fl(None),
                                     tensor_type(T.UNDEFINED, [4]), schema.TypeProto()],
                         ids=["symbolic", "no-shape", "unknown-dim", "undefined", "no-case"])
def test_p6_logical_type(logical):
    ev = encoded("w", type_ref=2001, raw_data=bytes(20))
    ev.logical_type.CopyFrom(logical)
    ev.logical_type.SetInParent()
    violations = check(block_model(ev))
    assert {v.rule for v in violations} == {"P6"}
    assert violations[0].path.startswith("graph.encoded_initializer['w'].logical_type")


# -- S1-S5 -------------------------------------------------------------------------------------


def _seq():
    tp = schema.TypeProto()
    tp.sequence_type.elem_type.CopyFrom(fl(4))
    return tp


@pytest.mark.parametrize("bad", [_seq(), category_type(), tensor_type(T.STRING, []),
                                 tensor_type(T.FLOAT, None), fl("n")],
                         ids=["sequence", "category", "string", "no-shape", "symbolic"])
def test_s1_not_fixed_size(bad):
    layout = inline_layout([("v", fl()), ("bad", bad)])
    violations = check(model_with(encoded=[encoded("w", struct=layout, raw_data=bytes(4))]))
    assert [(v.rule, v.path) for v in violations] == [("S1", "graph.encoded_initializer['w'].struct_type")]
    assert "field['bad']" in violations[0].message


def test_s1_through_a_reference_names_the_declaration():
    cache = struct_decl(3000, "Cache", [("blocks", _seq()), ("length", tensor_type(T.INT64, []))])
    m = model_with(struct_types=[cache], inputs=[("c", ref_type(3000))],
                   encoded=[encoded("w", type_ref=3000, raw_data=bytes(8))])
    violations = check(m)
    assert [v.rule for v in violations] == ["S1"]
    assert "struct_types(type_id=3000).structure.field['blocks']" in violations[0].message


def test_s2_overflow():
    layout = inline_layout([("x", array_type(tensor_type(T.DOUBLE, [2**32]), 2**26))])
    assert rules_of(model_with(encoded=[encoded("w", struct=layout, raw_data=bytes(8))])) == {"S2"}


def test_s3_padded_payload():
    layout = inline_layout([("tag", tensor_type(T.UINT8, [])), ("value", fl())])
    assert check(model_with(encoded=[encoded("w", struct=layout, raw_data=bytes(15))])) == []
    violations = check(model_with(encoded=[encoded("w", struct=layout, raw_data=bytes(16))]))
    assert [v.rule for v in violations] == ["S3"]
    assert "5 bytes" in violations[0].message


@pytest.mark.parametrize("fields", [
    [("scale", scalar())],
    [("x", tensor_type(T.INT4, [3]))],
    [("q", bit_packing_type([("a", 3)], 1))],
], ids=["constant-only", "twelve-bits", "three-bits"])
def test_s4_root_size(fields):
    decl = struct_decl(5, "x", fields)
    m = model_with(struct_types=[decl], encoded=[encoded("w", type_ref=5)])
    assert rules_of(m) == {"S4"}


def test_s5_partial_record():
    violations = check(block_model(encoded("w", type_ref=2001, raw_data=bytes(30))))
    assert [(v.rule, v.path) for v in violations] == [("S5", "graph.encoded_initializer['w']")]


def test_s5_in_a_subgraph():
    sub = schema.GraphProto(name="then")
    sub.encoded_initializer.add().CopyFrom(encoded("w", type_ref=1102, raw_data=bytes(11)))
    sub.node.add(op_type="Identity", input=["c"], output=["t"])
    sub.output.add(name="t").type.CopyFrom(tensor_type(T.BOOL, []))
    node = schema.NodeProto(op_type="If", input=["c"], output=["y"])
    node.attribute.add(name="then_branch", type=AttributeProto.GRAPH).g.CopyFrom(sub)
    node.attribute.add(name="else_branch", type=AttributeProto.GRAPH).g.CopyFrom(sub)
    m = model_with(struct_types=spec_catalogue(), nodes=[node], inputs=[("c", tensor_type(T.BOOL, []))])
    violations = check(m)
    assert sorted((v.rule, v.path) for v in violations) == [
        ("S5", "graph.node[0].attribute['else_branch'].g.encoded_initializer['w']"),
        ("S5", "graph.node[0].attribute['then_branch'].g.encoded_initializer['w']"),
    ]


# -- A1-A8 -------------------------------------------------------------------------------------


@pytest.mark.parametrize("kw, rule", [
    (dict(affine=affine_layout(T.FLOAT, scalar()), raw_data=bytes(96)), "A1"),
    (dict(affine=affine_layout(T.INT16, scalar()), raw_data=bytes(48)), "A1"),
    (dict(affine=affine_layout(T.INT8, scalar()), logical=tensor_type(T.INT32, [4, 6]), raw_data=bytes(24)), "A2"),
    (dict(affine=affine_layout(T.INT8, scalar()), logical=fl(4, "n"), raw_data=bytes(24)), "A2"),
    (dict(affine=affine_layout(T.INT8, scalar()), logical=category_type(), raw_data=bytes(24)), "A2"),
    (dict(affine=affine_layout(T.INT8, None), raw_data=bytes(24)), "A3"),
    (dict(affine=affine_layout(T.INT8, scalar(3, T.INT32)), raw_data=bytes(24)), "A3"),
    (dict(affine=affine_layout(T.INT8, schema.TensorProto(data_type=T.FLOAT, dims=[2], float_data=[1.0])),
          raw_data=bytes(24)), "A3"),
    (dict(affine=affine_layout(T.INT8, scalar(), constant(T.UINT8, [], [1])), raw_data=bytes(24)), "A4"),
    (dict(affine=affine_layout(T.INT8, scalar(), constant(T.INT8, [1], [1])), raw_data=bytes(24)), "A4"),
    (dict(affine=affine_layout(T.INT8, constant(T.FLOAT, [6], [1] * 6)), raw_data=bytes(24)), "A5"),
    (dict(affine=affine_layout(T.INT8, constant(T.FLOAT, [6], [1] * 6), axis=2), raw_data=bytes(24)), "A6"),
    (dict(affine=affine_layout(T.INT8, constant(T.FLOAT, [6], [1] * 6), axis=-3), raw_data=bytes(24)), "A6"),
    (dict(affine=affine_layout(T.INT8, constant(T.FLOAT, [4], [1] * 4), axis=1), raw_data=bytes(24)), "A6"),
    (dict(affine=affine_layout(T.INT8, scalar(), axis=0), logical=fl(), raw_data=bytes(1)), "A6"),
    (dict(affine=affine_layout(T.INT8, scalar(), block_size=2), raw_data=bytes(24)), "A7"),
    (dict(affine=affine_layout(T.INT8, constant(T.FLOAT, [4, 2], [1] * 8), axis=1, block_size=0),
          raw_data=bytes(24)), "A7"),
    (dict(affine=affine_layout(T.INT8, constant(T.FLOAT, [4, 3], [1] * 12), axis=1, block_size=4),
          raw_data=bytes(24)), "A7"),
    (dict(affine=affine_layout(T.INT8, scalar()), raw_data=bytes(23)), "A8"),
    (dict(affine=affine_layout(T.INT4, scalar()), raw_data=bytes(24)), "A8"),
    (dict(affine=affine_layout(T.INT4, scalar()),
          external=[("location", "q.bin"), ("length", "13")]), "A8"),
], ids=["storage-float", "storage-int16", "logical-int", "logical-symbolic", "logical-struct",
        "scale-missing", "scale-int", "scale-count", "zp-type", "zp-dims", "per-tensor-scale-rank",
        "axis-high", "axis-low", "per-axis-scale-length", "axis-on-scalar", "block-without-axis",
        "block-zero", "blocked-scale-dims", "payload-int8", "payload-int4", "payload-external"])
def test_affine_rules(kw, rule):
    violations = check(affine_model(**kw))
    assert {v.rule for v in violations} == {rule}, [str(v) for v in violations]
    assert all(v.path.startswith("graph.encoded_initializer['q']") for v in violations)


# -- wire compatibility ------------------------------------------------------------------------


def test_extended_model_round_trips_through_stock_onnx(tmp_path):
    m = model_with(
        struct_types=spec_catalogue(),
        encoded=[encoded("blocks", type_ref=2001, raw_data=bytes(range(40)), logical=fl(64)),
                 encoded("cb", type_ref=1102, raw_data=bytes.fromhex("e4" * 8 + "00000040"), logical=fl(32)),
                 encoded("q", affine=affine_layout(T.INT4, constant(T.FLOAT, [2], [0.5, 0.25]), axis=0),
                         logical=fl(2, 3), raw_data=bytes(3))],
        inputs=[("state", ref_type(1102)), ("x", fl("n", 3))],
    )
    data = m.SerializeToString()
    first = tmp_path / "m.onnx"
    first.write_bytes(data)

    stock = onnx.load(str(first))
    assert len(stock.graph.input) == 2 and not stock.graph.initializer
    second = tmp_path / "copy.onnx"
    onnx.save(stock, str(second))
    assert second.read_bytes() == data

    assert check(str(second)) == []
    assert check(stock) == []
    reparsed = schema.parse_model(second.read_bytes())
    assert len(reparsed.struct_types) == 5 and len(reparsed.graph.encoded_initializer) == 3
    assert reparsed.graph.encoded_initializer[1].raw_data == bytes.fromhex("e4" * 8 + "00000040")


def test_stock_round_trip_keeps_violations():
    m = block_model(encoded("w", type_ref=2001, raw_data=bytes(21)))
    stock = onnx.ModelProto()
    stock.ParseFromString(m.SerializeToString())
    with pytest.raises(VerificationError) as info:
        verify(stock)
    assert info.value.rules == ["S5"]
