"""The window generators HannWindow, HammingWindow and BlackmanWindow: ``size`` samples of a
raised-cosine window, periodic (period ``size``) or symmetric (period ``size - 1``),
computed in float64 and rounded once to ``output_datatype``."""
from __future__ import annotations

import math

import numpy as np

from onnxforge.kernels_cy.ops.base import Kernel, NodeSpec, register
from onnxforge.proto_ext.dtypes import np_dtype
from onnxforge.proto_ext.errors import CodecError

__all__ = ["window"]

_HAMMING_ALPHA = 25.0 / 46.0


def window(kind: str, size: int, periodic: bool) -> np.ndarray:
    """float64 samples of the ``kind`` window ("Hann", "Hamming" or "Blackman")."""
    n = np.arange(size, dtype=np.float64)
    period = size if periodic else size - 1
    with np.errstate(divide="ignore", invalid="ignore"):
        phase = n * (2.0 * math.pi) / period
    if kind == "Hann":
        return 0.5 - 0.5 * np.cos(phase)
    if kind == "Hamming":
        return _HAMMING_ALPHA - (1.0 - _HAMMING_ALPHA) * np.cos(phase)
    return 0.42 - 0.5 * np.cos(phase) + 0.08 * np.cos(2.0 * phase)


@register("", "HannWindow", "HammingWindow", "BlackmanWindow")
class Window(Kernel):
    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.kind = spec.op_type[: -len("Window")]
        self.periodic = bool(spec.int("periodic", 1))
        to = spec.int("output_datatype", 1)
        try:
            self.dtype = np_dtype(to)
        except CodecError:
            raise spec.fail(f"attribute output_datatype={to} names no supported element type") from None

    def run(self, size):
        if size.size != 1 or size.dtype.kind not in "iu":
            raise self.error(f"size must be one integer, got {size.dtype} of shape {size.shape}")
        n = int(size.reshape(-1)[0])
        if n < 0:
            raise self.error(f"size must not be negative, got {n}")
        return window(self.kind, n, self.periodic).astype(self.dtype)
