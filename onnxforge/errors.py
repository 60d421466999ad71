"""Typed exceptions shared by every layer (public home: ``onnxforge.errors``).

The classes are defined in the lowest layer, :mod:`onnxforge.proto_ext.errors`,
so that the layers never import the facade package; this module re-exports
them unchanged (``onnxforge.errors.CodecError is onnxforge.proto_ext.errors.CodecError``).
"""
from __future__ import annotations

from onnxforge.proto_ext.errors import (
    CodecError,
    ExportError,
    ExternalDataError,
    ModelFileError,
    OnnxforgeError,
    VerificationError,
    Violation,
    WireError,
)

__all__ = [
    "CodecError",
    "ExportError",
    "ExternalDataError",
    "ModelFileError",
    "OnnxforgeError",
    "Violation",
    "VerificationError",
    "WireError",
]
