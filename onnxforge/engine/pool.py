"""The engine's page pool: a byte budget over every sequence's pages, and the prefix
registry that lets full pages be shared between sequences.

A sequence holds, per layer, one :class:`~onnxforge.kernels_cy.paged.pages.PagedKVCache`
(its page table, its pages and one staging page). The pool counts the bytes of every
payload held once: a sequence's own payloads count for it, a registered page counts for
the registry (whoever holds it). The budget is checked before a step with an upper
bound (each new page in the policy's newest format), so a step never overruns it.

A registered page is keyed by the hash chain of the tokens it and every page before it
hold, the format policy, and the page's own format (each layer's page ``i`` of one
sequence has the same format, the policy's for its age). A sequence that reaches a page
already in the registry adopts the registered payloads (or, having computed its own,
drops them for the registered ones): a full page below every holder's length is never
written again, and a holder whose policy converts it writes a converted copy (the
caches guarantee both; rule R2's exception for engine pools).
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from onnxforge.kernels_cy.paged.pages import PagedKVCache

__all__ = ["PagePool", "PrefixEntry", "chain_key"]


def chain_key(previous: bytes, tokens: Sequence[int], policy: str) -> bytes:
    """The key of a page holding ``tokens`` after the pages keyed up to ``previous``."""
    h = hashlib.blake2b(previous, digest_size=16)
    h.update(np.asarray(tokens, dtype=np.int64).tobytes())
    h.update(policy.encode())
    return h.digest()


@dataclass(slots=True)
class PrefixEntry:
    """One registered page: each layer's ``(format, payload)`` and who holds it."""

    pages: list[tuple[str, np.ndarray]]
    nbytes: int
    holders: set[int] = field(default_factory=set)
    hits: int = 0


class PagePool:
    """Byte budget and prefix registry; see the module docstring. Not thread-safe by
    itself: the engine calls it under its lock."""

    def __init__(self, capacity: int, layers: int, page_bytes: int, staging_bytes: int):
        self.capacity = int(capacity)
        self.layers = layers
        self.page_bytes = page_bytes  # one page of one layer in the policy's newest format
        self.staging_bytes = staging_bytes  # one sequence's staging pages (all layers)
        self.registry: OrderedDict[tuple[bytes, str], PrefixEntry] = OrderedDict()
        self.seq_bytes: dict[int, int] = {}
        self.prefix_hits = 0

    # -- accounting -----------------------------------------------------------------
    @property
    def registry_bytes(self) -> int:
        return sum(e.nbytes for e in self.registry.values())

    @property
    def used(self) -> int:
        return sum(self.seq_bytes.values()) + self.registry_bytes

    @property
    def free(self) -> int:
        return self.capacity - self.used

    def pages_for(self, tokens: int, page_size: int) -> int:
        """Pages of one layer covering ``tokens`` tokens."""
        return -(-tokens // page_size)

    def cost(self, new_pages: int) -> int:
        """Upper bound of the bytes ``new_pages`` pages of every layer take."""
        return new_pages * self.layers * self.page_bytes

    def recount(self, rid: int, caches: Sequence[PagedKVCache]) -> None:
        """The bytes sequence ``rid`` holds on its own (shared payloads count for the registry)."""
        self.seq_bytes[rid] = sum(c.nbytes - c.shared_bytes + c.staging_bytes for c in caches)

    def drop(self, rid: int) -> None:
        """Sequence ``rid`` holds nothing any more."""
        self.seq_bytes.pop(rid, None)
        for e in self.registry.values():
            e.holders.discard(rid)

    def evict(self, need: int) -> int:
        """Drop registered pages nobody holds, least recently used first, until ``need``
        bytes are free or none is left; returns the bytes freed."""
        freed = 0
        for key in list(self.registry):
            if self.free >= need:
                break
            e = self.registry[key]
            if not e.holders:
                del self.registry[key]
                freed += e.nbytes
        return freed

    # -- the registry ---------------------------------------------------------------
    def lookup(self, key: bytes, fmt: str) -> PrefixEntry | None:
        e = self.registry.get((key, fmt))
        if e is not None:
            self.registry.move_to_end((key, fmt))
        return e

    def register(self, key: bytes, fmt: str, rid: int, pages: list[tuple[str, np.ndarray]]) -> PrefixEntry:
        e = PrefixEntry(pages, sum(p.nbytes for _, p in pages), {rid})
        self.registry[(key, fmt)] = e
        return e

    @property
    def pages_shared(self) -> int:
        """Pages (of one layer each) that two or more sequences hold."""
        return sum(self.layers for e in self.registry.values() if len(e.holders) >= 2)

    def pages_in_use(self, per_sequence: dict[int, int]) -> int:
        """Pages the running sequences hold: each one's own plus every registered page some
        sequence holds, once."""
        return sum(per_sequence.values()) + self.layers * sum(1 for e in self.registry.values() if e.holders)

    @property
    def pages_cached(self) -> int:
        """Registered pages no sequence holds: kept for later prompts, dropped when room is needed."""
        return self.layers * sum(1 for e in self.registry.values() if not e.holders)
