"""Symbolic dimension algebra: integer polynomials over named symbols.

A :class:`SymExpr` is a polynomial with integer coefficients. Its variables
("atoms") are named symbols (ONNX ``dim_param`` strings) or opaque terms for
the operations a polynomial cannot express: floor division, modulo, maximum
and minimum. An opaque term behaves like a symbol inside a polynomial and
compares structurally, after the folding rules below have brought it to a
canonical shape::

    (2*n)//2          -> n
    (4*n + 8)//4      -> n + 2
    (n - 1)//2 + 1    -> (n + 1)//2        constants reduced into [0, divisor)
    (2*n + 2)//4      -> (n + 1)//2        common factor removed
    (n//2)//3         -> n//6
    n % 1             -> 0
    (2*n + 5) % 2     -> 1
    (n % 8) % 4       -> n % 4
    max(n, n + 1, 3)  -> max(3, n + 1)

The algebra makes no assumption about the sign of a symbol. Divisors are
assumed to be non-zero (``a//a`` folds to 1); a zero constant divisor raises
:class:`SymbolicZeroDivisionError`. Equality is structural on the canonical
form, so ``n + 1 == 1 + n`` while ``(n + 1)//2 == n - n//2`` is not
recognised; :func:`dims_equal` answers ``None`` in such cases.

``str()`` gives a readable form that :func:`parse_dim` reads back into an
equal expression (``n//2``, ``(n + 1)//2``, ``3*(n % 4)``, ``max(m, n)``);
when every symbol name is a Python identifier, Python evaluates it to the
same integer. Symbol names that are not identifiers are written between
backticks inside larger expressions; a lone symbol is written verbatim, so a
``dim_param`` kept whole comes back unchanged.

Example::

    >>> past, seq = parse_dim("past"), parse_dim("seq")
    >>> str(past + seq)
    'past + seq'
    >>> dims_equal(parse_dim("past + seq"), seq + past)
    True
    >>> dim_to_onnx((2 * seq + 1) // 2)
    (None, 'seq')
"""
from __future__ import annotations

import operator
import re
from collections.abc import Callable, Iterable, Mapping
from functools import lru_cache
from math import gcd
from typing import TypeAlias

from onnxforge.errors import OnnxforgeError

__all__ = [
    "Dim",
    "SymExpr",
    "SymbolicError",
    "SymbolicZeroDivisionError",
    "UnboundSymbolError",
    "as_dim",
    "ceildiv",
    "dim_from_onnx",
    "dim_to_onnx",
    "dims_equal",
    "floordiv",
    "mod",
    "parse_dim",
    "product",
    "sum_dims",
    "sym_max",
    "sym_min",
    "symbol",
]


class SymbolicError(OnnxforgeError, ValueError):
    """An operation of the symbolic dimension algebra cannot be carried out."""


class SymbolicZeroDivisionError(SymbolicError, ZeroDivisionError):
    """Floor division or modulo by a divisor that is (or evaluates to) zero."""


class UnboundSymbolError(SymbolicError):
    """:meth:`SymExpr.evaluate` met symbols that the environment does not bind."""

    def __init__(self, missing: Iterable[str], expr: str):
        self.missing: tuple[str, ...] = tuple(sorted(missing))
        names = ", ".join(repr(s) for s in self.missing)
        super().__init__(f"cannot evaluate {expr!r}: no value for symbol(s) {names}")


# --------------------------------------------------------------------------
# Canonical representation
#
# terms:    dict[Monomial, int]   non-zero coefficients only; () is the constant
# Monomial: tuple[(atom, power), ...] sorted by atom, power >= 1
# atom:     str (a symbol name) or _Opaque (floor division, modulo, max, min)
#
# str atoms sort before opaque atoms; opaque atoms sort by (kind, text).
# --------------------------------------------------------------------------

_FLOORDIV = 0
_MOD = 1
_MAX = 2
_MIN = 3
_KIND_NAMES = ("floordiv", "mod", "max", "min")

_set = object.__setattr__
_new = object.__new__


class _Opaque:
    """An atom that stands for ``a//b``, ``a % b``, ``max(...)`` or ``min(...)``.

    Only built by the folding functions, so its arguments are canonical.
    """

    __slots__ = ("_hash", "_text", "args", "kind")

    kind: int
    args: tuple[SymExpr, ...]

    def __init__(self, kind: int, args: tuple[SymExpr, ...]):
        _set(self, "kind", kind)
        _set(self, "args", args)
        _set(self, "_hash", hash((kind, args)))
        _set(self, "_text", None)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("symbolic atoms are immutable")

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        return (_Opaque, (self.kind, self.args))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if isinstance(other, _Opaque):
            return self._hash == other._hash and self.kind == other.kind and self.args == other.args
        return False

    # Ordering: every symbol name sorts before every opaque atom.
    def _key(self) -> tuple[int, str]:
        return (self.kind, self.text())

    def __lt__(self, other: object) -> bool:
        if isinstance(other, str):
            return False
        if isinstance(other, _Opaque):
            return self._key() < other._key()
        return NotImplemented

    def __gt__(self, other: object) -> bool:
        if isinstance(other, str):
            return True
        if isinstance(other, _Opaque):
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
            if self.kind == _FLOORDIV:
                t = f"{_operand(self.args[0])}//{_operand(self.args[1])}"
            elif self.kind == _MOD:
                t = f"{_operand(self.args[0])} % {_operand(self.args[1])}"
            else:
                inner = ", ".join(_format(a._terms, lone=False) for a in self.args)
                t = f"{_KIND_NAMES[self.kind]}({inner})"
            _set(self, "_text", t)
        return t

    def __repr__(self) -> str:
        return f"<{self.text()}>"

    def evaluate(self, env: Mapping[str, int]) -> int:
        vals = [a._eval(env) for a in self.args]
        if self.kind == _MAX:
            return max(vals)
        if self.kind == _MIN:
            return min(vals)
        if vals[1] == 0:
            raise SymbolicZeroDivisionError(f"division by zero while evaluating {self.text()!r}")
        return vals[0] // vals[1] if self.kind == _FLOORDIV else vals[0] % vals[1]

    def rebuild(self, args: list[SymExpr]) -> SymExpr:
        if self.kind == _FLOORDIV:
            return _floordiv(args[0], args[1])
        if self.kind == _MOD:
            return _mod(args[0], args[1])
        return _minmax(self.kind, args)


def _mono_mul(a: tuple, b: tuple) -> tuple:
    if not a:
        return b
    if not b:
        return a
    d = dict(a)
    for atom, p in b:
        d[atom] = d.get(atom, 0) + p
    return tuple(sorted(d.items()))


def _add_into(out: dict, terms: dict, scale: int = 1) -> None:
    for m, c in terms.items():
        v = out.get(m, 0) + scale * c
        if v:
            out[m] = v
        else:
            out.pop(m, None)


def _mul_terms(a: dict, b: dict) -> dict:
    if len(b) == 1 and () in b:
        k = b[()]
        return {m: c * k for m, c in a.items()}
    if len(a) == 1 and () in a:
        k = a[()]
        return {m: c * k for m, c in b.items()}
    out: dict = {}
    for ma, ca in a.items():
        for mb, cb in b.items():
            m = _mono_mul(ma, mb)
            v = out.get(m, 0) + ca * cb
            if v:
                out[m] = v
            else:
                out.pop(m, None)
    return out


def _pow_terms(t: dict, k: int) -> dict:
    result: dict = {(): 1}
    base = t
    while k:
        if k & 1:
            result = _mul_terms(result, base)
        k >>= 1
        if k:
            base = _mul_terms(base, base)
    return result


def _make(terms: dict) -> SymExpr:
    # _hash and _free stay unset until first needed (see SymExpr.__hash__)
    e = _new(SymExpr)
    _set(e, "_terms", terms)
    return e


def _const(v: int) -> SymExpr:
    return _make({(): v} if v else {})


def _atom_expr(atom: object) -> SymExpr:
    return _make({((atom, 1),): 1})


def _is_index(x: object) -> bool:
    return isinstance(x, int) or (not isinstance(x, float) and hasattr(type(x), "__index__"))


def _coerce(x: object) -> SymExpr | None:
    if isinstance(x, SymExpr):
        return x
    if type(x) is int:
        return _const(x)
    if _is_index(x):
        return _const(operator.index(x))  # type: ignore[arg-type]
    return None


def _to_expr(x: int | SymExpr, what: str = "operand") -> SymExpr:
    e = _coerce(x)
    if e is None:
        raise TypeError(f"{what} must be an int or a SymExpr, got {type(x).__name__}")
    return e


class SymExpr:
    """Immutable, hashable integer polynomial over named symbols and opaque atoms.

    ``SymExpr(3)`` is the constant 3, ``SymExpr("n")`` the symbol named ``n``
    (the name is taken verbatim; use :func:`parse_dim` to read arithmetic).
    Arithmetic with ``int`` and ``SymExpr`` operands: ``+ - * ** // %`` and
    unary ``-``; ``//`` and ``%`` follow Python floor semantics. A constant
    expression compares and hashes equal to its ``int``.
    """

    __slots__ = ("_free", "_hash", "_terms")

    _terms: dict
    _hash: int  # set on first use
    _free: frozenset[str]  # set on first use

    def __init__(self, value: int | str = 0):
        if isinstance(value, str):
            if not value:
                raise SymbolicError("a symbol name cannot be empty")
            terms: dict = {((value, 1),): 1}
        elif _is_index(value):
            v = operator.index(value)
            terms = {(): v} if v else {}
        else:
            raise TypeError(f"SymExpr() takes an int or a symbol name, got {type(value).__name__}")
        _set(self, "_terms", terms)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("SymExpr is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("SymExpr is immutable")

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        return (_from_items, (tuple(self._terms.items()),))

    # ---- inspection ------------------------------------------------------

    @property
    def is_constant(self) -> bool:
        """True when the expression has no symbol (after folding)."""
        t = self._terms
        return not t or (len(t) == 1 and () in t)

    @property
    def constant_value(self) -> int | None:
        """The value of a constant expression, else ``None``."""
        t = self._terms
        if not t:
            return 0
        if len(t) == 1 and () in t:
            return t[()]
        return None

    @property
    def symbol_name(self) -> str | None:
        """The name when the expression is exactly one symbol, else ``None``."""
        t = self._terms
        if len(t) == 1:
            ((mono, c),) = t.items()
            if c == 1 and len(mono) == 1 and mono[0][1] == 1 and isinstance(mono[0][0], str):
                return mono[0][0]
        return None

    @property
    def free_symbols(self) -> frozenset[str]:
        """Names of all symbols, including those inside opaque terms."""
        try:
            return self._free
        except AttributeError:
            names: set[str] = set()
            for mono in self._terms:
                for atom, _ in mono:
                    if isinstance(atom, str):
                        names.add(atom)
                    else:
                        for a in atom.args:
                            names |= a.free_symbols
            f = frozenset(names)
            _set(self, "_free", f)
            return f

    # ---- equality --------------------------------------------------------

    def __hash__(self) -> int:
        try:
            return self._hash
        except AttributeError:
            t = self._terms
            if not t:
                h = hash(0)
            elif len(t) == 1 and () in t:
                h = hash(t[()])
            else:
                h = hash(frozenset(t.items()))
            _set(self, "_hash", h)
            return h

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if isinstance(other, SymExpr):
            return self._terms == other._terms
        if isinstance(other, int):
            t = self._terms
            return (not t and other == 0) or (len(t) == 1 and t.get(()) == other)
        return NotImplemented

    def __bool__(self) -> bool:
        """False only for the zero polynomial."""
        return bool(self._terms)

    def __int__(self) -> int:
        v = self.constant_value
        if v is None:
            raise SymbolicError(f"{self} is not a constant")
        return v

    # ---- arithmetic ------------------------------------------------------

    def __add__(self, other: int | SymExpr) -> SymExpr:
        if type(other) is int:
            if not other:
                return self
            t = dict(self._terms)
            v = t.get((), 0) + other
            if v:
                t[()] = v
            else:
                del t[()]
            return _make(t)
        o = _coerce(other)
        if o is None:
            return NotImplemented
        if not o._terms:
            return self
        if not self._terms:
            return o
        t = dict(self._terms)
        _add_into(t, o._terms)
        return _make(t)

    __radd__ = __add__

    def __sub__(self, other: int | SymExpr) -> SymExpr:
        if type(other) is int:
            return self.__add__(-other)
        o = _coerce(other)
        if o is None:
            return NotImplemented
        t = dict(self._terms)
        _add_into(t, o._terms, -1)
        return _make(t)

    def __rsub__(self, other: int | SymExpr) -> SymExpr:
        o = _coerce(other)
        if o is None:
            return NotImplemented
        return o.__sub__(self)

    def __neg__(self) -> SymExpr:
        return _make({m: -c for m, c in self._terms.items()})

    def __pos__(self) -> SymExpr:
        return self

    def __mul__(self, other: int | SymExpr) -> SymExpr:
        if type(other) is int:
            if other == 1:
                return self
            if not other:
                return _make({})
            return _make({m: c * other for m, c in self._terms.items()})
        o = _coerce(other)
        if o is None:
            return NotImplemented
        return _make(_mul_terms(self._terms, o._terms))

    __rmul__ = __mul__

    def __pow__(self, exponent: int) -> SymExpr:
        if not _is_index(exponent):
            return NotImplemented
        k = operator.index(exponent)
        if k < 0:
            raise SymbolicError(f"negative exponent {k} is outside the integer polynomial algebra")
        return _make(_pow_terms(self._terms, k))

    def __floordiv__(self, other: int | SymExpr) -> SymExpr:
        o = _coerce(other)
        if o is None:
            return NotImplemented
        return _floordiv(self, o)

    def __rfloordiv__(self, other: int | SymExpr) -> SymExpr:
        o = _coerce(other)
        if o is None:
            return NotImplemented
        return _floordiv(o, self)

    def __mod__(self, other: int | SymExpr) -> SymExpr:
        o = _coerce(other)
        if o is None:
            return NotImplemented
        return _mod(self, o)

    def __rmod__(self, other: int | SymExpr) -> SymExpr:
        o = _coerce(other)
        if o is None:
            return NotImplemented
        return _mod(o, self)

    # ---- substitution and evaluation -------------------------------------

    def substitute(self, mapping: Mapping[str, int | SymExpr]) -> SymExpr:
        """Replace symbols simultaneously and fold again.

        ``(n + m).substitute({"n": m, "m": 2})`` gives ``m + 2``.
        """
        if not mapping:
            return self
        repl: dict[object, dict | None] = {}
        changed = False
        for mono in self._terms:
            for atom, _ in mono:
                if atom in repl:
                    continue
                new = _subst_atom(atom, mapping)
                repl[atom] = new
                changed = changed or new is not None
        if not changed:
            return self
        out: dict = {}
        for mono, c in self._terms.items():
            term: dict = {(): c}
            kept: list = []
            for atom, p in mono:
                r = repl[atom]
                if r is None:
                    kept.append((atom, p))
                else:
                    term = _mul_terms(term, _pow_terms(r, p))
            if kept:
                term = _mul_terms(term, {tuple(kept): 1})
            _add_into(out, term)
        return _make(out)

    def evaluate(self, env: Mapping[str, int]) -> int:
        """Value of the expression for integer symbol values.

        Raises :class:`UnboundSymbolError` naming every missing symbol, and
        :class:`SymbolicZeroDivisionError` when a divisor evaluates to zero.
        """
        missing = [s for s in self.free_symbols if s not in env]
        if missing:
            raise UnboundSymbolError(missing, str(self))
        return self._eval(env)

    def _eval(self, env: Mapping[str, int]) -> int:
        total = 0
        cache: dict[object, int] = {}
        for mono, c in self._terms.items():
            v = c
            for atom, p in mono:
                x = cache.get(atom)
                if x is None:
                    x = operator.index(env[atom]) if isinstance(atom, str) else atom.evaluate(env)
                    cache[atom] = x
                v *= x**p
            total += v
        return total

    # ---- printing --------------------------------------------------------

    def __str__(self) -> str:
        return _format(self._terms, lone=True)

    def __repr__(self) -> str:
        return f"SymExpr({str(self)!r})"


def _from_items(items: tuple) -> SymExpr:
    return _make(dict(items))


def _subst_atom(atom: object, mapping: Mapping[str, int | SymExpr]) -> dict | None:
    """Terms replacing ``atom``, or ``None`` when the atom is unchanged."""
    if isinstance(atom, str):
        if atom not in mapping:
            return None
        return _to_expr(mapping[atom], f"substitution for {atom!r}")._terms
    args = [a.substitute(mapping) for a in atom.args]  # type: ignore[attr-defined]
    if all(n is o for n, o in zip(args, atom.args)):  # type: ignore[attr-defined]
        return None
    return atom.rebuild(args)._terms  # type: ignore[attr-defined]


# --------------------------------------------------------------------------
# Folding of floor division, modulo, max and min
# --------------------------------------------------------------------------


def _leading_negative(t: dict) -> bool:
    """Whether the first non-constant term (in canonical order) is negative."""
    best = None
    for m in t:
        if m and (best is None or m < best):
            best = m
    return best is not None and t[best] < 0


def _exact_multiple(a: dict, b: dict) -> int | None:
    """``k`` with ``a == k*b`` (``b`` non-empty), else ``None``."""
    if len(a) != len(b):
        return None
    m0, c0 = next(iter(b.items()))
    ca = a.get(m0)
    if ca is None or ca % c0:
        return None
    k = ca // c0
    for m, c in b.items():
        if a.get(m) != k * c:
            return None
    return k


def _mono_div(m: tuple, d: tuple) -> tuple | None:
    """``m / d`` when the monomial ``d`` divides ``m``."""
    md = dict(m)
    for atom, p in d:
        q = md.get(atom, 0) - p
        if q < 0:
            return None
        if q:
            md[atom] = q
        else:
            del md[atom]
    return tuple(sorted(md.items()))


def _split_by_monomial(a: dict, b: dict) -> tuple[dict, dict]:
    """Split ``a`` into ``b*q + r`` for a single-term ``b``: returns ``(q, r)``."""
    ((bm, bc),) = b.items()
    q: dict = {}
    r: dict = {}
    for m, c in a.items():
        qm = _mono_div(m, bm) if c % bc == 0 else None
        if qm is None:
            r[m] = c
        else:
            q[qm] = c // bc
    return q, r


def _in_range(r: dict, bound: int) -> bool:
    """Whether ``0 <= r < bound`` for every symbol value.

    ``r`` has non-negative coefficients; it qualifies when every non-constant
    term is a single ``x % d`` atom with a positive constant ``d``.
    """
    hi = r.get((), 0)
    for m, c in r.items():
        if not m:
            continue
        if len(m) != 1 or m[0][1] != 1:
            return False
        atom = m[0][0]
        if not isinstance(atom, _Opaque) or atom.kind != _MOD:
            return False
        d = atom.args[1].constant_value
        if d is None or d <= 0:
            return False
        hi += c * (d - 1)
    return hi < bound


@lru_cache(maxsize=8192)
def _floordiv(a: SymExpr, b: SymExpr) -> SymExpr:
    bt = b._terms
    bc = b.constant_value
    if bc is not None:
        if bc == 0:
            raise SymbolicZeroDivisionError(f"division by zero: ({a})//0")
        ac = a.constant_value
        if ac is not None:
            return _const(ac // bc)
        if bc < 0:  # a//(-c) == (-a)//c
            a, bc = -a, -bc
        if bc == 1:
            return a
        # a == bc*q + r with every coefficient of r in [0, bc): a//bc == q + r//bc
        q: dict = {}
        r: dict = {}
        for m, c in a._terms.items():
            qq, rr = divmod(c, bc)
            if qq:
                q[m] = qq
            if rr:
                r[m] = rr
        if not r or _in_range(r, bc):
            return _make(q)
        g = _content(r, bc)  # (g*x + k)//(g*c) == (x + k//g)//c for 0 <= k
        if g > 1:
            r, bc = _scale_down(r, g), bc // g
            if _in_range(r, bc):
                return _make(q)
        nested = _unit_floordiv(r)
        if nested is not None:
            # (x//d + p)//c == ((x + d*p)//d)//c == (x + d*p)//(d*c) for integer p, d, c > 0
            atom, d = nested
            p = dict(r)
            del p[((atom, 1),)]
            return _make(q) + _floordiv(atom.args[0] + _make(p) * d, _const(d * bc))
        q[((_Opaque(_FLOORDIV, (_make(r), _const(bc))), 1),)] = 1
        return _make(q)
    # symbolic divisor (assumed non-zero)
    if not a._terms:
        return a
    if _leading_negative(bt):  # a//(-b) == (-a)//b
        a, b = -a, -b
        bt = b._terms
    k = _exact_multiple(a._terms, bt)
    if k is not None:
        return _const(k)
    q, r = ({}, a._terms)
    if len(bt) == 1:
        q, r = _split_by_monomial(a._terms, bt)
        if not r:
            return _make(q)
    g = gcd(*r.values(), *bt.values())
    if g > 1:
        r = {m: c // g for m, c in r.items()}
        bt = {m: c // g for m, c in bt.items()}
    q = dict(q)
    q[((_Opaque(_FLOORDIV, (_make(r), _make(bt))), 1),)] = 1
    return _make(q)


def _content(r: dict, c: int) -> int:
    """gcd of ``c`` and the non-constant coefficients of ``r``."""
    return gcd(c, *(v for m, v in r.items() if m))


def _scale_down(r: dict, g: int) -> dict:
    """``r // g`` term by term (exact except for the constant term, which is floored)."""
    return {m: v // g for m, v in r.items() if v // g}


def _unit_floordiv(r: dict) -> tuple[_Opaque, int] | None:
    """The first ``x//d`` atom (constant ``d``) standing alone with coefficient 1 in ``r``."""
    for m, c in r.items():
        if c == 1 and len(m) == 1 and m[0][1] == 1:
            atom = m[0][0]
            if isinstance(atom, _Opaque) and atom.kind == _FLOORDIV:
                d = atom.args[1].constant_value
                if d is not None and d > 0:
                    return atom, d
    return None


def _liftable(atom: object, c: int) -> bool:
    if isinstance(atom, _Opaque) and atom.kind == _MOD:
        d = atom.args[1].constant_value
        return d is not None and d % c == 0
    return False


def _has_lift(r: dict, c: int) -> bool:
    return any(_liftable(atom, c) for m in r for atom, _ in m)


def _lift(r: dict, c: int) -> dict:
    """``r`` with every ``x % d`` atom, ``c`` dividing ``d``, replaced by ``x``."""
    out: dict = {}
    for m, coef in r.items():
        term: dict = {(): coef}
        for atom, p in m:
            base = atom.args[0]._terms if _liftable(atom, c) else {((atom, 1),): 1}  # type: ignore[attr-defined]
            term = _mul_terms(term, _pow_terms(base, p))
        _add_into(out, term)
    return out


@lru_cache(maxsize=8192)
def _mod(a: SymExpr, b: SymExpr) -> SymExpr:
    bt = b._terms
    bc = b.constant_value
    if bc is not None:
        if bc == 0:
            raise SymbolicZeroDivisionError(f"modulo by zero: ({a}) % 0")
        ac = a.constant_value
        if ac is not None:
            return _const(ac % bc)
        if bc < 0:  # a % (-c) == -((-a) % c)
            return -_mod(-a, _const(-bc))
        if bc == 1:
            return _const(0)
        r = {}
        for m, c in a._terms.items():
            rr = c % bc
            if rr:
                r[m] = rr
        if not r:
            return _const(0)
        if _in_range(r, bc):  # already in [0, bc)
            return _make(r)
        g = _content(r, bc)  # (g*x + k) % (g*c) == g*((x + k//g) % c) + k % g for 0 <= k
        k = 0
        if g > 1:
            k = r.get((), 0) % g
            r, bc = _scale_down(r, g), bc // g
            if _in_range(r, bc):
                return _make(r) * g + k
        if _has_lift(r, bc):  # (x % d) is congruent to x modulo c when c divides d
            return _mod(_make(_lift(r, bc)), _const(bc)) * g + k
        return _make({((_Opaque(_MOD, (_make(r), _const(bc))), 1),): g}) + k
    # symbolic divisor (assumed non-zero)
    if not a._terms:
        return a
    if _leading_negative(bt):  # a % (-b) == -((-a) % b)
        return -_mod(-a, -b)
    if _exact_multiple(a._terms, bt) is not None:
        return _const(0)
    r = a._terms
    if len(bt) == 1:
        _, r = _split_by_monomial(r, bt)
        if not r:
            return _const(0)
    g = gcd(*r.values(), *bt.values())
    if g > 1:
        r = {m: c // g for m, c in r.items()}
        bt = {m: c // g for m, c in bt.items()}
    return _make({((_Opaque(_MOD, (_make(r), _make(bt))), 1),): g})


def _minmax(kind: int, args: Iterable[int | SymExpr]) -> SymExpr:
    flat: list[SymExpr] = []
    for x in args:
        e = _to_expr(x, f"{_KIND_NAMES[kind]}() argument")
        t = e._terms
        if len(t) == 1:
            ((m, c),) = t.items()
            if c == 1 and len(m) == 1 and m[0][1] == 1:
                atom = m[0][0]
                if isinstance(atom, _Opaque) and atom.kind == kind:
                    flat.extend(atom.args)
                    continue
        flat.append(e)
    if not flat:
        raise SymbolicError(f"{_KIND_NAMES[kind]}() needs at least one argument")
    pick = max if kind == _MAX else min
    # arguments that differ by a constant are comparable: keep the extreme one
    best: dict[SymExpr, int] = {}
    for e in flat:
        t = e._terms
        k = t.get((), 0)
        rest = _make({m: c for m, c in t.items() if m}) if k else e
        best[rest] = pick(best[rest], k) if rest in best else k
    out = [rest + k for rest, k in best.items()]
    if len(out) == 1:
        return out[0]
    out.sort(key=lambda e: _format(e._terms, lone=False))
    return _atom_expr(_Opaque(kind, tuple(out)))


def floordiv(a: int | SymExpr, b: int | SymExpr) -> SymExpr:
    """``a // b`` with Python floor semantics, folded when possible."""
    return _floordiv(_to_expr(a), _to_expr(b))


def ceildiv(a: int | SymExpr, b: int | SymExpr) -> SymExpr:
    """Ceiling of ``a / b``: ``(a + b - 1)//b`` for a positive constant ``b``, else ``-((-a)//b)``."""
    ea, eb = _to_expr(a), _to_expr(b)
    bc = eb.constant_value
    if bc is not None and bc > 0:
        return _floordiv(ea + (bc - 1), eb)
    return -_floordiv(-ea, eb)


def mod(a: int | SymExpr, b: int | SymExpr) -> SymExpr:
    """``a % b`` with Python semantics (the sign of ``b``), folded when possible."""
    return _mod(_to_expr(a), _to_expr(b))


def sym_max(*args: int | SymExpr) -> SymExpr:
    """Maximum, folded over constants and arguments that differ by a constant."""
    return _minmax(_MAX, args)


def sym_min(*args: int | SymExpr) -> SymExpr:
    """Minimum, folded over constants and arguments that differ by a constant."""
    return _minmax(_MIN, args)


def symbol(name: str) -> SymExpr:
    """The symbol called ``name``, verbatim (no parsing)."""
    if not isinstance(name, str):
        raise TypeError(f"symbol name must be a str, got {type(name).__name__}")
    if not name:
        raise SymbolicError("a symbol name cannot be empty")
    return _atom_expr(name)


# --------------------------------------------------------------------------
# Printing
# --------------------------------------------------------------------------

# Names printed bare inside larger expressions: the identifiers the parser reads.
_IDENT = r"[^\W\d][\w.]*(?:-[^\W\d][\w.]*)*"
_IDENT_RE = re.compile(_IDENT)
# A whole dim_param that is a name even though it holds '/' (``encoder/seq``).
_PLAIN_RE = re.compile(r"[^\W\d][\w.]*(?:[-/][^\W\d][\w.]*)*")


def _name_in_compound(name: str) -> str:
    if _IDENT_RE.fullmatch(name):
        return name
    return "`" + name.replace("`", "``") + "`"


def _name_alone(name: str) -> str:
    if _PLAIN_RE.fullmatch(name) or (name.strip() and _try_parse(name) is None):
        return name
    return _name_in_compound(name)


def _degree(m: tuple) -> int:
    return sum(p for _, p in m)


def _format(t: dict, lone: bool) -> str:
    if not t:
        return "0"
    if lone and len(t) == 1:
        ((m, c),) = t.items()
        if c == 1 and len(m) == 1 and m[0][1] == 1 and isinstance(m[0][0], str):
            return _name_alone(m[0][0])
    if len(t) == 1:
        items = list(t.items())
    else:
        items = sorted(t.items(), key=lambda mc: (-_degree(mc[0]), mc[0]))
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
            if atom.kind in (_FLOORDIV, _MOD) and not alone:
                s = f"({s})"
        factors.append(s if p == 1 else f"{s}**{p}")
    return "*".join(factors)


def _operand(e: SymExpr) -> str:
    """An argument of ``//`` or ``%``, parenthesised unless it is a single atom."""
    t = e._terms
    if not t:
        return "0"
    if len(t) == 1:
        ((m, c),) = t.items()
        if not m and c >= 0:
            return str(c)
        if c == 1 and len(m) == 1 and m[0][1] == 1:
            atom = m[0][0]
            if isinstance(atom, str):
                return _name_in_compound(atom)
            if atom.kind in (_MAX, _MIN):
                return atom.text()
    return f"({_format(t, lone=False)})"


# --------------------------------------------------------------------------
# Parsing of dim_param strings
# --------------------------------------------------------------------------

_TOKEN_RE = re.compile(
    r"\s*(?:(?P<num>\d+)|`(?P<quoted>(?:[^`]|``)*)`|(?P<ident>" + _IDENT + r")|(?P<op>\*\*|//|[-+*/%(),]))"
)
_MAX_DEPTH = 100
_MAX_POWER_DEGREE = 64
_MAX_POWER_BITS = 4096


def _check_power(base: SymExpr, k: int) -> None:
    """Refuse powers whose expansion would be unreasonably large."""
    if k <= 1:
        return
    degree = max((_degree(m) for m in base._terms), default=0)
    bits = max((abs(c).bit_length() for c in base._terms.values()), default=0)
    if degree * k > _MAX_POWER_DEGREE or bits * k > _MAX_POWER_BITS:
        raise _ParseFailure("power too large")


class _ParseFailure(Exception):
    """Internal: the text is not arithmetic this parser understands."""


class _Ratio:
    """``num / den`` met while parsing true division (``floor(n/2)``)."""

    __slots__ = ("den", "num")

    def __init__(self, num: SymExpr, den: SymExpr):
        if not den._terms:
            raise _ParseFailure("division by zero")
        self.num = num
        self.den = den


_Value: TypeAlias = "SymExpr | _Ratio"


def _ratio(v: _Value) -> _Ratio:
    return v if isinstance(v, _Ratio) else _Ratio(v, _const(1))


def _exact(v: _Value) -> SymExpr:
    if isinstance(v, SymExpr):
        return v
    if v.den == 1:
        return v.num
    q = _floordiv(v.num, v.den)
    if q * v.den != v.num:
        raise _ParseFailure("inexact true division")
    return q


def _fn_floor(args: list[_Value]) -> SymExpr:
    (x,) = args
    return _floordiv(x.num, x.den) if isinstance(x, _Ratio) else x


def _fn_ceil(args: list[_Value]) -> SymExpr:
    (x,) = args
    return ceildiv(x.num, x.den) if isinstance(x, _Ratio) else x


def _fn_floordiv(args: list[_Value]) -> SymExpr:
    a, b = args
    return _floordiv(_exact(a), _exact(b))


def _fn_ceildiv(args: list[_Value]) -> SymExpr:
    a, b = args
    return ceildiv(_exact(a), _exact(b))


def _fn_truediv(args: list[_Value]) -> _Value:
    a, b = (_ratio(x) for x in args)
    return _Ratio(a.num * b.den, a.den * b.num)


def _fn_mod(args: list[_Value]) -> SymExpr:
    a, b = args
    return _mod(_exact(a), _exact(b))


def _fn_max(args: list[_Value]) -> SymExpr:
    return _minmax(_MAX, [_exact(a) for a in args])


def _fn_min(args: list[_Value]) -> SymExpr:
    return _minmax(_MIN, [_exact(a) for a in args])


# Function names as written by exporters (sympy/torch spellings), lower-cased.
_FUNCTIONS: dict[str, Callable[[list[_Value]], _Value]] = {
    "floor": _fn_floor,
    "floortoint": _fn_floor,
    "ceil": _fn_ceil,
    "ceiling": _fn_ceil,
    "ceiltoint": _fn_ceil,
    "floordiv": _fn_floordiv,
    "truediv": _fn_truediv,
    "inttruediv": _fn_truediv,
    "ceildiv": _fn_ceildiv,
    "mod": _fn_mod,
    "pythonmod": _fn_mod,
    "max": _fn_max,
    "sym_max": _fn_max,
    "min": _fn_min,
    "sym_min": _fn_min,
}


class _Parser:
    """Recursive descent over Python operator precedence.

    expr  := term (('+' | '-') term)*
    term  := unary (('*' | '/' | '//' | '%') unary)*
    unary := ('-' | '+') unary | power
    power := atom ('**' unary)?
    atom  := NUMBER | NAME | `QUOTED` | NAME '(' expr (',' expr)* ')' | '(' expr ')'
    """

    def __init__(self, text: str):
        self.tokens: list[tuple[str, str]] = []
        pos, n = 0, len(text)
        while pos < n:
            mt = _TOKEN_RE.match(text, pos)
            if mt is None:
                if text[pos:].strip():
                    raise _ParseFailure(f"unexpected character at {pos}")
                break
            kind = mt.lastgroup or ""
            value = mt.group(kind)
            if kind == "quoted":
                value = value.replace("``", "`")
            self.tokens.append((kind, value))
            pos = mt.end()
        self.i = 0
        self.depth = 0

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take_op(self, *ops: str) -> str | None:
        tok = self.peek()
        if tok is not None and tok[0] == "op" and tok[1] in ops:
            self.i += 1
            return tok[1]
        return None

    def parse(self) -> SymExpr:
        if not self.tokens:
            raise _ParseFailure("empty")
        v = self.expr()
        if self.i != len(self.tokens):
            raise _ParseFailure("trailing tokens")
        return _exact(v)

    def expr(self) -> _Value:
        self.depth += 1
        if self.depth > _MAX_DEPTH:
            raise _ParseFailure("nesting too deep")
        v = self.term()
        while (op := self.take_op("+", "-")) is not None:
            w = self.term()
            if isinstance(v, SymExpr) and isinstance(w, SymExpr):
                v = v + w if op == "+" else v - w
            else:
                rv, rw = _ratio(v), _ratio(w)
                num = rv.num * rw.den + rw.num * rv.den if op == "+" else rv.num * rw.den - rw.num * rv.den
                v = _Ratio(num, rv.den * rw.den)
        self.depth -= 1
        return v

    def term(self) -> _Value:
        v = self.unary()
        while (op := self.take_op("*", "/", "//", "%")) is not None:
            w = self.unary()
            if op == "*":
                if isinstance(v, SymExpr) and isinstance(w, SymExpr):
                    v = v * w
                else:
                    rv, rw = _ratio(v), _ratio(w)
                    v = _Ratio(rv.num * rw.num, rv.den * rw.den)
            elif op == "/":
                rv, rw = _ratio(v), _ratio(w)
                v = _Ratio(rv.num * rw.den, rv.den * rw.num)
            elif op == "//":
                v = _floordiv(_exact(v), _exact(w))
            else:
                v = _mod(_exact(v), _exact(w))
        return v

    def unary(self) -> _Value:
        self.depth += 1
        if self.depth > _MAX_DEPTH:
            raise _ParseFailure("nesting too deep")
        op = self.take_op("-", "+")
        if op is None:
            v = self.power()
        else:
            v = self.unary()
            if op == "-":
                v = -v if isinstance(v, SymExpr) else _Ratio(-v.num, v.den)
        self.depth -= 1
        return v

    def power(self) -> _Value:
        base = self.atom()
        if self.take_op("**") is None:
            return base
        k = _exact(self.unary()).constant_value
        if k is None or k < 0:
            raise _ParseFailure("exponent must be a non-negative integer")
        if isinstance(base, _Ratio):
            _check_power(base.num, k)
            _check_power(base.den, k)
            return _Ratio(base.num**k, base.den**k)
        _check_power(base, k)
        return base**k

    def atom(self) -> _Value:
        tok = self.peek()
        if tok is None:
            raise _ParseFailure("unexpected end")
        kind, value = tok
        self.i += 1
        if kind == "num":
            return _const(int(value))
        if kind == "quoted":
            if not value:
                raise _ParseFailure("empty quoted name")
            return _atom_expr(value)
        if kind == "ident":
            if self.take_op("(") is None:
                return _atom_expr(value)
            fn = _FUNCTIONS.get(value.lower())
            if fn is None:
                raise _ParseFailure(f"unknown function {value!r}")
            args = [self.expr()]
            while self.take_op(",") is not None:
                args.append(self.expr())
            if self.take_op(")") is None:
                raise _ParseFailure("missing ')'")
            try:
                return fn(args)
            except ValueError as exc:  # wrong number of arguments
                raise _ParseFailure(str(exc)) from exc
        if kind == "op" and value == "(":
            v = self.expr()
            if self.take_op(")") is None:
                raise _ParseFailure("missing ')'")
            return v
        raise _ParseFailure(f"unexpected {value!r}")


def _try_parse(text: str) -> SymExpr | None:
    """Arithmetic in ``text`` as an expression, or ``None`` if it does not parse."""
    try:
        return _Parser(text).parse()
    except (_ParseFailure, SymbolicZeroDivisionError):
        return None


@lru_cache(maxsize=8192)
def parse_dim(text: str) -> SymExpr:
    """Read an ONNX ``dim_param``.

    A plain name (``batch_size``, ``unk__0``, ``encoder/seq``, ``a.b``) is one
    symbol. Arithmetic (``past + seq``, ``2*n``, ``n//2``, ``(a+b)*c``) and the
    functions exporters write (``floor(s0/2)``, ``ceiling(s0/2)``,
    ``Mod(s0, 4)``, ``Max(1, s0)``, ``min``) are parsed. Anything else is kept
    whole as one opaque symbol, never an error. An empty ``dim_param`` carries
    no information and raises :class:`SymbolicError` (see :func:`dim_from_onnx`).
    """
    if not isinstance(text, str):
        raise TypeError(f"dim_param must be a str, got {type(text).__name__}")
    if not text.strip():
        raise SymbolicError("an empty dim_param names no dimension; use dim_from_onnx() to map it to None")
    if _PLAIN_RE.fullmatch(text):
        return _atom_expr(text)
    e = _try_parse(text)
    return _atom_expr(text) if e is None else e


# --------------------------------------------------------------------------
# Dim helpers
# --------------------------------------------------------------------------

Dim: TypeAlias = int | SymExpr | None
"""A tensor dimension: a known size, a symbolic size, or unknown (``None``)."""


def as_dim(x: int | SymExpr | str | None) -> Dim:
    """Normalise a dimension: constant expressions become ``int``, strings are parsed."""
    if x is None:
        return None
    if type(x) is int:
        return x
    if isinstance(x, SymExpr):
        v = x.constant_value
        return x if v is None else v
    if isinstance(x, str):
        return as_dim(parse_dim(x))
    if _is_index(x):
        return operator.index(x)  # type: ignore[arg-type]
    raise TypeError(f"a dimension is an int, SymExpr, str or None, got {type(x).__name__}")


def dim_from_onnx(dim_value: int | None, dim_param: str | None) -> Dim:
    """The :data:`Dim` of an ONNX ``TensorShapeProto.Dimension``.

    Pass ``None`` (or ``""``) for the member of the oneof that is not set;
    neither set (or a blank ``dim_param``) gives ``None``.
    """
    has_param = bool(dim_param and dim_param.strip())
    if dim_value is not None and has_param:
        raise SymbolicError(
            f"a dimension holds either dim_value or dim_param, got both ({dim_value!r}, {dim_param!r})"
        )
    if has_param:
        return as_dim(parse_dim(dim_param))  # type: ignore[arg-type]
    if dim_value is None:
        return None
    return operator.index(dim_value)


def dim_to_onnx(d: Dim) -> tuple[int | None, str | None]:
    """``(dim_value, dim_param)`` for a dimension; at most one is not ``None``."""
    d = as_dim(d)
    if d is None:
        return (None, None)
    if isinstance(d, int):
        return (d, None)
    return (None, str(d))


def dims_equal(a: Dim, b: Dim) -> bool | None:
    """True if provably equal, False if provably different, None if unknown.

    Two dimensions are provably different when they differ by a non-zero
    constant (``3`` vs ``4``, ``n`` vs ``n + 1``).
    """
    if a is None or b is None:
        return None
    if type(a) is int and type(b) is int:
        return a == b
    diff = _to_expr(a, "dimension") - _to_expr(b, "dimension")  # type: ignore[arg-type]
    v = diff.constant_value
    if v is None:
        return None
    return v == 0


def product(dims: Iterable[Dim]) -> Dim:
    """Product of dimensions: ``int`` when constant, ``None`` if any is unknown."""
    acc_int = 1
    acc: SymExpr | None = None
    for d in dims:
        if d is None:
            return None
        if type(d) is int:
            acc_int *= d
        else:
            e = _to_expr(d, "dimension")
            acc = e if acc is None else acc * e
    if acc is None:
        return acc_int
    return as_dim(acc * acc_int)


def sum_dims(dims: Iterable[Dim]) -> Dim:
    """Sum of dimensions: ``int`` when constant, ``None`` if any is unknown."""
    acc_int = 0
    acc: SymExpr | None = None
    for d in dims:
        if d is None:
            return None
        if type(d) is int:
            acc_int += d
        else:
            e = _to_expr(d, "dimension")
            acc = e if acc is None else acc + e
    if acc is None:
        return acc_int
    return as_dim(acc + acc_int)
