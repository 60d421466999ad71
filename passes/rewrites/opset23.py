"""Fusions into the opset-23 operators ``Attention`` and ``RMSNormalization``.

Exporters below opset 23 spell attention and RMS normalization out in elementary
operators (``torch.onnx`` at opset 20 writes about ten nodes per attention and six
per norm). This pass fuses both:

* the decomposed scaled-dot-product attention of
  :mod:`onnxforge.passes.rewrites.attention_fusion` becomes ``Attention``;
* ``x * Unsqueeze(Cos(Concat(a, a))) + Concat(-x2, x1) * Unsqueeze(Sin(Concat(a, a)))``
  (the halves ``x1, x2`` of the last axis) becomes ``RotaryEmbedding(x, Cos(a), Sin(a))``
  (:data:`ROTARY_RULES`, applied by the ``fusion`` pass once the halves are one Split);
* ``Mul(x, Reciprocal(Sqrt(Add(ReduceMean(Pow(x, 2), [-1]), eps))))`` (either operand
  order of both ``Mul`` and ``Add``, keepdims, float32 ``x`` with a static last axis)
  becomes ``RMSNormalization(x, ones, epsilon=eps)``: the same ``x / sqrt(mean(x^2) +
  eps)``, computed in float32 (``stash_type`` 1) as the chain is. A following ``Mul`` by
  a constant ``[D]`` weight becomes the norm's scale.

::

    before (per norm)                             after
      p = Pow(x, 2); m = ReduceMean(p, [-1])        y = RMSNormalization(x, w, epsilon=eps)
      r = Reciprocal(Sqrt(Add(m, eps)))
      y = Mul(Mul(x, r), w)

A model that already imports opset 23 or newer is fused as it is. An older one is fused
only when the pass is asked to raise its default-domain opset (``raise_opset=True``,
``onnxforge optimize --opset 23``, ``optimize(model, opset=23)``) and only when every
other operator keeps its meaning at 23 (:func:`~onnxforge.passes.rewrites.attention_fusion.
fuse_attention`'s check); otherwise the pass raises
:class:`~onnxforge.passes.rewrites.attention_fusion.AttentionFusionError` and changes nothing.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto
from onnxforge.graphbuilder.ir.core import Model, Value
from onnxforge.passes.rewrites.attention_fusion import (
    ATTENTION_FUSION,
    ATTENTION_OPSET,
    AttentionFusionError,
    opset_problem,
)
from onnxforge.passes.rewrites.dce import eliminate_dead_code
from onnxforge.passes.framework.domains import default_domain_key
from onnxforge.passes.framework.pass_manager import ALL, Pass, PassResult, register_pass
from onnxforge.passes.rewrites.engine import apply_rules
from onnxforge.passes.rewrites.patterns import Const, Match, Pattern, Rule, RuleTable
from onnxforge.passes.rewrites.shape_fold import LazyShapes
from onnxforge.proto_ext.types import TensorType

__all__ = ["OPSET23_RULES", "ROTARY_RULES", "Opset23FusionPass", "fuse_to_opset23"]


def _is_two(c: np.ndarray) -> bool:
    return c.size == 1 and c.dtype.kind == "f" and float(c.reshape(-1)[0]) == 2.0


def _eps(c: np.ndarray) -> bool:
    return c.size == 1 and c.dtype.kind == "f" and float(c.reshape(-1)[0]) >= 0.0


def _norm_patterns() -> list[Pattern]:
    """The ``x * rsqrt(mean(x^2, -1) + eps)`` chains, axes as an input (opset 18+) or an
    attribute, both operand orders of the Add and the Mul."""
    sq = Pattern("Pow", "x", Const("two", _is_two))
    means = [Pattern("ReduceMean", sq, Const("axes"), name="mean"), Pattern("ReduceMean", sq, name="mean")]
    out = []
    for mean in means:
        for add in (Pattern("Add", mean, Const("eps", _eps)), Pattern("Add", Const("eps", _eps), mean)):
            r = Pattern("Reciprocal", Pattern("Sqrt", add))
            out += [Pattern("Mul", "x", r), Pattern("Mul", r, "x")]
    return out


def _rms(m: Match) -> Value | None:
    # x * 1/sqrt(mean(x^2 over the last axis) + eps) = RMSNormalization(x, 1, epsilon=eps)
    mean = m.node("mean")
    t = m.type_of(m["x"])
    if not isinstance(t, TensorType) or t.elem_type != TensorProto.FLOAT or t.shape is None or not t.shape:
        return None
    rank, d = len(t.shape), t.shape[-1]
    if type(d) is not int or d < 1 or mean.attr("keepdims", 1) != 1:
        return None
    axes = m.const("axes").reshape(-1).tolist() if "axes" in m.consts else mean.attr("axes")
    if axes is None or [a % rank for a in axes] != [rank - 1]:
        return None
    eps = float(m.const("eps").reshape(-1)[0])
    y = m.op.RMSNormalization(m["x"], m.constant(np.ones(d, np.float32)), axis=-1, epsilon=eps, stash_type=1)
    y.type = m.root.outputs[0].type
    return y


def _ones(c: np.ndarray) -> bool:
    return c.dtype == np.float32 and c.ndim == 1 and bool(np.all(c == 1))


def _scaled(m: Match) -> Value | None:
    # RMSNormalization(x, 1) * w = RMSNormalization(x, w) for a float32 weight w [.., 1, D]
    norm, w = m.node("norm"), m.const("w")
    d = m.const("ones").shape[0]
    rank = m.rank_of(m["x"])
    if (w.dtype != np.float32 or w.ndim < 1 or w.shape[-1] != d or w.size != d or rank is None
            or w.ndim > rank):
        return None
    out = norm.outputs[0]
    if len(out.uses()) != 1 or norm.graph.is_output(out):
        return None
    y = m.op.RMSNormalization(m["x"], m.constant(np.ascontiguousarray(w.reshape(d))), **norm.attributes)
    y.type = m.root.outputs[0].type
    return y


_NORM = Pattern("RMSNormalization", "x", Const("ones", _ones), name="norm")

OPSET23_RULES = RuleTable(
    [Rule(p, _rms, f"decomposed_rms_norm_{i}") for i, p in enumerate(_norm_patterns())]
    + [Rule(Pattern("Mul", _NORM, Const("w")), _scaled, "rms_norm_weight"),
       Rule(Pattern("Mul", Const("w"), _NORM), _scaled, "rms_norm_weight_r")]) + ATTENTION_FUSION
"""Decomposed RMS norms and attention into the opset-23 operators (module docstring)."""


# -- rotary embedding -----------------------------------------------------------------
# y = x * cos + rotate_half(x) * sin with rotate_half(x) = Concat(-x2, x1) (x1, x2 the
# halves of the last axis) and cos = Cos(Concat(a, a)), sin = Sin(Concat(a, a)) unsqueezed
# on the head axis: both halves of cos / sin are Cos(a) / Sin(a), so
#   y = [x1 Cos(a) - x2 Sin(a), x2 Cos(a) + x1 Sin(a)] = RotaryEmbedding(x, Cos(a), Sin(a))
# (opset 23, 4-D x [B, N, S, H], per-token caches [B, S, H/2], halves not interleaved).


def _half_split(out: int) -> Pattern:
    return Pattern("Split", "x", Const("sizes"), name="split", output=out)


def _rotary_patterns() -> list[Pattern]:
    rot = Pattern("Concat", Pattern("Neg", _half_split(1)), _half_split(0), name="rot")
    cu = Pattern("Unsqueeze", Pattern("Cos", Pattern("Concat", "a", "a", name="cat_c")), Const("cax"))
    su = Pattern("Unsqueeze", Pattern("Sin", Pattern("Concat", "a", "a", name="cat_s")), Const("sax"))
    out = []
    for xc in (Pattern("Mul", "x", cu), Pattern("Mul", cu, "x")):
        for rs in (Pattern("Mul", rot, su), Pattern("Mul", su, rot)):
            out += [Pattern("Add", xc, rs), Pattern("Add", rs, xc)]
    return out


def _last_axis(n, rank: int) -> bool:
    a = n.attr("axis", 0)
    return a is not None and a % rank == rank - 1


def _rotary(m: Match) -> Value | None:
    xs, as_ = m.shape_of(m["x"]), m.shape_of(m["a"])
    t = m.type_of(m["x"])
    if xs is None or as_ is None or len(xs) != 4 or len(as_) != 3 or not isinstance(t, TensorType):
        return None
    h = xs[3]
    if type(h) is not int or h % 2 or as_[2] != h // 2 or t.elem_type != TensorProto.FLOAT:
        return None
    if m.const("sizes").reshape(-1).tolist() != [h // 2, h // 2] or not _last_axis(m.node("split"), 4):
        return None
    if not (_last_axis(m.node("rot"), 4) and _last_axis(m.node("cat_c"), 3) and _last_axis(m.node("cat_s"), 3)):
        return None
    if any(m.const(k).reshape(-1).tolist() not in ([1], [-3]) for k in ("cax", "sax")):
        return None
    y = m.op.RotaryEmbedding(m["x"], m.op.Cos(m["a"]), m.op.Sin(m["a"]), interleaved=0)
    y.type = m.root.outputs[0].type
    return y


ROTARY_RULES = RuleTable([Rule(p, _rotary, f"decomposed_rotary_{i}") for i, p in enumerate(_rotary_patterns())])
"""The decomposed rotary embedding of torch exports into ``RotaryEmbedding`` (opset 23);
the ``fusion`` pass applies it in models that import opset 23, once ``slice_split`` has made
the halves one ``Split``."""


def fuse_to_opset23(model: Model, *, raise_opset: bool = False, shapes=None) -> int:
    """Apply :data:`OPSET23_RULES` to ``model`` (in place); returns the number of fusions.

    Below opset 23 nothing happens unless ``raise_opset``; then the default-domain import
    becomes 23 when something fused, or :class:`AttentionFusionError` is raised (nothing
    changed) when another operator would change meaning."""
    key = default_domain_key(model.opset_imports)
    current = model.opset_imports.get(key)
    if current is None:
        return 0
    if current < ATTENTION_OPSET:
        if not raise_opset:
            return 0
        problem = opset_problem(model)
        if problem is not None:
            raise AttentionFusionError(f"{problem}: raising the opset to {ATTENTION_OPSET} for the fused "
                                       f"Attention / RMSNormalization would change it; the model is left as it is")
    count = apply_rules(model, OPSET23_RULES, shapes=shapes, lift=True)
    if count:
        eliminate_dead_code(model)
        if current < ATTENTION_OPSET:
            model.opset_imports[key] = ATTENTION_OPSET
    return count


@register_pass
class Opset23FusionPass(Pass):
    """Fuse decomposed attention and RMS norms into ``Attention`` / ``RMSNormalization``
    (see the module docstring); ``raise_opset`` lets it raise an older model's opset."""

    name = "opset23_fusion"
    invalidates = ALL
    preserves = ()
    declares_storage = False
    runs_after = ("inline",)

    def __init__(self, raise_opset: bool = False):
        self.raise_opset = bool(raise_opset)

    def call(self, model: Model) -> PassResult:
        n = fuse_to_opset23(model, raise_opset=self.raise_opset, shapes=LazyShapes(self.analyses, model))
        return PassResult(model, n > 0)
