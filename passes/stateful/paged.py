"""Paged KV caches for in-place stateful decoders: one paged cache per attention layer.

``make_stateful(model, N, cache="paged", page_size=P, formats=[...])`` first makes the
contiguous in-place model (capacity-sized READ_WRITE caches), then replaces each
layer's pair of caches and its attention by a paged cache (the ``ONNXFORGE_PAGED_KV_CACHE``
struct of :mod:`onnxforge.proto_ext.codecs.kvcache`: ``ceil(N / P)`` pages, each stored in
the format the policy ``formats`` gives it by age, newest first)::

    contiguous (torch.onnx families)              paged
      uk = CacheUpdate(past.0.key, k, pos)          c' = PagedCacheUpdate(past_key_values.0, k, v, pos)
      uv = CacheUpdate(past.0.value, v, pos)        y  = PagedAttention(q, c')
      y  = Attention(q, Slice(uk), Slice(uv), m)      (c' alias_of the cache; bound cache <- c')

    contiguous (onnxruntime-genai family)         paged
      y, pk, pv = GroupQueryAttention(q, k, v,      qr, kr = RotaryEmbedding(q), RotaryEmbedding(k)
          past.0.key, past.0.value, seqlens,        c' = PagedCacheUpdate(past_key_values.0,
          total, cos, sin)  (shared buffer)                  heads(kr), heads(v), total - S)
                                                    y  = merge(PagedAttention(heads(qr), c'))

``heads`` is ``[1, S, H*D] -> [1, H, S, D]`` (Reshape + Transpose of the new tokens
only) and ``merge`` its inverse. The paged attention is causal over the cache's valid
tokens: the converted model serves one sequence (batch 1) whose ``attention_mask`` is
all ones (no padding), which is what ``generate`` feeds; a padded mask is not read.
The per-call inputs stay ``input_ids`` and ``attention_mask``.
"""
from __future__ import annotations

import math
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
from onnxforge.graphbuilder.builder.opschemas import ONNXFORGE_DOMAIN
from onnxforge.graphbuilder.ir.storage import Storage
from onnxforge.passes.rewrites.dce import eliminate_dead_code
from onnxforge.passes.framework.domains import is_default_domain
from onnxforge.passes.stateful.convert import StatefulError
from onnxforge.passes.stateful.concat_caches import Emitter
from onnxforge.passes.rewrites.topo import schedule
from onnxforge.proto_ext.codecs.kvcache import cache_declaration
from onnxforge.proto_ext.codecs.kvpages import PageFormatError, declare_or_reuse, parse_policy
from onnxforge.proto_ext.types import StructType, TensorType

__all__ = ["parse_page_formats", "to_paged"]

_INT64 = 7
_FLOAT = 1
_GQA = ("com.microsoft", "GroupQueryAttention")


def parse_page_formats(formats: str | Sequence[str]) -> tuple[str, ...]:
    """``"float32,int8,int4"`` or a list -> a tuple of format names (newest page first),
    case-insensitive; the policy rules are :func:`~onnxforge.proto_ext.codecs.kvpages.parse_policy`'s."""
    try:
        return parse_policy(formats, fold_case=True)
    except PageFormatError as e:
        raise StatefulError(f"formats {formats!r}: {e}") from None


def _where(n: Node) -> str:
    return f"{n.domain or 'ai.onnx'}::{n.op_type} {n.name!r}"


class _Layer:
    """One attention layer: its two contiguous caches and how attention reads them."""

    def __init__(self, attention: Node, k_past: Value, v_past: Value, k_present: Value, v_present: Value,
                 updates: tuple[Node, Node] | None):
        self.attention = attention
        self.k_past, self.v_past = k_past, v_past
        self.k_present, self.v_present = k_present, v_present
        self.updates = updates  # the CacheUpdate nodes (torch families), None for GQA

    @property
    def geometry(self) -> tuple[int, int, int]:
        t = self.k_past.type
        return int(t.shape[1]), int(t.shape[2]), int(t.shape[3])  # kv_heads, capacity, head_dim


def _bound(g: Graph) -> dict[int, Value]:
    return {id(i): o for i, o in g.bindings}


def _cache_update_of(view: Value | None) -> Node | None:
    """``Slice(CacheUpdate(...), 0, total, axes=[2])`` -> the CacheUpdate node."""
    s = view.producer() if view is not None else None
    if s is None or s.op_type != "Slice" or not is_default_domain(s.domain) or s.inputs[0] is None:
        return None
    u = s.inputs[0].producer()
    if u is None or (u.domain, u.op_type) != (ONNXFORGE_DOMAIN, "CacheUpdate"):
        return None
    return u


def _layers(model: Model) -> list[_Layer]:
    g = model.graph
    bound = _bound(g)
    layers: list[_Layer] = []
    covered: set[int] = set()
    for n in g:
        if (n.domain, n.op_type) == _GQA and any(a.output_index in (1, 2) for a in n.output_alias):
            k_past, v_past = n.inputs[3], n.inputs[4]
            if k_past is None or v_past is None or id(k_past) not in bound or id(v_past) not in bound:
                raise StatefulError(f"{_where(n)}: its past inputs are not bound caches")
            for attr, ok in (("softcap", 0.0), ("local_window_size", -1)):
                if n.attr(attr, ok) not in (ok, None):
                    raise StatefulError(f"{_where(n)}: {attr}={n.attr(attr)} has no paged attention")
            layers.append(_Layer(n, k_past, v_past, n.outputs[1], n.outputs[2], None))
            covered.update((id(k_past), id(v_past)))
        elif n.op_type == "Attention" and is_default_domain(n.domain) and len(n.inputs) >= 3:
            uk, uv = _cache_update_of(n.inputs[1]), _cache_update_of(n.inputs[2])
            if uk is None or uv is None:
                continue
            k_past, v_past = uk.inputs[0], uv.inputs[0]
            if id(k_past) not in bound or id(v_past) not in bound:
                raise StatefulError(f"{_where(n)}: it reads caches that are not bound")
            for attr, ok in (("softcap", 0.0), ("qk_matmul_output_mode", 0)):
                if n.attr(attr, ok) not in (ok, None):
                    raise StatefulError(f"{_where(n)}: {attr}={n.attr(attr)} has no paged attention")
            if len(n.outputs) != 1:
                raise StatefulError(f"{_where(n)}: an Attention with extra outputs has no paged form")
            layers.append(_Layer(n, k_past, v_past, uk.outputs[0], uv.outputs[0], (uk, uv)))
            covered.update((id(k_past), id(v_past)))
    rest = [i.name for i, _ in g.bindings if i.access == READ_WRITE and id(i) not in covered]
    if rest:
        raise StatefulError(f"no paged form for the in-place cache(s) {rest}: each must be read by one "
                            f"GroupQueryAttention or one Attention through CacheUpdate")
    if not layers:
        raise StatefulError("no in-place KV cache to page: the model has no GroupQueryAttention in "
                            "shared-buffer mode and no Attention over CacheUpdate")
    return layers


def _layer_name(key: Value, fallback: str) -> str:
    """``past_key_values.0.key`` -> ``past_key_values.0`` (the layer's cache name)."""
    for suffix in (".key", "_key", ".k"):
        if key.name.endswith(suffix):
            return key.name[: -len(suffix)]
    return fallback


def _heads(em: Emitter, x: Value, heads: int, head_dim: int, before: Node, hint: str) -> Value:
    """[1, S, H*D] -> [1, H, S, D]."""
    t = x.type
    s = t.shape[1] if isinstance(t, TensorType) and t.shape and len(t.shape) == 3 else None
    r = em.node("Reshape", [x, em.const(np.array([0, 0, heads, head_dim], np.int64), "heads_shape")],
                TensorType(_FLOAT, (1, s, heads, head_dim)), before=before, hint=f"{hint}/split_heads")
    return em.node("Transpose", [r], TensorType(_FLOAT, (1, heads, s, head_dim)), before=before,
                   hint=f"{hint}/heads_first", perm=[0, 2, 1, 3])


def to_paged(model: Model, page_size: int, formats: Sequence[str]) -> Model:
    """Replace every layer's contiguous caches of an in-place stateful ``model`` by one
    paged cache (see the module docstring); returns ``model``."""
    if not isinstance(page_size, int) or isinstance(page_size, bool) or page_size < 1:
        raise StatefulError(f"page_size must be a positive int, got {page_size!r}")
    policy = parse_page_formats(formats)
    g = model.graph
    layers = _layers(model)
    for layer in layers:
        t = layer.k_past.type
        if not isinstance(t, TensorType) or t.shape is None or len(t.shape) != 4 or t.elem_type != _FLOAT:
            raise StatefulError(f"input {layer.k_past.name!r}: a paged cache holds float32 "
                                f"[1, kv_heads, capacity, head_dim] caches, got {t}")
        if t.shape[0] not in (1, None) and not isinstance(t.shape[0], str):
            raise StatefulError(f"input {layer.k_past.name!r}: a paged cache serves one sequence "
                                f"(batch 1), got batch {t.shape[0]}")
        d = layer.geometry[2]
        if d % 32 or page_size % 4:
            raise StatefulError(f"input {layer.k_past.name!r}: paged formats need head_dim % 32 == 0 "
                                f"and page_size % 4 == 0, got head_dim {d}, page_size {page_size}")
    em = Emitter(model)
    for index, layer in enumerate(layers):
        _convert_layer(model, em, layer, index, page_size, policy)
    if ONNXFORGE_DOMAIN not in model.opset_imports:
        model.opset_imports[ONNXFORGE_DOMAIN] = 1
    for v in g.inputs:  # one sequence
        vt = v.type
        if (isinstance(vt, TensorType) and vt.shape and not isinstance(vt.shape[0], int)
                and v.access != READ_WRITE):
            v.type = TensorType(vt.elem_type, (1, *vt.shape[1:]))
    eliminate_dead_code(model)
    g.reorder(schedule(g, Storage(model)))
    return model


def _convert_layer(model: Model, em: Emitter, layer: _Layer, index: int, page_size: int,
                   policy: tuple[str, ...]) -> None:
    g = model.graph
    h, capacity, d = layer.geometry
    num_pages = math.ceil(capacity / page_size)
    type_id = declare_or_reuse(model.struct_types,
                               lambda i: cache_declaration(h, page_size, d, num_pages, policy, i))
    cache = Value(em.names.fresh(_layer_name(layer.k_past, f"paged_cache.{index}")),
                  StructType(kind="type_ref", type_ref=type_id))
    cache.access = READ_WRITE
    g.add_input(cache)
    n = layer.attention
    if layer.updates is not None:  # Attention(q, Slice(CacheUpdate(k)), Slice(CacheUpdate(v)), mask)
        uk, uv = layer.updates
        q, key, value, position = n.inputs[0], uk.inputs[1], uv.inputs[1], uk.inputs[2]
        if uv.inputs[2] is not position:
            raise StatefulError(f"{_where(uk)} and {_where(uv)} write at different positions")
        q_heads = int(q.type.shape[1]) if isinstance(q.type, TensorType) and q.type.shape else 0
        scale = n.attr("scale")
        upd = em.node("PagedCacheUpdate", [cache, key, value, position], cache.type, before=uk,
                      domain=ONNXFORGE_DOMAIN, hint=_layer_name(layer.k_present, f"paged_cache_out.{index}"))
        attrs: dict[str, Any] = {"num_heads": q_heads, "kv_num_heads": h}
        if scale is not None:
            attrs["scale"] = float(scale)
        out = em.node("PagedAttention", [q, upd], n.outputs[0].type, before=n, domain=ONNXFORGE_DOMAIN,
                      hint=f"{cache.name}/attention", **attrs)
    else:  # GroupQueryAttention in shared-buffer mode
        q, key, value = n.inputs[0], n.inputs[1], n.inputs[2]
        if key is None or value is None:
            raise StatefulError(f"{_where(n)}: a packed QKV input has no paged form yet")
        total = n.inputs[6]
        q_heads, scale = int(n.attr("num_heads")), n.attr("scale")
        one = TensorType(_INT64, (1,))
        total64 = em.node("Cast", [total], TensorType(_INT64, ()), before=n, hint="total_length", to=_INT64)
        new = em.node("Shape", [q], one, before=n, hint="new_length", start=1, end=2)
        total1 = em.node("Reshape", [total64, em.const(np.array([1], np.int64), "one_d")], one,
                         before=n, hint="total_1d")
        pos1 = em.node("Sub", [total1, new], one, before=n, hint="position_1d")
        position = em.node("Reshape", [pos1, em.const(np.zeros((0,), np.int64), "scalar")],
                           TensorType(_INT64, ()), before=n, hint="position")
        if n.attr("do_rotary", 0):
            cos, sin = n.inputs[7], n.inputs[8]
            inter = int(n.attr("rotary_interleaved", 0) or 0)
            q = em.node("RotaryEmbedding", [q, pos1, cos, sin], q.type, before=n, domain="com.microsoft",
                        hint="q_rotary", interleaved=inter, num_heads=q_heads)
            key = em.node("RotaryEmbedding", [key, pos1, cos, sin], key.type, before=n,
                          domain="com.microsoft", hint="k_rotary", interleaved=inter, num_heads=h)
        q4 = _heads(em, q, q_heads, d, n, "q")
        k4, v4 = _heads(em, key, h, d, n, "k"), _heads(em, value, h, d, n, "v")
        upd = em.node("PagedCacheUpdate", [cache, k4, v4, position], cache.type, before=n,
                      domain=ONNXFORGE_DOMAIN, hint=_layer_name(layer.k_present, f"paged_cache_out.{index}"))
        attrs = {"num_heads": q_heads, "kv_num_heads": h}
        if scale is not None and float(scale) != 0.0:
            attrs["scale"] = float(scale)
        s = q4.type.shape[2]
        o4 = em.node("PagedAttention", [q4, upd], TensorType(_FLOAT, (1, q_heads, s, d)), before=n,
                     domain=ONNXFORGE_DOMAIN, hint=f"{cache.name}/attention", **attrs)
        ot = em.node("Transpose", [o4], TensorType(_FLOAT, (1, s, q_heads, d)), before=n,
                     hint=f"{cache.name}/heads_last", perm=[0, 2, 1, 3])
        merge = em.const(np.array([0, 0, q_heads * d], np.int64), "merge_shape")
        out = em.node("Reshape", [ot, merge], n.outputs[0].type, before=n,
                      hint=f"{cache.name}/merge_heads")
    upd.producer().output_alias.append(Alias(0, 0, MUST_ALIAS))
    upd.alias_of = cache
    n.outputs[0].replace_all_uses_with(out, outputs=True)
    # the contiguous caches go: bindings, outputs, inputs, and the nodes writing them
    olds = {id(layer.k_past), id(layer.v_past)}
    g.bindings = [(i, o) for i, o in g.bindings if id(i) not in olds]
    g.outputs[:] = [o for o in g.outputs if o is not layer.k_present and o is not layer.v_present]
    g.outputs.append(upd)
    g.bindings.append((cache, upd))
    for node in [n, *(layer.updates or ())]:
        for o in node.outputs:
            o.alias_of = None
        node.output_alias.clear()
    g.remove(n, safe=False)
    for node in layer.updates or ():  # their Slice views fed only the removed attention
        for o in node.outputs:
            for user, _ in list(o.uses()):
                if user.graph is g:
                    g.remove(user, safe=False)
        g.remove(node, safe=False)
    for past in (layer.k_past, layer.v_past):
        for user, _ in list(past.uses()):
            raise StatefulError(f"input {past.name!r} is still read by {_where(user)} after paging")
        g.remove_input(past)
