"""Attention-family operators of the decoders: ONNX ``Attention``, ``RotaryEmbedding``,
``RMSNormalization`` (opset 23) and the onnxruntime operators ``GroupQueryAttention``,
``MatMulNBits``, ``RotaryEmbedding``, ``SkipSimplifiedLayerNormalization``,
``SkipLayerNormalization`` (``com.microsoft``) and ``SimplifiedLayerNormalization``
(registered by onnxruntime in the default domain).

Cache lengths stay symbolic: ``present_key`` of ``Attention`` is
``[B, kv_heads, past + kv_seq, head]``. ``GroupQueryAttention``'s present has the
past's length when the output is declared to alias the past (the shared-buffer
mode: the buffer is capacity sized) or with ``sliding_window_cache=1``, and
``past + kv_seq`` otherwise (without a past: ``total_sequence_length`` when its
content is known, else ``kv_seq``).
"""
from __future__ import annotations

from onnx import TensorProto
from onnxforge.graphbuilder.shapes.infer._base import NodeInference, register
from onnxforge.graphbuilder.shapes.infer.nn import stats_shape
from onnxforge.graphbuilder.ir.core import MUST_ALIAS
from onnxforge.graphbuilder.shapes.symbolic import Dim, as_dim, floordiv, sum_dims

__all__: list[str] = []

MS = "com.microsoft"


def _div(op: NodeInference, d: Dim, k: int | None, what: str) -> Dim:
    if d is None or not k:
        return None
    if isinstance(d, int) and d % k:
        op.fail(f"{what} {d} is not a multiple of {k}")
    return as_dim(floordiv(d, k))


def _mul(d: Dim, k: int | None) -> Dim:
    return None if d is None or k is None else as_dim(d * k)


@register("Attention")
def _attention(op: NodeInference) -> None:
    q, k, v = op.shape(0), op.shape(1), op.shape(2)
    q_elem, k_elem, v_elem = op.elem(0), op.elem(1) or op.elem(0), op.elem(2) or op.elem(0)
    past = op.shape(4) if op.has(4) else None
    rank = len(q) if q is not None else None
    if rank not in (None, 3, 4):
        op.fail(f"Q must be 3-D or 4-D, got rank {rank}")
    for what, s in (("K", k), ("V", v)):
        if rank is not None and s is not None and len(s) != rank:
            op.fail(f"Q has rank {rank} but {what} has rank {len(s)}")
    batch: Dim = q[0] if q is not None else None
    y: list[Dim] | None = None
    q_heads: Dim = None
    kv_heads: Dim = None
    kv_seq: Dim = None
    head: Dim = None
    v_head: Dim = None
    if rank == 4:
        q_heads, q_seq = q[1], q[2]
        if k is not None:
            kv_heads, kv_seq, head = k[1], k[2], k[3]
            op.check_dims(q[3], k[3], "head size of Q and K")
        v_head = v[3] if v is not None else None
        y = [batch, q_heads, q_seq, v_head]
    elif rank == 3:
        q_heads = op.int_attr("q_num_heads")
        kv_n = op.int_attr("kv_num_heads")
        if not q_heads or not kv_n:
            op.fail("3-D inputs need the q_num_heads and kv_num_heads attributes")
        kv_heads = kv_n
        q_seq = q[1]
        if k is not None:
            kv_seq, head = k[1], _div(op, k[2], kv_n, "key hidden size")
        v_head = _div(op, v[2], kv_n, "value hidden size") if v is not None else None
        y = [batch, q_seq, _mul(v_head, q_heads)]
    else:
        q_seq = None
    op.set(0, q_elem, y)
    past_len = past[2] if past is not None and len(past) == 4 else (0 if not op.has(4) else None)
    total = sum_dims([past_len, kv_seq])
    if past is not None and len(past) == 4:
        kv_heads = kv_heads if kv_heads is not None else past[1]
    if op.has_output(1):
        op.set(1, k_elem, [batch, kv_heads, total, head])
    if op.has_output(2):
        op.set(2, v_elem, [batch, kv_heads, total, v_head])
    if op.has_output(3):
        op.set(3, q_elem, [batch, q_heads, q_seq, total])


@register("RotaryEmbedding")
@register("RotaryEmbedding", domain=MS)
def _rotary(op: NodeInference) -> None:
    op.same_as_input()


@register("RMSNormalization")
def _rms_norm(op: NodeInference) -> None:
    op.same_as_input(elem=op.elem(1) or op.elem(0))


@register("SimplifiedLayerNormalization")
@register("SimplifiedLayerNormalization", domain=MS)
def _simplified_ln(op: NodeInference) -> None:
    op.same_as_input(elem=op.elem(1) or op.elem(0))
    if op.has_output(1):
        stash = op.int_attr("stash_type", TensorProto.FLOAT)
        op.set(1, stash, stats_shape(op))


@register("SkipSimplifiedLayerNormalization", "SkipLayerNormalization", domain=MS)
def _skip_ln(op: NodeInference) -> None:
    op.same_as_input()
    s = op.shape(0)
    stats = None if s is None else list(s[:-1]) + [1]
    for i in (1, 2):
        if op.has_output(i):
            op.set(i, TensorProto.FLOAT, stats)
    if op.has_output(3):
        op.same_as_input(3, 0)


@register("MatMulNBits", domain=MS)
def _matmul_nbits(op: NodeInference) -> None:
    a = op.shape(0)
    n = op.int_attr("N")
    k = op.int_attr("K")
    if a is not None:
        if not a:
            op.fail("input A must have rank >= 1")
        op.check_dims(a[-1], k, "last dimension of A and attribute K")
    op.set(0, op.elem(0), None if a is None else list(a[:-1]) + [n])


def _aliases_past(op: NodeInference, out: int, past: int) -> bool:
    """True when output ``out`` is declared to share the storage of input ``past``."""
    if not op.has(past) or out >= op.n_outputs:
        return False
    v = op.output(out)
    target = op.input(past)
    if v.alias_of is target or (isinstance(v.alias_of, str) and v.alias_of == target.name and v.alias_of):
        return True
    return any(a.output_index == out and a.input_index == past and a.kind == MUST_ALIAS
               for a in op.node.output_alias)


@register("GroupQueryAttention", domain=MS)
def _gqa(op: NodeInference) -> None:
    q = op.shape(0)
    elem = op.elem(0)
    num_heads = op.int_attr("num_heads")
    kv_heads = op.int_attr("kv_num_heads")
    if q is not None and len(q) != 3:
        op.fail(f"query must be 3-D, got rank {len(q)}")
    packed = not op.has(1)
    head: Dim = None
    kv_seq: Dim = None
    out = None
    if q is not None:
        if packed:
            total_heads = (num_heads or 0) + 2 * (kv_heads or 0)
            head = _div(op, q[2], total_heads, "packed QKV hidden size") if num_heads and kv_heads else None
            out = [q[0], q[1], _mul(head, num_heads)]
            kv_seq = q[1]
        else:
            head = _div(op, q[2], num_heads, "query hidden size")
            out = list(q)
            k = op.shape(1)
            kv_seq = k[1] if k is not None and len(k) == 3 else None
    op.set(0, elem, out)
    past = op.shape(3) if op.has(3) else None
    if past is not None and len(past) != 4:
        op.fail(f"past_key must be 4-D, got rank {len(past)}")
    present_elem = op.elem(3) or elem
    batch = q[0] if q is not None else (past[0] if past is not None else None)
    if past is not None:
        head = head if head is not None else past[3]
        shared = op.int_attr("sliding_window_cache", 0) == 1 or _aliases_past(op, 1, 3)
        length = past[2] if shared else sum_dims([past[2], kv_seq])
    elif op.has(3):
        length = None
    else:
        total = op.ints(6) if op.has(6) else None
        length = total[0] if total is not None and len(total) == 1 and total[0] is not None else kv_seq
    for i in (1, 2):
        if op.has_output(i):
            op.set(i, present_elem, [batch, kv_heads, length, head])
    if op.has_output(3):
        total_len = sum_dims([past[2], kv_seq]) if past is not None else length
        op.set(3, elem, [batch, num_heads, q[1] if q is not None else None, total_len])
