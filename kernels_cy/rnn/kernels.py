"""ONNX ``RNN``, ``GRU`` and ``LSTM`` (opsets 7, 14, 22): forward, reverse and
bidirectional, ``sequence_lens``, initial states, ``clip``, ``layout`` and every activation
the operators list; LSTM's peepholes and ``input_forget``, GRU's ``linear_before_reset``.

The input projection of all time steps is one BLAS product per direction; each step then
adds ``H[t-1] @ R^T`` and applies the gates in numpy (gate orders as in the specification:
z, r, h for GRU; i, o, f, c for LSTM). float16 and bfloat16
are computed in float32 and rounded once; float64 in float64. A batch entry whose
``sequence_lens`` ends early stops there: its later rows of ``Y`` are zeros and ``Y_h`` /
``Y_c`` hold its last valid step (a reverse direction starts from its own last valid row).
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from onnxforge.kernels_cy.ops.base import Kernel, NodeSpec, register

__all__ = ["GRU", "LSTM", "RNN"]

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


class _Recurrent(Kernel):
    """The loop every recurrent layer shares (directions, sequence_lens, layout, initial states);
    a subclass gives its gate count, default activations and one step's cell."""

    GATES = 1
    DEFAULT_ACTS: tuple[str, ...] = ("Tanh",)
    STATES = 1  # 2 for LSTM (h and c)

    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.op = spec.op_type
        self.direction = spec.choice("direction", "forward", {"forward", "reverse", "bidirectional"})
        self.dirs = 2 if self.direction == "bidirectional" else 1
        self.hidden = spec.int("hidden_size", 0)
        self.clip = spec.attrs.get("clip")
        self.layout = spec.choice("layout", 0, {0, 1})
        k = len(self.DEFAULT_ACTS)
        names = spec.attrs.get("activations")
        if names is None:
            names = list(self.DEFAULT_ACTS) * self.dirs
        names = [n.decode() if isinstance(n, bytes) else str(n) for n in names]
        if len(names) != k * self.dirs:
            raise spec.fail(f"activations lists {len(names)} functions; {self.direction} needs {k * self.dirs}")
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
        if dtype.kind != "f" and dtype.name != "bfloat16":
            raise self.error(f"{self.op} takes float tensors, got {dtype}")
        ct = F64 if dtype == F64 else F32
        xs = x.astype(ct, copy=False)
        if xs.ndim != 3:
            raise self.error(f"X must have rank 3, got {list(x.shape)}")
        if self.layout == 1:
            xs = xs.transpose(1, 0, 2)
        seq, batch, _ = xs.shape
        dirs, g = self.dirs, self.GATES
        hid = self.hidden or (r.shape[-1] if r.ndim == 3 else 0)
        if w.ndim != 3 or w.shape != (dirs, g * hid, xs.shape[2]):
            raise self.error(f"W has shape {list(w.shape)}, expected [{dirs}, {g * hid}, {xs.shape[2]}]")
        if r.ndim != 3 or r.shape != (dirs, g * hid, hid):
            raise self.error(f"R has shape {list(r.shape)}, expected [{dirs}, {g * hid}, {hid}]")
        if b is not None and b.shape != (dirs, 2 * g * hid):
            raise self.error(f"B has shape {list(b.shape)}, expected [{dirs}, {2 * g * hid}]")
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

        hs = state(h0, "initial_h")
        cs = state(c0, "initial_c") if self.STATES == 2 else None
        y = np.zeros((seq, dirs, batch, hid), ct)
        finals = [np.empty((dirs, batch, hid), ct) for _ in range(self.STATES)]
        k = len(self.DEFAULT_ACTS)
        for d in range(dirs):
            reverse = self.direction == "reverse" or d == 1
            proj = xs.reshape(seq * batch, -1) @ w[d].astype(ct, copy=False).T
            bias = None if b is None else b[d].astype(ct, copy=False)
            states = [hs[d].copy()] + ([cs[d].copy()] if cs is not None else [])
            cell = self.cell(r[d].astype(ct, copy=False), bias, None if p is None else p[d].astype(ct, copy=False),
                             self.acts[k * d:k * (d + 1)], hid)
            if bias is not None:
                proj += self.input_bias(bias, hid)
            proj = proj.reshape(seq, batch, g * hid)
            for t in range(seq):
                live = lens > t
                if not live.any():
                    break
                rows = np.clip(lens - 1 - t, 0, None) if reverse else None
                xt = proj[rows, np.arange(batch)] if reverse else proj[t]
                new = cell(xt, *states)
                states = [np.where(live[:, None], n, o) for n, o in zip(new, states)]
                if reverse:
                    y[rows[live], d, np.flatnonzero(live)] = new[0][live]
                else:
                    y[t, d, live] = new[0][live]
            for f, s_ in zip(finals, states):
                f[d] = s_
        outs = [y, *finals]
        if self.layout == 1:
            outs = [outs[0].transpose(2, 0, 1, 3)] + [o.transpose(1, 0, 2) for o in outs[1:]]
        return tuple(np.ascontiguousarray(v).astype(dtype, copy=False) for v in outs)

    def input_bias(self, bias: np.ndarray, hid: int) -> np.ndarray:
        """The bias added to the input projection of every step (Wb + Rb by default)."""
        g = self.GATES
        return bias[:g * hid] + bias[g * hid:]

    def cell(self, r, bias, p, acts, hid):  # pragma: no cover - each operator overrides it
        raise NotImplementedError


@register("", "RNN")
class RNN(_Recurrent):
    """(X, W, R, B?, sequence_lens?, initial_h?) -> (Y?, Y_h?): ``H = f(X W^T + H R^T + Wb + Rb)``."""

    def cell(self, r, bias, p, acts, hid):
        (f,) = acts
        clip = self.clip

        def step(xt, h):
            return (f(_clipped(xt + h @ r.T, clip)),)
        return step


@register("", "GRU")
class GRU(_Recurrent):
    """(X, W, R, B?, sequence_lens?, initial_h?) -> (Y?, Y_h?); gates z, r, h (``linear_before_reset``
    applies the reset gate after the recurrent product and its bias)."""

    GATES = 3
    DEFAULT_ACTS = ("Sigmoid", "Tanh")

    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.linear_before_reset = spec.int("linear_before_reset", 0)

    def input_bias(self, bias, hid):
        # Wb for all three gates; Rb of z and r (the h gate's Rb sits inside the reset product)
        return bias[:3 * hid] + np.concatenate([bias[3 * hid:5 * hid], np.zeros(hid, bias.dtype)])

    def cell(self, r, bias, p, acts, hid):
        f, g = acts
        clip = self.clip
        rz, rr, rh = r[:hid], r[hid:2 * hid], r[2 * hid:]
        rbh = np.zeros(hid, r.dtype) if bias is None else bias[5 * hid:]

        def step(xt, h):
            z = f(_clipped(xt[:, :hid] + h @ rz.T, clip))
            rg = f(_clipped(xt[:, hid:2 * hid] + h @ rr.T, clip))
            if self.linear_before_reset:
                hh = g(_clipped(xt[:, 2 * hid:] + rg * (h @ rh.T + rbh), clip))
            else:
                hh = g(_clipped(xt[:, 2 * hid:] + (rg * h) @ rh.T + rbh, clip))
            return ((1 - z) * hh + z * h,)
        return step


@register("", "LSTM")
class LSTM(_Recurrent):
    """(X, W, R, B?, sequence_lens?, initial_h?, initial_c?, P?) -> (Y?, Y_h?, Y_c?); gates i, o, f, c."""

    GATES = 4
    DEFAULT_ACTS = ("Sigmoid", "Tanh", "Tanh")
    STATES = 2

    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.input_forget = spec.int("input_forget", 0)

    def cell(self, r, bias, p, acts, hid):
        f, g, hact = acts
        clip = self.clip
        zero = np.zeros(hid, r.dtype)
        pi, po, pf = (zero, zero, zero) if p is None else (p[:hid], p[hid:2 * hid], p[2 * hid:])

        def step(xt, h, c):
            gates = xt + h @ r.T
            gi, go, gf, gc = (gates[:, k * hid:(k + 1) * hid] for k in range(4))
            # each gate's argument (peephole included) is clipped, then activated
            i = f(_clipped(gi + pi * c, clip))
            fg = 1 - i if self.input_forget else f(_clipped(gf + pf * c, clip))
            cn = fg * c + i * g(_clipped(gc, clip))
            o = f(_clipped(go + po * cn, clip))
            return o * hact(cn), cn
        return step
