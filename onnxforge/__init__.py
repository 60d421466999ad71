"""onnxforge: graph-rewriting compiler toolkit for stateful ONNX models."""
from __future__ import annotations

from onnxforge.errors import (
    ExportError,
    CodecError,
    ExternalDataError,
    OnnxforgeError,
    VerificationError,
    WireError,
)

__version__ = "0.1.0"

__all__ = [
    "CodecError",
    "ExportError",
    "ExternalDataError",
    "OnnxforgeError",
    "VerificationError",
    "WireError",
    "__version__",
]
