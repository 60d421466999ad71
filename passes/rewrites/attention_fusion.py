"""Fuse the decomposed scaled-dot-product attention of ``torch.onnx`` exports (opset < 23)
into the standard ``Attention`` operator (opset 23).

Below opset 23, ``torch.onnx.export(dynamo=True)`` writes
``F.scaled_dot_product_attention(q, k, v, attn_mask)`` as a fixed chain: the keys are
transposed through a flatten / transpose / unflatten, both operands are scaled by
``sqrt(scale)``, the float mask is added, and rows that the softmax turned into NaN
are zeroed. The rule matches exactly that chain::

    before                                            after
      kt = Reshape(Transpose(Reshape(k, [-1, T, H]),    y = Attention(q, k, v, mask,
                   perm=[0, 2, 1]), [B, N, H, T])                     scale=c * c)
      s  = MatMul(Mul(q, c), Mul(kt, c))
      p  = Softmax(Add(s, mask), axis=-1)
      y  = MatMul(Where(IsNaN(p), 0, p), v)

The shapes of both Reshapes must be assembled from ``Shape(k)`` as above (leading
axes, last two axes swapped), ``c`` must be one positive scalar constant on both
operands, and ``mask`` a floating-point tensor: ``Attention`` then computes
``softmax(q k^T * c^2 + mask) v``, the same value (an all-masked row is finite with
the exporter's ``-FLT_MAX`` mask, so the NaN guard never fires). A softmax in that
position that does not match is left as it is; the stateful rewrite then refuses the
cache it reads, naming the node.

``Attention`` needs opset 23: :func:`fuse_attention` raises the model's default-domain
opset to 23 when it fused anything. It does so only when every operator of the model
keeps its meaning: a newer version must have the same attributes and ports (versions
21-23 mostly added element types: int4, bfloat16, float4) and not be one of
:data:`SEMANTIC_CHANGES`; otherwise it raises :class:`AttentionFusionError` naming
the operator, before changing anything.

A second rule, :data:`REPEAT_KV_RULES`, serves every ``Attention`` (fused here or
exported at opset 23): ``torch.onnx`` writes the grouped-query "repeat_kv" of Hugging
Face models as ``Reshape(Expand(Unsqueeze(k, [2]), [B, Hkv, G, T, D]), [B, Hkv*G, T, D])``
on both keys and values, a copy of the whole cache per layer and step. ``Attention``
reads fewer KV heads itself (query head ``h`` uses KV head ``h // G``, the same heads
the repeat made), so the rule feeds it ``k`` and ``v`` directly::

    before                                            after
      kr = Reshape(Expand(Unsqueeze(k, [2]), s5), s4)   y = Attention(q, k, v, mask)
      vr = Reshape(Expand(Unsqueeze(v, [2]), s5), s4)
      y  = Attention(q, kr, vr, mask)

It fires only when the shapes analysis proves the chain is exactly that repeat: ``k``
is ``[B, Hkv, T, D]``, the Expand gives ``[B, Hkv, G, T, D]`` and the Reshape
``[B, Hkv*G, T, D]`` with the same dimensions; ``q`` is 4-D, the node has no past
inputs, no head-count attributes and no output but ``Y`` in use.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from onnx import TensorProto
from onnxforge.graphbuilder.ir.core import Model, Value
from onnxforge.graphbuilder.builder.opschemas import get_schema
from onnxforge.passes.rewrites.dce import eliminate_dead_code
from onnxforge.passes.framework.domains import default_domain_key, is_default_domain
from onnxforge.passes.rewrites.engine import apply_rules
from onnxforge.passes.rewrites.patterns import Const, Match, Pattern, Rule, RuleTable
from onnxforge.proto_ext.errors import OnnxforgeError
from onnxforge.proto_ext.types import TensorType

__all__ = [
    "ATTENTION_FUSION",
    "REPEAT_KV_RULES",
    "SEMANTIC_CHANGES",
    "AttentionFusionError",
    "fuse_attention",
    "opset_problem",
]

ATTENTION_OPSET = 23

SEMANTIC_CHANGES = frozenset({"GroupNormalization"})
"""Operators whose versions 21-23 changed what they compute with the same signature
(GroupNormalization-21: per-channel scale and bias)."""

_FLOATS = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE)
_BIG = 2 ** 62


class AttentionFusionError(OnnxforgeError, ValueError):
    """The model's opset cannot be raised to the one the fused ``Attention`` needs."""


def _scalar(c: np.ndarray) -> bool:
    return c.size == 1 and c.dtype.kind == "f" and float(c.reshape(-1)[0]) > 0


def _zero(c: np.ndarray) -> bool:
    return c.size == 1 and float(c.reshape(-1)[0]) == 0.0


# y = MatMul(Where(IsNaN(p), 0, p), v), p = Softmax(Add(MatMul(Mul(q, c), Mul(kt, c)), mask))
_KT = Pattern("Reshape",
              Pattern("Transpose", Pattern("Reshape", "k", "flat", attrs={"allowzero": lambda a: not a},
                                           name="flatten"),
                      attrs={"perm": [0, 2, 1]}),
              "unflat", attrs={"allowzero": lambda a: not a}, name="unflatten")
_SCORES = Pattern("MatMul", Pattern("Mul", "q", Const("cq", _scalar)),
                  Pattern("Mul", _KT, Const("ck", _scalar)))
_SOFTMAX = Pattern("Softmax", Pattern("Add", _SCORES, "mask"), attrs={"axis": lambda a: a == -1},
                   name="softmax")
_PATTERN = Pattern("MatMul", Pattern("Where", Pattern("IsNaN", _SOFTMAX), Const("zero", _zero), "p"), "v")


def _shape_slice(v: Value, k: Value, start: int, end: int) -> bool:
    """``v`` is ``Slice(Shape(k), [start], [end])`` (ends past the rank spelled as huge ints)."""
    from onnxforge.passes.rewrites.fold import constant_value

    n = v.producer()
    if n is None or n.op_type != "Slice" or len(n.inputs) != 3 or not is_default_domain(n.domain):
        return False
    sh = n.inputs[0].producer() if n.inputs[0] is not None else None
    if (sh is None or sh.op_type != "Shape" or sh.inputs[0] is not k or sh.attr("start", 0) != 0
            or sh.attr("end") is not None):
        return False
    s, e = (constant_value(x) if x is not None else None for x in n.inputs[1:3])
    if s is None or e is None or s.size != 1 or e.size != 1:
        return False
    s0, e0 = int(s.reshape(-1)[0]), int(e.reshape(-1)[0])
    return s0 == start and (e0 == end or (end == _BIG and e0 >= _BIG) or (start == -_BIG and e0 == end))


def _concat_of(v: Value) -> list[Value] | None:
    n = v.producer()
    if n is None or n.op_type != "Concat" or n.attr("axis") != 0 or not is_default_domain(n.domain):
        return None
    return [x for x in n.inputs if x is not None]


def _swapped_last_two(m: Match) -> bool:
    """``flat`` is ``[-1, T, H]`` and ``unflat`` is ``[lead..., H, T]``, all read from ``Shape(k)``."""
    from onnxforge.passes.rewrites.fold import constant_value

    k = m["k"]
    flat, unflat = _concat_of(m["flat"]), _concat_of(m["unflat"])
    if flat is None or unflat is None or len(flat) != 3 or len(unflat) != 3:
        return False
    minus_one = constant_value(flat[0])
    if minus_one is None or minus_one.size != 1 or int(minus_one.reshape(-1)[0]) != -1:
        return False
    t, h = flat[1], flat[2]
    if unflat[1] is not h or unflat[2] is not t:
        return False
    lead = unflat[0]
    lead_ok = _shape_slice(lead, k, -_BIG, -2) or _shape_slice(lead, k, -(2 ** 63), -2)
    return _shape_slice(t, k, -2, -1) and _shape_slice(h, k, -1, _BIG) and lead_ok


def _fuse_ok(m: Match) -> bool:
    if m["p"] is not m.node("softmax").outputs[0]:
        return False
    cq, ck = float(m.const("cq").reshape(-1)[0]), float(m.const("ck").reshape(-1)[0])
    if cq != ck or not _swapped_last_two(m):
        return False
    if any(m.rank_of(m[n]) not in (None, 4) for n in ("q", "k", "v")):
        return False
    mt = m.type_of(m["mask"])
    return isinstance(mt, TensorType) and mt.elem_type in _FLOATS


def _fuse(m: Match) -> Value | None:
    # softmax(q c (k^T c) + mask) v -> Attention(q, k, v, mask, scale=c^2)
    if not _fuse_ok(m):
        return None
    cq, ck = float(m.const("cq").reshape(-1)[0]), float(m.const("ck").reshape(-1)[0])
    y = m.op.Attention(m["q"], m["k"], m["v"], m["mask"], scale=float(np.float32(cq) * np.float32(ck)))
    y.type = m.root.outputs[0].type
    return y


ATTENTION_FUSION = RuleTable([Rule(_PATTERN, _fuse, "decomposed_sdpa_to_attention")])
"""The rule table of the fusion (one rule)."""


def _dims_equal(a: Any, b: Any) -> bool:
    return a is not None and b is not None and a == b


def _unrepeated(m: Match, kr: Value) -> tuple[Value, int] | None:
    """``(k, G)`` when ``kr`` is ``Reshape(Expand(Unsqueeze(k, [2]), [B, H, G, T, D]),
    [B, H*G, T, D])`` (shapes proven by the analysis), else None."""
    from onnxforge.passes.rewrites.fold import constant_value

    rs = kr.producer()
    if rs is None or rs.op_type != "Reshape" or not is_default_domain(rs.domain) or rs.inputs[0] is None:
        return None
    ex = rs.inputs[0].producer()
    if ex is None or ex.op_type != "Expand" or not is_default_domain(ex.domain) or ex.inputs[0] is None:
        return None
    un = ex.inputs[0].producer()
    if (un is None or un.op_type != "Unsqueeze" or not is_default_domain(un.domain) or len(un.inputs) != 2
            or un.inputs[0] is None or un.inputs[1] is None):
        return None
    axes = constant_value(un.inputs[1])
    if axes is None or axes.reshape(-1).tolist() not in ([2], [-3]):
        return None
    k = un.inputs[0]
    ks, es, rsh = m.shape_of(k), m.shape_of(ex.outputs[0]), m.shape_of(kr)
    if ks is None or es is None or rsh is None or (len(ks), len(es), len(rsh)) != (4, 5, 4):
        return None
    heads, g = ks[1], es[2]
    if type(heads) is not int or type(g) is not int or g < 1:
        return None
    same = all(_dims_equal(ks[i], es[j]) for i, j in ((0, 0), (1, 1), (2, 3), (3, 4)))
    if not same or not all(_dims_equal(ks[i], rsh[i]) for i in (0, 2, 3)) or rsh[1] != heads * g:
        return None
    return k, g


def _drop_repeat_kv(m: Match) -> Value | Sequence[Value] | None:
    # Attention(q, repeat(k, G), repeat(v, G), ...) = Attention(q, k, v, ...) (grouped heads)
    node = m.root
    if any(a in node.attributes for a in ("q_num_heads", "kv_num_heads")) or m.rank_of(m["q"]) != 4:
        return None
    if any(o.num_uses() or node.graph.is_output(o) for o in node.outputs[1:]):
        return None
    k, v = _unrepeated(m, m["k"]), _unrepeated(m, m["v"])
    if k is None or v is None or k[1] != v[1] or k[1] == 1:
        return None
    qs, ks, vs = m.shape_of(m["q"]), m.shape_of(k[0]), m.shape_of(v[0])
    if qs is None or type(qs[1]) is not int or qs[1] != ks[1] * k[1] or ks[1] != vs[1]:
        return None
    mask = [m["mask"]] if "mask" in m.values else []
    outs = len(node.outputs)
    y = m.op.Attention(m["q"], k[0], v[0], *mask, _outputs=outs, **node.attributes)
    ys = [y] if outs == 1 else list(y)
    for new, old in zip(ys, node.outputs):
        new.type = old.type
    return ys[0] if outs == 1 else ys


REPEAT_KV_RULES = RuleTable([
    Rule(Pattern("Attention", "q", "k", "v"), _drop_repeat_kv, "attention_repeat_kv"),
    Rule(Pattern("Attention", "q", "k", "v", "mask"), _drop_repeat_kv, "attention_repeat_kv_mask"),
])
"""``Attention`` over repeated KV heads reads the grouped heads directly (module docstring)."""


def opset_problem(model: Model) -> str | None:
    """Why the default-domain opset cannot be raised to 23 without changing a meaning, or None."""
    current = model.opset_imports.get("", model.opset_imports.get("ai.onnx"))
    if current is None or current >= ATTENTION_OPSET:
        return None
    seen: set[str] = set()
    for g in model.all_graphs():
        for n in g:
            if not is_default_domain(n.domain) or n.op_type in seen:
                continue
            seen.add(n.op_type)
            why = _signature_change(n.op_type, current)
            if why:
                return f"{g.path()}.node({n.name!r}): {n.op_type} {why}"
    return None


def _signature(schema: Any) -> tuple:
    attrs = tuple(sorted((a.name, int(a.type), a.required) for a in schema.attributes.values()))
    ports = tuple((p.name, int(p.option)) for p in list(schema.inputs) + list(schema.outputs))
    return attrs, ports


def _signature_change(op_type: str, current: int) -> str | None:
    new, old = get_schema(op_type, ATTENTION_OPSET, ""), get_schema(op_type, current, "")
    if new is None or old is None:
        return f"has no schema at opset {current} or {ATTENTION_OPSET}"
    if new.since_version <= current:
        return None
    if op_type in SEMANTIC_CHANGES or _signature(new) != _signature(old):
        return f"changed between opset {current} and {ATTENTION_OPSET} (version {new.since_version})"
    return None


def fuse_attention(model: Model) -> int:
    """Fuse every decomposed attention of ``model`` (in place); returns how many.

    Raises :class:`AttentionFusionError`, changing nothing, when a fusion would need an
    opset raise that changes the meaning of another operator.
    """
    if not any(n.op_type == "Softmax" for g in model.all_graphs() for n in g):
        return 0
    problem = opset_problem(model)
    declined: list[str] = []

    def fuse(m: Match) -> Value | None:
        if problem is None:
            return _fuse(m)
        if _fuse_ok(m):
            declined.append(m.node("softmax").name)
        return None

    count = apply_rules(model, RuleTable([Rule(_PATTERN, fuse, "decomposed_sdpa_to_attention")]))
    if declined:
        raise AttentionFusionError(f"{problem}: the fused Attention of softmax {declined[0]!r} needs "
                                   f"opset {ATTENTION_OPSET}, so the model is left as it is")
    if count:
        eliminate_dead_code(model)
        key = default_domain_key(model.opset_imports)
        if model.opset_imports.get(key, 0) < ATTENTION_OPSET:
            model.opset_imports[key] = ATTENTION_OPSET
    return count
