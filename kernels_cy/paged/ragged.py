"""The ragged batch kernels: RaggedPagedCacheUpdate and RaggedPagedAttention, and
:class:`PageBatch`, the value their cache input holds at run time.

One run carries the new rows of N sequences, concatenated along the sequence axis of
a batch of one; sequence ``i`` owns rows ``[starts[i], starts[i + 1])`` and has its own
:class:`~onnxforge.kernels_cy.paged.pages.PagedKVCache` for each layer. A layer's
``PageBatch`` lists those caches in row order::

    batch = PageBatch([seq0.layer3, seq1.layer3])          # one cache per sequence
    c' = RaggedPagedCacheUpdate(batch, k, v, starts, pos)  # each sequence's rows staged
    y  = RaggedPagedAttention(q, c', starts)               # each sequence over its own pages

The update checks every sequence (rows, positions, that no cache appears twice) before
staging any, then stages each sequence's rows exactly as PagedCacheUpdate stages one
sequence's (rule KR5): the run commits every stage when it succeeds and discards every
one when it fails, so a failed step leaves every sequence's pages and length as they
were. The projections around the attentions see one ``[1, T, hidden]`` batch: one
product over all the rows of the step.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

import onnxforge.kernels_cy.paged._paged as _paged
from onnxforge.kernels_cy.ops.base import Kernel, register
from onnxforge.kernels_cy.paged.kernels import PagedAttention, stage_into
from onnxforge.kernels_cy.paged.pages import PagedKVCache

__all__ = ["PageBatch", "RaggedPagedAttention", "RaggedPagedCacheUpdate"]

F32 = np.dtype(np.float32)


class PageBatch:
    """One layer's page tables of the sequences of a ragged run, in row order.

    Several batches (one per layer) may hold the same sequence's caches; one batch never
    holds one cache twice (checked when the update runs)."""

    __slots__ = ("caches",)

    def __init__(self, caches: Iterable[PagedKVCache]):
        self.caches: list[PagedKVCache] = list(caches)
        for c in self.caches:
            if not isinstance(c, PagedKVCache):
                raise TypeError(f"a PageBatch holds PagedKVCache objects, got {type(c).__name__}")

    @property
    def nbytes(self) -> int:
        """Bytes of the page payloads the batch's caches hold (a page two of them share
        counts for each)."""
        return sum(c.nbytes for c in self.caches)

    def buffer_addresses(self) -> dict[int, int]:
        """``{k * 2**32 + page_id: address}`` of every page of cache ``k``."""
        out: dict[int, int] = {}
        for k, c in enumerate(self.caches):
            for i, a in c.buffer_addresses().items():
                out[(k << 32) + i] = a
        return out

    def __len__(self) -> int:
        return len(self.caches)

    def __repr__(self) -> str:
        return f"PageBatch({len(self.caches)} sequences, lengths {[c.length for c in self.caches]})"


def _batch(kernel: Kernel, x: object) -> PageBatch:
    if not isinstance(x, PageBatch):
        raise kernel.error(f"the cache input must be a PageBatch (one PagedKVCache per sequence), got "
                           f"{type(x).__name__}")
    return x


def _starts(kernel: Kernel, starts: object, sequences: int, rows: int) -> list[int]:
    s = np.asarray(starts)
    if s.dtype != np.int64 or s.ndim != 1:
        raise kernel.error(f"sequence_starts must be int64 [N + 1], got {s.dtype} {list(s.shape)}")
    if s.shape[0] != sequences + 1:
        raise kernel.error(f"sequence_starts has {s.shape[0]} entries for {sequences} sequences "
                           f"(it needs N + 1 = {sequences + 1})")
    out: list[int] = s.tolist()
    if out[0] != 0 or out[-1] != rows or any(b < a for a, b in zip(out, out[1:])):
        raise kernel.error(f"sequence_starts {out} must run from 0 to the {rows} rows without decreasing")
    return out


@register("ai.onnxforge", "RaggedPagedCacheUpdate")
class RaggedPagedCacheUpdate(Kernel):
    """(batch, key [1, Hkv, T, D], value [1, Hkv, T, D], sequence_starts [N + 1],
    position_ids [1, T]) -> batch."""

    fresh = False
    uses_context = True

    def run(self, ctx, batch, key, value, sequence_starts, position_ids):
        b = _batch(self, batch)
        for name, x in (("key", key), ("value", value)):
            if not isinstance(x, np.ndarray) or x.ndim != 4 or x.shape[0] != 1:
                raise self.error(f"{name} must be [1, kv_heads, T, head_dim], got "
                                 f"{list(getattr(x, 'shape', ())) or type(x).__name__}")
        rows = key.shape[2]
        if value.shape != key.shape:
            raise self.error(f"value has shape {list(value.shape)}, key {list(key.shape)}")
        s = _starts(self, sequence_starts, len(b.caches), rows)
        pos_arr = np.asarray(position_ids)
        if pos_arr.dtype != np.int64 or pos_arr.shape != (1, rows):
            raise self.error(f"position_ids must be int64 [1, {rows}], got {pos_arr.dtype} "
                             f"{list(pos_arr.shape)}")
        pos: list[int] = pos_arr[0].tolist()
        seen: set[int] = set()
        for k, c in enumerate(b.caches):  # every sequence checked before any page changes (KR5)
            if id(c) in seen or id(c) in ctx.staged:
                raise self.error(f"sequence {k}'s cache appears twice in the batch or is written twice in "
                                 f"one run")
            seen.add(id(c))
            lo, hi = s[k], s[k + 1]
            if hi == lo:
                continue
            first = pos[lo]
            if first != c.length:
                raise self.error(f"sequence {k}: its rows start at position {first} but its cache holds "
                                 f"{c.length} tokens (tokens are appended)")
            if hi - lo > 1 and pos[lo:hi] != list(range(first, first + hi - lo)):
                raise self.error(f"sequence {k}: positions {pos[lo:hi]} do not run on by one")
            if first + hi - lo > c.capacity:
                raise self.error(f"sequence {k}: writes [{first}, {first + hi - lo}) beyond its capacity "
                                 f"{c.capacity}")
        for k, c in enumerate(b.caches):
            lo, hi = s[k], s[k + 1]
            if hi == lo:
                continue
            stage_into(ctx, c, key[:, :, lo:hi], value[:, :, lo:hi], pos[lo])
        return b


@register("ai.onnxforge", "RaggedPagedAttention")
class RaggedPagedAttention(PagedAttention):
    """(query [1, Hq, T, D], batch, sequence_starts [N + 1]) -> [1, Hq, T, D]: each sequence's
    rows attend causally over its own pages (the rows staged in this run included); the
    attributes are PagedAttention's."""

    uses_context = True

    def run(self, ctx, query, batch, sequence_starts):
        b = _batch(self, batch)
        if not isinstance(query, np.ndarray) or query.dtype != F32 or query.ndim != 4 or query.shape[0] != 1:
            raise self.error(f"query must be float32 [1, Hq, T, D], got "
                             f"{getattr(query, 'dtype', type(query).__name__)} "
                             f"{list(getattr(query, 'shape', ()))}")
        hq, rows = query.shape[1], query.shape[2]
        if self.num_heads and hq != self.num_heads:
            raise self.error(f"query has {hq} heads, num_heads is {self.num_heads}")
        s = _starts(self, sequence_starts, len(b.caches), rows)
        out = np.empty(query.shape, dtype=F32)
        one: list[tuple[int, PagedKVCache, Any]] = []  # sequences with one row: one compiled call
        for k, c in enumerate(b.caches):
            lo, hi = s[k], s[k + 1]
            if hi == lo:
                continue
            if self.kv_heads and c.kv_heads != self.kv_heads:
                raise self.error(f"sequence {k}'s cache has {c.kv_heads} kv heads, kv_num_heads is "
                                 f"{self.kv_heads}")
            stage = ctx.staged.get(id(c))
            if hi - lo == 1:
                one.append((lo, c, stage))
                continue
            n = c.length if stage is None else stage.length
            nt = self.threads_for(n * hq * (hi - lo) * query.shape[3] * 2)
            out[:, :, lo:hi] = c.attend(query[:, :, lo:hi], None, self.scale, nt, stage=stage)
        if one:
            self._one_token_each(query, out, one)
        return out

    def _one_token_each(self, query: np.ndarray, out: np.ndarray, one: list) -> None:
        """The one-row sequences in one compiled call (all their (sequence, KV head) items on the
        pool): the tokens each attends over are its published ones plus the row staged in this run."""
        c0 = one[0][1]
        rows = np.array([r for r, _, _ in one], dtype=np.int64)
        addrs = [c._addr if st is None else st.addr for _, c, st in one]
        fmts = [c._fmt if st is None else st.fmt for _, c, st in one]
        totals = np.array([c.length if st is None else st.length for _, c, st in one], dtype=np.int64)
        geometry = {(c.kv_heads, c.page_size, c.head_dim) for _, c, _ in one}
        if len(geometry) != 1:
            raise self.error(f"the batch's caches differ in geometry {sorted(geometry)}")
        d = c0.head_dim
        hq = query.shape[1]
        nt = self.threads_for(int(totals.sum()) * hq * d * 2)
        scale = 1.0 / math.sqrt(d) if self.scale is None else self.scale
        q = query[0] if query.flags.c_contiguous else np.ascontiguousarray(query[0])
        _paged.attention_many(q, rows, addrs, fmts, totals, c0.kv_heads, c0.page_size, d, scale, out[0],
                              c0.workspace(max(1, nt or 1), hq), max(1, nt or 1))
