"""``make_stateful``: rewrite a past/present decoder into an in-place stateful model.

Three decoder families are supported. ``torch.onnx`` exports at opset 20 and 23
(``present = Concat(past, new)``; the attention decomposed or standard ``Attention``)
are rewritten by :mod:`onnxforge.passes.stateful.concat_caches` (CacheUpdate in place,
``Attention`` reading a Slice view of the valid prefix). In the onnxruntime-genai
layout ``com.microsoft`` GroupQueryAttention reads ``past_key_values.N.key/value`` (inputs 3 and 4) and
produces ``present.N.key/value`` (outputs 1 and 2). The rewrite makes each past a
capacity-sized READ_WRITE buffer, puts GroupQueryAttention in shared-buffer mode
(its present outputs MUST_ALIAS the past inputs, so the kernel writes the new rows
in place and attends up to the valid length), and declares the persistent bindings::

    before                                        after (max_length=N)
      past_key_values.0.key [B, 2, past, kv]        past_key_values.0.key [B, 2, N, 32] READ_WRITE
      y, present.0.key, present.0.value =           y, present.0.key, present.0.value =
        GroupQueryAttention(q, k, v, past_k,          GroupQueryAttention(q, k, v, past_k, past_v, ...)
                            past_v, ...)              output_alias {1<-3, 2<-4 MUST_ALIAS}
      outputs: logits, present.0.key [B, 2, T, kv]  outputs: logits, present.0.key alias_of past
                                                    bindings: past_key_values.0.key <- present.0.key

The per-call inputs stay as they were (``input_ids``, ``attention_mask`` of length
published + new tokens). Pairs come from ``bindings`` ({input: output}), else from
``genai_config.json`` (its ``past_key_names`` / ``present_key_names`` patterns),
else from the names ``past_key_values.N.key`` <-> ``present.N.key``. A pair the
rewrite cannot make in place is a :class:`StatefulError` naming the input or output
and why, unless ``bindings`` names it: then it is bound as it is (an RNN's state fed
back as an input), a persistent binding without an in-place rewrite. An IR ``Model``
is rewritten in place and returned (like ``optimize``). A torch export at opset 20 has
its decomposed attention fused into ``Attention`` first, which raises its opset to 23
(:mod:`onnxforge.passes.rewrites.attention_fusion`).
"""
from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from onnxforge.graphbuilder.ir.core import MUST_ALIAS, READ_WRITE, Alias, Model, Node, Value
from onnxforge.proto_ext.errors import OnnxforgeError
from onnxforge.proto_ext.types import TensorType

__all__ = ["StatefulError", "find_pairs", "make_stateful", "read_genai_config"]

_GQA = ("com.microsoft", "GroupQueryAttention")
_PAST = re.compile(r"^past_key_values\.(\d+)\.(key|value)$")


class StatefulError(OnnxforgeError, ValueError):
    """A past/present pair (or a whole model) that the stateful rewrite cannot make in place."""


def read_genai_config(model_path: str | os.PathLike) -> dict[str, Any] | None:
    """The ``genai_config.json`` next to ``model_path``, or None."""
    cfg = Path(model_path).parent / "genai_config.json"
    if not cfg.is_file():
        return None
    try:
        return json.loads(cfg.read_text())
    except (OSError, ValueError) as e:
        raise StatefulError(f"{cfg}: not a readable genai_config.json ({e})") from None


def _load(model: Any) -> tuple[Model, Mapping[str, Any] | None]:
    """The IR of ``model`` after the static rules (a VerificationError names the broken
    rule and its path, before the rewrite reads anything), and its genai_config. A file
    is mapped, scanned and parsed once: the rules run on the message the IR is built from."""
    from onnxforge.graphbuilder import serde
    from onnxforge.proto_ext.errors import VerificationError
    from onnxforge.proto_ext.verify import check

    if isinstance(model, Model):
        violations = check(model)
        if violations:
            raise VerificationError(violations)
        return model, None
    config = read_genai_config(model) if isinstance(model, (str, os.PathLike)) else None
    return serde.load(model, verify=True), config


def _config_pairs(config: Mapping[str, Any], layers: int) -> dict[str, str]:
    dec = config.get("model", {}).get("decoder", {})
    ins, outs = dec.get("inputs", {}), dec.get("outputs", {})
    pairs: dict[str, str] = {}
    for kind in ("key", "value"):
        p, q = ins.get(f"past_{kind}_names"), outs.get(f"present_{kind}_names")
        if p and q:
            for i in range(layers):
                pairs[p % i] = q % i
    return pairs


def find_pairs(model: Model, config: Mapping[str, Any] | None = None,
               bindings: Mapping[str, str] | None = None) -> dict[str, str]:
    """The past -> present pairs of ``model``: ``bindings``, else genai_config, else names."""
    g = model.graph
    if bindings:
        return dict(bindings)
    if config:
        layers = int(config.get("model", {}).get("decoder", {}).get("num_hidden_layers", 0))
        pairs = _config_pairs(config, layers)
        if pairs:
            return pairs
    pairs = {}
    outputs = {v.name for v in g.outputs}
    for v in g.inputs:
        m = _PAST.match(v.name)
        if m is None:
            continue
        present = f"present.{m.group(1)}.{m.group(2)}"
        if present not in outputs:
            raise StatefulError(f"input {v.name!r} looks like a past cache but the model has no output "
                                f"{present!r} to bind it to; pass bindings={{{v.name!r}: OUTPUT}}")
        pairs[v.name] = present
    if not pairs:
        raise StatefulError("no past/present pairs found: no input is named past_key_values.N.key/value, "
                            "no genai_config.json names them, and no bindings= were given")
    return pairs


def _head_size(past: Value, config: Mapping[str, Any] | None) -> int:
    t = past.type
    if isinstance(t, TensorType) and t.shape and isinstance(t.shape[-1], int) and t.shape[-1] > 0:
        return t.shape[-1]
    if config:
        h = config.get("model", {}).get("decoder", {}).get("head_size")
        if isinstance(h, int) and h > 0:
            return h
    raise StatefulError(f"input {past.name!r}: its last dimension ({t.shape[-1] if isinstance(t, TensorType) and t.shape else '?'}) "
                        f"is symbolic and no genai_config.json gives head_size")


def _is_concat_cache(past: Value, present: Value) -> bool:
    """``present`` is ``Concat(past, new)`` (the torch.onnx family)."""
    n = present.producer()
    return (n is not None and n.op_type == "Concat" and n.domain in ("", "ai.onnx")
            and len(n.inputs) == 2 and n.inputs[0] is past)


def _check_binding(inp: Value, out: Value) -> None:
    """An input and the output bound to it: same element type and rank, equal concrete dims."""
    ti, to = inp.type, out.type
    if isinstance(ti, TensorType) and isinstance(to, TensorType):
        if ti.elem_type != to.elem_type:
            raise StatefulError(f"bindings[{inp.name!r}] = {out.name!r}: element types differ "
                                f"({ti} vs {to})")
        if ti.shape is not None and to.shape is not None:
            if len(ti.shape) != len(to.shape):
                raise StatefulError(f"bindings[{inp.name!r}] = {out.name!r}: ranks differ ({ti} vs {to})")
            for i, (a, b) in enumerate(zip(ti.shape, to.shape)):
                if isinstance(a, int) and isinstance(b, int) and a != b:
                    raise StatefulError(f"bindings[{inp.name!r}] = {out.name!r}: dimension {i} is {a} "
                                        f"on the input but {b} on the output")
    elif type(ti) is not type(to):
        raise StatefulError(f"bindings[{inp.name!r}] = {out.name!r}: types differ ({ti} vs {to})")


def _convert_gqa(g: Any, plan: list[tuple[Value, Value, Node, int, int]], max_length: int,
                 batch: int | None, config: Mapping[str, Any] | None) -> None:
    for past, present, node, out_i, in_i in plan:
        t = past.type
        if not isinstance(t, TensorType) or t.shape is None or len(t.shape) != 4:
            raise StatefulError(f"input {past.name!r}: expected a rank-4 tensor [batch, kv_heads, "
                                f"past, head_size], got {t}")
        b = batch if batch is not None else t.shape[0]
        shape = (b, t.shape[1], max_length, _head_size(past, config))
        new_t = TensorType(t.elem_type, shape)
        past.type = new_t
        past.access = READ_WRITE
        present.type = new_t
        present.alias_of = past
        if not any(a.output_index == out_i for a in node.output_alias):
            node.output_alias.append(Alias(out_i, in_i, MUST_ALIAS))
        g.bindings.append((past, present))


def _gqa_plan(past: Value, present: Value, node: Node) -> tuple[Value, Value, Node, int, int]:
    out_i = present.index
    in_i = out_i + 2  # present key/value (1, 2) <- past key/value (3, 4)
    if out_i not in (1, 2) or len(node.inputs) <= in_i or node.inputs[in_i] is not past:
        raise StatefulError(f"output {present.name!r} is GroupQueryAttention output {out_i}, but "
                            f"input {past.name!r} is not that node's past input {in_i}")
    if past.num_uses() != 1:
        raise StatefulError(f"input {past.name!r} has {past.num_uses()} readers; an in-place "
                            f"cache must be read only by its GroupQueryAttention")
    return past, present, node, out_i, in_i


def make_stateful(model: Any, max_length: int, bindings: Mapping[str, str] | None = None, *,
                  batch: int | None = None, genai_config: Mapping[str, Any] | None = None,
                  cache: str = "contiguous", page_size: int = 16,
                  formats: str | Sequence[str] = ("float32",), ragged: bool = False) -> Model:
    """Rewrite ``model`` (IR, ModelProto, bytes or path) into an in-place stateful decoder.

    ``max_length`` is the cache capacity; ``batch`` fixes a symbolic batch dimension;
    ``genai_config`` overrides the ``genai_config.json`` found next to a model path.
    A pair whose present is made by GroupQueryAttention or by ``Concat(past, new)``
    becomes an in-place cache; with ``bindings=``, any other pair (an RNN's state) is
    bound as it is (a persistent binding without an in-place rewrite).

    ``cache="paged"`` makes each layer's keys and values one paged cache of
    ``ceil(max_length / page_size)`` pages whose formats follow ``formats`` by age
    (newest page first, the last repeating: ``"float32,int8,int4"``); see
    :mod:`onnxforge.passes.stateful.paged`. A paged model serves one sequence (batch 1).
    With ``ragged=True`` (paged only) it serves many: one run carries the new tokens of
    several sequences, each with its own page tables (:mod:`onnxforge.passes.stateful.ragged`;
    what :class:`onnxforge.Engine` runs).
    """
    if not isinstance(max_length, int) or isinstance(max_length, bool) or max_length < 1:
        raise StatefulError(f"max_length must be a positive int, got {max_length!r}")
    if cache not in ("contiguous", "paged"):
        raise StatefulError(f"cache must be 'contiguous' or 'paged', got {cache!r}")
    if ragged and cache != "paged":
        raise StatefulError("ragged=True needs cache='paged': a batch of sequences shares one page pool")
    if cache == "paged":
        from onnxforge.passes.stateful.paged import parse_page_formats, to_paged

        policy = parse_page_formats(formats)  # bad options fail before the model is touched
        if not isinstance(page_size, int) or isinstance(page_size, bool) or page_size < 1 or page_size % 4:
            raise StatefulError(f"page_size must be a positive multiple of 4, got {page_size!r}")
        if batch not in (None, 1):
            raise StatefulError(f"a paged cache serves one sequence: batch must be 1, got {batch}")
        m = make_stateful(model, max_length, bindings, batch=1, genai_config=genai_config)
        m = to_paged(m, page_size, policy)
        if ragged:
            from onnxforge.passes.stateful.ragged import to_ragged

            m = to_ragged(m)
        return m
    m, config = _load(model)
    config = genai_config if genai_config is not None else config
    g = m.graph
    if g.bindings:
        raise StatefulError(f"the model already declares persistent bindings "
                            f"{[(i.name, o.name) for i, o in g.bindings]}")
    inputs = {v.name: v for v in g.inputs}
    outputs = {v.name: v for v in g.outputs}
    pairs = find_pairs(m, config, bindings)
    gqa: list[tuple[Value, Value, Node, int, int]] = []
    concat: list[tuple[Value, Value]] = []
    plain: list[tuple[Value, Value]] = []
    for past_name, present_name in pairs.items():
        past, present = inputs.get(past_name), outputs.get(present_name)
        if past is None:
            raise StatefulError(f"bound input {past_name!r} is not a graph input")
        if present is None:
            raise StatefulError(f"bound output {present_name!r} (for {past_name!r}) is not a graph output")
        node = present.producer()
        if node is not None and (node.domain, node.op_type) == _GQA:
            gqa.append(_gqa_plan(past, present, node))
        elif _is_concat_cache(past, present):
            concat.append((past, present))
        elif bindings:
            _check_binding(past, present)
            plain.append((past, present))
        else:
            what = "a graph input" if node is None else f"{node.domain or 'ai.onnx'}::{node.op_type}"
            raise StatefulError(f"output {present_name!r} is produced by {what}, neither by "
                                f"com.microsoft::GroupQueryAttention nor by Concat({past_name!r}, new): "
                                f"no in-place rewrite applies; pass bindings={{{past_name!r}: "
                                f"{present_name!r}}} to bind it as it is")
    if concat:
        from onnxforge.passes.stateful.concat_caches import convert_concat_caches

        _fuse_decomposed(m)
        convert_concat_caches(m, concat, max_length, batch)
    _convert_gqa(g, gqa, max_length, batch, config)
    g.bindings.extend(plain)
    if batch is not None:
        for v in g.inputs:
            vt = v.type
            if (isinstance(vt, TensorType) and vt.shape and isinstance(vt.shape[0], str)
                    and v.access != READ_WRITE):
                v.type = TensorType(vt.elem_type, (batch, *vt.shape[1:]))
    return m


def _fuse_decomposed(m: Model) -> None:
    from onnxforge.passes.rewrites.attention_fusion import AttentionFusionError, fuse_attention

    try:
        fuse_attention(m)
    except AttentionFusionError as e:
        raise StatefulError(f"the decomposed attention cannot be fused: {e}") from None
