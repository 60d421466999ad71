"""Rules X1 (the standard part passes onnx.checker with full checks) and X2 (a standard
operator's required inputs are non-empty names)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

import onnxforge as of
from onnxforge.proto_ext.standard import skeleton
from onnxforge.proto_ext.verify import check, check_runnable

F, I64, I32, F16, F64, B = T.FLOAT, T.INT64, T.INT32, T.FLOAT16, T.DOUBLE, T.BOOL


def _vi(name: str, dtype: int, shape: list) -> onnx.ValueInfoProto:
    return h.make_tensor_value_info(name, dtype, shape)


def _model(nodes, inputs, outputs, value_info=(), initializers=(), opset: int = 20) -> onnx.ModelProto:
    g = h.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers), value_info=list(value_info))
    return h.make_model(g, opset_imports=[h.make_opsetid("", opset)])


def _binary(op: str, a: int, b: int) -> onnx.ModelProto:
    return _model([h.make_node(op, ["a", "b"], ["y"], name="n")],
                  [_vi("a", a, [2, 3]), _vi("b", b, [2, 3])], [_vi("y", a, [2, 3])])


def _declared_out(op: str, dtype: int, out: int, n_in: int = 1, shape=(2, 2), **attrs) -> onnx.ModelProto:
    names = [f"x{k}" for k in range(n_in)]
    return _model([h.make_node(op, names, ["y"], name="n", **attrs)],
                  [_vi(x, dtype, list(shape)) for x in names], [_vi("y", out, None)])


def _value_info_rank(op: str) -> onnx.ModelProto:
    # the op keeps x's rank 2; value_info says rank 3
    return _model([h.make_node(op, ["x"], ["t"], name="n"), h.make_node("Identity", ["t"], ["y"], name="id")],
                  [_vi("x", F, [2, 3])], [_vi("y", F, None)], value_info=[_vi("t", F, [2, 3, 1])])


def _gather(indices: int) -> onnx.ModelProto:
    return _model([h.make_node("Gather", ["data", "idx"], ["y"], name="n")],
                  [_vi("data", F, [4, 3]), _vi("idx", indices, [2])], [_vi("y", F, [2, 3])])


def _contradictions() -> list[tuple[str, onnx.ModelProto]]:
    cases: list[tuple[str, onnx.ModelProto]] = []
    for op in ("Add", "Sub", "Mul", "Div", "Max", "Min", "Mean", "Sum"):
        for a, b in ((F, I64), (F, I32), (I64, F64), (F16, F)):
            cases.append((f"{op}-{a}-{b}", _binary(op, a, b)))
    for out in (I64, F64, I32, F16):
        cases.append((f"MatMul-out-{out}", _declared_out("MatMul", F, out, 2)))
    for op in ("Relu", "Sigmoid", "Neg", "Abs", "Exp", "Tanh", "Softmax", "Identity"):
        cases.append((f"{op}-out-int64", _declared_out(op, F, I64)))
    for op in ("Relu", "Sigmoid", "Neg", "Abs", "Exp", "Tanh", "Sqrt", "Floor"):
        cases.append((f"{op}-value_info-rank", _value_info_rank(op)))
    for idx in (F, F64, F16):
        cases.append((f"Gather-indices-{idx}", _gather(idx)))
    cases.append(("Where-cond-float", _model(
        [h.make_node("Where", ["c", "a", "b"], ["y"], name="n")],
        [_vi("c", F, [2]), _vi("a", F, [2]), _vi("b", F, [2])], [_vi("y", F, [2])])))
    cases.append(("Concat-mixed", _model(
        [h.make_node("Concat", ["a", "b"], ["y"], name="n", axis=0)],
        [_vi("a", F, [2]), _vi("b", I64, [2])], [_vi("y", F, [4])])))
    cases.append(("Reshape-float-shape", _model(
        [h.make_node("Reshape", ["a", "s"], ["y"], name="n")],
        [_vi("a", F, [2, 3]), _vi("s", F, [2])], [_vi("y", F, None)])))
    cases.append(("MatMul-inner-dims", _model(
        [h.make_node("MatMul", ["a", "b"], ["y"], name="n")],
        [_vi("a", F, [2, 3]), _vi("b", F, [4, 5])], [_vi("y", F, None)])))
    cases.append(("Transpose-perm-rank", _model(
        [h.make_node("Transpose", ["a"], ["y"], name="n", perm=[0, 1, 2])],
        [_vi("a", F, [2, 3])], [_vi("y", F, None)])))
    cases.append(("Initializer-type", _model(
        [h.make_node("Add", ["a", "w"], ["y"], name="n")],
        [_vi("a", F, [3])], [_vi("y", F, [3])],
        initializers=[numpy_helper.from_array(np.arange(3, dtype=np.int64), "w")])))
    cases.append(("Output-rank", _model(
        [h.make_node("Relu", ["a"], ["y"], name="n")], [_vi("a", F, [2, 3])], [_vi("y", F, [2, 3, 4])])))
    cases.append(("Not-float", _declared_out("Not", F, B)))
    return cases


CONTRADICTIONS = _contradictions()


def test_at_least_fifty_contradicting_models() -> None:
    assert len(CONTRADICTIONS) >= 50
    assert len({name for name, _ in CONTRADICTIONS}) == len(CONTRADICTIONS)


@pytest.mark.parametrize("name,model", CONTRADICTIONS, ids=[n for n, _ in CONTRADICTIONS])
def test_contradicting_types_fail_x1(name: str, model: onnx.ModelProto) -> None:
    with pytest.raises((onnx.checker.ValidationError, onnx.shape_inference.InferenceError)):  # onnx agrees
        onnx.checker.check_model(model, full_check=True)
    with pytest.raises(of.VerificationError) as err:
        of.verify(model)
    assert err.value.rules == ["X1"]
    assert err.value.violations[0].path.startswith("graph")


@pytest.mark.parametrize("name,model", CONTRADICTIONS[::9], ids=[n for n, _ in CONTRADICTIONS[::9]])
def test_contradictions_fail_as_bytes_and_as_ir(name: str, model: onnx.ModelProto) -> None:
    for source in (model.SerializeToString(), of.load(model)):
        assert [v.rule for v in of.check(source)] == ["X1"]


def test_x1_names_the_node() -> None:
    (v,) = of.check(_binary("Add", F, I64))
    assert v.path == "graph.node[0]('n')"
    assert "inconsistent type" in v.message


def test_x1_names_a_node_inside_a_branch() -> None:
    then = h.make_graph([h.make_node("Add", ["a", "b"], ["t"], name="inner")], "then", [], [_vi("t", F, None)])
    other = h.make_graph([h.make_node("Identity", ["a"], ["e"], name="other")], "else", [], [_vi("e", F, None)])
    m = _model([h.make_node("If", ["c"], ["y"], name="if", then_branch=then, else_branch=other)],
               [_vi("c", B, []), _vi("a", F, [2]), _vi("b", I64, [2])], [_vi("y", F, None)])
    (v,) = of.check(m)
    assert v.rule == "X1"
    assert v.path == "graph.node[0]('if').attribute['then_branch'].g.node[0]('inner')"


def test_valid_models_pass() -> None:
    m = _model([h.make_node("MatMul", ["a", "b"], ["t"], name="mm"), h.make_node("Relu", ["t"], ["y"])],
               [_vi("a", F, ["n", 3]), _vi("b", F, [3, 4])], [_vi("y", F, ["n", 4])],
               value_info=[_vi("t", F, ["n", 4])])
    assert of.check(m) == []
    assert of.check(of.load(m)) == []
    check_runnable(m)


def test_payloads_are_not_in_the_skeleton() -> None:
    w = numpy_helper.from_array(np.ones((256, 256), np.float32), "w")
    shape = numpy_helper.from_array(np.array([1, -1], np.int64), "shape")
    m = _model([h.make_node("MatMul", ["a", "w"], ["t"]), h.make_node("Reshape", ["t", "shape"], ["y"])],
               [_vi("a", F, [2, 256])], [_vi("y", F, [1, 512])], initializers=[w, shape])
    for source in (m, of.load(m)):
        sk, _ = skeleton(_view(source))
        assert sk.ByteSize() < 1000
        assert [t.name for t in sk.graph.initializer] == ["shape"]  # small integers stay
        assert "w" in [v.name for v in sk.graph.input]
    assert of.check(m) == []
    bad = _model(m.graph.node, m.graph.input, [_vi("y", F, [1, 513])], initializers=[w, shape])
    assert [v.rule for v in of.check(bad)] == ["X1"]  # the reshape's elements are read


def _view(source):
    from onnxforge.proto_ext.verify import as_view

    return as_view(source)[0]


def test_unregistered_default_domain_operator_and_custom_domains_pass() -> None:
    m = _model([h.make_node("SimplifiedLayerNormalization", ["a", "s"], ["t"]),
                h.make_node("Foo", ["t"], ["u"], domain="com.example"),
                h.make_node("Relu", ["u"], ["y"])],
               [_vi("a", F, [2, 4]), _vi("s", F, [4])], [_vi("y", F, None)])
    assert of.check(m) == []


def test_builtin_decoder_passes_with_struct_values_left_out() -> None:
    from onnxforge.samples import builtin_model

    proto = builtin_model("decoder")
    assert of.check(proto) == []
    sk, _ = skeleton(_view(proto))
    onnx.checker.check_model(sk, full_check=True)


# ---------------------------------------------------------------- X2


@pytest.mark.parametrize("op,inputs,k", [
    ("MatMul", ["a", ""], 1), ("MatMul", ["", "a"], 0), ("Gather", ["a", ""], 1),
    ("Add", ["a"], 1), ("Where", ["", "a", "a"], 0)])
def test_x2_empty_required_input(op: str, inputs: list[str], k: int) -> None:
    m = _model([h.make_node(op, inputs, ["y"], name="n")], [_vi("a", F, [2, 2])], [_vi("y", F, None)])
    violations = of.check(m)
    assert [v.rule for v in violations] == ["X2"]
    assert violations[0].path == "graph.node[0]('n')"
    assert f"input {k}" in violations[0].message
    with pytest.raises(of.VerificationError):
        check_runnable(m)


def test_x2_variadic_and_optional() -> None:
    concat = _model([h.make_node("Concat", ["", ""], ["y"], name="c", axis=0)], [], [_vi("y", F, None)])
    assert [v.rule for v in of.check(concat)] == ["X2"]
    clip = _model([h.make_node("Clip", ["a", "", "m"], ["y"], name="c")],
                  [_vi("a", F, [2]), _vi("m", F, [])], [_vi("y", F, [2])])
    assert of.check(clip) == []  # an empty optional input is fine


def test_x2_checks_local_functions() -> None:
    f = h.make_function("pkg", "f", ["x"], ["y"], [h.make_node("MatMul", ["x", ""], ["y"])],
                        [h.make_opsetid("", 20)])
    m = _model([h.make_node("f", ["a"], ["y"], domain="pkg")], [_vi("a", F, [2, 2])], [_vi("y", F, None)])
    m.functions.append(f)
    m.opset_import.append(h.make_opsetid("pkg", 1))
    violations = of.check(m)
    assert [v.rule for v in violations] == ["X2"]
    assert violations[0].path.startswith("functions['pkg::f']")


def test_model_loading_commands_reject_x1(tmp_path) -> None:
    from onnxforge.cli import main

    path = tmp_path / "bad.onnx"
    onnx.save(_declared_out("MatMul", F, I64, 2), str(path))
    assert main(["verify", str(path)]) == 1
    assert main(["optimize", str(path), "-o", str(tmp_path / "out.onnx")]) == 1
    assert not (tmp_path / "out.onnx").exists()
    with pytest.raises(of.VerificationError):
        of.optimize(str(path))


def test_make_stateful_verifies_first() -> None:
    from onnxforge.passes.stateful.convert import make_stateful

    with pytest.raises(of.VerificationError) as err:
        make_stateful(_binary("Add", F, I64), max_length=8)
    assert err.value.rules == ["X1"]
