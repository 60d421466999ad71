"""Paged KV cache kernels (``ai.onnxforge``): PagedCacheUpdate and PagedAttention.

The cache value is a :class:`~onnxforge.kernels_cy.paged.pages.PagedKVCache` (a graph input
typed as a struct category, bound READ_WRITE). Before / after one decode step::

    updated = PagedCacheUpdate(cache, key, value, position)   # updated IS cache (MUST_ALIAS)
    y = PagedAttention(query, updated)                        # attends [0, updated.length)

A step is a transaction: PagedCacheUpdate stages the new tokens (the page already
holding tokens below them in the cache's staging page, new pages as new payloads; see
:mod:`~onnxforge.kernels_cy.paged.pages`) and records the stage in the run's context;
PagedAttention of that cache in the same run reads the published pages plus the staged
ones. The stage is committed (the staging page swapped in, aging pages converted, the
length published) only when the whole run succeeds, by the state that owns the cache or,
for a cache fed to a stateless run, by the session; a failed run discards it and leaves
every page and the length bitwise as they were. The run counters see only the page
payloads a step allocates (exactly one page's bytes for a page it starts, the new page's
bytes for a page that ages into another format, nothing for an existing page).
PagedAttention decodes one page of one KV head at a time into the cache's fixed workspace.
"""
from __future__ import annotations

import numpy as np

from onnxforge.kernels_cy.ops.base import Kernel, NodeSpec, register
from onnxforge.kernels_cy.paged.pages import PagedKVCache

__all__ = ["PagedAttention", "PagedCacheUpdate", "stage_into"]


def _cache(kernel: Kernel, x: object) -> PagedKVCache:
    if not isinstance(x, PagedKVCache):
        raise kernel.error(f"the cache input must be a PagedKVCache, got {type(x).__name__}")
    return x


def stage_into(ctx, cache: PagedKVCache, key, value, position) -> None:
    """Stage ``cache``'s new rows in the run: committed with it, discarded if it fails; the
    payloads the stage allocates or copies count for the run."""
    stage = cache.stage(key, value, position)
    ctx.staged[id(cache)] = stage
    if stage.allocated_bytes:
        ctx.mem.hold(stage.allocated_bytes)
    if stage.copied_bytes:
        ctx.mem.copied_only(stage.copied_bytes)


@register("ai.onnxforge", "PagedCacheUpdate")
class PagedCacheUpdate(Kernel):
    """(cache, key [1, Hkv, n, D], value [1, Hkv, n, D], position int64 scalar) -> cache."""

    fresh = False
    uses_context = True

    def run(self, ctx, cache, key, value, position):
        c = _cache(self, cache)
        if id(c) in ctx.staged:
            raise self.error("the cache is written twice in one run; one PagedCacheUpdate per cache and step")
        stage_into(ctx, c, key, value, position)
        return c


@register("ai.onnxforge", "PagedAttention")
class PagedAttention(Kernel):
    """(query [1, Hq, S, D], cache, total_length?) -> [1, Hq, S, D], causal over the cache
    (the published pages, plus the tokens a PagedCacheUpdate of this run staged).

    Attributes: ``scale`` (default 1/sqrt(D)), ``num_heads`` and ``kv_num_heads``
    (optional; checked against the shapes when given).
    """

    uses_context = True

    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        scale = spec.attrs.get("scale")
        self.scale = None if scale is None else float(scale)
        self.num_heads = spec.int("num_heads", 0)
        self.kv_heads = spec.int("kv_num_heads", 0)
        if self.num_heads < 0 or self.kv_heads < 0 or (self.kv_heads and self.num_heads % self.kv_heads):
            raise spec.fail(f"num_heads={self.num_heads} must be a multiple of kv_num_heads={self.kv_heads}")
        self.threads_for = spec.threads_for

    def run(self, ctx, query, cache, total_length=None):
        c = _cache(self, cache)
        stage = ctx.staged.get(id(c))
        if not isinstance(query, np.ndarray) or query.ndim != 4 or query.shape[0] != 1:
            raise self.error(f"query must be float32 [1, Hq, S, D], got "
                             f"{list(getattr(query, 'shape', ())) or type(query).__name__}")
        hq = query.shape[1]
        if self.num_heads and hq != self.num_heads:
            raise self.error(f"query has {hq} heads, num_heads is {self.num_heads}")
        if self.kv_heads and c.kv_heads != self.kv_heads:
            raise self.error(f"the cache has {c.kv_heads} kv heads, kv_num_heads is {self.kv_heads}")
        total = None
        if total_length is not None:
            t = np.asarray(total_length)
            if t.size != 1 or t.dtype.kind not in "iu":
                raise self.error(f"total_length must be one integer, got {t.dtype} {list(t.shape)}")
            total = int(t.reshape(-1)[0])
        n = (c.length if stage is None else stage.length) if total is None else total
        nt = self.threads_for(n * hq * query.shape[2] * query.shape[3] * 2)
        return c.attend(query, total, self.scale, nt, stage=stage)
