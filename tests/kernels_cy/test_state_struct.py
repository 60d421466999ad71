"""A whole structured input retained like a tensor: a ``Cache`` struct value (a dict of
field arrays) or a runtime cache object, held by owner, counted, addressed, published
atomically."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

import onnxforge as of
from onnxforge.graphbuilder.builder.graph_builder import GraphBuilder
from onnxforge.graphbuilder.ir.core import READ_ONLY, READ_WRITE
from onnxforge.kernels_cy.errors import FeedError, StateError, StateInitError
from onnxforge.kernels_cy.runtime.session import InferenceSession
from onnxforge.kernels_cy.runtime.state import make_state
from onnxforge.proto_ext.types import StructType

F = TensorProto.FLOAT


def addr(a: np.ndarray) -> int:
    return int(a.__array_interface__["data"][0])


def _passthrough(access: int = READ_ONLY):
    """cache: struct(Cache) <- cache_next = Identity(cache); y = Relu(x) on the side."""
    g = GraphBuilder(opset=23)
    cache = g.input("cache", type=StructType(name="Cache"), access=access)
    x = g.input("x", F, [2])
    g.output(g.op.Relu(x), "y")
    g.output(g.op.Identity(cache), "cache_next", type=StructType(name="Cache"))
    g.bind(cache, "cache_next")
    return g.to_model()


def _cache() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"key": rng.standard_normal((1, 2, 8, 4), dtype=np.float32),
            "value": rng.standard_normal((1, 2, 8, 4), dtype=np.float32),
            "length": np.array(3, np.int64)}


class PagedLike:
    """The runtime-object protocol the state relies on: nbytes, buffer_addresses(), length."""

    def __init__(self) -> None:
        self.pages = [np.zeros(64, np.uint8), np.zeros(64, np.uint8)]
        self.length = 5

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.pages)

    def buffer_addresses(self) -> dict[int, int]:
        return {i: addr(p) for i, p in enumerate(self.pages)}


X = {"x": np.array([-1.0, 2.0], np.float32)}


def test_the_model_verifies():
    of.verify(_passthrough())


def test_a_struct_value_is_retained_by_owner_counted_and_addressed():
    cache = _cache()
    st = make_state(_passthrough(), initial={"cache": cache})
    want = {f"cache.{k}": addr(a) for k, a in cache.items()}
    assert st.addresses() == want
    for _ in range(3):
        out = st.run(X)
        assert out["cache_next"] is cache  # passed through by owner, never copied
        assert st.addresses() == want
        assert st.last_run.copied_bytes == 0
        assert st.last_run.cache_bytes == st.cache_bytes == sum(a.nbytes for a in cache.values())
    np.testing.assert_array_equal(out["y"], [0.0, 2.0])
    view = st.values["cache"]
    assert set(view) == {"key", "value", "length"}
    assert addr(view["key"]) == addr(cache["key"]) and not view["key"].flags.writeable


def test_a_runtime_cache_object_is_retained_by_owner():
    obj = PagedLike()
    st = make_state(_passthrough(), initial={"cache": obj})
    out = st.run(X)
    assert out["cache_next"] is obj and st.values["cache"] is obj
    assert st.cache_bytes == 128 and st.last_run.cache_bytes == 128
    assert st.addresses() == {"cache[0]": addr(obj.pages[0]), "cache[1]": addr(obj.pages[1])}
    assert st.lengths == {"cache": 5}
    obj.length = 6
    assert st.lengths == {"cache": 6}
    with pytest.raises(StateError, match="runtime object"):
        st.save("unused.npz")


def test_a_failed_run_keeps_the_published_struct_value():
    cache = _cache()
    st = make_state(_passthrough(), initial={"cache": cache})
    st.run(X)
    with pytest.raises(FeedError, match="float64"):
        st.run({"x": np.zeros(2)})
    assert st.addresses() == {f"cache.{k}": addr(a) for k, a in cache.items()}


@pytest.mark.parametrize("bad, word", [
    (lambda: np.zeros(3, np.float32), "dict of field arrays"),
    (lambda: {"key": [1.0]}, "numpy array"),
    (lambda: {"key": np.zeros((4, 4), np.float32)[:, ::2]}, "C-contiguous"),
    (lambda: {"a.b": np.zeros(2, np.float32)}, "without '.'"),
])
def test_struct_initial_values_that_are_not_struct_values_are_rejected(bad, word):
    with pytest.raises(StateInitError, match=word):
        make_state(_passthrough(), initial={"cache": bad()})


def test_a_struct_input_has_no_zero_form():
    with pytest.raises(StateInitError, match="no zero form"):
        make_state(_passthrough())


def test_the_session_passes_struct_feeds_as_they_are_and_rejects_tensors():
    sess = InferenceSession(_passthrough())
    cache = _cache()
    _, nxt = sess.run(None, {"cache": cache, **X})
    assert nxt is cache
    with pytest.raises(FeedError, match="struct value"):
        sess.run(None, {"cache": np.zeros(3, np.float32), **X})


def test_read_write_struct_fields_are_owned_by_one_live_state():
    cache = _cache()
    first = make_state(_passthrough(READ_WRITE), initial={"cache": cache})
    with pytest.raises(StateInitError, match="another live state"):
        make_state(_passthrough(READ_WRITE), initial={"cache": {"key": cache["key"]}})
    ro = _cache()
    ro["value"].flags.writeable = False
    with pytest.raises(StateInitError, match="not writable"):
        make_state(_passthrough(READ_WRITE), initial={"cache": ro})
    first.close()
    second = make_state(_passthrough(READ_WRITE), initial={"cache": cache})
    assert second.run(X)["cache_next"] is cache


def test_save_and_restore_a_struct_value(tmp_path):
    cache = _cache()
    st = make_state(_passthrough(), initial={"cache": cache})
    st.run(X)
    path = tmp_path / "s.npz"
    st.save(path)
    again = make_state(_passthrough(), initial=path)
    got = again.values["cache"]
    assert set(got) == set(cache)
    for k, a in cache.items():
        np.testing.assert_array_equal(got[k], a)
    assert again.run(X)["cache_next"]["length"] == 3
