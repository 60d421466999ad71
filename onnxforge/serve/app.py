"""The Starlette application of ``onnxforge serve``: :func:`create_app`.

Endpoints: ``POST /v1/completions``, ``POST /v1/chat/completions`` (whole, or streamed
as server-sent events ending with ``data: [DONE]``), ``GET /v1/models``, ``GET /health``
(the engine's stats) and ``GET /metrics`` (Prometheus text format). Each request is
one engine request; its tokens arrive on an asyncio queue fed by the engine's thread
(:class:`~onnxforge.serve.loop.EngineLoop`) and become text through a
:class:`~onnxforge.text.stream.TextStream`, which applies the stop strings (a stop
string seen cancels the engine request). A client that disconnects has its request
cancelled, its pages freed.
"""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from onnxforge.engine.engine import Engine
from onnxforge.engine.errors import EngineCapacityError, EngineError
from onnxforge.serve.loop import EngineLoop, QueueFullError, ShuttingDownError
from onnxforge.serve.openai_shapes import ApiError, Params, chunk, completion, parse_request, usage
from onnxforge.text.errors import TextError
from onnxforge.text.stream import TextStream
from onnxforge.text.tokenizer import TextTokenizer

__all__ = ["create_app"]


class _Metrics:
    """The Prometheus metrics of one app, in its own registry."""

    def __init__(self, loop: EngineLoop) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter("onnxforge_requests", "Requests served, by endpoint and outcome",
                                ["endpoint", "outcome"], registry=r)
        self.tokens = Counter("onnxforge_tokens_generated", "Tokens generated", registry=r)
        self.ttft = Histogram("onnxforge_time_to_first_token_seconds", "Time from a request to its first token",
                              buckets=(.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30), registry=r)
        rate = Gauge("onnxforge_tokens_per_second", "Tokens generated per second over the last 10 s", registry=r)
        rate.set_function(loop.tokens_per_second)
        for key, text in (("pool_bytes", "Bytes of the KV page pool"), ("used_bytes", "Bytes of pages in use"),
                          ("pages_shared", "Pages shared between sequences"),
                          ("running", "Sequences running"), ("waiting", "Requests waiting for admission")):
            Gauge(f"onnxforge_{key}", text, registry=r).set_function(self._stat(loop, key))

    @staticmethod
    def _stat(loop: EngineLoop, key: str) -> Callable[[], float]:
        return lambda: float(loop.engine.stats[key])


class _Server:
    def __init__(self, engine: Engine, tokenizer: TextTokenizer, model_name: str, max_inflight: int | None) -> None:
        self.engine, self.tokenizer, self.model_name = engine, tokenizer, model_name
        self.loop = EngineLoop(engine, max_inflight=max_inflight)
        self.metrics = _Metrics(self.loop)
        self.created = int(time.time())
        self.eos = tokenizer.eos_ids  # genai_config.json's, else the tokenizer's eos_token

    # -- requests -------------------------------------------------------------------
    def _prompt_ids(self, p: Params) -> list[int]:
        try:
            if p.chat:
                return self.tokenizer.encode_chat(p.messages)
            return list(p.prompt) if isinstance(p.prompt, list) else self.tokenizer.encode(p.prompt or "")
        except TextError as e:
            raise ApiError(400, str(e), param="messages" if p.chat else "prompt") from None

    def start(self, p: Params, endpoint: str) -> _Generation:
        ids = self._prompt_ids(p)
        room = self.engine.max_length - len(ids)
        if room < 1 or (p.max_tokens is not None and p.max_tokens > room):
            raise ApiError(400, f"this model's context is {self.engine.max_length} tokens; the prompt has {len(ids)} "
                           f"and max_tokens asks {p.max_tokens if p.max_tokens is not None else 'at least 1'} more",
                           param="max_tokens" if room >= 1 else ("messages" if p.chat else "prompt"),
                           code="context_length_exceeded")
        return _Generation(self, p, ids, p.max_tokens or room, endpoint)


class _Generation:
    """One request on the engine: its token queue, text stream and outcome."""

    def __init__(self, server: _Server, p: Params, ids: list[int], max_new: int, endpoint: str) -> None:
        self.server, self.p, self.endpoint = server, p, endpoint
        self.prompt_tokens, self.completion_tokens = len(ids), 0
        self.id = f"{'chatcmpl' if p.chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        self.finish: str | None = None
        self._closed = False
        self.stream = TextStream(server.tokenizer, p.stop)
        self.queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self._loop = asyncio.get_running_loop()
        self.t0 = time.perf_counter()
        try:
            self.rid = server.loop.submit(ids, max_new, self._put, eos_token_id=server.eos, sampling=p.sampling)
        except ShuttingDownError as e:
            raise ApiError(503, str(e), type="server_error", code="shutting_down") from None
        except QueueFullError as e:
            raise ApiError(429, f"{e}: retry later", type="rate_limit_error", code="rate_limit_exceeded") from None
        except EngineCapacityError as e:
            raise ApiError(400, str(e), code="context_length_exceeded") from None
        except EngineError as e:  # e.g. an empty prompt, token ids outside the vocabulary
            raise ApiError(400, str(e), param="messages" if p.chat else "prompt", code="invalid_value") from None

    def _put(self, event: tuple[str, Any]) -> None:
        """The sink the engine's thread calls: onto this request's queue, in the event loop's thread."""
        try:
            self._loop.call_soon_threadsafe(self.queue.put_nowait, event)
        except RuntimeError:  # the event loop is closed: nobody waits for the event
            pass

    async def pieces(self) -> AsyncIterator[str]:
        """The text as it becomes safe to show; sets ``finish``; cancels the request if left early."""
        outcome = "cancelled"
        try:
            while True:
                kind, value = await self.queue.get()
                if kind == "token":
                    if self.completion_tokens == 0:
                        self.server.metrics.ttft.observe(time.perf_counter() - self.t0)
                    self.completion_tokens += 1
                    self.server.metrics.tokens.inc()
                    if value in self.server.eos:
                        self.finish = "stop"
                        continue
                    piece = self.stream.push(value)
                    if piece:
                        yield piece
                    if self.stream.stopped:
                        self.finish = "stop"
                        break
                elif kind == "done":
                    piece = self.stream.finish()
                    if piece:
                        yield piece
                    self.finish = self.finish or "length"
                    break
                else:
                    outcome = "error"
                    raise ApiError(500, f"generation failed: {value}", code="generation_failed")
            outcome = self.finish
        finally:
            self.close(outcome or "cancelled")

    def close(self, outcome: str) -> None:
        """End the request (its pages are freed if it still runs) and count its outcome, once."""
        if self._closed:
            return
        self._closed = True
        self.server.loop.cancel(self.rid)
        self.server.metrics.requests.labels(self.endpoint, outcome).inc()

    def usage(self) -> dict[str, int]:
        return usage(self.prompt_tokens, self.completion_tokens)


def _error(e: ApiError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status)


async def _body(request: Request) -> Any:
    raw = await request.body()
    try:
        return json.loads(raw)
    except ValueError as e:
        raise ApiError(400, f"the request body is not valid JSON: {e}") from None


def _sse(data: Any) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


async def _events(g: _Generation, name: str, chat: bool) -> AsyncIterator[str]:
    first = True
    try:
        if chat:
            yield _sse(chunk(g.id, name, chat, "", None, first=True))
            first = False
        async for piece in g.pieces():
            yield _sse(chunk(g.id, name, chat, piece, None, first=first))
            first = False
        yield _sse(chunk(g.id, name, chat, None, g.finish))
        if g.p.include_usage:
            yield _sse(chunk(g.id, name, chat, None, None, use=g.usage()))
    except ApiError as e:
        yield _sse(e.body())
    yield "data: [DONE]\n\n"


class _Stream(StreamingResponse):
    """A streamed generation whose engine request is cancelled however the response ends,
    even when the client leaves before the body starts."""

    def __init__(self, g: _Generation, name: str, chat: bool) -> None:
        super().__init__(_events(g, name, chat), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self._generation = g

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._generation.close("cancelled")  # a no-op when the stream ended


def create_app(engine: Engine, tokenizer: TextTokenizer, *, model_name: str,
               max_inflight: int | None = None) -> Starlette:
    """The server's app on ``engine`` (it starts the engine's thread); ``max_inflight``:
    requests running or waiting beyond which a new one gets 429 (default ``5 * max_sequences``).
    ``app.state.server.loop.close()`` stops the thread."""
    server = _Server(engine, tokenizer, model_name, max_inflight)

    def endpoint(chat: bool) -> Any:
        async def handle(request: Request) -> Response:
            path = request.url.path
            try:
                p = parse_request(await _body(request), chat=chat, model_name=model_name)
                g = server.start(p, path)
            except ApiError as e:
                server.metrics.requests.labels(path, f"http_{e.status}").inc()
                return _error(e)
            if p.stream:
                return _Stream(g, model_name, chat)
            try:
                text = "".join([piece async for piece in g.pieces()])
            except ApiError as e:
                return _error(e)
            return JSONResponse(completion(g.id, model_name, chat, text, g.finish or "length", g.usage()))
        return handle

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": model_name, "object": "model", "created": server.created, "owned_by": "onnxforge"}]})

    async def health(request: Request) -> Response:
        stats = {k: v for k, v in engine.stats.items() if k != "ttft_ms"}
        return JSONResponse({"status": "ok", "model": model_name, "inflight": server.loop.inflight, **stats})

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(server.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def http_error(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        detail = exc.detail if isinstance(exc, HTTPException) else "internal error"
        return _error(ApiError(status, f"{request.method} {request.url.path}: {detail}"))

    app = Starlette(routes=[
        Route("/v1/completions", endpoint(False), methods=["POST"]),
        Route("/v1/chat/completions", endpoint(True), methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ], exception_handlers={HTTPException: http_error})
    app.state.server = server
    return app

