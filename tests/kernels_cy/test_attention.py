"""gqa_attention against float64 numpy and com.microsoft GroupQueryAttention on onnxruntime."""
from __future__ import annotations

import numpy as np
import pytest

from onnxforge.kernels_cy.attention._attention import gqa_attention
from onnxforge.kernels_cy.cache._cache import cache_update
from onnxforge.kernels_cy.attention._rotary import rotary
from onnxforge.kernels_cy.errors import CacheRangeError, KernelDtypeError, KernelError

from . import reference as ref
from .oracles import run_ort_node


def _rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def _capacity_cache(rng, B, H, cap, D, total):
    """Random cache with NaN past each row's valid length: reading it would show."""
    c = _rand(rng, B, H, cap, D)
    for b in range(B):
        c[b, :, total[b]:] = np.nan
    return c


# (B, S, Hq, Hkv, D, cap)
SHAPES = [
    (1, 1, 4, 2, 32, 40),     # decode
    (2, 7, 4, 2, 16, 12),     # prefill-ish, batch 2
    (3, 1, 6, 3, 5, 9),       # odd head dim
    (2, 3, 8, 8, 33, 70),     # MHA, odd dim, several blocks of keys
    (1, 2, 20, 1, 4, 150),    # group of 20 heads (more than one pass of 16)
    (0, 1, 4, 2, 8, 4),       # empty batch
    (2, 0, 4, 2, 8, 4),       # no new tokens
]


@pytest.mark.parametrize("B,S,Hq,Hkv,D,cap", SHAPES)
def test_capacity_cache_reads_only_valid_length(B, S, Hq, Hkv, D, cap):
    rng = np.random.default_rng(B * 100 + S * 10 + D)
    total = rng.integers(S, cap + 1, size=B)
    q = _rand(rng, B, S, Hq, D)
    kc = _capacity_cache(rng, B, Hkv, cap, D, total)
    vc = _capacity_cache(rng, B, Hkv, cap, D, total)
    out = np.full(q.shape, 7.0, np.float32)
    gqa_attention(q, kc, vc, total, out, num_threads=2)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, ref.attention(q, kc, vc, total), atol=2e-6, rtol=1e-5)


def test_past_present_layout_and_strided_cache():
    rng = np.random.default_rng(1)
    B, S, Hq, Hkv, D, T = 2, 3, 4, 2, 16, 9
    q = _rand(rng, B, S, Hq, D)
    k_bsnh = _rand(rng, B, T, Hkv, D)          # [B, T, Hkv, D] storage, read through a view
    v_bsnh = _rand(rng, B, T, Hkv, D)
    kc, vc = k_bsnh.transpose(0, 2, 1, 3), v_bsnh.transpose(0, 2, 1, 3)
    total = np.array([T, T], np.int32)
    out = np.empty_like(q)
    gqa_attention(q, kc, vc, total, out)
    np.testing.assert_allclose(out, ref.attention(q, kc, vc, total), atol=2e-6)
    # an output view with head-major storage
    storage = np.empty((B, Hq, S, D), np.float32)
    gqa_attention(q, kc, vc, total, storage.transpose(0, 2, 1, 3))
    np.testing.assert_allclose(storage.transpose(0, 2, 1, 3), out, atol=0)


@pytest.mark.parametrize("softcap,window", [(0.0, 3), (2.5, -1), (1.5, 2)])
def test_softcap_and_local_window(softcap, window):
    rng = np.random.default_rng(2)
    B, S, Hq, Hkv, D, cap = 2, 4, 4, 2, 8, 12
    total = np.array([9, 5])
    q, kc, vc = _rand(rng, B, S, Hq, D), _rand(rng, B, Hkv, cap, D), _rand(rng, B, Hkv, cap, D)
    out = np.empty_like(q)
    gqa_attention(q, kc, vc, total, out, 0.3, softcap=softcap, local_window=window)
    expect = ref.attention(q, kc, vc, total, scale=0.3, softcap=softcap, window=window)
    np.testing.assert_allclose(out, expect, atol=2e-6)


def test_padded_first_prompt_with_query_start():
    rng = np.random.default_rng(3)
    B, S, Hq, Hkv, D = 2, 5, 2, 1, 8
    valid = np.array([5, 2])
    q, kc, vc = _rand(rng, B, S, Hq, D), _rand(rng, B, Hkv, S, D), _rand(rng, B, Hkv, S, D)
    out = np.empty_like(q)
    start = np.zeros(B, np.int64)
    gqa_attention(q, kc, vc, valid, out, query_start=start)
    np.testing.assert_allclose(out, ref.attention(q, kc, vc, valid, start=start), atol=2e-6)


def _ort_gqa(q, k, v, past_k, past_v, seqlens_k, total_seq, Hq, Hkv, cos=None, sin=None, **attrs):
    B, S = q.shape[:2]
    feeds = [("query", q.reshape(B, S, -1)), ("key", k.reshape(B, S, -1)), ("value", v.reshape(B, S, -1)),
             ("past_key", past_k), ("past_value", past_v), ("seqlens_k", seqlens_k.astype(np.int32)),
             ("total_sequence_length", np.array(total_seq, np.int32))]
    if cos is not None:
        feeds += [("cos_cache", cos), ("sin_cache", sin)]
    return run_ort_node("GroupQueryAttention", feeds, 3, num_heads=Hq, kv_num_heads=Hkv, **attrs)


def _ours_gqa(q, k, v, cache_k, cache_v, past_len, cos=None, sin=None, interleaved=False,
              first_prompt=False, **kw):
    """The stateful path: rotary on the new tokens, CacheUpdate per row, attention in place."""
    B, S = q.shape[:2]
    start = np.zeros(B, np.int64) if first_prompt else past_len.astype(np.int64)
    if cos is not None:
        q = rotary(q, cos, sin, np.empty_like(q), start=start, interleaved=interleaved)
        k = rotary(k, cos, sin, np.empty_like(k), start=start, interleaved=interleaved)
    kt = np.ascontiguousarray(k.transpose(0, 2, 1, 3))
    vt = np.ascontiguousarray(v.transpose(0, 2, 1, 3))
    cache_update(cache_k, kt, past_len)
    cache_update(cache_v, vt, past_len)
    out = np.empty(q.shape, np.float32)
    total = past_len + S
    gqa_attention(q, cache_k, cache_v, total.astype(np.int32), out, kw.pop("scale", 0.0),
                  query_start=start if first_prompt else None, num_threads=2, **kw)
    return out


@pytest.mark.parametrize("rotary_mode", [None, "halves", "interleaved"])
# onnxruntime takes S > 1 with a past only for batch 1
# and head sizes that are multiples of 16 with rotary (8 without)
@pytest.mark.parametrize("B,S,Hq,Hkv,D", [(1, 1, 4, 2, 32), (3, 1, 4, 2, 16), (1, 6, 8, 2, 16),
                                          (1, 3, 3, 1, 16)])
def test_matches_onnxruntime_decode_with_right_padding(rotary_mode, B, S, Hq, Hkv, D):
    rng = np.random.default_rng(B + S + D)
    past_len = rng.integers(0, 7, size=B)
    past_len[0] = 6                                  # the longest row fills the past buffer
    P, cap = int(past_len.max()), int(past_len.max()) + S + 3
    q, k, v = _rand(rng, B, S, Hq, D), _rand(rng, B, S, Hkv, D), _rand(rng, B, S, Hkv, D)
    cache_k, cache_v = _rand(rng, B, Hkv, cap, D), _rand(rng, B, Hkv, cap, D)
    cos = sin = None
    attrs: dict = {}
    if rotary_mode:
        angles = rng.uniform(0, 6.3, size=(64, D // 2)).astype(np.float32)
        cos, sin = np.cos(angles), np.sin(angles)
        attrs = {"do_rotary": 1, "rotary_interleaved": int(rotary_mode == "interleaved")}
    expect, present_k, _ = _ort_gqa(q, k, v, cache_k[:, :, :P].copy(), cache_v[:, :, :P].copy(),
                                    past_len + S - 1, P + S, Hq, Hkv, cos, sin, **attrs)
    got = _ours_gqa(q, k, v, cache_k, cache_v, past_len, cos, sin,
                    interleaved=rotary_mode == "interleaved")
    np.testing.assert_allclose(got.reshape(expect.shape), expect, atol=1e-5)
    for b in range(B):                                # the rotated keys landed where ORT put them
        t = past_len[b] + S
        np.testing.assert_allclose(cache_k[b, :, :t], present_k[b, :, :t], atol=1e-6)


@pytest.mark.parametrize("rotary_mode", [None, "halves"])
def test_matches_onnxruntime_padded_first_prompt(rotary_mode):
    rng = np.random.default_rng(11)
    B, S, Hq, Hkv, D = 3, 6, 4, 2, 16
    valid = np.array([6, 3, 1])
    q, k, v = _rand(rng, B, S, Hq, D), _rand(rng, B, S, Hkv, D), _rand(rng, B, S, Hkv, D)
    cos = sin = None
    attrs: dict = {}
    if rotary_mode:
        angles = rng.uniform(0, 6.3, size=(32, D // 2)).astype(np.float32)
        cos, sin = np.cos(angles), np.sin(angles)
        attrs = {"do_rotary": 1}
    empty = np.zeros((B, Hkv, 0, D), np.float32)
    expect, _, _ = _ort_gqa(q, k, v, empty, empty, valid - 1, S, Hq, Hkv, cos, sin, **attrs)
    cache_k, cache_v = np.zeros((B, Hkv, 8, D), np.float32), np.zeros((B, Hkv, 8, D), np.float32)
    start = np.zeros(B, np.int64)
    if cos is not None:
        q = rotary(q, cos, sin, np.empty_like(q), start=start)
        k = rotary(k, cos, sin, np.empty_like(k), start=start)
    cache_update(cache_k, np.ascontiguousarray(k.transpose(0, 2, 1, 3)), 0)
    cache_update(cache_v, np.ascontiguousarray(v.transpose(0, 2, 1, 3)), 0)
    got = np.empty(q.shape, np.float32)
    gqa_attention(q, cache_k, cache_v, (valid - 1).astype(np.int32), got, length_offset=1,
                  query_start=start)
    # every row, padded queries included (they attend to the row's valid keys)
    np.testing.assert_allclose(got.reshape(expect.shape), expect, atol=1e-5)


@pytest.mark.parametrize("softcap,window", [(3.0, -1), (0.0, 2)])
def test_matches_onnxruntime_softcap_and_local_window(softcap, window):
    rng = np.random.default_rng(5)
    B, S, Hq, Hkv, D = 2, 1, 4, 2, 8
    past_len = np.array([5, 2])
    P, cap = 5, 10
    q, k, v = _rand(rng, B, S, Hq, D), _rand(rng, B, S, Hkv, D), _rand(rng, B, S, Hkv, D)
    cache_k, cache_v = _rand(rng, B, Hkv, cap, D), _rand(rng, B, Hkv, cap, D)
    expect, _, _ = _ort_gqa(q, k, v, cache_k[:, :, :P].copy(), cache_v[:, :, :P].copy(),
                            past_len + S - 1, P + S, Hq, Hkv, softcap=softcap,
                            local_window_size=window, scale=0.5)
    got = _ours_gqa(q, k, v, cache_k, cache_v, past_len, softcap=softcap, local_window=window,
                    scale=0.5)
    np.testing.assert_allclose(got.reshape(expect.shape), expect, atol=1e-5)


def _args(rng):
    q = _rand(rng, 2, 2, 4, 8)
    kc, vc = _rand(rng, 2, 2, 6, 8), _rand(rng, 2, 2, 6, 8)
    return q, kc, vc


@pytest.mark.parametrize("case,exc", [
    ("total_over_capacity", CacheRangeError),
    ("total_negative", CacheRangeError),
    ("fewer_valid_than_new", CacheRangeError),
    ("float64_q", KernelDtypeError),
    ("float16_q", KernelDtypeError),
    ("heads_not_grouped", KernelError),
    ("head_dim_mismatch", KernelError),
    ("lengths_shape", KernelError),
    ("float_lengths", KernelDtypeError),
    ("out_read_only", KernelError),
    ("head_dim_too_large", KernelError),
])
def test_errors_raise_before_writing(case, exc):
    rng = np.random.default_rng(0)
    q, kc, vc = _args(rng)
    total = np.array([4, 6])
    out = np.full(q.shape, 3.0, np.float32)
    kw: dict = {}
    if case == "total_over_capacity":
        total = np.array([4, 7])
    elif case == "total_negative":
        total = np.array([-1, 4])
    elif case == "fewer_valid_than_new":
        total = np.array([1, 4])
    elif case == "float64_q":
        q = q.astype(np.float64)
    elif case == "float16_q":
        q = q.astype(np.float16)
    elif case == "heads_not_grouped":
        kc, vc = _rand(rng, 2, 3, 6, 8), _rand(rng, 2, 3, 6, 8)
    elif case == "head_dim_mismatch":
        kc, vc = _rand(rng, 2, 2, 6, 4), _rand(rng, 2, 2, 6, 4)
    elif case == "lengths_shape":
        total = np.array([4, 4, 4])
    elif case == "float_lengths":
        total = np.array([4.0, 4.0])
    elif case == "out_read_only":
        out.flags.writeable = False
    elif case == "head_dim_too_large":
        q = _rand(rng, 1, 1, 1, 300)
        kc = vc = _rand(rng, 1, 1, 2, 300)
        out = np.full(q.shape, 3.0, np.float32)
        total = np.array([2])
    with pytest.raises(exc) as info:
        gqa_attention(q, kc, vc, total, out, **kw)
    assert "gqa_attention" in str(info.value)
    assert (out == 3.0).all()
