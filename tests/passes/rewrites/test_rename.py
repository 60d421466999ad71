"""Renaming values; value surgery shared by the passes."""
from __future__ import annotations

import numpy as np
import pytest

from onnxforge.graphbuilder.builder.graph_builder import GraphBuilder
from onnxforge.graphbuilder.ir.core import Model
from onnxforge.graphbuilder.serde import to_onnx
from onnxforge.passes import NameScope, RenameError, RenamePass, replace_value

from tests.passes.helpers import (
    FLOAT,
    assert_sound,
    ort_run,
    output_names,
    stateful_model,
)

X = {"x": np.array([1.0, -2.0, 3.0, 0.5], np.float32)}


def _model() -> Model:
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [4])
    w = g.initializer("w", np.full(4, 2.0, np.float32))
    t = g.op.Relu(x)
    t.name = "t"
    g.output(g.op.Mul(t, w), "y")
    return g.to_model()


def test_internal_values_and_initializers_are_renamed_consumers_follow():
    m = _model()
    want = ort_run(to_onnx(m), X)
    assert RenamePass(values={"t": "hidden", "w": "weight"})(m).modified
    relu, mul = list(m.graph)
    assert relu.outputs[0].name == "hidden" and mul.inputs[0] is relu.outputs[0]
    assert list(m.graph.initializers) == ["weight"] and mul.inputs[1].name == "weight"
    assert m.graph.initializers["weight"].const.name == "weight"
    assert output_names(m) == ["y"]
    np.testing.assert_array_equal(ort_run(m, X)[0], want[0])


def test_interface_renames_need_the_io_mapping():
    m = _model()
    with pytest.raises(RenameError, match="interface"):
        RenamePass(values={"y": "z"})(m)
    with pytest.raises(RenameError, match="not a main-graph input or output"):
        RenamePass(io={"t": "z"})(m)
    assert RenamePass(io={"x": "tokens", "y": "logits"})(m).modified
    assert [v.name for v in m.graph.inputs] == ["tokens"] and output_names(m) == ["logits"]
    got = ort_run(m, {"tokens": X["x"]})
    np.testing.assert_array_equal(got[0], np.maximum(X["x"], 0) * 2)


def test_bound_and_aliased_values_follow_an_interface_rename():
    m = stateful_model()
    RenamePass(io={"cache": "kv", "cache_out": "kv_out"})(m)
    (i, o), = m.graph.bindings
    assert (i.name, o.name) == ("kv", "kv_out")
    assert o.alias_of is i
    assert_sound(m)


def test_collisions_and_missing_names_raise_and_swaps_work():
    m = _model()
    with pytest.raises(RenameError, match="already used"):
        RenamePass(values={"t": "w"})(m)
    with pytest.raises(RenameError, match="no value named 'nope'"):
        RenamePass(values={"nope": "z"})(m)
    with pytest.raises(RenameError, match="same name"):
        RenamePass(values={"t": "z"}, io={"x": "z"})(m)
    relu_out = list(m.graph)[0].outputs[0]
    RenamePass(values={"t": "tmp"})(m)
    assert relu_out.name == "tmp"


def test_name_scope_and_replace_value_hand_over_graph_outputs():
    m = _model()
    scope = NameScope.from_model(m)
    assert {"x", "w", "t", "y"} <= scope.used
    assert scope.fresh("t") == "t_1" and scope.fresh("new") == "new"
    relu, mul = list(m.graph)
    assert replace_value(mul.outputs[0], relu.outputs[0])  # the output name moves to Relu's value
    assert relu.outputs[0].name == "y" and m.graph.outputs[0] is relu.outputs[0]
    assert not replace_value(relu.outputs[0], m.graph.inputs[0])  # an input cannot become "y"
