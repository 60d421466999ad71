"""The ragged batch kernels (RaggedPagedCacheUpdate, RaggedPagedAttention): each sequence's
rows against the same rows run alone through the one-sequence paged model (PagedAttention,
an independent plan), and every bad batch refused before any page changes (rule KR5)."""
from __future__ import annotations

import numpy as np
import pytest

import onnxforge as of
from onnxforge.kernels_cy.errors import KernelError
from onnxforge.kernels_cy.paged.pages import PagedKVCache
from onnxforge.kernels_cy.paged.ragged import PageBatch
from onnxforge.kernels_cy.runtime.state import _paged_layout, make_state
from onnxforge.passes.stateful.convert import make_stateful

CAP = 64


@pytest.fixture(scope="module")
def ragged(decoder_models):
    path = decoder_models["genai_fp32"]
    model = make_stateful(path, CAP, cache="paged", ragged=True)
    sess = of.InferenceSession(model, threads=2)
    names = [v.name for v in model.graph.inputs if v.name.startswith("past_key_values")]
    h, d, p, n, fm = _paged_layout(model, names[0])
    return path, sess, names, (h, d, p, n, fm)


def _caches(layout, names, count):
    h, d, p, n, fm = layout
    return [{nm: PagedKVCache(h, d, p, n, fm) for nm in names} for _ in range(count)]


def _feeds(names, seqs, chunks, positions):
    ids = np.concatenate([np.asarray(c, np.int64) for c in chunks])[None]
    pos = np.concatenate([np.arange(p, p + len(c)) for c, p in zip(chunks, positions)]).astype(np.int64)[None]
    starts = np.cumsum([0] + [len(c) for c in chunks]).astype(np.int64)
    feeds = {"input_ids": ids, "position_ids": pos, "sequence_starts": starts}
    for nm in names:
        feeds[nm] = PageBatch([s[nm] for s in seqs])
    return feeds


def test_each_sequence_of_a_ragged_run_gives_the_logits_of_its_rows_run_alone(ragged):
    path, sess, names, layout = ragged
    rng = np.random.default_rng(0)
    prompts = [list(rng.integers(0, 500, n)) for n in (7, 1, 20, 16)]
    seqs = _caches(layout, names, len(prompts))
    (logits,) = sess.run(["logits"], _feeds(names, seqs, prompts, [0] * 4))
    assert logits.shape[:2] == (1, 4)
    paged = make_stateful(path, CAP, cache="paged")
    for k, q in enumerate(prompts):
        st = make_state(paged)
        out = st.run({"input_ids": np.array([q], np.int64), "attention_mask": np.ones((1, len(q)), np.int64)})
        np.testing.assert_allclose(logits[0, k], out["logits"][0, -1], rtol=1e-5, atol=1e-5)
        assert all(seqs[k][nm].length == len(q) for nm in names)


def test_a_sequence_with_no_rows_is_left_as_it_is(ragged):
    _, sess, names, layout = ragged
    seqs = _caches(layout, names, 2)
    sess.run(["logits"], _feeds(names, seqs, [[1, 2, 3], [4]], [0, 0]))
    before = {nm: (seqs[1][nm].length, seqs[1][nm].page_payload(0).tobytes()) for nm in names}
    feeds = _feeds(names, seqs, [[5, 6], []], [3, 1])
    (logits,) = sess.run(["logits"], feeds)
    assert [seqs[0][nm].length for nm in names] == [5] * len(names)
    assert {nm: (seqs[1][nm].length, seqs[1][nm].page_payload(0).tobytes()) for nm in names} == before


def _snapshot(seqs, names):
    return [{nm: (s[nm].length, [s[nm].page_payload(i).tobytes() for i in range(-(-s[nm].length // 16))])
             for nm in names} for s in seqs]


@pytest.mark.parametrize("fault", ["position", "starts", "twice", "capacity", "late"])
def test_a_bad_batch_or_a_failed_run_changes_no_page_of_any_sequence(ragged, fault):
    _, sess, names, layout = ragged
    seqs = _caches(layout, names, 3)
    sess.run(["logits"], _feeds(names, seqs, [[1, 2, 3], [4, 5], [6] * 17], [0, 0, 0]))
    before = _snapshot(seqs, names)
    feeds = _feeds(names, seqs, [[7], [8], [9]], [3, 2, 17])
    after_step = None
    if fault == "position":
        feeds["position_ids"][0, 1] = 5  # the second sequence holds 2 tokens, not 5
    elif fault == "starts":
        feeds["sequence_starts"] = np.array([0, 2, 1, 3], np.int64)
    elif fault == "twice":
        for nm in names:
            feeds[nm] = PageBatch([seqs[0][nm], seqs[1][nm], seqs[0][nm]])
    elif fault == "capacity":
        feeds = _feeds(names, seqs, [[7], [8], [9] * (CAP - 16)], [3, 2, 17])
    else:  # every update staged, then a fault at the last step of the plan
        last = sess.num_steps - 1

        def after_step(k):
            if k == last:
                raise RuntimeError("a fault after the last step")
    with pytest.raises((KernelError, RuntimeError)):
        sess.run(["logits"], feeds, after_step=after_step)
    assert _snapshot(seqs, names) == before
    # and the batch still runs afterwards
    sess.run(["logits"], _feeds(names, seqs, [[7], [8], [9]], [3, 2, 17]))
    assert [seqs[k][names[0]].length for k in range(3)] == [4, 3, 18]


def _recount(c: PagedKVCache) -> tuple[int, int]:
    held = [i for i, f in enumerate(c.page_formats()) if f is not None]
    return (sum(c.page_payload(i).nbytes for i in held),
            sum(c.page_payload(i).nbytes for i in held if c.is_shared(i)))


def test_the_held_and_shared_byte_counts_follow_every_page_change():
    rng = np.random.default_rng(4)
    a = PagedKVCache(2, 32, 4, 16, "float32,int8,int4")
    b = PagedKVCache(2, 32, 4, 16, "float32,int8,int4")
    kv = lambda n: (rng.standard_normal((1, 2, n, 32), dtype=np.float32),  # noqa: E731
                    rng.standard_normal((1, 2, n, 32), dtype=np.float32))
    a.update(*kv(9), 0)  # three pages, aging into int8 / int4
    assert (a.nbytes, a.shared_bytes) == _recount(a)
    for i in range(2):  # b adopts a's two full pages
        fmt, payload = a.share_page(i)
        b.adopt_page(i, fmt, payload)
    b.set_page(2, *a.share_page(2)[:1], np.array(a.page_payload(2)))  # a copy of the partial one
    b.set_length(9)
    for c in (a, b):
        assert (c.nbytes, c.shared_bytes) == _recount(c)
    assert b.shared_bytes == a.page_payload(0).nbytes + a.page_payload(1).nbytes
    for _ in range(6):  # appending ages the shared pages: each holder converts a copy of its own
        for c in (a, b):
            c.update(*kv(2), c.length)
            assert (c.nbytes, c.shared_bytes) == _recount(c)
    b.convert(0, "float16")
    assert (b.nbytes, b.shared_bytes) == _recount(b)
