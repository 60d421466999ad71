"""``Engine``: many sequences decoded at once from one compiled model and one page pool.

The model is compiled once in its ragged batched form (``make_stateful(...,
cache="paged", ragged=True)``): one run carries the new tokens of every running
sequence, so the projections and the MLP are one product over all the step's rows
while each sequence attends over its own pages. Requests are served continuously::

    with of.Engine("model.onnx", max_sequences=8) as engine:
        a = engine.add(prompt_ids, max_new_tokens=64)
        b = engine.add(other_ids, max_new_tokens=16, sampling=of.Sampling(temperature=0.7, seed=1))
        tokens = engine.run()            # {a: [...], b: [...]}

Each ``step`` first admits waiting requests while their prompt's pages plus one fit the
pool (after the pages their prompt shares with the registry), then plans the step:
one row for every decoding sequence, then prompt chunks of the prefilling ones, at most
``max_step_tokens`` rows in all. When the step's new pages do not fit, registered pages
nobody holds are dropped first, then the most recently admitted sequence is preempted
(its pages freed, its tokens kept; it resumes from the front of the queue and
recomputes its prefix). A batched run that fails commits nothing and is re-run once per
sequence: the sequences that fail alone end with their error, the others go on.

``add``, ``cancel``, ``release``, ``fork``, ``result`` and ``stats`` may be called from other threads
while one thread steps; they wait for the step in progress. Two threads stepping one
engine get :class:`EngineBusyError`.
"""
from __future__ import annotations

import itertools
import os
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from onnxforge.engine.errors import (EngineBusyError, EngineCapacityError, EngineClosedError, EngineError,
                                     RequestCancelledError, RequestError, RequestPendingError,
                                     UnknownRequestError)
from onnxforge.engine.pool import PagePool, chain_key
from onnxforge.graphbuilder.ir.core import Model
from onnxforge.kernels_cy.paged.pages import PagedKVCache, page_nbytes
from onnxforge.kernels_cy.paged.ragged import PageBatch
from onnxforge.kernels_cy.runtime.session import InferenceSession
from onnxforge.kernels_cy.runtime.state import _paged_layout
from onnxforge.passes.stateful.ragged import POSITION_IDS, SEQUENCE_STARTS
from onnxforge.text.sampling import Sampler, Sampling

__all__ = ["Engine"]

_WAITING, _RUNNING, _DONE, _FAILED, _CANCELLED = "waiting", "running", "done", "failed", "cancelled"


@dataclass(eq=False)
class _Request:
    rid: int
    prompt: list[int]
    max_new: int
    eos: frozenset[int]
    sampler: Sampler
    generated: list[int] = field(default_factory=list)
    caches: list[PagedKVCache] | None = None
    computed: int = 0  # tokens whose keys and values the caches hold
    keys: list[bytes] = field(default_factory=list)  # chain keys of the full pages of tokens
    status: str = _WAITING
    error: BaseException | None = None
    admitted: int = -1
    t_add: float = 0.0
    t_first: float | None = None

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.generated

    @property
    def pending(self) -> int:
        return len(self.prompt) + len(self.generated) - self.computed


def _config(model: Any, given: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """``given``, else the genai_config.json beside a model path, else {}."""
    if given is not None:
        return given
    if isinstance(model, (str, os.PathLike)):
        from onnxforge.passes.stateful.convert import read_genai_config

        return read_genai_config(model) or {}
    return {}


def _eos_of(config: Mapping[str, Any]) -> frozenset[int]:
    e = (config.get("model") or {}).get("eos_token_id")
    if isinstance(e, int):
        return frozenset({e})
    if isinstance(e, list) and all(isinstance(x, int) for x in e):
        return frozenset(e)
    return frozenset()


def _ragged_model(model: Any, max_length: int | None, page_size: int, formats: Any,
                  config: Mapping[str, Any]) -> tuple[Model, int]:
    """The ragged batched form of ``model`` (loaded once) and the max length it was made for."""
    from onnxforge.passes.stateful.convert import StatefulError

    try:
        return _convert(model, max_length, page_size, formats, config)
    except StatefulError as e:
        raise EngineError(f"the model has no batched form: {e}") from e


def _convert(model: Any, max_length: int | None, page_size: int, formats: Any,
             config: Mapping[str, Any]) -> tuple[Model, int]:
    from onnxforge.graphbuilder import serde
    from onnxforge.passes.stateful.convert import make_stateful
    from onnxforge.passes.stateful.paged import parse_page_formats, to_paged
    from onnxforge.passes.stateful.ragged import to_ragged
    from onnxforge.text.generator import context_of

    m = model if isinstance(model, Model) else serde.load(model, verify=True)
    ops = {(n.domain, n.op_type) for n in m.graph}
    if ("ai.onnxforge", "RaggedPagedCacheUpdate") in ops:
        return m, max_length or 0
    if ("ai.onnxforge", "PagedCacheUpdate") in ops:
        return to_ragged(m), max_length or 0
    if m.graph.bindings:  # an in-place stateful model: its caches' capacity is its max length
        return to_ragged(to_paged(m, page_size, parse_page_formats(formats))), max_length or 0
    if max_length is None:
        known = context_of(m, config)
        if known is None:
            raise EngineError("the model states no context length (no genai_config.json context_length, no "
                              "rotary cache): pass max_length=")
        max_length = known[0]
    return make_stateful(m, max_length, cache="paged", page_size=page_size, formats=formats, ragged=True,
                         genai_config=config or None), max_length


def _positive(name: str, v: Any, allow_none: bool = False) -> None:
    if v is None and allow_none:
        return
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise EngineError(f"{name} must be a positive int{' or None' if allow_none else ''}, got {v!r}")


class Engine:
    """Continuous batching over one compiled model and one page pool; see the module docstring.

    ``model``: a past/present decoder (path, ModelProto, bytes or IR) of a family
    ``make_stateful`` converts, or a stateful / paged / ragged model. ``max_length``
    (default: genai_config's ``context_length``, else the rotary cache's rows) bounds
    prompt plus new tokens of each request; ``page_size`` and ``formats`` (newest page
    first, as ``make_stateful``'s) shape every sequence's pages; ``pool_bytes`` (default:
    ``max_sequences`` full contexts) bounds all pages together; ``max_step_tokens``
    bounds the rows of one step; ``genai_config`` stands for the ``genai_config.json``
    beside a model path (context length, EOS, head size) when the model is given loaded."""

    def __init__(self, model: Any, *, max_sequences: int = 8, max_length: int | None = None,
                 page_size: int = 16, formats: str | Sequence[str] = "float32", pool_bytes: int | None = None,
                 max_step_tokens: int = 256, threads: int | None = None,
                 genai_config: Mapping[str, Any] | None = None):
        _positive("max_sequences", max_sequences)
        _positive("max_length", max_length, allow_none=True)
        _positive("page_size", page_size)
        _positive("max_step_tokens", max_step_tokens)
        _positive("pool_bytes", pool_bytes, allow_none=True)
        config = _config(model, genai_config)
        m, max_length = _ragged_model(model, max_length, page_size, formats, config)
        self._session = InferenceSession(m, threads=threads)
        g = self._session.model.graph
        self._cache_names = [v.name for v in g.inputs if v.name not in ("input_ids", POSITION_IDS, SEQUENCE_STARTS)]
        layouts = [_paged_layout(self._session.model, n) for n in self._cache_names]
        if not layouts or any(lay is None for lay in layouts):
            raise EngineError(f"inputs {self._cache_names} are not all paged caches of known geometry")
        h, d, p, num_pages, policy = layouts[0]
        if any(lay != layouts[0] for lay in layouts):
            raise EngineError("the layers' paged caches differ in geometry or formats")
        self._geometry = (h, d, p, num_pages)
        self.formats: tuple[str, ...] = policy
        self.page_size = p
        self.max_length = min(max_length or num_pages * p, num_pages * p)
        self.max_sequences = max_sequences
        self.max_step_tokens = max_step_tokens
        logits = next((o for o in g.outputs if o.name == "logits"), None)
        vt = getattr(logits, "type", None)
        self.vocab_size = vt.shape[-1] if vt is not None and vt.shape and isinstance(vt.shape[-1], int) else None
        layers = len(self._cache_names)
        page = page_nbytes(policy[0], h, p, d)
        if pool_bytes is None:
            pool_bytes = max_sequences * layers * (-(-self.max_length // p) + 1) * page
        self._pool = PagePool(pool_bytes, layers, page, layers * page)
        self._eos = _eos_of(config)
        self._policy_key = ",".join(policy)
        self._requests: dict[int, _Request] = {}
        self._waiting: deque[_Request] = deque()
        self._running: list[_Request] = []
        self._ids = itertools.count()
        self._admissions = itertools.count()
        self._lock = threading.RLock()
        self._stepping = threading.Lock()
        self._closed = False
        self.steps = 0
        self.preemptions = 0
        self.last_step: dict[str, int] = {}

    # -- requests -------------------------------------------------------------------
    def add(self, prompt_ids: Iterable[int], max_new_tokens: int, *, eos_token_id: int | Iterable[int] | None = None,
            sampling: Sampling | None = None) -> int:
        """Queue a request; returns its id. ``eos_token_id``: the token(s) that end it (default:
        genai_config's; ``()`` for none). Raises :class:`EngineCapacityError` when prompt plus
        ``max_new_tokens`` exceeds ``max_length`` or could never fit the pool."""
        prompt = self._prompt(prompt_ids)
        _positive("max_new_tokens", max_new_tokens)
        if sampling is not None and not isinstance(sampling, Sampling):
            raise EngineError(f"sampling must be an onnxforge.Sampling, got {type(sampling).__name__}")
        total = len(prompt) + max_new_tokens
        if total > self.max_length:
            raise EngineCapacityError(f"prompt ({len(prompt)} tokens) + max_new_tokens ({max_new_tokens}) = "
                                      f"{total} exceeds max_length {self.max_length}")
        need = self._pool.cost(self._pool.pages_for(total, self.page_size)) + self._pool.staging_bytes
        if need > self._pool.capacity:
            raise EngineCapacityError(f"a request of {total} tokens needs up to {need} bytes of pages; the pool "
                                      f"holds {self._pool.capacity} (pool_bytes)")
        eos = self._eos if eos_token_id is None else (
            frozenset({eos_token_id}) if isinstance(eos_token_id, int) else frozenset(eos_token_id))
        with self._lock:
            self._check_open()
            r = _Request(next(self._ids), prompt, max_new_tokens, eos, Sampler(sampling), t_add=time.perf_counter())
            self._requests[r.rid] = r
            self._waiting.append(r)
        return r.rid

    def _prompt(self, prompt_ids: Iterable[int]) -> list[int]:
        try:
            arr = np.asarray(list(prompt_ids) if not isinstance(prompt_ids, np.ndarray) else prompt_ids)
        except TypeError:
            raise EngineError("prompt_ids must be a sequence of token ids (ints)") from None
        if arr.size == 0:
            raise EngineError("prompt_ids is empty: a request needs at least one token")
        if arr.dtype.kind not in "iu":
            raise EngineError(f"prompt_ids must be integers, got {arr.dtype}")
        ids = [int(t) for t in arr.reshape(-1)]
        v = self.vocab_size
        out = [t for t in ids if t < 0 or (v is not None and t >= v)]
        if out:
            raise EngineError(f"token ids {out[:5]} are outside the vocabulary [0, {v})")
        return ids

    def cancel(self, rid: int) -> None:
        """End request ``rid`` now and free its pages (its tokens so far are dropped)."""
        with self._lock:
            r = self._get(rid)
            if r.status in (_DONE, _FAILED, _CANCELLED):
                return
            if r.status == _WAITING:
                self._waiting.remove(r)
            else:
                self._running.remove(r)
            self._free(r)
            r.status, r.error = _CANCELLED, RequestCancelledError(f"request {rid} was cancelled")

    def release(self, rid: int) -> None:
        """Forget request ``rid``, cancelling it first if it has not finished: its tokens and
        times go, and ``result`` then raises :class:`UnknownRequestError`. A long-running
        server releases every request it has answered, so the engine's records stay bounded."""
        with self._lock:
            self.cancel(rid)
            del self._requests[rid]

    def result(self, rid: int) -> list[int]:
        """The generated tokens of a finished request; raises its error if it failed."""
        with self._lock:
            r = self._get(rid)
            if r.status == _DONE:
                return list(r.generated)
            if r.error is not None:
                raise r.error
            raise RequestPendingError(f"request {rid} is {r.status}: step or run the engine first")

    def fork(self, rid: int, n: int) -> list[int]:
        """``n`` continuations of running request ``rid`` sharing all its pages (its partial last
        page is copied); child ``i`` samples with the seed ``(seed, i)``. Returns their ids."""
        _positive("n", n)
        with self._lock:
            self._check_open()
            r = self._get(rid)
            if r.status != _RUNNING or r.pending != 1 or not r.generated:
                raise EngineError(f"request {rid} is {r.status}"
                                  f"{' and still prefilling' if r.status == _RUNNING else ''}: only a running "
                                  f"sequence that has produced a token can be forked")
            out = []
            for i in range(n):
                child = _Request(next(self._ids), list(r.prompt), r.max_new, r.eos,
                                 Sampler(r.sampler.sampling, stream=i), generated=list(r.generated),
                                 t_add=time.perf_counter(), t_first=time.perf_counter())
                self._requests[child.rid] = child
                if not self._adopt_all(child, r):
                    self._waiting.appendleft(child)
                out.append(child.rid)
            return out

    # -- running --------------------------------------------------------------------
    def step(self) -> dict[int, int]:
        """One batched run over the new tokens of every running sequence; returns
        ``{request id: token}`` for each sequence that produced a token."""
        if not self._stepping.acquire(blocking=False):
            raise EngineBusyError("another thread is stepping this engine")
        try:
            with self._lock:
                self._check_open()
                self._admit()
                plan = self._plan()
                if not plan:
                    if self._waiting and not self._running:
                        r = self._waiting[0]
                        raise EngineError(f"request {r.rid} cannot be admitted: the pool's "
                                          f"{self._pool.free} free bytes hold no room for it")
                    return {}
                logits = self._forward(plan)
                self.steps += 1
                self.last_step = {"sequences": len(plan), "rows": sum(n for _, n in plan),
                                  "prefill_rows": sum(n for r, n in plan if n > 1 or r.pending > n)}
                return self._advance(plan, logits)
        finally:
            self._stepping.release()

    def run(self) -> dict[int, list[int]]:
        """Step until no request is waiting or running; returns the tokens of every request
        that finished during the call (failed ones raise from :meth:`result`)."""
        finished: dict[int, list[int]] = {}
        while True:
            with self._lock:
                self._check_open()
                if not self._waiting and not self._running:
                    break
                before = {rid for rid, r in self._requests.items() if r.status in (_WAITING, _RUNNING)}
            self.step()
            with self._lock:
                for rid in before:
                    r = self._requests.get(rid)
                    if r is not None and r.status == _DONE:
                        finished[rid] = list(r.generated)
        return finished

    @property
    def stats(self) -> dict[str, Any]:
        """``pool_bytes``, ``used_bytes``, ``pages_in_use`` (held by running sequences),
        ``pages_shared`` (held by two or more), ``pages_cached`` (registered, held by none),
        ``prefix_hits``,
        ``running``, ``waiting``, ``steps``, ``preemptions`` and ``ttft_ms`` ({request id: ms} of those with a token)."""
        with self._lock:
            own = {r.rid: sum(c.held_pages(shared=False) for c in r.caches)
                   for r in self._running if r.caches is not None}
            return {
                "pool_bytes": self._pool.capacity,
                "used_bytes": self._pool.used,
                "pages_in_use": self._pool.pages_in_use(own),
                "pages_shared": self._pool.pages_shared,
                "pages_cached": self._pool.pages_cached,
                "prefix_hits": self._pool.prefix_hits,
                "running": len(self._running),
                "waiting": len(self._waiting),
                "steps": self.steps,
                "preemptions": self.preemptions,
                "ttft_ms": {r.rid: (r.t_first - r.t_add) * 1e3 for r in self._requests.values()
                            if r.t_first is not None},
            }

    def close(self) -> None:
        """Free every page; the engine refuses further use."""
        with self._lock:
            for r in list(self._running) + list(self._waiting):
                self._free(r)
                r.status, r.error = _CANCELLED, EngineClosedError("the engine was closed")
            self._running.clear()
            self._waiting.clear()
            self._pool.registry.clear()
            self._closed = True

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise EngineClosedError("the engine is closed")

    def _get(self, rid: int) -> _Request:
        r = self._requests.get(rid) if isinstance(rid, int) else None
        if r is None:
            raise UnknownRequestError(f"no request has id {rid!r}")
        return r

    def _new_caches(self) -> list[PagedKVCache]:
        h, d, p, num_pages = self._geometry
        return [PagedKVCache(h, d, p, num_pages, self.formats) for _ in self._cache_names]

    def _format_at(self, age: int) -> str:
        return self.formats[min(age, len(self.formats) - 1)]

    def _chain(self, r: _Request, pages: int) -> list[bytes]:
        """Chain keys of the first ``pages`` full pages of ``r``'s tokens."""
        toks, p = r.tokens, self.page_size
        while len(r.keys) < pages:
            i = len(r.keys)
            r.keys.append(chain_key(r.keys[-1] if r.keys else b"", toks[i * p:(i + 1) * p], self._policy_key))
        return r.keys[:pages]

    def _hits(self, r: _Request) -> list:
        """Registered pages ``r`` can adopt: consecutive from page 0, all below its last token
        (which it computes itself for its logits), each in the format its age asks."""
        p = self.page_size
        usable = (len(r.tokens) - 1) // p
        keys = self._chain(r, usable)
        hits = []
        for i, key in enumerate(keys):
            e = self._pool.lookup(key, self._format_at(len(keys) - 1 - i))
            if e is None:
                break
            hits.append(e)
        # formats were asked for ages relative to the last usable page; only a full run of hits
        # keeps those ages right, so a partial run is retried for its own length
        while hits and len(hits) < len(keys):
            k = len(hits)
            again = [self._pool.lookup(keys[i], self._format_at(k - 1 - i)) for i in range(k)]
            if all(e is not None for e in again):
                return again
            hits = hits[:-1]
        return hits

    def _admit(self) -> None:
        pool, p = self._pool, self.page_size
        while self._waiting and len(self._running) < self.max_sequences:
            r = self._waiting[0]
            hits = self._hits(r)
            need = pool.cost(pool.pages_for(len(r.tokens), p) + 1 - len(hits)) + pool.staging_bytes
            if pool.free < need:
                pool.evict(need)
            if pool.free < need:
                return
            self._waiting.popleft()
            r.caches = self._new_caches()
            for i, e in enumerate(hits):
                for c, (fmt, payload) in zip(r.caches, e.pages):
                    c.adopt_page(i, fmt, payload)
                e.holders.add(r.rid)
                e.hits += 1
            pool.prefix_hits += len(hits)
            r.computed = len(hits) * p
            for c in r.caches:
                c.set_length(r.computed)
            r.status, r.admitted = _RUNNING, next(self._admissions)
            self._running.append(r)
            pool.recount(r.rid, r.caches)

    def _adopt_all(self, child: _Request, parent: _Request) -> bool:
        """Seat ``child`` beside ``parent`` on its pages now, if a slot and a page fit."""
        pool, p = self._pool, self.page_size
        need = pool.cost(1) + pool.staging_bytes
        if len(self._running) >= self.max_sequences or (pool.free < need and (pool.evict(need) or True)
                                                         and pool.free < need):
            return False
        full, part = divmod(parent.computed, p)
        keys = self._chain(parent, full)
        child.keys = list(keys)
        child.caches = self._new_caches()
        for i in range(full):
            fmt = parent.caches[0].page_format(i)
            e = pool.lookup(keys[i], fmt)
            if e is None:  # registered after every step; a page aged since is registered then too
                e = pool.register(keys[i], fmt, parent.rid, [c.share_page(i) for c in parent.caches])
            for c, (f, payload) in zip(child.caches, e.pages):
                c.adopt_page(i, f, payload)
            e.holders.add(child.rid)
        if part:
            for c, src in zip(child.caches, parent.caches):
                fmt = src.page_format(full)
                c.set_page(full, fmt, np.array(src.page_payload(full)))  # the partial page is copied
        for c in child.caches:
            c.set_length(parent.computed)
        child.computed = parent.computed
        child.status, child.admitted = _RUNNING, next(self._admissions)
        self._running.append(child)
        pool.recount(child.rid, child.caches)
        return True

    def _plan(self) -> list[tuple[_Request, int]]:
        budget = self.max_step_tokens
        plan: list[tuple[_Request, int]] = []
        for r in self._running:  # decoding sequences first: one row each
            if r.pending == 1 and budget:
                plan.append((r, 1))
                budget -= 1
        for r in self._running:  # then prompt chunks
            if r.pending > 1 and budget:
                n = min(r.pending, budget)
                plan.append((r, n))
                budget -= n
        return self._fit(plan)

    def _fit(self, plan: list[tuple[_Request, int]]) -> list[tuple[_Request, int]]:
        """The plan whose new pages fit the pool, preempting the most recently admitted
        sequences (never an out-of-memory error, never a truncation)."""
        pool, p = self._pool, self.page_size
        while True:
            need = sum(pool.cost(pool.pages_for(r.computed + n, p) - pool.pages_for(r.computed, p))
                       for r, n in plan)
            if pool.free >= need:
                return plan
            pool.evict(need)
            if pool.free >= need:
                return plan
            victim = max(self._running, key=lambda r: r.admitted)
            self._preempt(victim)
            plan = [(r, n) for r, n in plan if r is not victim]
            if not plan:
                return plan

    def _preempt(self, r: _Request) -> None:
        self.preemptions += 1
        self._running.remove(r)
        self._free(r)
        r.computed, r.status = 0, _WAITING
        self._waiting.appendleft(r)

    def _free(self, r: _Request) -> None:
        r.caches = None
        self._pool.drop(r.rid)

    def _feeds(self, plan: list[tuple[_Request, int]]) -> dict[str, Any]:
        ids: list[int] = []
        pos: list[int] = []
        starts = [0]
        for r, n in plan:
            toks = r.tokens
            ids.extend(toks[r.computed:r.computed + n])
            pos.extend(range(r.computed, r.computed + n))
            starts.append(starts[-1] + n)
        feeds: dict[str, Any] = {
            "input_ids": np.asarray([ids], dtype=np.int64),
            POSITION_IDS: np.asarray([pos], dtype=np.int64),
            SEQUENCE_STARTS: np.asarray(starts, dtype=np.int64),
        }
        for layer, name in enumerate(self._cache_names):
            feeds[name] = PageBatch([r.caches[layer] for r, _ in plan])
        return feeds

    def _forward(self, plan: list[tuple[_Request, int]]) -> dict[int, np.ndarray | None]:
        """Each planned sequence's last-row logits (None for a sequence that failed alone)."""
        try:
            (out,) = self._session.run(["logits"], self._feeds(plan))
            return {r.rid: out[0, k] for k, (r, _) in enumerate(plan)}
        except Exception:  # nothing of the batched run committed: each sequence alone
            rows: dict[int, np.ndarray | None] = {}
            for r, n in plan:
                try:
                    (out,) = self._session.run(["logits"], self._feeds([(r, n)]))
                    rows[r.rid] = out[0, 0]
                except Exception as e:  # noqa: BLE001 - the request ends with it
                    rows[r.rid] = None
                    err = RequestError(f"request {r.rid} failed: {e}")
                    err.__cause__ = e
                    self._running.remove(r)
                    self._free(r)
                    r.status, r.error = _FAILED, err
            return rows

    def _advance(self, plan: list[tuple[_Request, int]], logits: Mapping[int, np.ndarray | None]) -> dict[int, int]:
        produced: dict[int, int] = {}
        now = time.perf_counter()
        for r, n in plan:
            if logits.get(r.rid) is None:
                continue
            r.computed += n
            self._share_full_pages(r, n)
            if r.pending:
                self._pool.recount(r.rid, r.caches)
                continue
            tok = r.sampler.pick(logits[r.rid], r.tokens if r.sampler.sampling.repetition_penalty != 1.0 else ())
            r.generated.append(tok)
            produced[r.rid] = tok
            if r.t_first is None:
                r.t_first = now
            if tok in r.eos or len(r.generated) >= r.max_new or len(r.tokens) >= self.max_length:
                self._running.remove(r)
                self._free(r)
                r.status = _DONE
            else:
                self._pool.recount(r.rid, r.caches)
        return produced

    def _share_full_pages(self, r: _Request, n: int) -> None:
        """Register ``r``'s pages that became full (or changed format) this step, or adopt the
        registered copy of one it computed again."""
        p = self.page_size
        full = r.computed // p
        if full == 0:
            return
        first_new = (r.computed - n) // p
        converted = set(r.caches[0].last.converted_pages) if r.caches[0].last else set()
        candidates = sorted(set(range(first_new, full)) | {i for i in converted if i < full})
        keys = self._chain(r, full)
        for i in candidates:
            fmt = r.caches[0].page_format(i)
            if fmt is None or r.caches[0].is_shared(i):
                continue
            e = self._pool.lookup(keys[i], fmt)
            if e is None:
                self._pool.register(keys[i], fmt, r.rid, [c.share_page(i) for c in r.caches])
            elif all(f == c.page_format(i) for c, (f, _) in zip(r.caches, e.pages)):
                for c, (f, payload) in zip(r.caches, e.pages):
                    c.adopt_page(i, f, payload)  # its own copy is dropped
                e.holders.add(r.rid)
