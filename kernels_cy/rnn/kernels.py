"""ONNX ``LSTM`` (opsets 7, 14, 22): forward, reverse and bidirectional, ``sequence_lens``,
initial states, peepholes, ``clip``, ``input_forget``, ``layout`` and every activation the
operator lists.

The input projection of all time steps is one BLAS product per direction; each step then
adds ``H[t-1] @ R^T`` (one product of [batch, hidden] by [hidden, 4 * hidden]) and applies
the gates in numpy (gate order i, o, f, c as in the specification). float16 and bfloat16
are computed in float32 and rounded once; float64 in float64. A batch entry whose
``sequence_lens`` ends early stops there: its later rows of ``Y`` are zeros and ``Y_h`` /
``Y_c`` hold its last valid step (a reverse direction starts from its own last valid row).
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from onnxforge.kernels_cy.ops.base import Kernel, NodeSpec, register

__all__ = ["LSTM"]

F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)
Act = Callable[[np.ndarray], np.ndarray]


def _sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


def _activation(name: str, alpha: float | None, beta: float | None) -> Act:
    """The named activation (the operator's list; ``alpha`` / ``beta`` where it takes them)."""
    n = name.lower()
    if n == "sigmoid":
        return _sigmoid
    if n == "tanh":
        return np.tanh
    if n == "relu":
        return lambda x: np.maximum(x, 0)
    if n == "hardsigmoid":
        a, b = 0.2 if alpha is None else alpha, 0.5 if beta is None else beta
        return lambda x: np.clip(a * x + b, 0, 1)
    if n == "leakyrelu":
        a = 0.01 if alpha is None else alpha
        return lambda x: np.where(x >= 0, x, a * x)
    if n == "thresholdedrelu":
        a = 1.0 if alpha is None else alpha
        return lambda x: np.where(x > a, x, 0)
    if n == "scaledtanh":
        a, b = 1.0 if alpha is None else alpha, 1.0 if beta is None else beta
        return lambda x: a * np.tanh(b * x)
    if n == "affine":
        a, b = 1.0 if alpha is None else alpha, 0.0 if beta is None else beta
        return lambda x: a * x + b
    if n == "elu":
        a = 1.0 if alpha is None else alpha
        return lambda x: np.where(x >= 0, x, a * np.expm1(np.minimum(x, 0)))
    if n == "softsign":
        return lambda x: x / (1 + np.abs(x))
    if n == "softplus":
        return lambda x: np.logaddexp(x, 0)
    raise KeyError(name)


def _clipped(x: np.ndarray, clip: float | None) -> np.ndarray:
    return x if clip is None else np.clip(x, -clip, clip)


_TAKES_ALPHA = {"hardsigmoid", "leakyrelu", "thresholdedrelu", "scaledtanh", "affine", "elu"}
_TAKES_BETA = {"hardsigmoid", "scaledtanh", "affine"}


@register("", "LSTM")
class LSTM(Kernel):
    """(X, W, R, B?, sequence_lens?, initial_h?, initial_c?, P?) -> (Y?, Y_h?, Y_c?)."""

    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.direction = spec.choice("direction", "forward", {"forward", "reverse", "bidirectional"})
        self.dirs = 2 if self.direction == "bidirectional" else 1
        self.hidden = spec.int("hidden_size", 0)
        self.clip = spec.attrs.get("clip")
        self.input_forget = spec.int("input_forget", 0)
        self.layout = spec.choice("layout", 0, {0, 1})
        names = spec.attrs.get("activations")
        if names is None:
            names = ["Sigmoid", "Tanh", "Tanh"] * self.dirs
        names = [n.decode() if isinstance(n, bytes) else str(n) for n in names]
        if len(names) != 3 * self.dirs:
            raise spec.fail(f"activations lists {len(names)} functions; {self.direction} needs {3 * self.dirs}")
        alphas = list(spec.attrs.get("activation_alpha") or [])
        betas = list(spec.attrs.get("activation_beta") or [])
        self.acts: list[Act] = []
        for n in names:
            a = alphas.pop(0) if n.lower() in _TAKES_ALPHA and alphas else None
            b = betas.pop(0) if n.lower() in _TAKES_BETA and betas else None
            try:
                self.acts.append(_activation(n, a, b))
            except KeyError:
                raise spec.fail(f"activation {n!r} is not one the operator lists") from None

    def run(self, x, w, r, b=None, seq_lens=None, h0=None, c0=None, p=None):
        dtype = x.dtype
        ct = F64 if dtype == F64 else F32
        if dtype not in (F32, F64) and dtype.kind != "f" and dtype.name != "bfloat16":
            raise self.error(f"LSTM takes float tensors, got {dtype}")
        xs = x.astype(ct, copy=False)
        if xs.ndim != 3:
            raise self.error(f"X must have rank 3, got {list(x.shape)}")
        if self.layout == 1:
            xs = xs.transpose(1, 0, 2)
        seq, batch, _ = xs.shape
        dirs = self.dirs
        hid = self.hidden or (r.shape[-1] if r.ndim == 3 else 0)
        if w.ndim != 3 or w.shape[0] != dirs or w.shape[1] != 4 * hid or w.shape[2] != xs.shape[2]:
            raise self.error(f"W has shape {list(w.shape)}, expected [{dirs}, {4 * hid}, {xs.shape[2]}]")
        if r.ndim != 3 or r.shape != (dirs, 4 * hid, hid):
            raise self.error(f"R has shape {list(r.shape)}, expected [{dirs}, {4 * hid}, {hid}]")
        lens = np.full(batch, seq, np.int64) if seq_lens is None else np.asarray(seq_lens).astype(np.int64)
        if lens.shape != (batch,) or np.any(lens < 0) or np.any(lens > seq):
            raise self.error(f"sequence_lens {lens.tolist()} must give one length in [0, {seq}] per batch entry")

        def state(v, what):
            if v is None:
                return np.zeros((dirs, batch, hid), ct)
            a = v.astype(ct, copy=False)
            a = a.transpose(1, 0, 2) if self.layout == 1 else a
            if a.shape != (dirs, batch, hid):
                raise self.error(f"{what} has shape {list(v.shape)}, expected [{dirs}, {batch}, {hid}]"
                                 f"{' (layout 1: batch first)' if self.layout else ''}")
            return a

        hs, cs = state(h0, "initial_h"), state(c0, "initial_c")
        y = np.zeros((seq, dirs, batch, hid), ct)
        yh = np.empty((dirs, batch, hid), ct)
        yc = np.empty((dirs, batch, hid), ct)
        for d in range(dirs):
            self._direction(d, xs, w[d].astype(ct, copy=False), r[d].astype(ct, copy=False),
                            None if b is None else b[d].astype(ct, copy=False),
                            None if p is None else p[d].astype(ct, copy=False),
                            lens, hs[d].copy(), cs[d].copy(), y[:, d], yh, yc, d)
        if self.layout == 1:
            y, yh, yc = y.transpose(2, 0, 1, 3), yh.transpose(1, 0, 2), yc.transpose(1, 0, 2)
        return tuple(np.ascontiguousarray(v).astype(dtype, copy=False) for v in (y, yh, yc))

    def _direction(self, d: int, xs: np.ndarray, w: np.ndarray, r: np.ndarray, b: np.ndarray | None,
                   p: np.ndarray | None, lens: np.ndarray, h: np.ndarray, c: np.ndarray, y: np.ndarray,
                   yh: np.ndarray, yc: np.ndarray, slot: int) -> None:
        seq, batch, _ = xs.shape
        hid = r.shape[1]
        f, g, hact = self.acts[3 * d:3 * d + 3]
        reverse = self.direction == "reverse" or d == 1
        # rows of each batch entry in the order this direction reads them (reverse: from its last
        # valid row back), the projection of every input row at once
        proj = xs.reshape(seq * batch, -1) @ w.T
        if b is not None:
            proj += b[:4 * hid] + b[4 * hid:]
        proj = proj.reshape(seq, batch, 4 * hid)
        pi, po, pf = (np.zeros(hid, w.dtype),) * 3 if p is None else (p[:hid], p[hid:2 * hid], p[2 * hid:])
        clip = self.clip
        for t in range(seq):
            live = lens > t
            if not live.any():
                break
            if reverse:
                rows = np.clip(lens - 1 - t, 0, None)
                gates = proj[rows, np.arange(batch)] + h @ r.T
            else:
                gates = proj[t] + h @ r.T
            gi, go, gf, gc = (gates[:, k * hid:(k + 1) * hid] for k in range(4))
            # each gate's argument (peephole included) is clipped, then activated
            i = f(_clipped(gi + pi * c, clip))
            fg = 1 - i if self.input_forget else f(_clipped(gf + pf * c, clip))
            cn = fg * c + i * g(_clipped(gc, clip))
            o = f(_clipped(go + po * cn, clip))
            hn = o * hact(cn)
            c = np.where(live[:, None], cn, c)
            h = np.where(live[:, None], hn, h)
            if reverse:
                y[rows[live], np.flatnonzero(live)] = hn[live]
            else:
                y[t, live] = hn[live]
        yh[slot], yc[slot] = h, c
