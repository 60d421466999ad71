"""The real exported decoders on the CPU backend against onnxruntime.

A 64-token prompt, then greedy decode steps feeding present back as past: logits
within 1e-4 of onnxruntime for the fp32 exports (torch opsets 20/23, genai fp32),
within 1e-3 for genai int4 compared with MatMulNBits at accuracy_level 0, and the
same greedy tokens.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from onnxforge.kernels_cy.runtime.session import InferenceSession
from tests.fixtures.decoders import load_io_info, past_names, present_names, random_decoder_feeds

pytestmark = pytest.mark.slow

PROMPT = 64
STEPS = 4
TOLERANCE = {"torch20": 1e-4, "torch23": 1e-4, "genai_fp32": 1e-4, "genai_int4": 1e-3}


def _ort_session(path: Path, variant: str) -> ort.InferenceSession:
    if variant != "genai_int4":
        return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    model = onnx.load(str(path))
    for node in model.graph.node:
        for a in node.attribute:
            if node.op_type == "MatMulNBits" and a.name == "accuracy_level":
                a.i = 0  # exact arithmetic: level 4 quantizes activations to int8
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _decode(run: Any, info: dict[str, Any], feeds: dict[str, np.ndarray], out_names: list[str]):
    """Prompt + greedy steps; returns (list of logits, list of tokens)."""
    logits_all, tokens = [], []
    feeds = dict(feeds)
    for step in range(STEPS + 1):
        outs = dict(zip(out_names, run(feeds)))
        logits = outs[info["logits"]]
        logits_all.append(logits)
        token = int(np.argmax(logits[0, -1]))
        tokens.append(token)
        if step == STEPS:
            break
        for (pk, pv), (qk, qv) in zip(past_names(info), present_names(info)):
            feeds[pk], feeds[pv] = outs[qk], outs[qv]
        ids_dtype = feeds[info["input_ids"]].dtype
        feeds[info["input_ids"]] = np.array([[token]], dtype=ids_dtype)
        mask = feeds[info["attention_mask"]]
        feeds[info["attention_mask"]] = np.ones((1, mask.shape[1] + 1), dtype=mask.dtype)
        if info.get("position_ids"):
            feeds[info["position_ids"]] = np.array([[mask.shape[1]]], dtype=feeds[info["position_ids"]].dtype)
    return logits_all, tokens


@pytest.mark.parametrize("variant", ["torch20", "torch23", "genai_fp32", "genai_int4"])
def test_prefill_and_greedy_decode_match_onnxruntime(decoder_models: dict[str, Path], variant: str) -> None:
    path = decoder_models[variant]
    info = load_io_info(path)
    feeds = random_decoder_feeds(path, info, batch=1, seq=PROMPT, past=0, seed=7)
    ref = _ort_session(path, variant)
    names = [o.name for o in ref.get_outputs()]
    sess = InferenceSession(str(path))
    assert [o.name for o in sess.get_outputs()] == names
    want_logits, want_tokens = _decode(lambda f: ref.run(None, f), info, feeds, names)
    got_logits, got_tokens = _decode(lambda f: sess.run(None, f), info, feeds, names)
    assert got_tokens == want_tokens
    for g, w in zip(got_logits, want_logits):
        assert g.shape == w.shape
        assert float(np.max(np.abs(g.astype(np.float64) - w))) <= TOLERANCE[variant]
    assert sess.last_run.allocated_bytes > 0 and sess.last_run.copied_bytes == 0


def test_batched_decode_step_matches_onnxruntime(decoder_models: dict[str, Path]) -> None:
    path = decoder_models["torch23"]
    info = load_io_info(path)
    feeds = random_decoder_feeds(path, info, batch=3, seq=1, past=6, seed=3)
    want = _ort_session(path, "torch23").run(None, feeds)
    got = InferenceSession(str(path)).run(None, feeds)
    for g, w in zip(got, want):
        assert g.shape == w.shape and float(np.max(np.abs(g - w))) <= 1e-4
