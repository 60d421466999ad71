"""``onnxforge.backend``: onnx's backend interface, checked on our own small models
against numpy and on onnx's conformance cases (node, simple, pytorch-converted and
pytorch-operator; the ``real`` cases download weights and are left out).

Each conformance case either gives onnx's expected outputs within the suite's own
tolerances or is refused at prepare time with a typed error naming what the backend
cannot run (an operator it does not claim, an attribute form, a non-tensor input).
A wrong answer or an untyped failure is never acceptable; the cases known to give one
are strict xfails below, each with its reason.
"""
from __future__ import annotations

import unittest
import warnings

import numpy as np
import onnx
import onnx.backend.test
import pytest
from onnx import TensorProto, helper

import onnxforge.backend as backend
from onnxforge.kernels_cy.errors import FeedError, UnsupportedAttributeError, UnsupportedOperatorError

# A refusal: the backend says, before running anything, what it cannot run.
_REFUSALS = (UnsupportedOperatorError, UnsupportedAttributeError, FeedError)

_ALIGN = ("Resize's specification and onnxruntime divide by the integer output length minus one in "
          "align_corners; onnx's expected outputs (from onnx.reference) divide by in * scale - 1, a "
          "fractional length, when the output size comes from scales")

_XFAIL = {
    "test_mvn_cpu":
        "onnx.checker's full check (rule X1) rejects the Constant in MeanVarianceNormalization's "
        "own function body, so verification refuses a model onnx ships",
    "test_resize_downsample_scales_linear_align_corners_cpu": _ALIGN,
    "test_resize_downsample_scales_cubic_align_corners_cpu": _ALIGN,
}


def _conformance_cases() -> list:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        suite = onnx.backend.test.BackendTest(backend, __name__)
    params = []
    for group, cls in sorted(suite.test_cases.items()):
        if group == "OnnxBackendRealModelTest":
            continue
        for name in sorted(dir(cls)):
            if name.startswith("test_") and name.endswith("_cpu"):
                marks = [pytest.mark.xfail(strict=True, reason=_XFAIL[name])] if name in _XFAIL else []
                params.append(pytest.param(cls, name, id=name, marks=marks))
    return params


_CASES = _conformance_cases()


def test_the_conformance_suite_is_there():
    # the four kinds together hold well over a thousand CPU cases in every onnx release
    # this project supports; an empty list would make the test below vacuous
    assert len(_CASES) > 1000


@pytest.mark.parametrize(("case_class", "name"), _CASES)
def test_conformance_case_matches_onnx_or_is_refused_by_name(case_class, name):
    case = case_class(name)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            getattr(case, name)()
    except unittest.SkipTest as skip:  # the runner skips nothing on the CPU
        pytest.fail(f"onnx's runner skipped {name}: {skip}")
    except _REFUSALS as err:
        message = str(err)
        assert message.strip()
        if isinstance(err, UnsupportedOperatorError):
            # names each node: graph.node[<op>] or its path, then the operator
            assert "graph" in message and "node" in message, message


def _model() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    w = helper.make_tensor_value_info("w", TensorProto.FLOAT, [3, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 4])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Relu", ["y"], ["z"])]
    graph = helper.make_graph(nodes, "g", [x, w], [y, z])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def test_prepare_runs_by_position_and_by_name_like_numpy():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3)).astype(np.float32)
    w = rng.standard_normal((3, 4)).astype(np.float32)
    expect = x.astype(np.float64) @ w.astype(np.float64)
    rep = backend.prepare(_model(), "CPU", threads=1)
    for outputs in (rep.run([x, w]), rep.run({"x": x, "w": w})):
        y, z = outputs
        np.testing.assert_allclose(y, expect, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(z, np.maximum(expect, 0), rtol=1e-5, atol=1e-6)
    (y2, _) = backend.run_model(_model(), [x, w])
    np.testing.assert_allclose(y2, expect, rtol=1e-5, atol=1e-6)


def test_run_node_types_the_node_from_its_inputs():
    a = np.arange(6, dtype=np.int64).reshape(2, 3)
    b = np.array([10, 20, 30], dtype=np.int64)
    (out,) = backend.run_node(helper.make_node("Add", ["a", "b"], ["c"]), [a, b])
    assert out.dtype == np.int64
    assert out.tolist() == [[10, 21, 32], [13, 24, 35]]
    (t,) = backend.run_node(helper.make_node("Transpose", ["a"], ["t"], perm=[1, 0]), {"a": a})
    assert t.tolist() == [[0, 3], [1, 4], [2, 5]]


def test_the_backend_runs_on_the_cpu_only():
    assert backend.supports_device("CPU")
    assert not backend.supports_device("CUDA")
    with pytest.raises(ValueError, match="CPU only"):
        backend.prepare(_model(), "CUDA")


def test_too_many_inputs_is_a_clear_error():
    rep = backend.prepare(_model())
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(ValueError, match="3 inputs given, the model takes 2"):
        rep.run([x, np.zeros((3, 4), np.float32), x])


def test_an_operator_the_backend_does_not_claim_is_refused_at_prepare_naming_the_node():
    # Bernoulli draws random numbers: a backend that checks its answers never claims it
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
    graph = helper.make_graph([helper.make_node("Bernoulli", ["x"], ["y"])], "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    with pytest.raises(UnsupportedOperatorError, match=r"graph\.node\[Bernoulli\]"):
        backend.prepare(model)
