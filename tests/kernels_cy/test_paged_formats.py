"""Page formats of the paged KV cache: byte sizes, Cython decoders bit-exact against the
numpy reference (tests/kernels_cy/paged_ref.py), Cython encoders byte-identical to it and
within each format's error bound."""
from __future__ import annotations

import numpy as np
import pytest

from onnxforge.kernels_cy.errors import PageFormatError, PageShapeError
from onnxforge.kernels_cy.paged.pages import PAGE_FORMATS, PagedKVCache, page_nbytes, parse_formats
from tests.kernels_cy import paged_ref as ref

H, P, D = 2, 8, 64


def _page(seed: int, h: int = H, p: int = P, d: int = D) -> np.ndarray:
    """A page with mixed magnitudes, an all-zero row, constant groups and exact ties."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((2, h, p, d)) * rng.choice([1e-3, 0.1, 1.0, 30.0], (2, h, p, 1))).astype(np.float32)
    x[0, 0, 1] = 0.0                              # zero row (scale 0)
    x[1, 0, 2, :32] = 0.75                        # constant block (int2 scale 0)
    x[0, 1, 3, :8] = [1, -1, 0.5, -0.5, 2, -2, 0.25, 0.125]   # ties in every rounding
    x[1, 1, 4, :4] = [1e-6, -3e-8, 6e-5, 1e-40]   # float16 / fp8 subnormals
    return x


def _cache_with(fmt: str, page: np.ndarray) -> PagedKVCache:
    _, h, p, d = page.shape
    c = PagedKVCache(h, d, p, 1, formats=fmt)
    c.update(page[0][None], page[1][None], 0)
    return c


def test_page_sizes_follow_the_layout_table():
    for fmt in PAGE_FORMATS:
        for h, p, d in ((1, 4, 32), (4, 16, 64), (3, 12, 128)):
            assert page_nbytes(fmt, h, p, d) == ref.nbytes(fmt, h, p, d), fmt
    f16 = page_nbytes("float16", 4, 16, 64)
    assert page_nbytes("int4", 4, 16, 64) / f16 <= 0.29
    assert tuple(PAGE_FORMATS) == ref.FORMATS


@pytest.mark.parametrize("fmt", PAGE_FORMATS)
def test_decode_is_bit_exact_for_given_bytes(fmt):
    page = _page(1)
    payload = ref.encode(fmt, page)
    c = PagedKVCache(H, D, P, 1, formats=fmt)
    c.set_page(0, fmt, payload)
    got = c.decode(0)
    want = ref.decode(fmt, payload, H, P, D)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("fmt", ["float16", "int8", "int4", "fp8", "codebook"])
def test_decode_of_random_codes_is_bit_exact(fmt):
    """Arbitrary code bytes with finite scales decode exactly like the reference."""
    rng = np.random.default_rng(2)
    payload = ref.encode(fmt, _page(2))
    codes = rng.integers(0, 256, payload.size, dtype=np.uint8)
    scale_free = ref.encode(fmt, np.zeros((2, H, P, D), np.float32)) == 0  # bytes not holding a scale
    if fmt == "float16":
        codes[1::2] &= 0x7B                       # finite halves only
        payload = codes
    elif fmt == "fp8":
        payload = np.where(scale_free & (np.arange(payload.size) % (4 + D) >= 4), codes & 0xFE, payload)
    else:
        rec = {"int8": 4 + D, "int4": 18, "codebook": 12}[fmt]
        pos = np.arange(payload.size) % rec
        code_bytes = (pos >= 4) if fmt == "int8" else (pos >= 2) if fmt == "int4" else (pos < 8)
        payload = np.where(code_bytes, codes, payload).astype(np.uint8)
    c = PagedKVCache(H, D, P, 1, formats=fmt)
    c.set_page(0, fmt, payload.astype(np.uint8))
    want = ref.decode(fmt, payload, H, P, D)
    np.testing.assert_array_equal(c.decode(0).view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("fmt", PAGE_FORMATS)
def test_encode_of_a_whole_page_is_byte_identical_to_the_reference(fmt):
    page = _page(3)
    c = _cache_with(fmt, page)
    np.testing.assert_array_equal(c.page_payload(0), ref.encode(fmt, page))


@pytest.mark.parametrize("fmt", PAGE_FORMATS)
def test_a_partly_written_page_encodes_its_unwritten_tokens_as_zeros(fmt):
    page = _page(4)
    c = PagedKVCache(H, D, P, 2, formats=fmt)
    c.update(page[0][None, :, :5], page[1][None, :, :5], 0)
    padded = page.copy()
    padded[:, :, 5:] = 0.0
    np.testing.assert_array_equal(c.page_payload(0), ref.encode(fmt, padded))


@pytest.mark.parametrize("fmt", [f for f in PAGE_FORMATS if f != "int2"])
def test_token_by_token_writes_give_the_same_bytes_as_one_write(fmt):
    page = _page(5)
    c = PagedKVCache(H, D, P, 1, formats=fmt)
    for t in range(P):
        c.update(page[0][None, :, t:t + 1], page[1][None, :, t:t + 1], t)
    np.testing.assert_array_equal(c.page_payload(0), ref.encode(fmt, page))


def _bound(fmt: str, x: np.ndarray) -> np.ndarray:
    """Largest |decode(encode(x)) - x| the format allows, elementwise (x: [2, H, P, D])."""
    rows = np.abs(x).max(-1, keepdims=True)
    blk = np.abs(x.reshape(x.shape[:-1] + (-1, 32))).max(-1, keepdims=True)
    blk = np.broadcast_to(blk, blk.shape[:-1] + (32,)).reshape(x.shape)
    eps16 = 2.0 ** -11
    if fmt == "float32":
        return np.zeros_like(x)
    if fmt == "float16":
        return np.abs(x) * eps16 + 2.0 ** -25
    if fmt == "int8":
        return rows / 254 * (1 + 1e-6) + 1e-30
    if fmt == "fp8":
        return np.abs(x) * 2.0 ** -4 + rows / 448 * 2.0 ** -10 + 1e-30
    if fmt == "int4":
        return blk / 8 * (1 + 8 * eps16) + 1e-30     # one step (the clamped extreme) at most
    if fmt == "codebook":
        return blk * 0.375 * (1 + 1e-6) + 1e-30
    if fmt == "int2":   # keys per channel over the page, values per 32-block
        kr = x[0].max(1, keepdims=True) - x[0].min(1, keepdims=True)
        kb = np.abs(x[0]).max(1, keepdims=True)
        v = x[1].reshape(x.shape[1:3] + (-1, 32))
        vr = np.broadcast_to(v.max(-1, keepdims=True) - v.min(-1, keepdims=True), v.shape).reshape(x[1].shape)
        vb = np.broadcast_to(np.abs(v).max(-1, keepdims=True), v.shape).reshape(x[1].shape)
        return np.stack([np.broadcast_to(kr / 6 + 4 * eps16 * (kb + kr), x[0].shape),
                         vr / 6 + 4 * eps16 * (vb + vr)]) + 1e-30
    raise AssertionError(fmt)


@pytest.mark.parametrize("fmt", PAGE_FORMATS)
def test_encode_error_is_within_the_format_bound(fmt):
    page = _page(6, h=3, p=16, d=96)
    c = _cache_with(fmt, page)
    err = np.abs(c.decode(0).astype(np.float64) - page)
    assert np.all(err <= _bound(fmt, page)), float((err - _bound(fmt, page)).max())


def test_int2_keys_requantized_token_by_token_stay_near_the_bound():
    page = _page(7)
    c = PagedKVCache(H, D, P, 1, formats="int2")
    for t in range(P):
        c.update(page[0][None, :, t:t + 1], page[1][None, :, t:t + 1], t)
    err = np.abs(c.decode(0).astype(np.float64) - page)
    assert np.all(err[1] <= _bound("int2", page)[1])          # values: per token, exact layout
    assert np.all(err[0] <= 2 * _bound("int2", page)[0])      # keys: regrouped as tokens arrive


def test_bad_formats_and_shapes_are_typed_errors():
    with pytest.raises(PageFormatError, match="int3"):
        page_nbytes("int3", 1, 4, 32)
    with pytest.raises(PageFormatError, match="int3"):
        parse_formats("float32,int3")
    with pytest.raises(PageFormatError):
        parse_formats([])
    assert parse_formats("float32, int8,int4") == ("float32", "int8", "int4")
    with pytest.raises(PageShapeError, match="multiple of 32"):
        PagedKVCache(1, 48, 4, 1)
    with pytest.raises(PageShapeError, match="multiple of 4"):
        PagedKVCache(1, 32, 6, 1)
    with pytest.raises(PageFormatError):
        PagedKVCache(1, 32, 4, 1, formats="float32,bf16")


@pytest.mark.parametrize("fmt", ["float16", "int8", "int4"])
def test_vector_and_portable_decoders_agree_bit_for_bit(fmt):
    from onnxforge.kernels_cy.paged import _paged

    page = _page(8)
    c = _cache_with(fmt, page)
    q = np.random.default_rng(8).standard_normal((1, 4, 3, D)).astype(np.float32)
    fast_page, fast_y = c.decode(0), c.attend(q)
    _paged._force_baseline_simd(True)
    try:
        slow_page, slow_y = c.decode(0), c.attend(q)
    finally:
        _paged._force_baseline_simd(False)
    np.testing.assert_array_equal(fast_page.view(np.uint32), slow_page.view(np.uint32))
    np.testing.assert_allclose(fast_y, slow_y, rtol=1e-5, atol=1e-6)
    want = ref.decode(fmt, c.page_payload(0), H, P, D)
    np.testing.assert_array_equal(slow_page.view(np.uint32), want.view(np.uint32))
