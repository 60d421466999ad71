"""Many sequences at once: :class:`Engine` (continuous batching over one page pool)."""
from __future__ import annotations

from onnxforge.engine.engine import Engine
from onnxforge.engine.errors import (EngineBusyError, EngineCapacityError, EngineClosedError, EngineError,
                                     RequestCancelledError, RequestError, RequestPendingError,
                                     UnknownRequestError)

__all__ = ["Engine", "EngineBusyError", "EngineCapacityError", "EngineClosedError", "EngineError",
           "RequestCancelledError", "RequestError", "RequestPendingError", "UnknownRequestError"]
