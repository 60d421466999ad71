"""Rules K1-K9: PagedCacheUpdate, PagedAttention, the cache container and serialized pages."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxforge.proto_ext import schema
from onnxforge.proto_ext.codecs import kvcache as kc
from onnxforge.proto_ext.codecs import kvpages as kp
from onnxforge.proto_ext.convert import struct_to_proto
from onnxforge.proto_ext.verify import check
from tests.proto_ext.helpers import (
    category_type,
    ext,
    model_with,
    ref_type,
    struct_decl,
    tensor_type,
    value_info,
)

FLOAT, INT64 = TensorProto.FLOAT, TensorProto.INT64
RW, MUST = schema.READ_WRITE, schema.MUST_ALIAS
CONTAINER_ID = 7100
H, P, D, N = 2, 8, 64, 4


_vi = value_info  # name, type, and the alias fields


def _node(op: str, inputs: list[str], outputs: list[str], *, alias: bool = False, **attrs: Any) -> Any:
    n = ext(helper.make_node(op, inputs, outputs, name=op, domain="ai.onnxforge", **attrs), "NodeProto")
    if alias:
        n.output_alias.add(output_index=0, input_index=0, kind=MUST)
    return n


def _container(h: int = H, p: int = P, d: int = D, capacity: int = N * P, formats: str = "float32,int8") -> Any:
    decl = kc.cache_declaration(1, 4, 32, 1, type_id=CONTAINER_ID)
    st = struct_to_proto(decl, schema.StructTypeProto())
    consts = {f.name: f for f in st.structure.field}
    consts["page_shape"].constant.CopyFrom(schema.from_onnx(numpy_helper.from_array(
        np.array([2, h, p, d], np.int64))))
    consts["capacity"].constant.CopyFrom(schema.from_onnx(numpy_helper.from_array(np.array(capacity, np.int64))))
    st.metadata_props[0].value = formats
    return st


def paged_model(*, cache_type: Any = None, cache_access: int = RW, key: Any = None, value: Any = None,
                position: Any = None, query: Any = None, update: Any = None, attention: Any = None,
                struct_types: tuple = (), initializers: tuple = ()) -> Any:
    """cache (READ_WRITE) -> PagedCacheUpdate -> upd (alias_of cache) -> PagedAttention -> out."""
    kv = tensor_type(FLOAT, [1, H, "n", D])
    m = model_with(
        struct_types=struct_types,
        inputs=[_vi("cache", cache_type or category_type(), access=cache_access), _vi("key", key or kv),
                _vi("value", value or kv), _vi("position", position or tensor_type(INT64, [])),
                _vi("query", query or tensor_type(FLOAT, [1, 4, "n", D]))],
        outputs=[_vi("out", tensor_type(FLOAT, [1, 4, "n", D])), _vi("upd", cache_type or category_type(),
                                                                     alias_of="cache")],
        nodes=[update or _node("PagedCacheUpdate", ["cache", "key", "value", "position"], ["upd"], alias=True),
               attention or _node("PagedAttention", ["query", "upd"], ["out"], num_heads=4, kv_num_heads=2)],
        bindings=[("cache", "upd")],
        initializers=initializers,
    )
    m.opset_import.add(domain="ai.onnxforge", version=1)
    return m


def violations(m: Any, rule: str) -> list[tuple[str, str]]:
    return [(v.path, v.message) for v in check(m) if v.rule == rule]


def only(m: Any, rule: str) -> tuple[str, str]:
    found = violations(m, rule)
    assert len(found) == 1, check(m)
    return found[0]


def test_the_valid_paged_model_passes_every_rule():
    assert check(paged_model()) == []
    ref = ref_type(CONTAINER_ID)
    assert check(paged_model(cache_type=ref, struct_types=(_container(),))) == []


# -- K1 ------------------------------------------------------------------------------------------

def test_k1_update_needs_four_inputs_and_the_alias():
    path, msg = only(paged_model(update=_node("PagedCacheUpdate", ["cache", "key", "value"], ["upd"], alias=True)),
                     "K1")
    assert path == "graph.node[0]('PagedCacheUpdate')" and "(cache, key, value, position)" in msg
    path, msg = only(paged_model(update=_node("PagedCacheUpdate", ["cache", "key", "value", "position"], ["upd"])),
                     "K1")
    assert path == "graph.node[0]('PagedCacheUpdate').output_alias" and "MUST_ALIAS" in msg


# -- K2 ------------------------------------------------------------------------------------------

def test_k2_cache_is_a_struct_with_a_read_write_root():
    found = violations(paged_model(cache_type=tensor_type(FLOAT, [2, H, 32, D])), "K2")
    assert [p for p, _ in found] == ["graph.node[0]('PagedCacheUpdate').input[0]",
                                     "graph.node[1]('PagedAttention').input[1]"]
    assert all("TypeProto.struct_type" in msg for _, msg in found)
    path, msg = only(paged_model(cache_access=0), "K2")
    assert path == "graph.node[0]('PagedCacheUpdate').input[0]" and "READ_ONLY main-graph input 'cache'" in msg


def test_k2_a_reference_must_name_a_cache_container():
    decl = struct_decl(7200, "Other", [("x", tensor_type(FLOAT, []))])
    found = violations(paged_model(cache_type=ref_type(7200), struct_types=(decl,)), "K2")
    assert [p for p, _ in found] == ["graph.node[0]('PagedCacheUpdate').input[0]",
                                     "graph.node[1]('PagedAttention').input[1]"]


# -- K3 ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("key, value, position, where, text", [
    (tensor_type(TensorProto.INT8, [1, H, 1, D]), None, None, "input[1]", "FLOAT, FLOAT16 or BFLOAT16"),
    (tensor_type(FLOAT, [H, 1, D]), tensor_type(FLOAT, [H, 1, D]), None, "input[1]", "rank 3, not 4"),
    (tensor_type(FLOAT, [2, H, 1, D]), tensor_type(FLOAT, [2, H, 1, D]), None, "input[1]", "batch 2"),
    (None, tensor_type(FLOAT, [1, H, "n", 32]), None, "input[2]", "value dimension 3 is 32"),
    (None, tensor_type(TensorProto.FLOAT16, [1, H, "n", D]), None, "input[2]", "value is FLOAT16"),
    (None, None, tensor_type(INT64, [1]), "input[3]", "INT64 []"),
])
def test_k3_key_value_and_position(key, value, position, where, text):
    found = violations(paged_model(key=key, value=value, position=position), "K3")
    assert found and all(p.startswith("graph.node[0]('PagedCacheUpdate').input[") for p, _ in found)
    assert any(p.endswith(where) and text in msg for p, msg in found), found


def test_k3_geometry_and_capacity_of_a_container_reference():
    ref = ref_type(CONTAINER_ID)
    path, msg = only(paged_model(cache_type=ref, struct_types=(_container(),),
                                 key=tensor_type(FLOAT, [1, 3, "n", D]), value=tensor_type(FLOAT, [1, 3, "n", D])),
                     "K3")
    assert path.endswith(".input[1]") and "kv heads) is 3, the cache has 2" in msg
    kv = tensor_type(FLOAT, [1, H, 4, D])

    def constant_position(p: int) -> Any:
        m = paged_model(cache_type=ref, struct_types=(_container(),), key=kv, value=kv,
                        initializers=(numpy_helper.from_array(np.array(p, np.int64), "position"),))
        del m.graph.input[3]  # a constant, not an input's default
        return m

    path, msg = only(constant_position(30), "K3")
    assert path.endswith(".input[3]") and "30 + 4 tokens does not fit the capacity 32" in msg
    assert check(constant_position(28)) == []


# -- K4, K5 ----------------------------------------------------------------------------------------

def test_k4_attention_signature():
    bad = _node("PagedAttention", ["query"], ["out"], num_heads=4, kv_num_heads=2)
    path, _ = only(paged_model(attention=bad), "K4")
    assert path == "graph.node[1]('PagedAttention')"
    path, msg = only(paged_model(query=tensor_type(FLOAT, [4, "n", D])), "K4")
    assert path == "graph.node[1]('PagedAttention').input[0]" and "rank 3" in msg
    m = paged_model(attention=_node("PagedAttention", ["query", "upd", "total"], ["out"], num_heads=4,
                                    kv_num_heads=2))
    m.graph.input.append(_vi("total", tensor_type(TensorProto.INT32, [])))
    path, msg = only(m, "K4")
    assert path.endswith(".input[2]") and "INT64 []" in msg
    m = paged_model(query=tensor_type(TensorProto.FLOAT16, [1, 4, "n", D]))
    path, msg = only(m, "K4")
    assert path == "graph.node[1]('PagedAttention').output[0]" and "query's type" in msg


@pytest.mark.parametrize("attrs, where, text", [
    (dict(kv_num_heads=2), "attribute['num_heads']", "num_heads must be an integer >= 1"),
    (dict(num_heads=4, kv_num_heads=3), "", "not a multiple of kv_num_heads 3"),
    (dict(num_heads=8, kv_num_heads=2), "input[0]", "query has 4 heads, num_heads is 8"),
    (dict(num_heads=4, kv_num_heads=2, scale=-0.5), "attribute['scale']", "finite float > 0"),
])
def test_k5_attention_attributes(attrs, where, text):
    path, msg = only(paged_model(attention=_node("PagedAttention", ["query", "upd"], ["out"], **attrs)), "K5")
    assert path == "graph.node[1]('PagedAttention')" + (f".{where}" if where else "") and text in msg


def test_k5_attributes_against_the_container():
    m = paged_model(cache_type=ref_type(CONTAINER_ID), struct_types=(_container(),),
                    attention=_node("PagedAttention", ["query", "upd"], ["out"], num_heads=4, kv_num_heads=4))
    path, msg = only(m, "K5")
    assert path.endswith(".attribute['kv_num_heads']") and "cache's 2 kv heads" in msg


# -- K6 --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kw, text", [
    (dict(capacity=36), "page size 8 does not divide the capacity 36"),
    (dict(d=48), "D=48 is not a multiple of 32"),
    (dict(p=6, capacity=36), "P=6 is not a multiple of 4"),
    (dict(formats="float32,q3"), "unknown formats ['q3']"),
    (dict(h=0), "page_shape"),
])
def test_k6_container_declaration(kw, text):
    m = paged_model(cache_type=ref_type(CONTAINER_ID), struct_types=(_container(**kw),))
    found = violations(m, "K6")
    assert found and all(p == f"model.struct_types[0](type_id={CONTAINER_ID})" for p, _ in found)
    assert any(text in msg for _, msg in found), found


# -- K7-K9: the serialized cache ---------------------------------------------------------------------

def _wire(length: int = 13, fmts: tuple = ("float32", "int4", None, None)) -> Any:
    rng = np.random.default_rng(0)
    pages = tuple(None if f is None else (f, kp.encode_page(f, rng.standard_normal((2, H, P, D)).astype(np.float32)))
                  for f in fmts)
    return kc.cache_to_proto({"cache": kc.PagedCacheValue(H, D, P, len(fmts), length, pages)})


def _decl_index(m: Any, name: str) -> int:
    return [s.name for s in m.struct_types].index(name)


def test_k7_unknown_format_name():
    m = _wire()
    m.struct_types[_decl_index(m, "ONNXFORGE_KV_INT4_PAGE")].name = "ONNXFORGE_KV_INT3_PAGE"
    path, msg = only(m, "K7")
    assert path == "graph.encoded_initializer['cache.pages[1]']"
    assert "page 1 of cache 'cache'" in msg and "'ONNXFORGE_KV_INT3_PAGE' is not a page format" in msg


def test_k7_a_format_name_on_another_structure():
    m = _wire(fmts=("float32", "int8", None, None))
    # an int8 name on an int4-shaped declaration: the int8 decoder would misread it
    i = _decl_index(m, "ONNXFORGE_KV_INT8_PAGE")
    tid = m.struct_types[i].type_id
    m.struct_types[i].CopyFrom(kp.page_struct_types("int4", H, P, D, first_id=tid)[0])
    m.struct_types[i].name = "ONNXFORGE_KV_INT8_PAGE"
    m.graph.encoded_initializer[1].raw_data = bytes(kp.page_nbytes("int4", H, P, D))
    path, msg = only(m, "K7")
    assert path == "graph.encoded_initializer['cache.pages[1]'].struct_type" and "format's structure" in msg


def test_k7_codebook_table_is_the_formats():
    m = _wire(fmts=("float32", "codebook", None, None))
    block = m.struct_types[_decl_index(m, "CODEBOOK2_BLOCK_32")]
    block.structure.field[1].constant.CopyFrom(schema.from_onnx(numpy_helper.from_array(
        np.array([-1, -0.5, 0.5, 1], np.float32))))
    path, msg = only(m, "K7")
    assert path.endswith("['cache.pages[1]'].struct_type") and "codebook table" in msg


def test_k8_a_page_of_another_type_or_shape():
    m = _wire()
    m.graph.encoded_initializer[1].logical_type.tensor_type.shape.dim[3].dim_value = 32
    path, msg = only(m, "K8")
    assert path == "graph.encoded_initializer['cache.pages[1]'].logical_type" and "page 1" in msg
    m = _wire()
    m.graph.encoded_initializer[0].logical_type.tensor_type.elem_type = TensorProto.FLOAT16
    path, msg = only(m, "K8")
    assert path == "graph.encoded_initializer['cache.pages[0]'].logical_type" and "FLOAT[2, 2, 8, 64]" in msg


def test_k8_a_page_whose_layout_decodes_to_another_shape():
    m = _wire(fmts=("float32", "int8", None, None))
    # int8 rows of D=128 records: 2*H*P*(4+128) bytes decode to a page twice as wide
    i = _decl_index(m, "ONNXFORGE_KV_INT8_PAGE")
    tid = m.struct_types[i].type_id
    m.struct_types[i].CopyFrom(kp.page_struct_types("int8", H, P, 128, first_id=tid)[0])
    m.graph.encoded_initializer[1].raw_data = bytes(kp.page_nbytes("int8", H, P, 128))
    path, msg = only(m, "K8")
    assert path == "graph.encoded_initializer['cache.pages[1]'].struct_type"
    assert "page 1 of cache 'cache'" in msg and "D=128" in msg
    # float32 records of any width: only the count of values can differ
    m = _wire()
    m.graph.encoded_initializer[0].raw_data = bytes(2 * H * P * D * 4 * 2)
    path, msg = only(m, "K8")
    assert path == "graph.encoded_initializer['cache.pages[0]']" and "decode to 4096 values" in msg


def test_k8_a_page_value_outside_a_cache():
    decls = kp.page_struct_types("int4", 1, 4, 32, first_id=3001)
    payload = kp.encode_page("int4", np.ones((2, 1, 4, 32), np.float32))
    good = kp.page_encoded_value("int4", payload, 1, 4, 32, 3001, name="p")
    assert check(model_with(struct_types=decls, encoded=[good])) == []
    bad = kp.page_encoded_value("int4", payload, 1, 4, 32, 3001, name="p")
    bad.logical_type.tensor_type.shape.dim[2].dim_value = 8  # claims 8 tokens, holds 4
    path, msg = only(model_with(struct_types=decls, encoded=[bad]), "K8")
    assert path == "graph.encoded_initializer['p']" and "decode to 256 values" in msg


def test_k9_page_ids_and_length():
    m = _wire()
    m.graph.encoded_initializer[1].name = "cache.pages[4]"
    found = violations(m, "K9")
    assert ("graph.encoded_initializer['cache.pages[4]']",
            "page 4 of cache 'cache': page id 4 is outside [0, 4)") in found
    assert any("page 1 holds tokens below length 13 but is missing" in msg for _, msg in found)
    m = _wire()
    m.graph.initializer[0].CopyFrom(schema.from_onnx(numpy_helper.from_array(np.array(33, np.int64),
                                                                             "cache.length")))
    path, msg = only(m, "K9")
    assert path == "graph.initializer['cache.length']" and "length 33 is outside [0, capacity=32]" in msg
    m = _wire()
    del m.graph.initializer[:]
    path, msg = only(m, "K9")
    assert path == "graph.initializer['cache.length']" and "valid length" in msg


def test_k9_missing_pages_above_the_length_are_fine():
    assert check(_wire(length=16, fmts=("int4", "int4", None, None))) == []
    m = _wire(length=16, fmts=("int4", "int4", None, None))
    m.graph.initializer[0].CopyFrom(schema.from_onnx(numpy_helper.from_array(np.array(17, np.int64),
                                                                             "cache.length")))
    assert violations(m, "K9") == [
        ("graph.encoded_initializer", "cache 'cache': page 2 holds tokens below length 17 but is missing")]


def test_rules_paged_md_lists_the_module_rules():
    import pathlib

    from onnxforge.proto_ext.verify import paged_rules

    doc = [line for line in (paged_rules.__doc__ or "").splitlines() if line.startswith("- K")]
    md = pathlib.Path(paged_rules.__file__).with_name("RULES_PAGED.md").read_text().splitlines()
    assert [f"K{i}" for i in range(1, 13)] == [line.split()[1] for line in doc]
    assert doc == [line for line in md if line.startswith("- K") and not line.startswith("- KR")]
