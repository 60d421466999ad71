"""Local-function inlining."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

from onnxforge.graphbuilder.builder.graph_builder import READ_WRITE, GraphBuilder
from onnxforge.graphbuilder.ir.core import (
    Alias,
    Attr,
    AttrType,
    Function,
    Graph,
    Model,
    Node,
    Value,
)
from onnxforge.graphbuilder.serde import to_onnx
from onnxforge.passes import InlineError, InlinePass, check_invariants, ir_violations
from onnxforge.proto_ext.types import TensorType
from onnxforge.graphbuilder.ir.storage import Storage

from tests.passes.helpers import (
    FLOAT,
    assert_same_outputs,
    assert_sound,
    output_names,
    reference_run,
)

T4 = TensorType(FLOAT, (4,))
X = {"x": np.array([1.0, -2.0, 3.0, 0.5], np.float32)}


def _ops(m: Model) -> list[str]:
    return [n.op_type for n in m.graph]


def _all_names(m: Model) -> list[str]:
    names = [v.name for v in m.graph.inputs] + list(m.graph.initializers)
    names += [o.name for n in m.graph for o in n.outputs]
    return names


def test_inlines_calls_with_fresh_names_and_removes_the_function():
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [4])
    w = g.initializer("w", np.full(4, 0.5, np.float32))
    fb = g.function("local", "f", ["a", "b"])
    a, b = fb.graph.inputs
    fb.graph.outputs.append(fb.op.Mul(fb.op.Add(a, b, _name="t"), b))
    y1 = g.make_node("f", [x, w], 1, domain="local", name="call1").outputs[0]
    y2 = g.make_node("f", [y1, x], 1, domain="local", name="call2").outputs[0]
    g.output(y2, "y", type=T4)
    m = g.to_model()
    before = to_onnx(m)
    assert InlinePass()(m).modified
    assert _ops(m) == ["Add", "Mul", "Add", "Mul"]
    assert not m.functions
    names = _all_names(m)
    assert len(names) == len(set(names))
    assert output_names(m) == ["y"]
    assert_sound(m)
    assert_same_outputs(before, m, X)


def test_attribute_references_take_the_call_value_or_the_default():
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [4])
    fb = g.function("local", "leaky", ["a"])
    fn = fb.graph
    fn.attributes = ["alpha"]
    fn.attribute_defaults = {"alpha": Attr("alpha", AttrType.FLOAT, 0.5)}
    fn.outputs.append(fb.make_node("LeakyRelu", [fn.inputs[0]], 1,
                                   alpha=Attr("alpha", AttrType.FLOAT, None, ref_attr_name="alpha")).outputs[0])
    given = g.make_node("leaky", [x], 1, domain="local", alpha=0.125).outputs[0]
    default = g.make_node("leaky", [x], 1, domain="local").outputs[0]
    g.output(given, "given", type=T4)
    g.output(default, "default", type=T4)
    m = g.to_model()
    before = to_onnx(m)
    InlinePass()(m)
    alphas = [n.attr("alpha") for n in m.graph]
    assert alphas == [0.125, 0.5]
    assert all(not a.ref_attr_name for n in m.graph for a in n.attributes.values())
    assert_same_outputs(before, m, X)


def test_nested_calls_and_an_output_that_is_a_formal_input():
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [4])
    inner = g.function("local", "inner", ["a"])
    inner.graph.outputs.append(inner.op.Neg(inner.graph.inputs[0]))
    outer = g.function("local", "outer", ["a"])
    outer.graph.opset_imports["local"] = 1
    a = outer.graph.inputs[0]
    called = outer.make_node("inner", [a], 1, domain="local").outputs[0]
    outer.graph.outputs.extend([outer.op.Exp(called), a])  # second output: the input itself
    res, same = g.make_node("outer", [x], 2, domain="local").outputs
    g.output(res, "res", type=T4)
    g.output(g.op.Abs(same), "same", type=T4)
    m = g.to_model()
    before = to_onnx(m)
    assert InlinePass()(m).modified
    assert _ops(m) == ["Neg", "Exp", "Identity", "Abs"]
    assert not m.functions
    assert check_invariants(m) == []
    # onnxruntime rejects a function output that is one of its inputs: onnx.reference runs it
    assert_same_outputs(before, m, X, oracle=reference_run)


def test_aliases_and_bindings_survive_inlining_a_cache_writer():
    g = GraphBuilder(opset=21)
    cache = g.input("cache", FLOAT, [1, 8, 4], access=READ_WRITE)
    vals = g.input("vals", FLOAT, [1, 1, 4])
    pos = g.input("pos", TensorProto.INT64, [])
    fb = g.function("local", "append", ["c", "v", "p"])
    c, v, p = fb.graph.inputs
    c.access = READ_WRITE
    upd = fb.op.CacheUpdate(c, v, p)
    upd.alias_of = c
    fb.graph.outputs.append(upd)
    call = g.make_node("append", [cache, vals, pos], 1, domain="local",
                       output_alias=[Alias(0, 0)])
    out = call.outputs[0]
    out.type = cache.type
    g.output(out, "cache_out")
    g.bind("cache", "cache_out")
    m = g.to_model()
    assert ir_violations(m) == []
    assert InlinePass()(m).modified
    (node,) = list(m.graph)
    assert node.op_type == "CacheUpdate" and node.inputs[0] is cache
    res = node.outputs[0]
    assert res.name == "cache_out" and res.alias_of is cache and Storage(m).root(res) is cache
    assert m.graph.bindings == [(cache, res)]
    assert_sound(m)


def test_branches_inside_a_function_body_are_copied():
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [4])
    cond = g.input("c", TensorProto.BOOL, [])
    fb = g.function("local", "pick", ["a", "k"])
    a, k = fb.graph.inputs
    then_b, else_b = fb.subgraph("then"), fb.subgraph("else")
    t = then_b.op.Neg(a)
    t.type = T4
    then_b.graph.outputs.append(t)
    e = else_b.op.Exp(a)
    e.type = T4
    else_b.graph.outputs.append(e)
    fb.graph.outputs.append(fb.op.If(k, then_branch=then_b, else_branch=else_b))
    res = g.make_node("pick", [x, cond], 1, domain="local").outputs[0]
    g.output(res, "y", type=T4)
    m = g.to_model()
    before = to_onnx(m)
    InlinePass()(m)
    (node,) = list(m.graph)
    then_copy = node.attributes["then_branch"].value
    assert then_copy is not then_b.graph and then_copy.parent is node
    assert list(then_copy)[0].inputs[0] is x
    assert check_invariants(m) == []
    for flag in (True, False):
        assert_same_outputs(before, m, {**X, "c": np.array(flag)})


def test_recursion_is_an_error_and_opset_mismatch_is_left_alone():
    g = Graph("main")
    x = g.add_input(Value("x", T4))
    fn = Function("local", "loop_forever")
    fn.opset_imports = {"": 21, "local": 1}
    a = fn.add_input(Value("a"))
    fn.outputs.append(fn.append(Node("local", "loop_forever", [a], ["b"])).outputs[0])
    g.outputs.append(g.append(Node("local", "loop_forever", [x], [Value("y", T4)])).outputs[0])
    rec = Model(g, opset_imports={"": 21, "local": 1})
    rec.add_function(fn)
    with pytest.raises(InlineError, match="recursively"):
        InlinePass(max_depth=8)(rec)

    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [4])
    fb = g.function("local", "old", ["a"], opsets={"": 13})
    fb.graph.outputs.append(fb.op.Relu(fb.graph.inputs[0]))
    out = g.make_node("old", [x], 1, domain="local").outputs[0]
    g.output(out, "y", type=T4)
    m = g.to_model()
    assert not InlinePass()(m).modified
    assert _ops(m) == ["old"] and ("local", "old", "") in m.functions
