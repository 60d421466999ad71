"""torch.onnx decoders (opset 20 and 23) made stateful decode through make_state like
onnxruntime on the original past/present model, with the caches updated in place."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto
from onnxforge.graphbuilder.builder.graph_builder import GraphBuilder
from onnxforge.graphbuilder.ir.core import READ_WRITE
from onnxforge.kernels_cy.errors import BackendError
from onnxforge.kernels_cy.runtime.session import InferenceSession
from onnxforge.kernels_cy.runtime.state import make_state
from onnxforge.passes.stateful.convert import make_stateful

import onnxforge as of
from tests.kernels_cy.helpers import ort_greedy

PROMPT = [5, 17, 42, 7, 99]
NEW = 16
CAPACITY = len(PROMPT) + NEW
FAMILIES = ["torch20", "torch23"]


def _decode(state, prompt: list[int], new: int):
    ids, total, tokens, logits, counters, addresses = prompt, 0, [], [], [], []
    for _ in range(new):
        total += len(ids)
        out = state.run({"input_ids": np.array([ids], np.int64),
                         "attention_mask": np.ones((1, total), np.int64)})
        logits.append(out["logits"][0, -1].copy())
        ids = [int(out["logits"][0, -1].argmax())]
        tokens.append(ids[0])
        counters.append(state.last_run)
        addresses.append(state.addresses())
    return tokens, logits, counters, addresses


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_stateful_torch_decoder_decodes_like_onnxruntime_in_place(decoder_models, family):
    path = decoder_models[family]
    expected_tokens, expected_logits = ort_greedy(path, PROMPT, NEW)
    model = make_stateful(str(path), max_length=CAPACITY, batch=1)
    of.verify(model)
    st = make_state(model)
    start = st.addresses()
    tokens, logits, counters, addresses = _decode(st, PROMPT, NEW)
    assert tokens == expected_tokens
    for got, want in zip(logits, expected_logits):
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
    assert all(a == start for a in addresses), "a cache buffer moved"
    assert [c.copied_bytes for c in counters] == [0] * NEW
    cache_bytes = 8 * 2 * CAPACITY * 32 * 4
    assert {c.cache_bytes for c in counters} == {cache_bytes}
    # every one-token step allocates exactly the same bytes: nothing grows with the context
    steps = [c.allocated_bytes for c in counters[1:]]
    assert len(set(steps)) == 1, steps
    # the valid prefix of each cache is what onnxruntime's present holds
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    seq = PROMPT + tokens[:-1]
    ref = dict(zip(names, sess.run(None, {
        "input_ids": np.array([seq], np.int64), "attention_mask": np.ones((1, len(seq)), np.int64),
        **{i.name: np.zeros((1, 2, 0, 32), np.float32) for i in sess.get_inputs()
           if i.name.startswith("past_key_values")}})))
    for name, value in st.values.items():
        np.testing.assert_allclose(value[:, :, :len(seq)], ref[name.replace("past_key_values", "present")],
                                   atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_optimized_stateful_torch_decoder_decodes_the_same(decoder_models, family):
    model = make_stateful(str(decoder_models[family]), max_length=CAPACITY, batch=1)
    tokens, logits, _, _ = _decode(make_state(model), PROMPT, 6)
    optimized = of.optimize(model)
    of.verify(optimized)
    assert len(optimized.graph.bindings) == 8
    tokens2, logits2, counters, _ = _decode(make_state(optimized), PROMPT, 6)
    assert tokens2 == tokens
    for a, b in zip(logits, logits2):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
    assert all(c.copied_bytes == 0 for c in counters)


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_capacity_overflow_is_typed_and_leaves_the_state_unchanged(decoder_models, family):
    capacity = len(PROMPT) + 2
    st = make_state(make_stateful(str(decoder_models[family]), max_length=capacity, batch=1))
    st.run({"input_ids": np.array([PROMPT], np.int64),
            "attention_mask": np.ones((1, len(PROMPT)), np.int64)})
    before = {k: v.copy() for k, v in st.values.items()}
    addresses = st.addresses()
    with pytest.raises(BackendError, match="capacity"):  # 5 + 3 new tokens > 7
        st.run({"input_ids": np.array([[1, 2, 3]], np.int64),
                "attention_mask": np.ones((1, len(PROMPT) + 3), np.int64)})
    assert st.addresses() == addresses
    for k, v in st.values.items():
        np.testing.assert_array_equal(v, before[k])
    out = st.run({"input_ids": np.array([[7]], np.int64),
                  "attention_mask": np.ones((1, len(PROMPT) + 1), np.int64)})
    assert np.isfinite(out["logits"]).all()


def _grouped_reference(q, k, v, mask, scale):
    """float64 softmax(q k^T * scale + mask) v with query head h reading kv head h // group."""
    q, k, v = (a.astype(np.float64) for a in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    s = q @ np.swapaxes(k, 2, 3) * scale + np.where(mask, 0.0, -np.inf)
    s -= s.max(-1, keepdims=True)
    p = np.exp(s)
    return (p / p.sum(-1, keepdims=True)) @ v


@pytest.mark.parametrize("queries", [1, 3])
def test_attention_reads_a_strided_cache_view_with_grouped_heads_without_copies(queries):
    capacity, total, heads, kv_heads, dim = 16, 7, 4, 2, 8
    g = GraphBuilder(opset=23)
    q = g.input("q", TensorProto.FLOAT, [1, heads, queries, dim])
    cache_k = g.input("k", TensorProto.FLOAT, [1, kv_heads, capacity, dim])
    cache_v = g.input("v", TensorProto.FLOAT, [1, kv_heads, capacity, dim])
    mask = g.input("mask", TensorProto.BOOL, [1, 1, queries, capacity])
    ends = g.input("total", TensorProto.INT64, [1])
    zero, axis, last = (g.initializer(n, np.array([a], np.int64)) for n, a in
                        (("zero", 0), ("axis", 2), ("last", -1)))
    kv = [g.op.Slice(c, zero, ends, axis) for c in (cache_k, cache_v)]
    y = g.op.Attention(q, *kv, g.op.Slice(mask, zero, ends, last), scale=0.3)
    g.output(y, "y")
    rng = np.random.default_rng(0)
    feeds = {"q": rng.standard_normal((1, heads, queries, dim)).astype(np.float32),
             "k": rng.standard_normal((1, kv_heads, capacity, dim)).astype(np.float32),
             "v": rng.standard_normal((1, kv_heads, capacity, dim)).astype(np.float32),
             "mask": np.tril(np.ones((queries, capacity), bool), total - queries)[None, None],
             "total": np.array([total], np.int64)}
    sess = InferenceSession(g.to_model())
    (got,) = sess.run(None, feeds)
    want = _grouped_reference(feeds["q"], feeds["k"][:, :, :total], feeds["v"][:, :, :total],
                              feeds["mask"][..., :total], 0.3)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    assert sess.last_run.copied_bytes == 0
    assert sess.last_run.allocated_bytes == got.nbytes  # the output only: K and V are read in place


def test_a_state_fed_back_without_an_in_place_rewrite_decodes_like_a_manual_loop():
    from onnxforge.samples import build_builtin

    model = build_builtin("rnn")
    proto = of.to_standard_onnx(model)
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    stateful = make_stateful(build_builtin("rnn"), max_length=1, bindings={"state": "stateN"})
    assert [(i.name, o.name) for i, o in stateful.graph.bindings] == [("state", "stateN")]
    assert stateful.graph.inputs[1].access != READ_WRITE  # bound, not rewritten in place
    of.verify(stateful)
    st = make_state(stateful)
    rng = np.random.default_rng(1)
    h = np.zeros((1, 8), np.float32)
    for _ in range(6):
        x = rng.standard_normal((1, 4)).astype(np.float32)
        y_ref, h = sess.run(["y", "stateN"], {"x": x, "state": h})
        out = st.run({"x": x})
        np.testing.assert_allclose(out["y"], y_ref, atol=1e-6, rtol=0)
        np.testing.assert_allclose(st.values["state"], h, atol=1e-6, rtol=0)


@pytest.mark.slow
def test_generate_converts_a_torch_decoder_first(decoder_models):
    from onnxforge.commands.generate import generate

    path = decoder_models["torch20"]
    expected, _ = ort_greedy(path, PROMPT, 6)
    report = generate(str(path), PROMPT, 6, progress=False)
    assert report["tokens"] == expected
    assert report["copied_bytes"] == [0] * 6
    assert all(a == report["cache_addresses"][0] for a in report["cache_addresses"])
    assert len(set(report["allocated_bytes"][1:])) == 1


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_a_padded_batch_of_two_decodes_like_onnxruntime(decoder_models, family):
    path = decoder_models[family]
    st = make_state(make_stateful(str(path), max_length=24), dims={"batch": 2})
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    past = {i.name: np.zeros((2, 2, 0, 32), np.float32) for i in sess.get_inputs()
            if i.name.startswith("past_key_values")}
    ids, total, counters = np.array([[5, 17, 42, 7], [1, 2, 3, 4]], np.int64), 0, []
    for _ in range(5):
        total += ids.shape[1]
        mask = np.ones((2, total), np.int64)
        mask[1, 0] = 0  # row 1 is left-padded by one position
        ref = dict(zip(names, sess.run(None, {"input_ids": ids, "attention_mask": mask, **past})))
        past = {k: ref[k.replace("past_key_values", "present")] for k in past}
        out = st.run({"input_ids": ids, "attention_mask": mask})
        np.testing.assert_allclose(out["logits"], ref["logits"], atol=1e-4, rtol=0)
        counters.append(st.last_run)
        ids = ref["logits"][:, -1].argmax(-1)[:, None].astype(np.int64)
    assert all(c.copied_bytes == 0 for c in counters)
    assert len({c.allocated_bytes for c in counters[1:]}) == 1
