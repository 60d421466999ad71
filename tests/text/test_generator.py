"""onnxforge/text/generator.py on the onnxruntime-genai fp32 fixture (a tiny random Qwen3)."""
from __future__ import annotations

import json

import pytest

import onnxforge as of
from onnxforge.commands.generate import generate as generate_ids
from tests.text.conftest import copy_folder

PROMPT = "def main():"


def test_greedy_text_is_the_decoded_greedy_tokens(generator, genai_dir, hf_tokenizer):
    text = generator.generate(PROMPT, max_new_tokens=8)
    report = generator.last_report
    ids = hf_tokenizer.encode(PROMPT)
    assert report["prompt_ids"] == ids
    # the oracle: the token-id decode of `onnxforge generate --prompt-ids` (its own state)
    expected = generate_ids(str(genai_dir / "model.onnx"), ids, 8, progress=False)["tokens"]
    eos = generator.tokenizer.eos_ids
    n = next((i for i, t in enumerate(expected) if t in eos), len(expected))
    assert report["tokens"] == expected[:n + 1][:8]
    assert text == hf_tokenizer.decode(expected[:n], skip_special_tokens=True)
    assert "".join(generator.stream(PROMPT, max_new_tokens=8)) == text
    assert report["copied_bytes"] and set(report["copied_bytes"]) == {0}


def test_the_same_seed_gives_the_same_text(generator):
    s = of.Sampling(temperature=1.0, top_k=50, top_p=0.95, seed=1234)
    first = generator.generate(PROMPT, max_new_tokens=10, sampling=s)
    assert generator.generate(PROMPT, max_new_tokens=10, sampling=s) == first
    tokens = generator.last_report["tokens"]
    others = [generator.generate(PROMPT, max_new_tokens=10, sampling=of.Sampling(temperature=1.0, seed=k))
              for k in range(3)]
    assert len(tokens) == 10 and any(o != first for o in others)  # sampling, not greedy


def test_eos_from_genai_config_stops_the_decode(generator, genai_dir, tmp_path):
    step = 3
    for prompt in ("x = 1", "import os", "print('hi')"):  # one whose step-3 token is new at step 3
        generator.generate(prompt, max_new_tokens=6)
        tokens = generator.last_report["tokens"]
        if tokens[step] not in tokens[:step]:
            break
    else:
        pytest.fail(f"every prompt repeats a token at step {step}")
    folder = copy_folder(genai_dir, tmp_path / "m")
    cfg = json.loads((folder / "genai_config.json").read_text())
    cfg["model"]["eos_token_id"] = [tokens[step]]
    (folder / "genai_config.json").write_text(json.dumps(cfg))
    with of.Generator(folder, max_length=32) as g:
        text = g.generate(prompt, max_new_tokens=6)
        assert g.last_report["tokens"] == tokens[:step + 1]
        assert g.last_report["finish_reason"] == "stop"
        assert text == g.tokenizer.decode(tokens[:step])


def test_context_limit_and_prompt_errors(genai_dir):
    with of.Generator(genai_dir, max_length=8) as g:
        g.generate("a b c", max_new_tokens=50)
        r = g.last_report
        assert r["finish_reason"] in ("length", "stop") and r["prompt_tokens"] + r["new_tokens"] <= 9
        with pytest.raises(of.OnnxforgeError, match="more than the 8"):
            g.generate("a " * 20)
        with pytest.raises(of.OnnxforgeError, match="max_new_tokens"):
            g.generate("a", max_new_tokens=0)


def test_chat_keeps_the_common_prefix_and_answers_as_a_fresh_state(genai_dir, hf_tokenizer):
    messages = [{"role": "user", "content": "Hello world"}]
    with of.Generator(genai_dir, max_length=96) as g:
        reply = g.chat(messages, max_new_tokens=6)
        first = g.last_report
        held = first["prompt_ids"] + first["tokens"][:-1]
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "def main():"}]
        reply2 = g.chat(messages, max_new_tokens=6)
        second = g.last_report
    ids2 = hf_tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    ids2 = list(ids2["input_ids"] if hasattr(ids2, "keys") else ids2)
    common = next((i for i, (a, b) in enumerate(zip(held, ids2)) if a != b), min(len(held), len(ids2)))
    assert second["prompt_ids"] == ids2
    assert second["reused_tokens"] == common > len(first["prompt_ids"]) // 2
    assert second["prefilled_tokens"] == len(ids2) - common
    with of.Generator(genai_dir, max_length=96) as fresh:  # rewinding lost nothing
        assert fresh.chat(messages, max_new_tokens=6) == reply2
        assert fresh.last_report["tokens"] == second["tokens"]


def test_a_folder_without_a_tokenizer(genai_dir, tmp_path):
    folder = copy_folder(genai_dir, tmp_path / "bare", without=("tokenizer.json",))
    with pytest.raises(of.TokenizerFileError, match="tokenizer.json"):
        of.Generator(folder)
