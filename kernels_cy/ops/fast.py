"""The compiled hot kernels (``kernels_cy/_*.pyx``), or None where a module is not built.

Kernel objects call these for float32 C-contiguous operands and keep a numpy path
for every other case, so the backend works (slower) without the extensions.
"""
from __future__ import annotations

from importlib import import_module
from typing import Any

__all__ = ["cython_kernel"]


def cython_kernel(module: str, name: str) -> Any:
    """``onnxforge.kernels_cy.<module>.<name>``, or None when the extension is missing."""
    try:
        return getattr(import_module(f"onnxforge.kernels_cy.{module}"), name)
    except (ImportError, AttributeError):
        return None


rms_norm = cython_kernel("norm._norm", "rms_norm")
skip_rms_norm = cython_kernel("norm._norm", "skip_rms_norm")
# compiled kernel calls (a kernel object installs one as its ``run``, falling back to its method)
RowNorm = cython_kernel("norm._norm", "RowNorm")
SkipRowNorm = cython_kernel("norm._norm", "SkipRowNorm")
ReshapeCall = cython_kernel("ops._views", "ReshapeCall")
SplitCall = cython_kernel("ops._views", "SplitCall")
rotary = cython_kernel("attention._rotary", "rotary")
RotaryCall = cython_kernel("attention._rotary", "RotaryCall")
gqa_attention = cython_kernel("attention._attention", "gqa_attention")
GqaOneToken = cython_kernel("attention._attention", "GqaOneToken")
AttentionOneQuery = cython_kernel("attention._attention", "AttentionOneQuery")
matmul_nbits = cython_kernel("matmul._matmul_nbits", "matmul_nbits")
OneRowNBits = cython_kernel("matmul._matmul_nbits", "OneRowNBits")
softmax = cython_kernel("ops._softmax", "softmax")
sigmoid = cython_kernel("ops._softmax", "sigmoid")
erf_flat = cython_kernel("ops._erf", "erf_flat")
gelu_flat = cython_kernel("ops._erf", "gelu_flat")
cache_update = cython_kernel("cache._cache", "cache_update")
OneRowMatMul = cython_kernel("matmul._gemv", "OneRowMatMul")
OneRowSwiGLU = cython_kernel("matmul._gemv", "OneRowSwiGLU")
swiglu_gate = cython_kernel("matmul._gemv", "swiglu_gate")
# the shared worker pool: a session marks its runs so the workers spin only during one
pool_run_begins = cython_kernel("runtime._pool", "run_begins")
pool_run_ends = cython_kernel("runtime._pool", "run_ends")
