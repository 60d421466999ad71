"""onnxforge: graph-rewriting compiler toolkit for stateful ONNX models."""
from __future__ import annotations

from onnxforge.errors import (
    CodecError,
    ExportError,
    ExternalDataError,
    ModelFileError,
    OnnxforgeError,
    VerificationError,
    WireError,
)

from onnxforge.api import (
    check,
    decode_value,
    infer_shapes,
    load,
    optimize,
    save,
    to_standard_onnx,
    verify,
)
from onnxforge.graphbuilder.builder import GraphBuilder
from onnxforge.graphbuilder.ir import MUST_ALIAS, READ_ONLY, READ_WRITE

__version__ = "0.1.0"

__all__ = [
    "CodecError",
    "ExportError",
    "ExternalDataError",
    "ModelFileError",
    "OnnxforgeError",
    "VerificationError",
    "WireError",
    "__version__",
    "GraphBuilder",
    "MUST_ALIAS",
    "READ_ONLY",
    "READ_WRITE",
    "check",
    "decode_value",
    "infer_shapes",
    "load",
    "optimize",
    "save",
    "to_standard_onnx",
    "verify",
]
