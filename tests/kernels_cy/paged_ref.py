"""numpy reference codecs of the paged KV cache formats, written from the byte layouts
(independent of the Cython kernels): ``encode(fmt, page)`` -> uint8 payload and
``decode(fmt, payload, H, P, D)`` -> float32 [2, H, P, D], plus a float64 attention."""
from __future__ import annotations

import ml_dtypes
import numpy as np

F32 = np.float32
TABLE = np.array([-1.0, -0.25, 0.25, 1.0], F32)
FORMATS = ("float32", "float16", "int8", "int4", "fp8", "int2", "codebook")


def nbytes(fmt: str, h: int, p: int, d: int) -> int:
    nb = d // 32
    return {"float32": 2 * h * p * d * 4, "float16": 2 * h * p * d * 2, "int8": 2 * h * p * (4 + d),
            "int4": 2 * h * p * nb * 18, "fp8": 2 * h * p * (4 + d),
            "int2": h * d * (4 + p // 4) + h * p * nb * 12, "codebook": 2 * h * p * nb * 12}[fmt]


def _pack2(codes: np.ndarray) -> np.ndarray:
    c = codes.astype(np.uint8)
    return (c[..., 0::4] | (c[..., 1::4] << 2) | (c[..., 2::4] << 4) | (c[..., 3::4] << 6)).astype(np.uint8)


def _unpack2(packed: np.ndarray) -> np.ndarray:
    out = np.empty(packed.shape[:-1] + (packed.shape[-1] * 4,), np.uint8)
    for j in range(4):
        out[..., j::4] = (packed >> (2 * j)) & 3
    return out


def _rec(fields: list, count: int, payload: np.ndarray, offset: int = 0) -> np.ndarray:
    dt = np.dtype(fields)
    return np.frombuffer(payload.tobytes(), dtype=dt, count=count, offset=offset)


def _group2(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Asymmetric 2-bit groups along the last axis: (scale f16, min f16, codes)."""
    lo, hi = x.min(-1), x.max(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        s = np.where(hi == lo, F32(0), (hi - lo) / F32(3)).astype(F32)
        sh, mh = s.astype(np.float16), lo.astype(np.float16)
        sf, mf = sh.astype(F32)[..., None], mh.astype(F32)[..., None]
        codes = np.where(sf == 0, 0, np.clip(np.rint((x - mf) / sf), 0, 3))
    return sh, mh, codes.astype(np.uint8)


def encode(fmt: str, page: np.ndarray) -> np.ndarray:
    """Payload of ``page`` float32 [2, H, P, D] in format ``fmt``."""
    x = np.ascontiguousarray(page, F32)
    _, h, p, d = x.shape
    nb = d // 32
    rows = x.reshape(-1, d)
    if fmt == "float32":
        return np.frombuffer(x.astype("<f4").tobytes(), np.uint8).copy()
    if fmt == "float16":
        return np.frombuffer(x.astype("<f2").tobytes(), np.uint8).copy()
    if fmt in ("int8", "fp8"):
        amax = np.abs(rows).max(-1)
        scale = (amax / F32(127 if fmt == "int8" else 448)).astype(F32)
        rec = np.zeros(rows.shape[0], [("s", "<f4"), ("c", "u1", (d,))])
        rec["s"] = scale
        with np.errstate(divide="ignore", invalid="ignore"):
            y = rows / scale[:, None]
        live = scale != 0
        if fmt == "int8":
            codes = np.where(live[:, None], np.clip(np.rint(y), -127, 127), 0).astype(np.int8)
            rec["c"] = codes.view(np.uint8)
        else:
            y = np.where(live[:, None], np.clip(y, -448, 448), 0).astype(F32)
            rec["c"] = y.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
        return np.frombuffer(rec.tobytes(), np.uint8).copy()
    blocks = rows.reshape(-1, nb, 32)
    if fmt == "int4":
        idx = np.argmax(np.abs(blocks), -1)
        m = np.take_along_axis(blocks, idx[..., None], -1)[..., 0]
        dd = (m / F32(-8)).astype(F32)
        with np.errstate(divide="ignore"):
            inv = np.where(dd == 0, F32(0), F32(1) / dd).astype(F32)
        codes = np.clip(np.rint(blocks * inv[..., None]) + 8, 0, 15).astype(np.uint8)
        rec = np.zeros(blocks.shape[:2], [("s", "<f2"), ("c", "u1", (16,))])
        rec["s"] = dd.astype(np.float16)
        rec["c"] = codes[..., 0::2] | (codes[..., 1::2] << 4)
        return np.frombuffer(rec.tobytes(), np.uint8).copy()
    if fmt == "codebook":
        amax = np.abs(blocks).max(-1)
        with np.errstate(divide="ignore", invalid="ignore"):
            y = blocks / amax[..., None]
        codes = np.argmin(np.abs(y[..., None] - TABLE), -1)
        codes = np.where(amax[..., None] == 0, 0, codes)
        rec = np.zeros(blocks.shape[:2], [("c", "u1", (8,)), ("s", "<f4")])
        rec["c"] = _pack2(codes)
        rec["s"] = amax
        return np.frombuffer(rec.tobytes(), np.uint8).copy()
    if fmt == "int2":
        kch = np.ascontiguousarray(x[0].transpose(0, 2, 1)).reshape(h * d, p)  # channel (h, d) over P
        ks, km, kc = _group2(kch)
        krec = np.zeros(h * d, [("s", "<f2"), ("m", "<f2"), ("c", "u1", (p // 4,))])
        krec["s"], krec["m"], krec["c"] = ks, km, _pack2(kc)
        vblocks = x[1].reshape(h * p, nb, 32)
        vs, vm, vc = _group2(vblocks)
        vrec = np.zeros((h * p, nb), [("s", "<f2"), ("m", "<f2"), ("c", "u1", (8,))])
        vrec["s"], vrec["m"], vrec["c"] = vs, vm, _pack2(vc)
        return np.frombuffer(krec.tobytes() + vrec.tobytes(), np.uint8).copy()
    raise ValueError(fmt)


def decode(fmt: str, payload: np.ndarray, h: int, p: int, d: int) -> np.ndarray:
    """float32 [2, H, P, D] of a payload."""
    payload = np.asarray(payload, np.uint8)
    assert payload.size == nbytes(fmt, h, p, d)
    nb = d // 32
    n = 2 * h * p
    if fmt == "float32":
        return _rec("<f4", n * d, payload).astype(F32).reshape(2, h, p, d)
    if fmt == "float16":
        return _rec("<f2", n * d, payload).astype(F32).reshape(2, h, p, d)
    if fmt in ("int8", "fp8"):
        rec = _rec([("s", "<f4"), ("c", "u1", (d,))], n, payload)
        s = rec["s"].astype(F32)[:, None]
        if fmt == "int8":
            c = rec["c"].view(np.int8).astype(F32)
        else:
            c = rec["c"].copy().view(ml_dtypes.float8_e4m3fn).astype(F32)
        return (s * c).astype(F32).reshape(2, h, p, d)
    if fmt == "int4":
        rec = _rec([("s", "<f2"), ("c", "u1", (16,))], n * nb, payload)
        c = np.empty((n * nb, 32), np.uint8)
        c[:, 0::2], c[:, 1::2] = rec["c"] & 15, rec["c"] >> 4
        return (rec["s"].astype(F32)[:, None] * (c.astype(F32) - F32(8))).astype(F32).reshape(2, h, p, d)
    if fmt == "codebook":
        rec = _rec([("c", "u1", (8,)), ("s", "<f4")], n * nb, payload)
        return (rec["s"].astype(F32)[:, None] * TABLE[_unpack2(rec["c"])]).astype(F32).reshape(2, h, p, d)
    if fmt == "int2":
        krec = _rec([("s", "<f2"), ("m", "<f2"), ("c", "u1", (p // 4,))], h * d, payload)
        kv = krec["m"].astype(F32)[:, None] + krec["s"].astype(F32)[:, None] * _unpack2(krec["c"]).astype(F32)
        keys = kv.reshape(h, d, p).transpose(0, 2, 1)
        off = h * d * (4 + p // 4)
        vrec = _rec([("s", "<f2"), ("m", "<f2"), ("c", "u1", (8,))], h * p * nb, payload, off)
        vv = vrec["m"].astype(F32)[:, None] + vrec["s"].astype(F32)[:, None] * _unpack2(vrec["c"]).astype(F32)
        return np.stack([keys, vv.reshape(h, p, d)]).astype(F32)
    raise ValueError(fmt)


def dense(cache) -> tuple[np.ndarray, np.ndarray]:
    """K, V float32 [H, length, D] of a PagedKVCache decoded page by page with this module."""
    h, p, d = cache.kv_heads, cache.page_size, cache.head_dim
    n = -(-cache.length // p)
    pages = [decode(cache.page_format(i), cache.page_payload(i), h, p, d) for i in range(n)]
    full = np.concatenate(pages, axis=2)[:, :, :cache.length]
    return full[0], full[1]


def pages(cache) -> list:
    """``(format, payload copy)`` of every page of a PagedKVCache (None for a missing one)."""
    return [None if f is None else (f, cache.page_payload(i).copy()) for i, f in enumerate(cache.page_formats())]


def dense_as_seen(before: list, cache, position: int) -> tuple[np.ndarray, np.ndarray]:
    """K, V [H, length, D] as a step that wrote from ``position`` read them: the pages
    below the one holding ``position`` as they were before the step (``before``, from
    :func:`pages`; a page aging in that step converts only when it commits) and the
    pages the step wrote as the cache holds them now."""
    h, p, d = cache.kv_heads, cache.page_size, cache.head_dim
    first = position // p
    n = -(-cache.length // p)
    out = []
    for i in range(n):
        fmt, payload = before[i] if i < first else (cache.page_format(i), cache.page_payload(i))
        out.append(decode(fmt, payload, h, p, d))
    full = np.concatenate(out, axis=2)[:, :, :cache.length]
    return full[0], full[1]


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float | None = None) -> np.ndarray:
    """float64 causal grouped-query attention: q [1, Hq, S, D], k/v [Hkv, T, D] -> [1, Hq, S, D]."""
    _, hq, s, d = q.shape
    hkv, t = k.shape[0], k.shape[1]
    g = hq // hkv
    qq = q[0].astype(np.float64).reshape(hkv, g, s, d)
    sc = np.einsum("hgsd,htd->hgst", qq, k.astype(np.float64))
    sc *= (1.0 / np.sqrt(d)) if scale is None else scale
    pos = t - s + np.arange(s)
    sc = np.where(np.arange(t)[None, :] <= pos[:, None], sc, -np.inf)
    sc -= sc.max(-1, keepdims=True)
    e = np.exp(sc)
    e /= e.sum(-1, keepdims=True)
    return np.einsum("hgst,htd->hgsd", e, v.astype(np.float64)).reshape(1, hq, s, d)
