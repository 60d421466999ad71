"""Products: MatMul / Gemm (BLAS through numpy, no copies; one float32 row through the
pool's streaming product) and com.microsoft MatMulNBits (2/4/8-bit block-quantized B)."""
from __future__ import annotations

import ml_dtypes
import numpy as np

from onnxforge.kernels_cy.ops import fast
from onnxforge.kernels_cy.ops.base import Kernel, NodeSpec, register
from onnxforge.kernels_cy.runtime.threads import BLAS

F32 = np.dtype(np.float32)
_WIDENED = frozenset(np.dtype(t) for t in (ml_dtypes.bfloat16,))

__all__: list[str] = []


@register("", "MatMul")
class MatMul(Kernel):
    """One float32 row times a matrix: the pool's streaming product (``_gemv.OneRowMatMul``,
    installed as ``run``); otherwise numpy's matmul (BLAS, no copy of C- or F-ordered
    operands), a small product running BLAS on one thread (``threads.BLAS``)."""

    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        if fast.OneRowMatMul is not None:  # the compiled call, falling back to BLAS below
            self.run = fast.OneRowMatMul(spec.threads, self._blas)  # type: ignore[method-assign]

    def run(self, a, b):
        return self._blas(a, b)

    def _blas(self, a, b):
        if a.ndim == 0 or b.ndim == 0:
            raise self.error(f"MatMul operands must have rank >= 1, got shapes {list(a.shape)} and {list(b.shape)}")
        BLAS.for_work(a.size * b.shape[-1], b.nbytes)
        if a.dtype in _WIDENED:  # bfloat16: products and sums in float32, rounded once
            return np.matmul(a.astype(F32), b.astype(F32)).astype(a.dtype)
        return np.matmul(a, b)


@register("", "Gemm")
class Gemm(Kernel):
    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.alpha = spec.float("alpha", 1.0)
        self.beta = spec.float("beta", 1.0)
        self.ta = spec.int("transA", 0)
        self.tb = spec.int("transB", 0)

    def run(self, a, b, c=None):
        if a.ndim != 2 or b.ndim != 2:
            raise self.error(f"Gemm operands must be matrices, got shapes {list(a.shape)} and {list(b.shape)}")
        dtype = a.dtype
        if dtype in _WIDENED:  # bfloat16: computed in float32, rounded once at the end
            a, b = a.astype(F32), b.astype(F32)
            c = None if c is None else c.astype(F32)
        a = a.T if self.ta else a
        b = b.T if self.tb else b
        BLAS.for_work(a.size * b.shape[-1], b.nbytes)
        y = np.matmul(a, b)
        if self.alpha != 1.0:
            y *= y.dtype.type(self.alpha)
        if c is not None and self.beta == 0.0:  # C is not read (as BLAS and onnxruntime do): no 0 * inf
            try:
                np.broadcast_shapes(c.shape, y.shape)
            except ValueError:
                raise self.error(f"C of shape {list(c.shape)} does not broadcast to {list(y.shape)}") from None
        elif c is not None:
            y += (c * c.dtype.type(self.beta)) if self.beta != 1.0 else c
        return y.astype(dtype, copy=False)



@register("com.microsoft", "MatMulNBits")
class MatMulNBits(Kernel):
    """A [.., K] x dequantized B^T [K, N]: bits 2/4/8, block-wise scales, optional
    zero points (packed uint8 or scale-typed), optional bias. A constant B is
    dequantized once at plan time into a [K, N] float matrix."""

    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.k = spec.int("K")
        self.n = spec.int("N")
        self.bits = spec.int("bits", 4)
        self.bs = spec.int("block_size")
        if self.bits not in (2, 4, 8):
            raise spec.fail(f"bits={self.bits} is not supported (2, 4, 8)")
        if self.bs < 16 or self.bs & (self.bs - 1):
            raise spec.fail(f"block_size={self.bs} must be a power of two >= 16")
        if spec.has_input(4):
            raise spec.fail("g_idx is not supported")
        self.weight = None
        self.use_fast = fast.matmul_nbits is not None and self.bits == 4
        self.threads_for = spec.threads_for
        consts = [spec.const(i) for i in range(min(spec.n_inputs, 4))]
        if self.use_fast and fast.OneRowNBits is not None:  # the compiled call for a decode row
            self.run = fast.OneRowNBits(self.k, self.n, self.bs, spec.threads_for(self.k * self.n) or 1,  # type: ignore[method-assign]
                                        self._run)
        if not self.use_fast and all(consts[i] is not None for i in (1, 2)) and \
                (not spec.has_input(3) or consts[3] is not None):
            self.weight = self._dequantize(consts[1], consts[2], consts[3] if spec.has_input(3) else None)

    def _dequantize(self, b, scales, zp):
        nblk = -(-self.k // self.bs)
        raw = np.asarray(b, dtype=np.uint8).reshape(self.n, nblk, -1)
        per = 8 // self.bits
        mask = (1 << self.bits) - 1
        codes = np.empty((self.n, nblk, raw.shape[2] * per), dtype=np.uint8)
        for j in range(per):
            codes[:, :, j::per] = (raw >> (j * self.bits)) & mask
        codes = codes[:, :, :self.bs].astype(np.float32)
        sc = np.asarray(scales).reshape(self.n, nblk).astype(np.float32)
        if zp is None:
            z = np.float32(1 << (self.bits - 1))
            zz = np.full((self.n, nblk), z, dtype=np.float32)
        elif zp.dtype == np.uint8:
            zr = zp.reshape(self.n, -1)
            zc = np.empty((self.n, zr.shape[1] * per), dtype=np.uint8)
            for j in range(per):
                zc[:, j::per] = (zr >> (j * self.bits)) & mask
            zz = zc[:, :nblk].astype(np.float32)
        else:
            zz = None
            zf = np.asarray(zp, dtype=np.float32).reshape(self.n, nblk)
        if zz is None:  # zero points of the scales' type
            zz = zf
        w = (codes - zz[:, :, None]) * sc[:, :, None]
        w = w.reshape(self.n, nblk * self.bs)[:, :self.k]
        return np.ascontiguousarray(w.T.astype(np.asarray(scales).dtype))  # [K, N]

    def run(self, a, b, scales, zp=None, g_idx=None, bias=None):
        return self._run(a, b, scales, zp, g_idx, bias)

    def _run(self, a, b, scales, zp=None, g_idx=None, bias=None):
        if (self.use_fast and a.dtype == F32 and scales.dtype == F32 and b.flags.c_contiguous
                and scales.flags.c_contiguous and (zp is None or zp.dtype in (np.uint8, F32))):
            a2 = np.ascontiguousarray(a.reshape(-1, self.k))
            out = np.empty(a.shape[:-1] + (self.n,), dtype=F32)
            fast.matmul_nbits(a2, b, scales, zp, self.k, self.n, out.reshape(-1, self.n),
                              bits=4, block_size=self.bs, bias=bias,
                              num_threads=self.threads_for(a2.shape[0] * self.k * self.n))
            return out
        w = self.weight if self.weight is not None else self._dequantize(b, scales, zp)
        y = np.matmul(a, w)
        if bias is not None:
            y += bias
        return y
