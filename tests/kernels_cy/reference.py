"""float64 numpy references of the kernels (written from the operator definitions)."""
from __future__ import annotations

import numpy as np


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    x = x.astype(np.float64)
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w.astype(np.float64)


def softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def rotary(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, pos: np.ndarray,
           interleaved: bool) -> np.ndarray:
    """x [B, S, H, D]; cos/sin [P, R/2]; pos [B, S] integer positions."""
    x = x.astype(np.float64)
    half = cos.shape[-1]
    c = cos.astype(np.float64)[pos][:, :, None, :]
    s = sin.astype(np.float64)[pos][:, :, None, :]
    y = x.copy()
    if interleaved:
        a, b = x[..., 0:2 * half:2], x[..., 1:2 * half:2]
        y[..., 0:2 * half:2] = a * c - b * s
        y[..., 1:2 * half:2] = b * c + a * s
    else:
        a, b = x[..., :half], x[..., half:2 * half]
        y[..., :half] = a * c - b * s
        y[..., half:2 * half] = b * c + a * s
    return y


def attention(q: np.ndarray, kc: np.ndarray, vc: np.ndarray, total: np.ndarray,
              start: np.ndarray | None = None, scale: float = 0.0, softcap: float = 0.0,
              window: int = -1) -> np.ndarray:
    """q [B, S, Hq, D]; kc/vc [B, Hkv, L, D]; query i of row b at start[b] + i."""
    B, S, Hq, D = q.shape
    Hkv = kc.shape[1]
    scale = scale or 1.0 / np.sqrt(D)
    out = np.zeros(q.shape, np.float64)
    for b in range(B):
        st = int(total[b]) - S if start is None else int(start[b])
        for i in range(S):
            p = st + i
            hi = min(p + 1, int(total[b]))
            lo = max(0, p + 1 - window) if window > 0 else 0
            if hi <= lo:
                continue
            for h in range(Hq):
                g = h // (Hq // Hkv)
                K = kc[b, g, lo:hi].astype(np.float64)
                V = vc[b, g, lo:hi].astype(np.float64)
                sc = K @ q[b, i, h].astype(np.float64) * scale
                if softcap > 0:
                    sc = softcap * np.tanh(sc / softcap)
                e = np.exp(sc - sc.max())
                out[b, i, h] = (e / e.sum()) @ V
    return out


def dequant_int4(b_quant: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None,
                 K: int, block: int) -> np.ndarray:
    """MatMulNBits weight [N, K] in float64 from its packed codes (low nibble first)."""
    N, nblk, _ = b_quant.shape
    codes = np.empty((N, nblk, block), np.float64)
    codes[..., 0::2] = b_quant & 15
    codes[..., 1::2] = b_quant >> 4
    if zero_points is None:
        zp = np.full((N, nblk), 8.0)
    elif zero_points.dtype == np.uint8:
        zb = zero_points.reshape(N, (nblk + 1) // 2)
        zp = np.stack([zb & 15, zb >> 4], -1).reshape(N, 2 * zb.shape[1])[:, :nblk].astype(np.float64)
    else:
        zp = zero_points.reshape(N, nblk).astype(np.float64)
    w = (codes - zp[..., None]) * scales.reshape(N, nblk, 1).astype(np.float64)
    return w.reshape(N, nblk * block)[:, :K]


def pack_int4(codes: np.ndarray) -> np.ndarray:
    """Pack integer codes in [0, 15] along the last axis, low nibble first."""
    codes = codes.astype(np.uint8)
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)
