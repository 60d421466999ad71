"""A step is a transaction (DESIGN, *Runs, faults and many sequences*; rule R4): a run
that fails after any node of the plan leaves every retained value and published
length as it was, and the retry at the same position gives the result of a run that
never failed. Faults are injected after each step of the plan through the run's
``after_step`` hook, on one compiled session shared by the states of every format
policy; the oracle is a second state of the same policy that never saw a fault."""
from __future__ import annotations

import hashlib

import numpy as np
import pytest

from onnxforge.kernels_cy.errors import StateInitError
from onnxforge.kernels_cy.paged.pages import PagedKVCache
from onnxforge.kernels_cy.runtime.session import InferenceSession
from onnxforge.kernels_cy.runtime.state import make_state
from onnxforge.passes.stateful.convert import make_stateful

PAGE = 16
CAPACITY = 64
POLICIES = ["float32", "float16", "int8", "int4", "fp8", "int2", "codebook", "float32,int8,int4", "float32,int2"]


class Fault(Exception):
    """The injected failure."""


def _fail_at(k: int):
    def hook(step: int) -> None:
        if step == k:
            raise Fault(k)
    return hook


@pytest.fixture(scope="module")
def paged_session(decoder_models):
    """One session over the paged genai decoder; every state below runs on it."""
    model = make_stateful(str(decoder_models["genai_fp32"]), max_length=CAPACITY, cache="paged", page_size=PAGE,
                          formats=["float32"])
    return InferenceSession(model, threads=2)


def _state(sess: InferenceSession, policy: str):
    """A state of ``sess`` whose paged caches follow ``policy`` (the caches are the state's
    initial values: the policy is the state's, the compiled session is shared)."""
    probe = make_state(sess)
    caches = {k: PagedKVCache(c.kv_heads, c.head_dim, c.page_size, c.num_pages, formats=policy)
              for k, c in probe.values.items() if isinstance(c, PagedKVCache)}
    probe.close()
    assert caches
    return make_state(sess, initial=caches)


def _feeds(tokens: list[int], total: int) -> dict:
    return {"input_ids": np.array([tokens], np.int64), "attention_mask": np.ones((1, total), np.int64)}


def _fingerprint(st) -> tuple:
    """Published lengths and, per cache, every held page's format and payload digest."""
    pages = {}
    for k, c in st.values.items():
        if isinstance(c, PagedKVCache):
            pages[k] = [None if f is None else (f, hashlib.sha256(c.page_payload(i)).hexdigest())
                        for i, f in enumerate(c.page_formats())]
    return st.lengths, pages


def _steps(start: int) -> list[tuple[list[int], int]]:
    """(tokens, total) of a 10-token prefill, a 20-token prefill from 10 (an open page
    re-encoded, a new page), a decode step into an open page (the staging page) and one
    that starts page 2 (pages age when it commits)."""
    prompt = [(3 * j + start) % 90 + 1 for j in range(30)]
    return [(prompt[:10], 10), (prompt[10:30], 30), ([7], 31), ([11], 32)]


@pytest.mark.slow
@pytest.mark.parametrize("policy", POLICIES)
def test_a_fault_after_any_node_leaves_a_paged_state_bitwise_unchanged(paged_session, policy):
    sess = paged_session
    st, oracle = _state(sess, policy), _state(sess, policy)
    for n, (tokens, total) in enumerate(_steps(len(policy))):
        if n:  # the 10-token prefill only sets the scene
            before = _fingerprint(st)
            for k in range(sess.num_steps):
                with pytest.raises(Fault):
                    st.run(_feeds(tokens, total), after_step=_fail_at(k))
                assert _fingerprint(st) == before, f"{policy}: a fault after step {k} changed the state"
        got = st.run(_feeds(tokens, total))
        want = oracle.run(_feeds(tokens, total))
        np.testing.assert_array_equal(got["logits"], want["logits"])
        assert _fingerprint(st) == _fingerprint(oracle)
    assert len(set(st.values["past_key_values.0"].page_formats()[:2])) == (1 if "," not in policy else 2)


@pytest.mark.slow
def test_a_fault_leaves_a_contiguous_state_unchanged_below_its_lengths(decoder_models):
    sess = InferenceSession(make_stateful(str(decoder_models["genai_fp32"]), max_length=CAPACITY, batch=1))
    st, oracle = make_state(sess), make_state(sess)
    for tokens, total in _steps(0):
        lengths = st.lengths
        kept = {k: v[:, :, :lengths[k]].copy() for k, v in st.values.items()}
        for k in range(0, sess.num_steps, 3):
            with pytest.raises(Fault):
                st.run(_feeds(tokens, total), after_step=_fail_at(k))
            assert st.lengths == lengths
            for name, v in kept.items():
                np.testing.assert_array_equal(st.values[name][:, :, :lengths[name]], v)
        np.testing.assert_array_equal(st.run(_feeds(tokens, total))["logits"],
                                      oracle.run(_feeds(tokens, total))["logits"])


@pytest.mark.slow
def test_rewind_works_on_paged_caches(paged_session):
    """After a rewind the step from there equals a state that decoded straight to it."""
    sess = paged_session
    st, oracle = _state(sess, "float32,int8"), _state(sess, "float32,int8")
    steps = _steps(5)
    for tokens, total in steps[:2]:
        st.run(_feeds(tokens, total))
    oracle.run(_feeds(*steps[0]))
    st.rewind(10)
    assert set(st.lengths.values()) == {10}
    with pytest.raises(StateInitError, match="only lower"):
        st.rewind(11)
    got = st.run(_feeds(*steps[1]))
    want = oracle.run(_feeds(*steps[1]))
    np.testing.assert_array_equal(got["logits"], want["logits"])
