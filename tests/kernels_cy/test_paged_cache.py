"""PagedKVCache: the page rules with exact allocation / copy counters, the format policy,
typed errors that leave the cache unchanged, save and restore."""
from __future__ import annotations

import numpy as np
import pytest

from onnxforge.kernels_cy.errors import (BackendError, PageCapacityError, PagedCacheError, PageFormatError,
                                         PageIdError, PageShapeError)
from onnxforge.kernels_cy.paged.pages import PagedKVCache, page_nbytes
from tests.kernels_cy import paged_ref as ref

H, D, P = 2, 32, 4


def _kv(rng, n: int, h: int = H, d: int = D) -> tuple[np.ndarray, np.ndarray]:
    return (rng.standard_normal((1, h, n, d)).astype(np.float32),
            rng.standard_normal((1, h, n, d)).astype(np.float32))


def _snapshot(c: PagedKVCache) -> tuple:
    held = [i for i, f in enumerate(c.page_formats()) if f is not None]
    return (c.length, c.num_pages, c.page_formats(), c.buffer_addresses(), c.nbytes,
            [c.page_payload(i).tobytes() for i in held])


def test_updating_an_existing_page_allocates_and_copies_nothing():
    """The page and the staging page trade places on each commit: two buffers, no new one."""
    rng = np.random.default_rng(0)
    for fmt in ("float32", "int8", "int4", "int2"):
        c = PagedKVCache(H, D, P, 4, formats=fmt)
        last = c.update(*_kv(rng, 1), 0)
        assert (last.allocated_bytes, last.copied_bytes) == (page_nbytes(fmt, H, P, D), 0)
        pair = {c.buffer_addresses()[0], c.staging_address}
        for t in range(1, P):
            last = c.update(*_kv(rng, 1), t)
            assert (last.allocated_bytes, last.copied_bytes, last.freed_bytes) == (0, 0, 0), fmt
            assert last.staged_bytes == page_nbytes(fmt, H, P, D)
            assert {c.buffer_addresses()[0], c.staging_address} == pair
        assert c.allocated_bytes == page_nbytes(fmt, H, P, D) and c.copied_bytes == 0


def test_a_missing_page_allocates_exactly_its_format_bytes_and_moves_no_other_page():
    rng = np.random.default_rng(1)
    c = PagedKVCache(H, D, P, 4, formats="int4")
    c.update(*_kv(rng, P), 0)
    before = c.buffer_addresses()
    last = c.update(*_kv(rng, 1), P)
    assert last.allocated_bytes == page_nbytes("int4", H, P, D) == c.page_payload(1).nbytes
    assert last.copied_bytes == 0
    assert {i: a for i, a in c.buffer_addresses().items() if i in before} == before
    assert c.nbytes == 2 * page_nbytes("int4", H, P, D)


def test_converting_a_page_replaces_only_that_page():
    rng = np.random.default_rng(2)
    c = PagedKVCache(H, D, P, 4, formats="float32")
    c.update(*_kv(rng, 3 * P), 0)
    addrs = c.buffer_addresses()
    dense_before = ref.dense(c)
    last = c.convert(1, "int8")
    assert last.allocated_bytes == page_nbytes("int8", H, P, D)
    assert last.freed_bytes == page_nbytes("float32", H, P, D)
    assert last.copied_bytes == 0 and last.converted_pages == (1,)
    now = c.buffer_addresses()
    assert now[0] == addrs[0] and now[2] == addrs[2]
    assert c.page_formats() == ["float32", "int8", "float32", None]
    assert c.nbytes == 2 * page_nbytes("float32", H, P, D) + page_nbytes("int8", H, P, D)
    k, v = ref.dense(c)
    np.testing.assert_array_equal(k[:, :P], dense_before[0][:, :P])
    expect = ref.decode("int8", ref.encode("int8", ref.decode("float32", ref.encode(
        "float32", np.stack([dense_before[0][:, P:2 * P], dense_before[1][:, P:2 * P]])), H, P, D)), H, P, D)
    np.testing.assert_array_equal(np.stack([k[:, P:2 * P], v[:, P:2 * P]]), expect)
    assert c.convert(1, "int8").allocated_bytes == 0          # same format: nothing


def test_growing_the_page_table_copies_no_payload():
    rng = np.random.default_rng(3)
    c = PagedKVCache(H, D, P, 2, formats="int8")
    c.update(*_kv(rng, 2 * P), 0)
    addrs, payload = c.buffer_addresses(), c.page_payload(0).tobytes()
    c.grow(5)
    assert c.num_pages == 5 and c.capacity == 5 * P
    assert c.last.allocated_bytes == 0 and c.last.copied_bytes == 0
    assert c.buffer_addresses() == addrs and c.page_payload(0).tobytes() == payload
    assert c.page_formats() == ["int8", "int8", None, None, None]
    assert c.update(*_kv(rng, 1), 2 * P).allocated_bytes == page_nbytes("int8", H, P, D)


def test_the_policy_ages_pages_newest_first_with_the_last_format_repeating():
    rng = np.random.default_rng(4)
    c = PagedKVCache(H, D, P, 6, formats="float32,int8,int4")
    k, v = _kv(rng, 6 * P)
    seen = []
    for t in range(6 * P):
        before, staging = c.buffer_addresses(), c.staging_address
        last = c.update(k[:, :, t:t + 1], v[:, :, t:t + 1], t)
        if t % P == 0:
            seen.append(c.page_formats())
            n = t // P
            expect_alloc = page_nbytes("float32", H, P, D)
            if n >= 1:
                expect_alloc += page_nbytes("int8", H, P, D)
            if n >= 2:
                expect_alloc += page_nbytes("int4", H, P, D)
            assert last.allocated_bytes == expect_alloc and last.copied_bytes == 0
            assert last.converted_pages == tuple(i for i in (n - 2, n - 1) if i >= 0)
            untouched = [i for i in before if i not in last.converted_pages]
            assert all(c.buffer_addresses()[i] == before[i] for i in untouched)
        else:
            open_page = t // P
            assert last.allocated_bytes == 0
            assert {i: a for i, a in c.buffer_addresses().items() if i != open_page} == \
                {i: a for i, a in before.items() if i != open_page}
            assert c.buffer_addresses()[open_page] in (before[open_page], staging)
    assert seen[0] == ["float32", None, None, None, None, None]
    assert seen[2] == ["int4", "int8", "float32", None, None, None]
    assert seen[5] == ["int4", "int4", "int4", "int4", "int8", "float32"]
    # a prompt written at once quantizes each page straight into its final format
    p = PagedKVCache(H, D, P, 6, formats="float32,int8,int4")
    last = p.update(k[:, :, :3 * P + 1], v[:, :, :3 * P + 1], 0)
    assert p.page_formats()[:4] == ["int4", "int4", "int8", "float32"]
    assert last.converted_pages == () and last.allocated_bytes == p.nbytes
    for i, fmt in enumerate(["int4", "int4", "int8"]):
        page = np.stack([k[0, :, i * P:(i + 1) * P], v[0, :, i * P:(i + 1) * P]])
        np.testing.assert_array_equal(p.page_payload(i), ref.encode(fmt, page))


def test_dense_is_the_reference_decode_of_every_page():
    rng = np.random.default_rng(5)
    c = PagedKVCache(H, D, P, 8, formats="float32,fp8,int2,codebook,float16")
    k, v = _kv(rng, 6 * P + 3)
    c.update(k[:, :, :5], v[:, :, :5], 0)
    c.update(k[:, :, 5:], v[:, :, 5:], 5)
    got, want = c.dense(), ref.dense(c)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
    assert got[0].shape == (H, 6 * P + 3, D)


def _bad_calls(rng):
    k, v = _kv(rng, 1)
    return [
        (PageCapacityError, lambda c: c.update(k, v, c.length + 1), "published length"),
        (PageCapacityError, lambda c: c.update(k, v, -1), "outside the capacity"),
        (PageCapacityError, lambda c: c.update(*_kv(rng, c.capacity), c.length), "outside the capacity"),
        (PageShapeError, lambda c: c.update(k.astype(np.float64), v, c.length), "float32"),
        (PageShapeError, lambda c: c.update(k[:, :, :, :16], v, c.length), "shape"),
        (PageShapeError, lambda c: c.update(k, _kv(rng, 2)[1], c.length), "tokens"),
        (PageShapeError, lambda c: c.update(k, v, 1.5), "integer"),
        (PageIdError, lambda c: c.convert(99, "int8"), "outside the page table"),
        (PageIdError, lambda c: c.convert(3, "int8"), "missing"),
        (PageFormatError, lambda c: c.convert(0, "int3"), "unknown page format"),
        (PageFormatError, lambda c: c.set_page(0, "int4", np.zeros(7, np.uint8)), "bytes"),
        (PageFormatError, lambda c: c.set_page(0, "bf8", np.zeros(7, np.uint8)), "unknown"),
        (PageIdError, lambda c: c.decode(3), "missing"),
        (PageCapacityError, lambda c: c.grow(1), "never shrinks"),
        (PageCapacityError, lambda c: c.set_length(c.capacity + 1), "outside"),
        (PageIdError, lambda c: c.set_length(c.capacity), "missing"),
    ]


def test_bad_input_is_a_typed_error_and_the_cache_is_unchanged():
    rng = np.random.default_rng(6)
    c = PagedKVCache(H, D, P, 4, formats="float32,int4")
    c.update(*_kv(rng, P + 2), 0)
    for exc, call, word in _bad_calls(rng):
        before = _snapshot(c)
        with pytest.raises(exc, match=word):
            call(c)
        assert _snapshot(c) == before, word
        assert issubclass(exc, PagedCacheError) and issubclass(exc, BackendError)


def test_save_and_restore_decode_identically():
    rng = np.random.default_rng(7)
    c = PagedKVCache(H, D, P, 6, formats="float32,int8,int4,int2")
    c.update(*_kv(rng, 4 * P + 1), 0)
    c.convert(0, "codebook")
    saved = {i: (c.page_format(i), c.page_payload(i).tobytes()) for i in range(c.num_pages)
             if c.page_format(i) is not None}
    r = PagedKVCache(H, D, P, 6, formats="float32,int8,int4,int2")
    for i, (fmt, raw) in saved.items():
        r.set_page(i, fmt, raw)                                  # read-only bytes: copied once
    r.set_length(c.length)
    assert r.page_formats() == c.page_formats() and r.length == c.length and r.nbytes == c.nbytes
    for a, b in zip(r.dense(), c.dense()):
        np.testing.assert_array_equal(a, b)
    q = rng.standard_normal((1, 4, 2, D)).astype(np.float32)
    np.testing.assert_array_equal(r.attend(q), c.attend(q))
    # writable uint8 payloads are held as they are
    own = np.frombuffer(saved[1][1], np.uint8).copy()
    r.set_page(1, saved[1][0], own)
    assert r.buffer_addresses()[1] == own.ctypes.data and r.last.copied_bytes == 0
    k, v = _kv(rng, 1)
    c.update(k, v, c.length)
    r.update(k, v, r.length)
    for a, b in zip(r.dense(), c.dense()):
        np.testing.assert_array_equal(a, b)


def test_truncate_drops_unpublished_tokens_without_touching_payloads():
    rng = np.random.default_rng(8)
    c = PagedKVCache(H, D, P, 4, formats="float32")
    k, v = _kv(rng, P + 3)
    c.update(k, v, 0)
    addrs = c.buffer_addresses()
    c.truncate(P + 1)
    assert c.length == P + 1 and c.buffer_addresses() == addrs
    k2, v2 = _kv(rng, 2)
    c.update(k2, v2, P + 1)
    kk, vv = c.dense()
    np.testing.assert_array_equal(kk[:, P + 1:], k2[0])
    np.testing.assert_array_equal(kk[:, :P + 1], k[0, :, :P + 1])
    with pytest.raises(PageCapacityError):
        c.truncate(c.length + 1)
