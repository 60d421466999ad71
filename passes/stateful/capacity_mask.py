"""Compute an in-place decoder's attention mask at the cache capacity, then view its prefix.

After :mod:`onnxforge.passes.stateful.concat_caches`, a decoder's attention mask is still
built per call over the total length ``T = published + new`` (key positions
``Range(0, T)``, the padding read from ``attention_mask``), so every step would
allocate a little more than the last. This rewrite builds the mask over the
capacity ``N`` instead, a shape that does not change between steps, and hands
``Attention`` the view of its first ``T`` key positions::

    before                                           after (capacity N)
      T    = Add(published, new)                       kv   = Range(0, N)          (a constant)
      kv   = Range(0, T)                               am   = Pad(attention_mask, [0, 0, 0, N - T])
      m    = And(LessOrEqual(kv, q), Gather(am, kv))   m    = And(LessOrEqual(kv, q), Gather(am, kv))
      y    = Attention(q, k, v, m)                     y    = Attention(q, k, v, Slice(m, 0, T, axis=-1))

The *mask cone* is the set of nodes whose every output is read only by the cone or
by an ``Attention`` mask input (port 3). Inside the cone, each use of a value equal
to ``T`` (found by a small linear evaluation of the int64 length arithmetic in terms of
the published length and ``Shape(input_ids)[1]``) reads the constant ``N``, and each
read of ``attention_mask`` reads it zero-padded to ``N``. This is exact when the cone
computes the mask position by position along the key axis (elementwise, broadcast,
gather and shape operators: :data:`POSITIONWISE`): the first ``T`` key positions are
then what the original computed, and the others are sliced away. A cone holding any
other operator is left as it is (the mask stays correct, its allocation grows with
the context), and :func:`capacity_mask` returns 0.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from onnxforge.graphbuilder.ir.core import Graph, Model, Value
from onnxforge.passes.framework.domains import is_default_domain
from onnxforge.passes.rewrites.fold import constant_value
from onnxforge.proto_ext.types import TensorType

__all__ = ["POSITIONWISE", "capacity_mask"]

POSITIONWISE = frozenset({
    "And", "Or", "Xor", "Not", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Equal", "Max", "Min",
    "Add", "Sub", "Mul", "Where", "Cast", "Neg", "IsNaN", "IsInf", "Identity", "Unsqueeze", "Squeeze",
    "Expand", "Shape", "Concat", "Reshape", "Range", "Gather", "GatherND",
})
"""Operators the mask cone may hold (each computes key position j from key position j)."""

_INT64 = 7
Form = tuple[int, int, int]  # published, new tokens, constant


def _forms(g: Graph, published: Value, new: Value, total: Value, ids: Value,
           mask: Value) -> dict[int, tuple[Form, int]]:
    """Linear forms and ranks (0 or 1) of the one-element int64 length values of ``g``."""
    forms: dict[int, tuple[Form, int]] = {id(published): ((1, 0, 0), 1), id(new): ((0, 1, 0), 1),
                                          id(total): ((1, 1, 0), 1)}
    for n in g:
        if not is_default_domain(n.domain) or len(n.outputs) != 1:
            continue
        ins = n.inputs
        got: tuple[Form, int] | None = None
        src = forms.get(id(ins[0])) if ins and ins[0] is not None else None
        if n.op_type == "Shape" and ins[0] in (ids, mask) and n.attr("start", 0) == 1 and n.attr("end") == 2:
            got = ((0, 1, 0) if ins[0] is ids else (1, 1, 0), 1)
        elif src is not None and n.op_type in ("Identity", "Cast") and n.attr("to", _INT64) == _INT64:
            got = src
        elif src is not None and n.op_type in ("Squeeze", "Unsqueeze", "Reshape"):
            rank = {"Squeeze": 0, "Unsqueeze": 1}.get(n.op_type)
            if rank is None:
                target = constant_value(ins[1]) if len(ins) > 1 else None
                rank = None if target is None or target.size > 1 else target.size
            got = (src[0], rank) if rank is not None else None
        elif n.op_type in ("Add", "Sub") and len(ins) == 2:
            a, b = (_form(forms, v) for v in ins)
            if a is not None and b is not None:
                s = 1 if n.op_type == "Add" else -1
                got = ((a[0][0] + s * b[0][0], a[0][1] + s * b[0][1], a[0][2] + s * b[0][2]), max(a[1], b[1]))
        if got is not None:
            forms[id(n.outputs[0])] = got
    return forms


def _form(forms: dict[int, tuple[Form, int]], v: Value | None) -> tuple[Form, int] | None:
    if v is None:
        return None
    f = forms.get(id(v))
    if f is not None:
        return f
    c = constant_value(v)
    if c is not None and c.size == 1 and c.dtype.kind in "iu" and c.ndim <= 1:
        return ((0, 0, int(c.reshape(-1)[0])), c.ndim)
    return None


def _cone(g: Graph, sinks: set[tuple[int, int]]) -> set[int]:
    """Nodes whose every output is read only inside the cone or at an Attention mask port."""
    cone: set[int] = set()
    outputs = {id(v) for v in g.outputs}
    for n in reversed(list(g)):
        if not n.outputs or any(id(o) in outputs for o in n.outputs):
            continue
        ok = True
        for o in n.outputs:
            for user, i in o.uses():
                if (id(user), i) not in sinks and id(user) not in cone:
                    ok = False
                    break
            if not ok:
                break
        if ok and any(o.num_uses() for o in n.outputs):
            cone.add(id(n))
    return cone


def capacity_mask(model: Model, capacity: int, *, published: Value, new: Value, total: Value,
                  ids: Value, mask: Value, emit: Any) -> int:
    """Rewrite the mask cone of ``model``'s Attention nodes at ``capacity``; returns the number
    of Attention masks now read through a prefix view (0: left as it was)."""
    g = model.graph
    atts = [n for n in g if n.op_type == "Attention" and is_default_domain(n.domain)
            and len(n.inputs) > 3 and n.inputs[3] is not None]
    if not atts:
        return 0
    sinks = {(id(n), 3) for n in atts}
    cone = _cone(g, sinks)
    members = [n for n in g if id(n) in cone]
    if any(not is_default_domain(n.domain) or n.op_type not in POSITIONWISE for n in members):
        return 0
    forms = _forms(g, published, new, total, ids, mask)
    uses_total = [(n, i, forms[id(v)][1]) for n in members for i, v in enumerate(n.inputs)
                  if v is not None and forms.get(id(v), ((0, 0, 0), 0))[0] == (1, 1, 0)]
    uses_mask = [(n, i) for n in members for i, v in enumerate(n.inputs)
                 if v is mask and n.op_type != "Shape"]
    if not uses_total:
        return 0
    first = next(iter(g))
    padded = None
    if uses_mask:
        # pads = [0, 0, 0, N - T]: attention_mask [B, T] -> [B, N], zeros after T
        cap = emit.const(np.array([capacity]), "capacity_1d")
        rest = emit.node("Sub", [cap, total], TensorType(_INT64, (1,)), before=first, hint="mask_padding")
        pads = emit.node("Concat", [emit.const(np.zeros(3, np.int64), "zeros_3"), rest],
                         TensorType(_INT64, (4,)), before=first, hint="mask_pads", axis=0)
        mt = mask.type
        b = mt.shape[0] if isinstance(mt, TensorType) and mt.shape else None
        padded = emit.node("Pad", [mask, pads], TensorType(mt.elem_type, (b, capacity)), before=first,
                           hint="attention_mask_at_capacity", mode="constant")
    for n, i, rank in uses_total:
        n.set_input(i, emit.const(np.full((1,) * rank, capacity, np.int64), "capacity"))
    for n, i in uses_mask:
        n.set_input(i, padded)
    for n in members:  # their key axis is the capacity now: the shapes are inferred again
        for o in n.outputs:
            if isinstance(o.type, TensorType):
                o.type = TensorType(o.type.elem_type, None)
    minus_one = emit.const(np.array([-1]), "last_axis")
    zero = emit.const(np.array([0]), "zero_1d")
    for att in atts:
        m = att.inputs[3]
        mt = m.type
        view_t = None
        if isinstance(mt, TensorType) and mt.shape is not None:
            view_t = TensorType(mt.elem_type, (*mt.shape[:-1], None))
        view = emit.node("Slice", [m, zero, total, minus_one], view_t, before=att, hint="mask_valid")
        att.set_input(3, view)
    return len(atts)
