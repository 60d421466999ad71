"""Attention-family kernels: RotaryEmbedding (ONNX and com.microsoft), ONNX Attention,
com.microsoft GroupQueryAttention (rotary, seqlens_k, shared past/present buffer).

Grouped heads are handled by reshaping the queries to ``[B, Nkv, group * S, H]``
so one batched product per KV head reads the keys in place (no repeat of K/V).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from onnxforge.kernels_cy.errors import CacheRangeError, KernelError
from onnxforge.kernels_cy.ops import fast
from onnxforge.kernels_cy.ops.base import Kernel, NodeSpec, register
from onnxforge.kernels_cy.runtime.runctx import RunContext

F32 = np.dtype(np.float32)

__all__ = ["rotate", "grouped_attention"]


def rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, interleaved: bool, rot_dim: int) -> np.ndarray:
    """Rotary embedding of ``x`` [..., S, N, H] with ``cos``/``sin`` broadcastable to [..., S, 1, rot/2]."""
    out = np.array(x, copy=True)
    xr = x[..., :rot_dim]
    if interleaved:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
        out[..., 0:rot_dim:2] = cos * x1 - sin * x2
        out[..., 1:rot_dim:2] = sin * x1 + cos * x2
    else:
        h = rot_dim // 2
        x1, x2 = xr[..., :h], xr[..., h:]
        out[..., :h] = cos * x1 - sin * x2
        out[..., h:rot_dim] = sin * x1 + cos * x2
    return out


def _positions(kernel: Kernel, position_ids: Any, cos_cache: np.ndarray, sin_cache: np.ndarray) -> np.ndarray:
    """int64 position ids, each a row of both caches (``[0, rows)``, no wrapping of
    negatives, as onnxruntime checks them), or a KernelError before anything is written."""
    pos = np.asarray(position_ids)
    if pos.dtype.kind not in "iu":
        raise kernel.error(f"position_ids must be integers, got {pos.dtype}")
    rows = min(cos_cache.shape[0], sin_cache.shape[0]) if cos_cache.ndim and sin_cache.ndim else 0
    pos = pos.astype(np.int64, copy=False)
    bad = (pos < 0) | (pos >= rows)
    if bad.any():
        at = tuple(int(v) for v in np.argwhere(bad)[0])
        raise kernel.error(f"position_ids{list(at)} = {int(pos[at])} is outside the cos/sin cache [0, {rows})")
    return pos


@register("", "RotaryEmbedding")
class RotaryEmbedding(Kernel):
    """ONNX opset 23: (X, cos_cache, sin_cache, position_ids?)."""

    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.interleaved = bool(spec.int("interleaved", 0))
        self.num_heads = spec.int("num_heads", 0)
        self.rot = spec.int("rotary_embedding_dim", 0)
        if fast.RotaryCall is not None:  # the compiled call for 4-D inputs with per-token caches
            self.run = fast.RotaryCall(self.interleaved, self.rot, self._run)  # type: ignore[method-assign]

    def run(self, x, cos_cache, sin_cache, position_ids=None):
        return self._run(x, cos_cache, sin_cache, position_ids)

    def _run(self, x, cos_cache, sin_cache, position_ids=None):
        four = x.ndim == 4
        if four:  # [B, N, S, H] -> [B, S, N, H]
            xs = np.transpose(x, (0, 2, 1, 3))
        else:
            if not self.num_heads:
                raise self.error("a 3-D input needs the num_heads attribute")
            b, s, hid = x.shape
            xs = x.reshape(b, s, self.num_heads, hid // self.num_heads)
        rot = self.rot or xs.shape[-1]
        if (fast.rotary is not None and x.dtype == F32 and cos_cache.dtype == F32 and sin_cache.dtype == F32
                and xs.strides[-1] == 4 and cos_cache.shape[-1] * 2 == rot and rot <= xs.shape[-1]
                and (position_ids is not None or cos_cache.ndim == 3)):
            out = np.empty(x.shape, dtype=F32)
            ov = np.transpose(out, (0, 2, 1, 3)) if four else out.reshape(xs.shape)
            fast.rotary(xs, cos_cache, sin_cache, ov, position_ids=position_ids, interleaved=self.interleaved)
            return out
        if position_ids is not None:
            pos = _positions(self, position_ids, cos_cache, sin_cache)
            cos, sin = cos_cache[pos], sin_cache[pos]
        else:
            cos, sin = cos_cache, sin_cache
        if cos.shape[-1] != rot // 2:
            raise self.error(f"cos cache last dimension {cos.shape[-1]} != rotary dim / 2 = {rot // 2}")
        y = rotate(xs, cos[:, :, None, :], sin[:, :, None, :], self.interleaved, rot)
        if four:
            return np.ascontiguousarray(np.transpose(y, (0, 2, 1, 3)))
        return y.reshape(x.shape)


@register("com.microsoft", "RotaryEmbedding")
class MsRotaryEmbedding(Kernel):
    """com.microsoft: (input, position_ids, cos_cache, sin_cache)."""

    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.interleaved = bool(spec.int("interleaved", 0))
        self.num_heads = spec.int("num_heads", 0)
        self.rot = spec.int("rotary_embedding_dim", 0)
        if spec.int("is_packed_batching", 0):
            raise spec.fail("is_packed_batching=1 is not supported")

    def run(self, x, position_ids, cos_cache, sin_cache):
        four = x.ndim == 4
        if four:
            xs = np.transpose(x, (0, 2, 1, 3))
        else:
            b, s, hid = x.shape
            h = cos_cache.shape[-1] * 2 if not self.num_heads else hid // self.num_heads
            if self.rot and not self.num_heads:
                raise self.error("num_heads is required with rotary_embedding_dim")
            xs = x.reshape(b, s, hid // h, h)
        b, s = xs.shape[0], xs.shape[1]
        rot = self.rot or xs.shape[-1]
        pos = np.asarray(position_ids)
        if pos.size == 1 and pos.ndim <= 1:
            pos = int(pos.reshape(-1)[0]) + np.arange(s)[None, :].repeat(b, 0)
        elif pos.shape != (b, s):
            raise self.error(f"position_ids shape {list(pos.shape)} is neither [1] nor [batch, sequence] = {[b, s]}")
        pos = _positions(self, pos, cos_cache, sin_cache)
        cos, sin = cos_cache[pos], sin_cache[pos]
        y = rotate(xs, cos[:, :, None, :], sin[:, :, None, :], self.interleaved, rot)
        if four:
            return np.ascontiguousarray(np.transpose(y, (0, 2, 1, 3)))
        return y.reshape(x.shape)


def grouped_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float,
                      bias: np.ndarray | None) -> np.ndarray:
    """softmax(q k^T * scale + bias) v with grouped heads.

    q [Nq, S, H], k [Nkv, T, H], v [Nkv, T, Hv], bias broadcastable to [Nq, S, T]
    (or None); returns [Nq, S, Hv].
    """
    nq, s, h = q.shape
    nkv, t = k.shape[0], k.shape[1]
    g = nq // nkv
    qg = q.reshape(nkv, g * s, h)
    scores = np.matmul(qg, np.swapaxes(k, 1, 2))  # [Nkv, g*S, T]
    scores *= scores.dtype.type(scale)
    scores = scores.reshape(nq, s, t)
    if bias is not None:
        scores += bias
    m = np.max(scores, axis=-1, keepdims=True)
    m[np.isneginf(m)] = 0
    scores -= m
    np.exp(scores, out=scores)
    tot = np.sum(scores, axis=-1, keepdims=True)
    tot[tot == 0] = 1
    scores /= tot
    out = np.matmul(scores.reshape(nkv, g * s, t), v)  # [Nkv, g*S, Hv]
    return out.reshape(nq, s, v.shape[-1])


def _inert(mask) -> bool:
    """True when an attention mask masks nothing (absent, all True, or all zero)."""
    if mask is None:
        return True
    if mask.dtype == np.bool_:
        return bool(mask.all())
    return mask.dtype.kind == "f" and not mask.any()


@register("", "Attention")
class Attention(Kernel):
    """ONNX Attention (opsets 23/24): 3-D or 4-D Q/K/V, masks, causal, past, GQA.

    K and V may be strided views (a prefix of a capacity-sized cache, ``Slice`` along the
    sequence axis) with fewer heads than Q: query head ``h`` reads KV head ``h // (Nq /
    Nkv)`` through products on the views, so the cache is neither copied nor repeated.
    Without present outputs, nothing but ``Y`` is produced."""

    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.causal = bool(spec.int("is_causal", 0))
        self.q_heads = spec.attrs.get("q_num_heads")
        self.kv_heads = spec.attrs.get("kv_num_heads")
        self.scale = spec.attrs.get("scale")
        self.softcap = spec.float("softcap", 0.0)
        self.mode = spec.int("qk_matmul_output_mode", 0)
        self.n_out = spec.n_outputs
        if self.mode not in (0, 1, 2, 3):
            raise spec.fail(f"qk_matmul_output_mode={self.mode} is not supported")
        sp = spec.attrs.get("softmax_precision")
        self.softmax_dtype = None
        if sp:
            from onnxforge.proto_ext.dtypes import np_dtype

            self.softmax_dtype = np_dtype(int(sp))
        self.left = spec.int("left_window_size", -1)
        self.right = spec.int("right_window_size", -1)
        if self.left < -1 or self.right < -1:
            raise spec.fail(f"window sizes must be -1 or >= 0, got {self.left}, {self.right}")
        if (fast.AttentionOneQuery is not None and not self.causal and self.softcap <= 0 and self.n_out == 1
                and self.softmax_dtype is None and self.left < 0 and self.right < 0
                and (self.scale is None or self.scale > 0)):  # the compiled call for a decode step
            self.run = fast.AttentionOneQuery(  # type: ignore[method-assign]
                float(self.scale or 0.0), spec.threads or 1, self._run)

    def run(self, q, k, v, mask=None, past_k=None, past_v=None, nonpad=None):
        return self._run(q, k, v, mask, past_k, past_v, nonpad)

    def _run(self, q, k, v, mask=None, past_k=None, past_v=None, nonpad=None):
        three = q.ndim == 3
        if three:
            b = q.shape[0]
            q = q.reshape(b, q.shape[1], self.q_heads, -1).transpose(0, 2, 1, 3)
            k = k.reshape(b, k.shape[1], self.kv_heads, -1).transpose(0, 2, 1, 3)
            v = v.reshape(b, v.shape[1], self.kv_heads, -1).transpose(0, 2, 1, 3)
        b, nq, s, h = q.shape
        present_k = np.concatenate((past_k, k), axis=2) if past_k is not None else k
        present_v = np.concatenate((past_v, v), axis=2) if past_v is not None else v
        t = present_k.shape[2]
        scale = self.scale if self.scale is not None else 1.0 / np.sqrt(h)
        dt = q.dtype
        if (dt == F32 and self.n_out <= 3 and self.softcap <= 0 and nonpad is None and self.left < 0
                and self.right < 0 and self.softmax_dtype is None
                and (mask is None or mask.shape[-1] == t)):
            y = None
            if s == 1 and b == 1 and fast.gqa_attention is not None and h <= 256 and present_k.shape[1] > 0 \
                    and nq % present_k.shape[1] == 0 and nq // present_k.shape[1] <= 16 and q.strides[-1] == 4 \
                    and present_k.strides[-1] == 4 and present_v.strides[-1] == 4 and _inert(mask) \
                    and present_v.shape[3] == h \
                    and (not self.causal or (past_k is not None and past_k.shape[2] >= t - 1)):
                y = self._one_query(q, present_k, present_v, scale, three)
            if y is None:
                y = self._fast(q, present_k, present_v, mask, past_k, scale, three)
            if self.n_out == 1:  # K and V may be views of a cache: never copied for nothing
                return y
            outs = (y, np.ascontiguousarray(present_k), np.ascontiguousarray(present_v))
            return outs[:self.n_out]
        bias = np.zeros((s, t), dtype=dt)
        if mask is not None:
            if mask.dtype == np.bool_:
                mask = np.where(mask, dt.type(0), dt.type(-np.inf))
            pad = t - mask.shape[-1]
            if pad > 0:
                mask = np.pad(mask, [(0, 0)] * (mask.ndim - 1) + [(0, pad)], constant_values=-np.inf)
            bias = bias + mask
        if self.causal:
            off = past_k.shape[2] if past_k is not None else 0
            if past_k is None and nonpad is not None:
                offs = nonpad.reshape(-1, 1, 1, 1) - s
            else:
                offs = off
            allowed = np.arange(t)[None, :] <= (np.arange(s)[:, None] + offs)
            bias = bias + np.where(allowed, dt.type(0), dt.type(-np.inf))
        if self.left >= 0 or self.right >= 0:
            if past_k is None and nonpad is not None:
                woff = (nonpad.reshape(-1) - s).reshape(-1, 1, 1, 1)
            else:
                woff = past_k.shape[2] if past_k is not None else 0
            diff = (np.arange(s)[:, None] + woff) - np.arange(t)[None, :]
            ok = np.ones(np.shape(diff), dtype=bool)
            if self.left >= 0:
                ok &= diff <= self.left
            if self.right >= 0:
                ok &= -diff <= self.right
            bias = bias + np.where(ok, dt.type(0), dt.type(-np.inf))
        if nonpad is not None:
            pm = np.arange(t)[None, :] < nonpad[:, None]
            bias = bias + np.where(pm, 0, -np.inf).astype(dt).reshape(b, 1, 1, t)
        bias = np.broadcast_to(bias, (b, nq, s, t)) if bias.ndim == 4 else np.broadcast_to(
            bias, (b, nq, s, t))
        nkv = present_k.shape[1]
        g = nq // nkv
        sq = dt.type(np.sqrt(scale))
        qg = (q * sq).reshape(b, nkv, g * s, h)
        qk = np.matmul(qg, np.swapaxes(present_k * sq, 2, 3)).astype(dt).reshape(b, nq, s, t)
        if self.softcap > 0:
            qk = (np.tanh(qk / dt.type(self.softcap)) * dt.type(self.softcap)).astype(dt)
        biased = (qk + bias).astype(dt)
        sm_dt = self.softmax_dtype or dt
        x = biased.astype(sm_dt)
        m = np.max(x, axis=-1, keepdims=True)
        m = np.where(np.isneginf(m), 0, m).astype(sm_dt)
        e = np.exp(x - m)
        tot = np.sum(e, axis=-1, keepdims=True)
        tot = np.where(tot == 0, 1, tot).astype(sm_dt)
        p = e / tot
        p = np.where(np.isneginf(np.max(bias, axis=-1, keepdims=True)), 0, p).astype(dt)
        y = np.matmul(p.reshape(b, nkv, g * s, t), present_v).astype(dt).reshape(b, nq, s, -1)
        if three:
            y = y.transpose(0, 2, 1, 3).reshape(b, s, -1)
        y = np.ascontiguousarray(y)
        if self.n_out == 1:
            return y
        outs = [y, np.ascontiguousarray(present_k), np.ascontiguousarray(present_v)]
        if self.n_out > 3:
            qk_out = {2: biased, 3: p}.get(self.mode, qk)
            outs.append(np.ascontiguousarray(qk_out.astype(dt)))
        return y if self.n_out == 1 else tuple(outs[:self.n_out])


    def _one_query(self, q, pk, pv, scale, three):
        """One new token of batch row 0 that sees every key (causal or not): the compiled
        grouped-head kernel reads K and V in place."""
        b, nq, s, h = q.shape
        t = pk.shape[2]
        out = np.empty((b, s, nq, h), dtype=F32)
        fast.gqa_attention(q.transpose(0, 2, 1, 3), pk, pv, np.array([t], dtype=np.int64), out, float(scale),
                           query_start=np.array([t - 1], dtype=np.int64))
        return out.reshape(b, s, nq * h) if three else out.reshape(b, nq, s, h)

    def _fast(self, q, pk, pv, mask, past_k, scale, three):
        """float32 without softcap / windows / extra outputs: one product, an in-place
        softmax and one product (scale applied once to the scores)."""
        b, nq, s, h = q.shape
        nkv, t = pk.shape[1], pk.shape[2]
        g = nq // nkv
        sc = np.matmul(q.reshape(b, nkv, g * s, h), np.swapaxes(pk, 2, 3)).reshape(b, nq, s, t)
        sc *= F32.type(scale)
        if mask is not None:
            sc += np.where(mask, F32.type(0), F32.type(-np.inf)) if mask.dtype == np.bool_ else mask
        if self.causal:
            off = past_k.shape[2] if past_k is not None else 0
            sc += np.where(np.arange(t)[None, :] <= np.arange(s)[:, None] + off, F32.type(0),
                           F32.type(-np.inf))
        m = np.max(sc, axis=-1, keepdims=True)
        dead = np.isneginf(m)
        if dead.any():
            m[dead] = 0
        sc -= m
        np.exp(sc, out=sc)
        tot = np.sum(sc, axis=-1, keepdims=True)
        if dead.any():
            tot[dead] = 1
        sc /= tot
        y = np.matmul(sc.reshape(b, nkv, g * s, t), pv).reshape(b, nq, s, -1)
        if three:
            return np.ascontiguousarray(y.transpose(0, 2, 1, 3)).reshape(b, s, -1)
        return y


@register("com.microsoft", "GroupQueryAttention")
class GroupQueryAttention(Kernel):
    """com.microsoft GroupQueryAttention on the CPU, as onnxruntime defines it.

    Per batch row ``b`` the valid total length is ``seqlens_k[b] + 1`` and the new
    tokens sit at positions ``[seqlens_k[b] + 1 - S, seqlens_k[b] + 1)`` (right
    padding). With ``do_rotary`` the queries and keys are rotated at those positions.
    When the node aliases present to past (output_alias), the new keys and values
    are written into the past buffer in place and the buffer is returned;
    otherwise present is a new [B, Nkv, max(total, past), H] buffer. In place, a
    write below a state buffer's published length (rule R3) or past its capacity is
    a :class:`CacheRangeError` before any write; the new length (``seqlens_k + 1``
    per row) is recorded for the state to publish.
    """

    uses_context = True  # published lengths of the buffers it writes in place

    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.nq = spec.int("num_heads")
        self.nkv = spec.int("kv_num_heads")
        if self.nkv <= 0 or self.nq % self.nkv:
            raise spec.fail(f"num_heads={self.nq} must be a multiple of kv_num_heads={self.nkv}")
        self.scale = spec.float("scale", 0.0)
        self.window = spec.int("local_window_size", -1)
        self.softcap = spec.float("softcap", 0.0)
        self.rotary = bool(spec.int("do_rotary", 0))
        self.interleaved = bool(spec.int("rotary_interleaved", 0))
        if spec.int("smooth_softmax", 0):
            raise spec.fail("smooth_softmax=1 is not supported")
        if spec.has_input(10) or spec.has_input(11):
            raise spec.fail("attention_bias and head_sink inputs are not supported")
        self.shared = (1, 3) in spec.aliases or (2, 4) in spec.aliases
        self.n_out = spec.n_outputs
        self.spec_threads = spec.threads_for
        self.threads = spec.threads
        self.one_row = (fast.gqa_attention is not None and fast.rotary is not None and self.window < 0
                        and self.nq // self.nkv <= 16)
        if self.one_row and fast.GqaOneToken is not None:  # the compiled call for a decode step
            self.run = fast.GqaOneToken(  # type: ignore[method-assign]
                self.nq, self.nkv, self.scale, self.softcap, self.rotary, self.interleaved, self.shared,
                self.n_out, self.threads or 1, self._run, self._floors, self._wrote, self.spec_path)

    def _floors(self, ctx: RunContext, past_k, past_v, p0: object, s: int) -> object:
        """Check the in-place write at rows ``p0`` (int or [B]) against the published lengths
        of the shared buffers; returns the run's length record (None: untracked)."""
        if ctx.lengths is None:
            return None
        for buf in (past_k, past_v):
            floor = ctx.floor(buf)
            if floor is None:
                continue
            nxt = ctx.next(buf)
            if isinstance(p0, int) and isinstance(floor, int) and isinstance(nxt, int):  # one row: no arrays
                below, gap = p0 < floor, p0 > nxt
            else:
                below = bool(np.any(np.asarray(p0) < np.asarray(floor)))
                gap = bool(np.any(np.asarray(p0) > np.asarray(nxt)))
            if below:
                raise CacheRangeError(f"{self.spec_path}: writes new tokens at {np.asarray(p0).tolist()}, "
                                      f"below the published length {floor} of {ctx.name(buf)!r} "
                                      f"(rule R3: a run writes only at or above it)")
            if gap:
                raise CacheRangeError(f"{self.spec_path}: writes {s} new token(s) at {np.asarray(p0).tolist()} "
                                      f"(seqlens_k + 1 - sequence length) but {ctx.name(buf)!r} holds {nxt}: "
                                      f"the rows between would be published without being written; the "
                                      f"attention mask must cover the published tokens plus the new ones")
        return ctx

    @staticmethod
    def _wrote(ctx: Any, past_k, past_v, end: Any) -> None:
        if ctx is None:
            return
        if isinstance(end, int):  # one row (the compiled decode step): no numpy call
            length: Any = end
        else:
            length = int(end) if np.ndim(end) == 0 else tuple(int(e) for e in end)
            if not isinstance(length, int) and len(set(length)) == 1:
                length = length[0]
        ctx.wrote(past_k, length)
        ctx.wrote(past_v, length)

    def run(self, ctx, q, k=None, v=None, past_k=None, past_v=None, seqlens_k=None, total_len=None,
            cos_cache=None, sin_cache=None, position_ids=None, attention_bias=None, head_sink=None):
        return self._run(ctx, q, k, v, past_k, past_v, seqlens_k, total_len, cos_cache, sin_cache, position_ids,
                         attention_bias, head_sink)

    def _run(self, rctx, q, k=None, v=None, past_k=None, past_v=None, seqlens_k=None, total_len=None,
             cos_cache=None, sin_cache=None, position_ids=None, attention_bias=None, head_sink=None):
        b, s = q.shape[0], q.shape[1]
        nq, nkv = self.nq, self.nkv
        if k is None:  # packed QKV
            h = q.shape[2] // (nq + 2 * nkv)
            qq = q[:, :, :nq * h]
            k = q[:, :, nq * h:(nq + nkv) * h]
            v = q[:, :, (nq + nkv) * h:]
            q = qq
        h = q.shape[2] // nq
        qs = q.reshape(b, s, nq, h)
        ks = k.reshape(b, s, nkv, h)
        vs = v.reshape(b, s, nkv, h)
        if seqlens_k is None or total_len is None:
            raise self.error("seqlens_k and total_sequence_length are required")
        if (b == 1 and self.one_row and q.dtype == F32 and h <= 256 and position_ids is None
                and qs.strides[-1] == 4 and ks.strides[-1] == 4 and seqlens_k.size == 1
                and (not self.rotary or cos_cache.dtype == F32)):
            got = self._one_row(rctx, qs, ks, vs, past_k, past_v, int(seqlens_k.reshape(-1)[0]) + 1,
                                int(total_len.reshape(-1)[0]), cos_cache, sin_cache)
            if got is not None:
                return got
        seqlens = np.asarray(seqlens_k, dtype=np.int64).reshape(-1) + 1
        total = int(np.asarray(total_len).reshape(-1)[0])
        cap = past_k.shape[2] if past_k is not None else 0
        past_len = np.maximum(seqlens - s, 0)
        ctx = None
        if self.shared:
            if np.any(past_len + s > cap):
                raise CacheRangeError(f"{self.spec_path}: new tokens at {past_len.tolist()} + {s} exceed "
                                      f"the buffer capacity {cap}")
            ctx = self._floors(rctx, past_k, past_v, past_len, s)
        if self.rotary:
            if position_ids is not None:
                pos = np.asarray(position_ids, dtype=np.int64).reshape(b, s)
            else:
                pos = past_len[:, None] + np.arange(s)[None, :]
            if pos.size and (pos.max() >= cos_cache.shape[0] or pos.min() < 0):
                raise self.error(f"positions up to {int(pos.max())} exceed the rotary cache "
                                 f"of {cos_cache.shape[0]}")
            if (fast.rotary is not None and q.dtype == F32 and cos_cache.dtype == F32
                    and qs.strides[-1] == 4 and ks.strides[-1] == 4):
                qr = np.empty(qs.shape, dtype=F32)
                kr = np.empty(ks.shape, dtype=F32)
                fast.rotary(qs, cos_cache, sin_cache, qr, position_ids=pos, interleaved=self.interleaved)
                fast.rotary(ks, cos_cache, sin_cache, kr, position_ids=pos, interleaved=self.interleaved)
                qs, ks = qr, kr
            else:
                cos = cos_cache[pos][:, :, None, :]
                sin = sin_cache[pos][:, :, None, :]
                rot = cos_cache.shape[-1] * 2
                qs = rotate(qs, cos, sin, self.interleaved, rot)
                ks = rotate(ks, cos, sin, self.interleaved, rot)
        if self.shared:
            pk, pv = past_k, past_v
        else:
            plen = max(total, cap)
            pk = np.zeros((b, nkv, plen, h), dtype=q.dtype)
            pv = np.zeros((b, nkv, plen, h), dtype=q.dtype)
        out = np.empty((b, s, nq, h), dtype=q.dtype)
        scale = self.scale or 1.0 / np.sqrt(h)
        if (fast.gqa_attention is not None and q.dtype == F32 and self.window < 0 and nq // nkv <= 16
                and qs.strides[-1] == 4 and h <= 256):
            for i in range(b):
                p0 = int(past_len[i])
                if not self.shared and past_k is not None and p0:
                    pk[i, :, :p0] = past_k[i, :, :p0]
                    pv[i, :, :p0] = past_v[i, :, :p0]
                pk[i, :, p0:p0 + s] = ks[i].transpose(1, 0, 2)
                pv[i, :, p0:p0 + s] = vs[i].transpose(1, 0, 2)
            totals = np.minimum(np.maximum(seqlens, past_len + s), pk.shape[2])
            work = int(totals.sum()) * nq * h * 2
            fast.gqa_attention(qs, pk, pv, totals, out, float(scale), query_start=past_len,
                               softcap=float(self.softcap), num_threads=self.spec_threads(work))
            self._wrote(ctx, pk, pv, past_len + s)
            y = out.reshape(b, s, nq * h)
            return (y, pk, pv)[:self.n_out] if self.n_out > 1 else y
        for i in range(b):
            p0 = int(past_len[i])
            t = int(seqlens[i])
            if not self.shared and past_k is not None and p0:
                pk[i, :, :p0] = past_k[i, :, :p0]
                pv[i, :, :p0] = past_v[i, :, :p0]
            pk[i, :, p0:p0 + s] = ks[i].transpose(1, 0, 2)
            pv[i, :, p0:p0 + s] = vs[i].transpose(1, 0, 2)
            t = max(t, min(p0 + s, pk.shape[2]))
            kk = pk[i, :, :t]
            vv = pv[i, :, :t]
            bias = None
            if s > 1 or self.window >= 0:
                qpos = p0 + np.arange(s)[:, None]
                kpos = np.arange(t)[None, :]
                allowed = kpos <= qpos
                if self.window >= 0:
                    allowed &= kpos > qpos - self.window
                bias = np.where(allowed, 0, -np.inf).astype(q.dtype)
            qi = np.ascontiguousarray(qs[i].transpose(1, 0, 2))  # [Nq, S, H]
            if self.softcap > 0:
                out[i] = _softcap_attention(qi, kk, vv, scale, bias, self.softcap).transpose(1, 0, 2)
            else:
                out[i] = grouped_attention(qi, kk, vv, scale, bias).transpose(1, 0, 2)
        self._wrote(ctx, pk, pv, past_len + s)
        y = out.reshape(b, s, nq * h)
        return (y, pk, pv)[:self.n_out] if self.n_out > 1 else y


    def _one_row(self, rctx, qs, ks, vs, past_k, past_v, seq, total, cos_cache, sin_cache):
        """Batch 1 with the compiled kernels: rotate the new keys straight into the
        present buffer, no position arrays, Python ints for the lengths. None when
        the call needs the general path."""
        s, nkv, h = qs.shape[1], self.nkv, qs.shape[3]
        cap = past_k.shape[2] if past_k is not None else 0
        p0 = seq - s if seq > s else 0
        ctx = None
        if self.shared:
            if p0 + s > cap:
                raise CacheRangeError(f"{self.spec_path}: new tokens at {[p0]} + {s} exceed the buffer "
                                      f"capacity {cap}")
            ctx = self._floors(rctx, past_k, past_v, p0, s)
            pk, pv = past_k, past_v
        else:
            plen = total if total > cap else cap
            if p0 + s > plen:
                return None
            pk = np.empty((1, nkv, plen, h), dtype=F32)
            pv = np.empty((1, nkv, plen, h), dtype=F32)
            if p0:
                pk[:, :, :p0] = past_k[:, :, :p0]
                pv[:, :, :p0] = past_v[:, :, :p0]
            if p0 + s < plen:
                pk[:, :, p0 + s:] = 0
                pv[:, :, p0 + s:] = 0
        start = np.array([p0], dtype=np.int64)  # the run's own: the kernel object is shared
        kdst = pk[:, :, p0:p0 + s].transpose(0, 2, 1, 3)
        if self.rotary:
            if p0 + s > cos_cache.shape[0]:
                raise self.error(f"positions up to {p0 + s - 1} exceed the rotary cache of {cos_cache.shape[0]}")
            qr = np.empty(qs.shape, dtype=F32)
            fast.rotary(qs, cos_cache, sin_cache, qr, start=start, interleaved=self.interleaved)
            fast.rotary(ks, cos_cache, sin_cache, kdst, start=start, interleaved=self.interleaved)
        else:
            qr = qs
            kdst[...] = ks
        pv[:, :, p0:p0 + s] = vs.transpose(0, 2, 1, 3)
        tot = seq if seq > p0 + s else p0 + s
        total_arr = np.array([tot if tot < pk.shape[2] else pk.shape[2]], dtype=np.int64)
        out = np.empty(qs.shape[:2] + (self.nq, h), dtype=F32)
        fast.gqa_attention(qr, pk, pv, total_arr, out, self.scale, query_start=start,
                           softcap=self.softcap, num_threads=self.spec_threads(tot * self.nq * h * 2))
        self._wrote(ctx, pk, pv, p0 + s)
        y = out.reshape(1, s, self.nq * h)
        return (y, pk, pv)[:self.n_out] if self.n_out > 1 else y


def _softcap_attention(q, k, v, scale, bias, cap):
    nq, s, h = q.shape
    nkv, t = k.shape[0], k.shape[1]
    g = nq // nkv
    sc = np.matmul(q.reshape(nkv, g * s, h), np.swapaxes(k, 1, 2)).reshape(nq, s, t) * q.dtype.type(scale)
    sc = np.tanh(sc / cap) * cap
    if bias is not None:
        sc = sc + bias
    sc = sc - np.max(sc, axis=-1, keepdims=True)
    e = np.exp(sc)
    e /= np.sum(e, axis=-1, keepdims=True)
    return np.matmul(e.reshape(nkv, g * s, t), v).reshape(nq, s, -1).astype(q.dtype)
