"""``onnxforge generate ... --sequences K`` and ``--prompts-file F``: many requests on the engine."""
from __future__ import annotations

import json

import numpy as np

from onnxforge.cli import main
from onnxforge.kernels_cy.runtime.state import make_state
from onnxforge.passes.stateful.convert import make_stateful


def _alone(path, prompt, n):
    st = make_state(make_stateful(path, 64, cache="paged"))
    toks, out = list(prompt), []
    r = st.run({"input_ids": np.array([toks], np.int64), "attention_mask": np.ones((1, len(toks)), np.int64)})
    for k in range(n):
        t = int(r["logits"][0, -1].argmax())
        out.append(t)
        toks.append(t)
        if k + 1 < n:
            r = st.run({"input_ids": np.array([[t]], np.int64), "attention_mask": np.ones((1, len(toks)), np.int64)})
    return out


def test_sequences_decodes_copies_of_the_prompt_together(decoder_models, capsys):
    path = decoder_models["torch23"]
    assert main(["generate", str(path), "--prompt-ids", "5,17,42,7", "--new", "5", "--sequences", "3"]) == 0
    out = capsys.readouterr().out.splitlines()
    want = " ".join(str(t) for t in _alone(path, [5, 17, 42, 7], 5))
    assert out[:3] == [f"request {k}: {want}" for k in range(3)]
    assert "3 requests, 15 tokens" in out[3] and "tokens/s" in out[3]
    assert out[4].startswith("pool ")


def test_prompts_file_gives_each_line_its_request_and_json_reports_the_engine(decoder_models, tmp_path, capsys):
    path = decoder_models["genai_fp32"]
    f = tmp_path / "prompts.txt"
    f.write_text("1,2,3\n\n4, 5, 6, 7, 8\n9\n")
    assert main(["generate", str(path), "--prompts-file", str(f), "--new", "4", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [r["prompt_tokens"] for r in report["requests"]] == [3, 5, 1]
    for r, prompt in zip(report["requests"], ([1, 2, 3], [4, 5, 6, 7, 8], [9])):
        alone = _alone(path, prompt, 4)
        assert r["tokens"][:len(alone)] == alone[:len(r["tokens"])]  # EOS may end one early
        assert r["ttft_ms"] > 0
    assert {"tokens_per_second", "ttft_ms_mean", "pool_bytes", "pages_shared", "prefix_hits"} <= set(report)


def test_batched_usage_errors_exit_2_without_a_traceback(decoder_models, tmp_path, capsys):
    path = str(decoder_models["torch23"])
    assert main(["generate", path, "--prompt-ids", "1,2", "--new", "3", "--sequences", "2", "--cache",
                 "contiguous"]) == 2
    assert "contiguous has no batched form" in capsys.readouterr().err
    f = tmp_path / "p.txt"
    f.write_text("1,x\n")
    assert main(["generate", path, "--prompts-file", str(f), "--new", "3"]) == 2
    err = capsys.readouterr().err
    assert "p.txt:1" in err and "Traceback" not in err
    assert main(["generate", path, "--prompt-ids", "1,2", "--sequences", "2"]) == 2
    assert "--new N is required" in capsys.readouterr().err
