"""make_stateful on torch.onnx decoders (opset 20 and 23): Concat-based caches become
in-place CacheUpdate buffers that Attention reads through prefix views."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto
from onnxforge.graphbuilder.builder.graph_builder import GraphBuilder
from onnxforge.graphbuilder.ir.core import MUST_ALIAS, READ_WRITE
from onnxforge.passes.rewrites.attention_fusion import fuse_attention
from onnxforge.passes.stateful.convert import StatefulError, make_stateful

import onnxforge as of

FAMILIES = ["torch20", "torch23"]
PROMPT = [5, 17, 42, 7, 99]
CAPACITY = 16


def _past_feeds(sess) -> dict[str, np.ndarray]:
    return {i.name: np.zeros((1, 2, 0, 32), np.float32) for i in sess.get_inputs()
            if i.name.startswith("past_key_values")}


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_concat_caches_become_in_place_updates_read_through_views(decoder_models, family):
    model = make_stateful(str(decoder_models[family]), max_length=CAPACITY, batch=1)
    g = model.graph
    assert model.opset_imports[""] == 23 and model.opset_imports["ai.onnxforge"] == 1
    assert len(g.bindings) == 8
    for past, present in g.bindings:
        assert past.access == READ_WRITE and present.alias_of is past
        assert past.type.shape == (1, 2, CAPACITY, 32) and present.type == past.type
        node = present.producer()
        assert (node.domain, node.op_type) == ("ai.onnxforge", "CacheUpdate")
        assert [(a.output_index, a.input_index, a.kind) for a in node.output_alias] == [(0, 0, MUST_ALIAS)]
        assert [n.op_type for n in past.consumers()] == ["CacheUpdate"]  # no Shape reads the capacity
        views = present.consumers()
        assert [n.op_type for n in views] == ["Slice"]
        assert {n.op_type for n, _ in views[0].outputs[0].uses()} == {"Attention"}
    ops = [n.op_type for n in g]
    assert "Concat" not in {n.op_type for p, _ in g.bindings for n in p.consumers()}
    assert ops.count("Attention") == 4 and "Softmax" not in ops and "Expand" not in {
        n.op_type for n in g if any(i is not None and i.producer() is not None
                                    and i.producer().op_type == "Slice" for i in n.inputs)}
    of.verify(model)


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_the_standard_export_runs_in_onnxruntime_like_the_original(decoder_models, family, tmp_path):
    path = decoder_models[family]
    model = make_stateful(str(path), max_length=CAPACITY, batch=1)
    from onnxforge.passes.export import export_to_dir

    written = export_to_dir(model, tmp_path / "std")
    feedback = json.loads(Path(written["feedback"]).read_text())
    assert feedback == {f"past_key_values.{l}.{k}": f"present.{l}.{k}" for l in range(4)
                        for k in ("key", "value")}
    std = ort.InferenceSession(written["model"], providers=["CPUExecutionProvider"])
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    std_names = [o.name for o in std.get_outputs()]
    ref_names = [o.name for o in ref.get_outputs()]
    state = {i.name: np.zeros((1, 2, CAPACITY, 32), np.float32) for i in std.get_inputs() if i.name in feedback}
    past = _past_feeds(ref)
    ids, total = PROMPT, 0
    for _ in range(6):
        total += len(ids)
        feeds = {"input_ids": np.array([ids], np.int64), "attention_mask": np.ones((1, total), np.int64)}
        a = dict(zip(std_names, std.run(None, {**feeds, **state})))
        b = dict(zip(ref_names, ref.run(None, {**feeds, **past})))
        np.testing.assert_allclose(a["logits"], b["logits"], atol=1e-4, rtol=0)
        state = {i: a[o] for i, o in feedback.items()}
        past = {k: b[k.replace("past_key_values", "present")] for k in past}
        ids = [int(b["logits"][0, -1].argmax())]


@pytest.mark.slow
def test_the_decomposed_attention_fuses_into_standard_attention(decoder_models):
    from onnxforge.graphbuilder import serde

    path = decoder_models["torch20"]
    model = serde.load(str(path))
    assert fuse_attention(model) == 4
    assert model.opset_imports[""] == 23
    ops = [n.op_type for n in model.graph]
    assert ops.count("Attention") == 4 and "Softmax" not in ops and "IsNaN" not in ops
    rng = np.random.default_rng(0)
    feeds = {"input_ids": rng.integers(0, 512, (1, 3)), "attention_mask": np.ones((1, 7), np.int64)}
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds.update({i.name: rng.standard_normal((1, 2, 4, 32)).astype(np.float32)
                  for i in ref.get_inputs() if i.name.startswith("past")})
    fused = ort.InferenceSession(serde.to_onnx(model).SerializeToString(), providers=["CPUExecutionProvider"])
    for a, b in zip(ref.run(None, feeds), fused.run(None, feeds)):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)


def _concat_cache_model(reader: str):
    """past -> Concat -> present, the present read by ``reader`` (a decomposed attention)."""
    g = GraphBuilder(opset=20)
    ids = g.input("input_ids", TensorProto.INT64, [1, "seq"])
    g.input("attention_mask", TensorProto.INT64, [1, "total"])
    q = g.input("q", TensorProto.FLOAT, [1, 2, "seq", 4])
    k = g.input("k", TensorProto.FLOAT, [1, 2, "seq", 4])
    past = g.input("past_key_values.0.key", TensorProto.FLOAT, [1, 2, "past", 4])
    present = g.op.Concat(past, k, axis=-2)
    g.output(present, "present.0.key")
    if reader == "matmul":
        y = g.op.MatMul(q, g.op.Transpose(present, perm=[0, 1, 3, 2]))
    else:
        y = g.op.Neg(present)
    g.output(y, "y")
    g.output(g.op.Cast(ids, to=TensorProto.FLOAT), "ids_f")
    return g.to_model()


def test_an_unrecognized_attention_over_the_cache_is_a_typed_error_naming_the_node():
    with pytest.raises(StatefulError, match=r"present\.0\.key.*Transpose.*not recognized"):
        make_stateful(_concat_cache_model("matmul"), max_length=8)
    with pytest.raises(StatefulError, match=r"present\.0\.key.*Neg"):
        make_stateful(_concat_cache_model("neg"), max_length=8)


def test_a_past_read_by_another_node_is_a_typed_error_naming_it():
    g = GraphBuilder(opset=23)
    g.input("input_ids", TensorProto.INT64, [1, "seq"])
    g.input("attention_mask", TensorProto.INT64, [1, "total"])
    past = g.input("past_key_values.0.key", TensorProto.FLOAT, [1, 2, "past", 4])
    k = g.input("k", TensorProto.FLOAT, [1, 2, "seq", 4])
    g.output(g.op.Concat(past, k, axis=-2), "present.0.key")
    g.output(g.op.ReduceSum(past), "s")
    with pytest.raises(StatefulError, match=r"past_key_values\.0\.key.*ReduceSum"):
        make_stateful(g.to_model(), max_length=8)


def test_a_pair_without_a_rewrite_needs_explicit_bindings():
    from onnxforge.samples import build_builtin

    g = GraphBuilder(opset=23)
    past = g.input("past_key_values.0.key", TensorProto.FLOAT, [1, 4])
    x = g.input("x", TensorProto.FLOAT, [1, 4])
    g.output(g.op.Add(past, x), "present.0.key")
    with pytest.raises(StatefulError, match=r"present\.0\.key.*Add.*bindings="):
        make_stateful(g.to_model(), max_length=4)
    with pytest.raises(StatefulError, match=r"bindings\['state'\] = 'y'.*dimension 1"):
        make_stateful(build_builtin("rnn"), max_length=1, bindings={"state": "y"})


@pytest.mark.slow
def test_a_fusion_that_would_change_another_operator_is_refused_unchanged(decoder_models, monkeypatch):
    from onnxforge.graphbuilder import serde
    from onnxforge.passes.rewrites import attention_fusion

    monkeypatch.setattr(attention_fusion, "SEMANTIC_CHANGES", frozenset({"Cos"}))
    model = serde.load(str(decoder_models["torch20"]))
    with pytest.raises(attention_fusion.AttentionFusionError,
                       match=r"node\('node_cos'\): Cos changed.*Softmax"):
        fuse_attention(model)
    assert [n.op_type for n in model.graph].count("Softmax") == 4 and model.opset_imports[""] == 20
    with pytest.raises(StatefulError, match="decomposed attention cannot be fused"):
        make_stateful(str(decoder_models["torch20"]), max_length=8)
