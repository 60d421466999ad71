"""Typed exceptions shared by every layer.

They live in the lowest layer so that every layer (``proto_ext`` upwards) can
raise them without importing the facade package; ``onnxforge.errors`` and the
``onnxforge`` facade re-export them for users.
"""
from __future__ import annotations

from dataclasses import dataclass

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


class OnnxforgeError(Exception):
    """Base class of every error onnxforge raises on purpose."""


class WireError(OnnxforgeError, ValueError):
    """Bytes that are not a well-formed (extended) ONNX protobuf message."""


class ModelFileError(OnnxforgeError, OSError):
    """A model path that cannot be read as a file: missing, a directory, not readable."""


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken static rule: ``rule`` is an ID from RULES.md, ``path`` names the object."""

    rule: str
    path: str
    message: str

    def __str__(self) -> str:
        return f"[{self.rule}] {self.path}: {self.message}"


class VerificationError(OnnxforgeError, ValueError):
    """A model breaks one or more static rules; ``violations`` lists each of them."""

    def __init__(self, violations: list[Violation] | Violation | str):
        if isinstance(violations, str):
            violations = [Violation("?", "model", violations)]
        elif isinstance(violations, Violation):
            violations = [violations]
        self.violations: list[Violation] = list(violations)
        lines = [str(v) for v in self.violations]
        head = lines[0] if len(lines) == 1 else f"{len(lines)} violations:\n  " + "\n  ".join(lines)
        super().__init__(head)

    @property
    def rules(self) -> list[str]:
        return [v.rule for v in self.violations]


class CodecError(OnnxforgeError, ValueError):
    """A value cannot be decoded or encoded (missing decoder, bad payload, bad parameters)."""


class ExternalDataError(OnnxforgeError, ValueError):
    """An external-data reference is unsafe (escapes the model folder) or out of bounds.

    When a rule of RULES.md applies, ``rule`` is its ID (``"P4"``, ``"P5"``), ``path``
    names the object and the message reads ``[rule] path: detail``; otherwise ``rule``
    and ``path`` are None and the message is ``detail``.
    """

    def __init__(self, detail: str, *, rule: str | None = None, path: str | None = None):
        self.rule = rule
        self.path = path
        self.detail = detail
        super().__init__(detail if rule is None else f"[{rule}] {path}: {detail}")


class ExportError(OnnxforgeError):
    """Standard export cannot express some constructs; ``constructs`` lists (path, reason)."""

    def __init__(self, constructs: list[tuple[str, str]]):
        self.constructs = list(constructs)
        body = "\n  ".join(f"{p}: {r}" for p, r in self.constructs)
        super().__init__(f"cannot export {len(self.constructs)} construct(s) to standard ONNX:\n  {body}")
