"""``gqa_decode``: one token's rotation, cache writes and attention in one call, against
onnxruntime's GroupQueryAttention and float64 numpy."""
from __future__ import annotations

import numpy as np
import pytest

from onnxforge.kernels_cy.attention._attention import gqa_decode
from onnxforge.kernels_cy.errors import CacheRangeError, KernelError

from . import reference as ref
from .oracles import run_ort_node


def _rand(rng, *shape):
    return rng.standard_normal(shape, dtype=np.float32)


def _ort(q, k, v, past_k, past_v, pos, Hq, Hkv, cos, sin, interleaved, **attrs):
    feeds = [("query", q.reshape(1, 1, -1)), ("key", k.reshape(1, 1, -1)), ("value", v.reshape(1, 1, -1)),
             ("past_key", past_k), ("past_value", past_v), ("seqlens_k", np.array([pos], np.int32)),
             ("total_sequence_length", np.array(pos + 1, np.int32))]
    if cos is not None:
        feeds += [("cos_cache", cos), ("sin_cache", sin)]
        attrs.update(do_rotary=1, rotary_interleaved=int(interleaved))
    return run_ort_node("GroupQueryAttention", feeds, 3, num_heads=Hq, kv_num_heads=Hkv, **attrs)


@pytest.mark.parametrize("rotary_mode", [None, "halves", "interleaved"])
@pytest.mark.parametrize("Hq,Hkv,D,pos", [(4, 2, 32, 0), (8, 4, 64, 37), (6, 1, 16, 5), (34, 2, 16, 9),
                                          (8, 4, 64, 1023), (6, 1, 32, 1536), (4, 2, 32, 2100)])
@pytest.mark.parametrize("threads", [1, 2])
def test_matches_onnxruntime(rotary_mode, Hq, Hkv, D, pos, threads):
    rng = np.random.default_rng(Hq * 100 + D + pos)
    cap = pos + 4
    q, k, v = _rand(rng, 1, 1, Hq, D), _rand(rng, 1, 1, Hkv, D), _rand(rng, 1, 1, Hkv, D)
    kc, vc = _rand(rng, 1, Hkv, cap, D), _rand(rng, 1, Hkv, cap, D)
    cos = sin = None
    if rotary_mode:
        angles = rng.uniform(0, 6.3, size=(pos + 64, D // 2)).astype(np.float32)
        cos, sin = np.cos(angles), np.sin(angles)
    expect, present_k, present_v = _ort(q, k, v, kc[:, :, :pos].copy(), vc[:, :, :pos].copy(), pos, Hq, Hkv,
                                        cos, sin, rotary_mode == "interleaved")
    tail = kc[:, :, pos + 1:].copy()
    out = np.empty((1, 1, Hq, D), np.float32)
    gqa_decode(q, k, v, kc, vc, pos, cos, sin, out, interleaved=rotary_mode == "interleaved",
               num_threads=threads)
    np.testing.assert_allclose(out.reshape(expect.shape), expect, atol=1e-5)
    np.testing.assert_allclose(kc[:, :, :pos + 1], present_k, atol=1e-6)
    np.testing.assert_array_equal(vc[:, :, :pos + 1], present_v)
    np.testing.assert_array_equal(kc[:, :, pos + 1:], tail)  # nothing past the new row


@pytest.mark.parametrize("pos", [12, 1500])  # 1501 keys: split into chunks of 512 and merged
def test_partial_rotary_softcap_and_strided_inputs_match_float64(pos):
    rng = np.random.default_rng(11)
    Hq, Hkv, D, cap = 8, 2, 32, pos + 8
    packed = _rand(rng, 1, 1, (Hq + 2 * Hkv) * D)  # packed QKV: strided head views
    q = packed[:, :, :Hq * D].reshape(1, 1, Hq, D)
    k = packed[:, :, Hq * D:(Hq + Hkv) * D].reshape(1, 1, Hkv, D)
    v = packed[:, :, (Hq + Hkv) * D:].reshape(1, 1, Hkv, D)
    kc, vc = _rand(rng, 1, Hkv, cap, D), _rand(rng, 1, Hkv, cap, D)
    angles = rng.uniform(0, 6.3, size=(pos + 20, 8)).astype(np.float32)  # rotary dim 16 of 32
    cos, sin = np.cos(angles), np.sin(angles)
    kc0, vc0 = kc.copy(), vc.copy()
    out = np.empty((1, 1, Hq, D), np.float32)
    gqa_decode(q, k, v, kc, vc, pos, cos, sin, out, 0.5, softcap=3.0, num_threads=2)
    p = np.array([[pos]])
    qr = ref.rotary(q, cos, sin, p, False)
    kr = ref.rotary(k, cos, sin, p, False)
    kc0[0, :, pos], vc0[0, :, pos] = kr[0, 0], v[0, 0]
    g = Hq // Hkv
    for h in range(Hq):
        kk = kc0[0, h // g, :pos + 1].astype(np.float64)
        s = 3.0 * np.tanh(0.5 * (kk @ qr[0, 0, h]) / 3.0)
        w = np.exp(s - s.max())
        want = (w / w.sum()) @ vc0[0, h // g, :pos + 1].astype(np.float64)
        np.testing.assert_allclose(out[0, 0, h], want, atol=2e-5)
    np.testing.assert_allclose(kc, kc0, atol=1e-6)


@pytest.mark.parametrize("case,exc", [("past_capacity", CacheRangeError), ("negative", CacheRangeError),
                                      ("short_rotary", KernelError), ("heads", KernelError),
                                      ("batch", KernelError)])
def test_errors_raise_before_writing(case, exc):
    rng = np.random.default_rng(5)
    Hq, Hkv, D, cap = 4, 2, 16, 8
    q, k, v = _rand(rng, 1, 1, Hq, D), _rand(rng, 1, 1, Hkv, D), _rand(rng, 1, 1, Hkv, D)
    kc, vc = _rand(rng, 1, Hkv, cap, D), _rand(rng, 1, Hkv, cap, D)
    angles = rng.uniform(0, 6.3, size=(6, D // 2)).astype(np.float32)
    cos, sin = np.cos(angles), np.sin(angles)
    pos = {"past_capacity": cap, "negative": -1, "short_rotary": 6}.get(case, 3)
    if case == "heads":
        q = _rand(rng, 1, 1, 3, D)
    if case == "batch":
        q, k, v = _rand(rng, 2, 1, Hq, D), _rand(rng, 2, 1, Hkv, D), _rand(rng, 2, 1, Hkv, D)
    kc0, vc0 = kc.copy(), vc.copy()
    with pytest.raises(exc):
        gqa_decode(q, k, v, kc, vc, pos, cos, sin, np.empty(q.shape, np.float32), num_threads=2)
    assert np.array_equal(kc, kc0) and np.array_equal(vc, vc0)
