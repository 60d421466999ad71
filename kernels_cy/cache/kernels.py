"""ai.onnxforge CacheUpdate: a contiguous cache written in place at a position, every
check before the first byte (rules R3, L13)."""
from __future__ import annotations

import numpy as np

from onnxforge.kernels_cy.errors import CacheRangeError, KernelError
from onnxforge.kernels_cy.ops import fast
from onnxforge.kernels_cy.ops.base import Kernel, NodeSpec, register

__all__: list[str] = []

# element types the compiled copy takes (the operator's T); empty without the extension
_COMPILED_DTYPES = fast.cython_kernel("cache._cache", "DTYPES") or frozenset()


def _write(cache, values, pos, a: int, n: int) -> None:
    """``values`` into ``cache`` at ``[pos, pos + n)`` along axis ``a``: one scalar position
    for every row, or ``pos[b]`` for row ``b`` of axis 0. Through the compiled per-row copy
    when it takes the operands (C-contiguous, one of its element types, per-row positions
    behind a batch axis), else by numpy slicing."""
    scalar = pos.size == 1
    if (fast.cache_update is not None and cache.dtype.name in _COMPILED_DTYPES
            and cache.flags.c_contiguous and values.flags.c_contiguous and (scalar or a != 0)):
        fast.cache_update(cache, values, int(pos[0]) if scalar else pos, a)
        return
    rows = [(slice(None), int(pos[0]))] if scalar else list(enumerate(pos.tolist()))
    for b, p in rows:
        idx = [b] + [slice(None)] * (cache.ndim - 1)
        vidx = tuple(idx)
        idx[a] = slice(p, p + n)
        cache[tuple(idx)] = values[vidx]


@register("ai.onnxforge", "CacheUpdate")
class CacheUpdate(Kernel):
    """Writes ``values`` into ``cache`` at ``position`` along ``axis`` in place; returns ``cache``.

    Every check comes before the write: a negative position, ``position + n`` past
    the capacity, or (for a state buffer) a position below its published length
    (rule R3) is a :class:`CacheRangeError` and nothing is written. The new valid
    length ``position + n`` is recorded for the state to publish."""

    fresh = False
    uses_context = True

    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.axis = spec.int("axis", -2)

    def run(self, ctx, cache, values, position):
        floor = ctx.floor(cache)
        if (fast.cache_update is not None and isinstance(position, np.ndarray) and position.ndim == 0
                and position.dtype.kind in "iu" and isinstance(floor, (int, type(None)))):
            pos = int(position)  # the common decode step: one scalar position, the compiled copy
            if floor is not None and pos != floor and pos != ctx.next(cache):  # refused, with every check
                return self._general(cache, values, position, ctx, floor)
            try:
                end = fast.cache_update(cache, values, pos, self.axis)
            except KernelError as e:  # checked before the first byte is written
                raise type(e)(f"{self.spec_path}: {e}") from None
            if floor is not None:
                ctx.wrote(cache, end)
            return cache
        return self._general(cache, values, position, ctx, floor)

    def _gap(self, pos: object, floor: object, name: object) -> CacheRangeError:
        return CacheRangeError(f"{self.spec_path}: position {pos} is above the published length {floor} "
                               f"of {name!r}: the entries between would be published without being written "
                               f"(rule R3: a run appends at the published length)")

    def _below(self, pos: object, floor: object, name: object) -> CacheRangeError:
        return CacheRangeError(f"{self.spec_path}: position {pos} is below the published length {floor} "
                               f"of {name!r} (rule R3: a run writes only at or above it)")

    def _general(self, cache, values, position, ctx, floor):
        if not isinstance(cache, np.ndarray) or not cache.flags.writeable:
            raise self.error("the cache buffer is not writable")
        if values.dtype != cache.dtype:
            raise self.error(f"values are {values.dtype} but the cache is {cache.dtype}")
        if values.ndim != cache.ndim:
            raise self.error(f"values have rank {values.ndim}, the cache {cache.ndim}")
        a = self.axis % cache.ndim
        n = values.shape[a]
        cap = cache.shape[a]
        pos = np.asarray(position, dtype=np.int64).reshape(-1)
        if pos.size not in (1, cache.shape[0]):
            raise self.error(f"position has {pos.size} entries for batch {cache.shape[0]}")
        if pos.size and (pos.min() < 0 or pos.max() + n > cap):
            raise CacheRangeError(f"{self.spec_path}: position {pos.tolist()} + {n} new entries is outside "
                                  f"the capacity {cap}")
        for i, d in enumerate(values.shape):
            if i != a and d != cache.shape[i]:
                raise self.error(f"values shape {values.shape} does not match the cache {cache.shape}")
        if floor is not None and np.any(pos < np.asarray(floor)):
            raise self._below(pos.tolist(), floor, ctx.name(cache))
        if floor is not None and np.any(pos > np.asarray(ctx.next(cache))):
            raise self._gap(pos.tolist(), ctx.next(cache), ctx.name(cache))
        _write(cache, values, pos, a, n)
        if floor is not None:
            ctx.wrote(cache, int(pos[0]) + n if pos.size == 1 else tuple(int(p) + n for p in pos))
        return cache
