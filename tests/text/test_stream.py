"""onnxforge/text/stream.py: pieces never split a UTF-8 character nor show a stop string."""
from __future__ import annotations

import pytest

from onnxforge.text import TextStream, TextTokenizer

TEXT = "def main():\n    return 'héllo 世界 🙂' # done\nUser: next"


def _pieces(tok, ids, stop=()):
    s = TextStream(tok, stop)
    pieces = [s.push(t) for t in ids]
    pieces.append(s.finish())
    return [p for p in pieces if p], s


def test_multibyte_characters_are_never_split(genai_dir, hf_tokenizer):
    tok = TextTokenizer(genai_dir)
    ids = hf_tokenizer.encode(TEXT)
    # the byte-level tokenizer does split these characters across tokens
    assert any("\ufffd" in hf_tokenizer.decode([t]) for t in ids)
    pieces, _ = _pieces(tok, ids)
    assert "".join(pieces) == hf_tokenizer.decode(ids) == TEXT
    assert len(pieces) > 5 and not any("\ufffd" in p for p in pieces)


@pytest.mark.parametrize("stop", ["\nUser:", "世界", "'", "return 'h", "# done\nUser: next", "absent"])
def test_stop_strings_never_leak(genai_dir, hf_tokenizer, stop):
    tok = TextTokenizer(genai_dir)
    ids = hf_tokenizer.encode(TEXT)
    pieces, s = _pieces(tok, ids, [stop, "zzz"])
    cut = TEXT.find(stop)
    expected = TEXT if cut < 0 else TEXT[:cut]
    assert "".join(pieces) == expected == s.text
    assert s.stopped == (cut >= 0)
    # after every token the text shown is a prefix of the expected text: nothing shown is taken back
    shown, s2 = "", TextStream(tok, [stop])
    for t in ids:
        shown += s2.push(t)
        assert expected.startswith(shown)
