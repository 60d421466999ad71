"""The ``generate`` command functions (onnxforge/commands/generate.py) on stateful decoders."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest

from onnxforge.commands.generate import add_generate_parser
from onnxforge.kernels_cy.errors import FeedError
from onnxforge.kernels_cy.runtime.state import make_state
from onnxforge.samples import build_builtin


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_generate_parser(p.add_subparsers(dest="command", required=True))
    return p.parse_args(argv)


def _greedy(model, prompt: list[int], new: int) -> list[int]:
    st = make_state(model)
    ids, done, tokens = prompt, 0, []
    for _ in range(new):
        out = st.run({"input_ids": np.array([ids], np.int64), "position": np.array(done, np.int64)})
        done += len(ids)
        ids = [int(out["logits"][0, -1].argmax())]
        tokens.append(ids[0])
    return tokens


def test_generate_json_on_the_builtin_decoder(capsys):
    args = _parse(["generate", "builtin:decoder", "--prompt-ids", "5,17,42", "--new", "6", "--json"])
    args.model = build_builtin("decoder")
    assert args.func(args) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert set(report) == {"tokens", "step_ms", "cache_bytes", "allocated_bytes", "copied_bytes",
                           "cache_addresses"}
    assert report["tokens"] == _greedy(build_builtin("decoder"), [5, 17, 42], 6)
    assert all(len(report[k]) == 6 for k in report)
    assert report["copied_bytes"] == [0] * 6
    assert len({json.dumps(a, sort_keys=True) for a in report["cache_addresses"]}) == 1
    assert sorted(report["cache_addresses"][0]) == ["cache.0.key", "cache.0.value", "cache.1.key",
                                                    "cache.1.value"]
    assert len(set(report["allocated_bytes"][1:])) == 1 and len(set(report["cache_bytes"])) == 1
    assert "generate" in captured.err  # the progress bar


def test_generate_text_and_a_synthetic_prompt(capsys):
    args = _parse(["generate", "m", "--prompt-len", "4", "--new", "3", "-q"])
    args.model = build_builtin("decoder")
    assert args.func(args) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("tokens ") and len(out[0].split()) == 4
    assert len(out) == 2 + 3 and "cache.0.key=0x" in out[2]


def test_generate_clamps_new_tokens_to_the_capacity(capsys):
    args = _parse(["generate", "m", "--prompt-len", "60", "--new", "10", "-q", "--json"])
    args.model = build_builtin("decoder")
    assert args.func(args) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert len(report["tokens"]) == 5  # 60 prompt tokens + 4 fed back = the capacity 64
    assert report["clamped"] == {"asked": 10, "new": 5, "context": 64,
                                 "source": "the capacity of the state's caches"}
    assert "warning: --new 10 clamped to 5" in captured.err


def test_generate_refuses_a_prompt_longer_than_the_capacity():
    args = _parse(["generate", "m", "--prompt-len", "65", "--new", "1", "-q"])
    args.model = build_builtin("decoder")
    with pytest.raises(FeedError, match="65 tokens, more than the 64"):
        args.func(args)


@pytest.mark.slow
def test_generate_converts_a_genai_decoder(decoder_models: dict[str, Path], capsys):
    args = _parse(["generate", str(decoder_models["genai_fp32"]), "--prompt-ids", "5,17,42",
                   "--new", "5", "--json", "-q"])
    assert args.func(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert len(report["tokens"]) == 5 and report["copied_bytes"] == [0] * 5
    assert len({json.dumps(a, sort_keys=True) for a in report["cache_addresses"]}) == 1
    assert len(report["cache_addresses"][0]) == 8
