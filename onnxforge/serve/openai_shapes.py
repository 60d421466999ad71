"""Request validation and response bodies of the OpenAI-compatible API.

:func:`parse_request` turns the JSON body of ``/v1/completions`` or
``/v1/chat/completions`` into :class:`Params` or raises :class:`ApiError`, whose
:meth:`~ApiError.body` is OpenAI's error shape
``{"error": {"message", "type", "param", "code"}}``. The other functions build the
response bodies: a whole completion, and the chunks of a streamed one.
"""
from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field
from typing import Any

from onnxforge.text.errors import SamplingError
from onnxforge.text.sampling import Sampling

__all__ = ["ApiError", "Params", "chunk", "completion", "parse_request", "usage"]

_UNSUPPORTED = ("tools", "functions", "tool_choice", "function_call", "suffix", "logit_bias")


class ApiError(Exception):
    """A request the server refuses: an HTTP ``status`` and OpenAI's error fields."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 type: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.type = type or ("invalid_request_error" if status < 500 else "server_error")

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass
class Params:
    """A validated request: ``prompt`` (text or token ids) or ``messages``, and the decoding options."""

    chat: bool
    prompt: str | list[int] | None = None
    messages: list[dict[str, Any]] = field(default_factory=list)
    max_tokens: int | None = None
    sampling: Sampling = field(default_factory=Sampling)
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False


def _bad(message: str, param: str | None) -> ApiError:
    return ApiError(400, message, param=param, code="invalid_value" if param else None)


def _number(body: dict[str, Any], name: str, default: float) -> float:
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise _bad(f"{name} must be a number, got {v!r}", name)
    return float(v)


def _int(body: dict[str, Any], name: str) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise _bad(f"{name} must be an integer, got {v!r}", name)
    return v


def _sampling(body: dict[str, Any]) -> Sampling:
    seed = _int(body, "seed")
    top_k = _int(body, "top_k")
    try:
        return Sampling(temperature=_number(body, "temperature", 1.0), top_k=top_k or 0,
                        top_p=_number(body, "top_p", 1.0),
                        repetition_penalty=_number(body, "repetition_penalty", 1.0),
                        seed=None if seed is None else seed % (1 << 63))
    except SamplingError as e:
        m = re.search(r"Sampling\.(\w+)", str(e))
        raise _bad(str(e).replace("Sampling.", ""), m.group(1) if m else None) from None


def _stop(body: dict[str, Any]) -> list[str]:
    v = body.get("stop")
    if v is None:
        return []
    stops = [v] if isinstance(v, str) else v
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops) or len(stops) > 4:
        raise _bad("stop must be a string or a list of at most 4 strings", "stop")
    return [s for s in stops if s]


def _content(m: dict[str, Any], i: int) -> str:
    c = m.get("content")
    if c is None:
        return ""
    if isinstance(c, str):
        return c
    if isinstance(c, list) and all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                                   for p in c):
        return "".join(p["text"] for p in c)
    raise _bad(f"messages[{i}].content must be a string or a list of text parts", f"messages[{i}].content")


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise _bad("messages must be a non-empty list", "messages")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise _bad(f"messages[{i}] must be an object with a string role", f"messages[{i}]")
        out.append({"role": m["role"], "content": _content(m, i)})
    return out


def _prompt(body: dict[str, Any]) -> str | list[int]:
    p = body.get("prompt")
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], str):
        p = p[0]
    if isinstance(p, str):
        return p
    if isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
        return list(p)
    raise _bad("prompt must be a string or a non-empty list of token ids (one prompt per request)", "prompt")


def parse_request(body: Any, *, chat: bool, model_name: str) -> Params:
    """Validate a request body; raises :class:`ApiError` (400, or 404 for another model)."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    model = body.get("model")
    if model is not None and model != model_name:
        raise ApiError(404, f"the model {model!r} does not exist: this server serves {model_name!r}",
                       param="model", code="model_not_found")
    n = body.get("n")
    if n is not None and n != 1:
        raise _bad("only n = 1 is supported", "n")
    best_of = body.get("best_of")
    if best_of is not None and best_of != 1:
        raise _bad("only best_of = 1 is supported", "best_of")
    if body.get("logprobs") or body.get("top_logprobs"):
        raise _bad("logprobs are not supported", "logprobs")
    if body.get("echo"):
        raise _bad("echo is not supported", "echo")
    for name in _UNSUPPORTED:
        if body.get(name):
            raise _bad(f"{name} is not supported", name)
    max_tokens = _int(body, "max_completion_tokens") if chat else None
    if max_tokens is None:
        max_tokens = _int(body, "max_tokens")
    if max_tokens is not None and max_tokens < 1:
        raise _bad(f"max_tokens must be at least 1, got {max_tokens}", "max_tokens")
    if not chat and max_tokens is None:
        max_tokens = 16  # OpenAI's default for completions; chat defaults to the rest of the context
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise _bad("stream must be a boolean", "stream")
    options = body.get("stream_options") or {}
    p = Params(chat=chat, max_tokens=max_tokens, sampling=_sampling(body), stop=_stop(body), stream=stream,
               include_usage=bool(isinstance(options, dict) and options.get("include_usage")))
    if chat:
        p.messages = _messages(body)
    else:
        p.prompt = _prompt(body)
    return p


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion(rid: str, model: str, chat: bool, text: str, finish: str, use: dict[str, int]) -> dict[str, Any]:
    """A whole completion (``text_completion``) or chat completion (``chat.completion``)."""
    choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish}
    if chat:
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    return {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
            "model": model, "choices": [choice], "usage": use}


def chunk(rid: str, model: str, chat: bool, text: str | None, finish: str | None, *, first: bool = False,
          use: dict[str, int] | None = None) -> dict[str, Any]:
    """One server-sent event of a streamed completion; ``use``: the closing usage-only chunk."""
    out: dict[str, Any] = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
                           "created": int(time.time()), "model": model}
    if use is not None:
        out["choices"], out["usage"] = [], use
        return out
    choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish}
    if chat:
        delta: dict[str, Any] = {}
        if first:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        choice["delta"] = delta
    else:
        choice["text"] = text or ""
    out["choices"] = [choice]
    return out
