"""Typed errors of the engine (:class:`onnxforge.Engine`)."""
from __future__ import annotations

from onnxforge.proto_ext.errors import OnnxforgeError

__all__ = ["EngineBusyError", "EngineCapacityError", "EngineClosedError", "EngineError", "RequestCancelledError",
           "RequestError", "RequestPendingError", "UnknownRequestError"]


class EngineError(OnnxforgeError):
    """The engine cannot do what was asked."""


class EngineCapacityError(EngineError, ValueError):
    """A request that could never be served: prompt plus new tokens beyond ``max_length``, or
    more pages than the whole pool holds."""


class EngineBusyError(EngineError):
    """``step`` or ``run`` called while another thread is stepping the same engine."""


class EngineClosedError(EngineError):
    """The engine was closed; its pages are freed."""


class UnknownRequestError(EngineError, KeyError):
    """No request has this id."""

    def __str__(self) -> str:
        return str(self.args[0])


class RequestError(EngineError):
    """A request failed; ``result`` raises this error (its cause is the original error)."""


class RequestCancelledError(RequestError):
    """The request was cancelled before it finished."""


class RequestPendingError(EngineError):
    """The request has not finished yet (step or run the engine first)."""
