"""The portable vector code paths give the same results as the AVX2+FMA ones."""
from __future__ import annotations

import numpy as np
import pytest

from onnxforge.kernels_cy.attention import _attention
from onnxforge.kernels_cy.matmul import _matmul_nbits
from onnxforge.kernels_cy.norm import _norm
from onnxforge.kernels_cy.ops import _softmax

from . import reference as ref

MODULES = [_attention, _matmul_nbits, _norm, _softmax]


@pytest.fixture(params=["best", "baseline"])
def simd(request):
    for m in MODULES:
        m._force_baseline_simd(request.param == "baseline")
    yield request.param
    for m in MODULES:
        m._force_baseline_simd(False)


def test_kernels_on_both_paths(simd):
    rng = np.random.default_rng(4)
    q = rng.standard_normal((2, 3, 4, 40)).astype(np.float32)
    kc = rng.standard_normal((2, 2, 150, 40)).astype(np.float32)
    vc = rng.standard_normal((2, 2, 150, 40)).astype(np.float32)
    total = np.array([150, 77])
    out = np.empty_like(q)
    _attention.gqa_attention(q, kc, vc, total, out, num_threads=2)
    np.testing.assert_allclose(out, ref.attention(q, kc, vc, total), atol=2e-6)

    N, K, blk = 24, 96, 32
    codes = rng.integers(0, 16, size=(N, K // blk, blk))
    bq = ref.pack_int4(codes)
    sc = rng.uniform(0.01, 0.1, N * (K // blk)).astype(np.float32)
    a = rng.standard_normal((6, K)).astype(np.float32)
    mo = np.empty((6, N), np.float32)
    _matmul_nbits.matmul_nbits(a, bq, sc, None, K, N, mo, num_threads=2)
    np.testing.assert_allclose(mo, a.astype(np.float64) @ ref.dequant_int4(bq, sc, None, K, blk).T,
                               atol=2e-5)

    x = (rng.standard_normal((5, 37)) * 5).astype(np.float32)
    so = np.empty_like(x)
    _softmax.softmax(x, so)
    np.testing.assert_allclose(so, ref.softmax(x), atol=1e-7, rtol=2e-6)
    w = rng.standard_normal(37).astype(np.float32)
    _norm.rms_norm(x, w, 1e-6, so)
    np.testing.assert_allclose(so, ref.rms_norm(x, w, 1e-6), atol=1e-5, rtol=1e-5)
