"""Constants that hold on every run that returns (``passes/analyses/failing_branches.py``).

The models mirror torch.onnx's export of ``x.squeeze(-1)`` on a dimension it cannot
see, followed by ``LSTMCell``'s batched-input test::

    v = If(Gather(Shape(x), -1) == 1, then: Squeeze(x, [-1]), else: Identity(x))
    u = If(Not(Size(Shape(v)) == 2), then: Unsqueeze(v, [0]), else: Identity(v))
    y = LSTM(Unsqueeze(u, [0]), W, R)       # X must be 3-D

Only ``t == 1`` inputs run: with the else branch of ``v`` the LSTM meets a 5-D X.
onnxruntime and onnx.reference are the oracles, on inputs that run and on inputs
that fail.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnxforge.graphbuilder.serde import load, to_onnx
from onnxforge.graphbuilder.shapes.context import ShapesContext
from onnxforge.graphbuilder.shapes.speculation import Undecided
from onnxforge.graphbuilder.shapes.symtensor import ShapeError, SymTensor
from onnxforge.passes import optimize
from onnxforge.passes.framework.invariants import containers
from onnxforge.proto_ext.types import TensorType
from onnxruntime.capi.onnxruntime_pybind11_state import (
    Fail,
    InvalidArgument,
    RuntimeException,
)

import onnxforge as of
from tests.passes.helpers import ort_run, reference_run

H, C = 4, 8
ORT_ERRORS = (Fail, InvalidArgument, RuntimeException)
RNG = np.random.default_rng(11)


def _i64(name: str, values: list[int] | int) -> onnx.TensorProto:
    return helper.make_tensor(name, TensorProto.INT64, [] if isinstance(values, int) else [len(values)],
                              [values] if isinstance(values, int) else values)


def _branch(name: str, op: str, inputs: list[str], out: str) -> onnx.GraphProto:
    return helper.make_graph([helper.make_node(op, inputs, [out])], name, [],
                             [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)])


def _lstm_nodes(x: str, out: str) -> list[onnx.NodeProto]:
    return [helper.make_node("LSTM", [x, "W", "R"], ["", f"{out}_h"], hidden_size=H),
            helper.make_node("Squeeze", [f"{out}_h", "zero"], [out])]


def squeeze_lstm(tail: str = "lstm") -> onnx.ModelProto:
    """The model of the module docstring; ``tail`` changes what reads ``u``:

    * ``lstm``: as above;
    * ``reshape``: the else branch of ``u`` is ``Reshape(v, [1, -1, C])`` and feeds the LSTM
      (an input that fails would run once the rank test is folded);
    * ``dead``: the LSTM's result is unused, the output is ``Relu(u)``;
    * ``relu``: no LSTM: ``Relu(Unsqueeze(u, [0]))``, nothing fails;
    * ``branch``: the LSTM runs in a branch of an ``If`` on the input ``flag``;
    * ``loop``: the LSTM runs in the body of a ``Loop`` of ``trips`` iterations.
    """
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "minus_one"], ["last"]),
        helper.make_node("Equal", ["last", "one"], ["c"]),
        helper.make_node("If", ["c"], ["v"],
                         then_branch=_branch("squeeze", "Squeeze", ["x", "minus_one_1d"], "v_then"),
                         else_branch=_branch("keep", "Identity", ["x"], "v_else")),
        helper.make_node("Shape", ["v"], ["vs"]),
        helper.make_node("Size", ["vs"], ["rank"]),
        helper.make_node("Equal", ["rank", "two"], ["batched"]),
        helper.make_node("Not", ["batched"], ["b"]),
    ]
    u_else = (_branch("flat", "Reshape", ["v", "flat_shape"], "u_else") if tail == "reshape"
              else _branch("as_is", "Identity", ["v"], "u_else"))
    nodes.append(helper.make_node("If", ["b"], ["u"], then_branch=_branch("batch", "Unsqueeze", ["v", "zero"], "u_then"),
                                  else_branch=u_else))
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", C, "t"])]
    if tail == "reshape":
        nodes += _lstm_nodes("u", "y")
    elif tail in ("lstm", "dead"):
        nodes.append(helper.make_node("Unsqueeze", ["u", "zero"], ["X"]))
        nodes += _lstm_nodes("X", "y" if tail == "lstm" else "unused")
        if tail == "dead":
            nodes.append(helper.make_node("Relu", ["u"], ["y"]))
    elif tail == "relu":
        nodes += [helper.make_node("Unsqueeze", ["u", "zero"], ["X"]), helper.make_node("Relu", ["X"], ["y"])]
    elif tail == "branch":
        inputs.append(helper.make_tensor_value_info("flag", TensorProto.BOOL, []))
        body = helper.make_graph([helper.make_node("Unsqueeze", ["u", "zero"], ["X"]), *_lstm_nodes("X", "yb")],
                                 "recur", [], [helper.make_tensor_value_info("yb", TensorProto.FLOAT, None)])
        nodes.append(helper.make_node("If", ["flag"], ["y"], then_branch=body,
                                      else_branch=_branch("other", "Identity", ["h0"], "y_other")))
    elif tail == "loop":
        inputs.append(helper.make_tensor_value_info("trips", TensorProto.INT64, []))
        body = helper.make_graph(
            [helper.make_node("Unsqueeze", ["u", "zero"], ["X"]), *_lstm_nodes("X", "yl"),
             helper.make_node("Identity", ["cond_in"], ["cond_out"])],
            "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                     helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                     helper.make_tensor_value_info("acc", TensorProto.FLOAT, None)],
            [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
             helper.make_tensor_value_info("yl", TensorProto.FLOAT, None)])
        nodes.append(helper.make_node("Loop", ["trips", "", "h0"], ["y"], body=body))
    else:
        raise ValueError(tail)
    inits = [
        _i64("minus_one", -1), _i64("minus_one_1d", [-1]), _i64("one", 1), _i64("two", 2), _i64("zero", [0]),
        _i64("flat_shape", [1, -1, C]),
        helper.make_tensor("W", TensorProto.FLOAT, [1, 4 * H, C], RNG.standard_normal(4 * H * C).tolist()),
        helper.make_tensor("R", TensorProto.FLOAT, [1, 4 * H, H], RNG.standard_normal(4 * H * H).tolist()),
        helper.make_tensor("h0", TensorProto.FLOAT, [1, H], [0.0] * H),
    ]
    # the shapes of the inputs that run (the checker wants a shape on a graph output)
    shape = {"dead": ["m", C], "relu": [1, "m", C]}.get(tail, ["m", H])
    graph = helper.make_graph(nodes, f"squeeze_{tail}", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


def _ops(m) -> list[str]:
    return [n.op_type for c in containers(m) for n in c]


def _feeds(n: int, t: int, **extra) -> dict[str, np.ndarray]:
    return {"x": RNG.standard_normal((n, C, t)).astype(np.float32), **extra}


def _assert_fails(model, feeds) -> None:
    with pytest.raises(ORT_ERRORS):
        ort_run(model, feeds)


# ----------------------------------------------------------------------------- the pass


def test_the_rank_test_folds_when_the_other_branch_fails():
    proto = squeeze_lstm("lstm")
    m = optimize(load(proto), debug=True)
    ops = _ops(m)
    assert ops.count("If") == 1, ops  # v's own If stays: it rejects t != 1
    assert "Not" not in ops and "Size" not in ops and "Unsqueeze" in ops
    assert of.check(to_onnx(m)) == []
    for n in (1, 3):
        feeds = _feeds(n, 1)
        want = ort_run(proto, feeds)
        np.testing.assert_array_equal(ort_run(m, feeds)[0], want[0])
        np.testing.assert_allclose(reference_run(m, feeds)[0], want[0], rtol=1e-5, atol=1e-6)
    for n, t in ((1, 2), (3, 4)):  # what failed still fails
        _assert_fails(proto, _feeds(n, t))
        _assert_fails(m, _feeds(n, t))


def test_the_rank_test_folds_in_a_nested_graph():
    """The same model as the then branch of an If on an input (torch exports a model
    for two sample rates so): the constants are found in the branch."""
    inner = squeeze_lstm("lstm").graph
    branch = helper.make_graph(list(inner.node), "rate", [], list(inner.output))
    other = _branch("other", "Identity", ["h0"], "y_other")
    graph = helper.make_graph(
        [helper.make_node("If", ["fast"], ["y"], then_branch=branch, else_branch=other)], "outer",
        [*inner.input, helper.make_tensor_value_info("fast", TensorProto.BOOL, [])],
        list(inner.output), list(inner.initializer))
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(proto)
    m = optimize(load(proto), debug=True)
    ops = _ops(m)
    assert "Not" not in ops and "Size" not in ops and ops.count("If") == 2, ops
    for fast in (True, False):
        feeds = _feeds(2, 1, fast=np.array(fast))
        np.testing.assert_array_equal(ort_run(m, feeds)[0], ort_run(proto, feeds)[0])
    _assert_fails(proto, _feeds(2, 3, fast=np.array(True)))
    _assert_fails(m, _feeds(2, 3, fast=np.array(True)))


@pytest.mark.parametrize("tail", ["reshape", "dead", "relu", "branch", "loop"])
def test_no_constant_without_a_certain_failure(tail):
    """The rank test stays when the failure is not certain, or would stop happening."""
    proto = squeeze_lstm(tail)
    m = optimize(load(proto), debug=True)
    ops = _ops(m)
    assert "Size" in ops and "Not" in ops, (tail, ops)
    extra = {"flag": np.array(True)} if tail == "branch" else {"trips": np.array(2, np.int64)} if tail == "loop" else {}
    for n, t in ((1, 1), (2, 1), (2, 3)):
        feeds = _feeds(n, t, **extra)
        try:
            want = ort_run(proto, feeds)
        except ORT_ERRORS:
            if tail != "dead":  # dead code goes (dce), and its failure with it
                _assert_fails(m, feeds)
            continue
        got = ort_run(m, feeds)
        assert len(got) == len(want)
        for w, g in zip(want, got):
            np.testing.assert_array_equal(g, w)


def test_reshape_tail_still_rejects_what_the_original_rejects():
    proto = squeeze_lstm("reshape")
    m = optimize(load(proto))
    _assert_fails(proto, _feeds(2, 3))
    _assert_fails(m, _feeds(2, 3))


# ----------------------------------------------------------------------------- speculation


def _speculation_of(tail: str):
    m = load(squeeze_lstm(tail))
    ctx = ShapesContext(m, write_back=False, strict=False).infer_graph()
    nodes = {n.outputs[0].name if n.outputs else n.name: n for c in containers(m) for n in c}
    return m, ctx, nodes


def _assume_v(ctx: ShapesContext, nodes, rank: int, live) -> ShapesContext:
    s = ctx.speculation(live)
    v = nodes["v"].outputs[0]
    s.forget([v, *(o for n in m_order(nodes) for o in n.outputs)])
    shape = ("n", C) if rank == 2 else ("n", C, "t")
    s.set_type(v, TensorType(TensorProto.FLOAT, shape), "test")
    return s


def _everything(m) -> frozenset:
    """Every node counted as one that runs."""
    return frozenset(n for c in containers(m) for n in c)


def _infer_after_v(s: ShapesContext, nodes) -> None:
    for n in m_order(nodes):
        s.infer_node(n)


def m_order(nodes) -> list:
    """The main-graph nodes after ``v``'s If, in order."""
    v = nodes["v"]
    graph = v.graph
    order = list(graph)
    return order[order.index(v) + 1:]


@pytest.mark.parametrize("tail, live, error, match", [
    ("lstm", "all", ShapeError, "X must be 3-D"),  # a node that runs fails: decided
    ("lstm", "none", Undecided, "need not run"),   # the failing node might be skipped
    ("loop", "all", Undecided, "body"),            # a loop body might never run
])
def test_what_the_failing_branch_decides(tail, live, error, match):
    m, ctx, nodes = _speculation_of(tail)
    s = _assume_v(ctx, nodes, 3, _everything(m) if live == "all" else frozenset())
    with pytest.raises(error, match=match):
        _infer_after_v(s, nodes)


def test_the_other_branch_runs_and_makes_the_rank_test_constant():
    m, ctx, nodes = _speculation_of("lstm")
    ok = _assume_v(ctx, nodes, 2, _everything(m))
    _infer_after_v(ok, nodes)
    assert ok.value_of(nodes["b"].outputs[0]).flat() == [False]
    assert ok.shape_of(nodes["X"].outputs[0])[0] == 1 and len(ok.shape_of(nodes["X"].outputs[0])) == 3


def test_speculation_infers_only_the_branch_that_runs():
    """With the condition known, the branch that does not run is not inferred: an error
    there is no error of the run. Without a speculation both branches are inferred."""
    m, ctx, nodes = _speculation_of("branch")
    live = _everything(m)
    y_if = nodes["y"]
    for flag, error in ((False, None), (True, ShapeError)):
        s = _assume_v(ctx, nodes, 3, live)
        s.set_value(y_if.inputs[0], SymTensor.of(TensorProto.BOOL, flag), "test")
        if error is None:
            _infer_after_v(s, nodes)
        else:
            with pytest.raises(error):
                _infer_after_v(s, nodes)
    s = _assume_v(ctx, nodes, 3, live)  # the flag unknown: the branch need not run
    with pytest.raises(Undecided):
        _infer_after_v(s, nodes)


def test_a_speculation_leaves_its_context_unchanged():
    m, ctx, nodes = _speculation_of("lstm")
    before = {v: t for v, t in ctx.values()}
    live = _everything(m)
    s = _assume_v(ctx, nodes, 2, live)
    _infer_after_v(s, nodes)
    assert {v: t for v, t in ctx.values()} == before
    assert ctx.shape_of(nodes["v"].outputs[0]) is None  # the join: rank 2 or 3


def test_symbolic_arithmetic_that_fails_decides_nothing(monkeypatch):
    """A rule that cannot carry out its symbolic arithmetic has found no failing run."""
    from onnxforge.graphbuilder.shapes import infer
    from onnxforge.graphbuilder.shapes.symbolic import SymbolicError

    m, ctx, nodes = _speculation_of("lstm")
    lookup = infer.lookup

    def failing(op):
        raise SymbolicError("no closed form")

    monkeypatch.setattr(infer, "lookup", lambda domain, op: failing if op == "LSTM" else lookup(domain, op))
    live = _everything(m)
    s = _assume_v(ctx, nodes, 2, live)
    with pytest.raises(Undecided, match="no closed form"):
        _infer_after_v(s, nodes)
    plain = ShapesContext(m, write_back=False, strict=False)
    with pytest.raises(ShapeError, match="no closed form"):
        plain.infer_graph()


def test_a_node_asked_about_is_live_exactly_when_the_whole_walk_finds_it(wild_models):
    from onnxforge.graphbuilder.ir.core import Node
    from onnxforge.passes.analyses.effects import effect_analysis
    from onnxforge.passes.analyses.failing_branches import _LiveNodes, live_nodes

    models = [load(squeeze_lstm(tail)) for tail in ("lstm", "reshape")]
    models += [load(str(p)) for p in wild_models.values()]
    for m in models:  # a dead node in the main graph, and the nodes of its body
        g = m.graph
        g.append(Node("", "Neg", [g.inputs[0]], ["dead_for_test"]))
    asked = dead = 0
    for m in models:
        fx = effect_analysis(m)
        whole = live_nodes(m, fx)
        each = _LiveNodes(m, fx)
        nodes = [n for c in containers(m) for n in c]
        assert [n in each for n in nodes] == [n in whole for n in nodes]
        asked += len(nodes)
        dead += len(nodes) - len(whole)
    assert asked > 3000 and dead >= len(models)
