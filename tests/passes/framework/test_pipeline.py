"""The default pipeline: synthetic chain, stateful model, real exported decoders."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto

from onnxforge.graphbuilder.builder.graph_builder import GraphBuilder
from onnxforge.graphbuilder.serde import load, save, to_onnx
from onnxforge.passes import DEFAULT_PIPELINE, PassManager, check_invariants, optimize
from onnxforge.passes.framework.invariants import containers
from onnxforge.proto_ext.types import TensorType

from tests.conftest import random_decoder_feeds
from tests.passes.helpers import (
    FLOAT,
    assert_same_outputs,
    assert_sound,
    ort_run,
    stateful_model,
)

BENCH = Path(__file__).resolve().parents[3] / "benchmarks"


def _chain_reference(n: int) -> onnx.ModelProto:
    sys.path.insert(0, str(BENCH.parent))
    try:
        from benchmarks.chain import build_chain
    finally:
        sys.path.pop(0)
    return to_onnx(build_chain(n))


def test_default_pipeline_is_a_valid_order():
    assert PassManager(DEFAULT_PIPELINE).names == list(DEFAULT_PIPELINE)


def test_chain_end_state_and_numerics():
    proto = _chain_reference(1300)
    m = load(proto)
    assert len(m.graph) == 1300
    optimize(m, debug=True)
    # per 100 steps the peers keep Add, Mul (x 25) + Add + Max = 52 nodes; Max(a, a) -> a and
    # x * 1 -> x (one constant in ten is 1.0) remove more
    assert len(m.graph) < 52 * 1300 * 100 // 129 // 100 + 2
    assert len(m.graph.initializers) == 10
    x = np.linspace(-2, 2, 64, dtype=np.float32)
    assert_same_outputs(proto, m, {"x": x})


def test_stateful_model_keeps_its_state_machinery():
    m = stateful_model(forwarded=True)
    optimize(m, debug=True)
    ops = [n.op_type for n in m.graph]
    assert ops == ["CacheUpdate", "Add", "Relu"]
    (i, o), = m.graph.bindings
    assert (i.name, o.name) == ("cache", "cache_out") and o.alias_of is i
    assert_sound(m)


def test_optimize_accepts_a_model_proto():
    proto = _chain_reference(300)
    m = optimize(proto)
    assert len(m.graph) < 300 and check_invariants(m) == []


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["torch20", "torch23", "genai_fp32", "genai_int4"])
def test_real_decoders_optimize_soundly_and_compute_the_same(decoder_models, variant, tmp_path):
    path = decoder_models[variant]
    m = load(path)
    nodes = len(m.graph)
    optimize(m, debug=True)
    assert len(m.graph) <= nodes
    assert check_invariants(m) == []
    out = tmp_path / "model.onnx"
    save(m, out)
    feeds = random_decoder_feeds(path, past=3, seq=2)
    want = ort_run(path, feeds)
    got = ort_run(out, feeds)
    for w, g in zip(want, got):
        assert w.shape == g.shape and w.dtype == g.dtype
        np.testing.assert_array_equal(w, g)


def test_loop_body_with_outer_references_and_carried_values():
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [4])
    trips = g.initializer("trips", np.array(3, np.int64))
    cond = g.initializer("cond", np.array(True))
    scale = g.op.Exp(x)  # outer value read by the body
    body = g.subgraph("body")
    it = body.input("it", TensorProto.INT64, [])
    c_in = body.input("c_in", TensorProto.BOOL, [])
    acc = body.input("acc", FLOAT, [4])
    a1 = body.op.Mul(acc, scale)
    a2 = body.op.Mul(acc, scale)  # duplicate
    one = body.make_node("Constant", [], ["body_one"], value=np.ones(4, np.float32)).outputs[0]
    nxt = body.op.Mul(body.op.Max(a1, a2), one)  # Max(a, a) and x * 1 go
    body.op.Neg(nxt)  # dead
    c_out = body.op.Identity(c_in)  # a body output fed by a body input: stays
    for v in (c_out, nxt):
        body.graph.outputs.append(v)
    c_out.type = TensorType(TensorProto.BOOL, ())
    nxt.type = TensorType(FLOAT, (4,))
    res = g.op.Loop(trips, cond, x, body=body)
    g.output(res, "y", type=TensorType(FLOAT, (4,)))
    m = g.to_model()
    before = to_onnx(m)
    optimize(m, debug=True)
    loop = next(n for n in m.graph if n.op_type == "Loop")
    assert [n.op_type for n in loop.attributes["body"].value] == ["Mul", "Identity"]
    assert_same_outputs(before, m, {"x": np.array([0.5, -1, 0.25, 2], np.float32)})


def test_default_pipeline_folds_shapes_inlines_ifs_and_fuses(tmp_path):
    # Shape(x)[1] == 4 decides an If whose then-branch holds Conv + BatchNormalization:
    # the end state is one Conv, numerically the original's, and no larger on disk.
    for name in ("shape_folding", "if_inlining", "fusion", "slice_split"):
        assert name in DEFAULT_PIPELINE
    rng = np.random.default_rng(4)
    g = GraphBuilder(opset=21)
    x = g.input("x", TensorProto.FLOAT, ["n", 4, 6, 6])
    ch = g.op.Gather(g.op.Shape(x), g.initializer("one", np.array(1, np.int64)), axis=0)
    cond = g.op.Equal(ch, g.initializer("four", np.array(4, np.int64)))
    t = g.subgraph("then")
    w = g.initializer("W", rng.standard_normal((4, 4, 3, 3)).astype(np.float32))
    bn = [g.initializer(k, v.astype(np.float32)) for k, v in (
        ("s", rng.standard_normal(4)), ("b", rng.standard_normal(4)), ("mean", rng.standard_normal(4)),
        ("var", np.abs(rng.standard_normal(4)) + 0.5))]
    t.output(t.op.BatchNormalization(t.op.Conv(x, w, pads=[1, 1, 1, 1]), *bn), "t_out")
    e = g.subgraph("else")
    e.output(e.op.Neg(x), "e_out")
    g.output(g.op.If(cond, then_branch=t.graph, else_branch=e.graph), "y")
    m = g.to_model()
    before = to_onnx(m)
    src = tmp_path / "m.onnx"
    src.write_bytes(before.SerializeToString())
    out = optimize(str(src), debug=True)
    assert [n.op_type for c in containers(out) for n in c] == ["Conv"]
    assert [v.name for v in out.graph.outputs] == ["y"]
    assert len(to_onnx(out).SerializeToString()) <= src.stat().st_size
    feeds = {"x": rng.standard_normal((2, 4, 6, 6)).astype(np.float32)}
    want, got = ort_run(before, feeds)[0], ort_run(out, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(want).max())))
