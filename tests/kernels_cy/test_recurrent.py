"""ONNX LSTM, GRU and RNN on the backend against onnxruntime (and onnx.reference where it
runs the form): random configurations of direction, layout, sequence lengths, initial
states, peepholes, clip, input_forget, linear_before_reset and activations."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import onnxforge.backend as backend
from onnxforge.kernels_cy.errors import UnsupportedAttributeError

NAMES = ["X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"]


def _model(feeds: dict, opset: int, op: str = "LSTM", **attrs):
    inputs = [n if n in feeds else "" for n in NAMES]
    while inputs and inputs[-1] == "":
        inputs.pop()
    outs_names = ["Y", "Y_h", "Y_c"] if op == "LSTM" else ["Y", "Y_h"]
    node = helper.make_node(op, inputs, outs_names, **attrs)
    vi = [helper.make_tensor_value_info(n, TensorProto.INT32 if n == "sequence_lens" else TensorProto.FLOAT,
                                        list(v.shape)) for n, v in feeds.items()]
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outs_names]
    return helper.make_model(helper.make_graph([node], "lstm", vi, outs),
                             opset_imports=[helper.make_opsetid("", opset)])


def _ours(model, feeds):
    return backend.prepare(model).run([feeds[n] for n in NAMES if n in feeds])


@st.composite
def configs(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    seq, batch, inp, hid = (draw(st.integers(1, 6)), draw(st.integers(1, 3)), draw(st.integers(1, 5)),
                            draw(st.integers(1, 5)))
    direction = draw(st.sampled_from(["forward", "reverse", "bidirectional"]))
    dirs = 2 if direction == "bidirectional" else 1
    x = rng.standard_normal((seq, batch, inp)).astype(np.float32)
    feeds = {"X": x, "W": rng.standard_normal((dirs, 4 * hid, inp)).astype(np.float32) * 0.7,
             "R": rng.standard_normal((dirs, 4 * hid, hid)).astype(np.float32) * 0.7}
    if draw(st.booleans()):
        feeds["B"] = rng.standard_normal((dirs, 8 * hid)).astype(np.float32)
    if draw(st.booleans()):
        feeds["sequence_lens"] = rng.integers(1, seq + 1, batch).astype(np.int32)
    if draw(st.booleans()):
        feeds["initial_h"] = rng.standard_normal((dirs, batch, hid)).astype(np.float32)
        feeds["initial_c"] = rng.standard_normal((dirs, batch, hid)).astype(np.float32)
    if draw(st.booleans()):
        feeds["P"] = rng.standard_normal((dirs, 3 * hid)).astype(np.float32)
    attrs = {"hidden_size": hid, "direction": direction}
    if draw(st.booleans()):
        attrs["clip"] = float(draw(st.sampled_from([0.5, 2.0])))
    if draw(st.booleans()):
        attrs["activations"] = draw(st.sampled_from([["Sigmoid", "Tanh", "Tanh"], ["Sigmoid", "Relu", "Tanh"],
                                                     ["HardSigmoid", "Tanh", "Softsign"]])) * dirs
    return feeds, attrs


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=configs())
def test_lstm_matches_onnxruntime(cfg):
    feeds, attrs = cfg
    model = _model(feeds, 14, **attrs)
    got = _ours(model, feeds)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_lstm_batch_first_layout_matches_the_reference(direction):
    rng = np.random.default_rng(3)
    dirs = 2 if direction == "bidirectional" else 1
    feeds = {"X": rng.standard_normal((2, 5, 3)).astype(np.float32),
             "W": rng.standard_normal((dirs, 16, 3)).astype(np.float32),
             "R": rng.standard_normal((dirs, 16, 4)).astype(np.float32),
             "B": rng.standard_normal((dirs, 32)).astype(np.float32)}
    model = _model(feeds, 14, hidden_size=4, direction=direction, layout=1)
    got = _ours(model, feeds)
    want = ReferenceEvaluator(model).run(None, feeds)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    assert got[0].shape == (2, 5, dirs, 4) and got[1].shape == (2, dirs, 4)


def test_lstm_input_forget_couples_the_gates_as_onnxruntime_does():
    rng = np.random.default_rng(5)
    feeds = {"X": rng.standard_normal((4, 2, 3)).astype(np.float32),
             "W": rng.standard_normal((1, 12, 3)).astype(np.float32),
             "R": rng.standard_normal((1, 12, 3)).astype(np.float32)}
    model = _model(feeds, 14, hidden_size=3, input_forget=1)
    got = _ours(model, feeds)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_an_activation_the_operator_does_not_list_is_refused_at_prepare_time():
    feeds = {"X": np.zeros((1, 1, 2), np.float32), "W": np.zeros((1, 8, 2), np.float32),
             "R": np.zeros((1, 8, 2), np.float32)}
    with pytest.raises(UnsupportedAttributeError, match="Gelu"):
        backend.prepare(_model(feeds, 14, hidden_size=2, activations=["Sigmoid", "Gelu", "Tanh"]))


@st.composite
def gru_rnn_configs(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    op = draw(st.sampled_from(["GRU", "RNN"]))
    g = 3 if op == "GRU" else 1
    seq, batch, inp, hid = (draw(st.integers(1, 6)), draw(st.integers(1, 3)), draw(st.integers(1, 5)),
                            draw(st.integers(1, 5)))
    direction = draw(st.sampled_from(["forward", "reverse", "bidirectional"]))
    dirs = 2 if direction == "bidirectional" else 1
    feeds = {"X": rng.standard_normal((seq, batch, inp)).astype(np.float32),
             "W": rng.standard_normal((dirs, g * hid, inp)).astype(np.float32) * 0.7,
             "R": rng.standard_normal((dirs, g * hid, hid)).astype(np.float32) * 0.7}
    if draw(st.booleans()):
        feeds["B"] = rng.standard_normal((dirs, 2 * g * hid)).astype(np.float32)
    if draw(st.booleans()):
        feeds["sequence_lens"] = rng.integers(1, seq + 1, batch).astype(np.int32)
    if draw(st.booleans()):
        feeds["initial_h"] = rng.standard_normal((dirs, batch, hid)).astype(np.float32)
    attrs = {"hidden_size": hid, "direction": direction}
    if op == "GRU" and draw(st.booleans()):
        attrs["linear_before_reset"] = 1
    if draw(st.booleans()):
        attrs["clip"] = float(draw(st.sampled_from([0.5, 2.0])))
    if draw(st.booleans()):
        acts = ["Sigmoid", "Tanh"] if op == "GRU" else [draw(st.sampled_from(["Tanh", "Relu", "Sigmoid"]))]
        attrs["activations"] = acts * dirs
    return op, feeds, attrs


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=gru_rnn_configs())
def test_gru_and_rnn_match_onnxruntime(cfg):
    op, feeds, attrs = cfg
    model = _model(feeds, 14, op, **attrs)
    got = _ours(model, feeds)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
