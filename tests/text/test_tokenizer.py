"""onnxforge/text/tokenizer.py against transformers' tokenizer on the fixture folders."""
from __future__ import annotations

import json

import pytest

from onnxforge.proto_ext.errors import OnnxforgeError
from onnxforge.text import TextTokenizer, TokenizerFileError
from tests.text.conftest import copy_folder

CONVERSATIONS = [
    [{"role": "user", "content": "Hello world"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "def main():"},
     {"role": "assistant", "content": "return 42"}, {"role": "user", "content": "héllo 世界 🙂"}],
]


@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_chat_template_renders_as_transformers_does(genai_dir, hf_tokenizer, messages):
    tok = TextTokenizer(genai_dir)
    assert (genai_dir / "chat_template.jinja").is_file()
    expected = hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert tok.apply_chat_template(messages) == expected
    ids = hf_tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    assert tok.encode_chat(messages) == list(ids)


@pytest.mark.parametrize("text", ["def main():\n    return 42", "héllo 世界 🙂", ""])
def test_encode_and_decode_match_transformers(genai_dir, hf_tokenizer, text):
    tok = TextTokenizer(genai_dir)
    ids = tok.encode(text)
    assert ids == hf_tokenizer.encode(text)
    assert tok.decode(ids) == hf_tokenizer.decode(ids, skip_special_tokens=True)


def test_genai_config_values_and_the_chat_template_key(genai_dir, hf_tokenizer, tmp_path):
    cfg = json.loads((genai_dir / "genai_config.json").read_text())["model"]
    tok = TextTokenizer(genai_dir)
    assert tok.eos_ids == {cfg["eos_token_id"]} and tok.bos_id == cfg["bos_token_id"]
    assert tok.context_length == cfg["context_length"]
    # eos_token_id as a list; the template from tokenizer_config.json's chat_template key
    folder = copy_folder(genai_dir, tmp_path / "m", without=("chat_template.jinja",))
    data = json.loads((folder / "genai_config.json").read_text())
    data["model"]["eos_token_id"] = [2, 7]
    (folder / "genai_config.json").write_text(json.dumps(data))
    tc = json.loads((folder / "tokenizer_config.json").read_text())
    tc["chat_template"] = (genai_dir / "chat_template.jinja").read_text()
    (folder / "tokenizer_config.json").write_text(json.dumps(tc))
    tok2 = TextTokenizer(folder)
    assert tok2.eos_ids == {2, 7}
    messages = CONVERSATIONS[1]
    assert tok2.apply_chat_template(messages) == hf_tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True)


def test_missing_tokenizer_and_template_are_typed_errors(genai_dir, tmp_path):
    folder = copy_folder(genai_dir, tmp_path / "bare", without=("tokenizer.json",))
    with pytest.raises(TokenizerFileError, match="tokenizer.json") as e:
        TextTokenizer(folder)
    assert isinstance(e.value, OnnxforgeError) and str(folder / "tokenizer.json") in str(e.value)
    folder = copy_folder(genai_dir, tmp_path / "plain", without=("chat_template.jinja",))
    with pytest.raises(TokenizerFileError, match="chat_template.jinja"):
        TextTokenizer(folder).apply_chat_template(CONVERSATIONS[0])
