"""rotary against float64 numpy, onnx RotaryEmbedding (opset 23) and com.microsoft RotaryEmbedding."""
from __future__ import annotations

import numpy as np
import pytest

from onnxforge.kernels_cy.attention._rotary import rotary
from onnxforge.kernels_cy.errors import KernelDtypeError, KernelError

from . import reference as ref
from .oracles import run_ort_node


def _caches(rng, max_pos, half):
    angles = rng.uniform(0, 6.3, size=(max_pos, half))
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("B,S,H,D,half", [(1, 1, 4, 32, 16), (2, 5, 3, 10, 5), (3, 2, 2, 12, 4),
                                          (0, 3, 2, 8, 4), (2, 0, 2, 8, 4), (1, 4, 1, 7, 2)])
def test_positions_from_start_and_ids(interleaved, B, S, H, D, half):
    rng = np.random.default_rng(B * 31 + S * 7 + D)
    x = rng.standard_normal((B, S, H, D)).astype(np.float32)
    cos, sin = _caches(rng, 20, half)
    start = rng.integers(0, 20 - S + 1, size=B)
    pos = start[:, None] + np.arange(S)[None, :]
    out = np.empty_like(x)
    rotary(x, cos, sin, out, start=start, interleaved=interleaved, num_threads=2)
    expect = ref.rotary(x, cos, sin, pos, interleaved)
    np.testing.assert_allclose(out, expect, atol=1e-6)
    ids = rng.integers(0, 20, size=(B, S))
    rotary(x, cos, sin, out, position_ids=ids, interleaved=interleaved)
    np.testing.assert_allclose(out, ref.rotary(x, cos, sin, ids, interleaved), atol=1e-6)
    y = x.copy()
    rotary(y, cos, sin, y, position_ids=ids, interleaved=interleaved)     # in place
    np.testing.assert_array_equal(y, out)


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("layout", ["4d", "3d"])
@pytest.mark.parametrize("partial", [False, True])
def test_matches_onnx_rotary_embedding_opset23(interleaved, layout, partial):
    rng = np.random.default_rng(7)
    B, S, H, D = 2, 5, 3, 16
    rot = 8 if partial else D
    cos, sin = _caches(rng, 12, rot // 2)
    ids = rng.integers(0, 12, size=(B, S)).astype(np.int64)
    attrs = {"interleaved": interleaved}
    if partial:
        attrs["rotary_embedding_dim"] = rot
    if layout == "4d":
        x = rng.standard_normal((B, H, S, D)).astype(np.float32)
        view = x.transpose(0, 2, 1, 3)              # [B, S, H, D] without a copy
    else:
        x = rng.standard_normal((B, S, H * D)).astype(np.float32)
        attrs["num_heads"] = H
        view = x.reshape(B, S, H, D)
    (expect,) = run_ort_node("RotaryEmbedding", [("x", x), ("cos", cos), ("sin", sin), ("ids", ids)], 1,
                             domain="", opset=23, **attrs)
    out = np.empty_like(x)
    oview = out.transpose(0, 2, 1, 3) if layout == "4d" else out.reshape(B, S, H, D)
    rotary(view, cos, sin, oview, position_ids=ids, interleaved=bool(interleaved))
    np.testing.assert_allclose(out, expect, atol=1e-6)
    # without position_ids the caches are per token: [B, S, rot/2]
    c3, s3 = cos[ids], sin[ids]
    (expect3,) = run_ort_node("RotaryEmbedding", [("x", x), ("cos", c3), ("sin", s3)], 1,
                              domain="", opset=23, **attrs)
    rotary(view, c3, s3, oview, interleaved=bool(interleaved))
    np.testing.assert_allclose(out, expect3, atol=1e-6)


@pytest.mark.parametrize("interleaved", [0, 1])
def test_matches_com_microsoft_rotary_embedding(interleaved):
    rng = np.random.default_rng(8)
    B, S, H, D = 2, 3, 2, 16
    cos, sin = _caches(rng, 16, D // 2)
    x = rng.standard_normal((B, S, H * D)).astype(np.float32)
    ids = rng.integers(0, 16, size=(B, S)).astype(np.int64)
    (expect,) = run_ort_node("RotaryEmbedding", [("x", x), ("ids", ids), ("cos", cos), ("sin", sin)], 1,
                             interleaved=interleaved, num_heads=H)
    out = np.empty_like(x)
    rotary(x.reshape(B, S, H, D), cos, sin, out.reshape(B, S, H, D), position_ids=ids,
           interleaved=bool(interleaved))
    np.testing.assert_allclose(out, expect, atol=1e-6)


@pytest.mark.parametrize("case,exc", [
    ("position_past_cache", KernelError), ("negative_start", KernelError),
    ("start_overflows", KernelError), ("rot_too_wide", KernelError), ("no_positions", KernelError),
    ("both_positions", KernelError), ("float_ids", KernelDtypeError), ("float16", KernelDtypeError),
    ("cos_sin_shapes", KernelError), ("strided_last_axis", KernelError),
])
def test_errors_raise_before_writing(case, exc):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 2, 8)).astype(np.float32)
    cos, sin = _caches(rng, 6, 4)
    out = np.full_like(x, 4.0)
    kw: dict = {"position_ids": np.zeros((2, 3), np.int64)}
    if case == "position_past_cache":
        kw = {"position_ids": np.full((2, 3), 6)}
    elif case == "negative_start":
        kw = {"start": np.array([-1, 0])}
    elif case == "start_overflows":
        kw = {"start": np.array([0, 4])}
    elif case == "rot_too_wide":
        cos, sin = _caches(rng, 6, 5)
    elif case == "no_positions":
        kw = {}
    elif case == "both_positions":
        kw["start"] = np.zeros(2, np.int64)
    elif case == "float_ids":
        kw = {"position_ids": np.zeros((2, 3))}
    elif case == "float16":
        x = x.astype(np.float16)
    elif case == "cos_sin_shapes":
        sin = sin[:5]
    elif case == "strided_last_axis":
        x = rng.standard_normal((2, 3, 2, 16)).astype(np.float32)[..., ::2]
    with pytest.raises(exc, match="rotary"):
        rotary(x, cos, sin, out, **kw)
    assert (out == 4.0).all()
