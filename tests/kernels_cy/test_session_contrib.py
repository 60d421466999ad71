"""Contrib operators against onnxruntime on random inputs (one-node models), the
GroupQueryAttention shared-buffer mode, and shape fuzzing against float64 numpy."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from onnxforge.graphbuilder import serde
from onnxforge.graphbuilder.ir.core import READ_WRITE, Alias
from onnxforge.kernels_cy.runtime.session import InferenceSession
from tests.kernels_cy.helpers import F, onnx_model, tensor

MS = {"com.microsoft": 1}
I32 = TensorProto.INT32


def _both(model, feeds, atol):
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = InferenceSession(model).run(None, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, atol=atol, rtol=0)
    return got


def _gqa_model(nq, nkv, h, rotary, softcap=0.0, n_cos=32):
    node = helper.make_node(
        "GroupQueryAttention", ["q", "k", "v", "pk", "pv", "seqlens_k", "total", "cos", "sin"],
        ["y", "present_k", "present_v"], domain="com.microsoft", num_heads=nq, kv_num_heads=nkv,
        do_rotary=rotary, softcap=softcap)
    ins = [tensor("q", F, ["b", "s", nq * h]), tensor("k", F, ["b", "s", nkv * h]),
           tensor("v", F, ["b", "s", nkv * h]), tensor("pk", F, ["b", nkv, "p", h]),
           tensor("pv", F, ["b", nkv, "p", h]), tensor("seqlens_k", I32, ["b"]), tensor("total", I32, []),
           tensor("cos", F, [n_cos, h // 2]), tensor("sin", F, [n_cos, h // 2])]
    outs = [tensor("y", F, None), tensor("present_k", F, None), tensor("present_v", F, None)]
    return onnx_model([node], ins, outs, opset=21, domains=MS)


def _gqa_feeds(rng, b, s, p, nq, nkv, h, n_cos=32):
    ang = rng.random((n_cos, h // 2)).astype(np.float32) * 3
    return {"q": rng.standard_normal((b, s, nq * h), dtype=np.float32),
            "k": rng.standard_normal((b, s, nkv * h), dtype=np.float32),
            "v": rng.standard_normal((b, s, nkv * h), dtype=np.float32),
            "pk": rng.standard_normal((b, nkv, p, h), dtype=np.float32),
            "pv": rng.standard_normal((b, nkv, p, h), dtype=np.float32),
            "seqlens_k": np.full(b, p + s - 1, np.int32), "total": np.array(p + s, np.int32),
            "cos": np.cos(ang), "sin": np.sin(ang)}


@pytest.mark.parametrize("b, s, p", [(1, 5, 0), (2, 1, 3), (1, 3, 4), (3, 1, 0)])
@pytest.mark.parametrize("rotary", [0, 1])
@pytest.mark.parametrize("nq, nkv, h", [(4, 2, 16), (6, 3, 16), (2, 2, 32)])  # onnxruntime: h % 16 == 0
def test_group_query_attention_matches_onnxruntime(b, s, p, rotary, nq, nkv, h):
    rng = np.random.default_rng(b * 100 + s * 10 + p + rotary)
    _both(_gqa_model(nq, nkv, h, rotary), _gqa_feeds(rng, b, s, p, nq, nkv, h), atol=1e-5)


def test_group_query_attention_softcap_matches_onnxruntime():
    rng = np.random.default_rng(5)
    _both(_gqa_model(4, 2, 16, 1, softcap=2.0), _gqa_feeds(rng, 2, 1, 3, 4, 2, 16), atol=1e-5)


def _shared(plain):
    """The GQA model with present aliasing past (shared-buffer mode): past READ_WRITE,
    each present output MUST_ALIAS its past and declaring it (rules L4, L7)."""
    shared = serde.from_proto(plain)
    node = next(iter(shared.graph))
    node.output_alias = [Alias(1, 3), Alias(2, 4)]
    for o, i in ((1, 3), (2, 4)):
        node.inputs[i].access = READ_WRITE
        node.outputs[o].alias_of = node.inputs[i]
    return shared


def test_group_query_attention_shared_buffer_writes_in_place():
    rng = np.random.default_rng(9)
    nq, nkv, h, cap = 4, 2, 16, 12
    plain = _gqa_model(nq, nkv, h, 1)
    shared = _shared(plain)
    feeds = _gqa_feeds(rng, 1, 2, 3, nq, nkv, h)
    want = InferenceSession(plain).run(None, feeds)
    buf_k = np.zeros((1, nkv, cap, h), np.float32)
    buf_v = np.zeros((1, nkv, cap, h), np.float32)
    buf_k[:, :, :3], buf_v[:, :, :3] = feeds["pk"], feeds["pv"]
    y, pk, pv = InferenceSession(shared).run(None, feeds | {"pk": buf_k, "pv": buf_v})
    assert pk is buf_k and pv is buf_v
    np.testing.assert_allclose(y, want[0], atol=1e-6)
    np.testing.assert_allclose(buf_k[:, :, :5], want[1], atol=1e-6)
    assert not buf_k[:, :, 5:].any()


@pytest.mark.parametrize("shape", [(2, 3, 16), (1, 1, 8), (4, 32)])
def test_skip_and_simplified_layer_norm_match_onnxruntime(shape):
    rng = np.random.default_rng(len(shape))
    h = shape[-1]
    nodes = [helper.make_node("SkipSimplifiedLayerNormalization", ["x", "skip", "g"], ["y", "", "", "sum"],
                              domain="com.microsoft", epsilon=1e-6),
             helper.make_node("SimplifiedLayerNormalization", ["sum", "g"], ["z"], epsilon=1e-5, axis=-1)]
    m = onnx_model(nodes, [tensor("x", F, list(shape)), tensor("skip", F, list(shape)), tensor("g", F, [h])],
                   [tensor("y", F, None), tensor("sum", F, None), tensor("z", F, None)], opset=21, domains=MS)
    feeds = {"x": rng.standard_normal(shape, dtype=np.float32),
             "skip": rng.standard_normal(shape, dtype=np.float32), "g": rng.random(h, dtype=np.float32)}
    _both(m, feeds, atol=1e-5)


@pytest.mark.parametrize("with_zp", [False, True])
@pytest.mark.parametrize("m_rows, k, n", [(1, 64, 8), (5, 96, 12), (3, 32, 1)])
def test_matmul_nbits_matches_onnxruntime_at_accuracy_level_0(with_zp, m_rows, k, n):
    rng = np.random.default_rng(k + n)
    blk = 32
    nblk = -(-k // blk)
    q = rng.integers(0, 256, size=(n, nblk, blk // 2), dtype=np.uint8)
    scales = (rng.random(n * nblk, dtype=np.float32) + 0.5) / 8
    inits = [helper.make_tensor("w", TensorProto.UINT8, q.shape, q.tobytes(), raw=True),
             helper.make_tensor("s", F, scales.shape, scales)]
    names = ["a", "w", "s"]
    if with_zp:
        zp = rng.integers(0, 256, size=(n, (nblk + 1) // 2), dtype=np.uint8)
        inits.append(helper.make_tensor("zp", TensorProto.UINT8, zp.shape, zp.tobytes(), raw=True))
        names.append("zp")
    node = helper.make_node("MatMulNBits", names, ["y"], domain="com.microsoft", K=k, N=n, bits=4,
                            block_size=blk, accuracy_level=0)
    model = onnx_model([node], [tensor("a", F, [m_rows, k])], [tensor("y", F, [m_rows, n])],
                       opset=21, domains=MS, initializers=inits)
    _both(model, {"a": rng.standard_normal((m_rows, k), dtype=np.float32)}, atol=1e-4)


@pytest.mark.parametrize("interleaved", [0, 1])
def test_ms_rotary_embedding_matches_onnxruntime(interleaved):
    rng = np.random.default_rng(interleaved)
    b, s, nh, h = 2, 3, 2, 8
    node = helper.make_node("RotaryEmbedding", ["x", "pos", "cos", "sin"], ["y"], domain="com.microsoft",
                            interleaved=interleaved)
    m = onnx_model([node], [tensor("x", F, [b, s, nh * h]), tensor("pos", TensorProto.INT64, [b, s]),
                            tensor("cos", F, [16, h // 2]), tensor("sin", F, [16, h // 2])],
                   [tensor("y", F, None)], opset=21, domains=MS)
    ang = rng.random((16, h // 2)).astype(np.float32)
    feeds = {"x": rng.standard_normal((b, s, nh * h), dtype=np.float32),
             "pos": np.array([[0, 1, 2], [5, 6, 7]], np.int64), "cos": np.cos(ang), "sin": np.sin(ang)}
    _both(m, feeds, atol=1e-5)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("shape", [(0, 4), (3, 0, 5), (2, 1, 7), (5, 33)])
def test_kernels_on_odd_and_empty_shapes_match_float64(shape):
    rng = np.random.default_rng(sum(shape))
    nodes = [helper.make_node("Softmax", ["x"], ["sm"], axis=-1),
             helper.make_node("RMSNormalization", ["x", "g"], ["rms"], epsilon=1e-5),
             helper.make_node("Sigmoid", ["x"], ["sg"]),
             helper.make_node("ReduceMean", ["x"], ["mean"], keepdims=1)]
    h = shape[-1]
    m = onnx_model(nodes, [tensor("x", F, list(shape)), tensor("g", F, [h])],
                   [tensor(n, F, None) for n in ("sm", "rms", "sg", "mean")])
    x = rng.standard_normal(shape).astype(np.float32)
    g = rng.random(h).astype(np.float32)
    sm, rms, sg, mean = InferenceSession(m).run(None, {"x": x, "g": g})
    x64 = x.astype(np.float64)
    e = np.exp(x64 - (x64.max(axis=-1, keepdims=True) if x.size else 0))
    np.testing.assert_allclose(sm, e / e.sum(axis=-1, keepdims=True), atol=1e-6)
    np.testing.assert_allclose(rms, x64 / np.sqrt((x64 ** 2).mean(axis=-1, keepdims=True) + 1e-5) * g,
                               atol=1e-5)
    np.testing.assert_allclose(sg, 1 / (1 + np.exp(-x64)), atol=1e-6)
    if x.size:
        np.testing.assert_allclose(mean, x64.mean(axis=tuple(range(x.ndim)), keepdims=True), atol=1e-6)


def _packed_gqa_model(nq, nkv, h, rotary, interleaved=0):
    node = helper.make_node(
        "GroupQueryAttention", ["qkv", "", "", "pk", "pv", "seqlens_k", "total", "cos", "sin"],
        ["y", "present_k", "present_v"], domain="com.microsoft", num_heads=nq, kv_num_heads=nkv,
        do_rotary=rotary, rotary_interleaved=interleaved)
    ins = [tensor("qkv", F, ["b", "s", (nq + 2 * nkv) * h]), tensor("pk", F, ["b", nkv, "p", h]),
           tensor("pv", F, ["b", nkv, "p", h]), tensor("seqlens_k", I32, ["b"]), tensor("total", I32, []),
           tensor("cos", F, [32, h // 2]), tensor("sin", F, [32, h // 2])]
    outs = [tensor("y", F, None), tensor("present_k", F, None), tensor("present_v", F, None)]
    return onnx_model([node], ins, outs, opset=21, domains=MS)


@pytest.fixture
def general_path_calls(monkeypatch):
    """Counts the calls that reach GroupQueryAttention's general (Python) path."""
    from onnxforge.kernels_cy.attention.kernels import GroupQueryAttention

    calls = []
    general = GroupQueryAttention._run

    def counted(self, *args, **kwargs):
        calls.append(args[0].shape)
        return general(self, *args, **kwargs)

    monkeypatch.setattr(GroupQueryAttention, "_run", counted)
    return calls


@pytest.mark.parametrize("p, cap", [(0, 0), (5, 5), (3, 9)])
@pytest.mark.parametrize("rotary, interleaved, packed", [(0, 0, False), (1, 0, False), (0, 0, True), (1, 0, True),
                                                         (1, 1, True)])
def test_group_query_attention_decode_step_compiled_call_matches_onnxruntime(p, cap, rotary, interleaved, packed,
                                                                            general_path_calls):
    # one token of batch row 0 takes the compiled call; a past buffer longer than the valid
    # length (cap > p) gives a present of the buffer's length, as onnxruntime makes it
    nq, nkv, h = 4, 2, 16
    rng = np.random.default_rng(p * 7 + cap + rotary * 3 + interleaved + packed * 11)
    feeds = _gqa_feeds(rng, 1, 1, cap, nq, nkv, h)
    feeds["seqlens_k"] = np.array([p], np.int32)
    feeds["total"] = np.array(p + 1, np.int32)
    if packed:
        feeds["qkv"] = np.concatenate([feeds.pop("q"), feeds.pop("k"), feeds.pop("v")], axis=-1)
        model = _packed_gqa_model(nq, nkv, h, rotary, interleaved)
    else:
        model = _gqa_model(nq, nkv, h, rotary)
    _both(model, feeds, atol=1e-5)
    assert general_path_calls == []


def test_group_query_attention_decode_step_in_place_and_its_errors(general_path_calls):
    # shared buffers: the compiled call writes row p in place and returns the buffers; a
    # position past the capacity is a CacheRangeError with nothing written
    nq, nkv, h, cap, p = 4, 2, 16, 8, 5
    rng = np.random.default_rng(3)
    plain = _gqa_model(nq, nkv, h, 1)
    shared = _shared(plain)
    feeds = _gqa_feeds(rng, 1, 1, p, nq, nkv, h)
    want = ort.InferenceSession(plain.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    buf_k = np.zeros((1, nkv, cap, h), np.float32)
    buf_v = np.zeros((1, nkv, cap, h), np.float32)
    buf_k[:, :, :p], buf_v[:, :, :p] = feeds["pk"], feeds["pv"]
    sess = InferenceSession(shared)
    y, pk, pv = sess.run(None, feeds | {"pk": buf_k, "pv": buf_v})
    assert pk is buf_k and pv is buf_v and general_path_calls == []
    np.testing.assert_allclose(y, want[0], atol=1e-5)
    np.testing.assert_allclose(buf_k[:, :, :p + 1], want[1], atol=1e-5)
    np.testing.assert_allclose(buf_v[:, :, :p + 1], want[2], atol=1e-6)
    assert not buf_k[:, :, p + 1:].any() and not buf_v[:, :, p + 1:].any()
    before = (buf_k.copy(), buf_v.copy())
    from onnxforge.kernels_cy.errors import CacheRangeError

    with pytest.raises(CacheRangeError, match="capacity 8"):
        sess.run(None, feeds | {"pk": buf_k, "pv": buf_v, "seqlens_k": np.array([cap], np.int32),
                                "total": np.array(cap + 1, np.int32)})
    np.testing.assert_array_equal(buf_k, before[0])
    np.testing.assert_array_equal(buf_v, before[1])
