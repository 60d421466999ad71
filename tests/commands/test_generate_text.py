"""``onnxforge generate MODEL --prompt TEXT`` / ``--chat`` through the command line's main."""
from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest

from onnxforge.cli import main


@pytest.fixture(scope="module")
def folder(decoder_models) -> Path:
    return Path(decoder_models["genai_fp32"]).parent


@pytest.fixture(scope="module")
def hf_tok(folder):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))


def _json(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_prompt_gives_the_ids_of_prompt_ids(folder, hf_tok, capsys):
    text = "import os"
    report = _json(capsys, ["generate", str(folder), "--prompt", text, "--new", "5", "--json"])
    ids = hf_tok.encode(text)
    assert report["prompt_ids"] == ids
    by_ids = _json(capsys, ["generate", str(folder / "model.onnx"), "--prompt-ids", ",".join(map(str, ids)),
                            "--new", "5", "--json", "-q"])
    assert report["tokens"] == by_ids["tokens"][:len(report["tokens"])]
    assert set(by_ids) <= set(report)  # keys added, none changed
    assert report["text"] == hf_tok.decode(report["tokens"], skip_special_tokens=True)


def test_text_streams_to_stdout_and_stats_to_stderr(folder, capsys):
    report = _json(capsys, ["generate", str(folder), "--prompt", "x = 1", "--new", "6", "--json"])
    assert main(["generate", str(folder), "--prompt", "x = 1", "--max-new", "6"]) == 0
    out, err = capsys.readouterr()
    assert out == report["text"] + "\n"
    assert f"prompt {report['prompt_tokens']} tok (prefilled {report['prompt_tokens']})" in err
    assert f"{len(report['tokens'])} tok at" in err and "tok/s" in err
    assert "first token" in err and "copied 0 B" in err and "allocated" in err and "cache" in err


def test_stop_string_is_never_printed(folder, capsys):
    argv = ["generate", str(folder), "--prompt", "print('hi')", "--new", "12", "--temperature", "1.0",
            "--seed", "7"]
    full = _json(capsys, [*argv, "--json"])["text"]
    stop = full[3:5]
    assert len(stop) == 2 and stop in full
    assert main([*argv, "--stop", stop, "--stop", "never-there"]) == 0
    out = capsys.readouterr().out
    assert out == full[:full.find(stop)] + "\n"


def test_the_same_seed_gives_the_same_text(folder, capsys):
    argv = ["generate", str(folder), "--prompt", "def main():", "--new", "8", "--temperature", "0.9",
            "--top-k", "40", "--top-p", "0.9", "--repetition-penalty", "1.1", "--seed", "3"]
    assert main(argv) == 0
    first = capsys.readouterr().out
    assert main(argv) == 0
    assert capsys.readouterr().out == first


def test_chat_on_a_pipe_keeps_the_conversation(folder, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("Hello world\n\ndef main():\n"))
    turns = _json(capsys, ["generate", str(folder), "--chat", "--new", "4", "--json"])["turns"]
    assert len(turns) == 2
    assert turns[1]["reused_tokens"] > turns[0]["prompt_tokens"] // 2
    assert turns[1]["prefilled_tokens"] == turns[1]["prompt_tokens"] - turns[1]["reused_tokens"]
    monkeypatch.setattr("sys.stdin", io.StringIO("Hello world\ndef main():\n"))
    assert main(["generate", str(folder), "--chat", "--new", "4"]) == 0
    out, err = capsys.readouterr()
    assert out == "".join(t["text"] + "\n" for t in turns) and err.count("tok/s") == 2


@pytest.mark.parametrize("argv, message", [
    (["--prompt", "hi", "--top-p", "0"], "top_p"),
    (["--prompt", "hi", "--temperature", "-1"], "temperature"),
    (["--prompt-ids", "1,2", "--new", "2", "--temperature", "0.5"], "--temperature"),
    (["--prompt-ids", "1,2"], "--new"),
    ([], "give a prompt"),
])
def test_usage_errors_are_one_line(folder, capsys, argv, message):
    assert main(["generate", str(folder / "model.onnx"), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_text_for_a_folder_without_a_tokenizer(folder, tmp_path, capsys):
    for f in ("model.onnx", "model.onnx.data", "genai_config.json"):
        shutil.copy2(folder / f, tmp_path / f)
    assert main(["generate", str(tmp_path), "--prompt", "hi", "--new", "2"]) == 2
    err = capsys.readouterr().err
    assert str(tmp_path / "tokenizer.json") in err and "Traceback" not in err
    assert main(["generate", "builtin:decoder", "--prompt", "hi"]) == 2
    assert "tokenizer" in capsys.readouterr().err
