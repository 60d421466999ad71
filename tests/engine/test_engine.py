"""``onnxforge.Engine``: many sequences in one batched run, checked against each sequence
decoded alone by ``make_state`` on the one-sequence paged model (the oracle: a model and
a state the engine does not use)."""
from __future__ import annotations

import threading

import numpy as np
import pytest

import onnxforge as of
from onnxforge.engine import (Engine, EngineBusyError, EngineCapacityError, EngineClosedError, EngineError,
                              RequestCancelledError, RequestError, RequestPendingError, UnknownRequestError)
from onnxforge.kernels_cy.errors import KernelError
from onnxforge.kernels_cy.runtime.state import make_state
from onnxforge.passes.stateful.convert import StatefulError, make_stateful

MAX_LENGTH = 96
FAMILIES = ["torch20", "torch23", "genai_fp32", "genai_int4"]
_PAGED: dict[tuple, object] = {}


def _paged(path, formats="float32", page_size=16):
    key = (str(path), formats, page_size)
    if key not in _PAGED:
        _PAGED[key] = make_stateful(path, MAX_LENGTH, cache="paged", page_size=page_size, formats=formats)
    return _PAGED[key]


def alone(path, prompt, n, formats="float32", page_size=16):
    """Greedy tokens of ``prompt`` decoded alone, with the top-two logit gap of each step."""
    st = make_state(_paged(path, formats, page_size))
    toks, out, gaps = list(prompt), [], []
    r = st.run({"input_ids": np.array([toks], np.int64), "attention_mask": np.ones((1, len(toks)), np.int64)})
    for k in range(n):
        logits = r["logits"][0, -1]
        top = np.sort(logits)[-2:]
        gaps.append(float(top[1] - top[0]))
        t = int(logits.argmax())
        out.append(t)
        toks.append(t)
        if k + 1 < n:
            r = st.run({"input_ids": np.array([[t]], np.int64), "attention_mask": np.ones((1, len(toks)), np.int64)})
    return out, gaps


def assert_same_tokens(got, want, gaps):
    """Equal up to the first step whose top two logits were closer than 1e-4 (a tie)."""
    for k, (g, w) in enumerate(zip(got, want)):
        if gaps[k] < 1e-4:
            return
        assert g == w, (k, got, want)
    assert len(got) == len(want)


def _prompts(seed, lengths):
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(0, 500, n)] for n in lengths]


@pytest.mark.parametrize("family", FAMILIES)
def test_eight_sequences_arriving_and_finishing_at_different_steps_match_each_decoded_alone(decoder_models, family):
    path = decoder_models[family]
    prompts = _prompts(1, (5, 17, 3, 33, 8, 40, 12, 1))
    news = [10, 4, 20, 7, 15, 3, 9, 12]
    rows_per_step = []
    with Engine(path, max_length=MAX_LENGTH, max_step_tokens=24) as eng:
        real_run = eng._session.run

        def counting_run(names, feeds, *a, **k):
            rows_per_step.append(feeds["input_ids"].shape[1])
            return real_run(names, feeds, *a, **k)

        eng._session.run = counting_run
        rids = [eng.add(prompts[k], news[k], eos_token_id=()) for k in range(4)]
        produced = eng.step()
        eng.step()
        rids += [eng.add(prompts[k], news[k], eos_token_id=()) for k in range(4, 8)]
        finished = eng.run()
        assert produced  # the first step already produced tokens (short prompts fit one step)
        results = {rid: eng.result(rid) for rid in rids}
    assert max(rows_per_step) <= 24  # no step carries more than max_step_tokens rows
    assert any(n > 1 for n in rows_per_step[2:])  # prompts were prefilled beside decode rows
    assert set(finished) | set(produced) >= set(rids[4:])
    for rid, q, m in zip(rids, prompts, news):
        want, gaps = alone(path, q, m)
        assert_same_tokens(results[rid], want, gaps)


@pytest.mark.parametrize("formats", ["int8", "float32,int8,int4"])
def test_quantized_page_formats_give_the_tokens_of_the_sequence_alone_with_the_same_formats(decoder_models, formats):
    path = decoder_models["torch23"]
    prompts = _prompts(2, (20, 37, 6))
    with Engine(path, max_length=MAX_LENGTH, formats=formats, page_size=8) as eng:
        rids = [eng.add(q, 12, eos_token_id=()) for q in prompts]
        eng.run()
        for rid, q in zip(rids, prompts):
            want, gaps = alone(path, q, 12, formats, page_size=8)
            assert_same_tokens(eng.result(rid), want, gaps)


def test_a_pool_too_small_for_all_requests_preempts_and_completes_them_all_with_the_same_tokens(decoder_models):
    path = decoder_models["genai_fp32"]
    prompts = _prompts(3, (30, 25, 18, 40))
    probe = Engine(path, max_length=MAX_LENGTH)
    page_cost = probe._pool.page_bytes * probe._pool.layers
    probe.close()
    # room for about six pages per layer beyond the staging pages of two sequences
    with Engine(path, max_length=MAX_LENGTH, pool_bytes=8 * page_cost) as eng:
        rids = [eng.add(q, 16, eos_token_id=()) for q in prompts]
        eng.run()
        assert eng.stats["preemptions"] > 0
        assert eng.stats["used_bytes"] <= eng.stats["pool_bytes"]
        for rid, q in zip(rids, prompts):
            want, gaps = alone(path, q, 16)
            assert_same_tokens(eng.result(rid), want, gaps)


def test_requests_sharing_a_prompt_share_its_full_pages_and_skip_their_prefill(decoder_models):
    path = decoder_models["torch23"]
    (prompt,) = _prompts(4, (80,))
    with Engine(path, max_length=MAX_LENGTH, page_size=16) as eng:
        first = eng.add(prompt, 4, eos_token_id=())
        eng.step()  # the whole prompt in one step: the first token
        assert eng.stats["ttft_ms"][first] > 0
        rows = []
        real_run = eng._session.run

        def counting_run(names, feeds, *a, **k):
            rows.append(feeds["input_ids"].shape[1])
            return real_run(names, feeds, *a, **k)

        eng._session.run = counting_run
        others = [eng.add(prompt, 4, eos_token_id=()) for _ in range(7)]
        eng.step()
        # 7 newcomers recompute only the tokens of the last page (79 // 16 = 4 pages shared)
        assert rows[0] == 1 + 7 * (80 - 4 * 16)
        stats = eng.stats
        assert stats["prefix_hits"] == 7 * 4
        # and the fifth page, full after this step, is kept once too (the newcomers adopt the first's)
        assert stats["pages_shared"] == 5 * eng._pool.layers
        layers = eng._pool.layers
        one_request = -(-81 // 16) * layers
        # 8 requests hold at most 1.15x one request's pages plus their new tokens' pages
        assert stats["pages_in_use"] <= 1.15 * one_request + 7 * layers * 2
        eng.run()
        want, gaps = alone(path, prompt, 4)
        for rid in [first, *others]:
            assert_same_tokens(eng.result(rid), want, gaps)


def test_identical_prompts_admitted_together_keep_one_copy_of_each_full_page(decoder_models):
    path = decoder_models["genai_fp32"]
    (prompt,) = _prompts(5, (64,))
    with Engine(path, max_length=MAX_LENGTH) as eng:
        rids = [eng.add(prompt, 3, eos_token_id=()) for _ in range(4)]
        eng.step()
        layers = eng._pool.layers
        # 4 full pages each computed four times, one copy kept (the others adopt it)
        assert eng.stats["pages_shared"] == 4 * layers
        eng.run()
        results = [eng.result(r) for r in rids]
    assert all(r == results[0] for r in results)


def test_fork_continues_a_sequence_on_its_pages_and_children_are_reproducible(decoder_models):
    path = decoder_models["torch23"]
    (prompt,) = _prompts(6, (37,))
    sampling = of.Sampling(temperature=0.9, top_k=50, seed=7)

    def forked():
        with Engine(path, max_length=MAX_LENGTH) as eng:
            parent = eng.add(prompt, 10, sampling=sampling, eos_token_id=())
            for _ in range(3):
                eng.step()
            kids = eng.fork(parent, 3)
            assert eng.stats["running"] == 4
            assert eng.stats["pages_shared"] >= 2 * eng._pool.layers  # 39 tokens: two full pages
            eng.run()
            return eng.result(parent), [eng.result(k) for k in kids]

    p1, kids1 = forked()
    p2, kids2 = forked()
    assert (p1, kids1) == (p2, kids2)  # the same schedule gives the same tokens
    assert all(k[:3] == p1[:3] for k in kids1)  # the tokens before the fork are the parent's
    assert len({tuple(k) for k in kids1}) > 1  # child i draws with (seed, i)


def test_greedy_fork_children_continue_exactly_as_the_parent(decoder_models):
    path = decoder_models["genai_fp32"]
    (prompt,) = _prompts(7, (21,))
    with Engine(path, max_length=MAX_LENGTH) as eng:
        parent = eng.add(prompt, 8, eos_token_id=())
        eng.step()
        eng.step()
        kids = eng.fork(parent, 2)
        eng.run()
        assert all(eng.result(k) == eng.result(parent) for k in kids)
    want, gaps = alone(path, prompt, 8)
    assert_same_tokens(eng.result(parent), want, gaps)


def test_a_failing_sequence_ends_with_its_error_and_the_others_continue_unharmed(decoder_models):
    path = decoder_models["torch23"]
    prompts = _prompts(8, (9, 14, 6))
    poison = 499
    prompts[1][3] = poison
    with Engine(path, max_length=MAX_LENGTH) as eng:
        real_run = eng._session.run

        def faulty_run(names, feeds, *a, **k):
            if (feeds["input_ids"] == poison).any():
                raise KernelError("a fault injected by the test")
            return real_run(names, feeds, *a, **k)

        eng._session.run = faulty_run
        rids = [eng.add(q, 6, eos_token_id=()) for q in prompts]
        eng.run()
        with pytest.raises(RequestError, match="injected") as info:
            eng.result(rids[1])
        assert isinstance(info.value.__cause__, KernelError)
        for k in (0, 2):
            want, gaps = alone(path, prompts[k], 6)
            assert_same_tokens(eng.result(rids[k]), want, gaps)


def test_add_cancel_and_stats_from_other_threads_while_one_thread_runs(decoder_models):
    path = decoder_models["genai_fp32"]
    prompts = _prompts(9, (11, 7, 19, 5, 13, 8))
    with Engine(path, max_length=MAX_LENGTH, max_step_tokens=8) as eng:
        first = [eng.add(q, 20, eos_token_id=()) for q in prompts[:2]]
        added, errors = [], []
        stop = threading.Event()

        def other():
            try:
                for q in prompts[2:]:
                    added.append(eng.add(q, 5, eos_token_id=()))
                    eng.stats  # noqa: B018 - read while the other thread steps
                eng.cancel(first[1])
            except Exception as e:  # noqa: BLE001 - surfaced by the assertion below
                errors.append(e)
            finally:
                stop.set()

        t = threading.Thread(target=other)
        t.start()
        while not stop.is_set():
            eng.step()
        t.join()
        eng.run()
        assert errors == []
        with pytest.raises(RequestCancelledError):
            eng.result(first[1])
        for rid, q in zip(added, prompts[2:]):
            want, gaps = alone(path, q, 5)
            assert_same_tokens(eng.result(rid), want, gaps)


def test_release_forgets_finished_and_running_requests(decoder_models):
    with Engine(decoder_models["torch23"], max_length=MAX_LENGTH) as eng:
        done, running = eng.add([1, 2, 3], 2, eos_token_id=()), eng.add([4, 5, 6, 7], 30, eos_token_id=())
        eng.step()
        eng.step()
        assert len(eng.result(done)) == 2
        eng.release(done)
        eng.release(running)  # still running: cancelled, its pages freed, then forgotten
        for rid in (done, running):
            with pytest.raises(UnknownRequestError):
                eng.result(rid)
        stats = eng.stats
        assert (stats["running"], stats["waiting"], stats["ttft_ms"]) == (0, 0, {})
        assert eng._pool.seq_bytes == {}
        with pytest.raises(UnknownRequestError):
            eng.release(done)


def test_two_threads_stepping_one_engine_get_a_typed_error(decoder_models):
    with Engine(decoder_models["torch23"], max_length=MAX_LENGTH) as eng:
        eng.add([1, 2, 3], 2)
        assert eng._stepping.acquire()
        try:
            with pytest.raises(EngineBusyError):
                eng.step()
        finally:
            eng._stepping.release()
        eng.run()


def test_requests_that_can_never_be_served_and_bad_calls_get_typed_errors(decoder_models):
    path = decoder_models["torch23"]
    with Engine(path, max_length=MAX_LENGTH) as eng:
        with pytest.raises(EngineCapacityError, match="max_length"):
            eng.add(list(range(90)), 7)
        with pytest.raises(EngineError, match="empty"):
            eng.add([], 3)
        with pytest.raises(EngineError, match="vocabulary"):
            eng.add([1, 10**6], 3)
        with pytest.raises(EngineError, match="integers"):
            eng.add([1.5, 2.0], 3)
        with pytest.raises(EngineError, match="max_new_tokens"):
            eng.add([1, 2], 0)
        with pytest.raises(UnknownRequestError):
            eng.result(12345)
        rid = eng.add([4, 5, 6], 5)
        with pytest.raises(RequestPendingError):
            eng.result(rid)
        with pytest.raises(EngineError, match="forked"):
            eng.fork(rid, 2)
        eng.step()
        eng.cancel(rid)
        assert eng.stats["running"] == 0
        assert eng._pool.seq_bytes == {}  # its pages are freed at once
    with pytest.raises(EngineClosedError):
        eng.add([1], 1)
    with pytest.raises(EngineCapacityError, match="pool"):
        Engine(path, max_length=MAX_LENGTH, pool_bytes=1024).add(list(range(10)), 5)
    with pytest.raises(EngineError, match="max_sequences"):
        Engine(path, max_length=MAX_LENGTH, max_sequences=0)


def test_the_ragged_model_verifies_and_standard_export_rejects_it_by_name(decoder_models):
    m = make_stateful(decoder_models["genai_fp32"], 64, cache="paged", ragged=True)
    assert of.check(m) == []
    names = {v.name for v in m.graph.inputs}
    assert {"input_ids", "position_ids", "sequence_starts"} <= names and "attention_mask" not in names
    ops = {n.op_type for n in m.graph}
    assert {"RaggedPagedCacheUpdate", "RaggedPagedAttention"} <= ops
    assert not {"PagedCacheUpdate", "PagedAttention"} & ops
    with pytest.raises(of.ExportError, match="RaggedPagedCacheUpdate"):
        of.to_standard_onnx(m)
    with pytest.raises(StatefulError, match="paged"):
        make_stateful(decoder_models["genai_fp32"], 64, ragged=True)
