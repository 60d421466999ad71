"""Property tests: random small graphs through every pass.

Each generated model mixes plain operators (duplicates, identities, dead nodes,
constants, foldable subexpressions, algebraic identities) with every extension
kind: a struct-type catalogue, encoded initializers (affine and struct, some
duplicated), persistent bindings and an in-place cache write aliased to a
READ_WRITE input. After every pass of the default pipeline the model has no
IR or static-rule violation, and bindings and aliases name live, compatible
values; a model without extensions computes the same outputs in onnxruntime
before and after.
"""
from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto

from onnxforge.graphbuilder.builder.graph_builder import READ_WRITE, GraphBuilder
from onnxforge.graphbuilder.ir.core import Model, Value
from onnxforge.graphbuilder.serde import to_onnx
from onnxforge.passes import DEFAULT_PIPELINE, PassManager, PassRecord, get_pass
from onnxforge.proto_ext.types import TensorType

from tests.passes.helpers import FLOAT, assert_sound, ort_run

VALUES = [np.array([1, 1, 1, 1], np.float32), np.array([0.5, -2, 3, 0], np.float32),
          np.array([-0.0, -0.0, -0.0, -0.0], np.float32), np.array([2, 2, 2, 2], np.float32)]
BINARY = ["Add", "Mul", "Sub", "Max", "Min"]
UNARY = ["Neg", "Relu", "Identity", "Abs"]

step = st.one_of(
    st.tuples(st.sampled_from(BINARY), st.integers(0, 63), st.integers(0, 63)),
    st.tuples(st.sampled_from(UNARY), st.integers(0, 63), st.just(0)),
    st.tuples(st.just("Init"), st.integers(0, len(VALUES) - 1), st.just(0)),
    st.tuples(st.just("Const"), st.integers(0, len(VALUES) - 1), st.just(0)),
    st.tuples(st.just("Reshape2"), st.integers(0, 63), st.just(0)),
    st.tuples(st.just("Self"), st.sampled_from(["Max", "Min"]), st.integers(0, 63)),
)


@st.composite
def models(draw, extensions: bool) -> Model:
    g = GraphBuilder(opset=21)
    pool: list[Value] = [g.input("x", FLOAT, [4])]
    counter = iter(range(10_000))
    for op, a, b in draw(st.lists(step, min_size=1, max_size=24)):
        pick = pool[a % len(pool)] if isinstance(a, int) and op not in ("Init", "Const") else None
        if op in BINARY:
            v = g.make_node(op, [pick, pool[b % len(pool)]], 1).outputs[0]
        elif op in UNARY:
            v = g.make_node(op, [pick], 1).outputs[0]
        elif op == "Init":
            v = g.initializer(f"w{next(counter)}", VALUES[a])
        elif op == "Const":
            v = g.make_node("Constant", [], [f"k{next(counter)}"], value=VALUES[a]).outputs[0]
        elif op == "Reshape2":
            square = g.initializer(f"s{next(counter)}", np.array([2, 2], np.int64))
            flat = g.initializer(f"f{next(counter)}", np.array([4], np.int64))
            v = g.op.Reshape(g.op.Reshape(pick, square), flat)
        else:  # Max(x, x) / Min(x, x)
            x = pool[b % len(pool)]
            v = g.make_node(a, [x, x], 1).outputs[0]
        pool.append(v)
    computed = [v for v in pool if v.producer() is not None]
    chosen = draw(st.lists(st.integers(0, 10_000), min_size=1, max_size=3, unique=True))
    outs: list[Value] = []
    for k in chosen:
        v = computed[k % len(computed)] if computed else pool[0]
        if any(v is o for o in outs) or v.producer() is None or v.is_graph_output():
            v = g.op.Identity(v)
        outs.append(v)
    for k, v in enumerate(outs):
        g.output(v, f"out{k}", type=TensorType(FLOAT, (4,)))
    if extensions:
        _add_extensions(g, draw)
    return g.to_model()


def _add_extensions(g: GraphBuilder, draw) -> None:
    cache = g.input("cache", FLOAT, [1, 8, 4], access=READ_WRITE)
    vals = g.input("vals", FLOAT, [1, 1, 4])
    pos = g.input("pos", TensorProto.INT64, [])
    upd = g.op.CacheUpdate(cache, vals, pos)
    if draw(st.booleans()):
        upd = g.op.Identity(upd)  # forwarded write
    g.output(upd, "cache_out")
    g.bind("cache", "cache_out")
    state = g.input("state", FLOAT, [4])
    step = g.initializer("state_step", VALUES[draw(st.integers(0, len(VALUES) - 1))])
    nxt = g.op.Add(state, step)
    if draw(st.booleans()):
        g.op.Add(state, step)  # a duplicate of the bound computation, unused
    g.output(nxt, "state_out")
    g.bind("state", "state_out")
    raw = np.linspace(-1, 1, 8, dtype=np.float32)
    for k in range(draw(st.integers(1, 3))):  # equal affine encodings: dedup candidates
        g.encoded_initializer(f"q{k}", raw, storage_type=TensorProto.INT8)
    rec = g.declare_struct_type("rec", [("codes", TensorType(TensorProto.INT8, (4,))),
                                        ("scale", TensorType(FLOAT, ()))])
    payload = bytes(range(8 * draw(st.integers(1, 3))))
    for k in range(draw(st.integers(1, 2))):
        g.encoded_initializer(f"r{k}", struct_type=rec, codes=payload)


def _checked_pipeline() -> PassManager:
    def after_each(record: PassRecord) -> None:
        assert_sound(_current[0])

    return PassManager([get_pass(n) for n in DEFAULT_PIPELINE], debug=True, progress=after_each)


_current: list[Model] = []


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(models(extensions=True))
def test_every_pass_keeps_extensions_sound(model: Model):
    bindings = [(i.name, o.name) for i, o in model.graph.bindings]
    n_struct = len(model.struct_types)
    _current[:] = [model]
    _checked_pipeline()(model)
    assert [(i.name, o.name) for i, o in model.graph.bindings] == bindings
    assert len(model.struct_types) == n_struct
    assert model.graph.encoded_initializers  # deduplicated, never all dropped
    ops = [n.op_type for n in model.graph]
    assert ops.count("CacheUpdate") == 1


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(models(extensions=False), st.integers(0, 2**31 - 1))
def test_pipeline_preserves_outputs(model: Model, seed: int):
    before = to_onnx(model)
    names = [v.name for v in model.graph.outputs]
    _current[:] = [model]
    _checked_pipeline()(model)
    assert [v.name for v in model.graph.outputs] == names
    x = np.random.default_rng(seed).standard_normal(4).astype(np.float32)
    x[0] = -0.0
    x[1] = np.nan
    want = ort_run(before, {"x": x})
    got = ort_run(model, {"x": x})
    for w, v in zip(want, got):
        np.testing.assert_array_equal(w, v)
        assert np.array_equal(np.signbit(w), np.signbit(v))
