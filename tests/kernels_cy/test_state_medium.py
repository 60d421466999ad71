"""Acceptance on the medium decoder (hidden 512, 8 layers, 8 heads, 4 KV heads, head_dim 64):
make_stateful on the onnxruntime-genai export decodes the same greedy tokens as onnxruntime on
the original past/present model, in place."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnxforge.kernels_cy.state import make_state
from onnxforge.passes.stateful import make_stateful

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
