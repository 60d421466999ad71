"""The tokenizer of a model folder, read with the Hugging Face ``tokenizers`` library.

A folder exported by onnxruntime-genai (or saved by ``transformers``) holds::

    tokenizer.json          the tokenizer itself (vocabulary, merges, pre-tokenizer, decoder)
    tokenizer_config.json   special tokens, and a ``chat_template`` in older exports
    chat_template.jinja     the chat template (preferred over the key above)
    genai_config.json       model.eos_token_id (an int or a list), bos_token_id, context_length

The chat template renders with ``jinja2`` in a sandbox configured as ``transformers``
configures it (``trim_blocks``, ``lstrip_blocks``, loop controls, a ``tojson`` that keeps
non-ASCII text, ``raise_exception``), so the rendered prompt is the one
``apply_chat_template(messages, tokenize=False, add_generation_prompt=True)`` gives.
"""
from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from onnxforge.text.errors import TextError, TokenizerFileError

__all__ = ["TextTokenizer", "render_chat_template"]

_SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise TextError(f"{path}: not a readable JSON file ({e})") from None
    if not isinstance(data, dict):
        raise TextError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _token_text(value: Any) -> str | None:
    """A special token of tokenizer_config.json: a string, or an AddedToken dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _ids(value: Any) -> tuple[int, ...]:
    if isinstance(value, bool):
        return ()
    if isinstance(value, int):
        return (value,)
    if isinstance(value, list):
        return tuple(v for v in value if isinstance(v, int) and not isinstance(v, bool))
    return ()


def render_chat_template(template: str, messages: Sequence[Mapping[str, Any]], *,
                         add_generation_prompt: bool = True, **variables: Any) -> str:
    """Render a chat template on ``messages`` (``variables``: special tokens and the like)."""
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
               separators: Any = None, sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        compiled = env.from_string(template)
        return compiled.render(messages=[dict(m) for m in messages],
                               add_generation_prompt=add_generation_prompt, **variables)
    except jinja2.exceptions.TemplateError as e:
        raise TextError(f"the chat template failed to render: {e}") from None


class TextTokenizer:
    """Text to token ids and back for the model in ``folder``; see the module docstring."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        from tokenizers import Tokenizer

        self.folder = Path(folder)
        path = self.folder / "tokenizer.json"
        if not path.is_file():
            raise TokenizerFileError(str(path), "no tokenizer.json beside the model: text in and out need the "
                                                "model's tokenizer (token ids work without it: --prompt-ids)")
        try:
            self._tok = Tokenizer.from_file(str(path))
        except Exception as e:  # the tokenizers library raises a bare Exception on a malformed file
            raise TextError(f"{path}: not a readable tokenizer.json ({e})") from None
        cfg_path = self.folder / "tokenizer_config.json"
        self.config = _read_json(cfg_path) if cfg_path.is_file() else {}
        genai_path = self.folder / "genai_config.json"
        genai = (_read_json(genai_path).get("model") or {}) if genai_path.is_file() else {}
        self.specials = {k: t for k in _SPECIAL_KEYS if (t := _token_text(self.config.get(k))) is not None}
        eos = _ids(genai.get("eos_token_id"))
        if not eos and "eos_token" in self.specials:
            eos = _ids(self._tok.token_to_id(self.specials["eos_token"]))
        self.eos_ids: frozenset[int] = frozenset(eos)
        bos = _ids(genai.get("bos_token_id"))
        self.bos_id: int | None = bos[0] if bos else None
        length = genai.get("context_length")
        self.context_length: int | None = length if isinstance(length, int) and length > 0 else None
        jinja = self.folder / "chat_template.jinja"
        template = self.config.get("chat_template")
        if jinja.is_file():
            template = jinja.read_text(encoding="utf-8")
        self.chat_template: str | None = template if isinstance(template, str) else None

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """The token ids of ``text`` (the tokenizer's post-processor adds its specials)."""
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], *,
                            add_generation_prompt: bool = True) -> str:
        """The prompt text for ``messages`` (``[{"role": ..., "content": ...}, ...]``)."""
        if self.chat_template is None:
            raise TokenizerFileError(str(self.folder / "chat_template.jinja"),
                                     "no chat template (neither this file nor the chat_template key of "
                                     "tokenizer_config.json): --chat needs one")
        return render_chat_template(self.chat_template, messages,
                                    add_generation_prompt=add_generation_prompt, **self.specials)

    def encode_chat(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """The token ids of the rendered chat (the template writes its own special tokens)."""
        return self.encode(self.apply_chat_template(messages), add_special_tokens=False)
