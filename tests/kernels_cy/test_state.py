"""make_state: bindings resolved once, values retained by owner, typed errors, atomic publication."""
from __future__ import annotations

import copy
import threading

import numpy as np
import pytest
from onnx import TensorProto

from onnxforge.graphbuilder.ir import core as ir_module
from onnxforge.graphbuilder import serde
from onnxforge.graphbuilder.builder.graph_builder import GraphBuilder
from onnxforge.graphbuilder.ir.core import READ_WRITE
from onnxforge.kernels_cy.errors import (
    BackendError,
    FeedError,
    StateBusyError,
    StateClosedError,
    StateError,
    StateFeedError,
    StateInitError,
)
from onnxforge.kernels_cy.runtime.state import StateCounters, make_state

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def addr(a: np.ndarray) -> int:
    return int(a.__array_interface__["data"][0])


def _cache_model():
    """cache [1, 8, 4] READ_WRITE <- updated = CacheUpdate(cache, values, pos); total = sum."""
    g = GraphBuilder(opset=23)
    cache = g.input("cache", F, [1, 8, 4], access=READ_WRITE)
    values = g.input("values", F, [1, 2, 4])
    pos = g.input("pos", I64, [])
    upd = g.op.CacheUpdate(cache, values, pos)
    g.output(g.op.ReduceSum(upd, keepdims=0), "total")
    g.output(upd, "updated")
    g.bind(cache, "updated")
    return g.to_model()


def _concat_model():
    """acc [1, past] <- next = Concat(acc, x): a read-only binding whose buffer changes."""
    g = GraphBuilder(opset=23)
    acc = g.input("acc", F, [1, "past"])
    x = g.input("x", F, [1, "n"])
    g.output(g.op.Concat(acc, x, axis=1), "next")
    g.bind(acc, "next")
    return g.to_model()


def _feeds(pos: int, v: float = 1.0) -> dict:
    return {"values": np.full((1, 2, 4), v, np.float32), "pos": np.array(pos, np.int64)}


def test_outputs_are_retained_by_owner_and_the_cache_keeps_its_address():
    st = make_state(_cache_model())
    a0 = st.addresses()["cache"]
    out = st.run(_feeds(0, 1.0))
    assert addr(out["updated"]) == a0 == st.addresses()["cache"]
    out = st.run(_feeds(2, 2.0))
    assert addr(out["updated"]) == a0 == st.addresses()["cache"]
    expected = np.zeros((1, 8, 4), np.float32)
    expected[0, 0:2], expected[0, 2:4] = 1, 2
    np.testing.assert_array_equal(st.values["cache"], expected)
    assert float(out["total"]) == expected.sum()
    assert st.last_run == StateCounters(st.last_run.allocated_bytes, 0, st.last_run.peak_bytes,
                                        expected.nbytes)


def test_values_are_read_only_views_of_the_retained_buffer():
    st = make_state(_cache_model())
    st.run(_feeds(0))
    v = st.values["cache"]
    assert not v.flags.writeable and addr(v) == st.addresses()["cache"]
    with pytest.raises(ValueError):
        v[0, 0, 0] = 5
    st.run(_feeds(2, 3.0))
    assert v[0, 2, 0] == 3.0  # a live view of the same storage, rows below the old length intact
    np.testing.assert_array_equal(v[0, :2], 1.0)


def test_numpy_initial_values_are_retained_without_a_copy():
    cache = np.zeros((1, 8, 4), np.float32)
    st = make_state(_cache_model(), initial={"cache": cache}, lengths={"cache": 1})
    out = st.run(_feeds(1, 4.0))
    assert out["updated"] is cache and cache[0, 1:3].sum() == 32


@pytest.mark.parametrize("bad, word", [
    (lambda: np.zeros((1, 8, 4), np.float64), "dtype float64"),
    (lambda: np.zeros((1, 8, 8), np.float32)[:, :, :4], "C-contiguous"),
    (lambda: _ro(), "not writable"),
    (lambda: np.zeros((1, 4, 4), np.float32), "shape"),
    (lambda: [[0.0]], "numpy array"),
])
def test_initial_values_that_would_need_a_copy_are_rejected(bad, word):
    with pytest.raises(StateInitError, match=word):
        make_state(_cache_model(), initial={"cache": bad()})


def _ro() -> np.ndarray:
    a = np.zeros((1, 8, 4), np.float32)
    a.flags.writeable = False
    return a


def test_unknown_initial_names_are_rejected():
    with pytest.raises(StateInitError, match="not bound inputs"):
        make_state(_cache_model(), initial={"values": np.zeros((1, 2, 4), np.float32)})


def test_a_feed_overriding_a_retained_input_is_a_typed_error():
    st = make_state(_cache_model())
    with pytest.raises(StateFeedError, match="'cache'"):
        st.run({**_feeds(0), "cache": np.zeros((1, 8, 4), np.float32)})
    with pytest.raises(FeedError, match="missing"):
        st.run({"values": np.ones((1, 2, 4), np.float32)})


def test_symbolic_dimensions_need_a_size_and_zero_gives_an_empty_concat_cache():
    with pytest.raises(StateInitError, match="'acc'.*dimension 1.*'past'"):
        make_state(_concat_model())
    st = make_state(_concat_model(), dims={"past": 0})
    assert st.values["acc"].shape == (1, 0)
    out = st.run({"x": np.array([[1.0, 2.0]], np.float32)})
    assert addr(out["next"]) == st.addresses()["acc"]  # retained by owner, not copied
    out = st.run({"x": np.array([[3.0]], np.float32)})
    np.testing.assert_array_equal(st.values["acc"], [[1.0, 2.0, 3.0]])
    assert out["next"] is not None and st.last_run.copied_bytes == 0


def test_read_only_bindings_also_reject_non_contiguous_initial_values():
    a = np.zeros((2, 6), np.float32)[:1, ::2]
    with pytest.raises(StateInitError, match="C-contiguous"):
        make_state(_concat_model(), initial={"acc": a})
    ro = np.zeros((1, 3), np.float32)
    ro.flags.writeable = False
    st = make_state(_concat_model(), initial={"acc": ro})  # read-only storage is fine here
    assert addr(st.values["acc"]) == addr(ro)


def test_a_retained_buffer_its_owner_made_read_only_is_refused_before_any_write():
    buf = np.zeros((1, 8, 4), np.float32)
    st = make_state(_cache_model(), initial={"cache": buf})  # retained without a copy
    st.run(_feeds(0, 1.0))
    st.run(_feeds(2, 2.0))  # the retained buffer is now passed to the session unchecked...
    before = buf.copy()
    buf.flags.writeable = False  # ...until its owner makes it read-only
    with pytest.raises(FeedError, match="not writable"):
        st.run(_feeds(4, 3.0))
    np.testing.assert_array_equal(buf, before)
    assert st.lengths == {"cache": 4}
    buf.flags.writeable = True
    st.run(_feeds(4, 3.0))
    assert st.lengths == {"cache": 6} and float(buf[0, 4, 0]) == 3.0


def test_a_failed_run_leaves_the_state_unchanged():
    st = make_state(_cache_model())
    st.run(_feeds(0, 1.0))
    before = st.values["cache"].copy()
    counters = st.last_run
    with pytest.raises(BackendError, match="capacity"):  # position + n > capacity
        st.run(_feeds(7, 9.0))
    np.testing.assert_array_equal(st.values["cache"], before)
    with pytest.raises(FeedError, match="float64"):  # a wrong-dtype feed
        st.run({"values": np.full((1, 2, 4), 9.0), "pos": np.array(2, np.int64)})
    np.testing.assert_array_equal(st.values["cache"], before)
    assert st.last_run == counters
    st.run(_feeds(2, 5.0))  # and the state is still usable
    assert st.values["cache"][0, 2:4].sum() == 40


def test_a_second_concurrent_call_is_rejected():
    st = make_state(_cache_model())
    entered, release = threading.Event(), threading.Event()
    inner = st.session.run

    def slow_run(names, feeds, **kw):
        entered.set()
        release.wait(10)
        return inner(names, feeds, **kw)

    st._session.run = slow_run  # the first call holds the state while it runs
    errors: list[BaseException] = []
    t = threading.Thread(target=lambda: _capture(errors, lambda: st.run(_feeds(0))))
    t.start()
    assert entered.wait(10)
    try:
        with pytest.raises(StateBusyError, match="another call"):
            st.run(_feeds(2))
        with pytest.raises(StateBusyError):
            st.reset()
        with pytest.raises(StateBusyError):
            st.close()
    finally:
        release.set()
        t.join(10)
    assert errors == []
    assert st.values["cache"][0, :2].sum() == 8 and st.values["cache"][0, 2:].sum() == 0


def _capture(errors: list[BaseException], fn) -> None:
    try:
        fn()
    except BaseException as e:  # noqa: BLE001 - re-checked by the test thread
        errors.append(e)


def test_independent_states_are_isolated():
    m = _cache_model()
    a, b = make_state(m), make_state(m)
    assert a.addresses()["cache"] != b.addresses()["cache"]
    a.run(_feeds(0, 1.0))
    assert not np.any(b.values["cache"])
    b.run(_feeds(0, 2.0))
    assert a.values["cache"].sum() == 8 and b.values["cache"].sum() == 16


def test_a_buffer_bound_to_two_live_states_is_rejected():
    cache = np.zeros((1, 8, 4), np.float32)
    first = make_state(_cache_model(), initial={"cache": cache})
    with pytest.raises(StateInitError, match="another live state"):
        make_state(_cache_model(), initial={"cache": cache})
    flat = np.zeros(64, np.float32)
    third = make_state(_cache_model(), initial={"cache": flat[:32].reshape(1, 8, 4)})
    with pytest.raises(StateInitError, match="another live state"):  # overlapping storage
        make_state(_cache_model(), initial={"cache": flat[16:48].reshape(1, 8, 4)})
    third.close()
    first.close()
    second = make_state(_cache_model(), initial={"cache": cache})
    assert second.addresses()["cache"] == addr(cache)


def test_reset_and_close():
    st = make_state(_cache_model())
    st.run(_feeds(0))
    view = st.values["cache"]
    fresh = np.full((1, 8, 4), 7.0, np.float32)
    st.reset({"cache": fresh})
    assert st.addresses()["cache"] == addr(fresh) and st.last_run == StateCounters()
    st.reset()
    assert not np.any(st.values["cache"])
    st.close()
    assert view[0, 0, 0] == 1.0  # views handed out earlier outlive reset and close
    for call in (lambda: st.run(_feeds(0)), lambda: st.values, lambda: st.reset()):
        with pytest.raises(StateClosedError):
            call()
    assert issubclass(StateClosedError, StateError) and issubclass(StateError, BackendError)


def test_save_and_restore(tmp_path):
    st = make_state(_cache_model())
    st.run(_feeds(0, 1.5))
    st.run(_feeds(2, 2.5))
    path = tmp_path / "state.npz"
    st.save(path)
    again = make_state(_cache_model(), initial=str(path))
    np.testing.assert_array_equal(again.values["cache"], st.values["cache"])
    again.run(_feeds(4, 3.5))
    st.run(_feeds(4, 3.5))
    np.testing.assert_array_equal(again.values["cache"], st.values["cache"])
    st.reset(path)
    np.testing.assert_array_equal(st.values["cache"][0, 4:], 0)
    with pytest.raises(StateInitError, match="cannot read"):
        make_state(_cache_model(), initial=str(tmp_path / "missing.npz"))


def _chain_model(n: int):
    """acc [4] <- acc + n * x, through a chain of n Add nodes (a large graph)."""
    g = GraphBuilder(opset=23)
    acc = g.input("acc", F, [4])
    x = g.input("x", F, [4])
    y = acc
    for _ in range(n):
        y = g.op.Add(y, x)
    g.output(y, "next")
    g.bind(acc, "next")
    return g.to_model()


def test_the_model_is_never_serialized_cloned_or_rescanned(monkeypatch):
    model = _chain_model(3000)
    nodes_before = [id(n) for n in model.graph]
    calls: list[str] = []

    def forbid(name):
        def f(*a, **k):
            calls.append(name)
            raise AssertionError(name)
        return f

    for name in ("to_proto", "to_onnx", "to_bytes", "write", "save"):
        monkeypatch.setattr(serde, name, forbid(f"serde.{name}"))
    monkeypatch.setattr(copy, "deepcopy", forbid("copy.deepcopy"))
    st = make_state(model, initial={"acc": np.zeros(4, np.float32)})
    walks = []
    real_iter = ir_module._Body.__iter__

    def counting_iter(self):
        walks.append(self)
        return real_iter(self)

    monkeypatch.setattr(ir_module._Body, "__iter__", counting_iter)
    monkeypatch.setattr(ir_module._Body, "__hash__", forbid("hash(graph)"), raising=False)
    x = np.ones(4, np.float32)
    for _ in range(5):
        st.run({"x": x})
    assert walks == [] and calls == []
    np.testing.assert_array_equal(st.values["acc"], 5 * 3000)
    monkeypatch.setattr(ir_module._Body, "__iter__", real_iter)
    assert [id(n) for n in model.graph] == nodes_before and st.session.model is model


def test_a_state_collected_without_close_releases_its_buffers():
    import gc

    cache = np.zeros((1, 8, 4), np.float32)
    first = make_state(_cache_model(), initial={"cache": cache})
    first.run(_feeds(0))
    del first
    gc.collect()
    second = make_state(_cache_model(), initial={"cache": cache})
    assert second.addresses()["cache"] == addr(cache)


def test_torch_initial_values_are_retained_through_dlpack():
    import torch
    cache = torch.zeros((1, 8, 4), dtype=torch.float32)
    st = make_state(_cache_model(), initial={"cache": cache}, lengths={"cache": 1})
    assert st.addresses()["cache"] == cache.data_ptr()
    st.run(_feeds(1, 2.0))
    assert float(cache.sum()) == 16.0  # written in place, seen by the tensor's owner
    with pytest.raises(StateInitError, match="dtype float64"):
        make_state(_cache_model(), initial={"cache": torch.zeros((1, 8, 4), dtype=torch.float64)})
    with pytest.raises(StateInitError, match="C-contiguous"):
        make_state(_cache_model(), initial={"cache": torch.zeros((1, 4, 8)).transpose(1, 2)})
