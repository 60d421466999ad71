"""``PagedKVCache``: the keys and values of one attention layer (batch 1) in pages, each
page in its own quantization format.

A page holds ``page_size`` tokens, logically float32 ``[2, kv_heads, page_size,
head_dim]`` (keys then values); physically a flat uint8 payload whose layout is
fixed per format (float32, float16, int8, int4, fp8, int2, codebook; see
:data:`PAGE_FORMATS` and :func:`page_nbytes`). The format policy lists formats
from the newest page to older ones, the last repeating::

    cache = PagedKVCache(4, 64, page_size=16, num_pages=256, formats="float32,int8,int4")
    cache.update(k, v, position=0)        # k, v float32 [1, 4, n, 64]: tokens [0, n)
    cache.page_formats()                  # ['int4', ..., 'int8', 'float32', None, ...]
    y = cache.attend(q)                   # q float32 [1, 8, S, 64], causal over [0, length)

Rules (each visible in the counters :attr:`last`, :attr:`allocated_bytes`,
:attr:`copied_bytes`): new tokens are quantized directly into their page;
updating an existing page allocates nothing and moves no payload; a missing page
allocates exactly its format's page bytes; a page whose age crosses into the next
format is re-encoded into a new payload of that format (the old one is freed);
growing the page table never touches a payload. Every argument is checked before
the first change, so a typed error (:class:`PagedCacheError`) leaves the cache
as it was. Attention decodes one page of one KV head at a time into a workspace of
fixed size (:attr:`workspace_bytes`, independent of the context length).

Updates are transactions. :meth:`PagedKVCache.stage` writes a step's tokens
without touching a published page: the page that already holds tokens below the
new ones is staged in the cache's staging page (allocated once with the cache; the
published page is copied there and the new tokens encoded on top, re-encoding the
page where its format requires it, as int2 keys do), pages the step starts are new
payloads, and :meth:`PagedKVCache.attend` given the :class:`PageStage` reads the
published pages as they are plus the staged ones. :meth:`PageStage.commit` swaps
the staging page in for its page (the replaced payload becomes the next staging
page: no allocation, no copy), installs the new pages, converts the pages that age
(KR2) and publishes the length, all at once; :meth:`PageStage.discard` drops
everything, leaving every held payload and the length bitwise as they were.
:meth:`PagedKVCache.update` is a stage committed at once::

    stage = cache.stage(k, v, position=cache.length)    # nothing published changes
    y = cache.attend(q, stage=stage)                    # sees the staged tokens
    stage.commit()                                      # or stage.discard()
"""
from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

import onnxforge.kernels_cy.paged._paged as _paged
from onnxforge.kernels_cy.errors import (PageCapacityError, PagedCacheError, PageFormatError,
                                         PageIdError, PageShapeError)
from onnxforge.proto_ext.codecs import kvpages

__all__ = ["PAGE_FORMATS", "PageCounters", "PageStage", "PagedCacheError", "PagedKVCache", "page_nbytes",
           "parse_formats"]

# The format catalogue (names, codes, page sizes, geometry, policies) is
# proto_ext.codecs.kvpages; the compiled kernels number formats by FORMAT_CODES.
PAGE_FORMATS: tuple[str, ...] = kvpages.FORMATS
_CODE = kvpages.FORMAT_CODES
F32 = np.dtype(np.float32)


def _check_shape(kv_heads: int, page_size: int, head_dim: int) -> None:
    try:
        kvpages.check_geometry(kv_heads, page_size, head_dim)
    except kvpages.PageFormatError as e:
        raise PageShapeError(str(e)) from None


def _code(fmt: Any) -> int:
    try:
        return kvpages.format_code(fmt)
    except kvpages.PageFormatError as e:
        raise PageFormatError(str(e)) from None


def page_nbytes(fmt: str, kv_heads: int, page_size: int, head_dim: int) -> int:
    """Payload bytes of one page ``[2, kv_heads, page_size, head_dim]`` in format ``fmt``."""
    _check_shape(kv_heads, page_size, head_dim)
    _code(fmt)
    return int(kvpages.page_nbytes(fmt, kv_heads, page_size, head_dim))


def parse_formats(formats: str | Sequence[str]) -> tuple[str, ...]:
    """A format policy from ``"float32,int8,int4"`` or a sequence of names (newest first)."""
    try:
        return kvpages.parse_policy(formats)
    except kvpages.PageFormatError as e:
        raise PageFormatError(str(e)) from None


def _position(position: Any) -> int:
    """An int from an int, a numpy integer or a one-element integer array."""
    if isinstance(position, np.ndarray) and position.size == 1 and position.dtype.kind in "iu":
        return int(position.reshape(-1)[0])
    try:
        return operator.index(position)
    except TypeError:
        raise PageShapeError(f"position must be an integer scalar, got {position!r}") from None


@dataclass(frozen=True, slots=True)
class PageCounters:
    """Bytes of one update or conversion: page payloads allocated and freed, bytes copied
    (contiguity fixes of the operands), bytes of the published page copied into the
    staging page (``staged_bytes``: the transaction's own cost, at most one page)."""

    allocated_bytes: int = 0
    copied_bytes: int = 0
    freed_bytes: int = 0
    converted_pages: tuple[int, ...] = ()
    staged_bytes: int = 0


class PageStage:
    """One step's tokens written beside a :class:`PagedKVCache`, not yet published.

    ``pages`` maps a page id to the ``(format, payload)`` that replaces it at commit;
    ``length`` is the length the commit publishes; ``addr`` / ``fmt`` are the page
    table attention reads during the step (published pages, staged ones substituted).
    ``allocated_bytes`` counts the new payloads the stage made (the staging page is the
    cache's own and costs nothing). Commit or discard it exactly once."""

    __slots__ = ("cache", "position", "length", "pages", "staging", "addr", "fmt", "allocated_bytes",
                 "copied_bytes", "staged_bytes", "done")

    def __init__(self, cache: PagedKVCache, position: int, length: int):
        self.cache = cache
        self.position = position
        self.length = length
        self.pages: dict[int, tuple[str, np.ndarray]] = {}
        self.staging: int | None = None  # the page id staged in the cache's staging page
        self.addr = cache._addr
        self.fmt = cache._fmt
        self.allocated_bytes = 0
        self.copied_bytes = 0
        self.staged_bytes = 0
        self.done = False

    def commit(self) -> PageCounters:
        """Publish the step: the staged pages replace theirs, aging pages convert, the
        length publishes. Returns the counters of the whole update (the stage's own
        allocations included)."""
        if self.done:
            raise PagedCacheError("this stage was already committed or discarded")
        self.done = True
        return self.cache._commit(self)

    def discard(self) -> None:
        """Drop the step: nothing published changes (idempotent)."""
        if not self.done:
            self.done = True
            self.cache._stage = None


class PagedKVCache:
    """Paged keys and values of one attention layer, one sequence; see the module docstring."""

    def __init__(self, kv_heads: int, head_dim: int, page_size: int, num_pages: int,
                 formats: str | Sequence[str] = ("float32",)):
        _check_shape(kv_heads, page_size, head_dim)
        if not isinstance(num_pages, (int, np.integer)) or isinstance(num_pages, bool) or num_pages < 0:
            raise PageCapacityError(f"num_pages must be an int >= 0, got {num_pages!r}")
        self.kv_heads, self.head_dim, self.page_size = int(kv_heads), int(head_dim), int(page_size)
        self.formats = parse_formats(formats)
        n = int(num_pages)
        self._pages: list[tuple[str, np.ndarray] | None] = [None] * n
        self._addr = np.zeros(n, dtype=np.int64)   # payload address per page (0: missing)
        self._fmt = np.full(n, -1, dtype=np.int32)
        self._length = 0
        h, p, d = self.kv_heads, self.page_size, self.head_dim
        self._page_ws = np.zeros((2, h, p, d), dtype=F32)     # conversions
        self._scratch = np.zeros(p * d, dtype=F32)            # int2 key channels
        self._attn_ws = np.zeros((1, _paged.workspace_floats(p, d)), dtype=F32)  # grown per Hq
        # the staging page: receives a step's tokens for the page already holding tokens
        # below them (newest format); swapped with that page when the step commits
        self._staging = self._new_page(self.formats[0])
        self._stage: PageStage | None = None  # the step in flight, if any
        self._shared: set[int] = set()  # ids of payloads other caches may hold too (never written)
        self._held_bytes = 0  # payload bytes held, and of those the shared ones (kept by _store)
        self._shared_held = 0
        self.allocated_bytes = 0
        self.copied_bytes = 0
        self.last = PageCounters()

    # -- introspection ----------------------------------------------------------------
    @property
    def length(self) -> int:
        """Published valid tokens."""
        return self._length

    @property
    def num_pages(self) -> int:
        return len(self._pages)

    @property
    def capacity(self) -> int:
        return len(self._pages) * self.page_size

    @property
    def nbytes(self) -> int:
        """Bytes of the page payloads actually held."""
        return self._held_bytes

    def held_pages(self, shared: bool | None = None) -> int:
        """Pages held (``shared=True``: only those other caches may hold too; False: only the
        cache's own)."""
        if shared is None:
            return sum(1 for e in self._pages if e is not None)
        sh = self._shared
        return sum(1 for e in self._pages if e is not None and (id(e[1]) in sh) == shared)

    @property
    def shared_bytes(self) -> int:
        """Bytes of the held payloads other caches may hold too (adopted or shared pages)."""
        return self._shared_held

    @property
    def workspace_bytes(self) -> int:
        """Bytes of the attention workspace (one page of one head per thread, plus scores)."""
        return int(self._attn_ws.nbytes)

    @property
    def staging_address(self) -> int:
        """Data address of the staging page (it swaps with the page it replaces on commit)."""
        return int(self._staging.ctypes.data)

    @property
    def staging_bytes(self) -> int:
        """Bytes of the staging page (one page in the newest format, held with the cache)."""
        return int(self._staging.nbytes)

    def policy_format(self, age: int) -> str:
        """The policy's format of a page ``age`` pages older than the newest."""
        return self.formats[min(age, len(self.formats) - 1)]

    def _page(self, page_id: Any) -> int:
        try:
            i = operator.index(page_id)
        except TypeError:
            raise PageIdError(f"page id must be an int, got {type(page_id).__name__}") from None
        if not 0 <= i < len(self._pages):
            raise PageIdError(f"page id {i} outside the page table [0, {len(self._pages)})")
        return i

    def page_format(self, page_id: int) -> str | None:
        e = self._pages[self._page(page_id)]
        return None if e is None else e[0]

    def page_formats(self) -> list[str | None]:
        return [None if e is None else e[0] for e in self._pages]

    def page_payload(self, page_id: int) -> np.ndarray:
        """A read-only view of the page's payload (uint8)."""
        i = self._page(page_id)
        e = self._pages[i]
        if e is None:
            raise PageIdError(f"page {i} is missing")
        view = e[1].view()
        view.flags.writeable = False
        return view

    def buffer_addresses(self) -> dict[int, int]:
        """``{page_id: payload address}`` of every held page."""
        return {i: int(e[1].__array_interface__["data"][0]) for i, e in enumerate(self._pages) if e is not None}

    def __repr__(self) -> str:
        return (f"PagedKVCache(kv_heads={self.kv_heads}, head_dim={self.head_dim}, page_size={self.page_size}, "
                f"num_pages={self.num_pages}, formats={','.join(self.formats)}, length={self._length})")

    def _idle(self, what: str) -> None:
        if self._stage is not None:
            raise PagedCacheError(f"{what}: an update of this cache is in flight (commit or discard it first)")

    # -- page storage -----------------------------------------------------------------
    def _nbytes(self, fmt: str) -> int:
        return int(_paged.page_bytes(_CODE[fmt], self.kv_heads, self.page_size, self.head_dim))

    def _store(self, i: int, fmt: str, payload: np.ndarray) -> None:
        old = self._pages[i]
        if old is not None:
            self._held_bytes -= old[1].nbytes
            if old[1] is not payload and id(old[1]) in self._shared:
                self._shared.discard(id(old[1]))
                self._shared_held -= old[1].nbytes
        self._held_bytes += payload.nbytes
        self._pages[i] = (fmt, payload)
        self._addr[i] = payload.ctypes.data
        self._fmt[i] = _CODE[fmt]

    def _new_page(self, fmt: str) -> np.ndarray:
        payload = np.empty(self._nbytes(fmt), dtype=np.uint8)
        _paged.init_page(_CODE[fmt], payload, self.kv_heads, self.page_size, self.head_dim)
        return payload

    def _valid_rows(self, i: int) -> int:
        return max(0, min(self.page_size, self._length - i * self.page_size))

    def _reencode(self, i: int, fmt: str, k: np.ndarray | None = None, v: np.ndarray | None = None,
                  j0: int = 0, n: int = 0, t0: int = 0) -> tuple[int, int]:
        """Page ``i`` re-encoded as ``fmt`` (with tokens ``j0 .. j0+n`` of k/v at row ``t0``):
        returns (allocated, freed) bytes."""
        old_fmt, old = self._pages[i]  # type: ignore[misc]
        ws = self._page_ws
        h, p, d = self.kv_heads, self.page_size, self.head_dim
        _paged.decode_page(_CODE[old_fmt], old, ws)
        ws[:, :, self._valid_rows(i):, :] = 0.0
        if n:
            ws[0, :, t0:t0 + n] = k[:, j0:j0 + n]  # type: ignore[index]
            ws[1, :, t0:t0 + n] = v[:, j0:j0 + n]  # type: ignore[index]
        new = np.empty(self._nbytes(fmt), dtype=np.uint8)
        _paged.encode_rows(_CODE[fmt], new, ws[0], ws[1], 0, p, 0, h, p, d, self._scratch)
        self._store(i, fmt, new)
        return new.nbytes, old.nbytes

    # -- updates ----------------------------------------------------------------------
    def _rows(self, x: Any, name: str) -> tuple[np.ndarray, int]:
        if not isinstance(x, np.ndarray):
            raise PageShapeError(f"{name} must be a numpy.ndarray, got {type(x).__name__}")
        if x.dtype != F32:
            raise PageShapeError(f"{name} must be float32, got {x.dtype}")
        if x.ndim == 4 and x.shape[0] == 1:
            x = x[0]
        if x.ndim != 3 or x.shape[0] != self.kv_heads or x.shape[2] != self.head_dim:
            raise PageShapeError(f"{name} has shape {list(x.shape)}, expected [1, {self.kv_heads}, n, "
                                 f"{self.head_dim}] or [{self.kv_heads}, n, {self.head_dim}]")
        if x.strides[2] == 4:
            return x, 0
        return np.ascontiguousarray(x), x.nbytes

    def update(self, key: np.ndarray, value: np.ndarray, position: Any) -> PageCounters:
        """Write tokens ``[position, position + n)`` and publish them at once (a
        :meth:`stage` committed); ``position`` must be :attr:`length`."""
        return self.stage(key, value, position).commit()

    def stage(self, key: np.ndarray, value: np.ndarray, position: Any) -> PageStage:
        """Write tokens ``[position, position + n)`` beside the published pages (see the
        module docstring); ``position`` must be :attr:`length`. Every argument is checked
        first; nothing published changes until :meth:`PageStage.commit`."""
        if self._stage is not None:
            raise PagedCacheError("another update of this cache is in flight (one step at a time: "
                                  "commit or discard it first)")
        k, ck = self._rows(key, "key")
        v, cv = self._rows(value, "value")
        n = k.shape[1]
        if v.shape[1] != n:
            raise PageShapeError(f"key has {n} tokens, value {v.shape[1]}")
        pos = _position(position)
        if pos < 0 or pos + n > self.capacity:
            raise PageCapacityError(f"writes [{pos}, {pos + n}) outside the capacity {self.capacity} "
                                    f"({self.num_pages} pages of {self.page_size})")
        if pos != self._length:
            raise PageCapacityError(f"writes at position {pos} but the published length is "
                                    f"{self._length} (tokens are appended)")
        p = self.page_size
        if n and pos % p and self._pages[pos // p] is None:
            raise PageIdError(f"page {pos // p} holds tokens below position {pos} but is missing")
        stage = PageStage(self, pos, pos + n)
        stage.copied_bytes = ck + cv
        self._stage = stage
        if n == 0:
            return stage
        last_new = (pos + n - 1) // p
        h, d = self.kv_heads, self.head_dim
        j = 0
        while j < n:
            i, t0 = divmod(pos + j, p)
            m = min(p - t0, n - j)
            target = self.policy_format(last_new - i)
            e = self._pages[i] if t0 else None  # a page the step starts holds nothing of value
            code = _CODE[target]
            if e is not None and e[0] == target and e[1].nbytes == self._staging.nbytes:
                payload = self._staging  # the published page copied, the new tokens on top
                np.copyto(payload, e[1])
                stage.staging = i
                stage.staged_bytes += payload.nbytes
                _paged.encode_rows(code, payload, k, v, j, m, t0, h, p, d, self._scratch)
            elif e is not None:
                payload = self._reencoded(i, target, k, v, j, m, t0)
                stage.allocated_bytes += payload.nbytes
            else:
                payload = self._new_page(target)
                _paged.encode_rows(code, payload, k, v, j, m, t0, h, p, d, self._scratch)
                stage.allocated_bytes += payload.nbytes
            stage.pages[i] = (target, payload)
            j += m
        stage.addr = self._addr.copy()
        stage.fmt = self._fmt.copy()
        for i, (fmt, payload) in stage.pages.items():
            stage.addr[i] = payload.ctypes.data
            stage.fmt[i] = _CODE[fmt]
        return stage

    def _commit(self, stage: PageStage) -> PageCounters:
        if self._stage is not stage:
            raise PagedCacheError("this stage does not belong to the cache's update in flight")
        self._stage = None
        p = self.page_size
        last_old = (self._length - 1) // p if self._length else -1
        last_new = (stage.length - 1) // p if stage.length else -1
        alloc, freed = stage.allocated_bytes, 0
        converted = []
        for i, (fmt, payload) in stage.pages.items():
            old = self._pages[i]
            if i == stage.staging and id(old[1]) not in self._shared:
                self._staging = old[1]  # the replaced payload is the next staging page
            elif i == stage.staging:  # a shared payload is never written: a staging page of its own
                self._staging = self._new_page(self.formats[0])
                alloc += self._staging.nbytes
            elif old is not None:
                freed += old[1].nbytes
            self._store(i, fmt, payload)
        if last_new > last_old:  # pages age: re-encode those crossing into the next format
            first = min(stage.pages) if stage.pages else len(self._pages)
            for i in range(0, first):
                e = self._pages[i]
                target = self.policy_format(last_new - i)
                if e is not None and target != self.policy_format(last_old - i) and e[0] != target:
                    a, f = self._reencode(i, target)
                    alloc, freed = alloc + a, freed + f
                    converted.append(i)
        self._length = stage.length
        self.last = PageCounters(alloc, stage.copied_bytes, freed, tuple(converted), stage.staged_bytes)
        self.allocated_bytes += alloc
        self.copied_bytes += stage.copied_bytes
        return self.last

    def _reencoded(self, i: int, fmt: str, k: np.ndarray, v: np.ndarray, j0: int, n: int, t0: int) -> np.ndarray:
        """A new payload: page ``i``'s valid rows and tokens ``j0 .. j0+n`` of k/v at row
        ``t0``, encoded as ``fmt`` (the page itself is left as it is)."""
        old_fmt, old = self._pages[i]  # type: ignore[misc]
        ws = self._page_ws
        h, p, d = self.kv_heads, self.page_size, self.head_dim
        _paged.decode_page(_CODE[old_fmt], old, ws)
        ws[:, :, min(t0, self._valid_rows(i)):, :] = 0.0
        ws[0, :, t0:t0 + n] = k[:, j0:j0 + n]
        ws[1, :, t0:t0 + n] = v[:, j0:j0 + n]
        new = np.empty(self._nbytes(fmt), dtype=np.uint8)
        _paged.encode_rows(_CODE[fmt], new, ws[0], ws[1], 0, p, 0, h, p, d, self._scratch)
        return new

    def convert(self, page_id: int, fmt: str) -> PageCounters:
        """Re-encode one held page as ``fmt`` (a new payload; the old one is freed)."""
        self._idle("convert")
        i = self._page(page_id)
        _code(fmt)
        e = self._pages[i]
        if e is None:
            raise PageIdError(f"page {i} is missing; there is nothing to convert")
        if e[0] == fmt:
            self.last = PageCounters()
            return self.last
        a, f = self._reencode(i, fmt)
        self.last = PageCounters(a, 0, f, (i,))
        self.allocated_bytes += a
        return self.last

    def grow(self, num_pages: int) -> None:
        """Extend the page table to ``num_pages`` pages (the new ones missing; no payload moves)."""
        self._idle("grow")
        if not isinstance(num_pages, (int, np.integer)) or num_pages < len(self._pages):
            raise PageCapacityError(f"grow({num_pages!r}): the page table has {len(self._pages)} pages "
                                    f"and never shrinks")
        extra = int(num_pages) - len(self._pages)
        self._pages.extend([None] * extra)
        self._addr = np.concatenate([self._addr, np.zeros(extra, dtype=np.int64)])
        self._fmt = np.concatenate([self._fmt, np.full(extra, -1, dtype=np.int32)])
        self.last = PageCounters()

    def set_page(self, page_id: int, fmt: str, payload: Any) -> None:
        """Install a saved page payload (uint8, exactly the format's page bytes). A writable
        C-contiguous uint8 array is held as it is; anything else is copied once."""
        self._idle("set_page")
        i = self._page(page_id)
        _code(fmt)
        want = self._nbytes(fmt)
        arr = payload if isinstance(payload, np.ndarray) else np.frombuffer(payload, dtype=np.uint8)
        if arr.dtype != np.uint8 or arr.ndim != 1:
            raise PageFormatError(f"page {i}: payload must be a 1-D uint8 array, got {arr.dtype} "
                                  f"{list(arr.shape)}")
        if arr.size != want:
            raise PageFormatError(f"page {i}: a {fmt} page [2, {self.kv_heads}, {self.page_size}, "
                                  f"{self.head_dim}] has {want} bytes, the payload {arr.size}")
        copied = 0
        if not (arr.flags.writeable and arr.flags.c_contiguous):
            arr = np.array(arr, dtype=np.uint8, copy=True)
            copied = arr.nbytes
        self._store(i, fmt, arr)
        self.copied_bytes += copied
        self.last = PageCounters(copied_bytes=copied)

    def share_page(self, page_id: int) -> tuple[str, np.ndarray]:
        """``(format, payload)`` of a held page, to be adopted by another cache
        (:meth:`adopt_page`): from now on this cache never writes that payload either
        (a step that extends the page writes a copy; aging re-encodes into a new one)."""
        self._idle("share_page")
        i = self._page(page_id)
        e = self._pages[i]
        if e is None:
            raise PageIdError(f"page {i} is missing; there is nothing to share")
        if id(e[1]) not in self._shared:
            self._shared.add(id(e[1]))
            self._shared_held += e[1].nbytes
        return e

    def adopt_page(self, page_id: int, fmt: str, payload: np.ndarray) -> None:
        """Hold a payload another cache shares (:meth:`share_page`) as page ``page_id``,
        without a copy; it is never written here (rule R2's exception for engine pools)."""
        self._idle("adopt_page")
        i = self._page(page_id)
        _code(fmt)
        if not isinstance(payload, np.ndarray) or payload.dtype != np.uint8 or payload.ndim != 1 \
                or payload.size != self._nbytes(fmt) or not payload.flags.c_contiguous:
            raise PageFormatError(f"page {i}: an adopted payload is a C-contiguous uint8 array of the "
                                  f"{fmt} page's {self._nbytes(fmt)} bytes")
        self._store(i, fmt, payload)
        if id(payload) not in self._shared:
            self._shared.add(id(payload))
            self._shared_held += payload.nbytes

    def is_shared(self, page_id: int) -> bool:
        """True when page ``page_id``'s payload may be held by another cache too."""
        e = self._pages[self._page(page_id)]
        return e is not None and id(e[1]) in self._shared

    def set_length(self, length: int) -> None:
        """Publish ``length`` valid tokens (restoring a saved state); every page covering
        ``[0, length)`` must be held."""
        self._idle("set_length")
        n = operator.index(length)
        if not 0 <= n <= self.capacity:
            raise PageCapacityError(f"length {n} outside [0, {self.capacity}]")
        missing = [i for i in range(-(-n // self.page_size)) if self._pages[i] is None]
        if missing:
            raise PageIdError(f"length {n} needs pages {missing}, which are missing")
        self._length = n

    def truncate(self, length: int) -> None:
        """Publish a shorter length (tokens at and above it are written again later); no
        payload changes."""
        self._idle("truncate")
        n = operator.index(length)
        if not 0 <= n <= self._length:
            raise PageCapacityError(f"truncate({n}): the cache holds {self._length} tokens")
        self._length = n

    # -- reading ----------------------------------------------------------------------
    def decode(self, page_id: int) -> np.ndarray:
        """Page ``page_id`` decoded: float32 [2, H, P, D]."""
        i = self._page(page_id)
        e = self._pages[i]
        if e is None:
            raise PageIdError(f"page {i} is missing")
        out = np.empty((2, self.kv_heads, self.page_size, self.head_dim), dtype=F32)
        _paged.decode_page(_CODE[e[0]], e[1], out)
        return out

    def dense(self) -> tuple[np.ndarray, np.ndarray]:
        """Keys and values of the valid tokens decoded: float32 [H, length, D] each."""
        n = -(-self._length // self.page_size)
        pages = [self.decode(i) for i in range(n)]
        if not pages:
            z = np.zeros((self.kv_heads, 0, self.head_dim), dtype=F32)
            return z, z.copy()
        full = np.concatenate(pages, axis=2)[:, :, :self._length]
        return np.ascontiguousarray(full[0]), np.ascontiguousarray(full[1])

    def workspace(self, threads: int, query_heads: int = 0) -> np.ndarray:
        """The attention workspace for ``threads`` threads and ``query_heads`` query heads
        (grown when a call needs more, then reused)."""
        need = _paged.workspace_floats(self.page_size, self.head_dim, query_heads)
        ws = self._attn_ws
        if ws.shape[0] < threads or ws.shape[1] < need:
            ws = self._attn_ws = np.zeros((max(threads, ws.shape[0]), max(need, ws.shape[1])), dtype=F32)
        return ws

    def attend(self, query: np.ndarray, total: int | None = None, scale: float | None = None,
               num_threads: int | None = None, stage: PageStage | None = None) -> np.ndarray:
        """Causal grouped-query attention of ``query`` float32 [1, Hq, S, D] over keys
        ``[0, total)`` (default :attr:`length`, or the ``stage``'s length: the published
        pages plus the staged ones); query ``i`` sits at ``total - S + i``."""
        if not isinstance(query, np.ndarray) or query.dtype != F32:
            raise PageShapeError(f"query must be a float32 numpy.ndarray, got "
                                 f"{getattr(query, 'dtype', type(query).__name__)}")
        q = query[0] if query.ndim == 4 and query.shape[0] == 1 else query
        if q.ndim != 3 or q.shape[2] != self.head_dim or q.shape[0] % self.kv_heads:
            raise PageShapeError(f"query has shape {list(query.shape)}, expected [1, Hq, S, {self.head_dim}] "
                                 f"with Hq a multiple of {self.kv_heads}")
        s = q.shape[1]
        held = self._length
        addr, fmts = self._addr, self._fmt
        if stage is not None:
            if stage.cache is not self or stage.done:
                raise PagedCacheError("the stage given to attend is not this cache's update in flight")
            held, addr, fmts = stage.length, stage.addr, stage.fmt
        tot = held if total is None else operator.index(total)
        if not s <= tot <= held:
            raise PageCapacityError(f"attention over {tot} keys with {s} queries; the cache holds "
                                    f"{held}")
        need = -(-tot // self.page_size)
        missing = np.flatnonzero(addr[:need] == 0)
        if missing.size:
            raise PageIdError(f"pages {missing.tolist()} below the length {tot} are missing")
        q = np.ascontiguousarray(q)
        nt = max(1, int(num_threads or 1))
        out = np.empty((1,) + q.shape, dtype=F32)
        sc = 1.0 / math.sqrt(self.head_dim) if scale is None else float(scale)
        _paged.attention(q, addr, fmts, tot, self.kv_heads, self.page_size, self.head_dim,
                         sc, out[0], self.workspace(nt, q.shape[0]), nt)
        return out
