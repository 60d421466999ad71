"""Complementary Slices become one ``Split``; a Slice of a Slice becomes one Slice.

Unit-step Slices of one value along one static axis that cover it exactly, in
pieces, are replaced by one ``Split`` of that value (its sizes the pieces' lengths,
in order); a Slice whose input is another Slice, read by it alone, on other axes,
becomes one Slice with both sets of parameters. Bounds must be constants (the
first constant folding has made them so); the axis's dimension comes from what
the graph states (:mod:`onnxforge.passes.analyses.stated_types`) or else the
``shapes`` analysis, asked only of candidates.

Before / after (``t: [b, 4, s, 32]``)::

    lo = Slice(t, [0], [16], [3])         lo, hi = Split(t, [16, 16], axis=3)
    hi = Slice(t, [16], [INT64_MAX], [3])

    u = Slice(t, [0], [2], [1])           w = Slice(t, [0, 1], [2, 9], [1, 2])
    w = Slice(u, [1], [9], [2])           (u read by w alone)
"""
from __future__ import annotations

from functools import cache, partial

import numpy as np
from onnxforge.graphbuilder.ir.core import (
    Attr,
    AttrType,
    Function,
    Graph,
    Model,
    Node,
    Value,
)
from onnxforge.graphbuilder.ir.tensors import Tensor
from onnxforge.graphbuilder.shapes.context import ShapesContext
from onnxforge.passes.analyses.effects import Effects, effect_analysis
from onnxforge.passes.analyses.stated_types import stated_dims
from onnxforge.passes.framework.domains import DEFAULT_DOMAINS, imported_version, opsets_in_scope
from onnxforge.passes.framework.invariants import containers
from onnxforge.passes.framework.pass_manager import ALL, Pass, PassResult, register_pass
from onnxforge.passes.rewrites.fold import constant_value
from onnxforge.passes.rewrites.rename import NameScope, can_replace, replace_value
from onnxforge.passes.rewrites.shape_fold import LazyShapes
from onnxforge.proto_ext.types import TensorType

__all__ = ["SliceSplitPass", "merge_complementary_slices"]


def _slice_range(n: Node, dims: tuple[object, ...]) -> tuple[int, int, int] | None:
    """``(axis, start, end)`` of a one-axis, unit-step Slice with constant bounds, clamped
    to the (static) dimension; None otherwise."""
    ins = list(n.inputs) + [None] * (5 - len(n.inputs))
    if len(n.inputs) < 3 or any(v is not None and constant_value(v) is None for v in ins[1:5]):
        return None
    st, en, ax, sp = (constant_value(v) if v is not None else None for v in ins[1:5])
    if st is None or en is None or st.size != 1 or en.size != 1:
        return None
    if sp is not None and (sp.size != 1 or int(sp.reshape(-1)[0]) != 1):
        return None
    a = 0 if ax is None else int(ax.reshape(-1)[0]) if ax.size == 1 else None
    if a is None or not -len(dims) <= a < len(dims):
        return None
    a = a + len(dims) if a < 0 else a
    d = dims[a]
    if type(d) is not int:
        return None
    s, e = int(st.reshape(-1)[0]), int(en.reshape(-1)[0])
    s = min(max(s + d if s < 0 else s, 0), d)
    e = min(max(e + d if e < 0 else e, 0), d)
    return a, s, e


def _slice_params(n: Node, rank: int | None) -> tuple[np.ndarray, ...] | None:
    """``(starts, ends, axes, steps)`` of a Slice (opset >= 10 form) with constant
    parameters, as int64 arrays with non-negative axes; None otherwise."""
    if len(n.inputs) < 3 or len(n.inputs) > 5 or n.attributes:
        return None
    vals = [constant_value(v) if v is not None else None for v in n.inputs[1:]]
    vals += [None] * (4 - len(vals))
    if any(v is None for v, x in zip(vals, n.inputs[1:]) if x is not None) or vals[0] is None or vals[1] is None:
        return None
    if any(v is not None and (v.ndim != 1 or v.dtype.kind not in "iu") for v in vals):
        return None
    starts, ends = vals[0].astype(np.int64), vals[1].astype(np.int64)
    k = starts.size
    axes = np.arange(k, dtype=np.int64) if vals[2] is None else vals[2].astype(np.int64)
    steps = np.ones(k, np.int64) if vals[3] is None else vals[3].astype(np.int64)
    if ends.size != k or axes.size != k or steps.size != k or k == 0 or (steps == 0).any():
        return None
    if (axes < 0).any():
        if rank is None:
            return None
        axes = np.where(axes < 0, axes + rank, axes)
    if len(set(axes.tolist())) != k or (rank is not None and ((axes < 0) | (axes >= rank)).any()):
        return None
    return starts, ends, axes, steps


def _full_range(params: tuple[np.ndarray, ...], dims: tuple[object, ...] | None) -> bool:
    """Whether a Slice with these (normalized) parameters keeps every element."""
    for s, e, ax, st in zip(*(p.tolist() for p in params)):
        d = dims[ax] if dims is not None and ax < len(dims) else None
        if st != 1:
            return False
        if not (s == 0 or (type(d) is int and s <= -d)):
            return False
        if not (e >= 1 << 62 or (type(d) is int and e >= d)):
            return False
    return True


class _SliceMerger:
    def __init__(self, model: Model, shapes: ShapesContext | LazyShapes, effects: Effects):
        self.model = model
        self.shapes = shapes
        self.effects = effects
        self.names = cache(partial(NameScope.from_model, model))  # built when first needed
        self.merged = 0

    def shape_of(self, v: Value) -> tuple[object, ...] | None:
        """The shape of ``v`` (asked only of candidates: most models never ask)."""
        return self.shapes.shape_of(v)

    def run(self, c: Graph | Function) -> None:
        opset = imported_version(opsets_in_scope(self.model, c), "") or 1
        if opset < 10:
            return
        for n in list(c):
            if n.graph is c and n.op_type == "Slice" and n.domain in DEFAULT_DOMAINS:
                self.try_compose(c, n)
        seen: set[int] = set()
        for n in list(c):
            if n.graph is not c or n.op_type != "Slice" or n.domain not in DEFAULT_DOMAINS:
                continue
            t = n.inputs[0]
            if t is None or id(t) in seen:
                continue
            seen.add(id(t))
            self.try_merge(c, t, opset)

    def _constant(self, c: Graph | Function, anchor: Node, base: str, array: np.ndarray) -> Value:
        tensor = Tensor.from_numpy(array)
        v = Value(self.names().fresh(base), TensorType(tensor.dtype, tensor.dims))
        if isinstance(c, Graph):
            c.add_initializer(v, tensor)
        else:
            c.insert_before(anchor, Node("", "Constant", [], [v], name=v.name,
                                         attributes=[Attr("value", AttrType.TENSOR, tensor)]))
        return v

    def try_compose(self, c: Graph | Function, n: Node) -> None:
        """``Slice(Slice(x, ...), ...)`` on disjoint axes -> one ``Slice(x, ...)``."""
        t = n.inputs[0] if n.inputs else None
        p = t.producer() if t is not None else None
        if (p is None or p.op_type != "Slice" or p.domain not in DEFAULT_DOMAINS or p.graph is not c
                or t.num_uses() != 1 or c.is_output(t) or self.effects.has_side_effects(p)
                or self.effects.has_side_effects(n) or p.inputs[0] is None):
            return
        shape = self.shape_of(p.inputs[0])
        rank = None if shape is None else len(shape)
        a, b = _slice_params(p, rank), _slice_params(n, rank)
        if a is None or b is None or set(a[2].tolist()) & set(b[2].tolist()):
            return
        if _full_range(a, shape) or _full_range(b, self.shape_of(t)):
            return  # a no-op Slice goes in the rewrite; composing would keep it
        out = n.outputs[0]
        name = n.name or "Slice"
        params = [self._constant(c, n, f"{name}_{k}", np.concatenate([x, y]))
                  for k, x, y in zip(("starts", "ends", "axes", "steps"), a, b)]
        new = Node("", "Slice", [p.inputs[0], *params], [Value(self.names().fresh(out.name or name), out.type)],
                   name=self.names().fresh(name))
        c.insert_before(n, new)
        if not (can_replace(out, new.outputs[0]) and replace_value(out, new.outputs[0])):
            c.remove(new, safe=False)
            for v in params:
                if isinstance(c, Graph):
                    c.remove_initializer(v)
                else:
                    c.remove(v.producer(), safe=False)
            return
        c.remove(n, safe=False)
        if not t.num_uses():
            c.remove(p, safe=False)
        self.merged += 1

    def try_merge(self, c: Graph | Function, t: Value, opset: int) -> None:
        slices = [u for u, i in t.uses() if i == 0 and u.op_type == "Slice" and u.graph is c
                  and u.domain in DEFAULT_DOMAINS and not self.effects.has_side_effects(u)]
        if len(slices) < 2 or len({id(u) for u in slices}) != len(slices):
            return
        # the dims the graph states (a Reshape to a constant target, a Transpose of it...)
        # first: where they give every Slice's range, inference would give the same
        dims: tuple[object, ...] | None = stated_dims(t)
        ranges = [] if dims is None else [_slice_range(u, dims) for u in slices]
        if dims is None or any(r is None for r in ranges):
            dims = self.shape_of(t)
            if dims is None:
                return
            ranges = [_slice_range(u, tuple(dims)) for u in slices]
        if any(r is None for r in ranges) or len({r[0] for r in ranges}) != 1:
            return
        axis = ranges[0][0]
        order = sorted(zip(ranges, slices), key=lambda p: p[0][1])
        pos = 0
        for (_a, s, e), _u in order:
            if s != pos or e <= s:
                return
            pos = e
        if pos != dims[axis]:
            return
        sizes = [e - s for (_a, s, e), _u in order]
        first = next(x for x in c if any(x is u for u in slices))
        base = self.names().fresh(f"{t.name or 'v'}_split")
        outs = [Value(self.names().fresh(f"{base}_{k}"), u.outputs[0].type) for k, (_r, u) in enumerate(order)]
        ins: list[Value | None] = [t]
        attrs = [Attr("axis", AttrType.INT, axis)]
        if opset >= 13:
            tensor = Tensor.from_numpy(np.array(sizes, np.int64))
            sv = Value(self.names().fresh(f"{base}_sizes"), TensorType(tensor.dtype, tensor.dims))
            if isinstance(c, Graph):
                c.add_initializer(sv, tensor)
            else:
                c.insert_before(first, Node("", "Constant", [], [sv], name=sv.name,
                                            attributes=[Attr("value", AttrType.TENSOR, tensor)]))
            ins.append(sv)
        else:
            attrs.append(Attr("split", AttrType.INTS, sizes))
        split = Node("", "Split", ins, outs, name=base, attributes=attrs)
        c.insert_before(first, split)
        if not all(can_replace(u.outputs[0], o) for (_r, u), o in zip(order, outs)):
            c.remove(split, safe=False)
            if opset >= 13 and isinstance(c, Graph):
                c.remove_initializer(ins[1])
            elif opset >= 13:
                c.remove(ins[1].producer(), safe=False)
            return
        for (_r, u), o in zip(order, outs):
            replace_value(u.outputs[0], o)
            c.remove(u, safe=False)
        self.merged += 1


def merge_complementary_slices(model: Model, ctx: ShapesContext | None = None) -> int:
    """Replace unit-step Slices of one value along one static axis that cover it exactly,
    in pieces, by one ``Split``; returns how many Splits were made."""
    return _merge_slices(model, LazyShapes(None, model) if ctx is None else ctx)


def _merge_slices(model: Model, shapes: ShapesContext | LazyShapes, effects: Effects | None = None) -> int:
    merger = _SliceMerger(model, shapes, effect_analysis(model) if effects is None else effects)
    for c in list(containers(model)):
        merger.run(c)
    return merger.merged


@register_pass
class SliceSplitPass(Pass):
    """Complementary Slices -> Split; a Slice of a Slice on other axes -> one Slice.

    Before / after (``t: [b, 4, s, 32]``)::

        lo = Slice(t, [0], [16], [3])         lo, hi = Split(t, [16, 16], axis=3)
        hi = Slice(t, [16], [INT64_MAX], [3])

        u = Slice(t, [0], [2], [1])           w = Slice(t, [0, 1], [2, 9], [1, 2])
        w = Slice(u, [1], [9], [2])           (u read by w alone)
    """

    name = "slice_split"
    invalidates = ALL
    preserves = ()
    declares_storage = False
    # after the first constant folding (Slice bounds are constants by then), and before the
    # last one, which folds a Split of a weight without growing the model
    runs_after = ("inline",)

    def call(self, model: Model) -> PassResult:
        effects = self.analyses.get("effects", model)  # the one LazyShapes reads too
        return PassResult(model, _merge_slices(model, LazyShapes(self.analyses, model), effects) > 0)
