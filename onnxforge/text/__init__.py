"""Text in, text out: tokenizers, chat templates, sampling and :class:`Generator`.

``onnxforge.text.tokenizer`` reads a model folder's tokenizer files with the Hugging Face
``tokenizers`` library and renders chat templates with ``jinja2``; ``sampling`` picks
tokens; ``stream`` turns token ids into text pieces safe to show; ``generator`` runs a
decoder's persistent state on them.
"""
from __future__ import annotations

from onnxforge.text.errors import SamplingError, TextError, TokenizerFileError
from onnxforge.text.generator import Generator
from onnxforge.text.sampling import Sampler, Sampling
from onnxforge.text.stream import TextStream
from onnxforge.text.tokenizer import TextTokenizer

__all__ = ["Generator", "Sampler", "Sampling", "SamplingError", "TextError", "TextStream", "TextTokenizer",
           "TokenizerFileError"]
