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
  ``RotaryEmbedding`` (23) on Q and K when ``do_rotary``, the present caches
  rebuilt per row with ``GatherElements`` / ``Where``, and a standard
  ``Attention`` (23) on 4-D inputs with a boolean mask built from ``seqlens_k``
  and ``total_sequence_length``: exactly what onnxruntime computes per row (valid
  past ``seqlens_k + 1 - S`` tokens, or none in a first prompt; new tokens written
  after it; causal, row-length and ``local_window_size`` limits; rotary positions
  from the row's past length), whatever the zeros of the attention mask look like
  (left padding, a right-padded past, rows of different lengths). The full table
  is above :func:`_check_gqa`. ``attention_bias``, ``head_sink``, quantized caches,
  ``smooth_softmax`` and ``output_qk`` are refused by the check.

Rules that cannot express a node (a sliding window, a quantized KV cache, a
non-initializer MatMulNBits weight...) say why through their ``check``.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from onnx import TensorProto

from onnxforge.graphbuilder.ir.core import Graph, Node, Value
from onnxforge.graphbuilder.ir.tensors import Tensor
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
    g: Graph = node.graph  # type: ignore[assignment]  # local functions are inlined before lowering
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
    g: Graph = node.graph  # type: ignore[assignment]  # local functions are inlined before lowering
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

    g: Graph = node.graph  # type: ignore[assignment]  # local functions are inlined before lowering
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
               offset: Value) -> Value:
    """``offset + arange(seq)`` broadcast to ``[batch, seq]`` (int64), ``seq`` being
    ``x``'s length along ``seq_axis``."""
    em = ctx.emitter
    (xs,) = em.node(g, node, "Shape", [x], name=f"{name}/shape")
    (b,) = em.node(g, node, "Gather", [xs, em.const(g, np.array([0], np.int64), "idx0")],
                   name=f"{name}/batch", axis=0)
    (s1,) = em.node(g, node, "Gather", [xs, em.const(g, np.array([seq_axis], np.int64), f"idx{seq_axis}")],
                    name=f"{name}/seq", axis=0)
    scalar = em.const(g, np.zeros((0,), np.int64), "scalar_shape")
    (s,) = em.node(g, node, "Reshape", [s1, scalar], name=f"{name}/seq_scalar")
    (start,) = em.node(g, node, "Reshape", [offset, scalar], name=f"{name}/offset")
    if elem_type(offset) not in (None, TensorProto.INT64):
        (start,) = em.node(g, node, "Cast", [start], name=f"{name}/offset_i64", to=TensorProto.INT64)
    (end,) = em.node(g, node, "Add", [start, s], name=f"{name}/end")
    (r,) = em.node(g, node, "Range", [start, end, em.const(g, np.array(1, np.int64), "one")],
                   name=f"{name}/range")
    (r2,) = em.node(g, node, "Unsqueeze", [r, em.const(g, np.array([0], np.int64), "idx0")],
                    name=f"{name}/unsqueeze")
    (bs,) = em.node(g, node, "Concat", [b, s1], name=f"{name}/batch_seq", axis=0)
    (p,) = em.node(g, node, "Expand", [r2, bs], name=f"{name}/position_ids")
    return p


def _lower_ms_rotary(node: Node, ctx: LowerContext) -> None:
    g: Graph = node.graph  # type: ignore[assignment]  # local functions are inlined before lowering
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
#
# What onnxruntime (1.32, CPU) computes, per batch row b, from S new tokens, a past
# buffer of length P (``past_key.shape[2]``, 0 without past), ``seqlens_k`` and the
# scalar T = ``total_sequence_length`` (the mask itself is never read):
#
#   first prompt      first = (S == T)
#   row length        tot_b = seqlens_k[b] + 1
#   valid past        past_b = 0 if first else tot_b - S
#   present length    L = max(T, P)
#   present[b, :, j]  = past[b, :, j]            j <  past_b
#                     = new[b, :, j - past_b]    past_b <= j < past_b + S
#                     = 0                        otherwise
#   query s attends   j < tot_b  and  j <= past_b + s  and (window w >= 0)  j > a - w,
#                     a = past_b + s, or min(past_b + s, tot_b - 1) when softcap > 0 (the
#                     two differ only on the pad queries of a right-padded first prompt);
#                     a query with no such key outputs 0
#   rotary position   past_b + s; with a position_ids input: position_ids[b, s], except
#                     in a first prompt, where every row uses position_ids[0, 0] + s
#   softcap           softcap * tanh(score / softcap) before masking and softmax
#
# The lowering builds exactly these tensors: present = Where(valid, GatherElements(
# Concat(past, new), index), 0) and a boolean [B, 1, S, L] mask for a standard
# Attention (23) on 4-D inputs. Left padding in the attention mask therefore gives
# what onnxruntime gives (it attends the pad positions, it does not see them).
# onnxruntime refuses S > 1 with S != T (a prompt after a past) at batch > 1; the
# lowering applies the same per-row rule there. Inputs that
# onnxruntime would read out of bounds for (tot_b > L, past_b > P, tot_b < S after the
# first prompt) are outside the operator's contract.

_GQA_UNLOWERED_INPUTS = {10: "attention_bias", 11: "head_sink", 12: "k_scale", 13: "v_scale",
                         14: "q_norm_weight", 15: "k_norm_weight", 16: "query_seqlens"}


def _check_gqa(node: Node, ctx: LowerContext) -> str | None:
    ins = _ins(node, 17)
    q, k, v, pk, pv, seqlens, total, cos, sin = ins[:9]
    reasons = []
    if q is None or seqlens is None or total is None:
        reasons.append("query, seqlens_k and total_sequence_length are required")
    if (k is None) != (v is None):
        reasons.append("key and value must be given together")
    if (pk is None) != (pv is None):
        reasons.append("past_key and past_value must be given together")
    used = _outs_used(node) + [False] * 4
    if used[3]:
        reasons.append("output_qk is not lowered")
    for i, nm in _GQA_UNLOWERED_INPUTS.items():
        if ins[i] is not None:
            reasons.append(f"input {nm} is not lowered")
    if not int(node.attr("num_heads", 0)) or not int(node.attr("kv_num_heads", 0)):
        reasons.append("num_heads and kv_num_heads must be positive")
    elif int(node.attr("num_heads")) % int(node.attr("kv_num_heads")):
        reasons.append("num_heads must be a multiple of kv_num_heads")
    window = int(node.attr("local_window_size", -1))
    if window < -1:
        reasons.append(f"local_window_size={window} is outside onnxruntime's range (-1 or >= 0)")
    if int(node.attr("sliding_window_cache", 0)) != 0:
        reasons.append("a windowed cache is not lowered")
    if int(node.attr("smooth_softmax", 0)) == 1:
        reasons.append("smooth_softmax is not lowered")
    if int(node.attr("qk_output", 0)) != 0:
        reasons.append("qk_output is not lowered")
    if float(node.attr("softcap", 0.0)) < 0:
        reasons.append("a negative softcap is not lowered")
    for a in ("k_quant_type", "v_quant_type"):
        val = node.attr(a, b"NONE")
        if (val.decode() if isinstance(val, bytes) else str(val)).upper() != "NONE":
            reasons.append(f"a quantized KV cache ({a}) is not lowered")
    if int(node.attr("do_rotary", 0)):
        if cos is None or sin is None:
            reasons.append("do_rotary needs cos_cache and sin_cache")
        elif _rotary_dim_from_cache(cos) is None:
            reasons.append("do_rotary needs a cos_cache of static shape [max_position, rotary_dim / 2]")
    et = elem_type(q)
    if et is not None and et not in _FLOATS:
        reasons.append("query must be a float tensor")
    if tensor_rank(q) not in (None, 3):
        reasons.append("query must be 3-D (batch, sequence, hidden)")
    return "; ".join(reasons) or None


class _Gqa:
    """Emits the lowering of one GroupQueryAttention node (see the table above)."""

    def __init__(self, node: Node, ctx: LowerContext):
        self.node = node
        self.g: Graph = node.graph  # type: ignore[assignment]  # functions are inlined before lowering
        self.em = ctx.emitter
        self.name = node.name or "GroupQueryAttention"

    def op(self, op_type: str, inputs: list[Value | None], tag: str, **attrs: Any) -> Value:
        """One single-output node named ``<node>/<tag>``, inserted before the node."""
        return self.em.node(self.g, self.node, op_type, inputs, name=f"{self.name}/{tag}", **attrs)[0]

    def i64(self, value: Any, hint: str) -> Value:
        return self.em.const(self.g, np.array(value, np.int64), hint)

    def dim(self, shape: Value, axis: int, tag: str) -> Value:
        """``shape[axis]`` as a 1-element int64 tensor."""
        return self.op("Gather", [shape, self.i64([axis], f"idx{axis}")], tag, axis=0)

    def scalar(self, v: Value, tag: str) -> Value:
        return self.op("Reshape", [v, self.i64(np.zeros((0,), np.int64), "scalar_shape")], tag)

    def to_i64(self, v: Value, tag: str) -> Value:
        if elem_type(v) == TensorProto.INT64:
            return v
        return self.op("Cast", [v], tag, to=TensorProto.INT64)

    def unsqueeze(self, v: Value, axes: list[int], tag: str) -> Value:
        return self.op("Unsqueeze", [v, self.i64(axes, "axes_" + "_".join(map(str, axes)))], tag)

    def to_bnsh(self, x: Value, heads: int, tag: str) -> Value:
        """[B, S, heads * D] -> [B, heads, S, D]."""
        r = self.op("Reshape", [x, self.i64([0, 0, heads, -1], f"bshd_{heads}")], f"{tag}_bshd")
        return self.op("Transpose", [r], f"{tag}_bnsh", perm=[0, 2, 1, 3])


def _gqa_split_packed(b: _Gqa, q: Value, hq: int, hkv: int) -> tuple[Value, Value, Value]:
    """Packed QKV: head_size = hidden / (hq + 2 hkv); split [hq, hkv, hkv] * head_size."""
    qs = b.op("Shape", [q], "qkv_shape", start=-1)
    hd = b.op("Div", [qs, b.i64([hq + 2 * hkv], "heads_total")], "head_size")
    sizes = b.op("Mul", [hd, b.i64([hq, hkv, hkv], "qkv_heads")], "split_sizes")
    outs = b.em.node(b.g, b.node, "Split", [q, sizes], 3, name=f"{b.name}/split_qkv", axis=-1)
    return outs[0], outs[1], outs[2]


def _gqa_rotary(b: _Gqa, q: Value, k: Value, qa: Value, first: Value, ar_s: Value,
                pos_ids: Value | None, hq: int, hkv: int) -> tuple[Value, Value]:
    node = b.node
    cos, sin = node.inputs[7], node.inputs[8]
    if pos_ids is None:
        pos = qa
    else:
        given = b.to_i64(pos_ids, "pos_i64")                                         # [B, >= S]
        seq = b.op("Shape", [q], "seq_len", start=1, end=2)
        zero1, one1 = b.i64([0], "zero1"), b.i64([1], "one1")
        given = b.op("Slice", [given, zero1, seq, one1], "pos_first_s")               # [B, S]
        origin = b.op("Slice", [given, b.i64([0, 0], "zero2"), b.i64([1, 1], "one2")],
                      "pos_origin")                                                   # [1, 1]
        offset = b.op("Add", [origin, b.unsqueeze(ar_s, [0], "arange_row")], "pos_offset")
        pos = b.op("Where", [first, offset, given], "position_ids")                 # [B, S]
    attrs: dict[str, Any] = {"interleaved": int(node.attr("rotary_interleaved", 0)),
                             "rotary_embedding_dim": _rotary_dim_from_cache(cos)}
    q = b.op("RotaryEmbedding", [q, cos, sin, pos], "rotary_q", num_heads=hq, **attrs)
    k = b.op("RotaryEmbedding", [k, cos, sin, pos], "rotary_k", num_heads=hkv, **attrs)
    return q, k


def _gqa_present(b: _Gqa, past: Value | None, new4: Value, pb: Value, j_row: Value,
                 p_len: Value, s_len: Value, l_len1: Value, zero: Value, tag: str) -> Value:
    """The present cache [B, H, L, D] (see the table above)."""
    cat = new4 if past is None else b.op("Concat", [past, new4], f"{tag}_concat", axis=2)
    from_past = b.op("Less", [j_row, pb], f"{tag}_from_past")                          # [B, L]
    shifted = b.op("Add", [b.op("Sub", [j_row, pb], f"{tag}_new_offset"), p_len], f"{tag}_new_index")
    idx = b.op("Where", [from_past, j_row, shifted], f"{tag}_index")
    valid = b.op("Less", [j_row, b.op("Add", [pb, s_len], f"{tag}_end")], f"{tag}_valid")
    idx = b.op("Where", [valid, idx, b.i64(0, "zero")], f"{tag}_index_valid")
    idx4 = b.unsqueeze(idx, [1, 3], f"{tag}_index4")                                  # [B, 1, L, 1]
    cs = b.op("Shape", [cat], f"{tag}_cat_shape")
    bh = b.op("Slice", [cs, b.i64([0], "zero1"), b.i64([2], "two1")], f"{tag}_bh")
    d = b.op("Slice", [cs, b.i64([3], "three1"), b.i64([4], "four1")], f"{tag}_d")
    shape = b.op("Concat", [bh, l_len1, d], f"{tag}_shape", axis=0)
    gathered = b.op("GatherElements", [cat, b.op("Expand", [idx4, shape], f"{tag}_index_full")],
                    f"{tag}_gather", axis=2)
    return b.op("Where", [b.unsqueeze(valid, [1, 3], f"{tag}_valid4"), gathered, zero], f"{tag}_present")


def _lower_gqa(node: Node, ctx: LowerContext) -> None:
    b = _Gqa(node, ctx)
    ins = _ins(node, 17)
    q, k, v, pk, pv, seqlens, total = ins[:7]
    pos_ids = ins[9]
    hq = int(node.attr("num_heads"))
    hkv = int(node.attr("kv_num_heads"))
    window = int(node.attr("local_window_size", -1))
    if k is None:
        q, k, v = _gqa_split_packed(b, q, hq, hkv)

    # per-row lengths: tot_b, past_b, and the absolute position qa[b, s] = past_b + s
    qshape = b.op("Shape", [q], "q_shape")
    s_len = b.scalar(b.dim(qshape, 1, "seq1"), "seq")
    t_len = b.to_i64(b.scalar(total, "total"), "total_i64")
    tot = b.op("Add", [b.to_i64(seqlens, "seqlens_i64"), b.i64(1, "one")], "row_total")       # [B]
    first = b.op("Equal", [s_len, t_len], "first_prompt")
    past_b = b.op("Where", [first, b.i64(0, "zero"), b.op("Sub", [tot, s_len], "row_past_raw")],
                  "row_past")                                                                 # [B]
    ar_s = b.op("Range", [b.i64(0, "zero"), s_len, b.i64(1, "one")], "arange_seq")            # [S]
    pb = b.unsqueeze(past_b, [1], "row_past_col")                                             # [B, 1]
    qa = b.op("Add", [pb, b.unsqueeze(ar_s, [0], "arange_row")], "query_position")            # [B, S]

    if int(node.attr("do_rotary", 0)):
        q, k = _gqa_rotary(b, q, k, qa, first, ar_s, pos_ids, hq, hkv)

    q4, k4, v4 = b.to_bnsh(q, hq, "q"), b.to_bnsh(k, hkv, "k"), b.to_bnsh(v, hkv, "v")
    p_len = (b.i64(0, "zero") if pk is None else
             b.scalar(b.dim(b.op("Shape", [pk], "past_shape"), 2, "past_len1"), "past_len"))
    l_len = b.op("Max", [t_len, p_len], "present_len")
    l_len1 = b.unsqueeze(l_len, [0], "present_len1")
    j = b.op("Range", [b.i64(0, "zero"), l_len, b.i64(1, "one")], "key_index")               # [L]
    j_row = b.unsqueeze(j, [0], "key_row")                                                     # [1, L]
    zero = b.op("CastLike", [b.em.const(b.g, np.array(0.0, np.float32), "zero_f"), q], "zero_like")
    pres_k = _gqa_present(b, pk, k4, pb, j_row, p_len, s_len, l_len1, zero, "key")
    pres_v = _gqa_present(b, pv, v4, pb, j_row, p_len, s_len, l_len1, zero, "value")

    # mask[b, 0, s, j] = j < tot_b and j <= qa[b, s] (and j > qa[b, s] - window)
    qa3 = b.unsqueeze(qa, [2], "query_position3")                                             # [B, S, 1]
    j3 = b.unsqueeze(j, [0, 1], "key_index3")                                                 # [1, 1, L]
    tot3 = b.unsqueeze(tot, [1, 2], "row_total3")                                             # [B, 1, 1]
    allowed = b.op("And", [b.op("LessOrEqual", [j3, qa3], "causal"),
                           b.op("Less", [j3, tot3], "in_row")], "allowed")
    softcap = float(node.attr("softcap", 0.0))
    if window >= 0:
        qa_w = qa
        if softcap:  # onnxruntime's softcap path windows a padded query from the row's last token
            last = b.op("Sub", [b.unsqueeze(tot, [1], "row_total_col"), b.i64(1, "one")], "row_last")
            qa_w = b.op("Min", [qa, last], "window_position")
        qa3 = b.unsqueeze(qa_w, [2], "window_position3")
        lo = b.op("Sub", [qa3, b.i64(window, f"window_{window}")], "window_start")
        allowed = b.op("And", [allowed, b.op("Greater", [j3, lo], "in_window")], "allowed_window")
    mask = b.unsqueeze(allowed, [1], "mask")                                                  # [B,1,S,L]

    attrs: dict[str, Any] = {"is_causal": 0}
    scale = float(node.attr("scale", 0.0))
    if scale:
        attrs["scale"] = scale
    if softcap:
        attrs["softcap"] = softcap
    out4 = b.op("Attention", [q4, pres_k, pres_v, mask], "attention", **attrs)              # [B,hq,S,D]
    if window >= 0:  # a query whose window holds no valid key outputs 0
        first_key = b.op("Max", [b.op("Sub", [qa_w, b.i64(window - 1, f"window_{window}_m1")],
                                       "window_first"), b.i64(0, "zero")], "window_first_valid")
        last_end = b.op("Min", [b.op("Add", [qa, b.i64(1, "one")], "causal_end"),
                                b.unsqueeze(tot, [1], "row_total_col")], "key_end")
        row_ok = b.unsqueeze(b.op("Less", [first_key, last_end], "row_has_key"), [1, 3], "row_has_key4")
        out4 = b.op("Where", [row_ok, out4, zero], "attention_guarded")
    out_t = b.op("Transpose", [out4], "out_bshd", perm=[0, 2, 1, 3])
    out = b.em.node(b.g, node, "Reshape", [out_t, b.i64([0, 0, -1], "bs_hidden")], name=b.name)[0]
    _finish(node, ctx, {0: out, 1: pres_k, 2: pres_v})


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
