"""Acceptance on the medium decoder (hidden 512, 8 layers, 8 heads, 4 KV heads, head_dim 64):
make_stateful on the onnxruntime-genai export decodes the same greedy tokens as onnxruntime on
the original past/present model, in place."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnxforge.kernels_cy.runtime.state import make_state
from onnxforge.passes.stateful.convert import make_stateful

from tests.conftest import decoder_fixture_dir
from tests.fixtures.decoders import MEDIUM_QWEN3, build_all
from tests.kernels_cy.helpers import ort_greedy

PROMPT = [5, 17, 42, 7, 99, 3, 250, 11]
STEPS = 16
CAPACITY = 64


@pytest.fixture(scope="module")
def medium_path() -> Path:
    return build_all(decoder_fixture_dir(), which="genai_medium")["genai_medium"]


@pytest.mark.slow
def test_medium_decoder_decodes_like_onnxruntime_in_place(medium_path: Path):
    expected_tokens, expected_logits = ort_greedy(medium_path, PROMPT, STEPS,
                                                  kv_heads=MEDIUM_QWEN3["num_key_value_heads"],
                                                  head_dim=MEDIUM_QWEN3["head_dim"])
    model = make_stateful(str(medium_path), max_length=CAPACITY, batch=1)
    kv, h, layers = (MEDIUM_QWEN3[k] for k in ("num_key_value_heads", "head_dim", "num_hidden_layers"))
    assert [p.type.shape for p, _ in model.graph.bindings] == [(1, kv, CAPACITY, h)] * (2 * layers)
    st = make_state(model, threads=2)
    addresses = st.addresses()
    assert len(addresses) == 2 * layers
    ids, total, tokens, counters = PROMPT, 0, [], []
    for step in range(STEPS):
        total += len(ids)
        out = st.run({"input_ids": np.array([ids], np.int64), "attention_mask": np.ones((1, total), np.int64)})
        assert st.addresses() == addresses, f"step {step}: a cache buffer moved"
        assert set(st.lengths.values()) == {total}, f"step {step}: published lengths {st.lengths}"
        np.testing.assert_allclose(out["logits"][0, -1], expected_logits[step], atol=1e-4, rtol=0)
        ids = [int(out["logits"][0, -1].argmax())]
        tokens.append(ids[0])
        counters.append(st.last_run)
    assert tokens == expected_tokens
    assert all(c.copied_bytes == 0 for c in counters)
    cache_bytes = 2 * layers * kv * CAPACITY * h * 4
    assert {c.cache_bytes for c in counters} == {cache_bytes}
    # one-token steps at contexts 9 ... 23 allocate the same bytes: nothing grows with the context
    assert len({c.allocated_bytes for c in counters[1:]}) == 1
    assert counters[1].allocated_bytes < cache_bytes


@pytest.mark.slow
def test_medium_decoder_runs_on_the_backend_like_onnxruntime(medium_path: Path):
    """A 64-token prompt, then 16 greedy steps feeding present back as past, on
    InferenceSession over the original (stateless) model: prefill and decode logits
    within 1e-4 of onnxruntime's, the same tokens."""
    import onnxruntime as ort
    from onnxforge.kernels_cy.runtime.session import InferenceSession

    kv, h = MEDIUM_QWEN3["num_key_value_heads"], MEDIUM_QWEN3["head_dim"]
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    peer = ort.InferenceSession(str(medium_path), opts, providers=["CPUExecutionProvider"])
    ours = InferenceSession(str(medium_path), threads=2)
    names = [o.name for o in peer.get_outputs()]
    past = {i.name: np.zeros((1, kv, 0, h), np.float32) for i in peer.get_inputs()
            if i.name.startswith("past_key_values")}
    ids = [(7 * i + 3) % MEDIUM_QWEN3["vocab_size"] for i in range(64)]
    total, ours_past, peer_past = 0, dict(past), dict(past)
    for step in range(17):
        total += len(ids)
        common = {"input_ids": np.array([ids], np.int64), "attention_mask": np.ones((1, total), np.int64)}
        want = dict(zip(names, peer.run(None, {**common, **peer_past})))
        got = dict(zip(names, ours.run(None, {**common, **ours_past})))
        np.testing.assert_allclose(got["logits"], want["logits"], atol=1e-4, rtol=0, err_msg=f"step {step}")
        peer_past = {k: want[k.replace("past_key_values", "present")] for k in past}
        ours_past = {k: np.asarray(got[k.replace("past_key_values", "present")]) for k in past}
        a, b = int(got["logits"][0, -1].argmax()), int(want["logits"][0, -1].argmax())
        assert a == b, f"step {step}: token {a} vs onnxruntime's {b}"
        ids = [a]


@pytest.mark.slow
def test_medium_decoder_with_paged_int8_pages_keeps_the_greedy_tokens(medium_path: Path):
    """Paged float32 pages give the contiguous logits (1e-4); with int8 pages, 16 free-running
    greedy tokens agree with onnxruntime's float tokens at least 12 times."""
    kv, h = MEDIUM_QWEN3["num_key_value_heads"], MEDIUM_QWEN3["head_dim"]
    want, want_logits = ort_greedy(medium_path, PROMPT, STEPS, kv_heads=kv, head_dim=h)
    for formats in ("float32", "int8"):
        st = make_state(make_stateful(str(medium_path), max_length=CAPACITY, cache="paged", page_size=16,
                                      formats=formats), threads=2)
        ids, total, tokens, worst = PROMPT, 0, [], 0.0
        for step in range(STEPS):
            total += len(ids)
            out = st.run({"input_ids": np.array([ids], np.int64),
                          "attention_mask": np.ones((1, total), np.int64)})
            row = np.asarray(out["logits"])[0, -1]
            if tokens == want[:len(tokens)]:  # same context so far: compare the logits
                worst = max(worst, float(np.abs(row - want_logits[step]).max()))
            ids = [int(row.argmax())]
            tokens.append(ids[0])
            assert st.last_run.copied_bytes == 0
        if formats == "float32":
            assert tokens == want and worst <= 1e-4, worst
        else:
            assert sum(a == b for a, b in zip(tokens, want)) >= 12, (tokens, want)
