"""Typed errors raised by the CPU kernels when their arguments are wrong.

Every kernel checks shapes, dtypes, contiguity and index ranges before it
touches memory, so an error always means "nothing was written".
"""
from __future__ import annotations

from onnxforge.proto_ext.errors import OnnxforgeError

__all__ = ["BackendError", "CacheRangeError", "FeedError", "KernelDtypeError", "KernelError",
           "UnsupportedAttributeError", "UnsupportedOperatorError"]


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
