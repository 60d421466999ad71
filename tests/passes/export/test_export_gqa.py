"""GroupQueryAttention lowered to standard ONNX, exactly as onnxruntime computes it.

onnxruntime never reads the attention mask: each row's valid past and new tokens
come from ``seqlens_k`` (row length - 1) and ``total_sequence_length``. The
lowering must reproduce that per row, whatever the mask's zeros look like (left
padding, a right-padded past, rows of different lengths). Every case compares
onnxruntime on the original node with onnxruntime on the lowered graph, over all
outputs, and a float64 numpy oracle of the operator checks both on a few cases.
"""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxforge.passes.export import non_standard_nodes, to_standard_onnx

from onnxforge.errors import ExportError

FLOAT, INT32, INT64 = TensorProto.FLOAT, TensorProto.INT32, TensorProto.INT64
MS = "com.microsoft"
HQ, HKV, D = 4, 2, 16
TOL = 1e-5
DECODER_TOL = 1e-4


# --------------------------------------------------------------------------- one-node models


def _gqa_model(*, packed: bool = False, rotary: bool = False, interleaved: int = 0,
               window: int = -1, softcap: float = 0.0, position_ids: bool = False,
               from_mask: bool = False, past: bool = True, seed: int = 0,
               extra_attrs: dict | None = None, extra_inputs: dict[int, str] | None = None
               ) -> onnx.ModelProto:
    """One GroupQueryAttention node (opset 21 + com.microsoft 1). With ``from_mask``
    the model takes an int64 ``mask`` and derives ``seqlens_k = sum(mask) - 1`` and
    ``total_sequence_length = width(mask)`` as the onnxruntime-genai builder does;
    otherwise both are graph inputs."""
    rng = np.random.default_rng(seed)
    inits, pre = [], []
    vi = helper.make_tensor_value_info
    if from_mask:
        inits += [numpy_helper.from_array(np.array([1], np.int64), "one"),
                  numpy_helper.from_array(np.array(1, np.int64), "axis1")]
        pre = [helper.make_node("ReduceSum", ["mask", "one"], ["msum"], keepdims=0),
               helper.make_node("Sub", ["msum", "one"], ["seqlens64"]),
               helper.make_node("Cast", ["seqlens64"], ["seqlens"], to=INT32),
               helper.make_node("Shape", ["mask"], ["mshape"]),
               helper.make_node("Gather", ["mshape", "axis1"], ["total64"], axis=0),
               helper.make_node("Cast", ["total64"], ["total"], to=INT32)]
    ins = ["query"] + (["", ""] if packed else ["key", "value"])
    ins += ["past_key", "past_value"] if past else ["", ""]
    ins += ["seqlens", "total"]
    if rotary:
        theta = rng.random((64, D // 2)) * 3.0
        inits += [numpy_helper.from_array(np.cos(theta).astype(np.float32), "cos"),
                  numpy_helper.from_array(np.sin(theta).astype(np.float32), "sin")]
        ins += ["cos", "sin"]
    if position_ids:
        ins += [""] * (9 - len(ins)) + ["pos"]
    for index, name in sorted((extra_inputs or {}).items()):
        ins += [""] * (index - len(ins)) + [name]
    attrs = dict(num_heads=HQ, kv_num_heads=HKV, do_rotary=int(rotary), local_window_size=window,
                 rotary_interleaved=interleaved, **(extra_attrs or {}))
    if softcap:
        attrs["softcap"] = softcap
    node = helper.make_node("GroupQueryAttention", ins, ["out", "present_key", "present_value"],
                            domain=MS, name="gqa", **attrs)
    hidden = (HQ + 2 * HKV) * D if packed else HQ * D
    inputs = [vi("query", FLOAT, ["B", "S", hidden])]
    if not packed:
        inputs += [vi("key", FLOAT, ["B", "S", HKV * D]), vi("value", FLOAT, ["B", "S", HKV * D])]
    if past:
        inputs += [vi("past_key", FLOAT, ["B", HKV, "P", D]), vi("past_value", FLOAT, ["B", HKV, "P", D])]
    inputs += ([vi("mask", INT64, ["B", "T"])] if from_mask else
               [vi("seqlens", INT32, ["B"]), vi("total", INT32, [])])
    if position_ids:
        inputs.append(vi("pos", INT64, ["B", "S"]))
    for name in (extra_inputs or {}).values():
        inputs.append(vi(name, FLOAT, None))
    outputs = [vi("out", FLOAT, ["B", "S", HQ * D]), vi("present_key", FLOAT, ["B", HKV, "L", D]),
               vi("present_value", FLOAT, ["B", HKV, "L", D])]
    graph = helper.make_graph(pre + [node], "g", inputs, outputs, inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)])
    m.ir_version = 10
    return m


def _feeds(B: int, S: int, P: int, lengths: list[int], *, total: int | None = None,
           packed: bool = False, seed: int = 1) -> dict[str, np.ndarray]:
    """Random q/k/v/past; ``seqlens_k = lengths - 1``; ``total`` defaults to ``P + S``."""
    rng = np.random.default_rng(seed)
    hidden = (HQ + 2 * HKV) * D if packed else HQ * D
    feeds = {"query": rng.standard_normal((B, S, hidden)).astype(np.float32),
             "past_key": rng.standard_normal((B, HKV, P, D)).astype(np.float32),
             "past_value": rng.standard_normal((B, HKV, P, D)).astype(np.float32),
             "seqlens": np.array(lengths, np.int32) - 1,
             "total": np.array(P + S if total is None else total, np.int32)}
    if not packed:
        feeds["key"] = rng.standard_normal((B, S, HKV * D)).astype(np.float32)
        feeds["value"] = rng.standard_normal((B, S, HKV * D)).astype(np.float32)
    return feeds


def _session(proto: onnx.ModelProto) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "0")
    return ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _max_diff(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    assert [x.shape for x in a] == [y.shape for y in b]
    return max(float(np.abs(x.astype(np.float64) - y).max()) if x.size else 0.0 for x, y in zip(a, b))


def _lowered(m: onnx.ModelProto) -> onnx.ModelProto:
    low = to_standard_onnx(m)
    onnx.checker.check_model(low, full_check=True)
    assert non_standard_nodes(low) == []
    assert "Attention" in [n.op_type for n in low.graph.node]
    return low


# Scenarios: (B, S, P, row lengths, total_sequence_length or None for P + S). A row length
# is what onnxruntime reads from seqlens_k; the mask that produced it may have its zeros
# anywhere (left padding, a right-padded past), which is invisible to the operator.
SCENARIOS = {
    "prefill_full_b1": (1, 5, 0, [5], None),
    "prefill_padded_b2": (2, 5, 0, [5, 3], None),            # left or right padded prompt
    "prefill_padded_b3": (3, 6, 0, [6, 2, 1], None),
    "prefill_padded_b4": (4, 4, 0, [4, 1, 3, 2], None),
    "decode_full_b1": (1, 1, 6, [7], None),
    "decode_rows_b2": (2, 1, 6, [7, 4], None),               # right-padded past in row 1
    "decode_rows_b3": (3, 1, 5, [6, 2, 4], None),
    "decode_rows_b4": (4, 1, 6, [7, 6, 3, 1], None),
    "subsequent_prompt_b1": (1, 3, 4, [7], None),
    "subsequent_prompt_padded_b1": (1, 3, 4, [5], None),     # past of 2 valid tokens
    "static_cache_decode_b2": (2, 1, 8, [5, 3], 5),          # a capacity buffer longer than total
    "static_cache_prefill_b3": (3, 4, 8, [4, 2, 1], 4),
}

VARIANTS = {
    "plain": {},
    "rotary": {"rotary": True},
    "rotary_interleaved": {"rotary": True, "interleaved": 1},
    "packed_rotary": {"packed": True, "rotary": True},
    "softcap": {"softcap": 3.0},
    "window2": {"window": 2},
    "window0": {"window": 0},
    "window3_softcap_rotary": {"window": 3, "softcap": 3.0, "rotary": True},
    "window1_softcap": {"window": 1, "softcap": 2.0},
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_gqa_matches_onnxruntime_per_row(variant: str, scenario: str) -> None:
    opts = VARIANTS[variant]
    B, S, P, lengths, total = SCENARIOS[scenario]
    m = _gqa_model(**opts)
    feeds = _feeds(B, S, P, lengths, total=total, packed=bool(opts.get("packed")))
    low = _lowered(m)
    expected = _session(m).run(None, feeds)
    got = _session(low).run(None, feeds)
    assert _max_diff(expected, got) <= TOL


@pytest.mark.parametrize("scenario", ["prefill_padded_b3", "decode_rows_b3", "subsequent_prompt_b1"])
def test_gqa_position_ids(scenario: str) -> None:
    """A position_ids input is used as given, except in a first prompt, where
    onnxruntime offsets every row from ``position_ids[0, 0]``."""
    B, S, P, lengths, total = SCENARIOS[scenario]
    m = _gqa_model(rotary=True, position_ids=True)
    feeds = _feeds(B, S, P, lengths, total=total)
    feeds["pos"] = (np.arange(B)[:, None] * 7 + np.arange(S)[None] + 2).astype(np.int64)
    expected = _session(m).run(None, feeds)
    got = _session(_lowered(m)).run(None, feeds)
    assert _max_diff(expected, got) <= TOL


def test_gqa_without_past_inputs() -> None:
    m = _gqa_model(rotary=True, past=False)
    feeds = {k: v for k, v in _feeds(3, 5, 0, [5, 2, 4]).items() if not k.startswith("past")}
    assert _max_diff(_session(m).run(None, feeds), _session(_lowered(m)).run(None, feeds)) <= TOL


# --------------------------------------------------------------------------- masks as the builder feeds them


def _left_padded(lengths: list[int], width: int) -> np.ndarray:
    return np.array([[0] * (width - n) + [1] * n for n in lengths], np.int64)


def _right_padded_past(valid_past: list[int], past: int, seq: int) -> np.ndarray:
    """Row b: its valid past, zeros up to the past width, then ``seq`` new tokens."""
    return np.array([[1] * n + [0] * (past - n) + [1] * seq for n in valid_past], np.int64)


MASK_CASES = {
    "left_padded_prefill_b2": (5, 0, lambda: _left_padded([5, 2], 5)),
    "left_padded_prefill_b4": (4, 0, lambda: _left_padded([4, 1, 3, 2], 4)),
    "right_padded_prefill_b3": (5, 0, lambda: _left_padded([5, 3, 1], 5)[:, ::-1].copy()),
    "right_padded_past_decode_b2": (1, 5, lambda: _right_padded_past([5, 2], 5, 1)),
    "right_padded_past_decode_b4": (1, 6, lambda: _right_padded_past([6, 0, 3, 5], 6, 1)),
    "left_padded_decode_b3": (1, 5, lambda: _left_padded([6, 3, 2], 6)),
    "per_row_lengths_decode_b1": (1, 4, lambda: _right_padded_past([2], 4, 1)),
}


@pytest.mark.parametrize("rotary", [False, True])
@pytest.mark.parametrize("case", sorted(MASK_CASES))
def test_gqa_from_attention_mask(case: str, rotary: bool) -> None:
    S, P, make_mask = MASK_CASES[case]
    mask = make_mask()
    B = mask.shape[0]
    m = _gqa_model(rotary=rotary, from_mask=True)
    feeds = _feeds(B, S, P, [1] * B)
    del feeds["seqlens"], feeds["total"]
    feeds["mask"] = mask
    low = _lowered(m)
    types = [n.op_type for n in low.graph.node]
    assert "ReduceSum" in types  # seqlens_k is read now
    assert _max_diff(_session(m).run(None, feeds), _session(low).run(None, feeds)) <= TOL


# --------------------------------------------------------------------------- float64 oracle


def _rotate(x: np.ndarray, pos: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    c, s = cos[pos][:, None], sin[pos][:, None]  # [B, 1, S, D/2]
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * c - b * s, b * c + a * s], axis=-1)


def _oracle(feeds: dict[str, np.ndarray], cos: np.ndarray | None = None,
            sin: np.ndarray | None = None) -> list[np.ndarray]:
    """GroupQueryAttention as onnxruntime defines it (non-packed, no window), in float64."""
    f = {k: v.astype(np.float64) if v.dtype == np.float32 else v for k, v in feeds.items()}
    B, S, _ = f["query"].shape
    P = f["past_key"].shape[2]
    T = int(f["total"])
    tot = f["seqlens"].astype(np.int64) + 1
    past = np.zeros(B, np.int64) if S == T else tot - S
    L = max(T, P)
    q = f["query"].reshape(B, S, HQ, D).transpose(0, 2, 1, 3)
    k = f["key"].reshape(B, S, HKV, D).transpose(0, 2, 1, 3)
    v = f["value"].reshape(B, S, HKV, D).transpose(0, 2, 1, 3)
    if cos is not None:
        pos = past[:, None] + np.arange(S)[None]
        q, k = _rotate(q, pos, cos, sin), _rotate(k, pos, cos, sin)
    pk, pv = np.zeros((B, HKV, L, D)), np.zeros((B, HKV, L, D))
    out = np.zeros((B, HQ, S, D))
    for b in range(B):
        p = past[b]
        pk[b, :, :p], pv[b, :, :p] = f["past_key"][b, :, :p], f["past_value"][b, :, :p]
        pk[b, :, p:p + S], pv[b, :, p:p + S] = k[b], v[b]
        for h in range(HQ):
            scores = q[b, h] @ pk[b, h // (HQ // HKV)].T / np.sqrt(D)
            for s in range(S):
                ok = (np.arange(L) <= p + s) & (np.arange(L) < tot[b])
                e = np.where(ok, np.exp(scores[s] - scores[s][ok].max()), 0.0)
                out[b, h, s] = e / e.sum() @ pv[b, h // (HQ // HKV)]
    return [out.transpose(0, 2, 1, 3).reshape(B, S, HQ * D), pk, pv]


@pytest.mark.parametrize("scenario", ["prefill_padded_b3", "decode_rows_b4", "subsequent_prompt_padded_b1",
                                      "static_cache_decode_b2"])
def test_gqa_oracle_agrees_with_both(scenario: str) -> None:
    B, S, P, lengths, total = SCENARIOS[scenario]
    m = _gqa_model(rotary=True)
    tables = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    feeds = _feeds(B, S, P, lengths, total=total)
    expected = _oracle(feeds, tables["cos"].astype(np.float64), tables["sin"].astype(np.float64))
    assert _max_diff(expected, _session(m).run(None, feeds)) <= TOL
    assert _max_diff(expected, _session(_lowered(m)).run(None, feeds)) <= TOL


# --------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("kwargs,reason", [
    ({"extra_inputs": {10: "bias"}}, "attention_bias is not lowered"),
    ({"extra_inputs": {11: "sink"}}, "head_sink is not lowered"),
    ({"extra_attrs": {"smooth_softmax": 1}}, "smooth_softmax is not lowered"),
    ({"window": -2}, "local_window_size=-2"),
    ({"extra_attrs": {"k_quant_type": "PER_TENSOR"}}, "quantized KV cache"),
])
def test_gqa_refuses_what_it_cannot_reproduce(kwargs: dict, reason: str) -> None:
    m = _gqa_model(**kwargs)
    with pytest.raises(ExportError) as info:
        to_standard_onnx(m)
    (path, why), = info.value.constructs
    assert path == "graph.node[0]('gqa')"
    assert why.startswith("com.microsoft::GroupQueryAttention cannot be lowered") and reason in why


def test_gqa_keep_domains_keeps_it() -> None:
    m = _gqa_model(rotary=True)
    kept = to_standard_onnx(m, keep_domains=[MS])
    assert [n.op_type for n in kept.graph.node if n.domain == MS] == ["GroupQueryAttention"]
    feeds = _feeds(2, 1, 3, [4, 2])
    assert _max_diff(_session(m).run(None, feeds), _session(kept).run(None, feeds)) <= TOL


# --------------------------------------------------------------------------- the genai fp32 decoder


@pytest.fixture(scope="module")
def genai_fp32(decoder_models):
    path = decoder_models["genai_fp32"]
    return path, _session(onnx.load(str(path))), _session(to_standard_onnx(path))


def _decoder_feeds(path, mask: np.ndarray, seq: int, seed: int) -> dict[str, np.ndarray]:
    from tests.fixtures.decoders import random_decoder_feeds

    B, width = mask.shape
    feeds = random_decoder_feeds(path, batch=B, seq=seq, past=width - seq, seed=seed)
    feeds["attention_mask"] = mask.astype(feeds["attention_mask"].dtype)
    return feeds


DECODER_CASES = {
    "left_padded_prefill_b2": (5, lambda: _left_padded([5, 3], 5)),
    "left_padded_prefill_b3": (6, lambda: _left_padded([6, 4, 1], 6)),
    "left_padded_prefill_b4": (4, lambda: _left_padded([4, 2, 3, 1], 4)),
    "right_padded_prefill_b3": (5, lambda: _left_padded([5, 2, 4], 5)[:, ::-1].copy()),
    "full_prefill_b1": (4, lambda: np.ones((1, 4), np.int64)),
    "right_padded_past_decode_b2": (1, lambda: _right_padded_past([6, 3], 6, 1)),
    "right_padded_past_decode_b4": (1, lambda: _right_padded_past([5, 1, 4, 2], 5, 1)),
    "left_padded_decode_b3": (1, lambda: _left_padded([7, 5, 2], 7)),
    "full_decode_b1": (1, lambda: np.ones((1, 6), np.int64)),
    "per_row_lengths_prefill_after_past_b1": (3, lambda: _right_padded_past([2], 5, 3)),
}


@pytest.mark.parametrize("case", sorted(DECODER_CASES))
def test_genai_decoder_matches_onnxruntime_with_padding(case: str, genai_fp32) -> None:
    path, original, exported = genai_fp32
    seq, make_mask = DECODER_CASES[case]
    feeds = _decoder_feeds(path, make_mask(), seq, seed=len(case))
    expected = original.run(None, feeds)
    got = exported.run(None, feeds)
    assert _max_diff(expected, got) <= DECODER_TOL
