"""Canonical terms of symbolic dimension expressions, and their text form.

The bottom layer of :mod:`onnxforge.graphbuilder.shapes.symbolic` (whose public names
live there): the representation the algebra of
:mod:`~onnxforge.graphbuilder.shapes.symexpr` works on, and the printer. They belong
together because the canonical order of opaque atoms (and of the arguments of
``max`` / ``min``) is the order of their printed text.

Representation::

    terms:    dict[Monomial, int]   non-zero coefficients only; () is the constant
    Monomial: tuple[(atom, power), ...] sorted by atom, power >= 1
    atom:     str (a symbol name) or Opaque (floor division, modulo, max, min)

``str`` atoms sort before opaque atoms; opaque atoms sort by (kind, text).

Printing rules::

    terms by decreasing degree, then canonical order   n**2 + 2*n - 3
    // and % operands parenthesised unless one atom    (n + 1)//2, n % 4
    an opaque factor of a product is parenthesised     3*(n % 4)
    a name that is not an identifier                   `a+b` + 1 (backticks, `` doubled)
    a lone symbol                                      written verbatim when parse_dim
                                                       would read the text back whole
"""
from __future__ import annotations

import re
from typing import Any

__all__: list[str] = []

# Kinds of opaque atoms (the operations a polynomial cannot express).
FLOORDIV = 0
MOD = 1
MAX = 2
MIN = 3
KIND_NAMES = ("floordiv", "mod", "max", "min")

# Names printed bare inside larger expressions: the identifiers the parser reads.
IDENT = r"[^\W\d][\w.]*(?:-[^\W\d][\w.]*)*"
_IDENT_RE = re.compile(IDENT)
PLAIN_RE = re.compile(r"[^\W\d][\w.]*(?:[-/][^\W\d][\w.]*)*")
"""A whole dim_param that is a name even though it may hold '/' (``encoder/seq``)."""


_set = object.__setattr__


class Opaque:
    """An atom that stands for ``a//b``, ``a % b``, ``max(...)`` or ``min(...)``.

    Only built by the folding functions of the algebra, so its arguments are
    canonical expressions (objects with canonical ``_terms``).
    """

    __slots__ = ("_hash", "_text", "args", "kind")

    kind: int
    args: tuple[Any, ...]
    _hash: int
    _text: str | None

    def __init__(self, kind: int, args: tuple[Any, ...]):
        _set(self, "kind", kind)
        _set(self, "args", args)
        _set(self, "_hash", hash((kind, args)))
        _set(self, "_text", None)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("symbolic atoms are immutable")

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        return (Opaque, (self.kind, self.args))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if isinstance(other, Opaque):
            return self._hash == other._hash and self.kind == other.kind and self.args == other.args
        return False

    # Ordering: every symbol name sorts before every opaque atom.
    def _key(self) -> tuple[int, str]:
        return (self.kind, self.text())

    def __lt__(self, other: object) -> bool:
        if isinstance(other, str):
            return False
        if isinstance(other, Opaque):
            return self._key() < other._key()
        return NotImplemented

    def __gt__(self, other: object) -> bool:
        if isinstance(other, str):
            return True
        if isinstance(other, Opaque):
            return self._key() > other._key()
        return NotImplemented

    def __le__(self, other: object) -> bool:
        return self == other or self.__lt__(other) is True

    def __ge__(self, other: object) -> bool:
        return self == other or self.__gt__(other) is True

    def text(self) -> str:
        """The atom as it is printed (cached)."""
        t = self._text
        if t is None:
            t = _opaque_text(self.kind, self.args)
            _set(self, "_text", t)
        return t

    def __repr__(self) -> str:
        return f"<{self.text()}>"


# --------------------------------------------------------------------------
# Arithmetic on terms
# --------------------------------------------------------------------------


def mono_mul(a: tuple, b: tuple) -> tuple:
    """Product of two monomials."""
    if not a:
        return b
    if not b:
        return a
    d = dict(a)
    for atom, p in b:
        d[atom] = d.get(atom, 0) + p
    return tuple(sorted(d.items()))


def add_into(out: dict, terms: dict, scale: int = 1) -> None:
    """``out += scale * terms`` in place."""
    for m, c in terms.items():
        v = out.get(m, 0) + scale * c
        if v:
            out[m] = v
        else:
            out.pop(m, None)


def mul_terms(a: dict, b: dict) -> dict:
    """Product of two polynomials."""
    if len(b) == 1 and () in b:
        k = b[()]
        return {m: c * k for m, c in a.items()}
    if len(a) == 1 and () in a:
        k = a[()]
        return {m: c * k for m, c in b.items()}
    out: dict = {}
    for ma, ca in a.items():
        for mb, cb in b.items():
            m = mono_mul(ma, mb)
            v = out.get(m, 0) + ca * cb
            if v:
                out[m] = v
            else:
                out.pop(m, None)
    return out


def pow_terms(t: dict, k: int) -> dict:
    """``t**k`` for ``k >= 0``."""
    result: dict = {(): 1}
    base = t
    while k:
        if k & 1:
            result = mul_terms(result, base)
        k >>= 1
        if k:
            base = mul_terms(base, base)
    return result


def unit_atom(t: dict) -> Any:
    """The atom when the terms ``t`` are exactly ``1*atom`` (power 1), else ``None``."""
    if len(t) == 1:
        ((m, c),) = t.items()
        if c == 1 and len(m) == 1 and m[0][1] == 1:
            return m[0][0]
    return None


def degree(m: tuple) -> int:
    """Total degree of a monomial."""
    return sum(p for _, p in m)


# --------------------------------------------------------------------------
# Text form
# --------------------------------------------------------------------------


def _name_in_compound(name: str) -> str:
    if _IDENT_RE.fullmatch(name):
        return name
    return "`" + name.replace("`", "``") + "`"


def _name_alone(name: str) -> str:
    if PLAIN_RE.fullmatch(name):
        return name
    from onnxforge.graphbuilder.shapes.symparse import try_parse  # the parser sits above this module

    if name.strip() and try_parse(name) is None:
        return name  # parse_dim keeps text it cannot parse whole
    return _name_in_compound(name)


def format_terms(t: dict, lone: bool) -> str:
    """Printed form of a polynomial; ``lone`` when it is a whole expression (not an operand)."""
    if not t:
        return "0"
    if len(t) == 1:
        if lone:
            atom = unit_atom(t)
            if isinstance(atom, str):
                return _name_alone(atom)
        items = list(t.items())
    else:
        items = sorted(t.items(), key=lambda mc: (-degree(mc[0]), mc[0]))
    parts: list[str] = []
    for i, (m, c) in enumerate(items):
        neg = c < 0
        if i == 0:
            parts.append(("-" if neg else "") + _format_mono(m, abs(c), bare_ok=not neg))
        else:
            parts.append((" - " if neg else " + ") + _format_mono(m, abs(c), bare_ok=True))
    return "".join(parts)


def _format_mono(m: tuple, c: int, bare_ok: bool) -> str:
    if not m:
        return str(c)
    alone = bare_ok and c == 1 and len(m) == 1 and m[0][1] == 1
    factors = [] if c == 1 else [str(c)]
    for atom, p in m:
        if isinstance(atom, str):
            s = _name_in_compound(atom)
        else:
            s = atom.text()
            if atom.kind in (FLOORDIV, MOD) and not alone:
                s = f"({s})"
        factors.append(s if p == 1 else f"{s}**{p}")
    return "*".join(factors)


def _operand(t: dict) -> str:
    """An argument of ``//`` or ``%``, parenthesised unless it is a single atom."""
    if not t:
        return "0"
    if len(t) == 1:
        ((m, c),) = t.items()
        if not m and c >= 0:
            return str(c)
        atom = unit_atom(t)
        if isinstance(atom, str):
            return _name_in_compound(atom)
        if atom is not None and atom.kind in (MAX, MIN):
            return atom.text()
    return f"({format_terms(t, lone=False)})"


def _opaque_text(kind: int, args: tuple[Any, ...]) -> str:
    """Printed form of an opaque atom of ``kind`` over expressions ``args``."""
    if kind == FLOORDIV:
        return f"{_operand(args[0]._terms)}//{_operand(args[1]._terms)}"
    if kind == MOD:
        return f"{_operand(args[0]._terms)} % {_operand(args[1]._terms)}"
    inner = ", ".join(format_terms(a._terms, lone=False) for a in args)
    return f"{KIND_NAMES[kind]}({inner})"
