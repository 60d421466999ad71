"""Plan-time fusions (``kernels_cy.matmul.fused``): the SwiGLU gate of a decoder MLP.

Oracles: float64 numpy and onnxruntime for the fused results; the unfused kernels'
own float32 steps (``gemv``, ``_softmax.sigmoid``, numpy products) for the claim that
fusing changes no bit.
"""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxforge as of
from onnxforge.kernels_cy.matmul import _gemv
from onnxforge.kernels_cy.ops import _softmax
from onnxforge.kernels_cy.errors import KernelError


def _steps(x: np.ndarray, wg: np.ndarray, wu: np.ndarray, threads: int) -> np.ndarray:
    """The five unfused kernels' float32 steps."""
    g = np.empty(wg.shape[1], np.float32)
    u = np.empty(wu.shape[1], np.float32)
    _gemv.gemv(x, wg, g, threads)
    _gemv.gemv(x, wu, u, threads)
    s = _softmax.sigmoid(g, np.empty_like(g))
    return (g * s) * u


def _ref64(x: np.ndarray, wg: np.ndarray, wu: np.ndarray) -> np.ndarray:
    g = x.astype(np.float64) @ wg.astype(np.float64)
    u = x.astype(np.float64) @ wu.astype(np.float64)
    return g / (1 + np.exp(-g)) * u


@pytest.fixture(params=["simd", "baseline"])
def simd_path(request):
    for m in (_gemv, _softmax):  # each module keeps its own dispatch flags
        m._force_baseline_simd(request.param == "baseline")
    yield request.param
    for m in (_gemv, _softmax):
        m._force_baseline_simd(0)


@pytest.mark.parametrize("k,n", [(1, 1), (7, 33), (512, 1536), (1536, 512), (130, 2048 + 17), (515, 3 * 2048)])
@pytest.mark.parametrize("threads", [1, 2, 5])
def test_swiglu_row_is_bitwise_the_unfused_steps_and_matches_float64(k, n, threads, simd_path):
    rng = np.random.default_rng(k * 31 + n)
    x = rng.standard_normal(k, dtype=np.float32)
    wg = rng.standard_normal((k, n), dtype=np.float32) / np.float32(np.sqrt(k))
    wu = rng.standard_normal((k, n), dtype=np.float32)
    out = np.full(n, np.nan, np.float32)
    assert _gemv.swiglu_row(x, wg, wu, out, threads) is out
    np.testing.assert_array_equal(out, _steps(x, wg, wu, threads))
    ref = _ref64(x, wg, wu)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(ref).max())))


def test_swiglu_row_saturates_large_gates_like_the_sigmoid_kernel():
    x = np.ones(4, np.float32)
    wg = np.array([[100.0, -100.0, 0.0]] * 4, np.float32)  # g = 400, -400, 0
    wu = np.full((4, 3), 0.5, np.float32)                  # u = 2
    out = _gemv.swiglu_row(x, wg, wu, np.empty(3, np.float32))
    np.testing.assert_array_equal(out, _steps(x, wg, wu, 1))
    assert out[0] == 800.0 and out[2] == 0.0 and abs(float(out[1])) < 1e-30  # float64: 800, -1e-171, 0
    assert np.all(np.isfinite(out))


def test_swiglu_row_rejects_operands_it_cannot_stream():
    x = np.ones(8, np.float32)
    w = np.ones((8, 4), np.float32)
    with pytest.raises(KernelError, match="must be float32"):
        _gemv.swiglu_row(x, w.astype(np.float64), w, np.empty(4, np.float32))
    with pytest.raises(KernelError, match="do not match"):
        _gemv.swiglu_row(x, w, np.ones((8, 5), np.float32), np.empty(4, np.float32))
    with pytest.raises(KernelError, match="unit column"):
        _gemv.swiglu_row(x, np.ones((8, 8), np.float32)[:, ::2], w, np.empty(4, np.float32))


def _mlp(k: int, n: int, *, swap_a: bool = False, swap_y: bool = False, gate_out: bool = False,
         up_out: bool = False, seed: int = 0):
    rng = np.random.default_rng(seed)
    wg = rng.standard_normal((k, n), dtype=np.float32) / np.float32(np.sqrt(k))
    wu = rng.standard_normal((k, n), dtype=np.float32) / np.float32(np.sqrt(k))
    wd = rng.standard_normal((n, k), dtype=np.float32) / np.float32(np.sqrt(n))
    nodes = [
        helper.make_node("MatMul", ["x", "wg"], ["g"], name="gate"),
        helper.make_node("MatMul", ["x", "wu"], ["u"], name="up"),
        helper.make_node("Sigmoid", ["g"], ["s"], name="sig"),
        helper.make_node("Mul", ["s", "g"] if swap_a else ["g", "s"], ["a"], name="act"),
        helper.make_node("Mul", ["u", "a"] if swap_y else ["a", "u"], ["m"], name="gated"),
        helper.make_node("MatMul", ["m", "wd"], ["y"], name="down"),
    ]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if gate_out:
        outs.append(helper.make_tensor_value_info("g", TensorProto.FLOAT, None))
    if up_out:
        nodes.append(helper.make_node("Neg", ["u"], ["nu"], name="neg_up"))
        outs.append(helper.make_tensor_value_info("nu", TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, None, k])],
                              outs, [numpy_helper.from_array(a, nm) for a, nm in ((wg, "wg"), (wu, "wu"), (wd, "wd"))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _ort(model, feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _fused_labels(sess) -> list[str]:
    return [s[0] for s in sess._cg.steps if "fused SwiGLU" in s[0]]


@pytest.mark.parametrize("swap_a,swap_y", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("rows", [1, 5])
def test_session_fuses_the_gate_and_matches_onnxruntime(swap_a, swap_y, rows):
    k, n = 256, 768
    m = _mlp(k, n, swap_a=swap_a, swap_y=swap_y)
    sess = of.InferenceSession(of.load(m.SerializeToString()), threads=2)
    assert _fused_labels(sess) == ["node 'gated' (fused SwiGLU)"]
    assert len(sess._cg.steps) == 2  # the fused gate and the down projection
    x = np.random.default_rng(rows).standard_normal((1, rows, k), dtype=np.float32)
    (got,) = sess.run(None, {"x": x})
    (want,) = _ort(m, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(want).max())))
    c = sess.last_run
    if rows == 1:  # the compiled call: the gated row and the down projection's output, nothing else
        assert c.allocated_bytes == n * 4 + k * 4
    else:  # the two products, then the gate in one compiled pass: the products are counted too
        assert c.allocated_bytes == rows * (n * 4 * 3 + k * 4)
    assert c.copied_bytes == 0


@pytest.mark.parametrize("rows", [3, 37])
def test_the_many_row_gate_is_bitwise_the_unfused_kernels(rows):
    # 37 rows x 1000 columns: blocks on the pool, and a tail that is no multiple of 64
    k, n = 64, 1000
    x = np.random.default_rng(rows).standard_normal((1, rows, k), dtype=np.float32) * np.float32(4)
    x[0, 0, :3] = [np.nan, np.inf, -np.inf]
    fused = of.InferenceSession(of.load(_mlp(k, n).SerializeToString()), threads=2)
    plain = of.InferenceSession(of.load(_mlp(k, n, gate_out=True).SerializeToString()), threads=2)
    assert _fused_labels(fused) and not _fused_labels(plain)
    (a,) = fused.run(None, {"x": x})
    b = plain.run(None, {"x": x})[0]
    assert np.array_equal(a, b, equal_nan=True)


@pytest.mark.parametrize("kw", [{"gate_out": True}, {"up_out": True}])
def test_a_gate_read_outside_the_group_is_not_fused(kw):
    k, n = 64, 96
    m = _mlp(k, n, **kw)
    sess = of.InferenceSession(of.load(m.SerializeToString()), threads=2)
    assert _fused_labels(sess) == []
    x = np.random.default_rng(1).standard_normal((1, 1, k), dtype=np.float32)
    got = sess.run(None, {"x": x})
    want = _ort(m, {"x": x})
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("variant", ["genai_fp32", "torch20"])
def test_decoders_fuse_their_mlp_and_match_onnxruntime(decoder_models, variant):
    """Every layer's gate of a real decoder is fused; a decode step's outputs equal
    onnxruntime's on the original model."""
    from tests.fixtures.decoders import load_io_info, random_decoder_feeds

    path = decoder_models[variant]
    info = load_io_info(path)
    sess = of.InferenceSession(str(path), threads=2)
    assert len(_fused_labels(sess)) == int(info["num_layers"])
    feeds = random_decoder_feeds(path, info, batch=1, seq=1, past=9, seed=3)
    got = sess.run(None, feeds)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
