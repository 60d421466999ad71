"""The symbolic dimension algebra: integer polynomials over named symbols.

The public names live in :mod:`onnxforge.graphbuilder.shapes.symbolic`; this module
holds :class:`SymExpr`, its arithmetic and the folding rules. The term
representation and the text form are :mod:`~onnxforge.graphbuilder.shapes.symterms`,
the reader of ``dim_param`` strings :mod:`~onnxforge.graphbuilder.shapes.symparse`.

Opaque atoms stand for ``a//b``, ``a % b``, ``max(...)`` and ``min(...)``; the
folding functions bring them to a canonical shape before they are built::

    (2*n)//2          -> n
    (4*n + 8)//4      -> n + 2
    (4*b*p + 4*b*s)//(p + s) -> 4*b   exact polynomial quotient
    (n - 1)//2 + 1    -> (n + 1)//2        constants reduced into [0, divisor)
    (2*n + 2)//4      -> (n + 1)//2        common factor removed
    (n//2)//3         -> n//6
    n % 1             -> 0
    (2*n + 5) % 2     -> 1
    (n % 8) % 4       -> n % 4
    max(n, n + 1, 3)  -> max(3, n + 1)
"""
from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping
from functools import lru_cache
from math import gcd

from onnxforge.graphbuilder.shapes.symterms import (
    FLOORDIV,
    KIND_NAMES,
    MAX,
    MIN,
    MOD,
    Opaque,
    add_into,
    format_terms,
    mul_terms,
    pow_terms,
    unit_atom,
)
from onnxforge.proto_ext.errors import OnnxforgeError

__all__ = [
    "SymExpr",
    "SymbolicError",
    "SymbolicZeroDivisionError",
    "UnboundSymbolError",
    "ceildiv",
    "floordiv",
    "mod",
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
# Expressions (representation: see symterms)
# --------------------------------------------------------------------------

_set = object.__setattr__
_new = object.__new__


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


def _constant_of(t: dict) -> int | None:
    """The value of constant terms, else ``None``."""
    if not t:
        return 0
    if len(t) == 1 and () in t:
        return t[()]
    return None


class SymExpr:
    """Immutable, hashable integer polynomial over named symbols and opaque atoms.

    ``SymExpr(3)`` is the constant 3, ``SymExpr("n")`` the symbol named ``n``
    (the name is taken verbatim; use :func:`~onnxforge.graphbuilder.shapes.symbolic.parse_dim`
    to read arithmetic). Arithmetic with ``int`` and ``SymExpr`` operands:
    ``+ - * ** // %`` and unary ``-``; ``//`` and ``%`` follow Python floor
    semantics. A constant expression compares and hashes equal to its ``int``.
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
        return _constant_of(self._terms)

    @property
    def symbol_name(self) -> str | None:
        """The name when the expression is exactly one symbol, else ``None``."""
        atom = unit_atom(self._terms)
        return atom if isinstance(atom, str) else None

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
            v = _constant_of(t)
            h = hash(v) if v is not None else hash(frozenset(t.items()))
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
        add_into(t, o._terms)
        return _make(t)

    __radd__ = __add__

    def __sub__(self, other: int | SymExpr) -> SymExpr:
        if type(other) is int:
            return self.__add__(-other)
        o = _coerce(other)
        if o is None:
            return NotImplemented
        t = dict(self._terms)
        add_into(t, o._terms, -1)
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
        return _make(mul_terms(self._terms, o._terms))

    __rmul__ = __mul__

    def __pow__(self, exponent: int) -> SymExpr:
        if not _is_index(exponent):
            return NotImplemented
        k = operator.index(exponent)
        if k < 0:
            raise SymbolicError(f"negative exponent {k} is outside the integer polynomial algebra")
        return _make(pow_terms(self._terms, k))

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
                    term = mul_terms(term, pow_terms(r, p))
            if kept:
                term = mul_terms(term, {tuple(kept): 1})
            add_into(out, term)
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
                    x = operator.index(env[atom]) if isinstance(atom, str) else _eval_atom(atom, env)
                    cache[atom] = x
                v *= x**p
            total += v
        return total

    # ---- printing --------------------------------------------------------

    def __str__(self) -> str:
        return format_terms(self._terms, lone=True)

    def __repr__(self) -> str:
        return f"SymExpr({str(self)!r})"


def _from_items(items: tuple) -> SymExpr:
    return _make(dict(items))


def _eval_atom(atom: Opaque, env: Mapping[str, int]) -> int:
    vals = [a._eval(env) for a in atom.args]
    if atom.kind == MAX:
        return max(vals)
    if atom.kind == MIN:
        return min(vals)
    if vals[1] == 0:
        raise SymbolicZeroDivisionError(f"division by zero while evaluating {atom.text()!r}")
    return vals[0] // vals[1] if atom.kind == FLOORDIV else vals[0] % vals[1]


def _rebuild(atom: Opaque, args: list[SymExpr]) -> SymExpr:
    """The atom's operation applied (and folded) to new arguments."""
    if atom.kind == FLOORDIV:
        return _floordiv(args[0], args[1])
    if atom.kind == MOD:
        return _mod(args[0], args[1])
    return _minmax(atom.kind, args)


def _subst_atom(atom: object, mapping: Mapping[str, int | SymExpr]) -> dict | None:
    """Terms replacing ``atom``, or ``None`` when the atom is unchanged."""
    if isinstance(atom, str):
        if atom not in mapping:
            return None
        return _to_expr(mapping[atom], f"substitution for {atom!r}")._terms
    args = [a.substitute(mapping) for a in atom.args]  # type: ignore[attr-defined]
    if all(n is o for n, o in zip(args, atom.args)):  # type: ignore[attr-defined]
        return None
    return _rebuild(atom, args)._terms  # type: ignore[arg-type]


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
        if not isinstance(atom, Opaque) or atom.kind != MOD:
            return False
        d = atom.args[1].constant_value
        if d is None or d <= 0:
            return False
        hi += c * (d - 1)
    return hi < bound


_MAX_DIVISION_STEPS = 256


def _exact_quotient(a: dict, b: dict) -> dict | None:
    """``q`` with ``a == q*b`` and integer coefficients, else ``None``.

    Multivariate division by one polynomial under the graded lexicographic order:
    the remainder is zero exactly when ``b`` divides ``a``, so the division stops
    as soon as the leading term of ``b`` fails to divide the remainder's::

        (4*b*p + 4*b*s) / (p + s)   -> 4*b
        (n**2 - 1) / (n + 1)        -> n - 1
        (n**2 + 1) / (n + 1)        -> None
    """
    atoms = sorted({x for t in (a, b) for m in t for x, _ in m})
    index = {x: i for i, x in enumerate(atoms)}

    def key(m: tuple) -> tuple[int, list[int]]:
        v = [0] * len(atoms)
        for x, p in m:
            v[index[x]] = p
        return (sum(v), v)

    lead_b = max(b, key=key)
    coef_b = b[lead_b]
    r = dict(a)
    q: dict = {}
    for _ in range(_MAX_DIVISION_STEPS):
        if not r:
            return q
        lead_r = max(r, key=key)
        c, rem = divmod(r[lead_r], coef_b)
        m = _mono_div(lead_r, lead_b)
        if rem or m is None:
            return None
        add_into(q, {m: c})
        add_into(r, mul_terms({m: c}, b), -1)
    return None


def _symbolic_division(kind: int, a: SymExpr, b: SymExpr) -> tuple[dict, SymExpr, int]:
    """``a // b`` or ``a % b`` for a divisor with a symbol (assumed non-zero), as
    ``(q, atom, g)``: the result is ``q + atom`` for floor division and ``g*atom``
    for modulo, ``b`` having a positive leading term. An exact multiple gives the
    constant quotient in ``q`` and ``atom`` zero."""
    bt = b._terms
    k = _exact_multiple(a._terms, bt)
    if k is not None:
        return ({(): k} if k else {}), _const(0), 1
    exact = _exact_quotient(a._terms, bt)
    if exact is not None:
        return exact, _const(0), 1
    q: dict = {}
    r = a._terms
    if len(bt) == 1:
        q, r = _split_by_monomial(r, bt)
        if not r:
            return q, _const(0), 1
    g = gcd(*r.values(), *bt.values())
    if g > 1:
        r = {m: c // g for m, c in r.items()}
        bt = {m: c // g for m, c in bt.items()}
    return q, _atom_expr(Opaque(kind, (_make(r), _make(bt)))), g


@lru_cache(maxsize=8192)
def _floordiv(a: SymExpr, b: SymExpr) -> SymExpr:
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
        q[((Opaque(FLOORDIV, (_make(r), _const(bc))), 1),)] = 1
        return _make(q)
    # symbolic divisor (assumed non-zero)
    if not a._terms:
        return a
    if _leading_negative(b._terms):  # a//(-b) == (-a)//b
        a, b = -a, -b
    q, quotient_atom, _ = _symbolic_division(FLOORDIV, a, b)
    return _make(q) + quotient_atom


def _content(r: dict, c: int) -> int:
    """gcd of ``c`` and the non-constant coefficients of ``r``."""
    return gcd(c, *(v for m, v in r.items() if m))


def _scale_down(r: dict, g: int) -> dict:
    """``r // g`` term by term (exact except for the constant term, which is floored)."""
    return {m: v // g for m, v in r.items() if v // g}


def _unit_floordiv(r: dict) -> tuple[Opaque, int] | None:
    """The first ``x//d`` atom (constant ``d``) standing alone with coefficient 1 in ``r``."""
    for m, c in r.items():
        if c == 1 and len(m) == 1 and m[0][1] == 1:
            atom = m[0][0]
            if isinstance(atom, Opaque) and atom.kind == FLOORDIV:
                d = atom.args[1].constant_value
                if d is not None and d > 0:
                    return atom, d
    return None


def _liftable(atom: object, c: int) -> bool:
    if isinstance(atom, Opaque) and atom.kind == MOD:
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
            term = mul_terms(term, pow_terms(base, p))
        add_into(out, term)
    return out


@lru_cache(maxsize=8192)
def _mod(a: SymExpr, b: SymExpr) -> SymExpr:
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
        return _make({((Opaque(MOD, (_make(r), _const(bc))), 1),): g}) + k
    # symbolic divisor (assumed non-zero)
    if not a._terms:
        return a
    if _leading_negative(b._terms):  # a % (-b) == -((-a) % b)
        return -_mod(-a, -b)
    _, atom, g = _symbolic_division(MOD, a, b)
    return atom * g


def _minmax(kind: int, args: Iterable[int | SymExpr]) -> SymExpr:
    flat: list[SymExpr] = []
    for x in args:
        e = _to_expr(x, f"{KIND_NAMES[kind]}() argument")
        atom = unit_atom(e._terms)
        if isinstance(atom, Opaque) and atom.kind == kind:
            flat.extend(atom.args)
        else:
            flat.append(e)
    if not flat:
        raise SymbolicError(f"{KIND_NAMES[kind]}() needs at least one argument")
    pick = max if kind == MAX else min
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
    out.sort(key=lambda e: format_terms(e._terms, lone=False))
    return _atom_expr(Opaque(kind, tuple(out)))


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
    return _minmax(MAX, args)


def sym_min(*args: int | SymExpr) -> SymExpr:
    """Minimum, folded over constants and arguments that differ by a constant."""
    return _minmax(MIN, args)


def symbol(name: str) -> SymExpr:
    """The symbol called ``name``, verbatim (no parsing)."""
    if not isinstance(name, str):
        raise TypeError(f"symbol name must be a str, got {type(name).__name__}")
    if not name:
        raise SymbolicError("a symbol name cannot be empty")
    return _atom_expr(name)
