"""InferenceSession: feeds, typed errors, introspection, counters, views and aliases."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from onnxforge.graphbuilder.builder.graph_builder import GraphBuilder
from onnxforge.graphbuilder.ir.core import READ_WRITE
from onnxforge.kernels_cy.runtime._buffers import buffer_address
from onnxforge.kernels_cy.errors import BackendError, FeedError
from onnxforge.kernels_cy.runtime.session import InferenceSession, RunCounters
from tests.kernels_cy.helpers import F, I64, onnx_model, tensor


def _relu_add() -> InferenceSession:
    m = onnx_model([helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Add", ["y", "x"], ["z"])],
                   [tensor("x", F, ["batch", 8])], [tensor("z", F, ["batch", 8])])
    return InferenceSession(m)


def test_runs_like_onnxruntime_and_returns_a_list():
    s = _relu_add()
    x = np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8)
    out = s.run(None, {"x": x})
    assert isinstance(out, list) and len(out) == 1
    np.testing.assert_array_equal(out[0], np.maximum(x, 0) + x)
    assert s.run(["z"], {"x": x})[0].shape == (4, 8)


def test_get_inputs_and_outputs_describe_types_and_symbolic_shapes():
    s = _relu_add()
    (i,), (o,) = s.get_inputs(), s.get_outputs()
    assert (i.name, i.type, i.shape) == ("x", "tensor(float)", ["batch", 8])
    assert (o.name, o.type, o.shape) == ("z", "tensor(float)", ["batch", 8])


@pytest.mark.parametrize("feeds, words", [
    ({}, ["missing", "'x'"]),
    ({"x": np.zeros((2, 8), np.float32), "nope": np.zeros(1)}, ["unknown", "nope"]),
    ({"x": np.zeros((2, 8), np.float64)}, ["'x'", "float64", "float32"]),
    ({"x": np.zeros((2, 8, 1), np.float32)}, ["'x'", "rank 3"]),
    ({"x": np.zeros((2, 7), np.float32)}, ["'x'", "dimension 1 is 7", "declares 8"]),
])
def test_feed_errors_are_typed_and_name_the_input(feeds, words):
    s = _relu_add()
    with pytest.raises(FeedError) as exc:
        s.run(None, feeds)
    assert isinstance(exc.value, BackendError) and isinstance(exc.value, ValueError)
    for w in words:
        assert w in str(exc.value)


def test_unknown_output_name_is_a_typed_error():
    with pytest.raises(FeedError, match="unknown output"):
        _relu_add().run(["w"], {"x": np.zeros((1, 8), np.float32)})


def test_counters_are_exact_for_fresh_outputs_and_views():
    # y = Relu(x) [4, 8]; r = Reshape(y) (a view: no bytes); t = Transpose(r) (new); z = Add(t, 1)
    nodes = [helper.make_node("Relu", ["x"], ["y"]),
             helper.make_node("Reshape", ["y", "shape"], ["r"]),
             helper.make_node("Transpose", ["r"], ["t"], perm=[1, 0]),
             helper.make_node("Add", ["t", "one"], ["z"])]
    inits = [helper.make_tensor("shape", I64, [2], [8, 4]), helper.make_tensor("one", F, [], [1.0])]
    s = InferenceSession(onnx_model(nodes, [tensor("x", F, [4, 8])], [tensor("z", F, [4, 8])],
                                    initializers=inits))
    z, = s.run(None, {"x": np.ones((4, 8), np.float32)})
    np.testing.assert_array_equal(z, np.full((4, 8), 2, np.float32))
    assert s.last_run == RunCounters(allocated_bytes=3 * 128, copied_bytes=0, peak_bytes=s.last_run.peak_bytes)
    assert 2 * 128 <= s.last_run.peak_bytes <= 3 * 128


def test_reshape_of_a_non_contiguous_view_is_materialized_and_counted():
    # Slice with unit steps is a view; reshaping the strided view needs one copy
    nodes = [helper.make_node("Slice", ["x", "st", "en", "ax"], ["v"]),
             helper.make_node("Reshape", ["v", "shape"], ["r"]),
             helper.make_node("Neg", ["r"], ["z"])]
    inits = [helper.make_tensor("st", I64, [1], [0]), helper.make_tensor("en", I64, [1], [4]),
             helper.make_tensor("ax", I64, [1], [1]), helper.make_tensor("shape", I64, [1], [16])]
    s = InferenceSession(onnx_model(nodes, [tensor("x", F, [4, 8])], [tensor("z", F, [16])],
                                    initializers=inits))
    x = np.arange(32, dtype=np.float32).reshape(4, 8)
    z, = s.run(None, {"x": x})
    np.testing.assert_array_equal(z, -x[:, :4].reshape(16))
    assert s.last_run.copied_bytes == 64
    assert s.last_run.allocated_bytes == 64 + 64  # the copy and Neg's output


def test_views_are_zero_copy():
    nodes = [helper.make_node("Unsqueeze", ["x", "ax"], ["u"]),
             helper.make_node("Squeeze", ["u", "ax"], ["q"]),
             helper.make_node("Flatten", ["q"], ["f"], axis=1),
             helper.make_node("Identity", ["f"], ["z"])]
    s = InferenceSession(onnx_model(nodes, [tensor("x", F, [4, 8])], [tensor("z", F, [4, 8])],
                                    initializers=[helper.make_tensor("ax", I64, [1], [0])]))
    x = np.ones((4, 8), np.float32)
    z, = s.run(None, {"x": x})
    assert np.shares_memory(z, x)
    assert s.last_run == RunCounters(0, 0, 0)


def _cache_model(read_after_write: bool = False):
    g = GraphBuilder(opset=23)
    cache = g.input("cache", TensorProto.FLOAT, [1, 8, 4], access=READ_WRITE)
    values = g.input("values", TensorProto.FLOAT, [1, 2, 4])
    pos = g.input("pos", TensorProto.INT64, [])
    y = g.op.Identity(cache) if read_after_write else None
    upd = g.op.CacheUpdate(cache, values, pos)
    g.output(upd, "updated")
    if read_after_write:
        g.output(g.op.Add(y, g.op.ReduceSum(upd, keepdims=1)), "z")
    return g.to_model()


def test_cache_update_writes_in_place_and_returns_the_callers_buffer():
    s = InferenceSession(_cache_model())
    cache = np.zeros((1, 8, 4), np.float32)
    values = np.ones((1, 2, 4), np.float32)
    out, = s.run(None, {"cache": cache, "values": values, "pos": np.array(3, np.int64)})
    assert out is cache and buffer_address(out) == buffer_address(cache)
    assert cache[0, 3:5].sum() == 8 and cache.sum() == 8
    assert s.last_run == RunCounters(0, 0, 0)


@pytest.mark.parametrize("bad, word", [
    (lambda c: c.astype(np.float64), "float64"),
    (lambda c: np.zeros((1, 8, 8), np.float32)[:, :, :4], "C-contiguous"),
    (lambda c: _readonly(c), "not writable"),
])
def test_read_write_input_is_checked_before_any_write(bad, word):
    s = InferenceSession(_cache_model())
    cache = bad(np.zeros((1, 8, 4), np.float32))
    values = np.ones((1, 2, 4), np.float32)
    with pytest.raises(FeedError, match=word):
        s.run(None, {"cache": cache, "values": values, "pos": np.array(0, np.int64)})
    assert not np.any(cache)


def _readonly(c: np.ndarray) -> np.ndarray:
    v = c.view()
    v.flags.writeable = False
    return v


def test_position_past_capacity_fails_before_writing():
    s = InferenceSession(_cache_model())
    cache = np.zeros((1, 8, 4), np.float32)
    with pytest.raises(BackendError, match="capacity"):
        s.run(None, {"cache": cache, "values": np.ones((1, 2, 4), np.float32), "pos": np.array(7, np.int64)})
    assert not np.any(cache)


def test_a_view_read_after_the_write_is_materialized_before_it():
    s = InferenceSession(_cache_model(read_after_write=True))
    cache = np.full((1, 8, 4), 2.0, np.float32)
    before = cache.copy()
    values = np.ones((1, 2, 4), np.float32)
    upd, z = s.run(None, {"cache": cache, "values": values, "pos": np.array(0, np.int64)})
    assert upd is cache
    after = before.copy()
    after[0, 0:2] = 1
    np.testing.assert_array_equal(z, before + after.sum())  # y is version 0 of the cache
    assert s.last_run.copied_bytes == cache.nbytes
    assert s.last_run.allocated_bytes == cache.nbytes + 4 + cache.nbytes  # copy, ReduceSum, Add


def test_threads_bound_the_run_and_bad_values_are_refused():
    s = InferenceSession(_relu_add().model, threads=1)
    assert s.run(None, {"x": np.ones((1, 8), np.float32)})[0].sum() == 16
    with pytest.raises(BackendError, match="threads"):
        InferenceSession(_relu_add().model, threads=0)


def test_accepts_bytes_and_paths(tmp_path):
    m = onnx_model([helper.make_node("Neg", ["x"], ["y"])], [tensor("x", F, [2])], [tensor("y", F, [2])])
    p = tmp_path / "m.onnx"
    p.write_bytes(m.SerializeToString())
    for src in (m, m.SerializeToString(), str(p), p):
        assert InferenceSession(src).run(None, {"x": np.ones(2, np.float32)})[0].tolist() == [-1, -1]
    with pytest.raises(BackendError):
        InferenceSession(42)
