"""matmul_nbits against float64 numpy and com.microsoft MatMulNBits (accuracy_level 0)."""
from __future__ import annotations

import numpy as np
import pytest

from onnxforge.kernels_cy.matmul._matmul_nbits import matmul_nbits
from onnxforge.kernels_cy.errors import KernelDtypeError, KernelError

from . import reference as ref
from .oracles import run_ort_node


def _weights(rng, N, K, block, zp_kind):
    nblk = -(-K // block)
    codes = rng.integers(0, 16, size=(N, nblk, block))
    b_quant = ref.pack_int4(codes).reshape(N, nblk, block // 2)
    scales = rng.uniform(0.01, 0.1, size=N * nblk).astype(np.float32)
    zp = None
    if zp_kind == "uint8":
        zcodes = rng.integers(0, 16, size=(N, nblk + (nblk % 2)))
        zp = ref.pack_int4(zcodes).reshape(N * ((nblk + 1) // 2))
    elif zp_kind == "float":
        zp = rng.uniform(0, 15, size=N * nblk).astype(np.float32)
    return b_quant, scales, zp


@pytest.mark.parametrize("zp_kind", [None, "uint8", "float"])
@pytest.mark.parametrize("M,K,N,block", [(1, 128, 96, 32), (4, 64, 33, 16), (7, 80, 5, 32),
                                         (3, 100, 8, 64), (0, 32, 4, 32), (2, 32, 0, 32),
                                         (65, 256, 40, 128)])
def test_matches_float64(zp_kind, M, K, N, block):
    rng = np.random.default_rng(M + K + N + block)
    b_quant, scales, zp = _weights(rng, N, K, block, zp_kind)
    a = rng.standard_normal((M, K)).astype(np.float32)
    bias = rng.standard_normal(N).astype(np.float32)
    out = np.full((M, N), np.nan, np.float32)
    matmul_nbits(a, b_quant, scales, zp, K, N, out, block_size=block, bias=bias, num_threads=2)
    w = ref.dequant_int4(b_quant, scales, zp, K, block)
    np.testing.assert_allclose(out, a.astype(np.float64) @ w.T + bias, atol=2e-5, rtol=1e-5)
    # 2-D scales and zero points are accepted too
    nblk = -(-K // block)
    zp2 = None if zp is None else zp.reshape(N, nblk if zp.dtype == np.float32 else (nblk + 1) // 2)
    out2 = np.empty_like(out)
    matmul_nbits(a, b_quant, scales.reshape(N, nblk), zp2, K, N, out2, block_size=block, bias=bias)
    np.testing.assert_array_equal(out2, out)


@pytest.mark.parametrize("zp_kind", [None, "uint8"])
@pytest.mark.parametrize("M,K,N,block", [(1, 128, 96, 32), (5, 96, 24, 32), (3, 80, 16, 16)])
def test_matches_onnxruntime_accuracy_level_0(zp_kind, M, K, N, block):
    rng = np.random.default_rng(3)
    b_quant, scales, zp = _weights(rng, N, K, block, zp_kind)
    a = rng.standard_normal((M, K)).astype(np.float32)
    feeds = [("A", a), ("B", b_quant), ("scales", scales), ("zero_points", zp)]
    (expect,) = run_ort_node("MatMulNBits", feeds, 1, K=K, N=N, bits=4, block_size=block,
                             accuracy_level=0)
    out = np.empty((M, N), np.float32)
    matmul_nbits(a, b_quant, scales, zp, K, N, out, block_size=block)
    np.testing.assert_allclose(out, expect, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("case,exc", [
    ("bits", KernelError), ("block", KernelError), ("a_width", KernelError),
    ("b_shape", KernelError), ("b_dtype", KernelDtypeError), ("scales_len", KernelError),
    ("zp_len", KernelError), ("zp_dtype", KernelDtypeError), ("out_shape", KernelError),
    ("a_float16", KernelDtypeError), ("bias_len", KernelError),
])
def test_errors_raise_before_writing(case, exc):
    rng = np.random.default_rng(0)
    M, K, N, block = 2, 64, 8, 32
    b_quant, scales, zp = _weights(rng, N, K, block, "uint8")
    a = rng.standard_normal((M, K)).astype(np.float32)
    out = np.full((M, N), 6.0, np.float32)
    kw: dict = {"block_size": block}
    if case == "bits":
        kw["bits"] = 3
    elif case == "block":
        kw["block_size"] = 24
    elif case == "a_width":
        a = a[:, :60].copy()
    elif case == "b_shape":
        b_quant = b_quant[:, :1].copy()
    elif case == "b_dtype":
        b_quant = b_quant.astype(np.int8)
    elif case == "scales_len":
        scales = scales[:-1].copy()
    elif case == "zp_len":
        zp = zp[:-1].copy()
    elif case == "zp_dtype":
        zp = zp.astype(np.int32)
    elif case == "out_shape":
        out = np.full((M, N + 1), 6.0, np.float32)
    elif case == "a_float16":
        a = a.astype(np.float16)
    elif case == "bias_len":
        kw["bias"] = np.zeros(N + 1, np.float32)
    with pytest.raises(exc, match="matmul_nbits"):
        matmul_nbits(a, b_quant, scales, zp, K, N, out, **kw)
    assert (out == 6.0).all()
