"""Standard export of the built-in stateful decoder, and the errors of unexportable models."""
from __future__ import annotations

import json
import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from onnxforge.errors import ExportError
from onnxforge.graphbuilder.builder.graph_builder import GraphBuilder, tensor_type
from onnxforge.graphbuilder.ir.core import Model, Value
from onnxforge.passes.export import FEEDBACK_KEY, non_standard_nodes, read_feedback, to_standard_onnx
from onnxforge.proto_ext.types import StructType, TensorType
from onnxforge.samples import DecoderConfig, build_decoder

FLOAT, INT64, INT4 = TensorProto.FLOAT, TensorProto.INT64, TensorProto.INT4


def _session(proto: onnx.ModelProto) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])


# --------------------------------------------------------------------------- float64 reference


def _int4_nibbles(raw: bytes, count: int) -> np.ndarray:
    """Signed INT4 codes packed two per byte, low nibble first."""
    b = np.frombuffer(bytes(raw), dtype=np.uint8)
    codes = np.empty(b.size * 2, dtype=np.int64)
    codes[0::2] = b & 0xF
    codes[1::2] = b >> 4
    codes = codes[:count]
    return np.where(codes >= 8, codes - 16, codes)


def _affine_weight(model: Model, name: str) -> np.ndarray:
    header = model.graph.encoded_initializers[name].const.header
    a = header.affine
    shape = tuple(header.logical_type.shape)
    codes = _int4_nibbles(header.raw_data, int(np.prod(shape))).reshape(shape).astype(np.float64)
    scale = np.asarray(a.scale.array(), dtype=np.float64)
    zp = 0.0 if a.zero_point is None else np.asarray(a.zero_point.array()).astype(np.float64)
    block = np.repeat(np.arange(scale.shape[a.axis]), a.block_size)[: shape[a.axis]]
    scale_full = np.take(scale, block, axis=a.axis)
    zp_full = np.take(zp, block, axis=a.axis) if np.ndim(zp) else zp
    return (codes - zp_full) * scale_full


def _int4_block_weight(model: Model, name: str) -> np.ndarray:
    header = model.graph.encoded_initializers[name].const.header
    rec = np.frombuffer(bytes(header.raw_data), dtype=np.uint8).reshape(-1, 20)
    codes = np.stack([_int4_nibbles(r[:16].tobytes(), 32) for r in rec]).astype(np.float64)
    scale = rec[:, 16:20].copy().view("<f4").reshape(-1).astype(np.float64)
    return (codes * scale[:, None]).reshape(tuple(header.logical_type.shape))


def _rms(x: np.ndarray, gamma: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * gamma


class _Reference:
    """The built-in decoder computed in float64 numpy from its weights."""

    def __init__(self, model: Model, cfg: DecoderConfig):
        self.cfg = cfg
        self.w = {k: np.asarray(v.const.numpy(), dtype=np.float64)
                  for k, v in model.graph.initializers.items()}
        for layer in range(cfg.layers):
            for n in ("w1", "w2"):
                self.w[f"layer{layer}.{n}"] = _affine_weight(model, f"layer{layer}.{n}")
        self.w["lm_head"] = _int4_block_weight(model, "lm_head")
        shape = (cfg.layers, cfg.kv_heads, cfg.capacity, cfg.head_dim)
        self.k = np.zeros(shape)
        self.v = np.zeros(shape)
        self.length = 0

    def step(self, ids: np.ndarray) -> np.ndarray:
        c, w = self.cfg, self.w
        seq = ids.shape[1]
        pos = self.length
        x = w["embed"][ids[0]]                                       # [seq, hidden]
        group = c.heads // c.kv_heads
        for layer in range(c.layers):
            p = f"layer{layer}"
            h = _rms(x, w[f"{p}.norm1"])
            q = (h @ w[f"{p}.wq"]).reshape(seq, c.heads, c.head_dim)
            k = (h @ w[f"{p}.wk"]).reshape(seq, c.kv_heads, c.head_dim)
            v = (h @ w[f"{p}.wv"]).reshape(seq, c.kv_heads, c.head_dim)
            self.k[layer, :, pos:pos + seq] = k.transpose(1, 0, 2)
            self.v[layer, :, pos:pos + seq] = v.transpose(1, 0, 2)
            out = np.zeros((seq, c.heads, c.head_dim))
            for head in range(c.heads):
                kh = self.k[layer, head // group, : pos + seq]
                vh = self.v[layer, head // group, : pos + seq]
                s = q[:, head] @ kh.T / np.sqrt(c.head_dim)          # [seq, pos + seq]
                allowed = np.arange(pos + seq)[None, :] <= (pos + np.arange(seq))[:, None]
                s = np.where(allowed, s, -np.inf)
                e = np.exp(s - s.max(axis=-1, keepdims=True))
                out[:, head] = (e / e.sum(axis=-1, keepdims=True)) @ vh
            x = x + out.reshape(seq, -1) @ w[f"{p}.wo"]
            h2 = _rms(x, w[f"{p}.norm2"])
            x = x + np.maximum(h2 @ w[f"{p}.w1"], 0) @ w[f"{p}.w2"]
        self.length += seq
        return (_rms(x, w["norm_f"]) @ w["lm_head"])[None]


# --------------------------------------------------------------------------- built-in decoder


@pytest.fixture(scope="module")
def decoder() -> tuple[Model, onnx.ModelProto]:
    model = build_decoder()
    return model, to_standard_onnx(model)


def test_builtin_decoder_is_standard(decoder) -> None:
    model, proto = decoder
    onnx.checker.check_model(proto, full_check=True)
    assert non_standard_nodes(proto) == []
    assert {op.domain: op.version for op in proto.opset_import} == {"": 24}
    assert len(proto.functions) == 0
    types = {n.op_type for n in proto.graph.node}
    assert {"TensorScatter", "DequantizeLinear"} <= types and "CacheUpdate" not in types
    # no extension field survives: a stock parse discards nothing
    copy = onnx.ModelProto()
    copy.ParseFromString(proto.SerializeToString())
    size = copy.ByteSize()
    copy.DiscardUnknownFields()
    assert copy.ByteSize() == size
    # the source model is untouched
    assert model.graph.bindings and model.graph.encoded_initializers


def test_builtin_decoder_feedback_metadata(decoder) -> None:
    _, proto = decoder
    feedback = read_feedback(proto)
    assert feedback == {f"cache.{l}.{k}": f"present.{l}.{k}" for l in range(2) for k in ("key", "value")}
    entry = [p.value for p in proto.metadata_props if p.key == FEEDBACK_KEY]
    assert json.loads(entry[0]) == feedback


def test_builtin_decoder_matches_float64_reference(decoder) -> None:
    model, proto = decoder
    cfg = DecoderConfig()
    sess = _session(proto)
    ref = _Reference(model, cfg)
    feedback = read_feedback(proto)
    caches = {name: np.zeros((1, cfg.kv_heads, cfg.capacity, cfg.head_dim), np.float32)
              for name in feedback}
    rng = np.random.default_rng(7)
    position = 0
    diffs = []
    for seq in (5, 1, 1, 1):
        ids = rng.integers(0, cfg.vocab, size=(1, seq)).astype(np.int64)
        feeds = {"input_ids": ids, "position": np.array(position, np.int64), **caches}
        out_names = [o.name for o in sess.get_outputs()]
        results = dict(zip(out_names, sess.run(None, feeds)))
        expected = ref.step(ids)
        assert results["logits"].shape == expected.shape
        diffs.append(float(np.abs(results["logits"] - expected).max()))
        caches = {inp: results[out] for inp, out in feedback.items()}
        assert caches["cache.0.key"].shape == (1, cfg.kv_heads, cfg.capacity, cfg.head_dim)
        position += seq
    assert max(diffs) <= 1e-4, diffs


def test_builtin_decoder_below_opset_24_uses_scatter_elements() -> None:
    model = build_decoder()
    proto = to_standard_onnx(model, target_opset=23)
    onnx.checker.check_model(proto, full_check=True)
    types = {n.op_type for n in proto.graph.node}
    assert "ScatterElements" in types and "TensorScatter" not in types
    assert {op.domain: op.version for op in proto.opset_import} == {"": 23}
    hi = to_standard_onnx(model)
    cfg = DecoderConfig()
    feeds = {"input_ids": np.array([[3, 1, 4, 1, 5]], np.int64), "position": np.array(2, np.int64)}
    rng = np.random.default_rng(1)
    for l in range(cfg.layers):
        for k in ("key", "value"):
            shape = (1, 2, cfg.capacity, cfg.head_dim)
            feeds[f"cache.{l}.{k}"] = rng.standard_normal(shape).astype(np.float32)
    a = _session(proto).run(None, feeds)
    b = _session(hi).run(None, feeds)
    for x, y in zip(a, b):
        assert np.abs(x - y).max() <= 1e-6


# --------------------------------------------------------------------------- errors


def test_lower_false_rejects_encoded_initializer_and_cache_update() -> None:
    with pytest.raises(ExportError) as info:
        to_standard_onnx(build_decoder(), lower=False)
    paths = [p for p, _ in info.value.constructs]
    assert "graph.encoded_initializer['layer0.w1']" in paths
    assert "graph.encoded_initializer['lm_head']" in paths
    cache_updates = [p for p in paths if re.fullmatch(r"graph\.node\[\d+\]\('CacheUpdate(_\d)?'\)", p)]
    assert len(cache_updates) == 4
    assert all("ai.onnxforge::CacheUpdate is not standard" in dict(info.value.constructs)[p]
               for p in cache_updates)
    assert sum(p.endswith(".output_alias") for p in paths) == 4
    assert any(p.startswith("graph.persistent_bindings[0]") for p in paths)
    assert "model.struct_types" in paths


def _unexportable_model() -> Model:
    g = GraphBuilder(opset=23, domains={"com.microsoft": 1, "acme.ops": 1})
    x = g.input("x", FLOAT, [2, 32])
    blob = StructType(kind=None)
    g.input("blob", type=blob)
    raw = g.declare_struct_type("RawBlock", [("codes", StructType(kind="array", array=_array_int4())),
                                            ("scale", tensor_type(FLOAT, []))])
    records = bytes(20 * 16)
    w = g.encoded_initializer("w", struct_type=raw, codes=records,
                              logical_type=tensor_type(FLOAT, [32, 16]))
    y = g.op.MatMul(x, w)
    z = g.op["acme.ops"].Frobnicate(y, _name="frob")
    q = g.op["com.microsoft"].GroupQueryAttention(
        g.initializer("q", np.zeros((1, 1, 64), np.float32)),
        g.initializer("k", np.zeros((1, 1, 32), np.float32)),
        g.initializer("v", np.zeros((1, 1, 32), np.float32)),
        None, None,
        g.initializer("seqlens", np.zeros((1,), np.int32)),
        g.initializer("total", np.array(1, np.int32)),
        num_heads=2, kv_num_heads=1, smooth_softmax=1, _name="attn", _outputs=3)
    g.output(z, "z")
    g.output(q[0], "attn_out")
    # a subgraph with a persistent binding (added directly in the IR)
    then = g.subgraph("then_branch")
    then.output(then.op.Identity(x), "t_out")
    other = g.subgraph("else_branch")
    other.output(other.op.Identity(x), "e_out")
    cond = g.initializer("cond", np.array(True))
    out = g.op.If(cond, then_branch=then, else_branch=other, _name="branch")
    g.output(out, "branch_out")
    model = g.to_model()
    sub = then.graph
    state = sub.add_input(Value("state_in", TensorType(FLOAT, (2, 32))))
    sub.bindings.append((state, sub.outputs[0]))
    return model


def _array_int4():
    from onnxforge.proto_ext.types import ArrayKind

    return ArrayKind(TensorType(INT4, ()), 32)


def test_export_error_lists_every_unexportable_construct() -> None:
    model = _unexportable_model()
    with pytest.raises(ExportError) as info:
        to_standard_onnx(model)
    found = dict(info.value.constructs)
    paths = list(found)
    assert "graph.input['blob'].type.struct_type" in paths
    assert "graph.encoded_initializer['w'].struct_type" in paths
    assert "decoder FunctionProto" in found["graph.encoded_initializer['w'].struct_type"]
    frob = [p for p in paths if p.endswith("('frob')")]
    assert len(frob) == 1 and frob[0].startswith("graph.node[")
    assert "acme.ops::Frobnicate" in found[frob[0]]
    attn = [p for p in paths if p.endswith("('attn')")]
    assert len(attn) == 1 and "smooth_softmax" in found[attn[0]]
    sub = [p for p in paths if "persistent_bindings" in p]
    assert len(sub) == 1 and sub[0].startswith("graph.node('branch').attribute['then_branch'].g")
    # the message names every one of them
    for p in paths:
        assert p in str(info.value)
    # keeping the custom domains removes those two errors, the others remain
    with pytest.raises(ExportError) as info2:
        to_standard_onnx(model, keep_domains=["acme.ops", "com.microsoft"])
    paths2 = [p for p, _ in info2.value.constructs]
    assert not any(p.endswith("('frob')") or p.endswith("('attn')") for p in paths2)
    assert "graph.encoded_initializer['w'].struct_type" in paths2


def test_target_opset_too_low_is_reported() -> None:
    with pytest.raises(ExportError) as info:
        to_standard_onnx(build_decoder(), target_opset=20)
    found = dict(info.value.constructs)
    affine = [p for p in found if p.endswith(".affine")]
    assert len(affine) == 4 and all("opset >= 21" in found[p] for p in affine)


def test_plain_standard_model_round_trips_and_lower_false_accepts_it() -> None:
    x = helper.make_tensor_value_info("x", FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", FLOAT, [2, 3])
    proto = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 21)])
    out = to_standard_onnx(proto, lower=False)
    assert [n.op_type for n in out.graph.node] == ["Relu"]
    assert {op.domain: op.version for op in out.opset_import} == {"": 21}
    up = to_standard_onnx(proto, target_opset=24)
    assert {op.domain: op.version for op in up.opset_import} == {"": 24}
    onnx.checker.check_model(up, full_check=True)


def test_foreign_extension_fields_are_reported() -> None:
    node = helper.make_node("Relu", ["x"], ["y"], name="relu")
    tagged = onnx.NodeProto()
    tagged.ParseFromString(node.SerializeToString() + bytes([0xC0, 0xB8, 0x02, 0x01]))  # field 5000 = 1
    x = helper.make_tensor_value_info("x", FLOAT, [2])
    y = helper.make_tensor_value_info("y", FLOAT, [2])
    proto = helper.make_model(helper.make_graph([tagged], "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 21)])
    with pytest.raises(ExportError) as info:
        to_standard_onnx(proto)
    assert [p for p, _ in info.value.constructs] == ["graph.node[0]"]


def test_builtin_decoder_from_a_file_with_external_data(tmp_path) -> None:
    from onnxforge.graphbuilder import serde

    model = build_decoder()
    serde.save(model, tmp_path / "decoder.onnx", external_data="decoder.data", size_threshold=0)
    from_file = to_standard_onnx(tmp_path / "decoder.onnx")
    direct = to_standard_onnx(model)
    assert all(t.data_location == onnx.TensorProto.DEFAULT for t in from_file.graph.initializer)
    cfg = DecoderConfig()
    feeds = {"input_ids": np.array([[2, 7, 1]], np.int64), "position": np.array(0, np.int64)}
    for l in range(cfg.layers):
        for k in ("key", "value"):
            feeds[f"cache.{l}.{k}"] = np.zeros((1, 2, cfg.capacity, cfg.head_dim), np.float32)
    for a, b in zip(_session(from_file).run(None, feeds), _session(direct).run(None, feeds)):
        np.testing.assert_array_equal(a, b)


def test_local_functions_are_inlined_when_lowering() -> None:
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [2, 3])
    fb = g.function("local.fns", "Swish", ["a"])
    a = fb.graph.inputs[0]
    fb.graph.outputs.append(fb.op.Mul(a, fb.op.Sigmoid(a)))
    g.output(g.op["local.fns"].Swish(x, _name="swish"), "y")
    model = g.to_model()
    with pytest.raises(ExportError) as info:
        to_standard_onnx(model, lower=False)
    assert [p for p, _ in info.value.constructs] == ["graph.node[0]('swish')"]
    proto = to_standard_onnx(model)
    assert [n.op_type for n in proto.graph.node] == ["Sigmoid", "Mul"] and not proto.functions
    assert {op.domain for op in proto.opset_import} == {""}
    xv = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    (y,) = _session(proto).run(None, {"x": xv})
    expected = xv.astype(np.float64) / (1 + np.exp(-xv.astype(np.float64)))
    assert np.abs(y - expected).max() <= 1e-6


def test_sample_int4_block_decoder_function_matches_native_decoder() -> None:
    from onnxforge.proto_ext.catalogue import Catalogue
    from onnxforge.proto_ext.codecs.decode import run_decoder_function
    from onnxforge.proto_ext.codecs.records import read_fields
    from onnxforge.proto_ext.codecs.registry import get_decoder
    from onnxforge.proto_ext.sizes import record_layout

    model = build_decoder()
    header = model.graph.encoded_initializers["lm_head"].const.header
    catalogue = Catalogue(model.struct_types)
    decl = catalogue.resolve(header.struct_type)
    layout = record_layout(header.struct_type, catalogue)
    fields = read_fields(header.raw_data, layout)
    by_function = run_decoder_function(decl.decoder.proto, fields, "lm_head").reshape(-1)
    native = get_decoder("Int4Block").fn(fields, len(header.raw_data) // 20, layout)
    np.testing.assert_array_equal(by_function, native)
    expected = _int4_block_weight(model, "lm_head").reshape(-1)
    assert np.abs(by_function - expected).max() <= 1e-7  # one float32 rounding of code * scale
