"""The compiled plan: schedule, slots, release lists, plan-time folding and errors,
claimed operators, the reference fallback and control flow with captured values."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from onnxforge.graphbuilder import serde
from onnxforge.graphbuilder.builder.graph_builder import GraphBuilder
from onnxforge.graphbuilder.ir.core import READ_WRITE
from onnxforge.kernels_cy.runtime.compile import compile_model, schedule
from onnxforge.kernels_cy.errors import UnsupportedAttributeError, UnsupportedOperatorError
from onnxforge.kernels_cy.runtime.plan import Program
from onnxforge.kernels_cy.runtime.runctx import RunContext
from onnxforge.kernels_cy.runtime.session import InferenceSession, backend_ops
from tests.kernels_cy.helpers import F, I64, onnx_model, reference, tensor


def test_schedule_puts_readers_of_a_version_before_its_writer():
    g = GraphBuilder(opset=23)
    cache = g.input("cache", TensorProto.FLOAT, [1, 8, 4], access=READ_WRITE)
    values = g.input("values", TensorProto.FLOAT, [1, 1, 4])
    pos = g.input("pos", TensorProto.INT64, [])
    upd = g.op.CacheUpdate(cache, values, pos)
    g.output(upd, "updated")
    s1 = g.op.ReduceSum(cache, keepdims=0)  # appended after the writer, reads version 0
    g.output(s1, "s1")
    m = g.to_model()
    order = [n.op_type for n in schedule(m.graph)]
    assert order.index("ReduceSum") < order.index("CacheUpdate")
    sess = InferenceSession(m)
    buf = np.ones((1, 8, 4), np.float32)
    upd_out, total = sess.run(None, {"cache": buf, "values": np.zeros((1, 1, 4), np.float32),
                                     "pos": np.array(0, np.int64)})
    assert float(total) == 32.0 and upd_out is buf and buf.sum() == 28.0


def test_slots_and_release_lists():
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Relu", ["y"], ["z"]),
             helper.make_node("Add", ["z", "x"], ["out"])]
    m = serde.from_proto(onnx_model(nodes, [tensor("x", F, [2, 2])], [tensor("out", F, [2, 2])],
                                    initializers=[helper.make_tensor("w", F, [2, 2], [1, 0, 0, 1])]))
    cg, _ = compile_model(m)
    labels = [s[0] for s in cg.steps]
    assert [lab.split("(")[-1] for lab in labels] == ["MatMul)", "Relu)", "Add)"]
    (_, in0, out0, rel0), (_, in1, out1, rel1), (_, in2, out2, rel2) = cg.steps
    assert in0 == (0, 1) and in1 == out0 and rel1 == out0  # y dies after Relu
    assert rel2 == out1 and rel0 == ()  # z dies after Add; the output is never released


def test_constant_subexpressions_and_static_shapes_fold_at_plan_time():
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "one"], ["d"], axis=0),
             helper.make_node("Unsqueeze", ["d", "zero"], ["d1"]),
             helper.make_node("Concat", ["d1", "d1"], ["shape"], axis=0),
             helper.make_node("Reshape", ["y", "shape"], ["out"])]
    inits = [helper.make_tensor("one", I64, [], [1]), helper.make_tensor("zero", I64, [1], [0])]
    proto = onnx_model(nodes, [tensor("x", F, [3, 4]), tensor("y", F, [16])], [tensor("out", F, [4, 4])],
                       initializers=inits)
    cg, _ = compile_model(serde.from_proto(proto))
    assert len(cg.steps) == 1 and "Reshape" in cg.steps[0][0]
    assert {"s", "d", "d1", "shape"} <= set(cg.constants)
    y = np.arange(16, dtype=np.float32)
    out, = InferenceSession(proto).run(None, {"x": np.zeros((3, 4), np.float32), "y": y})
    np.testing.assert_array_equal(out, y.reshape(4, 4))


def test_unclaimed_operators_are_listed_node_by_node():
    nodes = [helper.make_node("Det", ["x"], ["d"], name="det1"), helper.make_node("Neg", ["x"], ["n"]),
             helper.make_node("Det", ["n"], ["e"], name="det2")]
    proto = onnx_model(nodes, [tensor("x", F, [2, 2])], [tensor("d", F, []), tensor("e", F, [])])
    with pytest.raises(UnsupportedOperatorError) as exc:
        InferenceSession(proto)
    assert [p for p, _ in exc.value.nodes] == ["graph.node('det1')", "graph.node('det2')"]
    assert "fallback='reference'" in str(exc.value)
    sess = InferenceSession(proto, fallback="reference")
    assert sess.fallback_nodes == ["graph.node('det1')", "graph.node('det2')"]
    x = np.array([[2, 1], [1, 3]], np.float32)
    d, e = sess.run(None, {"x": x})
    assert d == pytest.approx(5.0) and e == pytest.approx(5.0)


def test_unsupported_attribute_is_a_plan_time_error_naming_the_node():
    proto = onnx_model([helper.make_node("Gelu", ["x"], ["y"], name="act", approximate="cubic")],
                       [tensor("x", F, [2])], [tensor("y", F, [2])])
    with pytest.raises(UnsupportedAttributeError, match=r"node\('act'\).*approximate='cubic'"):
        InferenceSession(proto)


def test_backend_ops_claims_the_decoder_corpus():
    ops = set(backend_ops())
    for op in ["MatMul", "Gemm", "Attention", "RotaryEmbedding", "RMSNormalization", "If", "Loop", "Scan",
               "DequantizeLinear", "QuantizeLinear", "TensorScatter", "Where", "IsNaN", "Softmax"]:
        assert ("", op) in ops, op
    for op in ["GroupQueryAttention", "SkipSimplifiedLayerNormalization", "SimplifiedLayerNormalization",
               "MatMulNBits", "RotaryEmbedding"]:
        assert ("com.microsoft", op) in ops, op
    assert ("ai.onnxforge", "CacheUpdate") in ops
    assert ops == set(sorted(ops)) and all(isinstance(d, str) for d, _ in ops)


def test_empty_kernel_program_runs_every_step_in_order():
    class Inc:
        def run(self, x):
            return x + 1

    n = 50
    k = Inc()
    prog = Program(n + 1, [None] * (n + 1), [k.run] * n, ["inc"] * n, [[i] for i in range(n)],
                   [[i + 1] for i in range(n)], [[i] for i in range(n)], [[] for _ in range(n)],
                   [[False] for _ in range(n)], list(range(n + 1)), [0], [n])
    assert prog.run([0], RunContext()) == [n]
    assert prog.num_steps == n


def test_kernel_errors_carry_the_node_name():
    proto = onnx_model([helper.make_node("Gather", ["x", "i"], ["y"], name="pick")],
                       [tensor("x", F, [3]), tensor("i", I64, [1])], [tensor("y", F, [1])])
    with pytest.raises(ValueError) as exc:
        InferenceSession(proto).run(None, {"x": np.zeros(3, np.float32), "i": np.array([7])})
    assert "out of range" in str(exc.value) and "pick" in "".join(getattr(exc.value, "__notes__", []))


# ----------------------------------------------------------------------------- control flow

def _branch(name: str, op: str) -> helper.GraphProto:
    # reads the outer values "x" and "w" (captured)
    return helper.make_graph([helper.make_node(op, ["x", "w"], [f"{name}_out"])], name, [],
                             [tensor(f"{name}_out", F, [2])])


def test_if_runs_the_chosen_branch_with_captured_outer_values():
    nodes = [helper.make_node("Neg", ["a"], ["x"]),
             helper.make_node("If", ["c"], ["y"], then_branch=_branch("then", "Add"),
                              else_branch=_branch("else", "Mul"))]
    proto = onnx_model(nodes, [tensor("a", F, [2]), tensor("c", TensorProto.BOOL, [])],
                       [tensor("y", F, [2])], initializers=[helper.make_tensor("w", F, [2], [3, 4])])
    sess = InferenceSession(proto)
    a = np.array([1, 2], np.float32)
    for c in (True, False):
        feeds = {"a": a, "c": np.array(c)}
        np.testing.assert_array_equal(sess.run(None, feeds)[0], reference(proto, feeds)[0])


def test_loop_carries_state_stacks_scan_outputs_and_reads_outer_values():
    body = helper.make_graph(
        [helper.make_node("Add", ["acc_in", "step"], ["acc_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Mul", ["acc_out", "step"], ["scan_out"])],
        "body", [tensor("i", I64, []), tensor("cond_in", TensorProto.BOOL, []), tensor("acc_in", F, [2])],
        [tensor("cond_out", TensorProto.BOOL, []), tensor("acc_out", F, [2]), tensor("scan_out", F, [2])])
    nodes = [helper.make_node("Loop", ["n", "", "init"], ["final", "stacked"], body=body)]
    proto = onnx_model(nodes, [tensor("n", I64, []), tensor("init", F, [2]), tensor("step", F, [2])],
                       [tensor("final", F, [2]), tensor("stacked", F, [None, 2])])
    feeds = {"n": np.array(3, np.int64), "init": np.zeros(2, np.float32),
             "step": np.array([1, 2], np.float32)}
    final, stacked = InferenceSession(proto).run(None, feeds)
    step = feeds["step"]
    np.testing.assert_array_equal(final, 3 * step)
    np.testing.assert_array_equal(stacked, np.stack([k * step * step for k in (1, 2, 3)]))


def test_scan_over_an_axis_with_state_and_a_captured_value():
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "x_t"], ["s_out"]), helper.make_node("Mul", ["s_out", "k"], ["y_t"])],
        "body", [tensor("s_in", F, [3]), tensor("x_t", F, [3])], [tensor("s_out", F, [3]), tensor("y_t", F, [3])])
    nodes = [helper.make_node("Scan", ["s0", "xs"], ["s", "ys"], body=body, num_scan_inputs=1,
                              scan_input_axes=[1], scan_output_directions=[1])]
    proto = onnx_model(nodes, [tensor("s0", F, [3]), tensor("xs", F, [3, 4]), tensor("k", F, [3])],
                       [tensor("s", F, [3]), tensor("ys", F, [4, 3])])
    rng = np.random.default_rng(0)
    feeds = {"s0": rng.random(3, dtype=np.float32), "xs": rng.random((3, 4), dtype=np.float32),
             "k": rng.random(3, dtype=np.float32)}
    s, ys = InferenceSession(proto).run(None, feeds)
    states = np.cumsum(feeds["xs"].T, axis=0) + feeds["s0"]  # float64 oracle of the states
    np.testing.assert_allclose(s, states[-1], rtol=1e-6)
    np.testing.assert_allclose(ys, (states * feeds["k"])[::-1], rtol=1e-6)  # reversed output
