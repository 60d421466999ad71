"""Feeds a run refuses before any write (rules R2, R3): one buffer or overlapping views
fed to two READ_WRITE inputs, a write that would publish rows it does not write, an
attention mask or position inconsistent with the published lengths, and values of a
type the backend does not run."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from onnxforge.graphbuilder.builder.graph_builder import GraphBuilder
from onnxforge.graphbuilder.ir.core import READ_WRITE
from onnxforge.kernels_cy.errors import BackendError, CacheRangeError, FeedError, PageCapacityError
from onnxforge.kernels_cy.runtime.session import InferenceSession
from onnxforge.kernels_cy.runtime.state import make_state
from onnxforge.passes.stateful.convert import make_stateful

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def _two_caches(bind: bool = False):
    g = GraphBuilder(opset=23)
    a = g.input("a", F, [1, 8, 4], access=READ_WRITE)
    b = g.input("b", F, [1, 8, 4], access=READ_WRITE)
    v = g.input("v", F, [1, 1, 4])
    p = g.input("p", I64, [])
    ua = g.op.CacheUpdate(a, v, p)
    ub = g.op.CacheUpdate(b, g.op.Neg(v), p)
    g.output(g.op.Add(g.op.ReduceSum(ua, keepdims=0), g.op.ReduceSum(ub, keepdims=0)), "total")
    g.output(ua, "a_next")
    g.output(ub, "b_next")
    if bind:
        g.bind(a, "a_next")
        g.bind(b, "b_next")
    return g.to_model()


def test_one_buffer_for_two_read_write_inputs_is_refused_before_any_write():
    sess = InferenceSession(_two_caches())
    buf = np.zeros((1, 8, 4), np.float32)
    feeds = {"v": np.ones((1, 1, 4), np.float32), "p": np.array(0, np.int64)}
    with pytest.raises(FeedError, match="share storage.*R2"):
        sess.run(None, {**feeds, "a": buf, "b": buf})
    assert not buf.any()
    big = np.zeros((2, 8, 4), np.float32)  # two disjoint views of one array are fine
    total, a, b = sess.run(None, {**feeds, "a": big[:1], "b": big[1:]})
    assert a.base is big and float(total) == 0.0 and big[0, 0].sum() == 4 and big[1, 0].sum() == -4
    wide = np.zeros((1, 12, 4), np.float32)  # overlapping views: rows 0-7 and 4-11
    with pytest.raises(FeedError, match="share storage"):
        sess.run(None, {**feeds, "a": wide[:, :8], "b": wide[:, 4:]})
    assert not wide.any()


def test_a_state_refuses_a_shared_initial_buffer_as_the_session_does():
    buf = np.zeros((1, 8, 4), np.float32)
    from onnxforge.kernels_cy.errors import StateInitError
    with pytest.raises(StateInitError, match="share storage"):
        make_state(_two_caches(bind=True), initial={"a": buf, "b": buf})


@pytest.mark.slow
@pytest.mark.parametrize("cache", ["contiguous", "paged"])
@pytest.mark.parametrize("variant", ["genai_fp32", "torch23"])
def test_a_mask_inconsistent_with_the_published_length_is_refused(decoder_models, variant, cache):
    """After 5 tokens, one new token needs a mask of 6: 8 would publish rows nobody
    wrote, 5 or 3 would rewrite published rows; each is a typed error, state unchanged."""
    kw = {"cache": "paged", "page_size": 16} if cache == "paged" else {"batch": 1}
    st = make_state(make_stateful(str(decoder_models[variant]), max_length=32, **kw))
    st.run({"input_ids": np.array([[1, 2, 3, 4, 5]]), "attention_mask": np.ones((1, 5), np.int64)})
    before = st.lengths
    for bad in (8, 5, 3, 0):  # a mask of 0 puts the token at position -1: the rotary refuses it
        with pytest.raises((CacheRangeError, PageCapacityError) if bad else BackendError):
            st.run({"input_ids": np.array([[6]]), "attention_mask": np.ones((1, bad), np.int64)})
        assert st.lengths == before
    st.run({"input_ids": np.array([[6]]), "attention_mask": np.ones((1, 6), np.int64)})
    assert set(st.lengths.values()) == {6}


def test_a_sequence_input_is_refused_not_stacked():
    node = helper.make_node("SequenceLength", ["s"], ["n"])
    g = helper.make_graph([node], "g", [helper.make_tensor_sequence_value_info("s", F, None)],
                          [helper.make_tensor_value_info("n", I64, [])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    sess = InferenceSession(model, fallback="reference")
    with pytest.raises(FeedError, match=r"typed seq\(FLOAT.*tensor and struct values only"):
        sess.run(None, {"s": [np.zeros(2, np.float32), np.zeros(2, np.float32)]})


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["genai_fp32", "torch23"])
def test_a_zero_token_step_never_publishes_a_row_it_did_not_write(decoder_models, variant):
    """No new token: either a typed error (torch's Reshape of an empty sequence) or a run
    that publishes the lengths it had; never a row nobody wrote."""
    st = make_state(make_stateful(str(decoder_models[variant]), max_length=32, batch=1))
    st.run({"input_ids": np.array([[1, 2, 3, 4, 5]]), "attention_mask": np.ones((1, 5), np.int64)})
    before = st.lengths
    try:
        st.run({"input_ids": np.zeros((1, 0), np.int64), "attention_mask": np.ones((1, 5), np.int64)})
    except BackendError:
        pass
    assert st.lengths == before
    with pytest.raises(BackendError):  # a zero-token step whose mask claims a sixth token
        st.run({"input_ids": np.zeros((1, 0), np.int64), "attention_mask": np.ones((1, 6), np.int64)})
    assert st.lengths == before
