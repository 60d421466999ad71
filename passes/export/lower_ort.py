"""Lowering of onnxruntime-only operators to standard ONNX (opset 21 / 23), on the IR.

Each rule states the algebra it implements:

* ``SimplifiedLayerNormalization`` (default domain, registered only by
  onnxruntime) -> ``RMSNormalization`` (23), same ``axis``, ``epsilon``,
  ``stash_type``::

      y = SimplifiedLayerNormalization(x, g)   ->   y = RMSNormalization(x, g)

* ``com.microsoft::SkipSimplifiedLayerNormalization(x, skip, gamma[, bias])``
  -> ``s = x + skip (+ bias)``; ``y = RMSNormalization(s, gamma, axis=-1)``;
  its 4th output ``input_skip_bias_sum`` is ``s``.
* ``com.microsoft::MatMulNBits(A, B, scales[, zero_points][, g_idx][, bias])``
  with ``B`` uint8 ``[N, K/block, block*bits/8]`` computes ``A @ dequant(B)^T``
  with ``dequant(B)[n, k] = (code[n, k] - zp[n, k/block]) * scale[n, k/block]``
  and a default zero point of ``2^(bits-1)``. The codes are transposed once, at
  export, to ``[K, N]`` (UINT4 for 4 bits, UINT8 for 8, UINT2 for 2) so that::

      Y = MatMul(A, DequantizeLinear(codes_KN, scale_KN, zp_KN, axis=0, block_size=block)) (+ bias)

  (the pattern runtimes recognize as a quantized MatMul). ``accuracy_level``
  is an execution hint: the lowered graph computes in the input's float type,
  which is what ``accuracy_level=0`` asks for.
* ``com.microsoft::RotaryEmbedding(x, position_ids, cos, sin)`` ->
  ``RotaryEmbedding(x, cos, sin, position_ids)`` (23); a 1-D ``position_ids``
  of shape ``[1]`` (an offset) becomes ``offset + arange(seq)`` per batch.
* ``com.microsoft::GroupQueryAttention`` -> (``Split`` for packed QKV)
  ``RotaryEmbedding`` on Q and K when ``do_rotary`` + ``Attention`` (23) with
  ``q_num_heads`` / ``kv_num_heads``, ``past_key`` / ``past_value`` and the
  present outputs, ``is_causal = causal``. Rotary positions are
  ``total_sequence_length - sequence_length + arange(sequence_length)`` (or the
  given ``position_ids``) and the present caches are ``concat(past, new)``.

  Limitation: ``seqlens_k`` is not read. The lowering is exact when every batch
  row has the same length (an all-ones attention mask), and for a right-padded
  first prompt (past length 0) at every valid position; left padding, or
  batches of rows with different lengths after the first prompt, are not
  expressed (GroupQueryAttention places each row's new tokens at its own
  ``seqlens_k``). ``past_present_share_buffer`` must be off: past and present
  are distinct tensors of lengths ``P`` and ``P + S``.

Rules that cannot express a node (a sliding window, a quantized KV cache, a
non-initializer MatMulNBits weight...) say why through their ``check``.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from onnx import TensorProto

from onnxforge.graphbuilder.ir import Graph, Node, Value
from onnxforge.graphbuilder.tensors import Tensor
from onnxforge.passes.export.lower_extensions import (
    LowerContext,
    NodeLowering,
    elem_type,
    tensor_rank,
    tensor_shape,
)

__all__ = ["ORT_NODE_LOWERINGS", "MS_DOMAIN", "unpack_bits"]

MS_DOMAIN = "com.microsoft"

_FLOATS = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE)


def _ins(node: Node, n: int) -> list[Value | None]:
    ins = list(node.inputs)
    return ins + [None] * (n - len(ins))


def _outs_used(node: Node) -> list[bool]:
    return [bool(o.name) and (o.num_uses() > 0 or o.is_graph_output()) for o in node.outputs]


def _finish(node: Node, ctx: LowerContext, replacements: dict[int, Value]) -> None:
    """Replace the node's used outputs and remove it."""
    em = ctx.emitter
    for i, new in replacements.items():
        if i < len(node.outputs):
            old = node.outputs[i]
            if new.type is None:
                new.type = old.type
            em.replace(old, new)
    ctx.remove_node(node)


def _is_init(v: Value | None) -> bool:
    return v is not None and v.const is not None and not v.is_encoded() and not v.is_graph_input()


# --------------------------------------------------------------------------- RMS norms


def _check_sln(node: Node, ctx: LowerContext) -> str | None:
    ins = _ins(node, 2)
    if ins[0] is None or ins[1] is None:
        return "SimplifiedLayerNormalization needs X and scale"
    used = _outs_used(node)
    if len(used) > 1 and any(used[1:]):
        return "the training output inv_std_var is consumed; it has no standard equivalent here"
    return None


def _lower_sln(node: Node, ctx: LowerContext) -> None:
    g: Graph = node.graph
    x, scale = node.inputs[:2]
    (y,) = ctx.emitter.node(g, node, "RMSNormalization", [x, scale], name=node.name or "rms",
                            axis=int(node.attr("axis", -1)), epsilon=float(node.attr("epsilon", 1e-5)),
                            stash_type=int(node.attr("stash_type", 1)))
    _finish(node, ctx, {0: y})


def _check_skip_sln(node: Node, ctx: LowerContext) -> str | None:
    ins = _ins(node, 4)
    if any(v is None for v in ins[:3]):
        return "SkipSimplifiedLayerNormalization needs input, skip and gamma"
    used = _outs_used(node) + [False] * 4
    if used[1] or used[2]:
        return "the training outputs mean / inv_std_var are consumed; they have no standard " \
               "equivalent here"
    return None


def _lower_skip_sln(node: Node, ctx: LowerContext) -> None:
    g: Graph = node.graph
    em = ctx.emitter
    x, skip, gamma, bias = _ins(node, 4)[:4]
    name = node.name or "skip_rms"
    (s,) = em.node(g, node, "Add", [x, skip], name=f"{name}/skip_add")
    if bias is not None:
        (s,) = em.node(g, node, "Add", [s, bias], name=f"{name}/bias_add")
    (y,) = em.node(g, node, "RMSNormalization", [s, gamma], name=name, axis=-1,
                   epsilon=float(node.attr("epsilon", 1e-12)), stash_type=1)
    _finish(node, ctx, {0: y, 3: s})


# --------------------------------------------------------------------------- MatMulNBits


_NBITS_STORAGE = {2: TensorProto.UINT2, 4: TensorProto.UINT4, 8: TensorProto.UINT8}


def unpack_bits(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    """Unpack the last axis of a uint8 array into ``count`` codes of ``bits`` bits,
    least-significant bits first (MatMulNBits' packing)."""
    packed = np.asarray(packed, dtype=np.uint8)
    if bits == 8:
        return packed[..., :count]
    per = 8 // bits
    mask = (1 << bits) - 1
    parts = [(packed >> (bits * i)) & mask for i in range(per)]
    codes = np.stack(parts, axis=-1).reshape(*packed.shape[:-1], packed.shape[-1] * per)
    return codes[..., :count]


def _nbits_attrs(node: Node) -> tuple[int, int, int, int]:
    return (int(node.attr("K", 0)), int(node.attr("N", 0)), int(node.attr("bits", 4)),
            int(node.attr("block_size", 0)))


def _check_nbits(node: Node, ctx: LowerContext) -> str | None:
    A, B, scales, zp, g_idx, bias = _ins(node, 6)[:6]
    K, N, bits, bs = _nbits_attrs(node)
    if bits not in _NBITS_STORAGE:
        return f"bits={bits} is not lowered (2, 4 and 8 are)"
    if K <= 0 or N <= 0 or bs <= 0:
        return "MatMulNBits needs positive K, N and block_size"
    if int(node.attr("weight_prepacked", 0)) != 0:
        return "prepacked (execution-provider specific) weights have no standard form"
    if g_idx is not None:
        return "the g_idx input (act-order) is not lowered"
    if not _is_init(B) or not _is_init(scales):
        return "B and scales must be initializers to be repacked as DequantizeLinear inputs"
    kb = -(-K // bs)
    blob = bs * bits // 8
    if B.const.size != N * kb * blob:
        return f"B holds {B.const.size} bytes, K={K}, N={N}, bits={bits}, block_size={bs} need " \
               f"{N * kb * blob}"
    if B.const.dtype != TensorProto.UINT8:
        return "B must be uint8"
    if scales.const.size != N * kb:
        return f"scales hold {scales.const.size} values, {N * kb} are needed"
    if zp is not None:
        if not _is_init(zp):
            return "zero_points must be an initializer"
        if zp.const.dtype != TensorProto.UINT8:
            return "unpacked (float) zero points are not lowered; DequantizeLinear takes integer " \
                   "zero points"
        if zp.const.size != N * (-(-kb * bits // 8)):
            return "packed zero_points have an unexpected size"
    return None


def _nbits_opset(node: Node) -> int:
    return 25 if int(node.attr("bits", 4)) == 2 else 21


def _lower_nbits(node: Node, ctx: LowerContext) -> None:
    from onnxforge.proto_ext.codecs.bits import pack_codes

    g: Graph = node.graph
    em = ctx.emitter
    A, B, scales, zp, _, bias = _ins(node, 6)[:6]
    K, N, bits, bs = _nbits_attrs(node)
    kb = -(-K // bs)
    blob = bs * bits // 8
    storage = _NBITS_STORAGE[bits]
    raw = np.asarray(B.const.numpy()).reshape(N, kb * blob)
    codes = unpack_bits(raw, bits, K).T                                  # [K, N]
    scale = np.asarray(scales.const.numpy()).reshape(N, kb).T            # [kb, N]
    if zp is None:
        zps = np.full((kb, N), 1 << (bits - 1), dtype=np.uint8)
    else:
        zraw = np.asarray(zp.const.numpy()).reshape(N, -1)
        zps = unpack_bits(zraw, bits, kb).T
    base = B.name.removesuffix("_Q4").removesuffix("_Q8").removesuffix("_Q2")
    if bits == 8:
        q_t = Tensor.from_numpy(np.ascontiguousarray(codes, dtype=np.uint8))
        z_t = Tensor.from_numpy(np.ascontiguousarray(zps, dtype=np.uint8))
    else:
        q_t = Tensor(storage, (K, N), raw=pack_codes(np.ascontiguousarray(codes), bits))
        z_t = Tensor(storage, (kb, N), raw=pack_codes(np.ascontiguousarray(zps), bits))
    q = em.initializer(g, q_t, f"{base}_quantized")
    s = em.initializer(g, np.ascontiguousarray(scale), f"{base}_scale")
    z = em.initializer(g, z_t, f"{base}_zero_point")
    name = node.name or "MatMulNBits"
    (w,) = em.node(g, node, "DequantizeLinear", [q, s, z], name=f"{name}/dequantize", axis=0,
                   block_size=bs)
    (y,) = em.node(g, node, "MatMul", [A, w], name=name)
    if bias is not None:
        (y,) = em.node(g, node, "Add", [y, bias], name=f"{name}/bias")
    _finish(node, ctx, {0: y})


# --------------------------------------------------------------------------- RotaryEmbedding


def _rotary_dim_from_cache(cos: Value | None) -> int | None:
    s = tensor_shape(cos)
    if s is not None and len(s) == 2 and isinstance(s[1], int):
        return 2 * s[1]
    return None


def _check_ms_rotary(node: Node, ctx: LowerContext) -> str | None:
    x, pos, cos, sin = _ins(node, 4)[:4]
    if any(v is None for v in (x, pos, cos, sin)):
        return "RotaryEmbedding needs input, position_ids, cos_cache and sin_cache"
    if int(node.attr("is_packed_batching", 0)) != 0:
        return "packed (ragged) batching has no standard form"
    if float(node.attr("scale", 1.0)) != 1.0:
        return "a RotaryEmbedding scale other than 1.0 is not lowered"
    rank = tensor_rank(x)
    if rank not in (3, 4):
        return "the input's rank must be known (3 or 4)"
    if tensor_rank(pos) not in (1, 2):
        return "position_ids' rank must be known (1 or 2)"
    if rank == 3 and not int(node.attr("num_heads", 0)):
        hidden = tensor_shape(x)[2]
        rd = _rotary_dim_from_cache(cos)
        if not isinstance(hidden, int) or rd is None:
            return "num_heads=0 with a 3-D input needs a static hidden size and cos_cache shape"
    return None


def _positions(g: Graph, node: Node, ctx: LowerContext, x: Value, seq_axis: int, name: str, *,
               offset: Value | None = None, total: Value | None = None) -> Value:
    """``start + arange(seq)`` broadcast to ``[batch, seq]`` (int64), ``seq`` being
    ``x``'s length along ``seq_axis``: ``start = offset``, or ``start = total - seq`` (the
    new tokens are the last ``seq`` of ``total``)."""
    em = ctx.emitter
    (xs,) = em.node(g, node, "Shape", [x], name=f"{name}/shape")
    (b,) = em.node(g, node, "Gather", [xs, em.const(g, np.array([0], np.int64), "idx0")],
                   name=f"{name}/batch", axis=0)
    (s1,) = em.node(g, node, "Gather", [xs, em.const(g, np.array([seq_axis], np.int64), f"idx{seq_axis}")],
                    name=f"{name}/seq", axis=0)
    scalar = em.const(g, np.zeros((0,), np.int64), "scalar_shape")
    (s,) = em.node(g, node, "Reshape", [s1, scalar], name=f"{name}/seq_scalar")
    if offset is not None:
        (start,) = em.node(g, node, "Reshape", [offset, scalar], name=f"{name}/offset")
        if elem_type(offset) not in (None, TensorProto.INT64):
            (start,) = em.node(g, node, "Cast", [start], name=f"{name}/offset_i64", to=TensorProto.INT64)
        (end,) = em.node(g, node, "Add", [start, s], name=f"{name}/end")
    else:
        (end,) = em.node(g, node, "Reshape", [total, scalar], name=f"{name}/total")
        (end,) = em.node(g, node, "Cast", [end], name=f"{name}/total_i64", to=TensorProto.INT64)
        (start,) = em.node(g, node, "Sub", [end, s], name=f"{name}/past_length")
    (r,) = em.node(g, node, "Range", [start, end, em.const(g, np.array(1, np.int64), "one")],
                   name=f"{name}/range")
    (r2,) = em.node(g, node, "Unsqueeze", [r, em.const(g, np.array([0], np.int64), "idx0")],
                    name=f"{name}/unsqueeze")
    (bs,) = em.node(g, node, "Concat", [b, s1], name=f"{name}/batch_seq", axis=0)
    (p,) = em.node(g, node, "Expand", [r2, bs], name=f"{name}/position_ids")
    return p


def _lower_ms_rotary(node: Node, ctx: LowerContext) -> None:
    g: Graph = node.graph
    em = ctx.emitter
    x, pos, cos, sin = node.inputs[:4]
    name = node.name or "RotaryEmbedding"
    rank = tensor_rank(x)
    if tensor_rank(pos) == 1:
        pos = _positions(g, node, ctx, x, 1 if rank == 3 else 2, name, offset=pos)
    elif elem_type(pos) not in (None, TensorProto.INT64):
        (pos,) = em.node(g, node, "Cast", [pos], name=f"{name}/pos_i64", to=TensorProto.INT64)
    attrs: dict[str, Any] = {"interleaved": int(node.attr("interleaved", 0))}
    num_heads = int(node.attr("num_heads", 0))
    rot = int(node.attr("rotary_embedding_dim", 0))
    if rank == 3:
        if not num_heads:
            num_heads = int(tensor_shape(x)[2]) // _rotary_dim_from_cache(cos)
        attrs["num_heads"] = num_heads
    elif num_heads:
        attrs["num_heads"] = num_heads
    if rot:
        attrs["rotary_embedding_dim"] = rot
    (y,) = em.node(g, node, "RotaryEmbedding", [x, cos, sin, pos], name=name, **attrs)
    _finish(node, ctx, {0: y})


# --------------------------------------------------------------------------- GroupQueryAttention


def _check_gqa(node: Node, ctx: LowerContext) -> str | None:
    ins = _ins(node, 17)
    q, k, v, pk, pv, seqlens, total, cos, sin = ins[:9]
    reasons = []
    if q is None or total is None:
        reasons.append("query and total_sequence_length are required")
    if (k is None) != (v is None):
        reasons.append("key and value must be given together")
    if (pk is None) != (pv is None):
        reasons.append("past_key and past_value must be given together")
    used = _outs_used(node) + [False] * 4
    if pk is None and (used[1] or used[2]):
        reasons.append("present outputs without past inputs are not lowered")
    if used[3]:
        reasons.append("output_qk is not lowered")
    names = ["head_sink", "k_scale", "v_scale", "q_norm_weight", "k_norm_weight", "query_seqlens"]
    for i, nm in zip(range(11, 17), names):
        if ins[i] is not None:
            reasons.append(f"input {nm} is not lowered")
    if int(node.attr("local_window_size", -1)) != -1:
        reasons.append("a sliding window (local_window_size) is not lowered")
    if int(node.attr("sliding_window_cache", 0)) != 0:
        reasons.append("a windowed cache is not lowered")
    if int(node.attr("smooth_softmax", -1)) == 1:
        reasons.append("smooth_softmax is not lowered")
    if int(node.attr("qk_output", 0)) != 0:
        reasons.append("qk_output is not lowered")
    for a in ("k_quant_type", "v_quant_type"):
        val = node.attr(a, b"NONE")
        if (val.decode() if isinstance(val, bytes) else str(val)).upper() != "NONE":
            reasons.append(f"a quantized KV cache ({a}) is not lowered")
    if int(node.attr("do_rotary", 0)) and (cos is None or sin is None):
        reasons.append("do_rotary needs cos_cache and sin_cache")
    et = elem_type(q)
    if et is not None and et not in _FLOATS:
        reasons.append("query must be a float tensor")
    if tensor_rank(q) not in (None, 3):
        reasons.append("query must be 3-D (batch, sequence, hidden)")
    return "; ".join(reasons) or None


def _lower_gqa(node: Node, ctx: LowerContext) -> None:
    g: Graph = node.graph
    em = ctx.emitter
    ins = _ins(node, 17)
    q, k, v, pk, pv, _seqlens, total, cos, sin, pos_ids, bias = ins[:11]
    hq = int(node.attr("num_heads"))
    hkv = int(node.attr("kv_num_heads"))
    name = node.name or "GroupQueryAttention"

    if k is None:
        # packed QKV: head_size = hidden / (hq + 2 hkv); split [hq, hkv, hkv] * head_size
        heads_total = em.const(g, np.array([hq + 2 * hkv], np.int64), "heads_total")
        qkv_heads = em.const(g, np.array([hq, hkv, hkv], np.int64), "qkv_heads")
        (qs,) = em.node(g, node, "Shape", [q], name=f"{name}/qkv_shape", start=-1)
        (hd,) = em.node(g, node, "Div", [qs, heads_total], name=f"{name}/head_size")
        (sizes,) = em.node(g, node, "Mul", [hd, qkv_heads], name=f"{name}/split_sizes")
        q, k, v = em.node(g, node, "Split", [q, sizes], 3, name=f"{name}/split_qkv", axis=-1)

    if int(node.attr("do_rotary", 0)):
        if pos_ids is None:  # the new tokens are the last S of total_sequence_length
            pos = _positions(g, node, ctx, q, 1, name, total=total)
        else:
            pos = pos_ids
            if elem_type(pos) not in (None, TensorProto.INT64):
                (pos,) = em.node(g, node, "Cast", [pos], name=f"{name}/pos_i64", to=TensorProto.INT64)
        rot_attrs: dict[str, Any] = {"interleaved": int(node.attr("rotary_interleaved", 0))}
        rd = _rotary_dim_from_cache(cos)
        if rd is not None:
            rot_attrs["rotary_embedding_dim"] = rd
        (q,) = em.node(g, node, "RotaryEmbedding", [q, cos, sin, pos], name=f"{name}/rotary_q",
                       num_heads=hq, **rot_attrs)
        (k,) = em.node(g, node, "RotaryEmbedding", [k, cos, sin, pos], name=f"{name}/rotary_k",
                       num_heads=hkv, **rot_attrs)

    attrs: dict[str, Any] = {"q_num_heads": hq, "kv_num_heads": hkv,
                             "is_causal": int(node.attr("causal", 1))}
    scale = float(node.attr("scale", 0.0))
    if scale:
        attrs["scale"] = scale
    softcap = float(node.attr("softcap", 0.0))
    if softcap:
        attrs["softcap"] = softcap
    if pk is not None:
        out, pres_k, pres_v = em.node(g, node, "Attention", [q, k, v, bias, pk, pv], 3, name=name,
                                      **attrs)
        repl = {0: out, 1: pres_k, 2: pres_v}
    else:
        (out,) = em.node(g, node, "Attention", [q, k, v, bias], name=name, **attrs)
        repl = {0: out}
    _finish(node, ctx, repl)


def _opset23(node: Node) -> int:
    return 23


ORT_NODE_LOWERINGS: dict[tuple[str, str], NodeLowering] = {
    ("", "SimplifiedLayerNormalization"): NodeLowering(
        "", "SimplifiedLayerNormalization", _check_sln, _lower_sln, _opset23, _opset23),
    (MS_DOMAIN, "SimplifiedLayerNormalization"): NodeLowering(
        MS_DOMAIN, "SimplifiedLayerNormalization", _check_sln, _lower_sln, _opset23, _opset23),
    (MS_DOMAIN, "SkipSimplifiedLayerNormalization"): NodeLowering(
        MS_DOMAIN, "SkipSimplifiedLayerNormalization", _check_skip_sln, _lower_skip_sln, _opset23,
        _opset23),
    (MS_DOMAIN, "MatMulNBits"): NodeLowering(
        MS_DOMAIN, "MatMulNBits", _check_nbits, _lower_nbits, _nbits_opset, _nbits_opset),
    (MS_DOMAIN, "RotaryEmbedding"): NodeLowering(
        MS_DOMAIN, "RotaryEmbedding", _check_ms_rotary, _lower_ms_rotary, _opset23, _opset23),
    (MS_DOMAIN, "GroupQueryAttention"): NodeLowering(
        MS_DOMAIN, "GroupQueryAttention", _check_gqa, _lower_gqa, _opset23, _opset23),
}
"""Lowerings of onnxruntime-only operators, keyed by ``(domain, op_type)``."""
