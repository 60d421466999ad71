"""Paged grouped-query attention against a float64 numpy reference computed from pages
decoded by the independent numpy codecs; the backend kernels PagedCacheUpdate and
PagedAttention, directly and through InferenceSession."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

from onnxforge.graphbuilder.builder.graph_builder import GraphBuilder
from onnxforge.graphbuilder.ir.core import MUST_ALIAS, READ_WRITE, Alias
from onnxforge.kernels_cy.paged import _paged
from onnxforge.kernels_cy.errors import KernelError, PageCapacityError, PageShapeError
from onnxforge.kernels_cy.ops.base import REGISTRY, NodeSpec
from onnxforge.kernels_cy.paged.pages import PAGE_FORMATS, PagedKVCache
from onnxforge.kernels_cy.runtime.runctx import RunContext
from onnxforge.kernels_cy.runtime.session import InferenceSession
from onnxforge.proto_ext.types import StructType
from tests.kernels_cy import paged_ref as ref

F, I64 = TensorProto.FLOAT, TensorProto.INT64
MIXED = ["float32", "int8", "int4", "int2", "fp8", "codebook", "float16"]


def _filled(rng, hkv: int, d: int, p: int, n: int, formats) -> PagedKVCache:
    c = PagedKVCache(hkv, d, p, -(-n // p) + 1, formats=formats)
    k = rng.standard_normal((1, hkv, n, d)).astype(np.float32)
    v = rng.standard_normal((1, hkv, n, d)).astype(np.float32)
    c.update(k[:, :, :n - 3], v[:, :, :n - 3], 0)
    for t in range(n - 3, n):
        c.update(k[:, :, t:t + 1], v[:, :, t:t + 1], t)
    return c


def _check(c: PagedKVCache, q: np.ndarray, total: int | None = None, **kw) -> None:
    k, v = ref.dense(c)
    if total is not None:
        k, v = k[:, :total], v[:, :total]
    want = ref.attention(q, k, v, kw.get("scale"))
    got = c.attend(q, total, **kw)
    assert got.shape == q.shape and got.dtype == np.float32
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


@pytest.mark.parametrize("fmt", PAGE_FORMATS)
@pytest.mark.parametrize("s", [1, 5])
def test_every_format_matches_the_float64_reference(fmt, s):
    rng = np.random.default_rng(0)
    c = _filled(rng, 4, 64, 16, 77, fmt)
    _check(c, rng.standard_normal((1, 8, s, 64)).astype(np.float32))


def test_a_mixed_cache_matches_the_reference():
    rng = np.random.default_rng(1)
    c = _filled(rng, 2, 32, 8, 8 * len(MIXED) - 2, "float32")
    for i, fmt in enumerate(MIXED):
        c.convert(i, fmt)
    assert c.page_formats()[:len(MIXED)] == MIXED
    for s in (1, 3):
        _check(c, rng.standard_normal((1, 6, s, 32)).astype(np.float32))
    _check(c, rng.standard_normal((1, 2, 1, 32)).astype(np.float32), total=20, scale=0.3)


@pytest.mark.parametrize("hq,hkv", [(4, 4), (40, 2)])
def test_group_sizes_one_and_above_one_pass(hq, hkv):
    rng = np.random.default_rng(2)
    c = _filled(rng, hkv, 32, 4, 30, "float32,int8,int4")
    _check(c, rng.standard_normal((1, hq, 2, 32)).astype(np.float32))


@pytest.mark.parametrize("s", [1, 3])
def test_threads_give_the_same_result(s):
    rng = np.random.default_rng(3)
    c = _filled(rng, 4, 64, 16, 100, "float32,int4")
    q = rng.standard_normal((1, 8, s, 64)).astype(np.float32)
    np.testing.assert_array_equal(c.attend(q, num_threads=2), c.attend(q, num_threads=1))
    _check(c, q, num_threads=2)


def test_workspace_bytes_do_not_depend_on_the_context_length():
    rng = np.random.default_rng(4)
    q = rng.standard_normal((1, 8, 1, 64)).astype(np.float32)
    sizes = []
    for n in (40, 1200):
        c = _filled(rng, 4, 64, 16, n, "int8")
        c.attend(q, num_threads=2)
        sizes.append(c.workspace_bytes)
    assert sizes[0] == sizes[1] == 2 * _paged.workspace_floats(16, 64) * 4
    assert sizes[0] < 2 * 4 * 64 * 16 * 4 * 2 * 4    # far below one full K+V of 1200 tokens


def test_attention_errors_are_typed():
    rng = np.random.default_rng(5)
    c = _filled(rng, 2, 32, 4, 10, "float32")
    q = rng.standard_normal((1, 4, 1, 32)).astype(np.float32)
    with pytest.raises(PageCapacityError):
        c.attend(q, total=11)
    with pytest.raises(PageShapeError):
        c.attend(q.astype(np.float64))
    with pytest.raises(PageShapeError):
        c.attend(rng.standard_normal((1, 3, 1, 32)).astype(np.float32))


# -- backend kernels ------------------------------------------------------------------
def _spec(op: str, n_inputs: int, **attrs) -> NodeSpec:
    return NodeSpec(op, "ai.onnxforge", op, f"/{op}", 1, attrs, n_inputs, 1)


def test_kernels_update_in_place_and_count_only_new_pages():
    rng = np.random.default_rng(6)
    upd = REGISTRY[("ai.onnxforge", "PagedCacheUpdate")](_spec("PagedCacheUpdate", 4))
    att = REGISTRY[("ai.onnxforge", "PagedAttention")](
        _spec("PagedAttention", 2, num_heads=8, kv_num_heads=4, scale=0.2))
    assert upd.fresh is False and upd.uses_context
    c = PagedKVCache(4, 64, 16, 4, formats="float32,int4")
    for t in range(20):
        k, v = (rng.standard_normal((1, 4, 1, 64)).astype(np.float32) for _ in range(2))
        ctx = RunContext()
        mem = ctx.mem
        before = c.page_formats(), c.length
        assert upd.run(ctx, c, k, v, np.array(t, np.int64)) is c
        assert (c.page_formats(), c.length) == before  # staged, not published
        q = rng.standard_normal((1, 8, 1, 64)).astype(np.float32)
        staged = att.run(ctx, q, c)  # the run's attention sees the staged token
        mem.hold(ctx.commit()[0])
        new_page = t % 16 == 0
        expect = c.page_payload(t // 16).nbytes if new_page else 0
        if t == 16:
            expect += c.page_payload(0).nbytes   # page 0 aged into int4
        assert (mem.allocated, mem.copied) == (expect, 0)
        assert c.length == t + 1
        kk, vv = ref.dense(c)
        want = ref.attention(q, kk, vv, 0.2)
        got = att.run(RunContext(), q, c)
        assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
        if t != 16:  # the step that ages page 0 read it before its conversion (KR2 on commit)
            np.testing.assert_array_equal(staged, got)
    with pytest.raises(KernelError, match="PagedKVCache"):
        upd.run(RunContext(), np.zeros(3, np.float32), k, v, np.array(20))
    with pytest.raises(KernelError, match="kv_num_heads"):
        att.run(RunContext(), q, PagedKVCache(2, 64, 16, 2))


def _model():
    """cache (struct category, READ_WRITE) -> PagedCacheUpdate -> PagedAttention."""
    g = GraphBuilder(opset=23)
    cache = g.input("cache", type=StructType(), access=READ_WRITE)
    key = g.input("key", F, [1, 2, "n", 32])
    value = g.input("value", F, [1, 2, "n", 32])
    query = g.input("query", F, [1, 4, "n", 32])
    pos = g.input("position", I64, [])
    upd = g.op.PagedCacheUpdate(cache, key, value, pos)
    g.output(g.op.PagedAttention(query, upd, num_heads=4, kv_num_heads=2), "y")
    g.output(upd, "updated_cache")
    g.bind(cache, "updated_cache")
    model = g.to_model()
    assert model.graph.nodes[0].output_alias == [Alias(0, 0, MUST_ALIAS)]
    assert model.graph.outputs[1].alias_of is model.graph.inputs[0]
    return model


def test_two_steps_through_inference_session():
    rng = np.random.default_rng(7)
    sess = InferenceSession(_model())
    c = PagedKVCache(2, 32, 4, 6, formats="float32,int8,int2")
    pos = 0
    for n in (7, 1, 1, 5):
        feeds = {"cache": c, "position": np.array(pos, np.int64),
                 "key": rng.standard_normal((1, 2, n, 32)).astype(np.float32),
                 "value": rng.standard_normal((1, 2, n, 32)).astype(np.float32),
                 "query": rng.standard_normal((1, 4, n, 32)).astype(np.float32)}
        addrs, before = c.buffer_addresses(), ref.pages(c)
        y, out = sess.run(None, feeds)
        assert out is c and c.length == pos + n
        kk, vv = ref.dense_as_seen(before, c, pos)  # pages aging in this step converted on commit
        pos += n
        want = ref.attention(feeds["query"], kk, vv)
        assert np.abs(y - want).max() <= 1e-5 * np.abs(want).max()
        assert sess.last_run.allocated_bytes == c.last.allocated_bytes + y.nbytes
        assert sess.last_run.copied_bytes == 0
        if c.last.allocated_bytes == 0:  # only the open page traded places with the staging page
            assert len(set(c.buffer_addresses().values()) - set(addrs.values())) <= 1
    assert c.page_formats() == ["int2", "int2", "int8", "float32", None, None]
