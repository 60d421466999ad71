"""Compiled kernel calls (``OneRowMatMul``, ``RowNorm``, ``SkipRowNorm``): the fast branch
against float64 numpy, every other operand handed to the fallback unchanged."""
from __future__ import annotations

import numpy as np
import pytest

from onnxforge.kernels_cy.matmul._gemv import OneRowMatMul
from onnxforge.kernels_cy.norm._norm import RowNorm, SkipRowNorm
from onnxforge.kernels_cy.errors import KernelError


class _Fallback:
    def __init__(self):
        self.calls = 0

    def __call__(self, *args):
        self.calls += 1
        return "fallback"


def _rms64(x, w, eps):
    x = x.astype(np.float64)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


@pytest.mark.parametrize("a_shape", [(300,), (1, 300), (1, 1, 300)])
@pytest.mark.parametrize("threads", [1, 2])
def test_one_row_matmul_fast_branch(a_shape, threads):
    rng = np.random.default_rng(1)
    a = rng.standard_normal(a_shape, dtype=np.float32)
    b = rng.standard_normal((300, 1100), dtype=np.float32)
    fb = _Fallback()
    y = OneRowMatMul(threads, fb)(a, b)
    assert fb.calls == 0 and y.shape == a_shape[:-1] + (1100,) and y.dtype == np.float32
    np.testing.assert_allclose(y, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-4)


def test_one_row_matmul_hands_other_operands_to_the_fallback():
    rng = np.random.default_rng(2)
    b = rng.standard_normal((8, 6), dtype=np.float32)
    cases = [
        (rng.standard_normal((33, 8), dtype=np.float32), b),           # more rows than a few-row product takes
        (rng.standard_normal((1, 8)), b),                               # float64 row
        (rng.standard_normal((1, 8), dtype=np.float32), np.asfortranarray(b)),  # column stride
        (rng.standard_normal((1, 16), dtype=np.float32)[:, ::2], b),    # non-contiguous row
        (rng.standard_normal((1, 8), dtype=np.float32), b[None]),       # 3-D weight
        ([1.0] * 8, b),                                                  # not an array
    ]
    for a, w in cases:
        fb = _Fallback()
        assert OneRowMatMul(2, fb)(a, w) == "fallback" and fb.calls == 1


@pytest.mark.parametrize("shape", [(1, 1, 512), (3, 64), (7,)])
def test_row_norm_matches_float64(shape):
    rng = np.random.default_rng(3)
    x = rng.standard_normal(shape, dtype=np.float32)
    w = rng.standard_normal(shape[-1], dtype=np.float32)
    y = RowNorm(1e-6, _Fallback())(x, w)
    np.testing.assert_allclose(y, _rms64(x, w, 1e-6), rtol=1e-5, atol=1e-5)


def test_row_norm_fallbacks_and_bad_eps():
    x = np.ones((2, 4), np.float32)
    for a, w in [(x.T, np.ones(2, np.float32)), (x, np.ones(3, np.float32)), (x.astype(np.float16), np.ones(4, np.float32)),
                 (x, np.ones((1, 4), np.float32)), (np.ones((2, 0), np.float32), np.ones(0, np.float32))]:
        fb = _Fallback()
        assert RowNorm(1e-5, fb)(a, w) == "fallback" and fb.calls == 1
    with pytest.raises(KernelError, match="eps"):
        RowNorm(-1.0, _Fallback())


@pytest.mark.parametrize("n_out", [1, 4])
@pytest.mark.parametrize("with_bias", [False, True])
def test_skip_row_norm_matches_float64(n_out, with_bias):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 3, 96), dtype=np.float32)
    skip = rng.standard_normal((2, 3, 96), dtype=np.float32)
    g = rng.standard_normal(96, dtype=np.float32)
    bias = rng.standard_normal(96, dtype=np.float32) if with_bias else None
    got = SkipRowNorm(1e-5, n_out, _Fallback())(x, skip, g, bias)
    s = x.astype(np.float64) + skip + (bias if with_bias else 0.0)
    y = got if n_out == 1 else got[0]
    np.testing.assert_allclose(y, _rms64(s, g, 1e-5), rtol=1e-5, atol=1e-5)
    if n_out == 4:
        assert got[1].size == 0 and got[2].size == 0
        np.testing.assert_allclose(got[3], s, rtol=1e-6, atol=1e-6)


def test_skip_row_norm_fallbacks():
    x = np.ones((2, 4), np.float32)
    g = np.ones(4, np.float32)
    for args in [(x, np.ones((1, 4), np.float32), g, None),        # broadcast skip
                 (x, np.ones((2, 4)), g, None),                      # float64 skip
                 (x, x, g, np.ones(3, np.float32)),                  # bias of the wrong length
                 (x, x, g, [0.0] * 4)]:                              # bias not an array
        fb = _Fallback()
        assert SkipRowNorm(1e-5, 1, fb)(*args) == "fallback" and fb.calls == 1
    with pytest.raises(KernelError):
        SkipRowNorm(1e-5, 2, _Fallback())


def test_reshape_call_views_copy_zero_dims_and_fall_back():
    from onnxforge.kernels_cy.ops._views import ReshapeCall

    x = np.arange(2 * 3 * 8, dtype=np.float32).reshape(2, 3, 8)
    fb = _Fallback()
    y = ReshapeCall([0, -1, 4], False, fb)(x)
    assert y.shape == (2, 6, 4) and np.shares_memory(x, y) and fb.calls == 0
    np.testing.assert_array_equal(y, x.reshape(2, 6, 4))
    z = ReshapeCall([0, 48], True, fb)  # allowzero: 0 is a zero-sized dimension
    with pytest.raises(ValueError):
        z(x)
    assert ReshapeCall([0, 0, 0, 0], False, fb)(x) == "fallback"  # a 0 past the input's rank
    assert ReshapeCall([-1], False, fb)(x.transpose(1, 0, 2)) == "fallback"  # not C-contiguous
    assert fb.calls == 2
    with pytest.raises(ValueError):
        ReshapeCall([5, -1], False, fb)(x)  # 48 elements do not split into rows of 5


@pytest.mark.parametrize("shape,axis,sizes", [((1, 1, 1024), -1, [512, 256, 256]), ((2, 5, 3), 1, [1, 0, 4]),
                                               ((6, 4), 0, [2, 4]), ((3, 4, 2), -2, [4]), ((2, 3), 1, [0, 3])])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_, np.float16])
def test_split_call_copies_each_part_like_numpy(shape, axis, sizes, dtype):
    from onnxforge.kernels_cy.ops._views import SplitCall

    x = (np.arange(int(np.prod(shape))) % 7).astype(dtype).reshape(shape)
    fb = _Fallback()
    parts = SplitCall(sizes, axis, fb)(x)
    want = np.split(x, np.cumsum(sizes)[:-1], axis=axis)
    assert fb.calls == 0 and len(parts) == len(sizes)
    for p, w in zip(parts, want):
        assert p.dtype == x.dtype and p.flags.c_contiguous and not np.shares_memory(p, x)
        np.testing.assert_array_equal(p, w)


def test_split_call_hands_other_inputs_to_the_fallback():
    from onnxforge.kernels_cy.ops._views import SplitCall

    fb = _Fallback()
    call = SplitCall([2, 2], 1, fb)
    x = np.zeros((3, 4), np.float32)
    assert call(x.T.copy().T) == "fallback"                       # not C-contiguous
    assert call(np.zeros((3, 5), np.float32)) == "fallback"       # the axis is not the parts' total
    assert call(np.zeros(4, np.float32)) == "fallback"            # no axis 1
    assert call(np.array([["a"] * 4], dtype=object)) == "fallback"
    assert call([[0.0] * 4]) == "fallback"                          # not an array
    assert fb.calls == 5
    with pytest.raises(KernelError):
        SplitCall([2, -1], 0, fb)


def _nbits_operands(rng, K: int, N: int, zp_kind: str | None):
    """Random 4-bit MatMulNBits operands (blocks of 32): packed codes, scales and zero
    points of ``zp_kind`` (None, packed ``"uint8"`` or ``"float"``)."""
    from . import reference as ref

    nblk = K // 32
    b = ref.pack_int4(rng.integers(0, 16, size=(N, nblk, 32)))
    scales = rng.uniform(0.01, 0.1, size=N * nblk).astype(np.float32)
    zp = None
    if zp_kind == "uint8":
        zp = ref.pack_int4(rng.integers(0, 16, size=(N, 2 * ((nblk + 1) // 2)))).reshape(-1)
    elif zp_kind == "float":
        zp = rng.uniform(6, 9, size=N * nblk).astype(np.float32)
    return b, scales, zp


@pytest.mark.parametrize("zp_kind", [None, "uint8", "float"])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("threads", [1, 2])
def test_one_row_nbits_matches_float64(zp_kind, with_bias, threads):
    from onnxforge.kernels_cy.matmul._matmul_nbits import OneRowNBits

    from . import reference as ref

    rng = np.random.default_rng(9)
    K, N = 96, 2050
    b, scales, zp = _nbits_operands(rng, K, N, zp_kind)
    bias = rng.standard_normal(N, dtype=np.float32) if with_bias else None
    a = rng.standard_normal((1, 1, K), dtype=np.float32)
    fb = _Fallback()
    got = OneRowNBits(K, N, 32, threads, fb)(a, b, scales, zp, None, bias)
    assert fb.calls == 0 and got.shape == (1, 1, N)
    want = a.reshape(-1).astype(np.float64) @ ref.dequant_int4(b, scales, zp, K, 32).T
    if with_bias:
        want = want + bias
    np.testing.assert_allclose(got.reshape(-1), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("simd", [0, 2, 1], ids=["best", "avx2", "baseline"])
@pytest.mark.parametrize("zp_kind", [None, "uint8", "float"])
def test_one_row_nbits_zero_terms_of_constant_operands_follow_the_operands(simd, zp_kind):
    # read-only operands (a model's weights) get their scale * zero point terms computed
    # once; other read-only operands, or writable ones, must not reuse them. N = 4k + 3
    # rows exercise the kernels' four-row groups and their remainder on every vector path.
    from onnxforge.kernels_cy.matmul import _matmul_nbits
    from onnxforge.kernels_cy.matmul._matmul_nbits import OneRowNBits

    from . import reference as ref

    rng = np.random.default_rng(17)
    K, N = 160, 43

    def operands(writable: bool):
        b, sc, zp = _nbits_operands(rng, K, N, zp_kind)
        for x in (b, sc, zp):
            if x is not None:
                x.flags.writeable = writable
        return b, sc, zp

    call = OneRowNBits(K, N, 32, 2, _Fallback())
    a = rng.standard_normal((1, K), dtype=np.float32)
    _matmul_nbits._force_baseline_simd(simd)
    try:
        for ops in (operands(False), operands(False), operands(True)):
            for _ in range(2):
                got = call(a, *ops)
                want = a.reshape(-1).astype(np.float64) @ ref.dequant_int4(ops[0], ops[1], ops[2], K, 32).T
                np.testing.assert_allclose(got.reshape(-1), want, rtol=1e-4, atol=1e-4)
            if ops[1].flags.writeable:  # a writable operand changed in place is read afresh
                ops[1][:] *= 2
                want = a.reshape(-1).astype(np.float64) @ ref.dequant_int4(ops[0], ops[1], ops[2], K, 32).T
                np.testing.assert_allclose(call(a, *ops).reshape(-1), want, rtol=1e-4, atol=1e-4)
    finally:
        _matmul_nbits._force_baseline_simd(0)


def test_one_row_nbits_hands_other_forms_to_the_fallback():
    from onnxforge.kernels_cy.matmul._matmul_nbits import OneRowNBits

    K, N = 64, 8
    b = np.zeros((N, 2, 16), np.uint8)
    s = np.ones(N * 2, np.float32)
    a = np.ones((1, K), np.float32)
    cases = [
        (np.ones((2, K), np.float32), b, s, None),      # two rows
        (a, b.reshape(N, -1), s, None),                  # b_quant of the wrong rank
        (a, b, s.astype(np.float16), None),              # float16 scales
        (a, b, s, np.ones(3, np.uint8)),                 # zero points of the wrong size
        (a.astype(np.float64), b, s, None),
    ]
    for args in cases:
        fb = _Fallback()
        assert OneRowNBits(K, N, 32, 2, fb)(*args) == "fallback" and fb.calls == 1
    fb = _Fallback()
    assert OneRowNBits(K + 1, N, 32, 2, fb)(a, b, s) == "fallback"  # K not a multiple of 32
    assert OneRowNBits(K, N, 64, 2, fb)(a, b, s) == "fallback"      # another block size


def _rotate64(x, cos, sin, rot, interleaved):
    """float64 rotary embedding of x [B, N, S, D] with per-token cos / sin [B, S, rot / 2]."""
    x = x.astype(np.float64)
    c, s = cos[:, None].astype(np.float64), sin[:, None].astype(np.float64)
    y = x.copy()
    if interleaved:
        a, b = x[..., 0:rot:2], x[..., 1:rot:2]
        y[..., 0:rot:2], y[..., 1:rot:2] = a * c - b * s, a * s + b * c
    else:
        a, b = x[..., :rot // 2], x[..., rot // 2:rot]
        y[..., :rot // 2], y[..., rot // 2:rot] = a * c - b * s, a * s + b * c
    return y


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rot", [0, 8])
@pytest.mark.parametrize("strided", [False, True])
def test_rotary_call_matches_float64(interleaved, rot, strided):
    # a [B, S, N, D] tensor transposed to [B, N, S, D] is read through its strides
    from onnxforge.kernels_cy.attention._rotary import RotaryCall

    rng = np.random.default_rng(5)
    B, N, S, D = 2, 3, 4, 16
    x = rng.standard_normal((B, S, N, D), dtype=np.float32).transpose(0, 2, 1, 3) if strided else \
        rng.standard_normal((B, N, S, D), dtype=np.float32)
    r = rot or D
    ang = rng.uniform(0, 6, (B, S, r // 2))
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    fb = _Fallback()
    y = RotaryCall(interleaved, rot, fb)(x, cos, sin)
    assert fb.calls == 0 and y.shape == x.shape and y.flags.c_contiguous
    np.testing.assert_allclose(y, _rotate64(x, cos, sin, r, interleaved), rtol=1e-6, atol=1e-6)


def test_rotary_call_hands_other_forms_to_the_fallback():
    from onnxforge.kernels_cy.attention._rotary import RotaryCall

    x = np.zeros((1, 2, 3, 8), np.float32)
    c3 = np.zeros((1, 3, 4), np.float32)
    fb = _Fallback()
    call = RotaryCall(False, 0, fb)
    assert call(x, c3, c3, np.zeros((1, 3), np.int64)) == "fallback"      # position ids
    assert call(x, np.zeros((16, 4), np.float32), np.zeros((16, 4), np.float32)) == "fallback"  # 2-D caches
    assert call(x.astype(np.float64), c3, c3) == "fallback"
    assert call(x.reshape(1, 3, 16), c3, c3) == "fallback"               # 3-D input
    assert call(x, np.zeros((1, 3, 3), np.float32), np.zeros((1, 3, 3), np.float32)) == "fallback"  # 6 != 8
    assert call(x, np.zeros((2, 3, 4), np.float32), np.zeros((2, 3, 4), np.float32)) == "fallback"  # batch 2
    assert fb.calls == 6


def _attention64(q, k, v, scale):
    g = q.shape[1] // k.shape[1]
    k64 = np.repeat(k.astype(np.float64), g, axis=1)
    v64 = np.repeat(v.astype(np.float64), g, axis=1)
    s = q.astype(np.float64) @ np.swapaxes(k64, 2, 3) * scale
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v64


@pytest.mark.parametrize("hq, hkv", [(4, 4), (8, 2), (6, 1)])
@pytest.mark.parametrize("mask", [None, "bool", "float", "bool_heads"])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("T", [37, 1024, 1537])  # from 1024 keys on, chunks of 512 are merged
def test_attention_one_query_matches_float64_over_cache_views(hq, hkv, mask, threads, T):
    # K and V are the valid prefix of capacity-sized caches (strided views), as the stateful
    # torch decoders pass them; a mask that masks nothing is the exporter's all-true mask
    from onnxforge.kernels_cy.attention._attention import AttentionOneQuery

    rng = np.random.default_rng(hq * 10 + hkv)
    D, cap = 32, T + 27
    q = rng.standard_normal((1, hq, 1, D), dtype=np.float32)
    kc = rng.standard_normal((1, hkv, cap, D), dtype=np.float32)
    vc = rng.standard_normal((1, hkv, cap, D), dtype=np.float32)
    m = {None: None, "bool": np.ones((1, 1, 1, T), bool), "float": np.zeros((1, 1, 1, T), np.float32),
         "bool_heads": np.ones((1, hq, 1, T), bool)}[mask]
    fb = _Fallback()
    y = AttentionOneQuery(0.2, threads, fb)(q, kc[:, :, :T], vc[:, :, :T], m)
    assert fb.calls == 0 and y.shape == (1, hq, 1, D)
    np.testing.assert_allclose(y, _attention64(q, kc[:, :, :T], vc[:, :, :T], 0.2), rtol=1e-5, atol=1e-5)
    y = AttentionOneQuery(0.0, threads, fb)(q, kc[:, :, :T], vc[:, :, :T], m)  # default scale 1/sqrt(D)
    np.testing.assert_allclose(y, _attention64(q, kc[:, :, :T], vc[:, :, :T], D ** -0.5), rtol=1e-5, atol=1e-5)


def test_attention_one_query_hands_masking_masks_and_other_forms_to_the_fallback():
    from onnxforge.kernels_cy.attention._attention import AttentionOneQuery

    q = np.zeros((1, 4, 1, 8), np.float32)
    k = np.zeros((1, 2, 5, 8), np.float32)
    some = np.ones((1, 1, 1, 5), bool)
    some[..., 3] = False
    fb = _Fallback()
    call = AttentionOneQuery(0.0, 2, fb)
    assert call(q, k, k, some) == "fallback"                                  # masks a key
    assert call(q, k, k, np.full((1, 1, 1, 5), -1.0, np.float32)) == "fallback"  # a float bias
    assert call(q, k, k, np.ones((1, 1, 2, 5), bool)) == "fallback"           # two query rows
    assert call(q, k, k, np.ones((1, 1, 1, 6), bool)) == "fallback"           # wrong length
    assert call(q, k, k, None, k, k) == "fallback"                           # past inputs
    assert call(np.zeros((1, 4, 2, 8), np.float32), k, k) == "fallback"      # two query tokens
    assert call(np.zeros((1, 3, 1, 8), np.float32), k, k) == "fallback"      # 3 heads over 2
    assert call(q.reshape(1, 1, 32), k, k) == "fallback"                     # 3-D
    assert fb.calls == 8
