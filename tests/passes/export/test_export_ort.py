"""Each onnxruntime-only operator: onnxruntime running the original operator versus
onnxruntime running its standard lowering, on random inputs."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxforge.errors import ExportError
from onnxforge.passes.export import non_standard_nodes, to_standard_onnx

FLOAT, INT32, INT64, UINT8 = TensorProto.FLOAT, TensorProto.INT32, TensorProto.INT64, TensorProto.UINT8
MS = "com.microsoft"
TOL = 1e-5


def _model(nodes, inputs, outputs, inits=(), opset: int = 21) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)])
    m.ir_version = 10
    return m


def _run(proto: onnx.ModelProto, feeds: dict[str, np.ndarray], *, optimize: bool = True) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    # onnxruntime may fuse DequantizeLinear + MatMul into an int8-accumulating MatMulNBits;
    # accuracy level 0 keeps the float arithmetic the original runs with
    so.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "0")
    sess = ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _compare(proto: onnx.ModelProto, feeds: dict[str, np.ndarray], *, keep_check: bool = True) -> float:
    """Max abs diff between the original and the lowered model; checks the lowered one."""
    lowered = to_standard_onnx(proto)
    onnx.checker.check_model(lowered, full_check=True)
    assert non_standard_nodes(lowered) == []
    if keep_check:
        kept = to_standard_onnx(proto, keep_domains=[MS])
        assert any(n.domain == MS for n in kept.graph.node) or not any(
            n.domain == MS for n in proto.graph.node)
    a = _run(proto, feeds)
    b = _run(lowered, feeds)
    assert len(a) == len(b)
    diff = 0.0
    for x, y in zip(a, b):
        assert x.shape == y.shape
        diff = max(diff, float(np.abs(x.astype(np.float64) - y).max()) if x.size else 0.0)
    return diff


def _vi(name: str, elem: int, shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


# --------------------------------------------------------------------------- RMS norms


def test_simplified_layer_normalization() -> None:
    rng = np.random.default_rng(0)
    gamma = numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "gamma")
    node = helper.make_node("SimplifiedLayerNormalization", ["x", "gamma"], ["y"], axis=-1,
                            epsilon=1e-6, stash_type=1)
    m = _model([node], [_vi("x", FLOAT, [2, 3, 16])], [_vi("y", FLOAT, [2, 3, 16])], [gamma], opset=22)
    x = rng.standard_normal((2, 3, 16)).astype(np.float32)
    assert _compare(m, {"x": x}, keep_check=False) <= TOL
    lowered = to_standard_onnx(m)
    assert [n.op_type for n in lowered.graph.node] == ["RMSNormalization"]


@pytest.mark.parametrize("with_bias", [False, True])
def test_skip_simplified_layer_normalization(with_bias: bool) -> None:
    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array(rng.standard_normal(32).astype(np.float32), "gamma")]
    ins = ["x", "skip", "gamma"]
    if with_bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(32).astype(np.float32), "bias"))
        ins.append("bias")
    node = helper.make_node("SkipSimplifiedLayerNormalization", ins, ["y", "", "", "sum"], domain=MS,
                            epsilon=1e-6)
    m = _model([node], [_vi("x", FLOAT, [2, 4, 32]), _vi("skip", FLOAT, [2, 4, 32])],
               [_vi("y", FLOAT, [2, 4, 32]), _vi("sum", FLOAT, [2, 4, 32])], inits)
    feeds = {"x": rng.standard_normal((2, 4, 32)).astype(np.float32),
             "skip": rng.standard_normal((2, 4, 32)).astype(np.float32)}
    assert _compare(m, feeds) <= TOL


# --------------------------------------------------------------------------- MatMulNBits


def _pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """Pack the last axis, least-significant bits first."""
    per = 8 // bits
    c = codes.astype(np.uint8).reshape(*codes.shape[:-1], -1, per)
    out = np.zeros(c.shape[:-1], np.uint8)
    for i in range(per):
        out |= c[..., i] << (bits * i)
    return out


@pytest.mark.parametrize("bits,K,N,block,zero_points,bias", [
    (4, 64, 24, 32, False, False),
    (4, 96, 16, 32, True, True),      # 3 blocks: odd count of packed zero points
    (4, 40, 8, 16, True, False),      # K not a multiple of the block size
    (8, 64, 16, 32, True, False),
    (8, 64, 8, 16, False, True),
])
def test_matmul_nbits(bits: int, K: int, N: int, block: int, zero_points: bool, bias: bool) -> None:
    rng = np.random.default_rng(K + N + bits)
    kb = -(-K // block)
    codes = rng.integers(0, 1 << bits, size=(N, kb * block)).astype(np.uint8)
    codes[:, K:] = 0
    zp_full = np.full((N, kb), 1 << (bits - 1), np.int64)
    B = _pack(codes.reshape(N, kb, block), bits)                      # [N, kb, block*bits/8]
    scales = (rng.random((N * kb)) * 0.1 + 0.01).astype(np.float32)
    inits = [numpy_helper.from_array(B, "B"), numpy_helper.from_array(scales, "scales")]
    ins = ["A", "B", "scales"]
    if zero_points:
        zps = rng.integers(0, 1 << bits, size=(N, kb)).astype(np.uint8)
        zp_full = zps.astype(np.int64)
        if bits == 4 and kb % 2:
            zps = np.concatenate([zps, np.zeros((N, 1), np.uint8)], axis=1)
        inits.append(numpy_helper.from_array(_pack(zps, bits) if bits < 8 else zps, "zp"))
        ins.append("zp")
    if bias:
        while len(ins) < 5:
            ins.append("")
        inits.append(numpy_helper.from_array(rng.standard_normal(N).astype(np.float32), "bias"))
        ins.append("bias")
    node = helper.make_node("MatMulNBits", ins, ["Y"], domain=MS, K=K, N=N, bits=bits,
                            block_size=block, accuracy_level=0)
    m = _model([node], [_vi("A", FLOAT, [2, 3, K])], [_vi("Y", FLOAT, [2, 3, N])], inits)
    A = rng.standard_normal((2, 3, K)).astype(np.float32)
    assert _compare(m, {"A": A}) <= TOL
    lowered = to_standard_onnx(m)
    assert {n.op_type for n in lowered.graph.node} >= {"DequantizeLinear", "MatMul"}
    # float64 oracle from the codes: W[k, n] = (code[n, k] - zp[n, k / block]) * scale[n, k / block]
    blocks = np.arange(K) // block
    W = ((codes[:, :K].astype(np.float64) - zp_full[:, blocks])
         * scales.reshape(N, kb)[:, blocks].astype(np.float64)).T
    expected = A.astype(np.float64) @ W
    if bias:
        expected = expected + numpy_helper.to_array(inits[-1]).astype(np.float64)
    (unfused,) = _run(lowered, {"A": A}, optimize=False)
    tol = TOL * max(1.0, float(np.abs(expected).max()))  # float32 accumulation, relative
    assert np.abs(unfused - expected).max() <= tol
    assert np.abs(_run(m, {"A": A})[0] - expected).max() <= tol


def test_matmul_nbits_default_zero_point_is_half_range() -> None:
    # one weight row of code 8 (the default zero point) must give zero output
    K, N, block = 32, 2, 32
    codes = np.full((N, 1, block), 8, np.uint8)
    codes[1] = 9
    B = _pack(codes, 4)
    scales = np.ones(N, np.float32)
    node = helper.make_node("MatMulNBits", ["A", "B", "s"], ["Y"], domain=MS, K=K, N=N, bits=4,
                            block_size=block)
    m = _model([node], [_vi("A", FLOAT, [1, K])], [_vi("Y", FLOAT, [1, N])],
               [numpy_helper.from_array(B, "B"), numpy_helper.from_array(scales, "s")])
    A = np.ones((1, K), np.float32)
    out = _run(to_standard_onnx(m), {"A": A})[0]
    np.testing.assert_allclose(out, [[0.0, float(K)]], atol=1e-6)


def test_matmul_nbits_rejects_float_zero_points() -> None:
    K, N, block = 32, 4, 32
    node = helper.make_node("MatMulNBits", ["A", "B", "s", "zp"], ["Y"], domain=MS, K=K, N=N, bits=4,
                            block_size=block, name="mm")
    m = _model([node], [_vi("A", FLOAT, [1, K])], [_vi("Y", FLOAT, [1, N])],
               [numpy_helper.from_array(np.zeros((N, 1, 16), np.uint8), "B"),
                numpy_helper.from_array(np.ones(N, np.float32), "s"),
                numpy_helper.from_array(np.ones((N, 1), np.float32), "zp")])
    with pytest.raises(ExportError) as info:
        to_standard_onnx(m)
    (path, reason), = info.value.constructs
    assert path.startswith("graph.node[0]") and "zero points" in reason


# --------------------------------------------------------------------------- RotaryEmbedding


@pytest.mark.parametrize("layout,interleaved,pos_kind", [
    ("3d", 0, "2d"), ("3d", 1, "2d"), ("4d", 0, "2d"), ("3d", 0, "offset"), ("4d", 1, "offset"),
])
def test_rotary_embedding(layout: str, interleaved: int, pos_kind: str) -> None:
    rng = np.random.default_rng(3)
    B, S, H, D, max_pos = 2, 5, 3, 8, 32
    theta = rng.random((max_pos, D // 2)) * 3.0
    cos = numpy_helper.from_array(np.cos(theta).astype(np.float32), "cos")
    sin = numpy_helper.from_array(np.sin(theta).astype(np.float32), "sin")
    shape = [B, S, H * D] if layout == "3d" else [B, H, S, D]
    attrs = {"interleaved": interleaved}
    if layout == "3d":
        attrs["num_heads"] = H
    node = helper.make_node("RotaryEmbedding", ["x", "pos", "cos", "sin"], ["y"], domain=MS, **attrs)
    if pos_kind == "2d":
        pos_vi, pos = _vi("pos", INT64, [B, S]), rng.integers(0, max_pos, size=(B, S)).astype(np.int64)
    else:
        pos_vi, pos = _vi("pos", INT64, [1]), np.array([7], np.int64)
    m = _model([node], [_vi("x", FLOAT, shape), pos_vi], [_vi("y", FLOAT, shape)], [cos, sin])
    x = rng.standard_normal(shape).astype(np.float32)
    assert _compare(m, {"x": x, "pos": pos}) <= TOL


# GroupQueryAttention (per-row lengths, padding, windows, the real decoder): test_export_gqa.py
