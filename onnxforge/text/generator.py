"""Text in, text out on one persistent state: :class:`Generator`.

    >>> import onnxforge as of
    >>> g = of.Generator("qwen3-genai/")                       # a folder with tokenizer.json
    >>> g.generate("Once upon a time", max_new_tokens=16)
    >>> for piece in g.stream("Hello", sampling=of.Sampling(temperature=0.7, seed=1)): ...
    >>> g.chat([{"role": "user", "content": "Hi"}])

The decoder runs through :func:`~onnxforge.kernels_cy.runtime.state.make_state` (a
past/present export is made stateful first, with a paged cache of the context's length).
The state keeps what it was fed: each call keeps the longest common token prefix with the
new prompt (the state is rewound to it) and prefills only the rest, so a chat that grows
turn by turn prefills each turn's new tokens only.
"""
from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from onnxforge.graphbuilder.ir.core import Model
from onnxforge.kernels_cy.errors import FeedError, StateError
from onnxforge.text.sampling import Sampler, Sampling
from onnxforge.text.stream import TextStream
from onnxforge.text.tokenizer import TextTokenizer

__all__ = ["Generator", "context_of", "model_file", "step_feeds"]

KNOWN_INPUTS = ("input_ids", "position", "attention_mask", "position_ids")


def model_file(model: str | os.PathLike[str]) -> Path:
    """The decoder file of ``model``: the file itself, or in a folder the ``decoder.filename``
    of its genai_config.json, else its ``model.onnx``."""
    path = Path(model)
    if not path.is_dir():
        return path
    from onnxforge.passes.stateful.convert import read_genai_config

    config = read_genai_config(path / "genai_config.json") or {}
    name = ((config.get("model") or {}).get("decoder") or {}).get("filename") or "model.onnx"
    return path / str(name)


def context_of(model: Model, config: Mapping[str, Any] | None) -> tuple[int, str] | None:
    """The most positions the model can attend to, and where that number comes from:
    genai_config.json's ``model.context_length``, else the rows of the rotary cache
    (``cos_cache``'s first dimension); None when neither says."""
    length = ((config or {}).get("model") or {}).get("context_length")
    if isinstance(length, int) and not isinstance(length, bool) and length > 0:
        return length, "model.context_length of genai_config.json"
    for g in model.all_graphs():
        for v in g.all_initializers():
            dims = getattr(v.const, "dims", None)
            if v.name.rsplit("/", 1)[-1].endswith("cos_cache") and dims and isinstance(dims[0], int):
                return int(dims[0]), f"the rows of the rotary cache {v.name!r}"
    return None


def step_feeds(free: Sequence[str], ids: Sequence[int], done: int) -> dict[str, np.ndarray]:
    """The per-call inputs for feeding ``ids`` after ``done`` cached tokens: ``input_ids``
    always, ``position`` (a scalar), ``attention_mask`` (ones of the total length) and
    ``position_ids`` where the model has them."""
    feeds: dict[str, np.ndarray] = {"input_ids": np.array([list(ids)], np.int64)}
    if "position" in free:
        feeds["position"] = np.array(done, np.int64)
    if "attention_mask" in free:
        feeds["attention_mask"] = np.ones((1, done + len(ids)), np.int64)
    if "position_ids" in free:
        feeds["position_ids"] = np.arange(done, done + len(ids), dtype=np.int64)[None, :]
    return feeds


def check_decoder(model: Model, state: Any) -> list[str]:
    """The per-call inputs of ``state`` (a :class:`StateError` when they or the outputs are
    not those of a decoder this module feeds)."""
    free = [v.name for v in model.graph.inputs if v.name not in {b.input for b in state.bindings}]
    unknown = [n for n in free if n not in KNOWN_INPUTS]
    if "input_ids" not in free or unknown:
        raise StateError(f"generate feeds input_ids, position, attention_mask and position_ids; "
                         f"the model's per-call inputs are {free}")
    outputs = [v.name for v in model.graph.outputs]
    if "logits" not in outputs:
        raise StateError(f"generate reads the next token from an output named 'logits' "
                         f"[batch, sequence, vocabulary]; the model's outputs are {outputs}")
    return free


def last_logits(out: Mapping[str, Any]) -> np.ndarray:
    logits = np.asarray(out["logits"])
    if logits.ndim != 3 or logits.shape[1] < 1 or logits.shape[2] < 1:
        raise StateError(f"the model's 'logits' came back with shape {list(logits.shape)}; generate "
                         f"needs [batch, sequence, vocabulary]")
    return logits[0, -1]


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class Generator:
    """A decoder and its tokenizer, with one persistent state; see the module docstring.

    ``max_length``: the most tokens the state holds (prompt and generated; default: the
    model's context); ``threads``: the backend's threads; ``page_size`` and ``formats``:
    the paged cache of a past/present export made stateful here."""

    def __init__(self, model_dir: str | os.PathLike[str], *, max_length: int | None = None,
                 threads: int | None = None, page_size: int = 16, formats: str = "float32") -> None:
        from onnxforge.graphbuilder import serde

        path = model_file(model_dir)
        self._open(serde.load(path, verify=True), path, max_length=max_length, threads=threads,
                   cache={"cache": "paged", "page_size": page_size, "formats": formats})

    @classmethod
    def from_model(cls, model: Model, path: str | os.PathLike[str], *, max_length: int | None = None,
                   threads: int | None = None, cache: Mapping[str, Any] | None = None) -> Generator:
        """A generator on ``model`` already loaded from ``path`` (its folder holds the tokenizer);
        ``cache``: ``make_stateful`` keywords (default: contiguous caches)."""
        self = cls.__new__(cls)
        self._open(model, Path(path), max_length=max_length, threads=threads, cache=dict(cache or {}))
        return self

    def _open(self, model: Model, path: Path, *, max_length: int | None, threads: int | None,
              cache: dict[str, Any]) -> None:
        from onnxforge.kernels_cy.runtime.state import make_state
        from onnxforge.passes.stateful.convert import make_stateful, read_genai_config

        self.tokenizer = TextTokenizer(path.parent)
        config = read_genai_config(path)
        context = context_of(model, config)
        if max_length is not None and (isinstance(max_length, bool) or not isinstance(max_length, int)
                                       or max_length < 1):
            raise FeedError(f"max_length must be a positive int, got {max_length!r}")
        limit = max_length or (context[0] if context else None)
        if not model.graph.bindings:
            if limit is None:
                raise FeedError("the model does not say its context (no genai_config.json context_length, "
                                "no rotary cache): give max_length")
            model = make_stateful(model, max_length=limit, batch=1, genai_config=config, **cache)
        self._model = model
        self._state = make_state(model, threads=threads, dims={"batch_size": 1, "batch": 1})
        self._free = check_decoder(model, self._state)
        caps = [b.shape[-2] for b in self._state.bindings
                if b.read_write and b.shape and len(b.shape) >= 2 and isinstance(b.shape[-2], int)]
        self.max_length: int = min([c for c in (limit, *caps) if c is not None] or [0])
        if self.max_length < 1:
            raise FeedError("the state's capacity is unknown: give max_length")
        self._held: list[int] = []  # the tokens the state's caches hold, in order
        self.last_report: dict[str, Any] = {}

    # ---------------------------------------------------------------- public API

    def generate(self, text: str, *, max_new_tokens: int | None = None, stop: Sequence[str] | None = None,
                 sampling: Sampling | None = None) -> str:
        """The text generated after ``text`` (until EOS, a stop string, ``max_new_tokens`` or the context)."""
        return "".join(self.stream(text, max_new_tokens=max_new_tokens, stop=stop, sampling=sampling))

    def stream(self, text: str, *, max_new_tokens: int | None = None, stop: Sequence[str] | None = None,
               sampling: Sampling | None = None) -> Iterator[str]:
        """Like :meth:`generate`, yielding the text piece by piece as tokens arrive."""
        return self.stream_ids(self.tokenizer.encode(text), max_new_tokens=max_new_tokens, stop=stop,
                               sampling=sampling)

    def chat(self, messages: Sequence[Mapping[str, Any]], *, max_new_tokens: int | None = None,
             stop: Sequence[str] | None = None, sampling: Sampling | None = None) -> str:
        """The assistant's reply to ``messages`` (rendered with the model's chat template)."""
        return "".join(self.stream_ids(self.tokenizer.encode_chat(messages), max_new_tokens=max_new_tokens,
                                       stop=stop, sampling=sampling))

    def close(self) -> None:
        self._state.close()
        self._held = []

    def __enter__(self) -> Generator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- decoding

    def stream_ids(self, ids: Sequence[int], *, max_new_tokens: int | None = None,
                   stop: Sequence[str] | None = None, sampling: Sampling | None = None) -> Iterator[str]:
        """Decode after the prompt token ids ``ids``, yielding text pieces; the report of the
        call is :attr:`last_report` (filled as it runs; complete when the iterator ends)."""
        ids = [int(t) for t in ids]
        if not ids:
            raise FeedError("the prompt is empty")
        if len(ids) > self.max_length:
            raise FeedError(f"the prompt has {len(ids)} tokens, more than the {self.max_length} the state "
                            f"holds (the model's context or max_length); shorten the prompt")
        budget = self.max_length - len(ids) + 1  # the last token generated is never fed
        if max_new_tokens is not None:
            if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
                raise FeedError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
            budget = min(budget, max_new_tokens)
        return self._decode(ids, budget, list(stop or ()), Sampler(sampling))

    def _decode(self, ids: list[int], budget: int, stop: list[str], sampler: Sampler) -> Iterator[str]:
        keep = min(_common(self._held, ids), len(ids) - 1)  # feed at least one token for logits
        if keep < len(self._held):
            self._state.rewind(keep)
            del self._held[keep:]
        stream = TextStream(self.tokenizer, stop)
        report: dict[str, Any] = {"prompt_ids": ids, "prompt_tokens": len(ids), "reused_tokens": keep,
                                  "prefilled_tokens": len(ids) - keep, "tokens": [], "step_ms": [],
                                  "cache_bytes": [], "allocated_bytes": [], "copied_bytes": [],
                                  "cache_addresses": [], "finish_reason": "length", "text": ""}
        self.last_report = report
        feed, seen = ids[keep:], list(ids)
        start = time.perf_counter()
        for step in range(budget):
            t0 = time.perf_counter()
            out = self._state.run(step_feeds(self._free, feed, len(self._held)))
            self._held.extend(feed)
            token = sampler.pick(last_logits(out), seen)
            ms = (time.perf_counter() - t0) * 1e3
            c = self._state.last_run
            report["tokens"].append(token)
            report["step_ms"].append(round(ms, 4))
            report["cache_bytes"].append(c.cache_bytes)
            report["allocated_bytes"].append(c.allocated_bytes)
            report["copied_bytes"].append(c.copied_bytes)
            report["cache_addresses"].append(self._state.addresses())
            if step == 0:
                report["time_to_first_token_ms"] = round(ms, 4)
            if token in self.tokenizer.eos_ids:
                report["finish_reason"] = "stop"
                break
            seen.append(token)
            piece = stream.push(token)
            report["text"] = stream.text
            if piece:
                yield piece
            if stream.stopped:
                report["finish_reason"] = "stop"
                break
            feed = [token]
        tail = stream.finish()
        report["text"] = stream.text
        total = time.perf_counter() - start
        n = len(report["tokens"])
        report["new_tokens"] = n
        report["tokens_per_s"] = round(n / total, 3) if total > 0 else 0.0
        if tail:
            yield tail
