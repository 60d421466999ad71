"""Fusions of constant affine maps into Conv, ConvTranspose and Gemm, as rewrite rules.

:data:`FUSION_RULES` is a :class:`~onnxforge.passes.rewrite.RuleTable`; the
``fusion`` pass applies it with the ``shapes`` analysis and turns the new
weights into initializers. Every rule folds constants in float64 and casts the
result back to the weights' type once (the fused model computes the same map;
results differ from the unfused one by rounding only), and fires only when the
fused node's output has no other reader and the old weights no other reader
(so no payload is duplicated).

* ``BatchNormalization(Conv(x, W, b), s, B, mean, var)`` (inference mode) ->
  ``Conv(x, W * a, (b - mean) * a + B)`` with ``a = s / sqrt(var + eps)`` per
  output channel; ConvTranspose alike (its output channels are
  ``W.shape[1] * group``).
* ``Mul(Conv(x, W, b), c)`` with ``c`` per-channel (scalar or ``[M, 1, ...]``) ->
  ``Conv(x, W * c, b * c)``; ``Add(Conv(x, W, b), c)`` -> ``Conv(x, W, b + c)``.
* ``Add(MatMul(A, B), C)`` with 2-D ``A``, constant 2-D ``B`` and ``C`` broadcastable
  to ``[M, N]`` -> ``Gemm(A, B, C)``.
* ``Attention(q, repeat_kv(k), repeat_kv(v), ...)`` -> ``Attention(q, k, v, ...)``: the
  grouped heads are read directly instead of a repeated copy of the cache
  (:mod:`onnxforge.passes.attention_fusion`).

Before / after::

    y = Conv(x, W)                     y2 = Conv(x, W', b')
    y2 = BatchNormalization(y, s, B, mean, var)
    t = MatMul(a, K)   # a: [n, 4]     u = Gemm(a, K, c)
    u = Add(t, c)      # c: [8]
"""
from __future__ import annotations

from collections.abc import Iterable
from functools import cache, partial

import numpy as np
from onnxforge.graphbuilder.ir import (
    Attr,
    AttrType,
    Function,
    Graph,
    Model,
    Node,
    Value,
)
from onnxforge.graphbuilder.shapes import ShapesContext
from onnxforge.graphbuilder.tensors import Tensor
from onnxforge.passes.attention_fusion import REPEAT_KV_RULES
from onnxforge.passes.domains import DEFAULT_DOMAINS, imported_version, opsets_in_scope
from onnxforge.passes.effects import Effects, effect_analysis
from onnxforge.passes.fold import constant_value
from onnxforge.passes.invariants import containers
from onnxforge.passes.manager import Pass, PassResult, register_pass
from onnxforge.passes.rename import NameScope, can_replace, replace_value
from onnxforge.passes.rewrite import Const, Match, Pattern, Rule, RuleTable, apply_rules
from onnxforge.passes.shape_fold import LazyShapes
from onnxforge.passes.stated import stated_dims, stated_rank
from onnxforge.proto_ext.types import TensorType

__all__ = ["FUSION_RULES", "FusionPass", "SliceSplitPass", "fuse", "merge_complementary_slices"]

_CONV_OPS = ("Conv", "ConvTranspose")


def _float(a: np.ndarray) -> bool:
    return a.dtype in (np.float16, np.float32, np.float64)


def _single_use(v: Value) -> bool:
    return v.num_uses() == 1 and not v.is_graph_output()


def _conv_parts(m: Match) -> tuple[Node, np.ndarray, np.ndarray | None] | None:
    """The matched conv node, its weights and bias, if they may be rewritten."""
    conv = m.node("conv")
    w = m.const("w")
    b = m.consts.get("b")
    if not _single_use(conv.outputs[0]) or not _float(w) or w.ndim < 3:
        return None
    if m["w"].num_uses() != 1 or ("b" in m.values and m["b"].num_uses() != 1):
        return None
    if b is not None and (b.dtype != w.dtype or b.ndim != 1):
        return None
    return conv, w, b


def _out_channels(conv: Node, w: np.ndarray) -> int:
    if conv.op_type == "Conv":
        return w.shape[0]
    return w.shape[1] * int(conv.attr("group", 1))


def _scale_weights(conv: Node, w: np.ndarray, a: np.ndarray) -> np.ndarray:
    """``W`` with output channel ``m`` multiplied by ``a[m]`` (float64)."""
    w64 = w.astype(np.float64)
    if conv.op_type == "Conv":
        return w64 * a.reshape((-1,) + (1,) * (w.ndim - 1))
    g = int(conv.attr("group", 1))
    c, mg = w.shape[0], w.shape[1]
    grouped = w64.reshape((g, c // g, mg) + w.shape[2:])
    scaled = grouped * a.reshape((g, 1, mg) + (1,) * (w.ndim - 2))
    return scaled.reshape(w.shape)


def _rebuild(m: Match, conv: Node, w: np.ndarray, b: np.ndarray, dtype: np.dtype) -> Value:
    attrs = dict(conv.attributes)
    maker = getattr(m.op, conv.op_type)
    return maker(m["x"], m.constant(w.astype(dtype)), m.constant(b.astype(dtype)), **attrs)


def _fuse_batchnorm(m: Match) -> Value | None:
    # y = s * (W*x + b - mean) / sqrt(var + eps) + B = (a*W)*x + ((b - mean)*a + B),
    # a = s / sqrt(var + eps), per output channel.
    bn = m.root
    parts = _conv_parts(m)
    if parts is None or len(bn.outputs) != 1:
        return None
    if int(bn.attr("training_mode", 0)) != 0 or int(bn.attr("spatial", 1)) != 1:
        return None
    conv, w, b = parts
    ch = _out_channels(conv, w)
    params = [m.const(k) for k in ("scale", "bias", "mean", "var")]
    if any(p.shape != (ch,) or not _float(p) for p in params):
        return None
    s, beta, mean, var = (p.astype(np.float64) for p in params)
    eps = float(bn.attr("epsilon", 1e-5))
    a = s / np.sqrt(var + eps)
    b64 = np.zeros(ch) if b is None else b.astype(np.float64)
    return _rebuild(m, conv, _scale_weights(conv, w, a), (b64 - mean) * a + beta, w.dtype)


def _per_channel(conv: Node, w: np.ndarray, c: np.ndarray) -> np.ndarray | None:
    """``c`` as one value per output channel when ``Conv(...) op c`` broadcasts per channel
    and keeps the conv output's shape; else None."""
    if c.dtype != w.dtype or c.ndim > w.ndim:
        return None
    ch = _out_channels(conv, w)
    full: np.ndarray = c.reshape((1,) * (w.ndim - c.ndim) + c.shape)
    if any(d != 1 for k, d in enumerate(full.shape) if k != 1) or full.shape[1] not in (1, ch):
        return None
    return np.broadcast_to(full.reshape(-1).astype(np.float64), (ch,))


def _conv_and_channel_constant(m: Match) -> tuple[Node, np.ndarray, np.ndarray, np.ndarray] | None:
    """The Conv of a match, its weight, its bias in float64 (zeros without one) and the
    per-output-channel constant ``c``; None when the match does not fuse."""
    parts = _conv_parts(m)
    if parts is None:
        return None
    conv, w, b = parts
    c = _per_channel(conv, w, m.const("c"))
    if c is None:
        return None
    return conv, w, np.zeros(c.shape[0]) if b is None else b.astype(np.float64), c


def _fuse_mul(m: Match) -> Value | None:
    # (W*x + b) * c = (c*W)*x + c*b, c per output channel
    found = _conv_and_channel_constant(m)
    if found is None:
        return None
    conv, w, b64, c = found
    return _rebuild(m, conv, _scale_weights(conv, w, c), b64 * c, w.dtype)


def _fuse_add(m: Match) -> Value | None:
    # (W*x + b) + c = W*x + (b + c), c per output channel
    found = _conv_and_channel_constant(m)
    if found is None:
        return None
    conv, w, b64, c = found
    return _rebuild(m, conv, w.astype(np.float64), b64 + c, w.dtype)


def _matmul_add_to_gemm(m: Match) -> Value | None:
    # MatMul(A, B) + C = Gemm(A, B, C) for A: [M, K], B: [K, N], C broadcastable to [M, N]
    mm = m.node("mm")
    if not _single_use(mm.outputs[0]):
        return None
    bmat, c = m.const("b"), m.const("c")
    if bmat.ndim != 2 or not _float(bmat) or c.dtype != bmat.dtype or c.ndim > 2:
        return None
    n = bmat.shape[1]
    full: np.ndarray = c.reshape((1,) * (2 - c.ndim) + c.shape)
    if full.shape[1] not in (1, n):
        return None
    # the rank is read off the graph first (Flatten, a Reshape to a constant target...);
    # the shape is asked when it is not, or when C's rows must match A's
    rank = stated_rank(m["a"])
    if rank is not None and rank != 2:
        return None
    if rank is None or full.shape[0] != 1:
        a_shape = m.shape_of(m["a"])
        if a_shape is None or len(a_shape) != 2:
            return None
        k, rows = a_shape[1], a_shape[0]
        if type(k) is int and k != bmat.shape[0]:
            return None
        if full.shape[0] != 1 and not (type(rows) is int and rows == full.shape[0]):
            return None
    # MatMul ties A's element type to B's, a float constant: Gemm takes that type
    return m.op.Gemm(m["a"], m["b"], m["c"])


def _conv(op: str, with_bias: bool) -> Pattern:
    ins: list[object] = ["x", Const("w")]
    if with_bias:
        ins.append(Const("b"))
    return Pattern(op, *ins, name="conv")


def _conv_rules() -> Iterable[Rule]:
    bn_params = [Const(k) for k in ("scale", "bias", "mean", "var")]
    for op in _CONV_OPS:
        for bias in (False, True):
            tag = f"{op.lower()}{'_bias' if bias else ''}"
            yield Rule(Pattern("BatchNormalization", _conv(op, bias), *bn_params), _fuse_batchnorm,
                       f"{tag}_batchnorm")
            yield Rule(Pattern("Mul", _conv(op, bias), Const("c")), _fuse_mul, f"{tag}_mul")
            yield Rule(Pattern("Mul", Const("c"), _conv(op, bias)), _fuse_mul, f"{tag}_mul_r")
            yield Rule(Pattern("Add", _conv(op, bias), Const("c")), _fuse_add, f"{tag}_add")
            yield Rule(Pattern("Add", Const("c"), _conv(op, bias)), _fuse_add, f"{tag}_add_r")


def _gemm_rules() -> Iterable[Rule]:
    mm = Pattern("MatMul", "a", Const("b"), name="mm")
    yield Rule(Pattern("Add", mm, Const("c")), _matmul_add_to_gemm, "matmul_add_gemm")
    yield Rule(Pattern("Add", Const("c"), mm), _matmul_add_to_gemm, "add_matmul_gemm")


FUSION_RULES: RuleTable = RuleTable([*_conv_rules(), *_gemm_rules(), *REPEAT_KV_RULES])
"""Conv/ConvTranspose + BatchNormalization / per-channel Mul / Add, MatMul + Add -> Gemm, and
``Attention`` over repeated KV heads reading the grouped heads directly
(:data:`~onnxforge.passes.attention_fusion.REPEAT_KV_RULES`)."""


def fuse(model: Model, shapes: ShapesContext | LazyShapes | None = None, *,
         effects: Effects | None = None) -> int:
    """Apply :data:`FUSION_RULES` to a fixed point (and, in a model importing opset 23 or
    newer, :data:`~onnxforge.passes.opset23.ROTARY_RULES`); new weights become
    initializers. Returns the number of fusions."""
    from onnxforge.passes.opset23 import ROTARY_RULES

    table = FUSION_RULES
    if (imported_version(model.opset_imports, "") or 0) >= 23:
        table = table + ROTARY_RULES
    return apply_rules(model, table, shapes=shapes, lift=True, effects=effects)


@register_pass
class FusionPass(Pass):
    """Fuse constant affine maps into Conv / ConvTranspose / Gemm (see the module docstring).

    Before / after: ``BatchNormalization(Conv(x, W), s, B, mean, var)`` becomes
    ``Conv(x, W', b')``; ``Add(MatMul(a, K), c)`` with 2-D ``a`` becomes ``Gemm(a, K, c)``.
    """

    name = "fusion"
    declares_storage = False
    runs_after = ("inline", "constant_folding")

    def call(self, model: Model) -> PassResult:
        shapes = LazyShapes(self.analyses, model)
        if _gemm_candidate(model):
            # MatMul + Add -> Gemm asks for a rank: a model inferred whole is inferred before
            # Conv fusions rebuild their nodes, so that the inference replays them
            shapes.prefetch()
        return PassResult(model, fuse(model, shapes, effects=self.analyses.get("effects", model)) > 0)


def _gemm_candidate(model: Model) -> bool:
    """Whether some MatMul's one reader is an Add (what the Gemm rule matches)."""
    for c in containers(model):
        for n in c:
            if n.op_type == "MatMul" and n.outputs and n.outputs[0].num_uses() == 1:
                user = n.outputs[0].uses()[0][0]
                if user.op_type == "Add":
                    return True
    return False



# ----------------------------------------------------------------------------- slices -> Split


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
    declares_storage = False
    # after the first constant folding (Slice bounds are constants by then), and before the
    # last one, which folds a Split of a weight without growing the model
    runs_after = ("inline",)

    def call(self, model: Model) -> PassResult:
        effects = self.analyses.get("effects", model)  # the one LazyShapes reads too
        return PassResult(model, _merge_slices(model, LazyShapes(self.analyses, model), effects) > 0)
