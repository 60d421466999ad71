"""Typed errors raised by the CPU kernels when their arguments are wrong.

Every kernel checks shapes, dtypes, contiguity and index ranges before it
touches memory, so an error always means "nothing was written".
"""
from __future__ import annotations

from onnxforge.proto_ext.errors import OnnxforgeError

__all__ = ["BackendError", "CacheRangeError", "FeedError", "KernelDtypeError", "KernelError",
           "PageCapacityError", "PageFormatError", "PageIdError", "PageShapeError", "PagedCacheError",
           "StateAliasError", "StateBusyError", "StateClosedError", "StateError", "StateFeedError",
           "StateFileError", "StateInitError", "UnsupportedAttributeError", "UnsupportedOperatorError"]


class BackendError(OnnxforgeError, ValueError):
    """Base class of the errors the CPU backend raises on purpose."""


class UnsupportedOperatorError(BackendError):
    """The model holds operators no kernel claims; ``nodes`` lists (node path, domain::op_type)."""

    def __init__(self, nodes: list[tuple[str, str]]):
        self.nodes = list(nodes)
        body = "\n  ".join(f"{p}: {op}" for p, op in self.nodes)
        super().__init__(f"{len(self.nodes)} node(s) use operators the backend does not claim "
                         f"(pass fallback='reference' to run them with onnx.reference):\n  {body}")


class UnsupportedAttributeError(BackendError):
    """A node's attribute value (or constant input) its kernel does not support (plan time)."""


class FeedError(BackendError):
    """A feed that does not match the model: missing, unknown, wrong dtype, rank or dimension."""


class KernelError(BackendError):
    """A kernel argument has the wrong shape, layout or value; nothing was written."""


class KernelDtypeError(KernelError, TypeError):
    """A kernel argument has an element type the kernel does not support."""


class CacheRangeError(KernelError):
    """A cache write or read position lies outside ``[0, capacity]``; nothing was written."""


class PagedCacheError(BackendError):
    """Base class of the errors a paged KV cache raises; the cache is unchanged."""


class PageCapacityError(PagedCacheError, CacheRangeError):
    """A write or read outside the page table (position < 0, past the capacity, not at the
    published length), or a page table that would shrink."""


class PageFormatError(PagedCacheError):
    """An unknown page format name, or a payload whose length is not its format's page size."""


class PageIdError(PagedCacheError, IndexError):
    """A page id outside the page table, or a page that is needed but missing."""


class PageShapeError(PagedCacheError, KernelError):
    """Keys, values or queries whose dtype, rank or dimensions do not fit the cache."""


class StateError(BackendError):
    """Base class of the errors a persistent state (``make_state``) raises; the state is unchanged."""


class StateInitError(StateError):
    """An initial or restored state value that cannot be retained as it is (rules R2, R6, R7):
    missing, unknown, wrong dtype or shape, non-writable or non-contiguous READ_WRITE storage,
    storage already bound to another live state, or a symbolic dimension with no size."""


class StateFileError(StateInitError):
    """A state file that cannot be restored: unreadable, truncated, corrupted (a checksum
    or a padding byte does not match), of another format or version, or saved from a
    state whose declared identity differs (bound inputs, dtypes, shapes, capacities,
    page geometry or format policy) or whose lengths exceed their capacities. The
    message names the file (also in ``path``) and what is wrong; nothing was restored."""

    def __init__(self, message: str, *, path: str | None = None):
        super().__init__(message)
        self.path = path


class StateFeedError(StateError, FeedError):
    """A feed that names an input the state retains (rule R6)."""


class StateBusyError(StateError):
    """``run``, ``reset`` or ``close`` while another call on the same state is active (rule R5)."""


class StateClosedError(StateError):
    """A call on a state after ``close()``."""


class StateAliasError(StateError):
    """A bound output that must be its input's buffer came back as other storage, or a
    READ_WRITE input's next value is not writable, C-contiguous storage (rules R1, R2)."""
