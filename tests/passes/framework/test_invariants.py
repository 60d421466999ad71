"""IR invariant checks and the side-effect analysis."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from onnxforge.graphbuilder.builder.graph_builder import GraphBuilder
from onnxforge.graphbuilder.ir.core import Graph, Model, Node, Value
from onnxforge.passes import check_invariants, effect_analysis, ir_violations
from onnxforge.passes.framework.invariants import is_nondeterministic
from onnxforge.proto_ext.types import TensorType

from tests.passes.helpers import FLOAT, stateful_model

T4 = TensorType(FLOAT, (4,))


def _chain() -> tuple[Model, Node, Node]:
    g = Graph("g")
    x = g.add_input(Value("x", T4))
    a = g.append(Node("", "Relu", [x], [Value("a", T4)]))
    b = g.append(Node("", "Neg", [a.outputs[0]], [Value("b", T4)]))
    g.outputs.append(b.outputs[0])
    return Model(g, opset_imports={"": 21}), a, b


def test_a_sound_model_has_no_violation():
    m, _, _ = _chain()
    assert check_invariants(m) == []
    assert check_invariants(stateful_model()) == []


def test_order_violation_is_reported_and_can_be_skipped():
    m, a, b = _chain()
    m.graph.reorder([b, a])
    rules = [v.rule for v in ir_violations(m)]
    assert rules == ["IR-ORDER"]
    assert ir_violations(m, topological=False) == []


def test_unrecorded_and_phantom_uses_are_reported():
    m, a, b = _chain()
    x = m.graph.inputs[0]
    b._inputs[0] = x  # bypass the IR's mutators: the use is not recorded
    got = ir_violations(m)
    assert any(v.rule == "IR-DEFUSE" and "not recorded" in v.message for v in got)
    assert any(v.rule == "IR-DEFUSE" and "holds another value" in v.message for v in got)


def test_use_by_a_removed_node_is_reported():
    m, a, b = _chain()
    ghost = Node("", "Abs", [a.outputs[0]], ["ghost"])  # records a use, never added
    got = ir_violations(m)
    assert any("no longer in the model" in v.message for v in got)
    ghost.detach_inputs()
    assert ir_violations(m) == []


def test_double_definition_is_reported():
    m, a, _ = _chain()
    m.graph.inputs.append(a.outputs[0])  # "a" becomes a graph input too: two definitions
    got = ir_violations(m)
    assert any(v.rule == "IR-SSA" and "defined twice" in v.message for v in got)
    assert any(v.rule == "IR-SSA" and "has a producer" in v.message for v in got)


def test_binding_to_a_non_output_is_reported():
    m = stateful_model()
    g = m.graph
    g.bindings = [(g.inputs[0], next(n for n in g if n.op_type == "Add").outputs[0])]
    assert any(v.rule == "IR-BIND" for v in ir_violations(m))


def test_subgraph_reading_a_later_outer_value_is_an_order_violation():
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [4])
    cond = g.input("c", TensorProto.BOOL, [])
    then_b = g.subgraph("then")
    else_b = g.subgraph("else")
    late = Value("late", T4)
    then_b.graph.outputs.append(then_b.op.Identity(x))
    ident = Node("", "Identity", [late], [Value("e", T4)])
    else_b.graph.append(ident)
    else_b.graph.outputs.append(ident.outputs[0])
    out = g.op.If(cond, then_branch=then_b, else_branch=else_b)
    producer = Node("", "Relu", [x], [late])
    g.graph.append(producer)  # defined after the If that reads it
    g.output(out, "y", type=T4)
    m = g.to_model()
    assert any(v.rule == "IR-ORDER" and "late" in v.message for v in ir_violations(m))
    m.graph.reorder([producer] + [n for n in m.graph if n is not producer])
    assert ir_violations(m) == []


def test_effects_of_writes_bindings_calls_and_subgraphs():
    m = stateful_model()
    eff = effect_analysis(m)
    by_op = {n.op_type: n for n in m.graph}
    assert eff.has_side_effects(by_op["CacheUpdate"])
    assert not eff.has_side_effects(by_op["Add"])
    assert not eff.has_side_effects(by_op["Neg"])

    fwd = stateful_model(forwarded=True)
    eff = effect_analysis(fwd)
    ident = next(n for n in fwd.graph if n.op_type == "Identity")
    assert eff.has_side_effects(ident)  # it produces the bound output


def test_calling_a_writing_function_is_a_side_effect():
    g = GraphBuilder(opset=21)
    cache = g.input("cache", FLOAT, [1, 8, 4], access=1)
    vals = g.input("vals", FLOAT, [1, 1, 4])
    pos = g.input("pos", TensorProto.INT64, [])
    fb = g.function("local", "append", ["c", "v", "p"])
    fn = fb.graph
    fn.inputs[0].access = 1
    out = fb.op.CacheUpdate(*fn.inputs)
    fn.outputs.append(out)
    call = g.make_node("append", [cache, vals, pos], 1, domain="local")
    m = g.to_model()
    assert effect_analysis(m).has_side_effects(call)


def test_nondeterministic_operators():
    x = Value("x", T4)
    assert is_nondeterministic(Node("", "RandomNormal", [], 1))
    assert is_nondeterministic(Node("", "Bernoulli", [x], 1))
    assert not is_nondeterministic(Node("", "Dropout", [x], 1))
    mode = Value("mode")
    g = Graph("g")
    from onnxforge.graphbuilder.ir.tensors import Tensor

    g.add_initializer(mode, Tensor.from_numpy(np.array(True)))
    assert is_nondeterministic(Node("", "Dropout", [x, None, mode], 1))
    off = Value("off")
    g.add_initializer(off, Tensor.from_numpy(np.array(False)))
    assert not is_nondeterministic(Node("", "Dropout", [x, None, off], 1))
    assert is_nondeterministic(Node("", "Dropout", [x, None, Value("runtime_mode")], 1))
