"""Declarative rewrite rules, the fixed-point driver and the default algebraic rules."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from onnx import TensorProto

from onnxforge.graphbuilder.builder.graph_builder import GraphBuilder
from onnxforge.graphbuilder.ir.core import Model, Value
from onnxforge.graphbuilder.serde import to_onnx
from onnxforge.passes import (
    DEFAULT_RULES,
    Const,
    Pattern,
    RewriteError,
    RewritePass,
    Rule,
    RuleTable,
    apply_rules,
    optimize,
)

from tests.passes.helpers import FLOAT, assert_same_outputs, assert_sound, output_names

RNG = np.random.default_rng(0)


def _ops(m: Model) -> list[str]:
    return [n.op_type for n in m.graph]


def _case(build: Callable[[GraphBuilder, Value], Value], *, dtype: int = FLOAT,
          shape: tuple[int, ...] = (2, 3), feed: np.ndarray | None = None) -> tuple[Model, dict]:
    """``y = Relu-free wrapper: Abs(build(x))`` so the rewritten value is never a graph input."""
    g = GraphBuilder(opset=21)
    x = g.input("x", dtype, list(shape))
    g.output(g.op.Identity(build(g, x)), "y")
    if feed is None:
        feed = RNG.standard_normal(shape).astype(np.float32)
    return g.to_model(), {"x": feed}


def _check(build, expected_ops: list[str], **kw) -> Model:
    m, feeds = _case(build, **kw)
    before = to_onnx(m)
    RewritePass()(m)
    assert _ops(m) == expected_ops
    assert_sound(m)
    assert_same_outputs(before, m, feeds)
    whole, _ = _case(build, **kw)  # the default pipeline, invariants checked between passes
    assert_same_outputs(before, optimize(whole, debug=True), feeds)
    return m


def test_multiplicative_and_additive_identities():
    ones = np.ones((1, 3), np.float32)
    _check(lambda g, x: g.op.Mul(x, g.initializer("one", ones)), ["Identity"])
    _check(lambda g, x: g.op.Mul(g.initializer("one", ones), x), ["Identity"])
    _check(lambda g, x: g.op.Div(x, g.initializer("one", np.float32(1))), ["Identity"])
    # broadcasting would change the shape: kept
    _check(lambda g, x: g.op.Mul(x, g.initializer("one", np.ones((4, 2, 3), np.float32))),
           ["Mul", "Identity"])
    # +0.0 turns -0.0 into +0.0, so only -0.0 is an identity for floats; x - (+0.0) is one
    _check(lambda g, x: g.op.Add(x, g.initializer("z", np.float32(0.0))), ["Add", "Identity"])
    _check(lambda g, x: g.op.Add(x, g.initializer("z", np.float32(-0.0))), ["Identity"],
           feed=np.array([[-0.0, 0.0, 1.0], [2.0, -3.0, np.inf]], np.float32))
    _check(lambda g, x: g.op.Sub(x, g.initializer("z", np.float32(0.0))), ["Identity"],
           feed=np.array([[-0.0, 0.0, 1.0], [2.0, -3.0, np.nan]], np.float32))
    _check(lambda g, x: g.op.Add(g.initializer("z", np.zeros(3, np.int32)), x), ["Identity"],
           dtype=TensorProto.INT32, feed=np.arange(6, dtype=np.int32).reshape(2, 3))


def test_idempotent_and_involutive_operators():
    _check(lambda g, x: g.op.Max(x, x), ["Identity"])
    _check(lambda g, x: g.op.Min(x, x), ["Identity"])
    _check(lambda g, x: g.op.Neg(g.op.Neg(x)), ["Identity"])
    bools = np.array([[True, False, True], [False, False, True]])
    _check(lambda g, x: g.op.And(x, x), ["Identity"], dtype=TensorProto.BOOL, feed=bools)
    _check(lambda g, x: g.op.Not(g.op.Not(x)), ["Identity"], dtype=TensorProto.BOOL, feed=bools)
    _check(lambda g, x: g.op.Concat(x, axis=0), ["Identity"])


def test_transposes_compose():
    m = _check(lambda g, x: g.op.Transpose(g.op.Transpose(x, perm=[1, 2, 0]), perm=[1, 2, 0]),
               ["Transpose", "Identity"], shape=(2, 3, 4),
               feed=RNG.standard_normal((2, 3, 4)).astype(np.float32))
    assert list(m.graph)[0].attr("perm") == [2, 0, 1]
    _check(lambda g, x: g.op.Transpose(g.op.Transpose(x, perm=[1, 0]), perm=[1, 0]), ["Identity"])
    _check(lambda g, x: g.op.Transpose(g.op.Transpose(x)), ["Identity"])  # default perms


def test_reshapes_and_casts():
    def shape(g: GraphBuilder, name: str, dims: list[int]) -> Value:
        return g.initializer(name, np.array(dims, np.int64))

    _check(lambda g, x: g.op.Reshape(g.op.Reshape(x, shape(g, "a", [3, 2])), shape(g, "b", [6])),
           ["Reshape", "Identity"])
    # a 0 in the outer shape copies a dimension of the inner result: kept
    _check(lambda g, x: g.op.Reshape(g.op.Reshape(x, shape(g, "a", [3, 2])), shape(g, "b", [0, 2, 1])),
           ["Reshape", "Reshape", "Identity"])
    _check(lambda g, x: g.op.Reshape(x, shape(g, "s", [2, -1])), ["Identity"])
    _check(lambda g, x: g.op.Reshape(x, shape(g, "s", [3, 2])), ["Reshape", "Identity"])
    _check(lambda g, x: g.op.Cast(x, to=TensorProto.FLOAT), ["Identity"])
    _check(lambda g, x: g.op.Cast(x, to=TensorProto.FLOAT16), ["Cast", "Identity"])
    _check(lambda g, x: g.op.Squeeze(g.op.Unsqueeze(x, shape(g, "a", [0])), shape(g, "b", [0])),
           ["Identity"])
    _check(lambda g, x: g.op.Squeeze(g.op.Unsqueeze(x, shape(g, "a", [0])), shape(g, "b", [1])),
           ["Unsqueeze", "Squeeze", "Identity"], shape=(1, 3),
           feed=np.ones((1, 3), np.float32))


def test_graph_output_fed_by_an_input_is_left_alone_side_effects_too():
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [4])
    g.output(g.op.Max(x, x), "y")  # y would become the input x: declined
    state = g.input("state", FLOAT, [4])
    g.output(g.op.Min(state, state), "state_out")
    g.bind("state", "state_out")
    m = g.to_model()
    assert not RewritePass()(m).modified
    assert _ops(m) == ["Max", "Min"] and output_names(m) == ["y", "state_out"]


def test_custom_tables_compose_and_captures_must_agree():
    # Sub(x, x) -> 0 * x  (x finite), written as a custom rule with a repeated capture
    def zero_like(m):
        return m.op.Mul(m["x"], m.constant(np.zeros((), np.float32)))

    sub_self = Rule(Pattern("Sub", "x", "x"), zero_like, "sub_self")
    table = DEFAULT_RULES + RuleTable([sub_self])
    assert len(table) == len(DEFAULT_RULES) + 1
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [4])
    w = g.initializer("w", np.ones(4, np.float32))
    a = g.op.Sub(x, x)
    b = g.op.Sub(x, w)  # different inputs: no match
    g.output(g.op.Add(a, b), "y")
    m = g.to_model()
    before = to_onnx(m)
    assert apply_rules(m, table) == 1
    assert _ops(m) == ["Constant", "Mul", "Sub", "Add"]
    assert_same_outputs(before, m, {"x": np.array([1, 2, -3, 0.5], np.float32)})


def test_attribute_predicates_and_const_predicates():
    seen = []

    def record(m):
        seen.append((m.root.attr("axis"), float(m.const("k")[0])))
        # decline: nothing changes

    rule = Rule(Pattern("Concat", "a", Const("k", lambda c: c.size == 1),
                        attrs={"axis": lambda v: v == 0}), record)
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [1])
    k = g.initializer("k", np.array([2.0], np.float32))
    c0 = g.op.Concat(x, k, axis=0)
    c1 = g.op.Concat(c0, k, axis=-1)
    g.output(c1, "y")
    m = g.to_model()
    assert apply_rules(m, RuleTable([rule])) == 0
    assert seen == [(0, 2.0)]
    assert len(m.graph) == 2


def test_non_terminating_rules_are_detected():
    def flip(m):
        return m.op.Relu(m["x"])  # Relu(x) -> Relu(x), forever

    table = RuleTable([Rule(Pattern("Relu", "x"), flip, "relu_forever")])
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [4])
    g.output(g.op.Neg(g.op.Relu(x)), "y")
    with pytest.raises(RewriteError, match="relu_forever"):
        apply_rules(g.to_model(), table, max_rewrites=50)
    with pytest.raises(RewriteError, match="fixed point"):
        apply_rules(g.to_model(), table)


# ----------------------------------------------------------------------------- chains and no-ops

I64 = TensorProto.INT64
BOOL = TensorProto.BOOL


def _axes(g: GraphBuilder, name: str, axes: list[int]) -> Value:
    return g.initializer(name, np.array(axes, np.int64))


def test_unsqueeze_of_squeeze_with_same_axes_is_removed():
    # Unsqueeze(Squeeze(x, a), a) -> x
    _check(lambda g, x: g.op.Unsqueeze(g.op.Squeeze(x, _axes(g, "a", [1])), _axes(g, "b", [1])),
           ["Identity"], shape=(2, 1, 3), feed=RNG.standard_normal((2, 1, 3)).astype(np.float32))
    # other axes: kept
    _check(lambda g, x: g.op.Unsqueeze(g.op.Squeeze(x, _axes(g, "a", [1])), _axes(g, "b", [0])),
           ["Squeeze", "Unsqueeze", "Identity"], shape=(2, 1, 3),
           feed=RNG.standard_normal((2, 1, 3)).astype(np.float32))


@pytest.mark.parametrize("a,b", [([0], [0]), ([1], [0, 3]), ([-1], [0]), ([0, 2], [-1]), ([2], [1])])
def test_unsqueeze_chains_merge(a, b):
    # Unsqueeze(Unsqueeze(x, a), b) -> Unsqueeze(x, b ∪ (the a-th positions b leaves free))
    m = _check(lambda g, x: g.op.Unsqueeze(g.op.Unsqueeze(x, _axes(g, "a", a)), _axes(g, "b", b)),
               ["Unsqueeze", "Identity"])
    assert m.graph.nodes[0].inputs[1].is_initializer()  # the merged axes were lifted


def test_identity_transpose_is_removed():
    # Transpose(x, perm=[0, 1]) -> x
    _check(lambda g, x: g.op.Transpose(x, perm=[0, 1]), ["Identity"])
    _check(lambda g, x: g.op.Transpose(x, perm=[1, 0]), ["Transpose", "Identity"])


def test_and_true_or_false_are_identities():
    feed = RNG.standard_normal((2, 3)) > 0
    t, f = np.array(True), np.array(False)
    for build in (lambda g, x: g.op.And(g.initializer("c", t), x),
                  lambda g, x: g.op.And(x, g.initializer("c", t)),
                  lambda g, x: g.op.Or(g.initializer("c", f), x),
                  lambda g, x: g.op.Or(x, g.initializer("c", np.zeros((1, 3), bool)))):
        _check(build, ["Identity"], dtype=BOOL, feed=feed)
    _check(lambda g, x: g.op.And(x, g.initializer("c", f)), ["And", "Identity"], dtype=BOOL, feed=feed)
    # broadcasting to a larger shape: kept
    _check(lambda g, x: g.op.Or(x, g.initializer("c", np.zeros((4, 2, 3), bool))), ["Or", "Identity"],
           dtype=BOOL, feed=feed)


def test_full_range_slice_is_removed():
    big = np.iinfo(np.int64).max
    # Slice(x, 0, >= dim) with step 1 on every sliced axis -> x
    _check(lambda g, x: g.op.Slice(x, _axes(g, "s", [0]), _axes(g, "e", [big])), ["Identity"])
    _check(lambda g, x: g.op.Slice(x, _axes(g, "s", [0, -2]), _axes(g, "e", [3, 2]), _axes(g, "a", [1, 0])),
           ["Identity"])
    _check(lambda g, x: g.op.Slice(x, _axes(g, "s", [0]), _axes(g, "e", [3]), _axes(g, "a", [1]),
                                   _axes(g, "p", [1])), ["Identity"])
    # a proper sub-range, or step -1: kept
    _check(lambda g, x: g.op.Slice(x, _axes(g, "s", [0]), _axes(g, "e", [2]), _axes(g, "a", [1])),
           ["Slice", "Identity"])
    _check(lambda g, x: g.op.Slice(x, _axes(g, "s", [-1]), _axes(g, "e", [-big]), _axes(g, "a", [1]),
                                   _axes(g, "p", [-1])), ["Slice", "Identity"])


def test_zero_pad_unit_tile_and_trivial_expand_are_removed():
    _check(lambda g, x: g.op.Pad(x, _axes(g, "p", [0, 0, 0, 0])), ["Identity"])
    _check(lambda g, x: g.op.Pad(x, _axes(g, "p", [0, 0, 0, 0]), g.initializer("v", np.float32(3))),
           ["Identity"])
    _check(lambda g, x: g.op.Pad(x, _axes(g, "p", [0, 1, 0, 0])), ["Pad", "Identity"])
    _check(lambda g, x: g.op.Tile(x, _axes(g, "r", [1, 1])), ["Identity"])
    _check(lambda g, x: g.op.Tile(x, _axes(g, "r", [1, 2])), ["Tile", "Identity"])
    # Expand(x, s) with broadcast(shape(x), s) == shape(x) -> x
    _check(lambda g, x: g.op.Expand(x, _axes(g, "s", [2, 3])), ["Identity"])
    _check(lambda g, x: g.op.Expand(x, _axes(g, "s", [1, 3])), ["Identity"])
    _check(lambda g, x: g.op.Expand(x, _axes(g, "s", [1])), ["Identity"])
    _check(lambda g, x: g.op.Expand(x, _axes(g, "s", [4, 2, 3])), ["Expand", "Identity"])


def test_cast_to_the_inferred_type_is_removed_with_the_shapes_analysis():
    # the value_info of t is missing: only inference knows t is FLOAT (Sigmoid's type is
    # not among those passes/analyses/stated_types.py reads off the graph)
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [2, 3])
    t = g.op.Sigmoid(x)
    g.output(g.op.Identity(g.op.Cast(t, to=FLOAT)), "y")
    m = g.to_model()
    t.type = None
    before = to_onnx(m)
    RewritePass()(m)
    assert _ops(m) == ["Sigmoid", "Identity"]
    assert_same_outputs(before, m, {"x": RNG.standard_normal((2, 3)).astype(np.float32)})
