"""Memory plan: exact bytes on concrete models, in-place and persistent state, views,
symbolic and unknown shapes, the built-in decoder."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from onnxforge.graphbuilder.builder.graph_builder import READ_WRITE, GraphBuilder
from onnxforge.graphbuilder.shapes.symbolic import SymExpr
from onnxforge.passes import AnalysisManager, PassManager, memory_plan
from onnxforge.samples import build_builtin

FLOAT, INT64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
V = 4 * 8 * 4  # bytes of a float32 [4, 8] value


def test_chain_peak_and_allocations_by_hand():
    # a = Relu(x); b = Neg(a); c = Abs(a); d = Add(b, c); y = Mul(d, a)
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [4, 8])
    a = g.op.Relu(x)
    b, c = g.op.Neg(a), g.op.Abs(a)
    d = g.op.Add(b, c)
    y = g.output(g.op.Mul(d, a), "y")
    plan = memory_plan(g.to_model())
    # step 0: a; 1: a b; 2: a b c; 3: a b c d (b, c released after); 4: a d y
    assert plan.step_bytes == (V, 2 * V, 3 * V, 4 * V, 3 * V)
    assert plan.peak_bytes == 4 * V and plan.allocated_bytes == 5 * V
    assert plan.state_bytes == 0 and plan.exact and plan.unknown == () and plan.nested == ()
    assert plan.kind[x] == "input" and plan.kind[y] == "result" and plan.kind[b] == "buffer"
    assert plan.bytes_of(y) == V and plan.bytes_of(x) == 0


def test_element_sizes_follow_the_in_memory_dtype():
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [4, 8])
    h = g.op.Cast(x, to=TensorProto.FLOAT16)
    i = g.op.Cast(h, to=TensorProto.INT64)
    g.output(g.op.Cast(i, to=TensorProto.BOOL), "y")
    plan = memory_plan(g.to_model())
    assert [plan.bytes_of(n.outputs[0]) for n in plan.order] == [64, 256, 32]
    assert plan.step_bytes == (64, 64 + 256, 256 + 32) and plan.peak_bytes == 320


def test_views_count_zero_and_keep_their_source_alive():
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [4, 8])
    a = g.op.Relu(x)
    r = g.op.Reshape(a, g.initializer("s", np.array([32], np.int64)))
    u = g.op.Unsqueeze(r, g.initializer("ax", np.array([0], np.int64)))
    b = g.op.Neg(u)
    g.output(g.op.Abs(b), "y")
    plan = memory_plan(g.to_model())
    assert plan.kind[r] == "view" and plan.kind[u] == "view" and plan.bytes_of(u) == 0
    # a lives until its view's last reader (Neg, step 3), then b until Abs
    assert plan.step_bytes == (V, V, V, 2 * V, 2 * V)
    assert plan.allocated_bytes == 3 * V and plan.exact


def _cache_model(*, snapshot: bool):
    """cache RW float32 [1, 8, 4] (128 bytes); two in-place writes and readers of each
    version; with ``snapshot`` an Identity of version 0 read after the write."""
    g = GraphBuilder(opset=23)
    cache = g.input("cache", FLOAT, [1, 8, 4], access=READ_WRITE)
    vals = g.input("vals", FLOAT, [1, 1, 4])
    pos = g.input("pos", INT64, [])
    s0 = g.op.ReduceSum(cache, keepdims=0)              # 4 bytes
    snap = g.op.Identity(cache) if snapshot else None
    u1 = g.op.CacheUpdate(cache, vals, pos)
    u2 = g.op.CacheUpdate(u1, vals, pos)
    r2 = g.op.ReduceSum(g.op.Flatten(u2), keepdims=0)   # a view of the cache, then 4 bytes
    total = g.op.Add(s0, r2)
    if snap is not None:
        total = g.op.Add(total, g.op.ReduceSum(snap, keepdims=0))
    g.output(total, "total")
    g.output(u2, "cache_out")
    g.bind("cache", "cache_out")
    return g.to_model(), cache, u1, u2, snap


def test_in_place_writes_count_zero_and_the_cache_once():
    m, cache, u1, u2, _ = _cache_model(snapshot=False)
    plan = memory_plan(m)
    assert plan.kind[cache] == "state" and plan.kind[u1] == "in_place" and plan.kind[u2] == "in_place"
    assert plan.bytes_of(u1) == plan.bytes_of(u2) == 0
    assert plan.state_bytes == 128  # three names, one storage
    # buffers: s0 (4), r2 (4), total (4); the Flatten is a view of version 2
    assert plan.allocated_bytes == 12 and plan.exact
    assert plan.step_bytes == (4, 4, 4, 4, 8, 12) and plan.peak_bytes == 12


def test_a_snapshot_read_after_the_write_is_a_buffer():
    m, _, _, _, snap = _cache_model(snapshot=True)
    plan = memory_plan(m)
    assert plan.kind[snap] == "buffer" and plan.bytes_of(snap) == 128
    assert plan.state_bytes == 128
    assert plan.allocated_bytes == 128 + 4 * 5  # the copy, and five scalars
    # ReduceSum, Identity, CacheUpdate x2, Flatten, ReduceSum, Add (s0, r2 go),
    # ReduceSum(snap) (the copy goes), Add
    assert plan.step_bytes == (4, 132, 132, 132, 132, 136, 140, 136, 12)
    assert plan.peak_bytes == 140


def test_a_persistent_binding_without_alias_counts_its_input_once():
    g = GraphBuilder(opset=21)
    past = g.input("past", FLOAT, [4, 8])
    new = g.input("new", FLOAT, [4, 8])
    present = g.op.Concat(past, new, axis=0)            # [8, 8], a fresh buffer every run
    g.output(g.op.ReduceSum(past, keepdims=0), "s")
    g.output(g.op.Identity(present), "present")
    g.bind("past", "present")
    m = g.to_model()
    plan = memory_plan(m)
    out = m.graph.outputs[1]
    assert plan.kind[past] == "state" and plan.state_bytes == V
    assert plan.kind[present] == "result" and plan.kind[out] == "view"
    assert plan.allocated_bytes == 2 * V + 4 and plan.peak_bytes == 2 * V + 4


def test_symbolic_unknown_and_nested_plans_are_not_exact():
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, ["n", 8])
    a = g.op.Relu(x)
    g.output(g.op.Neg(a), "y")
    plan = memory_plan(g.to_model())
    assert [str(b) for b in plan.step_bytes] == ["32*n", "64*n"]
    # the peak of symbolic steps is their max (not simplified by sign reasoning)
    assert isinstance(plan.peak_bytes, SymExpr) and str(plan.peak_bytes) == "max(32*n, 64*n)"
    assert not plan.exact and plan.unknown == ()
    assert plan.peak_for({"n": 4}) == 2 * V

    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [None, 8])
    a = g.op.Relu(x)
    g.output(g.op.Neg(a), "y")
    plan = memory_plan(g.to_model())
    assert not plan.exact and {v.name for v in plan.unknown} == {a.name, "y"}

    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [4, 8])
    c = g.input("c", BOOL, [])
    t, e = g.subgraph("then"), g.subgraph("else")
    t.output(t.op.Relu(x), "t_out")
    e.output(e.op.Neg(x), "e_out")
    y = g.output(g.op.If(c, then_branch=t, else_branch=e), "y")
    plan = memory_plan(g.to_model())
    assert [n.op_type for n in plan.nested] == ["If"] and not plan.exact
    assert plan.bytes_of(y) == V  # the If's output is counted, its bodies are not


def test_builtin_decoder_plan():
    m = build_builtin("decoder")
    am = AnalysisManager(m)
    plan = am.get("memory_plan")
    assert am.get("memory_plan") is plan
    caches = [v for v in m.graph.inputs if v.name.startswith("cache.")]
    assert len(caches) == 4 and all(plan.kind[c] == "state" for c in caches)
    assert plan.state_bytes == 4 * (1 * 2 * 64 * 8 * 4)  # each cache once
    for out in m.graph.outputs:
        if out.name.startswith("present."):
            assert plan.kind[out] == "in_place" and plan.bytes_of(out) == 0
    logits = next(v for v in m.graph.outputs if v.name == "logits")
    assert plan.kind[logits] == "result" and str(plan.bytes_of(logits)) == "256*seq"
    # Range(position, position + seq) has a length shape inference cannot name
    assert not plan.exact and {v.producer().op_type for v in plan.unknown} == {"Range", "LessOrEqual"}
    assert plan.nested == ()
    by_hand = max(int(s.evaluate({"seq": 3})) if isinstance(s, SymExpr) else s for s in plan.step_bytes)
    assert plan.peak_for({"seq": 3}) == by_hand > 0
    assert set(plan.buffers) == {v for v, k in plan.kind.items() if k in ("buffer", "result")}


def test_memory_plan_is_recomputed_after_a_pass_changes_the_graph():
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [4, 8])
    g.op.Neg(x)  # dead
    g.output(g.op.Relu(x), "y")
    m = g.to_model()
    pm = PassManager(["dce"])
    first = pm.analyses.get("memory_plan", m)
    assert first.allocated_bytes == 2 * V
    pm(m)
    second = pm.analyses.get("memory_plan", m)
    assert second is not first and second.allocated_bytes == V and len(second.order) == 1
