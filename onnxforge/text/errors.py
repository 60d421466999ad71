"""Typed errors of the text layer (tokenizer files, chat templates, sampling values)."""
from __future__ import annotations

from onnxforge.proto_ext.errors import OnnxforgeError

__all__ = ["SamplingError", "TextError", "TokenizerFileError"]


class TextError(OnnxforgeError):
    """Text in or text out cannot proceed: a tokenizer or chat template problem."""


class TokenizerFileError(TextError, FileNotFoundError):
    """A model folder lacks a file that text in or out needs (``tokenizer.json``, a chat template)."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(f"{path}: {why}")
        self.path = path

    def __str__(self) -> str:
        return str(self.args[0])


class SamplingError(TextError, ValueError):
    """A sampling value out of its range (negative temperature, top_p outside (0, 1], ...)."""
