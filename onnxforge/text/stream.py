"""Token ids in, text pieces out, as tokens arrive: :class:`TextStream`.

Two things are held back until they are certain:

* an incomplete UTF-8 character: a byte-level token can end inside a character, which
  decodes to U+FFFD until the next token completes it;
* a possible start of a stop string: ``"Hello\\nUs"`` with the stop string ``"\\nUser:"``
  emits ``"Hello"`` and waits; a stop string found ends the stream before it.

So the pieces joined equal the decoded text cut before the first stop string."""
from __future__ import annotations

from collections.abc import Sequence

from onnxforge.text.tokenizer import TextTokenizer

__all__ = ["TextStream"]


class TextStream:
    """Incremental detokenizer with stop strings; :meth:`push` a token, get the text now safe to show."""

    def __init__(self, tokenizer: TextTokenizer, stop: Sequence[str] = ()) -> None:
        self._tok = tokenizer
        self._stop = [s for s in stop if s]
        self._ids: list[int] = []
        self._prefix = 0  # decode from here, so that the piece joins what came before
        self._read = 0  # tokens already turned into text
        self._pending = ""  # decoded text not emitted yet (could start a stop string)
        self.stopped = False  # a stop string was found
        self.text = ""  # everything emitted

    def push(self, token: int) -> str:
        """Add ``token``; return the text that can be shown now ('' when held back)."""
        if self.stopped:
            return ""
        self._ids.append(token)
        before = self._tok.decode(self._ids[self._prefix:self._read])
        now = self._tok.decode(self._ids[self._prefix:])
        if len(now) <= len(before) or now.endswith("\ufffd"):
            return ""
        self._pending += now[len(before):]
        self._prefix, self._read = self._read, len(self._ids)
        return self._release(final=False)

    def finish(self) -> str:
        """The text still held back, at the end of generation."""
        if self.stopped:
            return ""
        tail = self._tok.decode(self._ids[self._prefix:])
        before = self._tok.decode(self._ids[self._prefix:self._read])
        if len(tail) > len(before):
            self._pending += tail[len(before):]
        self._read = len(self._ids)
        return self._release(final=True)

    def _release(self, final: bool) -> str:
        cut = min((i for i in (self._pending.find(s) for s in self._stop) if i >= 0), default=-1)
        if cut >= 0:
            out, self._pending, self.stopped = self._pending[:cut], "", True
        elif final:
            out, self._pending = self._pending, ""
        else:
            keep = max((k for s in self._stop for k in range(1, len(s))
                        if self._pending.endswith(s[:k])), default=0)
            out = self._pending[:len(self._pending) - keep]
            self._pending = self._pending[len(self._pending) - keep:]
        self.text += out
        return out
