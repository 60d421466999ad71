"""Recurrent operators: ``RNN``, ``GRU``, ``LSTM`` (``layout`` 0 and 1) and the linear
attention operators ``LinearAttention`` (opset 27) and ``ai.onnx.preview`` ``FlexAttention``.

With ``D`` directions (2 when ``direction="bidirectional"``) and hidden size ``H``
(attribute ``hidden_size``, else the last dimension of ``R``)::

    layout 0: X[seq, batch, in] -> Y[seq, D, batch, H], Y_h / Y_c[D, batch, H]
    layout 1: X[batch, seq, in] -> Y[batch, seq, D, H], Y_h / Y_c[batch, D, H]

``LinearAttention`` takes packed ``[B, T, heads*dim]`` inputs::

    query[B, T, Hq*dk], key[B, T, Hkv*dk], value[B, T, Hkv*dv]
      -> output[B, T, Hq*dv], present_state[B, Hkv, dk, dv]
"""
from __future__ import annotations

from onnxforge.graphbuilder.shapes.infer._base import NodeInference, register
from onnxforge.graphbuilder.shapes.symbolic import Dim, as_dim, floordiv

__all__: list[str] = []

PREVIEW = "ai.onnx.preview"


def _directions(op: NodeInference) -> int:
    d = op.attr("direction", b"forward")
    d = d.decode() if isinstance(d, bytes) else str(d)
    return 2 if d == "bidirectional" else 1


@register("RNN", "GRU", "LSTM")
def _recurrent(op: NodeInference) -> None:
    x, r = op.shape(0), op.shape(2)
    elem = op.elem(0) or op.elem(1)
    hidden: Dim = op.int_attr("hidden_size")
    if hidden is None and r is not None and len(r) == 3:
        hidden = r[2]
    dirs = _directions(op)
    layout = op.int_attr("layout", 0) if op.version >= 14 else 0
    seq: Dim = None
    batch: Dim = None
    if x is not None:
        if len(x) != 3:
            op.fail(f"X must be 3-D, got rank {len(x)}")
        seq, batch = (x[1], x[0]) if layout else (x[0], x[1])
    if layout:
        y, state = [batch, seq, dirs, hidden], [batch, dirs, hidden]
    else:
        y, state = [seq, dirs, batch, hidden], [dirs, batch, hidden]
    if op.has_output(0):
        op.set(0, elem, y)
    for i in range(1, op.n_outputs):
        if op.has_output(i):
            op.set(i, elem, state)


def _per_head(d: Dim, heads: int | None) -> Dim:
    if d is None or not heads:
        return None
    return as_dim(floordiv(d, heads))


@register("LinearAttention")
def _linear_attention(op: NodeInference) -> None:
    q, k, v = op.shape(0), op.shape(1), op.shape(2)
    elem = op.elem(0)
    hq, hkv = op.int_attr("q_num_heads"), op.int_attr("kv_num_heads")
    dk = _per_head(k[2], hkv) if k is not None and len(k) == 3 else None
    dv = _per_head(v[2], hkv) if v is not None and len(v) == 3 else None
    b: Dim = q[0] if q is not None else None
    t: Dim = q[1] if q is not None else None
    op.set(0, elem, [b, t, None if dv is None or not hq else as_dim(dv * hq)])
    if op.has_output(1):
        past = op.shape(3) if op.has(3) else None
        state: list[Dim] = [b, hkv, dk, dv]
        if past is not None and len(past) == 4:
            state = [p if not isinstance(d, int) and p is not None else d for d, p in zip(state, past)]
        op.set(1, op.elem(3) or elem, state)


@register("FlexAttention", domain=PREVIEW)
def _flex_attention(op: NodeInference) -> None:
    q, v = op.shape(0), op.shape(2)
    if q is None or len(q) != 4:
        op.set(0, op.elem(0), None if q is None else [None] * len(q))
        return
    op.set(0, op.elem(0), [q[0], q[1], q[2], v[3] if v is not None and len(v) == 4 else None])
