"""The built-in stateful decoder decoded through make_state against onnxruntime on its export."""
from __future__ import annotations

import json

import numpy as np
import pytest

import onnxforge as of
from onnxforge.kernels_cy.errors import BackendError, FeedError
from onnxforge.kernels_cy.runtime.state import make_state
from onnxforge.samples import DecoderConfig, build_builtin

import onnxruntime as ort

PROMPT = [5, 17, 42]
STEPS = 12


def addr(a: np.ndarray) -> int:
    return int(a.__array_interface__["data"][0])


def _ort_greedy(model, prompt: list[int], steps: int) -> tuple[list[int], list[np.ndarray]]:
    """Greedy decode with onnxruntime on the standard export, caches fed back by hand."""
    std = of.to_standard_onnx(model)
    feedback = json.loads({p.key: p.value for p in std.metadata_props}["onnxforge.feedback"])
    sess = ort.InferenceSession(std.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    state = {i.name: np.zeros(i.shape, np.float32) for i in sess.get_inputs() if i.name in feedback}
    ids, position, tokens, logits = prompt, 0, [], []
    for _ in range(steps):
        outs = dict(zip(names, sess.run(None, {"input_ids": np.array([ids], np.int64),
                                              "position": np.array(position, np.int64), **state})))
        state = {inp: outs[out] for inp, out in feedback.items()}
        position += len(ids)
        logits.append(outs["logits"][0, -1])
        ids = [int(outs["logits"][0, -1].argmax())]
        tokens.append(ids[0])
    return tokens, logits


def test_decode_through_the_state_matches_onnxruntime_in_place():
    model = build_builtin("decoder")
    expected_tokens, expected_logits = _ort_greedy(model, PROMPT, STEPS)
    st = make_state(model)
    addresses = st.addresses()
    assert sorted(addresses) == [f"cache.{l}.{k}" for l in range(2) for k in ("key", "value")]
    ids, position, tokens, counters = PROMPT, 0, [], []
    for step in range(STEPS):
        out = st.run({"input_ids": np.array([ids], np.int64), "position": np.array(position, np.int64)})
        assert st.addresses() == addresses, f"step {step}: a cache buffer moved"
        for i, o in ((b.input, b.output) for b in st.bindings):
            assert addr(out[o]) == addresses[i]
        np.testing.assert_allclose(out["logits"][0, -1], expected_logits[step], atol=1e-4, rtol=0)
        position += len(ids)
        ids = [int(out["logits"][0, -1].argmax())]
        tokens.append(ids[0])
        counters.append(st.last_run)
    assert tokens == expected_tokens
    assert all(c.copied_bytes == 0 for c in counters)
    cfg = DecoderConfig()
    cache_bytes = 4 * cfg.kv_heads * cfg.capacity * cfg.head_dim * 4
    assert {c.cache_bytes for c in counters} == {cache_bytes}
    # one-token steps at contexts 4 ... 14 allocate the same bytes: nothing grows with the context
    assert len({c.allocated_bytes for c in counters[1:]}) == 1
    assert counters[1].allocated_bytes < cache_bytes


def test_overflow_and_a_wrong_dtype_leave_the_decoder_state_unchanged():
    st = make_state(build_builtin("decoder"))
    st.run({"input_ids": np.array([PROMPT], np.int64), "position": np.array(0, np.int64)})
    before = {k: v.copy() for k, v in st.values.items()}
    capacity = DecoderConfig().capacity
    with pytest.raises(BackendError, match="capacity"):
        st.run({"input_ids": np.array([[1, 2]], np.int64), "position": np.array(capacity - 1, np.int64)})
    with pytest.raises(FeedError, match="int32"):
        st.run({"input_ids": np.array([[1]], np.int32), "position": np.array(3, np.int64)})
    for k, v in st.values.items():
        np.testing.assert_array_equal(v, before[k])
    out = st.run({"input_ids": np.array([[7]], np.int64), "position": np.array(3, np.int64)})
    assert np.isfinite(out["logits"]).all()
