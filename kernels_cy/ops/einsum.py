"""Einsum: numpy.einsum on an equation validated at plan time against ONNX's grammar
(letters, ``...``, ``,``, an optional ``->`` output), and at run time against the
operands' ranks and dimensions, so a malformed equation is a typed error, not a numpy
exception."""
from __future__ import annotations

import re

import numpy as np

from onnxforge.kernels_cy.ops.base import Kernel, NodeSpec, register

__all__ = ["parse_equation"]

_TERM = re.compile(r"^[A-Za-z]*(\.\.\.)?[A-Za-z]*$")


def parse_equation(equation: str) -> tuple[list[str], str | None]:
    """The input terms and the output term (None when implicit) of ``equation``, spaces
    removed; raises ValueError naming what is malformed."""
    eq = equation.replace(" ", "")
    if eq.count("->") > 1:
        raise ValueError("more than one '->'")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    for t in terms + ([rhs] if arrow else []):
        if not _TERM.match(t):
            raise ValueError(f"term {t!r} is not letters with at most one '...'")
    if arrow:
        letters = rhs.replace("...", "")
        if len(set(letters)) != len(letters):
            raise ValueError(f"the output {rhs!r} repeats a letter")
        known = set("".join(terms))
        missing = sorted(set(letters) - known)
        if missing:
            raise ValueError(f"the output names {missing} that no input has")
        if "..." in rhs and not any("..." in t for t in terms):
            raise ValueError("the output has '...' but no input has")
    return terms, (rhs if arrow else None)


@register("", "Einsum")
class Einsum(Kernel):
    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        eq = spec.string("equation")
        if eq is None:
            raise spec.fail("attribute 'equation' is required")
        try:
            self.terms, self.out = parse_equation(eq)
        except ValueError as err:
            raise spec.fail(f"equation {eq!r} is malformed: {err}") from None
        if len(self.terms) != spec.n_inputs:
            raise spec.fail(f"equation {eq!r} has {len(self.terms)} input terms for {spec.n_inputs} inputs")
        self.equation = eq.replace(" ", "")

    def _check(self, xs: tuple) -> None:
        dims: dict[str, int] = {}
        for i, (t, x) in enumerate(zip(self.terms, xs)):
            letters = t.replace("...", "")
            if ("..." in t and x.ndim < len(letters)) or ("..." not in t and x.ndim != len(letters)):
                raise self.error(f"input {i} of shape {x.shape} does not fit the term {t!r}")
            head, _, tail = t.partition("...")
            sizes = list(zip(head, x.shape[:len(head)])) + list(zip(tail, x.shape[x.ndim - len(tail):] if tail else ()))
            for c, d in sizes:
                if dims.setdefault(c, d) != d and d != 1 and dims[c] != 1:
                    raise self.error(f"index {c!r} has sizes {dims[c]} and {d}")

    def run(self, *xs):
        self._check(xs)
        dt = xs[0].dtype
        wide = dt.kind == "V" or (dt.kind == "f" and dt.itemsize < 4)
        ops = [x.astype(np.float32) for x in xs] if wide else xs
        try:
            y = np.einsum(self.equation, *ops, optimize=len(ops) > 2)
        except ValueError as err:
            raise self.error(f"Einsum {self.equation!r}: {err}") from None
        y = np.asarray(y)
        if any(np.may_share_memory(y, x) for x in ops):  # a transpose or diagonal is a view
            y = y.copy()
        return y.astype(dt, copy=False)
