"""PagedCacheUpdate and PagedAttention: schemas, builder defaults, shape rules, effects, export."""
from __future__ import annotations

import numpy as np
import onnx.defs
import pytest
from onnx import TensorProto

import onnxforge as of
from onnxforge.graphbuilder.builder.graph_builder import READ_WRITE, GraphBuilder
from onnxforge.graphbuilder.ir.core import Alias, Attr, AttrType, Graph, Model, Node, Value
from onnxforge.graphbuilder.builder.opschemas import ONNXFORGE_DOMAIN, SchemaCheckError
from onnxforge.graphbuilder.serde import to_onnx
from onnxforge.graphbuilder.shapes.symtensor import ShapeError
from onnxforge.passes import DeadCodeEliminationPass, TopologicalSortPass, check_invariants
from onnxforge.proto_ext.codecs.kvcache import cache_declaration
from onnxforge.proto_ext.errors import ExportError
from onnxforge.proto_ext.types import StructType, TensorType

FLOAT, FLOAT16, INT64 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.INT64
CATEGORY = StructType()


def _builder(dtype=np.float32, kv_shape=(1, 2, "n", 64), q_shape=(1, 4, "n", 64), cache_type=CATEGORY):
    g = GraphBuilder(23)
    cache = g.input("cache", type=cache_type, access=READ_WRITE)
    k = g.input("key", dtype, list(kv_shape))
    v = g.input("value", dtype, list(kv_shape))
    pos = g.input("position", np.int64, [])
    q = g.input("query", dtype, list(q_shape))
    return g, cache, k, v, pos, q


def _step_model(**kw) -> tuple[GraphBuilder, Value, Value]:
    g, cache, k, v, pos, q = _builder(**kw)
    upd = g.op.PagedCacheUpdate(cache, k, v, pos)
    out = g.op.PagedAttention(q, upd, num_heads=4, kv_num_heads=2)
    g.output(out, "out")
    g.output(upd, "next_cache")
    g.bind(cache, "next_cache")
    return g, upd, out


def test_schemas_are_registered_with_documented_signatures():
    upd = onnx.defs.get_schema("PagedCacheUpdate", 1, ONNXFORGE_DOMAIN)
    assert [i.name for i in upd.inputs] == ["cache", "key", "value", "position"]
    assert [o.name for o in upd.outputs] == ["updated_cache"] and "MUST_ALIAS" in upd.doc
    att = onnx.defs.get_schema("PagedAttention", 1, ONNXFORGE_DOMAIN)
    assert [i.name for i in att.inputs] == ["query", "cache", "total_length"]
    assert (att.min_input, att.max_input) == (2, 3)
    assert sorted(att.attributes) == ["kv_num_heads", "num_heads", "scale"]
    assert att.attributes["num_heads"].required and not att.attributes["scale"].required


def test_builder_reaches_both_ops_and_aliases_the_update():
    g, upd, out = _step_model()
    node = upd.producer()
    assert (node.domain, node.op_type) == (ONNXFORGE_DOMAIN, "PagedCacheUpdate")
    assert node.output_alias == [Alias(0, 0)]
    assert out.producer().output_alias == []
    assert g.model.opset_imports[ONNXFORGE_DOMAIN] == 1
    assert g.model.graph.outputs[1].alias_of is not None


def test_updated_cache_keeps_the_cache_type_and_attention_the_query_type():
    _, upd, out = _step_model()
    assert upd.type == CATEGORY
    assert str(out.type) == "FLOAT[1, 4, n, 64]"  # the query's symbolic shape
    _, upd, out = _step_model(dtype=np.float16, kv_shape=(1, 2, 3, 64), q_shape=(1, 4, 3, 64))
    assert out.type == TensorType(FLOAT16, (1, 4, 3, 64))
    decl = cache_declaration(2, 8, 64, 4, type_id=7001)
    ref = StructType(kind="type_ref", type_ref=7001)
    g, cache, k, v, pos, q = _builder(cache_type=ref)
    g.model.struct_types.append(decl)
    assert g.op.PagedCacheUpdate(cache, k, v, pos).type == ref


def test_the_built_model_verifies_and_round_trips():
    g, _, _ = _step_model()
    m = g.to_model()
    assert of.check(m) == []
    assert of.check(to_onnx(m)) == []


@pytest.mark.parametrize("kw, op, text", [
    (dict(kv_shape=(1, 2, 3)), "update", "rank 4"),
    (dict(kv_shape=(2, 2, 3, 64)), "update", "batch"),
    (dict(dtype=np.int8), "update", "element type INT8"),
    (dict(q_shape=(1, 8, "n", 64)), "attention", "num_heads"),
    (dict(cache_type=TensorType(FLOAT, (2, 2, 8, 64))), "update", "struct value"),
])
def test_shape_rules_reject_bad_inputs(kw, op, text):
    g, cache, k, v, pos, q = _builder(**kw)
    with pytest.raises(ShapeError, match=text):
        if op == "update":
            g.op.PagedCacheUpdate(cache, k, v, pos)
        else:
            g.op.PagedAttention(q, cache, num_heads=4, kv_num_heads=2)
    assert not any(n.op_type.startswith("Paged") for n in g.model.graph)  # a failed call adds nothing


def test_position_and_total_length_are_int64_scalars():
    g, cache, k, v, _, q = _builder()
    bad = g.input("bad", np.int64, [1])
    with pytest.raises(ShapeError, match="position must be a scalar"):
        g.op.PagedCacheUpdate(cache, k, v, bad)
    with pytest.raises(ShapeError, match="total_length must be a scalar"):
        g.op.PagedAttention(q, cache, bad, num_heads=4, kv_num_heads=2)
    with pytest.raises(ShapeError, match="not a multiple of kv_num_heads 3"):
        g.op.PagedAttention(q, cache, num_heads=4, kv_num_heads=3)


def test_attention_requires_its_head_attributes():
    g, cache, _, _, _, q = _builder()
    with pytest.raises(SchemaCheckError, match="requires attribute 'num_heads'"):
        g.op.PagedAttention(q, cache, kv_num_heads=2)


# -- effects: the passes treat PagedCacheUpdate like CacheUpdate --------------------------------------

def test_dce_keeps_an_update_whose_output_nobody_reads():
    g, cache, k, v, pos, q = _builder()
    g.op.PagedCacheUpdate(cache, k, v, pos)  # writes the caller's cache; output unused
    g.output(g.op.Relu(q), "y")
    m = g.to_model()
    assert not DeadCodeEliminationPass()(m).modified
    assert [n.op_type for n in m.graph] == ["PagedCacheUpdate", "Relu"]
    assert check_invariants(m) == []


def _reader_after_writer() -> tuple[Model, dict[str, Node]]:
    g = Graph("g")
    cache = g.add_input(Value("cache", CATEGORY, access=READ_WRITE))
    kv = TensorType(FLOAT, (1, 2, 1, 64))
    k, v = g.add_input(Value("key", kv)), g.add_input(Value("value", kv))
    pos = g.add_input(Value("pos", TensorType(INT64, ())))
    q = g.add_input(Value("q", TensorType(FLOAT, (1, 4, 1, 64))))
    w = Node(ONNXFORGE_DOMAIN, "PagedCacheUpdate", [cache, k, v, pos], [Value("upd", CATEGORY)], name="W",
             output_alias=[Alias(0, 0)])
    qt = TensorType(FLOAT, (1, 4, 1, 64))
    heads = [Attr("num_heads", AttrType.INT, 4), Attr("kv_num_heads", AttrType.INT, 2)]
    old = Node(ONNXFORGE_DOMAIN, "PagedAttention", [q, cache], [Value("old", qt)], name="R", attributes=heads)
    new = Node(ONNXFORGE_DOMAIN, "PagedAttention", [q, w.outputs[0]], [Value("new", qt)], name="R2",
               attributes=list(heads))
    nodes = {"W": w, "R": old, "R2": new}
    for name in ("W", "R2", "R"):  # the reader of the old version is listed after the write
        g.append(nodes[name])
    g.outputs.extend([old.outputs[0], new.outputs[0]])
    return Model(g, opset_imports={"": 23, ONNXFORGE_DOMAIN: 1}), nodes


def test_topological_order_puts_readers_of_the_old_version_before_the_update():
    m, _ = _reader_after_writer()
    assert TopologicalSortPass()(m).modified
    order = [n.name for n in m.graph]
    assert order.index("R") < order.index("W") < order.index("R2")
    assert check_invariants(m) == []
    assert of.check(to_onnx(m)) == []  # L13 holds in the sorted model


# -- export ---------------------------------------------------------------------------------------------

def test_standard_export_rejects_both_ops_naming_the_node_and_why():
    g, _, _ = _step_model()
    with pytest.raises(ExportError) as info:
        of.to_standard_onnx(g.to_model())
    text = str(info.value)
    for path in ("graph.node[0]('PagedCacheUpdate')", "graph.node[1]('PagedAttention')"):
        line = next(x for x in text.splitlines() if path in x)
        assert "cannot be exported: a paged KV cache has no standard ONNX form" in line
