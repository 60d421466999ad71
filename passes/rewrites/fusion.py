"""Fusions of constant affine maps into Conv, ConvTranspose and Gemm, as rewrite rules.

:data:`FUSION_RULES` is a :class:`~onnxforge.passes.rewrites.patterns.RuleTable`; the
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
  (:mod:`onnxforge.passes.rewrites.attention_fusion`).

Before / after::

    y = Conv(x, W)                     y2 = Conv(x, W', b')
    y2 = BatchNormalization(y, s, B, mean, var)
    t = MatMul(a, K)   # a: [n, 4]     u = Gemm(a, K, c)
    u = Add(t, c)      # c: [8]
"""
from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from onnxforge.graphbuilder.ir.core import Model, Node, Value
from onnxforge.graphbuilder.shapes.context import ShapesContext
from onnxforge.passes.analyses.effects import Effects
from onnxforge.passes.analyses.stated_types import stated_rank
from onnxforge.passes.framework.domains import imported_version
from onnxforge.passes.framework.invariants import containers
from onnxforge.passes.framework.pass_manager import ALL, Pass, PassResult, register_pass
from onnxforge.passes.rewrites.attention_fusion import REPEAT_KV_RULES
from onnxforge.passes.rewrites.engine import apply_rules
from onnxforge.passes.rewrites.patterns import Const, Match, Pattern, Rule, RuleTable
from onnxforge.passes.rewrites.shape_fold import LazyShapes

__all__ = ["FUSION_RULES", "FusionPass", "fuse"]

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
(:data:`~onnxforge.passes.rewrites.attention_fusion.REPEAT_KV_RULES`)."""


def fuse(model: Model, shapes: ShapesContext | LazyShapes | None = None, *,
         effects: Effects | None = None) -> int:
    """Apply :data:`FUSION_RULES` to a fixed point (and, in a model importing opset 23 or
    newer, :data:`~onnxforge.passes.rewrites.opset23.ROTARY_RULES`); new weights become
    initializers. Returns the number of fusions."""
    from onnxforge.passes.rewrites.opset23 import ROTARY_RULES

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
    invalidates = ALL
    preserves = ()
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
