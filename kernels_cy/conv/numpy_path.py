"""Conv and ConvTranspose in numpy, for the dtypes without a compiled path (float64).

One BLAS-batched product per kernel tap over strided views of a padded buffer: exact in
the input's dtype, and simple enough to follow the definition line by line. Shapes are
the 3-D lifted ones of :meth:`~.geometry.Geometry.lift`.
"""
from __future__ import annotations

import itertools

import numpy as np

__all__ = ["conv", "conv_transpose"]


def _taps(kernel: tuple[int, ...]) -> itertools.product:
    return itertools.product(*(range(k) for k in kernel))


def conv(x: np.ndarray, w: np.ndarray, group: int, ins: tuple[int, ...], outs: tuple[int, ...],
         kernel: tuple[int, ...], strides: tuple[int, ...], dilations: tuple[int, ...],
         pads: tuple[int, ...]) -> np.ndarray:
    """``y[n, m, o] = sum_{c, k} w[m, c, k] * x[n, g(m) * Cg + c, o * s - pad + k * d]``;
    x [N, C, *ins] and w [M, C / group, *kernel] lifted to 3-D; returns y [N, M, *outs]."""
    n, c = x.shape[:2]
    m = w.shape[0]
    cg, mg = c // group, m // group
    # a zero buffer holding every position a tap reads: [pad, pad + in) is x
    ext = [max(p + i, (o - 1) * s + (k - 1) * d + 1) for i, o, k, s, d, p
           in zip(ins, outs, kernel, strides, dilations, pads)]
    xp = np.zeros((n, c, *ext), dtype=x.dtype)
    xp[(slice(None), slice(None)) + tuple(slice(p, p + i) for p, i in zip(pads, ins))] = x
    y = np.zeros((n, group, mg, int(np.prod(outs))), dtype=x.dtype)
    wg = w.reshape(group, mg, cg, *kernel)
    for tap in _taps(kernel):
        sl = tuple(slice(t * d, t * d + (o - 1) * s + 1, s) for t, d, o, s in zip(tap, dilations, outs, strides))
        xs = xp[(slice(None), slice(None)) + sl].reshape(n, group, cg, int(np.prod(outs)))
        y += np.matmul(wg[(Ellipsis,) + tap], xs)
    return y.reshape(n, m, *outs)


def conv_transpose(x: np.ndarray, w: np.ndarray, group: int, ins: tuple[int, ...],
                   outs: tuple[int, ...], kernel: tuple[int, ...], strides: tuple[int, ...],
                   dilations: tuple[int, ...], pads: tuple[int, ...]) -> np.ndarray:
    """``y[n, g(c) * Mg + m, i * s - pad + k * d] += w[c, m, k] * x[n, c, i]``; x [N, C, *ins]
    and w [C, M / group, *kernel] lifted to 3-D; returns y [N, M, *outs] (positions outside
    ``[0, outs)`` dropped)."""
    n, c = x.shape[:2]
    mg = w.shape[1]
    cg = c // group
    full = [(i - 1) * s + (k - 1) * d + 1 for i, k, s, d in zip(ins, kernel, strides, dilations)]
    lead = [max(0, -p) for p in pads]  # room before position 0 when the output starts earlier
    ext = [ld + max(f, p + o) for ld, f, p, o in zip(lead, full, pads, outs)]
    yp = np.zeros((n, group, mg, *ext), dtype=x.dtype)
    xg = x.reshape(n, group, cg, int(np.prod(ins)))
    wt = np.swapaxes(w.reshape(group, cg, mg, *kernel), 1, 2)  # [G, Mg, Cg, *kernel]
    for tap in _taps(kernel):
        part = np.matmul(wt[(Ellipsis,) + tap], xg).reshape(n, group, mg, *ins)
        sl = tuple(slice(ld + t * d, ld + t * d + (i - 1) * s + 1, s)
                   for ld, t, d, i, s in zip(lead, tap, dilations, ins, strides))
        yp[(slice(None),) * 3 + sl] += part
    crop = tuple(slice(ld + p, ld + p + o) for ld, p, o in zip(lead, pads, outs))
    return np.ascontiguousarray(yp[(slice(None),) * 3 + crop].reshape(n, group * mg, *outs))
