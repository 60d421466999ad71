"""Paged KV cache kernels (``ai.onnxforge``): PagedCacheUpdate and PagedAttention.

The cache value is a :class:`~onnxforge.kernels_cy.paged.PagedKVCache` (a graph input
typed as a struct category, bound READ_WRITE). Before / after one decode step::

    updated = PagedCacheUpdate(cache, key, value, position)   # updated IS cache (MUST_ALIAS)
    y = PagedAttention(query, updated)                        # attends [0, updated.length)

PagedCacheUpdate quantizes the new tokens into their pages; the run counters see only the
page payloads it allocates (exactly one page's bytes for a missing page, the new page's
bytes for a page that ages into another format, nothing for an existing page).
PagedAttention decodes one page of one KV head at a time into the cache's fixed workspace.
"""
from __future__ import annotations

import numpy as np

from onnxforge.kernels_cy.ops.base import Kernel, NodeSpec, register
from onnxforge.kernels_cy.paged import PagedKVCache

__all__ = ["PagedAttention", "PagedCacheUpdate"]


def _cache(kernel: Kernel, x: object) -> PagedKVCache:
    if not isinstance(x, PagedKVCache):
        raise kernel.error(f"the cache input must be a PagedKVCache, got {type(x).__name__}")
    return x


@register("ai.onnxforge", "PagedCacheUpdate")
class PagedCacheUpdate(Kernel):
    """(cache, key [1, Hkv, n, D], value [1, Hkv, n, D], position int64 scalar) -> cache."""

    fresh = False
    uses_context = True

    def run(self, ctx, cache, key, value, position):
        c = _cache(self, cache)
        floor = ctx.floor(c)
        if isinstance(floor, int) and floor < c.length:
            c.truncate(floor)  # tokens of a failed run above the published length: dropped
        last = c.update(key, value, position)
        if floor is not None:
            ctx.wrote(c, c.length)
        if last.allocated_bytes:
            ctx.mem.hold(last.allocated_bytes)
        if last.copied_bytes:
            ctx.mem.copied_only(last.copied_bytes)
        return c


@register("ai.onnxforge", "PagedAttention")
class PagedAttention(Kernel):
    """(query [1, Hq, S, D], cache, total_length?) -> [1, Hq, S, D], causal over the cache.

    Attributes: ``scale`` (default 1/sqrt(D)), ``num_heads`` and ``kv_num_heads``
    (optional; checked against the shapes when given).
    """

    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        scale = spec.attrs.get("scale")
        self.scale = None if scale is None else float(scale)
        self.num_heads = spec.int("num_heads", 0)
        self.kv_heads = spec.int("kv_num_heads", 0)
        if self.num_heads < 0 or self.kv_heads < 0 or (self.kv_heads and self.num_heads % self.kv_heads):
            raise spec.fail(f"num_heads={self.num_heads} must be a multiple of kv_num_heads={self.kv_heads}")
        self.threads_for = spec.threads_for

    def run(self, query, cache, total_length=None):
        c = _cache(self, cache)
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
        n = c.length if total is None else total
        nt = self.threads_for(n * hq * query.shape[2] * query.shape[3] * 2)
        return c.attend(query, total, self.scale, nt)
