"""The engine's thread: it steps the engine while requests exist and hands each produced
token to the request's sink (the server's sinks put it on an asyncio queue through
``loop.call_soon_threadsafe``).

A sink receives, in order, ``("token", id)`` for every token, then one
``("done", None)`` or ``("error", exception)``. :meth:`EngineLoop.cancel` stops a
request at once (the engine frees its pages) and its sink receives nothing more.
"""
from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from onnxforge.engine.engine import Engine
from onnxforge.engine.errors import EngineError, RequestPendingError, UnknownRequestError
from onnxforge.text.sampling import Sampling

__all__ = ["EngineLoop", "QueueFullError", "ShuttingDownError", "Sink"]

Sink = Callable[[tuple[str, Any]], object]


class QueueFullError(EngineError):
    """More requests are in flight than the server accepts (HTTP 429)."""


class ShuttingDownError(EngineError):
    """The loop is closed: no new request is taken (HTTP 503)."""


class EngineLoop:
    """One thread stepping ``engine``; at most ``max_inflight`` requests (running or waiting)."""

    def __init__(self, engine: Engine, *, max_inflight: int | None = None) -> None:
        self.engine = engine
        self.max_inflight = max_inflight if max_inflight is not None else 5 * engine.max_sequences
        self._mu = threading.Lock()
        self._wake = threading.Condition(self._mu)
        self._sinks: dict[int, Sink] = {}
        self._closed = False
        self._recent: collections.deque[tuple[float, int]] = collections.deque()  # (time, tokens) per step
        self._thread = threading.Thread(target=self._run, name="onnxforge-engine", daemon=True)
        self._thread.start()

    @property
    def inflight(self) -> int:
        with self._mu:
            return len(self._sinks)

    def submit(self, prompt_ids: list[int], max_new_tokens: int, sink: Sink, *,
               eos_token_id: Iterable[int] | None = None, sampling: Sampling | None = None) -> int:
        """Queue a request whose events go to ``sink``; returns its engine id. Raises
        :class:`QueueFullError`, or the engine's errors (e.g. ``EngineCapacityError``)."""
        with self._mu:
            if self._closed:
                raise ShuttingDownError("the server is shutting down")
            if len(self._sinks) >= self.max_inflight:
                raise QueueFullError(f"{len(self._sinks)} requests are in flight, the most this server accepts")
            rid = self.engine.add(prompt_ids, max_new_tokens, eos_token_id=eos_token_id, sampling=sampling)
            self._sinks[rid] = sink
            self._wake.notify()
        return rid

    def cancel(self, rid: int) -> None:
        """Stop request ``rid`` (its pages are freed at once) and release it; a finished one is already released."""
        with self._mu:
            if self._sinks.pop(rid, None) is None:
                return
            try:
                self.engine.release(rid)
            except UnknownRequestError:
                pass

    def tokens_per_second(self, window: float = 10.0) -> float:
        """Tokens produced per second over the last ``window`` seconds."""
        now = time.monotonic()
        with self._mu:
            while self._recent and self._recent[0][0] < now - window:
                self._recent.popleft()
            return sum(n for _, n in self._recent) / window

    def close(self, timeout: float | None = None) -> None:
        """Stop the thread after the step in progress; requests still in flight get an error."""
        with self._mu:
            self._closed = True
            for rid, sink in self._sinks.items():
                sink(("error", EngineError("the server shut down")))
                try:
                    self.engine.cancel(rid)
                except UnknownRequestError:
                    pass
            self._sinks.clear()
            self._wake.notify()
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._mu:
                while not self._sinks and not self._closed:
                    self._wake.wait()
                if self._closed:
                    return
            try:
                produced = self.engine.step()
            except Exception as e:  # a step that fails ends every request in flight with its error
                self._fail_all(e)
                continue
            self._dispatch(produced)

    def _dispatch(self, produced: dict[int, int]) -> None:
        with self._mu:
            if produced:
                self._recent.append((time.monotonic(), len(produced)))
            for rid, tok in produced.items():
                sink = self._sinks.get(rid)
                if sink is not None:
                    sink(("token", tok))
            for rid in list(self._sinks):
                try:
                    self.engine.result(rid)
                except RequestPendingError:
                    continue
                except EngineError as e:
                    self._sinks.pop(rid)(("error", e))
                else:
                    self._sinks.pop(rid)(("done", None))
                self.engine.release(rid)  # answered: the engine keeps no record of it

    def _fail_all(self, error: BaseException) -> None:
        with self._mu:
            for rid, sink in self._sinks.items():
                sink(("error", error))
                try:
                    self.engine.release(rid)
                except UnknownRequestError:
                    pass
            self._sinks.clear()
