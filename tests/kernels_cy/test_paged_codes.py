"""Paged decode attention on the codes of int8 and int4 pages (and the decoded path of
the other formats in the same blocks), on the widest vector kernels the CPU has, the AVX2
ones and the portable ones, against a float64 numpy reference computed from pages decoded
by the independent numpy codecs."""
from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from onnxforge.kernels_cy.paged import _paged
from onnxforge.kernels_cy.paged.pages import PAGE_FORMATS, PagedKVCache
from tests.kernels_cy import paged_ref as ref

MIXED = ["int8", "float32", "int4", "int2", "int8", "fp8", "int4", "codebook", "float16", "int4", "int8"]


@pytest.fixture(params=["widest", "avx2", "portable"])
def simd_path(request) -> Iterator[str]:
    """Run a test on the widest kernels the CPU supports (AVX-512 where it has it), on the
    AVX2 ones, then on the portable ones."""
    _paged._allow_avx512(request.param == "widest")
    _paged._force_baseline_simd(request.param == "portable")
    try:
        yield request.param
    finally:
        _paged._allow_avx512(True)
        _paged._force_baseline_simd(False)


def _cache(rng, hkv: int, d: int, p: int, n: int, formats, spare: int = 1) -> PagedKVCache:
    """A cache of ``n`` tokens of random keys and values (last page cut mid-page when
    ``n % p``), its pages converted to ``formats`` (one name per page, cycled)."""
    npg = -(-n // p)
    c = PagedKVCache(hkv, d, p, npg + spare, formats="float32")
    k = rng.standard_normal((1, hkv, n, d)).astype(np.float32)
    v = rng.standard_normal((1, hkv, n, d)).astype(np.float32)
    c.update(k, v, 0)
    for i in range(npg):
        c.convert(i, formats[i % len(formats)])
    return c


def _check(c: PagedKVCache, q: np.ndarray, total: int | None = None, **kw) -> np.ndarray:
    k, v = ref.dense(c)
    if total is not None:
        k, v = k[:, :total], v[:, :total]
    want = ref.attention(q, k, v, kw.get("scale"))
    got = c.attend(q, total, **kw)
    assert got.shape == q.shape and got.dtype == np.float32
    err = float(np.abs(got - want).max())
    assert err <= 1e-5 * float(np.abs(want).max()), err
    return got


@pytest.mark.parametrize("fmt", ["int8", "int4"])
@pytest.mark.parametrize("d", [32, 64, 96, 128])
@pytest.mark.parametrize("p", [4, 12, 16, 64, 128])
def test_code_pages_match_the_float64_reference(simd_path, fmt, d, p):
    rng = np.random.default_rng(d + p)
    n = 3 * p + p // 2 + 1                  # an odd page count, the last page cut mid-page
    c = _cache(rng, 2, d, p, n, [fmt])
    q = rng.standard_normal((1, 4, 1, d)).astype(np.float32)
    _check(c, q)
    _check(c, q * 4.0, total=n - 5, scale=0.5)
    _check(c, rng.standard_normal((1, 4, 3, d)).astype(np.float32))


@pytest.mark.parametrize("hq,hkv", [(2, 2), (4, 2), (6, 2), (16, 1), (32, 2)])
@pytest.mark.parametrize("s", [1, 2])
def test_query_groups_of_one_two_odd_and_sixteen_heads(simd_path, hq, hkv, s):
    rng = np.random.default_rng(hq * 10 + hkv + s)
    c = _cache(rng, hkv, 64, 16, 16 * 5 - 7, ["int4", "int8", "float32"])
    _check(c, rng.standard_normal((1, hq, s, 64)).astype(np.float32))


@pytest.mark.parametrize("p", [4, 8, 16])
def test_every_format_mixed_in_one_cache(simd_path, p):
    rng = np.random.default_rng(p)
    n = p * len(MIXED) - p // 2
    c = _cache(rng, 2, 32, p, n, MIXED)
    assert c.page_formats()[:len(MIXED)] == MIXED
    for s in (1, 3):
        _check(c, rng.standard_normal((1, 4, s, 32)).astype(np.float32))
    for total in (1, p + 1, 2 * p - 1, n):
        _check(c, rng.standard_normal((1, 2, 1, 32)).astype(np.float32), total=total, scale=0.3)


@pytest.mark.parametrize("fmt", PAGE_FORMATS)
def test_one_token_and_one_key(simd_path, fmt):
    rng = np.random.default_rng(9)
    c = _cache(rng, 1, 32, 4, 1, [fmt])
    _check(c, rng.standard_normal((1, 3, 1, 32)).astype(np.float32))


def test_zero_rows_and_large_scores(simd_path):
    """All-zero tokens (int8 scale 0, int4 scale -0.0) and scores far from zero."""
    rng = np.random.default_rng(10)
    n, d = 40, 64
    c = PagedKVCache(2, d, 16, 3, formats="float32")
    k = rng.standard_normal((1, 2, n, d)).astype(np.float32) * 3.0
    v = rng.standard_normal((1, 2, n, d)).astype(np.float32)
    k[:, :, 5:20] = 0.0
    v[:, :, 10:30] = 0.0
    c.update(k, v, 0)
    c.convert(0, "int8")
    c.convert(1, "int4")
    c.convert(2, "int8")
    _check(c, rng.standard_normal((1, 4, 1, d)).astype(np.float32) * 8.0)


@pytest.mark.parametrize("s", [1, 4])
def test_vector_and_portable_kernels_agree(s):
    rng = np.random.default_rng(11)
    c = _cache(rng, 4, 128, 16, 16 * 9 + 3, ["int8", "int4"])
    q = rng.standard_normal((1, 8, s, 128)).astype(np.float32)
    got = {}
    try:
        for path, wide, portable in (("widest", True, False), ("avx2", False, False), ("portable", True, True)):
            _paged._allow_avx512(wide)
            _paged._force_baseline_simd(portable)
            got[path] = (c.attend(q), _paged._vector_level())
    finally:
        _paged._allow_avx512(True)
        _paged._force_baseline_simd(False)
    assert got["portable"][1] == 0 and got["avx2"][1] <= 1
    slow = got["portable"][0]
    for path in ("widest", "avx2"):
        np.testing.assert_allclose(got[path][0], slow, rtol=1e-5, atol=1e-6 * float(np.abs(slow).max()))


def test_threads_split_the_heads_with_the_same_result(simd_path):
    rng = np.random.default_rng(12)
    c = _cache(rng, 4, 64, 16, 16 * 7 + 9, ["int4", "int8"])
    q = rng.standard_normal((1, 8, 1, 64)).astype(np.float32)
    np.testing.assert_array_equal(c.attend(q, num_threads=2), c.attend(q, num_threads=1))
    _check(c, q, num_threads=3)


def test_workspace_does_not_grow_with_the_context():
    rng = np.random.default_rng(13)
    q = rng.standard_normal((1, 8, 1, 64)).astype(np.float32)
    sizes = []
    for n in (50, 3000):
        c = _cache(rng, 4, 64, 16, n, ["int8", "int4"])
        c.attend(q, num_threads=2)
        sizes.append(c.workspace_bytes)
    assert sizes[0] == sizes[1] == 2 * _paged.workspace_floats(16, 64) * 4


@pytest.mark.parametrize("s", [1, 3])
def test_code_pages_leave_the_decode_rows_of_the_workspace_untouched(simd_path, s):
    """int8 / int4 pages are attended on their codes: the K / V rows of the workspace
    (the first 2 * block_keys * D floats of a thread's row) are never written; a float16
    page in the same cache is decoded there."""
    rng = np.random.default_rng(14)
    p, d = 16, 64
    c = _cache(rng, 2, d, p, 5 * p - 3, ["int8", "int4"])
    q = rng.standard_normal((1, 4, s, d)).astype(np.float32)
    ws = c.workspace(1, 4)
    ws[:] = np.nan
    _check(c, q)
    rows = 2 * 64 * d
    assert np.isnan(c.workspace(1, 4)[:, :rows]).all()
    c.convert(2, "float16")
    _check(c, q)
    assert not np.isnan(c.workspace(1, 4)[0, :rows]).all()
