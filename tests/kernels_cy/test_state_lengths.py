"""Published lengths (rule R3): writes only at or above them, checked before any write,
published with the values on success, unchanged by a failed run, kept by save/restore."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

from onnxforge.graphbuilder import serde
from onnxforge.graphbuilder.builder.graph_builder import GraphBuilder
from onnxforge.graphbuilder.ir.core import READ_WRITE
from onnxforge.kernels_cy.errors import CacheRangeError, FeedError, StateInitError
from onnxforge.kernels_cy.runtime.session import InferenceSession
from onnxforge.kernels_cy.runtime.state import make_state
from onnxforge.passes.stateful.convert import make_stateful
from tests.kernels_cy.test_session_contrib import _gqa_feeds, _gqa_model

F, I64 = TensorProto.FLOAT, TensorProto.INT64
CAP = 8


def _two_caches():
    """a, b [1, 8, 4] READ_WRITE, each updated by its own CacheUpdate at its own position;
    ``a`` is written first, so a failure at ``b`` happens after ``a``'s write."""
    g = GraphBuilder(opset=23)
    a = g.input("a", F, [1, CAP, 4], access=READ_WRITE)
    b = g.input("b", F, [1, CAP, 4], access=READ_WRITE)
    va = g.input("va", F, [1, "n", 4])
    vb = g.input("vb", F, [1, "n", 4])
    pa = g.input("pa", I64, [])
    pb = g.input("pb", I64, [])
    ua = g.op.CacheUpdate(a, va, pa)
    sa = g.op.ReduceSum(ua, keepdims=0)
    ub = g.op.CacheUpdate(b, g.op.Add(vb, sa), pb)
    g.output(g.op.ReduceSum(ub, keepdims=0), "total")
    g.output(ua, "a_next")
    g.output(ub, "b_next")
    g.bind(a, "a_next")
    g.bind(b, "b_next")
    return g.to_model()


def _feeds(pa: int, pb: int, n: int = 2, v: float = 1.0) -> dict:
    vals = np.full((1, n, 4), v, np.float32)
    return {"va": vals, "vb": vals.copy(), "pa": np.array(pa, np.int64), "pb": np.array(pb, np.int64)}


def _snapshot(st) -> tuple[dict, dict]:
    return {k: v.copy() for k, v in st.values.items()}, st.lengths


def _assert_unchanged(st, before: tuple[dict, dict]) -> None:
    values, lengths = before
    assert st.lengths == lengths
    for k, old in values.items():
        n = lengths[k]
        np.testing.assert_array_equal(st.values[k][:, :n], old[:, :n])


def test_lengths_follow_each_successful_write():
    st = make_state(_two_caches())
    assert st.lengths == {"a": 0, "b": 0}
    st.run(_feeds(0, 0, n=3))
    assert st.lengths == {"a": 3, "b": 3}
    st.run(_feeds(3, 3, n=1))
    assert st.lengths == {"a": 4, "b": 4}
    assert st.last_run.copied_bytes == 0


def test_a_write_above_the_published_length_is_refused_before_any_write():
    """Entries between the published length and the position would be published without
    being written: a gap is a typed error, and ``a`` (written first) is left as it was."""
    st = make_state(_two_caches())
    st.run(_feeds(0, 0, n=3))
    before = _snapshot(st)
    whole = {k: v.copy() for k, v in st.values.items()}
    with pytest.raises(CacheRangeError, match="above the published length 3 of 'b'"):
        st.run(_feeds(3, 5, n=1))
    _assert_unchanged(st, before)
    np.testing.assert_array_equal(st.values["b"], whole["b"])
    st.run(_feeds(3, 3, n=1))
    assert st.lengths == {"a": 4, "b": 4}


@pytest.mark.parametrize("pa, pb, n, why", [
    (2, 3, 1, "below the published length"),   # a writes below its published length 3
    (3, 1, 1, "below the published length"),   # b does, after a was written
    (3, 7, 2, "capacity"),                      # b overflows
    (-1, 3, 1, "capacity"),                     # a negative position
])
def test_a_rejected_write_leaves_payload_and_lengths_unchanged(pa, pb, n, why):
    st = make_state(_two_caches())
    st.run(_feeds(0, 0, n=3, v=2.0))
    before = _snapshot(st)
    whole = {k: v.copy() for k, v in st.values.items()}
    with pytest.raises(CacheRangeError, match=why):
        st.run(_feeds(pa, pb, n=n, v=9.0))
    _assert_unchanged(st, before)
    if pa < 3:  # the failing write is the first one: nothing at all was written
        for k, v in st.values.items():
            np.testing.assert_array_equal(v, whole[k])
    st.run(_feeds(3, 3, n=1, v=4.0))  # the state is usable at its published lengths
    assert st.lengths == {"a": 4, "b": 4}
    np.testing.assert_array_equal(st.values["a"][0, :3], 2.0)


def test_the_floor_check_comes_before_the_kernel_writes():
    st = make_state(_two_caches())
    st.run(_feeds(0, 0, n=4, v=1.0))
    addresses = st.addresses()
    with pytest.raises(CacheRangeError, match=r"R3.*'a'|'a'.*R3"):
        st.run(_feeds(0, 4, n=1, v=5.0))
    assert not (st.values["a"] == 5.0).any() and st.addresses() == addresses


def test_a_wrong_dtype_feed_mid_decode_leaves_the_state_valid():
    st = make_state(_two_caches())
    st.run(_feeds(0, 0, n=2))
    before = _snapshot(st)
    bad = _feeds(2, 2)
    bad["va"] = bad["va"].astype(np.float64)
    with pytest.raises(FeedError, match="float64"):
        st.run(bad)
    _assert_unchanged(st, before)


def test_stateless_runs_are_not_limited_by_any_length():
    m = _two_caches()
    a, b = np.zeros((1, CAP, 4), np.float32), np.zeros((1, CAP, 4), np.float32)
    sess = InferenceSession(m)
    sess.run(None, {"a": a, "b": b, **_feeds(4, 4)})
    sess.run(None, {"a": a, "b": b, **_feeds(0, 0, v=3.0)})  # no state: no published length
    assert a[0, 0, 0] == 3.0


def test_save_and_restore_keep_the_lengths(tmp_path):
    st = make_state(_two_caches())
    st.run(_feeds(0, 0, n=3))
    st.run(_feeds(3, 3, n=2))
    path = tmp_path / "state.npz"
    st.save(path)
    again = make_state(_two_caches(), initial=path)
    assert again.lengths == {"a": 5, "b": 5}
    with pytest.raises(CacheRangeError, match="below the published length"):
        again.run(_feeds(4, 5, n=1))
    again.run(_feeds(5, 5, n=1))
    st.reset(path)
    assert st.lengths == {"a": 5, "b": 5}
    st.reset()
    assert st.lengths == {"a": 0, "b": 0}


def test_initial_lengths_and_rewind():
    a = np.zeros((1, CAP, 4), np.float32)
    st = make_state(_two_caches(), initial={"a": a}, lengths={"a": 2})
    assert st.lengths == {"a": 2, "b": 0}
    with pytest.raises(CacheRangeError):
        st.run(_feeds(1, 0, n=1))
    st.run(_feeds(2, 0, n=2))
    st.rewind({"a": 1})
    assert st.lengths == {"a": 1, "b": 2}
    st.run(_feeds(1, 2, n=1))
    st.rewind(0)
    assert st.lengths == {"a": 0, "b": 0}
    with pytest.raises(StateInitError, match="only lower"):
        st.rewind({"a": 5})
    for bad in ({"va": 1}, {"a": -1}, {"a": "x"}):
        with pytest.raises(StateInitError):
            make_state(_two_caches(), lengths=bad)


# -- GroupQueryAttention in shared-buffer mode: the length follows seqlens_k + 1 ---------------

NQ, NKV, H, GCAP = 4, 2, 16, 12


def _gqa_state():
    model = make_stateful(serde.from_proto(_gqa_model(NQ, NKV, H, 1)), max_length=GCAP,
                          bindings={"pk": "present_k", "pv": "present_v"}, batch=1)
    return make_state(model)


def _gqa_step(rng, past: int, s: int) -> dict:
    feeds = _gqa_feeds(rng, 1, s, past, NQ, NKV, H)
    del feeds["pk"], feeds["pv"]
    return feeds


def test_group_query_attention_publishes_seqlens_and_rejects_rewrites():
    rng = np.random.default_rng(3)
    st = _gqa_state()
    st.run(_gqa_step(rng, 0, 3))
    assert st.lengths == {"pk": 3, "pv": 3}
    st.run(_gqa_step(rng, 3, 1))
    assert st.lengths == {"pk": 4, "pv": 4}
    before = _snapshot(st)
    whole = {k: v.copy() for k, v in st.values.items()}
    with pytest.raises(CacheRangeError, match="below the published length"):
        st.run(_gqa_step(rng, 2, 1))  # a mask one token short: would overwrite position 2
    with pytest.raises(CacheRangeError, match="capacity"):
        st.run(_gqa_step(rng, 4, GCAP))
    bad = _gqa_step(rng, 4, 1)
    bad["q"] = bad["q"].astype(np.float64)
    with pytest.raises(FeedError):
        st.run(bad)
    _assert_unchanged(st, before)
    for k, v in st.values.items():
        np.testing.assert_array_equal(v, whole[k])
    st.run(_gqa_step(rng, 4, 2))
    assert st.lengths == {"pk": 6, "pv": 6}


def test_per_row_positions_publish_one_length_per_row():
    g = GraphBuilder(opset=23)
    cache = g.input("cache", F, [2, CAP, 4], access=READ_WRITE)
    vals = g.input("vals", F, [2, 1, 4])
    pos = g.input("pos", I64, [2])
    g.output(g.op.CacheUpdate(cache, vals, pos), "next")
    g.bind(cache, "next")
    st = make_state(g.to_model(), initial={"cache": np.zeros((2, CAP, 4), np.float32)}, lengths={"cache": (0, 2)})
    ones = np.ones((2, 1, 4), np.float32)
    with pytest.raises(CacheRangeError, match="above the published length"):  # row 0 would leave a gap
        st.run({"vals": ones, "pos": np.array([1, 2], np.int64)})
    st.run({"vals": ones, "pos": np.array([0, 2], np.int64)})
    assert st.lengths == {"cache": (1, 3)}
    before = _snapshot(st)
    with pytest.raises(CacheRangeError, match="below the published length"):
        st.run({"vals": 2 * ones, "pos": np.array([1, 2], np.int64)})  # row 1 would rewrite position 2
    assert st.lengths == before[1]
    np.testing.assert_array_equal(st.values["cache"], before[0]["cache"])
    st.run({"vals": ones, "pos": np.array([1, 3], np.int64)})
    assert st.lengths == {"cache": (2, 4)}
