"""Liveness: schedule, last use, storage sharing and release lists per container."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from onnxforge.graphbuilder.builder.graph_builder import READ_WRITE, GraphBuilder
from onnxforge.graphbuilder.ir.core import Graph
from onnxforge.passes import AnalysisManager, liveness
from onnxforge.passes.analyses.effects import effect_analysis
from onnxforge.passes.analyses.liveness import view_source

FLOAT, INT64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _released(live) -> list[list[str]]:
    return [[v.name for v in step] for step in live.release_after]


def test_chain_last_use_and_release_after_the_last_reader():
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [4, 8])
    a = g.op.Relu(x)
    b = g.op.Neg(a)
    c = g.op.Add(a, b)
    y = g.output(g.op.Abs(c), "y")
    m = g.to_model()
    live = liveness(m.graph)
    assert [n.op_type for n in live.order] == ["Relu", "Neg", "Add", "Abs"]
    assert live.last_use[x] == 0 and live.last_use[a] == 2 and live.last_use[b] == 2
    assert live.last_use[c] == 3 and live.last_use[y] == -1  # an output no step reads
    # a and b go after the Add that reads both; c after Abs; the output and the input never
    assert _released(live) == [[], [], [a.name, b.name], [c.name]]


def test_a_value_nobody_reads_is_released_after_its_own_step():
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [4])
    dead = g.op.Neg(x)
    g.output(g.op.Relu(x), "y")
    live = liveness(g.to_model().graph)
    assert live.last_use[dead] == -1
    assert _released(live) == [[dead.name], []]


def test_a_view_keeps_its_source_alive_and_initializers_are_never_released():
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [4, 8])
    shape = g.initializer("shape", np.array([32], np.int64))
    t = g.op.Relu(x)
    r = g.op.Reshape(t, shape)
    s = g.op.Neg(r)
    g.output(g.op.Abs(s), "y")
    m = g.to_model()
    live = liveness(m.graph)
    assert live.storage_of(r) is t and live.storage_of(t) is t
    assert live.last_use[t] == 1 and live.last_use[r] == 2 and live.last_use[shape] == 1
    # t's storage is released with its view, after the view's last reader (step 2)
    assert _released(live) == [[], [], [t.name, r.name], [s.name]]


def test_a_view_of_a_graph_output_or_input_is_never_released():
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [4, 8])
    t = g.op.Relu(x)
    g.output(t, "t")
    ident = g.op.Identity(t)
    flat = g.op.Flatten(x)
    g.output(g.op.Add(g.op.Neg(ident), g.op.Reshape(flat, g.initializer("s", np.array([4, 8])))), "y")
    live = liveness(g.to_model().graph)
    assert live.storage_of(ident) is t and live.storage_of(flat) is x
    released = {v.name for step in live.release_after for v in step}
    assert not released & {t.name, ident.name, flat.name, x.name}
    neg = next(n for n in live.order if n.op_type == "Neg").outputs[0]
    assert released == {neg.name}  # a Reshape of the input's view is the input's storage too


def test_subgraph_reads_of_outer_values_count_at_the_owner_node():
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [4])
    cond = g.input("c", BOOL, [])
    a = g.op.Relu(x)
    b = g.op.Neg(x)
    late = g.op.Abs(x)  # read only inside a branch nested two levels deep
    then_b, else_b = g.subgraph("then"), g.subgraph("else")
    inner_then, inner_else = then_b.subgraph("it"), then_b.subgraph("ie")
    inner_then.output(inner_then.op.Add(late, a), "it_out")
    inner_else.output(inner_else.op.Sub(a, late), "ie_out")
    nested = then_b.op.If(cond, then_branch=inner_then, else_branch=inner_else)
    then_b.output(then_b.op.Mul(nested, a), "t_out")
    else_b.output(b, "e_out")  # a branch returning an outer value reads it
    y = g.op.If(cond, then_branch=then_b, else_branch=else_b)
    g.output(g.op.Sigmoid(y), "y")
    m = g.to_model()
    am = AnalysisManager(m)
    lm = am.get("liveness")
    main = lm.main
    step_if = [n.op_type for n in main.order].index("If")
    assert step_if == 3
    for v in (a, b, late, cond):
        assert main.last_use[v] == step_if
    assert _released(main)[step_if] == [a.name, b.name, late.name]
    then_graph: Graph = next(sg for sg in main.order[step_if].subgraphs() if sg.name.startswith("then"))
    inner = lm.of(then_graph)
    assert [n.op_type for n in inner.order] == ["If", "Mul"]
    assert inner.last_use[a] == 1 and inner.last_use[late] == 0  # at the nested If
    # outer values are not this body's to release; the nested If's output goes after Mul
    assert _released(inner) == [[], [nested.name]]


def _cache_chain():
    """cache RW [1, 8, 4]: s0 = ReduceSum(cache); snap = Identity(cache);
    u1 = CacheUpdate(cache, v, p); u2 = CacheUpdate(u1, v, p); view = Reshape(u2);
    out = Add(ReduceSum(view), Add(s0, ReduceSum(snap))); bind cache <- u2."""
    g = GraphBuilder(opset=23)
    cache = g.input("cache", FLOAT, [1, 8, 4], access=READ_WRITE)
    v = g.input("v", FLOAT, [1, 1, 4])
    p = g.input("p", INT64, [])
    s0 = g.op.ReduceSum(cache)
    snap = g.op.Identity(cache)
    u1 = g.op.CacheUpdate(cache, v, p)
    u2 = g.op.CacheUpdate(u1, v, p)
    view = g.op.Reshape(u2, g.initializer("flat", np.array([32], np.int64)))
    r_view = g.op.ReduceSum(view)
    r_snap = g.op.ReduceSum(snap)
    g.output(g.op.Add(r_view, g.op.Add(s0, r_snap)), "out")
    g.output(u2, "cache_out")
    g.bind("cache", "cache_out")
    return g.to_model(), {"cache": cache, "s0": s0, "snap": snap, "u1": u1, "u2": u2,
                          "view": view, "r_view": r_view, "r_snap": r_snap}


def test_cache_update_chain_last_uses_storage_and_no_state_released():
    m, v = _cache_chain()
    fx = effect_analysis(m)
    live = liveness(m.graph, fx)
    ops = [n.op_type for n in live.order]
    assert ops[:5] == ["ReduceSum", "Identity", "CacheUpdate", "CacheUpdate", "Reshape"]
    # readers of version 0 come before its writer, the writer is the last use of version 0
    assert live.last_use[v["cache"]] == 2 and live.last_use[v["u1"]] == 3
    assert live.last_use[v["u2"]] == 4  # the Reshape; the binding is not a step
    assert live.storage_of(v["u1"]) is v["cache"] and live.storage_of(v["u2"]) is v["cache"]
    assert live.storage_of(v["view"]) is v["cache"]  # a view of version 2, never overwritten
    # the snapshot of version 0 is read after the write: it gets its own buffer
    assert view_source(v["snap"].producer(), fx) is None and live.storage_of(v["snap"]) is v["snap"]
    released = [x for step in live.release_after for x in step]
    assert not {x.name for x in released} & {"cache", "cache_out", v["u1"].name, v["view"].name}
    assert {x.name for x in released} == {v["s0"].name, v["snap"].name, v["r_view"].name,
                                          v["r_snap"].name, "Add_out"}
    snap_step = live.last_use[v["snap"]]
    assert v["snap"] in live.release_after[snap_step] and ops[snap_step] == "ReduceSum"


def test_function_body_liveness_and_default_effects():
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [4])
    fb = g.function("test.local", "F", ["a"])
    (a,) = fb.graph.inputs
    t = fb.op.Relu(a)
    fb.output(fb.op.Add(fb.op.Neg(t), t), "r")
    g.output(g.op["test.local"].F(x), "y")
    m = g.to_model()
    body = m.function("test.local", "F")
    live = liveness(body)  # effects computed for a model around the body
    assert live.last_use[a] == 0 and live.last_use[t] == 2
    assert _released(live) == [[], [], [t.name, fb.graph.nodes[1].outputs[0].name]]
    lm = AnalysisManager(m).get("liveness")
    assert _released(lm.of(body)) == _released(live)
    assert _released(lm.main) == [[]]


def _check_schedule(m) -> int:
    """Replay every container's schedule: nothing is read after its storage was released,
    every released value is owned by the container and released once, and every owned
    temporary is released. Returns the number of released values."""
    am = AnalysisManager(m)
    lm, fx = am.get("liveness"), am.get("effects")
    total = 0
    for container, live in lm.by_container.items():
        gone: set = set()
        outputs = set(container.outputs)
        for i, n in enumerate(live.order):
            read = [v for v in n.inputs if v is not None]
            for sg in n.subgraphs():
                read += [v for g in sg.all_graphs() for k in g for v in k.inputs if v is not None]
            assert not any(live.storage_of(v) in gone or v in gone for v in read), n
            for v in live.release_after[i]:
                assert v.producer() is not None and v.producer().graph is container
                assert v not in gone and v not in outputs and not fx.is_state(v)
                gone.add(v)
        total += len(gone)
        owned = {o for n in live.order for o in n.outputs if o.name}
        kept = {o for o in owned if o in outputs or fx.is_state(live.storage_of(o))
                or live.storage_of(o) not in owned or live.storage_of(o) in outputs
                or any(live.storage_of(x) is live.storage_of(o) for x in outputs)}
        assert owned - kept <= gone
    return total


def test_release_lists_replay_on_the_builtin_decoder():
    from onnxforge.samples import build_builtin

    assert _check_schedule(build_builtin("decoder")) > 40


def test_release_lists_replay_on_exported_decoders(decoder_models):
    import onnxforge as of

    for key in ("torch23", "genai_fp32"):
        assert _check_schedule(of.load(decoder_models[key])) > 50
