"""``onnxforge serve``: the OpenAI client against a server subprocess, and the app in process.

Greedy texts are checked against :class:`onnxforge.Generator` (one sequence through
``make_state``, no engine, no server) and against the same request sent alone.
"""
from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

try:  # the HTTP client of openai and starlette's TestClient: httpx2, formerly httpx
    import httpx2 as httpx
except ImportError:
    httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

NAME = "tiny"


@pytest.fixture(scope="module")
def genai_dir(decoder_models) -> Path:
    return Path(decoder_models["genai_fp32"]).parent


@pytest.fixture(scope="module")
def oracle(genai_dir):
    from onnxforge.text import Generator

    with Generator(genai_dir, max_length=96) as g:
        yield g


@pytest.fixture(scope="module")
def base_url(genai_dir) -> Iterator[str]:
    proc = subprocess.Popen([sys.executable, "-m", "onnxforge", "serve", str(genai_dir), "--port", "0",
                             "--model-name", NAME, "--max-sequences", "8"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    try:
        try:
            first = lines.get(timeout=120)
        except queue.Empty:
            pytest.fail(f"the server printed nothing: {proc.stderr.read() if proc.poll() is not None else ''}")
        assert first.startswith(f"serving {NAME} on http://127.0.0.1:"), first
        yield first.split()[-1].rstrip("/") + "/v1"
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode in (0, 130), proc.stderr.read()


@pytest.fixture(scope="module")
def client(base_url):
    return openai.OpenAI(base_url=base_url, api_key="x", max_retries=0)


def _complete(client, prompt: str, n: int, **kw) -> tuple[str, str, object]:
    r = client.completions.create(model=NAME, prompt=prompt, max_tokens=n, temperature=0, **kw)
    return r.choices[0].text, r.choices[0].finish_reason, r.usage


def test_completion_is_the_greedy_text(client, oracle) -> None:
    text, finish, use = _complete(client, "Hello world", 12)
    assert text == oracle.generate("Hello world", max_new_tokens=12)
    assert finish == "length"
    prompt_tokens = len(oracle.tokenizer.encode("Hello world"))
    assert (use.prompt_tokens, use.completion_tokens, use.total_tokens) == (prompt_tokens, 12, prompt_tokens + 12)
    assert [m.id for m in client.models.list().data] == [NAME]


def test_stop_string_ends_the_text(client, oracle) -> None:
    full = oracle.generate("Hello world", max_new_tokens=12)
    stop = full[len(full) // 2:len(full) // 2 + 3]
    text, finish, _ = _complete(client, "Hello world", 12, stop=[stop])
    assert text == full[:full.index(stop)]
    assert finish == "stop"


def test_streamed_chat_completion(client, oracle) -> None:
    messages = [{"role": "user", "content": "Tell me a story"}]
    chunks = list(client.chat.completions.create(model=NAME, messages=messages, max_tokens=10, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length" and not any(finishes[:-1])
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].usage.completion_tokens == 10
    assert text == oracle.chat(messages, max_new_tokens=10)
    whole = client.chat.completions.create(model=NAME, messages=messages, max_tokens=10, temperature=0)
    assert whole.choices[0].message.content == text


def test_concurrent_clients_get_their_tokens_alone(client, oracle) -> None:
    prompts = [f"Request number {i} says" + " hello" * (i % 5) for i in range(16)]
    alone = [_complete(client, p, 10)[0] for p in prompts]
    with ThreadPoolExecutor(16) as pool:
        together = list(pool.map(lambda p: _complete(client, p, 10)[0], prompts))
    assert together == alone
    for p, t in list(zip(prompts, alone))[:4]:
        assert t == oracle.generate(p, max_new_tokens=10)


def test_metrics_parse(client, base_url) -> None:
    _complete(client, "Hello", 3)
    text = httpx.get(base_url.removesuffix("/v1") + "/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in ("onnxforge_requests", "onnxforge_tokens_generated", "onnxforge_time_to_first_token_seconds",
                 "onnxforge_tokens_per_second", "onnxforge_pool_bytes", "onnxforge_pages_shared"):
        assert name in families, name
    tokens = [s.value for s in families["onnxforge_tokens_generated"].samples if s.name.endswith("_total")]
    assert tokens and tokens[0] >= 3
    assert [s.value for s in families["onnxforge_pool_bytes"].samples][0] > 0


@pytest.mark.parametrize("body, status, param", [
    ({"model": "other", "prompt": "hi"}, 404, "model"),
    ({"model": NAME, "prompt": "hi " * 3000, "max_tokens": 4}, 400, "prompt"),
    ({"model": NAME, "prompt": "hi", "max_tokens": 4000}, 400, "max_tokens"),
    ({"model": NAME, "prompt": "hi", "temperature": -1}, 400, "temperature"),
    ({"model": NAME, "prompt": "hi", "top_p": 0}, 400, "top_p"),
    ({"model": NAME, "prompt": "hi", "n": 2}, 400, "n"),
    ({"model": NAME, "prompt": "hi", "logprobs": 2}, 400, "logprobs"),
    ({"model": NAME, "prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
    ({"model": NAME, "prompt": "hi", "stop": 3}, 400, "stop"),
])
def test_bad_completion_requests(base_url, body, status, param) -> None:
    r = httpx.post(base_url + "/completions", json=body)
    assert r.status_code == status
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["param"] == param


def test_bad_chat_requests_and_routes(base_url) -> None:
    msgs = [{"role": "user", "content": "hi"}]
    for body, param in (({"model": NAME, "messages": msgs, "tools": [{"type": "function"}]}, "tools"),
                        ({"model": NAME, "messages": []}, "messages"),
                        ({"model": NAME, "messages": msgs, "top_k": -1}, "top_k"),
                        ({"model": NAME, "messages": msgs, "repetition_penalty": 0}, "repetition_penalty")):
        r = httpx.post(base_url + "/chat/completions", json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    r = httpx.post(base_url + "/chat/completions", content=b"{not json")
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.get(base_url + "/nothing")
    assert r.status_code == 404 and "error" in r.json()
    with pytest.raises(openai.BadRequestError):
        openai.OpenAI(base_url=base_url, api_key="x", max_retries=0).chat.completions.create(
            model=NAME, messages=msgs, n=3)


@pytest.fixture(scope="module")
def engine(genai_dir):
    from onnxforge.engine import Engine

    with Engine(str(genai_dir / "model.onnx"), max_sequences=1, max_length=1024) as e:
        yield e


def test_disconnect_cancels_and_full_queue_is_429(genai_dir, engine) -> None:
    from starlette.testclient import TestClient

    from onnxforge.serve.app import create_app
    from onnxforge.text import TextTokenizer

    app = create_app(engine, TextTokenizer(genai_dir), model_name=NAME, max_inflight=1)
    try:
        steps_before = engine.stats["steps"]
        with TestClient(app) as tc:
            body = {"model": NAME, "prompt": "Hello world", "max_tokens": 1000, "temperature": 0, "stream": True}
            with tc.stream("POST", "/v1/completions", json=body) as r:
                assert r.status_code == 200
                lines = r.iter_lines()
                first = next(line for line in lines if line.startswith("data: "))
                assert json.loads(first[6:])["object"] == "text_completion"
                assert engine.stats["running"] == 1
                busy = tc.post("/v1/completions", json={"model": NAME, "prompt": "hi", "max_tokens": 2})
                assert busy.status_code == 429 and busy.json()["error"]["code"] == "rate_limit_exceeded"
            deadline = time.monotonic() + 30
            while engine.stats["running"] and time.monotonic() < deadline:
                time.sleep(0.01)
            stats = engine.stats
            assert (stats["running"], stats["waiting"], app.state.server.loop.inflight) == (0, 0, 0)
            assert stats["ttft_ms"] == {}  # the request was released: the engine keeps no record of it
            assert stats["steps"] - steps_before < 1000  # it stopped early: cancelled, not finished
            health = tc.get("/health").json()
            assert health["status"] == "ok" and health["running"] == 0
            metrics = tc.get("/metrics").text
            assert 'onnxforge_requests_total{endpoint="/v1/completions",outcome="cancelled"} 1.0' in metrics
            ok = tc.post("/v1/completions", json={"model": NAME, "prompt": "hi", "max_tokens": 2,
                                                  "temperature": 0})
            assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2
    finally:
        app.state.server.loop.close()


def test_end_of_sequence_finishes_with_stop(genai_dir, engine) -> None:
    from starlette.testclient import TestClient

    from onnxforge.serve.app import create_app
    from onnxforge.text import TextTokenizer

    tok = TextTokenizer(genai_dir)
    rid = engine.add(tok.encode("Hello world"), 16, eos_token_id=())
    engine.run()
    greedy = engine.result(rid)
    k = next(i for i, t in enumerate(greedy) if i and t not in greedy[:i])
    tok.eos_ids = frozenset({greedy[k]})  # a later greedy token of the model stands for its end of sequence
    app = create_app(engine, tok, model_name=NAME)
    try:
        with TestClient(app) as tc:
            r = tc.post("/v1/completions", json={"prompt": "Hello world", "max_tokens": 16, "temperature": 0}).json()
            assert r["choices"][0]["finish_reason"] == "stop"
            assert r["choices"][0]["text"] == tok.decode(greedy[:k])
            assert r["usage"]["completion_tokens"] == k + 1
            bad = tc.post("/v1/completions", json={"prompt": [10 ** 6], "max_tokens": 2})
            assert bad.status_code == 400 and bad.json()["error"]["param"] == "prompt"
            assert tc.post("/v1/completions", json=[1, 2]).status_code == 400
            app.state.server.loop.close()
            closed = tc.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 2})
            assert closed.status_code == 503 and closed.json()["error"]["code"] == "shutting_down"
    finally:
        app.state.server.loop.close()


def test_serve_errors_are_one_line(tmp_path, capsys) -> None:
    from onnxforge.cli import main

    assert main(["serve", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "Traceback" not in err and "tokenizer.json" in err
