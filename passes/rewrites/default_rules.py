"""The default algebraic rules, :data:`DEFAULT_RULES`: rewrites as data.

One :class:`~onnxforge.passes.rewrites.patterns.RuleTable` of (pattern -> replacement)
pairs, each commented with its algebra and exact (bit for bit) under its stated
condition: identities (``x * 1``, ``x + -0.0``, ``And(x, True)``), idempotent and
involutive operators, composed transposes and reshapes, no-op casts, slices, pads,
expands and tiles, cancelling squeezes and unsqueezes. The ``rewrite`` pass
(:class:`~onnxforge.passes.rewrites.engine.RewritePass`) applies them; a new rule
is one line of the table and a replacement function of the
:class:`~onnxforge.passes.rewrites.patterns.Match`, with a test.

Element types, ranks and static shapes come from
:mod:`onnxforge.passes.analyses.stated_types` first (what the graph states), and
from the ``shapes`` analysis only when that is not enough.

Before / after::

    a = Transpose(x, perm=[1, 0])
    b = Transpose(a, perm=[1, 0])           y = Neg(x)
    c = Mul(b, one)      # one = 1.0
    m = Max(c, c)
    y = Neg(m)
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from onnxforge.proto_ext.errors import OnnxforgeError
from onnxforge.graphbuilder.ir.core import Node, Value
from onnxforge.graphbuilder.ir.tensors import onnx_dtype
from onnxforge.passes.analyses.stated_types import stated_dims, stated_elem_type
from onnxforge.passes.rewrites.patterns import Const, Match, Pattern, Replacement, Rule, RuleTable
from onnxforge.proto_ext.types import TensorType

__all__ = ["DEFAULT_RULES"]


def _all(value: float) -> Callable[[np.ndarray], bool]:
    def test(a: np.ndarray) -> bool:
        return a.dtype.kind in "biuf" and a.size > 0 and bool(np.all(a == value))
    return test


def _zero_for_add(a: np.ndarray) -> bool:
    # x + (-0.0) == x for every float x (also -0.0); x + (+0.0) turns -0.0 into +0.0.
    if a.dtype.kind in "iu":
        return a.size > 0 and not a.any()
    return a.dtype.kind == "f" and a.size > 0 and bool(np.all((a == 0) & np.signbit(a)))


def _zero_for_sub(a: np.ndarray) -> bool:
    # x - (+0.0) == x for every float x; x - (-0.0) turns -0.0 into +0.0.
    if a.dtype.kind in "iu":
        return a.size > 0 and not a.any()
    return a.dtype.kind == "f" and a.size > 0 and bool(np.all((a == 0) & ~np.signbit(a)))


def _static_shape(v: Value) -> tuple[int, ...] | None:
    t = v.type
    if isinstance(t, TensorType) and t.shape is not None and all(type(d) is int for d in t.shape):
        return tuple(t.shape)
    return None


def _rank(v: Value) -> int | None:
    t = v.type
    return len(t.shape) if isinstance(t, TensorType) and t.shape is not None else None


def _broadcast_keeps(x: Value, c: np.ndarray) -> bool:
    """Broadcasting constant ``c`` against ``x`` leaves ``x``'s shape and type unchanged."""
    t = x.type
    if isinstance(t, TensorType):
        try:
            if onnx_dtype(c.dtype) != t.elem_type:
                return False
        except (ValueError, TypeError, KeyError, OnnxforgeError):
            return False
    if c.ndim == 0:
        return True
    if not isinstance(t, TensorType) or t.shape is None or len(t.shape) < c.ndim:
        return False
    for cd, xd in zip(reversed(c.shape), reversed(t.shape)):
        if cd != 1 and not (type(xd) is int and xd == cd):
            return False
    return True


def _identity_if_keeps(cap: str, const: str) -> Replacement:
    def replace(m: Match) -> Value | None:
        return m[cap] if _broadcast_keeps(m[cap], m.const(const)) else None
    replace.__name__ = f"keep_{cap}"
    return replace


def _same(m: Match) -> Value:
    return m["x"]


def _perm(node: Node, x: Value) -> list[int] | None:
    perm = node.attr("perm")
    if perm is not None:
        return [int(p) for p in perm]
    r = _rank(x)
    return None if r is None else list(range(r - 1, -1, -1))


def _compose_transposes(m: Match) -> Value | None:
    inner, outer = m.node("inner"), m.root
    p = _perm(inner, m["x"])
    if p is None:
        return None
    q = _perm(outer, inner.outputs[0])
    if q is None or len(p) != len(q):
        return None
    r = [p[i] for i in q]
    if r == list(range(len(r))):
        return m["x"]
    return m.op.Transpose(m["x"], perm=r)


def _no_copy_zeros(m: Match) -> bool:
    return m.root.attr("allowzero", 0) == 1 or not bool(np.any(m.const("b") == 0))


def _collapse_reshapes(m: Match) -> Value | None:
    if not _no_copy_zeros(m):
        return None
    allowzero = m.root.attr("allowzero")
    return m.op.Reshape(m["x"], m["b"], allowzero=allowzero)


def _reshape_noop(m: Match) -> Value | None:
    shape = _static_shape(m["x"])
    if shape is None:
        return None
    target = [int(d) for d in m.const("s").reshape(-1)]
    if len(target) != len(shape):
        return None
    zero_copies = m.root.attr("allowzero", 0) != 1
    known = [shape[i] if (d == 0 and zero_copies) else d for i, d in enumerate(target)]
    if known.count(-1) == 1:
        rest = [d for d in known if d != -1]
        if all(d > 0 for d in rest) and all(d > 0 for d in shape):
            total = int(np.prod(shape))
            known[known.index(-1)] = total // int(np.prod(rest)) if rest else total
    return m["x"] if tuple(known) == shape else None


def _cast_noop(m: Match) -> Value | None:
    t = m["x"].type
    if isinstance(t, TensorType) and t.elem_type == m.root.attr("to"):
        return m["x"]
    return None


def _axes_of(node: Node, const: np.ndarray | None) -> list[int] | None:
    if const is not None:
        return [int(a) for a in const.reshape(-1)]
    got = node.attr("axes")
    return None if got is None else [int(a) for a in got]


def _squeeze_unsqueeze(m: Match) -> Value | None:
    inner = m.node("inner")
    a = _axes_of(inner, m.consts.get("a"))
    b = _axes_of(m.root, m.consts.get("b"))
    return m["x"] if a is not None and a == b else None


def _cast_noop_typed(m: Match) -> Value | None:
    # the element type the producers fix, when they do: no shape inference needed
    et = stated_elem_type(m["x"])
    if et is None:
        t = m.type_of(m["x"])
        et = t.elem_type if isinstance(t, TensorType) else None
    return m["x"] if et is not None and et == m.root.attr("to") else None


def _unsqueeze_squeeze(m: Match) -> Value | None:
    # Squeeze(x, a) drops dims a of x (each 1); Unsqueeze(., a) puts them back where they
    # were: both normalize a against rank(x), so equal lists restore x exactly.
    a = _axes_of(m.node("inner"), m.consts.get("a"))
    b = _axes_of(m.root, m.consts.get("b"))
    return m["x"] if a and a == b else None


def _merged_unsqueeze_axes(m: Match) -> list[int] | None:
    """Unsqueeze(Unsqueeze(x, a), b) == Unsqueeze(x, c): the outer axes b are final
    positions; inner axis i (counted in the middle rank) is the i-th final position
    that b leaves free; c is both, sorted."""
    a = _axes_of(m.node("inner"), m.consts.get("a"))
    b = _axes_of(m.root, m.consts.get("b"))
    if not a or not b:
        return None
    if any(v < 0 for v in a + b):
        r0 = m.rank_of(m["x"])
        if r0 is None:
            return None
        r1 = r0 + len(a)
        a = [v + r1 if v < 0 else v for v in a]
        b = [v + r1 + len(b) if v < 0 else v for v in b]
    if len(set(a)) != len(a) or len(set(b)) != len(b):
        return None
    taken = set(b)
    free: list[int] = []
    pos = 0
    need = max(a) + 1
    while len(free) < need:
        if pos not in taken:
            free.append(pos)
        pos += 1
    return sorted(taken | {free[i] for i in a})


def _merge_unsqueezes(m: Match) -> Value | None:
    c = _merged_unsqueeze_axes(m)
    if c is None:
        return None
    return m.op.Unsqueeze(m["x"], m.constant(np.array(c, np.int64)))


def _merge_unsqueezes_attr(m: Match) -> Value | None:
    c = _merged_unsqueeze_axes(m)
    return None if c is None else m.op.Unsqueeze(m["x"], axes=c)


def _transpose_identity(m: Match) -> Value | None:
    perm = m.root.attr("perm")
    if perm is None:  # the default reverses the dims: the identity only up to rank 1
        r = m.rank_of(m["x"])
        return m["x"] if r is not None and r <= 1 else None
    return m["x"] if [int(p) for p in perm] == list(range(len(perm))) else None


_BIG = 1 << 31  # ends at or past this are "to the end" for any dimension a tensor can have


def _slice_noop_axes(m: Match, starts: np.ndarray, ends: np.ndarray, axes: np.ndarray | None,
                     steps: np.ndarray | None) -> Value | None:
    """Slice(x, starts, ends, axes, steps) -> x when every sliced axis keeps [0, dim)
    with step 1: start 0 (or <= -dim), end >= dim."""
    x = m["x"]
    st = [int(v) for v in starts.reshape(-1)]
    en = [int(v) for v in ends.reshape(-1)]
    if len(st) != len(en):
        return None
    ax = list(range(len(st))) if axes is None else [int(v) for v in axes.reshape(-1)]
    sp = [1] * len(st) if steps is None else [int(v) for v in steps.reshape(-1)]
    if len(ax) != len(st) or len(sp) != len(st) or any(v != 1 for v in sp) or any(s > 0 for s in st):
        return None  # a start past 0 drops elements of any dimension: no shape needed to say so
    # the dims the graph states (a shape vector's length, a Conv's channels...) when they
    # give every sliced axis; where they do, inference gives the same
    shape: tuple[Any, ...] | None = stated_dims(x)
    if shape is None or any(not -len(shape) <= a < len(shape) or shape[a] is None for a in ax):
        shape = m.shape_of(x)
    for a, s, e in zip(ax, st, en):
        dim = None
        if shape is not None:
            if not -len(shape) <= a < len(shape):
                return None
            d = shape[a]
            dim = d if type(d) is int else None
        elif a < 0:
            return None
        start_ok = s == 0 or (dim is not None and s <= -dim)
        end_ok = e >= _BIG or (dim is not None and e >= dim)
        if not (start_ok and end_ok):
            return None
    return x


def _slice_noop(m: Match) -> Value | None:
    return _slice_noop_axes(m, m.const("s"), m.const("e"), m.consts.get("a"), m.consts.get("p"))


def _slice_noop_attr(m: Match) -> Value | None:
    st, en, ax = m.root.attr("starts"), m.root.attr("ends"), m.root.attr("axes")
    if st is None or en is None:
        return None
    return _slice_noop_axes(m, np.array(st), np.array(en), None if ax is None else np.array(ax), None)


def _pad_noop(m: Match) -> Value | None:
    pads = m.consts["p"] if "p" in m.consts else (
        np.array(m.root.attr("pads")) if m.root.attr("pads") is not None else None)
    return m["x"] if pads is not None and pads.size > 0 and not pads.any() else None


def _expand_noop(m: Match) -> Value | None:
    # Expand(x, s) has shape broadcast(shape(x), s): x itself when s has no more dims than x
    # and each of its dims is 1 or x's (static) dim.
    shape = m.shape_of(m["x"])
    s = [int(d) for d in m.const("s").reshape(-1)]
    if shape is None or len(s) > len(shape):
        return None
    for d, xd in zip(reversed(s), reversed(shape)):
        if d != 1 and not (type(xd) is int and xd == d):
            return None
    return m["x"]


def _tile_noop(m: Match) -> Value | None:
    r = m.const("r")
    return m["x"] if r.size > 0 and bool(np.all(r == 1)) else None


def _bool_identity(value: bool) -> Callable[[np.ndarray], bool]:
    def test(a: np.ndarray) -> bool:
        return a.dtype == np.bool_ and a.size > 0 and bool(np.all(a == value))
    return test


def _rules() -> RuleTable:
    one, zero = _all(1), _zero_for_add
    rules = [
        # x * 1 -> x
        Rule(Pattern("Mul", "x", Const("c", one)), _identity_if_keeps("x", "c"), "mul_by_one"),
        # 1 * x -> x
        Rule(Pattern("Mul", Const("c", one), "x"), _identity_if_keeps("x", "c"), "one_mul"),
        # x / 1 -> x
        Rule(Pattern("Div", "x", Const("c", one)), _identity_if_keeps("x", "c"), "div_by_one"),
        # x + 0 -> x  (integers; floats only for -0.0, the additive identity of IEEE 754)
        Rule(Pattern("Add", "x", Const("c", zero)), _identity_if_keeps("x", "c"), "add_zero"),
        # 0 + x -> x  (same condition)
        Rule(Pattern("Add", Const("c", zero), "x"), _identity_if_keeps("x", "c"), "zero_add"),
        # x - 0 -> x  (integers; floats only for +0.0)
        Rule(Pattern("Sub", "x", Const("c", _zero_for_sub)), _identity_if_keeps("x", "c"), "sub_zero"),
        # Max(x, x) -> x ; Min(x, x) -> x  (idempotent)
        Rule(Pattern("Max", "x", "x"), _same, "max_idempotent"),
        Rule(Pattern("Min", "x", "x"), _same, "min_idempotent"),
        # And(x, x) -> x ; Or(x, x) -> x  (idempotent)
        Rule(Pattern("And", "x", "x"), _same, "and_idempotent"),
        Rule(Pattern("Or", "x", "x"), _same, "or_idempotent"),
        # Neg(Neg(x)) -> x ; Not(Not(x)) -> x  (involutions)
        Rule(Pattern("Neg", Pattern("Neg", "x")), _same, "double_neg"),
        Rule(Pattern("Not", Pattern("Not", "x")), _same, "double_not"),
        # Transpose(Transpose(x, p), q) -> Transpose(x, p∘q), with (p∘q)[i] = p[q[i]];
        # -> x when p∘q is the identity permutation
        Rule(Pattern("Transpose", Pattern("Transpose", "x", name="inner")), _compose_transposes,
             "compose_transposes"),
        # Reshape(Reshape(x, a), b) -> Reshape(x, b)  (b constant, no 0 that copies a dim of a)
        Rule(Pattern("Reshape", Pattern("Reshape", "x", "a"), Const("b")), _collapse_reshapes,
             "collapse_reshapes"),
        # Reshape(x, s) -> x  when the static shape of x already is s
        Rule(Pattern("Reshape", "x", Const("s")), _reshape_noop, "reshape_noop"),
        # Cast(x, T) with x already T -> x
        Rule(Pattern("Cast", "x"), _cast_noop, "cast_noop"),
        # Squeeze(Unsqueeze(x, a), a) -> x  (opset >= 13: axes are inputs)
        Rule(Pattern("Squeeze", Pattern("Unsqueeze", "x", Const("a"), name="inner"), Const("b")),
             _squeeze_unsqueeze, "squeeze_unsqueeze"),
        # Squeeze(Unsqueeze(x, axes=a), axes=a) -> x  (opset < 13: axes are attributes)
        Rule(Pattern("Squeeze", Pattern("Unsqueeze", "x", name="inner")), _squeeze_unsqueeze,
             "squeeze_unsqueeze_attr"),
        # Concat(x) -> x  (a single input)
        Rule(Pattern("Concat", "x"), _same, "concat_single"),
        # Cast(x, T) with x inferred to be T already -> x
        Rule(Pattern("Cast", "x"), _cast_noop_typed, "cast_noop_inferred"),
        # Unsqueeze(Squeeze(x, a), a) -> x  (opset >= 13)
        Rule(Pattern("Unsqueeze", Pattern("Squeeze", "x", Const("a"), name="inner"), Const("b")),
             _unsqueeze_squeeze, "unsqueeze_squeeze"),
        # Unsqueeze(Squeeze(x, axes=a), axes=a) -> x  (opset < 13)
        Rule(Pattern("Unsqueeze", Pattern("Squeeze", "x", name="inner")), _unsqueeze_squeeze,
             "unsqueeze_squeeze_attr"),
        # Unsqueeze(Unsqueeze(x, a), b) -> Unsqueeze(x, b ∪ free_b(a))  (opset >= 13)
        Rule(Pattern("Unsqueeze", Pattern("Unsqueeze", "x", Const("a"), name="inner"), Const("b")),
             _merge_unsqueezes, "merge_unsqueezes"),
        # same, axes as attributes (opset < 13)
        Rule(Pattern("Unsqueeze", Pattern("Unsqueeze", "x", name="inner")), _merge_unsqueezes_attr,
             "merge_unsqueezes_attr"),
        # Transpose(x, perm=[0, 1, ..., r-1]) -> x
        Rule(Pattern("Transpose", "x"), _transpose_identity, "transpose_identity"),
        # And(True, x) -> x ; And(x, True) -> x ; Or(False, x) -> x ; Or(x, False) -> x
        # (identity elements; the constant must not broadcast x to a larger shape)
        Rule(Pattern("And", Const("c", _bool_identity(True)), "x"), _identity_if_keeps("x", "c"),
             "true_and"),
        Rule(Pattern("And", "x", Const("c", _bool_identity(True))), _identity_if_keeps("x", "c"),
             "and_true"),
        Rule(Pattern("Or", Const("c", _bool_identity(False)), "x"), _identity_if_keeps("x", "c"),
             "false_or"),
        Rule(Pattern("Or", "x", Const("c", _bool_identity(False))), _identity_if_keeps("x", "c"),
             "or_false"),
        # Slice(x, 0, >= dim) on every sliced axis, step 1 -> x  (inputs: opset >= 10)
        Rule(Pattern("Slice", "x", Const("s"), Const("e")), _slice_noop, "slice_full"),
        Rule(Pattern("Slice", "x", Const("s"), Const("e"), Const("a")), _slice_noop, "slice_full_axes"),
        Rule(Pattern("Slice", "x", Const("s"), Const("e"), Const("a"), Const("p")), _slice_noop,
             "slice_full_steps"),
        # same, starts/ends/axes as attributes (opset < 10)
        Rule(Pattern("Slice", "x"), _slice_noop_attr, "slice_full_attr"),
        # Pad(x, pads = 0...) -> x  (any mode: nothing is added)
        Rule(Pattern("Pad", "x", Const("p")), _pad_noop, "pad_zero"),
        Rule(Pattern("Pad", "x", Const("p"), "v"), _pad_noop, "pad_zero_value"),
        Rule(Pattern("Pad", "x", Const("p"), None), _pad_noop, "pad_zero_no_value"),
        Rule(Pattern("Pad", "x", Const("p"), "v", "a"), _pad_noop, "pad_zero_axes"),
        Rule(Pattern("Pad", "x", Const("p"), None, "a"), _pad_noop, "pad_zero_axes_no_value"),
        Rule(Pattern("Pad", "x"), _pad_noop, "pad_zero_attr"),
        # Expand(x, s) -> x  when broadcasting shape(x) with s gives shape(x)
        Rule(Pattern("Expand", "x", Const("s")), _expand_noop, "expand_noop"),
        # Tile(x, [1, ..., 1]) -> x
        Rule(Pattern("Tile", "x", Const("r")), _tile_noop, "tile_ones"),
    ]
    return RuleTable(rules)


DEFAULT_RULES: RuleTable = _rules()
"""The default algebraic rules; each is exact (bit for bit) under its stated condition."""
