"""Decomposed RMS norms and attention fused into the opset-23 operators."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto
from onnxforge.graphbuilder.builder.graph_builder import GraphBuilder
from onnxforge.graphbuilder.ir.core import Model
from onnxforge.graphbuilder.serde import load, to_onnx
from onnxforge.kernels_cy.runtime.session import InferenceSession
from onnxforge.passes import Opset23FusionPass, optimize
from onnxforge.passes.rewrites.attention_fusion import AttentionFusionError

from tests.fixtures.decoders import load_io_info, random_decoder_feeds
from tests.passes.helpers import FLOAT, assert_sound, ort_run, reference_run

RNG = np.random.default_rng(31)
D = 16


def _rms_model(opset: int = 20, *, weight: bool = True, swap: bool = False, axis: int = -1,
               elem: int = FLOAT, exponent: float = 2.0) -> Model:
    # y = x * 1/sqrt(mean(x^2, axis) + eps) [* w], as torch.onnx writes an RMS norm
    g = GraphBuilder(opset=opset)
    x = g.input("x", elem, ["b", 3, D])
    np_t = np.float32 if elem == FLOAT else np.float16
    two = g.initializer("two", np.array(exponent, np_t))
    sq = g.op.Pow(x, two)
    if opset >= 18:
        mean = g.op.ReduceMean(sq, g.initializer("axes", np.array([axis], np.int64)), keepdims=1)
    else:
        mean = g.op.ReduceMean(sq, axes=[axis], keepdims=1)
    eps = g.initializer("eps", np.array(1e-6, np_t))
    r = g.op.Reciprocal(g.op.Sqrt(g.op.Add(eps, mean) if swap else g.op.Add(mean, eps)))
    y = g.op.Mul(r, x) if swap else g.op.Mul(x, r)
    if weight:
        w = g.initializer("w", RNG.uniform(0.5, 1.5, D).astype(np_t))
        y = g.op.Mul(w, y) if swap else g.op.Mul(y, w)
    g.output(y, "y")
    return g.to_model()


def _ops(m: Model) -> list[str]:
    return [n.op_type for n in m.graph]


@pytest.mark.parametrize("weight", [True, False])
@pytest.mark.parametrize("swap", [False, True])
@pytest.mark.parametrize("opset", [20, 23])
def test_decomposed_rms_norm_becomes_rms_normalization(weight, swap, opset):
    m = _rms_model(opset, weight=weight, swap=swap)
    before = to_onnx(m)
    assert Opset23FusionPass(raise_opset=True)(m).modified
    assert _ops(m) == ["RMSNormalization"] and m.opset_imports[""] == 23
    assert_sound(m)
    x = RNG.standard_normal((2, 3, D)).astype(np.float32)
    want = reference_run(before, {"x": x})[0]
    for got in (ort_run(before, {"x": x})[0], ort_run(m, {"x": x})[0], InferenceSession(m).run(None, {"x": x})[0]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_an_older_model_keeps_its_opset_unless_asked():
    m = _rms_model(20)
    optimize(m)
    assert m.opset_imports[""] == 20 and "RMSNormalization" not in _ops(m)
    m = optimize(_rms_model(20), opset=23)
    assert m.opset_imports[""] == 23 and _ops(m) == ["RMSNormalization"]


@pytest.mark.parametrize("case", ["first_axis", "float16", "cube"])
def test_other_reductions_and_types_are_not_fused(case):
    # a mean over another axis is not an RMS norm of the last one; float16 chains round
    # in float16, which RMSNormalization (float32 stash) would not; a mean of cubes is
    # not a mean square
    kwargs = {"first_axis": {"axis": 0}, "float16": {"elem": TensorProto.FLOAT16},
              "cube": {"exponent": 3.0}}[case]
    m = _rms_model(23, **kwargs)
    before = _ops(m)
    Opset23FusionPass()(m)
    assert _ops(m) == before


def test_a_raise_that_would_change_another_operator_is_refused_and_nothing_changes():
    # ReduceMean-18 moved its axes to an input: an opset-13 model cannot be raised to 23
    m = _rms_model(13)
    before = _ops(m)
    with pytest.raises(AttentionFusionError, match="ReduceMean"):
        Opset23FusionPass(raise_opset=True)(m)
    assert _ops(m) == before and m.opset_imports[""] == 13


def test_torch_opset20_export_fuses_attention_and_norms_with_the_same_outputs(decoder_models):
    path = decoder_models["torch20"]
    m = optimize(load(str(path)), opset=23, debug=True)
    ops = _ops(m)
    assert m.opset_imports[""] == 23
    assert ops.count("Attention") == 4 and ops.count("RMSNormalization") == 17
    assert ops.count("RotaryEmbedding") == 8
    assert not any(o in ops for o in ("Softmax", "IsNaN", "Reciprocal", "Pow", "ReduceMean", "Neg"))
    assert len(ops) < 0.6 * len(list(load(str(path)).graph))
    info = load_io_info(path)
    for b, s, p in ((2, 5, 0), (1, 1, 9)):
        feeds = random_decoder_feeds(path, info, batch=b, seq=s, past=p, seed=b + s)
        want = ort_run(str(path), feeds)
        for got in (ort_run(m, feeds), InferenceSession(m).run(None, feeds)):
            for w, g in zip(want, got):
                np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(w).max())))


def _rotary_model(opset: int = 23, *, order: str = "rotate_half", same_halves: bool = True) -> Model:
    # y = x * cos + rotate_half(x) * sin, cos = Cos(Concat(a, a)) on the head axis, as
    # torch.onnx writes Hugging Face's apply_rotary_pos_emb (halves already one Split)
    g = GraphBuilder(opset=opset)
    x = g.input("x", FLOAT, [1, 2, 3, D])
    a = g.input("a", FLOAT, [1, 3, D // 2])
    b = g.input("b", FLOAT, [1, 3, D // 2])
    x1, x2 = g.op.Split(x, g.initializer("sizes", np.array([D // 2, D // 2], np.int64)), axis=-1, _outputs=2)
    halves = [g.op.Neg(x2), x1] if order == "rotate_half" else [x1, g.op.Neg(x2)]
    rot = g.op.Concat(*halves, axis=-1)
    one = g.initializer("one", np.array([1], np.int64))
    cos = g.op.Unsqueeze(g.op.Cos(g.op.Concat(a, a if same_halves else b, axis=-1)), one)
    sin = g.op.Unsqueeze(g.op.Sin(g.op.Concat(a, a if same_halves else b, axis=-1)), one)
    g.output(g.op.Add(g.op.Mul(x, cos), g.op.Mul(rot, sin)), "y")
    return g.to_model()


def _rotary_feeds() -> dict[str, np.ndarray]:
    return {"x": RNG.standard_normal((1, 2, 3, D)).astype(np.float32),
            "a": RNG.uniform(0, 6, (1, 3, D // 2)).astype(np.float32),
            "b": RNG.uniform(0, 6, (1, 3, D // 2)).astype(np.float32)}


def test_decomposed_rotary_becomes_rotary_embedding():
    m = _rotary_model()
    before = to_onnx(m)
    m = optimize(m, debug=True)
    assert "RotaryEmbedding" in _ops(m) and "Neg" not in _ops(m)
    feeds = _rotary_feeds()
    want = reference_run(before, feeds)[0]
    for got in (ort_run(m, feeds)[0], InferenceSession(m).run(None, feeds)[0]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", ["halves_in_order", "different_halves", "opset_21"])
def test_other_rotations_are_not_fused(case):
    # Concat(x1, -x2) is another rotation; Cos(Concat(a, b)) has different halves; an
    # opset-21 model has no RotaryEmbedding (and is not raised without being asked)
    kwargs = {"halves_in_order": {"order": "other"}, "different_halves": {"same_halves": False},
              "opset_21": {"opset": 21}}[case]
    m = _rotary_model(**kwargs)
    before = to_onnx(m)
    m = optimize(m)
    assert "RotaryEmbedding" not in _ops(m) and "Neg" in _ops(m)
    feeds = _rotary_feeds()
    np.testing.assert_allclose(ort_run(m, feeds)[0], reference_run(before, feeds)[0], rtol=1e-5, atol=1e-5)
