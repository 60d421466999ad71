"""The memory plan at run time (issue 10 item 4): an in-place update counts zero cache
bytes, persistent values are never released or reused, and the plan's peak and
allocations equal the counters a state run measures."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

from onnxforge.graphbuilder.builder.graph_builder import READ_WRITE, GraphBuilder
from onnxforge.kernels_cy.runtime.session import InferenceSession
from onnxforge.kernels_cy.runtime.state import make_state
from onnxforge.passes import memory_plan
from onnxforge.passes.analyses.effects import effect_analysis
from onnxforge.passes.analyses.liveness import liveness

F, I64 = TensorProto.FLOAT, TensorProto.INT64
CACHE = 1 * 8 * 4 * 4  # bytes of the float32 [1, 8, 4] cache


def _cache_model(*, snapshot: bool, keepdims: int = 1):
    """cache RW [1, 8, 4]; two in-place writes, readers of each version, and with
    ``snapshot`` an Identity of version 0 read after the writes (the runtime copies it)."""
    g = GraphBuilder(opset=23)
    cache = g.input("cache", F, [1, 8, 4], access=READ_WRITE)
    vals = g.input("vals", F, [1, 1, 4])
    pos = g.input("pos", I64, [])
    s0 = g.op.ReduceSum(cache, keepdims=keepdims)
    snap = g.op.Identity(cache) if snapshot else None
    u1 = g.op.CacheUpdate(cache, vals, pos)
    u2 = g.op.CacheUpdate(u1, vals, g.input("pos2", I64, []))
    total = g.op.Add(s0, g.op.ReduceSum(g.op.Relu(u2), keepdims=keepdims))
    if snap is not None:
        total = g.op.Add(total, g.op.ReduceSum(snap, keepdims=keepdims))
    g.output(total, "total")
    g.output(u2, "cache_out")
    g.bind("cache", "cache_out")
    return g.to_model(), cache, u1, u2


def _concat_model():
    """past [4, 8] <- present = Concat(past, new): a fresh buffer every run, no alias."""
    g = GraphBuilder(opset=23)
    past = g.input("past", F, [4, 8])
    new = g.input("new", F, [4, 8])
    present = g.op.Concat(past, new, axis=0)
    g.output(g.op.ReduceSum(g.op.Relu(past), keepdims=1), "s")
    starts, ends, axes = (g.initializer(n, np.array([v], np.int64)) for n, v in (("starts", 4), ("ends", 8), ("axes", 0)))
    g.output(g.op.Slice(present, starts, ends, axes), "present")
    g.bind("past", "present")
    return g.to_model()


def _at(pos: int) -> dict[str, np.ndarray]:
    return {"vals": np.ones((1, 1, 4), np.float32), "pos": np.array(pos, np.int64),
            "pos2": np.array(pos + 1, np.int64)}


@pytest.mark.parametrize("snapshot", [False, True])
def test_plan_equals_the_run_time_counters_of_an_in_place_cache(snapshot):
    m, cache, u1, u2 = _cache_model(snapshot=snapshot)
    plan = memory_plan(m)
    assert plan.exact
    assert plan.kind[cache] == "state" and plan.state_bytes == CACHE
    assert plan.kind[u1] == plan.kind[u2] == "in_place" and plan.bytes_of(u1) == plan.bytes_of(u2) == 0
    st = make_state(m)
    for step in range(3):
        st.run(_at(2 * step))
        c = st.last_run
        assert c.allocated_bytes == plan.allocated_bytes, f"step {step}"
        assert c.peak_bytes == plan.peak_bytes, f"step {step}"
        assert c.cache_bytes == plan.state_bytes
        # an in-place update copies nothing; a snapshot read after the write is one copy
        assert c.copied_bytes == (CACHE if snapshot else 0)
    assert st.lengths == {"cache": 6}


def test_plan_equals_the_run_time_counters_of_a_concat_binding():
    m = _concat_model()
    plan = memory_plan(m)
    assert plan.exact and plan.state_bytes == 4 * 8 * 4
    st = make_state(m)
    for _ in range(2):
        st.run({"new": np.ones((4, 8), np.float32)})
        assert st.last_run.allocated_bytes == plan.allocated_bytes
        assert st.last_run.peak_bytes == plan.peak_bytes


def test_persistent_values_are_never_released_or_reused():
    m, cache, u1, u2 = _cache_model(snapshot=True)
    live = liveness(m.graph, effect_analysis(m))
    released = {v.name for step in live.release_after for v in step}
    assert not released & {cache.name, u1.name, u2.name}
    st = make_state(m)
    steps = st.session._cg.steps  # (label, input slots, output slots, released slots)
    slots = {0}  # the cache is the program's first input slot
    for label, ins, outs, _ in steps:
        if "CacheUpdate" in label and ins[0] in slots:
            slots.update(outs)  # the in-place versions share the cache's storage
    assert len(slots) == 3
    assert all(not set(released) & slots for *_, released in steps)
    address = st.addresses()["cache"]
    for step in range(3):
        st.run(_at(2 * step))
        assert st.addresses()["cache"] == address
    np.testing.assert_array_equal(st.values["cache"][0, :6], 1.0)  # every write kept


def test_scalar_results_are_counted_like_the_plan():
    m, *_ = _cache_model(snapshot=False, keepdims=0)
    plan = memory_plan(m)
    st = make_state(m)
    st.run(_at(0))
    assert st.last_run.allocated_bytes == plan.allocated_bytes


def test_constant_nodes_are_counted_like_the_plan():
    g = GraphBuilder(opset=23)
    x = g.input("x", F, [4])
    g.output(g.op.Add(x, g.constant(np.ones(4, np.float32))), "y")
    m = g.to_model()
    plan = memory_plan(m)
    sess = InferenceSession(m)
    sess.run(None, {"x": np.ones(4, np.float32)})
    assert sess.last_run.allocated_bytes == plan.allocated_bytes
