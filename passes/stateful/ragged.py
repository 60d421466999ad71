"""The batched (ragged) form of a paged decoder: many sequences in one run.

``make_stateful(model, N, cache="paged", ragged=True)`` first makes the one-sequence
paged model (:mod:`onnxforge.passes.stateful.paged`), then lets one run carry the new
tokens of several sequences, concatenated along the sequence axis of a batch of one::

    one sequence (paged)                         ragged
      input_ids [1, S], attention_mask [1, L]      input_ids [1, T], position_ids [1, T],
                                                   sequence_starts [N + 1]
      c' = PagedCacheUpdate(cache, k, v, pos)      c' = RaggedPagedCacheUpdate(cache, k, v,
                                                          sequence_starts, position_ids)
      y  = PagedAttention(q, c')                   y  = RaggedPagedAttention(q, c', sequence_starts)
      logits [1, S, V]                             logits [1, N, V] (each sequence's last row)

Sequence ``i`` owns rows ``[sequence_starts[i], sequence_starts[i + 1])``; its tokens
sit at the positions ``position_ids`` gives, which start at the length its own cache
holds. The cache input of each layer is then a batch of page tables, one per sequence
(:class:`onnxforge.kernels_cy.paged.batch.PageBatch` at run time; the same container
declaration, rule K10). Everything between the attentions works on rows and is left as
it is: projections and MLP become one product over all the rows of the step.

The positions replace what the paged model derived from ``attention_mask`` (its
published length): the rotary embedding's position ids (``com.microsoft``
RotaryEmbedding's input, or the ``Range(0, S) + published`` of a torch export) and
the caches' write position. A model that reads the published length in any other
way is refused with a :class:`StatefulError` naming the node. The head is computed
only for each sequence's last row (a Gather before the last product).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from onnxforge.graphbuilder.builder.opschemas import ONNXFORGE_DOMAIN
from onnxforge.graphbuilder.ir.core import MUST_ALIAS, Alias, Model, Node, Value
from onnxforge.graphbuilder.ir.storage import Storage
from onnxforge.passes.framework.domains import is_default_domain
from onnxforge.passes.rewrites.dce import eliminate_dead_code
from onnxforge.passes.rewrites.fold import constant_value
from onnxforge.passes.rewrites.topo import schedule
from onnxforge.passes.stateful.concat_caches import Emitter
from onnxforge.passes.stateful.convert import StatefulError
from onnxforge.proto_ext.types import TensorType

__all__ = ["POSITION_IDS", "SEQUENCE_STARTS", "to_ragged"]

POSITION_IDS = "position_ids"
SEQUENCE_STARTS = "sequence_starts"
_INT64 = 7
_PASS_THROUGH = {"Squeeze", "Unsqueeze", "Reshape", "Cast", "Identity"}


def _where(n: Node) -> str:
    return f"{n.domain or 'ai.onnx'}::{n.op_type} {n.name!r}"


def _is(n: Node | None, domain: str, op: str) -> bool:
    return n is not None and n.op_type == op and (n.domain == domain or (not domain and is_default_domain(n.domain)))


def _int_const(v: Value | None) -> int | None:
    a = constant_value(v)
    if a is None or a.size != 1 or a.dtype.kind not in "iu":
        return None
    return int(a.reshape(-1)[0])


def _arange_from_zero(v: Value) -> bool:
    """``v`` is ``Range(0, n, 1)`` (possibly cast)."""
    n = v.producer()
    while n is not None and n.op_type == "Cast":
        n = n.inputs[0].producer() if n.inputs[0] is not None else None
    return _is(n, "", "Range") and _int_const(n.inputs[0]) == 0 and _int_const(n.inputs[2]) == 1


def to_ragged(model: Model) -> Model:
    """Rewrite a one-sequence paged decoder (the output of ``to_paged``) into its ragged
    batched form (see the module docstring); returns ``model``."""
    g = model.graph
    updates = [n for n in g if (n.domain, n.op_type) == (ONNXFORGE_DOMAIN, "PagedCacheUpdate")]
    if not updates:
        raise StatefulError("no PagedCacheUpdate: the ragged form rewrites a paged decoder")
    em = Emitter(model)
    ids = next((v for v in g.inputs if v.name == "input_ids"), None)
    if ids is None:
        raise StatefulError("the model has no input 'input_ids'")
    pos_ids = Value(em.names.fresh(POSITION_IDS), TensorType(_INT64, (1, "total_tokens")))
    starts = Value(em.names.fresh(SEQUENCE_STARTS), TensorType(_INT64, ("sequences_plus_one",)))
    g.add_input(pos_ids)
    g.add_input(starts)
    ids.type = TensorType(ids.type.elem_type, (1, "total_tokens"))
    first = next(iter(g))
    flat = em.node("Reshape", [pos_ids, em.const(np.array([-1], np.int64), "flat_shape")],
                   TensorType(_INT64, ("total_tokens",)), before=first, hint="positions_flat")

    # each write position's published length (one per model, or one per layer)
    published = {id(p): p for p in (_published(n.inputs[3]) for n in updates)}
    for value in published.values():
        _reroute_positions(em, value, pos_ids, flat, first)
    for upd in updates:
        _convert_layer(em, upd, starts, pos_ids)
    _gather_last_rows(em, starts)
    eliminate_dead_code(model)
    for v in list(g.inputs):  # attention_mask fed only the published length
        if v.name == "attention_mask" and not v.uses():
            g.remove_input(v)
    g.reorder(schedule(g, Storage(model)))
    return model


def _published(position: Value) -> Value:
    """The published-length value the paged model wrote its caches at: the one-element
    ``total - new`` the position scalar is reshaped from."""
    n = position.producer()
    if not _is(n, "", "Reshape") or n.inputs[0] is None:
        raise StatefulError(f"the caches' write position {position.name!r} is not the reshaped published "
                            f"length the paged rewrite makes")
    return n.inputs[0]


def _reroute_positions(em: Emitter, published: Value, pos_ids: Value, flat: Value, first: Node) -> None:
    """Every reader of the published length reads the per-token positions instead."""
    for user, port in published.uses():
        if _is(user, "com.microsoft", "RotaryEmbedding") and port == 1:
            user.set_input(1, pos_ids)  # [1] start offset -> [1, T] positions
            continue
        if _is(user, "", "Reshape") and all(u.op_type in ("PagedCacheUpdate",) for u, _ in user.outputs[0].uses()):
            continue  # the caches' write position: the ragged updates take the positions instead
        if user.op_type in _PASS_THROUGH and is_default_domain(user.domain):
            _reroute_scalar(em, user.outputs[0], flat)
            continue
        raise StatefulError(f"{_where(user)} reads the published length; the ragged form knows only the "
                            f"rotary positions and the caches' write position")


def _reroute_scalar(em: Emitter, scalar: Value, flat: Value) -> None:
    """``Add(Range(0, S, 1), published)`` (a torch export's positions) -> the positions."""
    for user, port in scalar.uses():
        if user.op_type in _PASS_THROUGH and is_default_domain(user.domain):
            _reroute_scalar(em, user.outputs[0], flat)
            continue
        other = user.inputs[1 - port] if _is(user, "", "Add") and len(user.inputs) == 2 else None
        if other is None or not _arange_from_zero(other):
            raise StatefulError(f"{_where(user)} reads the published length; the ragged form recognizes "
                                f"Range(0, S, 1) + published (the rotary positions) only")
        out = user.outputs[0]
        t = out.type
        src = flat
        if isinstance(t, TensorType) and t.elem_type and t.elem_type != _INT64:
            src = em.node("Cast", [flat], TensorType(t.elem_type, ("total_tokens",)), before=user,
                          hint="positions_cast", to=t.elem_type)
        out.replace_all_uses_with(src, outputs=True)


def _convert_layer(em: Emitter, upd: Node, starts: Value, pos_ids: Value) -> None:
    g = em.g
    cache, key, value = upd.inputs[0], upd.inputs[1], upd.inputs[2]
    out = upd.outputs[0]
    attention = [u for u, _ in out.uses() if (u.domain, u.op_type) == (ONNXFORGE_DOMAIN, "PagedAttention")]
    others = [u for u, _ in out.uses() if u not in attention]
    if len(attention) > 1 or others:
        raise StatefulError(f"{_where(upd)}: the ragged form needs the updated cache read by at most one "
                            f"PagedAttention and nothing else, found "
                            f"{[_where(u) for u, _ in out.uses()]}")
    new = em.node("RaggedPagedCacheUpdate", [cache, key, value, starts, pos_ids], out.type, before=upd,
                  domain=ONNXFORGE_DOMAIN, hint=out.name)
    new.producer().output_alias.append(Alias(0, 0, MUST_ALIAS))
    new.alias_of = cache
    for att in attention:  # none where the layer's attention output is never read
        if len(att.inputs) > 2 and att.inputs[2] is not None:
            raise StatefulError(f"{_where(att)}: a total_length input has no ragged form")
        attrs: dict[str, Any] = {a: att.attr(a) for a in ("num_heads", "kv_num_heads", "scale")
                                 if att.attr(a) is not None}
        y = em.node("RaggedPagedAttention", [att.inputs[0], new, starts], att.outputs[0].type, before=att,
                    domain=ONNXFORGE_DOMAIN, hint=att.outputs[0].name, **attrs)
        att.outputs[0].replace_all_uses_with(y, outputs=True)
        g.remove(att, safe=False)
    out.replace_all_uses_with(new, outputs=True)  # bindings and graph outputs too
    out.alias_of = None
    upd.output_alias.clear()
    g.remove(upd, safe=False)
    new.name, out.name = out.name, new.name  # the bound output keeps its name (present.N)


def _gather_last_rows(em: Emitter, starts: Value) -> None:
    """Logits only for each sequence's last row: ``rows = sequence_starts[1:] - 1`` gathered
    before the last product (or, for any other head, from the logits)."""
    g = em.g
    logits = next((o for o in g.outputs if o.name == "logits"), None)
    if logits is None:
        raise StatefulError("the model has no output 'logits'")
    n = logits.producer()
    one = em.const(np.array([1], np.int64), "one")
    end = em.const(np.array([np.iinfo(np.int64).max], np.int64), "end")
    first = next(iter(g))
    tail = em.node("Slice", [starts, one, end], TensorType(_INT64, ("sequences",)), before=first,
                   hint="sequence_ends")
    rows = em.node("Sub", [tail, one], TensorType(_INT64, ("sequences",)), before=first, hint="last_rows")
    a = n.inputs[0] if _is(n, "", "MatMul") else None
    at = a.type if a is not None else None
    if a is not None and isinstance(at, TensorType) and at.shape is not None and len(at.shape) == 3:
        picked = em.node("Gather", [a, rows], TensorType(at.elem_type, (1, "sequences", at.shape[2])),
                         before=n, hint="last_hidden", axis=1)
        n.set_input(0, picked)
    else:
        lt = logits.type
        shape = (1, "sequences", *lt.shape[2:]) if isinstance(lt, TensorType) and lt.shape else None
        picked = em.node("Gather", [logits, rows], TensorType(lt.elem_type, shape), before=None,
                         hint="last_logits", axis=1)
        g.outputs[:] = [picked if o is logits else o for o in g.outputs]
        picked.name, logits.name = logits.name, picked.name
        return
    lt = logits.type
    if isinstance(lt, TensorType) and lt.shape is not None and len(lt.shape) == 3:
        logits.type = TensorType(lt.elem_type, (1, "sequences", lt.shape[2]))
