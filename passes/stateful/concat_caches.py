"""In-place caches for Concat-based past/present decoders (``torch.onnx`` exports).

In these decoders every layer appends its new keys (values) to the past with
``present = Concat(past, new, axis=-2)``, repeats the KV heads for the query heads
(``Unsqueeze -> Expand -> Reshape``, "repeat_kv") and feeds the standard
``Attention``; the past length is read from the past's shape. The rewrite makes each
past a capacity-sized READ_WRITE buffer written in place and lets ``Attention``
read the valid prefix with grouped heads::

    before                                          after (max_length=N)
      past_key_values.0.key [B, 2, past, 32]          past_key_values.0.key [B, 2, N, 32] READ_WRITE
      present.0.key = Concat(past, k, axis=-2)        present.0.key = ai.onnxforge::CacheUpdate(
      kr = Reshape(Expand(Unsqueeze(present, 2)))                         past, k, published)
      y  = Attention(q, kr, vr, mask)                   (alias_of past; bound past <- present)
      len = Squeeze(Shape(past, 2, 3))                kv = Slice(present.0.key, [0], total, axes=[2])
                                                      y  = Attention(q, kv, vv, mask)
                                                      len = Squeeze(published_1d)

with ``total = Shape(attention_mask)[1]`` and ``published = total - Shape(input_ids)[1]``
computed in the graph: the per-call inputs stay ``input_ids`` and ``attention_mask``
(length published + new tokens). Every other read of a past's shape reads
``published`` for the sequence axis, so nothing reads the capacity as a length, and
``Shape(input_ids)[0]`` or the declared size for the other axes.
``Slice`` is a view in the backend, and its ``Attention`` kernel handles kv heads <
query heads, so a decode step neither copies nor expands the cache.

Anything else reading a past or a present is a :class:`StatefulError` naming the
node and why. Decomposed attention (opset < 23) is fused into ``Attention`` first
(:mod:`onnxforge.passes.rewrites.attention_fusion`).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from onnxforge.graphbuilder.ir.core import (
    MUST_ALIAS,
    READ_WRITE,
    Alias,
    Graph,
    Model,
    Node,
    Value,
)
from onnxforge.graphbuilder.ir.names import NameScope
from onnxforge.graphbuilder.builder.opschemas import ONNXFORGE_DOMAIN
from onnxforge.graphbuilder.ir.storage import Storage
from onnxforge.graphbuilder.ir.tensors import Tensor
from onnxforge.passes.rewrites.dce import eliminate_dead_code
from onnxforge.passes.framework.domains import is_default_domain
from onnxforge.passes.rewrites.fold import constant_value
from onnxforge.passes.framework.records import make_attrs
from onnxforge.passes.rewrites.rename import transfer_value
from onnxforge.passes.stateful.convert import StatefulError
from onnxforge.passes.stateful.capacity_mask import capacity_mask
from onnxforge.passes.rewrites.topo import schedule
from onnxforge.proto_ext.types import TensorType

__all__ = ["Emitter", "convert_concat_caches"]

_INT64 = 7
_RANK = 4
_SEQ = 2  # the sequence axis of [batch, kv_heads, sequence, head_size]


def _where(n: Node) -> str:
    return f"{n.domain or 'ai.onnx'}::{n.op_type} {n.name!r}"


class Emitter:
    """Nodes and small constants with names unused in the model."""

    def __init__(self, model: Model):
        self.g = model.graph
        self.names = NameScope.from_model(model)

    def node(self, op: str, inputs: Sequence[Value | None], out_type: Any, *, before: Node | None,
             domain: str = "", hint: str = "", **attrs: Any) -> Value:
        base = hint or op
        out = Value(self.names.fresh(base), out_type)
        n = Node(domain, op, list(inputs), [out], name=self.names.fresh(f"stateful/{base}"),
                 attributes=make_attrs(attrs, StatefulError, f"stateful {op} node {base!r}"))
        if before is None:
            self.g.append(n)
        else:
            self.g.insert_before(before, n)
        return out

    def const(self, array: Any, hint: str) -> Value:
        arr = np.array(array, order="C")
        v = Value(self.names.fresh(hint), TensorType(_INT64, tuple(arr.shape)))
        self.g.add_initializer(v, Tensor.from_numpy(arr))
        return v


def _check_pair(past: Value, present: Value) -> tuple[Node, list[tuple[Node, int]]]:
    """The Concat of the pair and the ``(Attention, port)`` reads of its present."""
    cat = present.producer()
    assert cat is not None  # make_stateful checked that present = Concat(past, new)
    t = past.type
    if not isinstance(t, TensorType) or t.shape is None or len(t.shape) != _RANK:
        raise StatefulError(f"input {past.name!r}: expected a rank-4 cache [batch, kv_heads, past, "
                            f"head_size], got {t}")
    if cat.attr("axis") not in (-2, _SEQ):
        raise StatefulError(f"output {present.name!r}: {_where(cat)} concatenates along axis "
                            f"{cat.attr('axis')}, not the sequence axis -2 of input {past.name!r}")
    for n, _ in past.uses():
        if n is not cat and not (n.op_type == "Shape" and is_default_domain(n.domain)):
            raise StatefulError(f"input {past.name!r} is read by {_where(n)}; an in-place cache may be read "
                                f"only by its Concat and by Shape")
    reads: list[tuple[Node, int]] = []
    for n, i in present.uses():
        reads.extend(_attention_reads(present, n, i))
    if not reads:
        raise StatefulError(f"output {present.name!r} is not read by any Attention node: no attention "
                            f"over the cache was recognized (input {past.name!r})")
    return cat, reads


def _sole_use(v: Value, op: str) -> Node | None:
    uses = v.uses()
    if len(uses) == 1 and uses[0][1] == 0 and uses[0][0].op_type == op and is_default_domain(uses[0][0].domain):
        return uses[0][0]
    return None


def _attention_reads(present: Value, n: Node, i: int) -> list[tuple[Node, int]]:
    """Attention ports fed by ``present`` directly or through repeat_kv
    (``Reshape(Expand(Unsqueeze(present, [2])))``)."""
    if n.op_type == "Attention" and is_default_domain(n.domain) and i in (1, 2):
        return [(n, i)]
    why = f"{_where(n)} reads it (expected Attention, or repeat_kv: Unsqueeze(axes=[2]) -> Expand -> Reshape)"
    if n.op_type == "Unsqueeze" and is_default_domain(n.domain) and i == 0 and len(n.inputs) == 2:
        axes = constant_value(n.inputs[1])
        ex = _sole_use(n.outputs[0], "Expand")
        rs = _sole_use(ex.outputs[0], "Reshape") if ex is not None else None
        if axes is not None and axes.reshape(-1).tolist() in ([2], [-3]) and rs is not None:
            out = []
            for m, j in rs.outputs[0].uses():
                if not (m.op_type == "Attention" and is_default_domain(m.domain) and j in (1, 2)):
                    raise StatefulError(f"output {present.name!r}: its repeated heads are read by {_where(m)}, "
                                        f"not by an Attention node's key or value")
                out.append((m, j))
            return out
    if n.op_type in ("MatMul", "Transpose", "Softmax") or n.op_type == "Reshape":
        why += "; an attention left decomposed (MatMul / Softmax) is not recognized"
    raise StatefulError(f"output {present.name!r}: {why}")


def _check_attention(n: Node) -> None:
    if len(n.outputs) != 1 or len(n.inputs) > 4:
        raise StatefulError(f"{_where(n)}: an Attention with past inputs or extra outputs is not supported "
                            f"over an in-place cache")


def _shape_range(n: Node) -> tuple[int, int]:
    start, end = n.attr("start", 0), n.attr("end", _RANK)
    start = max(0, min(_RANK, start + _RANK if start < 0 else start))
    end = max(0, min(_RANK, end + _RANK if end < 0 else end))
    return start, end


def convert_concat_caches(model: Model, pairs: Sequence[tuple[Value, Value]], max_length: int,
                          batch: int | None) -> None:
    """Rewrite the Concat-based caches of ``pairs`` (past, present) in place (see the module)."""
    g: Graph = model.graph
    inputs = {v.name: v for v in g.inputs}
    ids, mask = inputs.get("input_ids"), inputs.get("attention_mask")
    if ids is None or mask is None:
        raise StatefulError("a Concat-based cache needs the inputs input_ids and attention_mask: the "
                            "published length is attention_mask's length minus input_ids' length")
    checked = [(past, present, *_check_pair(past, present)) for past, present in pairs]
    for _, _, _, reads in checked:
        for n, _ in reads:
            _check_attention(n)
    em = Emitter(model)
    first = next(iter(g), None)
    total_sym = mask.type.shape[1] if isinstance(mask.type, TensorType) and mask.type.shape else None
    one_d = TensorType(_INT64, (1,))
    total = em.node("Shape", [mask], one_d, before=first, hint="total_length", start=1, end=2)
    new = em.node("Shape", [ids], one_d, before=first, hint="new_length", start=1, end=2)
    published = em.node("Sub", [total, new], one_d, before=first, hint="published_length")
    position = em.node("Reshape", [published, em.const(np.zeros((0,), np.int64), "scalar_shape")],
                       TensorType(_INT64, ()), before=first, hint="position")
    zero, seq_axis = em.const(np.array([0]), "zero_1d"), em.const(np.array([_SEQ]), "sequence_axis")
    for past, present, cat, reads in checked:
        t = past.type
        b = batch if batch is not None else t.shape[0]
        cap_t = TensorType(t.elem_type, (b, t.shape[1], max_length, t.shape[3]))
        u = em.node("CacheUpdate", [past, cat.inputs[1], position], cap_t, before=cat,
                    domain=ONNXFORGE_DOMAIN, hint=f"{present.name}/update", axis=-2)
        u.producer().output_alias.append(Alias(0, 0, MUST_ALIAS))
        view_t = TensorType(t.elem_type, (b, t.shape[1], total_sym, t.shape[3]))
        kv = em.node("Slice", [u, zero, total, seq_axis], view_t, before=cat, hint=f"{present.name}/valid")
        for n, i in reads:
            n.set_input(i, kv)
        for n in [n for n, _ in past.uses() if n.op_type == "Shape"]:
            _reroute_shape(em, n, published, ids)
        transfer_value(present, u)
        g.remove(cat, safe=False)
        u.type = cap_t
        past.type = cap_t
        past.access = READ_WRITE
        u.alias_of = past
        g.bindings.append((past, u))
    if ONNXFORGE_DOMAIN not in model.opset_imports:
        model.opset_imports[ONNXFORGE_DOMAIN] = 1
    eliminate_dead_code(model)
    if capacity_mask(model, max_length, published=published, new=new, total=total, ids=ids, mask=mask,
                     emit=em):
        eliminate_dead_code(model)
    g.reorder(schedule(g, Storage(model)))


def _reroute_shape(em: Emitter, n: Node, published: Value, ids: Value) -> None:
    """``Shape(past, start, end)`` reads the published length for the sequence axis,
    ``Shape(input_ids)[0]`` for the batch and the declared sizes of the other axes (the
    past's shape itself is read only where such a size is symbolic)."""
    start, end = _shape_range(n)
    past = n.inputs[0]
    dims = past.type.shape
    parts: list[Value] = []
    for axis in range(start, end):
        if axis == _SEQ:
            parts.append(published)
        elif axis == 0:
            parts.append(em.node("Shape", [ids], TensorType(_INT64, (1,)), before=n, hint="batch_size",
                                 start=0, end=1))
        elif isinstance(dims[axis], int):
            parts.append(em.const(np.array([dims[axis]]), f"cache_dim{axis}"))
        else:
            parts.append(em.node("Shape", [past], TensorType(_INT64, (1,)), before=n,
                                 hint=f"cache_dim{axis}", start=axis, end=axis + 1))
    out = n.outputs[0]
    if not parts:
        repl = em.const(np.zeros((0,), np.int64), "empty_shape")
    elif len(parts) == 1:
        repl = parts[0]
    else:
        repl = em.node("Concat", parts, TensorType(_INT64, (end - start,)), before=n, hint="cache_shape",
                       axis=0)
    out.replace_all_uses_with(repl, outputs=True)
    em.g.remove(n, safe=False)
