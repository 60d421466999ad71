"""Initializer deduplication (dense and encoded)."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from onnxforge.graphbuilder.builder.graph_builder import GraphBuilder
from onnxforge.graphbuilder.ir.core import Model, Value
from onnxforge.graphbuilder.serde import to_onnx
from onnxforge.graphbuilder.ir.tensors import Tensor
from onnxforge.passes import DeduplicateInitializersPass
from onnxforge.proto_ext.types import TensorType

from tests.passes.helpers import FLOAT, assert_same_outputs, assert_sound

X = {"x": np.array([1.0, -2.0, 3.0, 0.5], np.float32)}


def test_equal_dense_initializers_merge_and_uses_follow():
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [4])
    a = g.initializer("a", np.array([1, 2, 3, 4], np.float32))
    b = g.initializer("b", np.array([1, 2, 3, 4], np.float32))
    c = g.initializer("c", np.array([1, 2, 3, 5], np.float32))
    g.output(g.op.Sub(g.op.Mul(g.op.Add(x, a), b), c), "y")
    m = g.to_model()
    before = to_onnx(m)
    assert DeduplicateInitializersPass()(m).modified
    assert sorted(m.graph.initializers) == ["a", "c"]
    assert a.num_uses() == 2 and b.num_uses() == 0
    assert_sound(m)
    assert_same_outputs(before, m, X)
    assert not DeduplicateInitializersPass()(m).modified


def test_equal_bytes_with_another_dtype_or_shape_are_not_duplicates():
    g = GraphBuilder(opset=21)
    raw = np.array([1, 2, 3, 4], np.int32)
    g.initializer("i32", raw)
    g.initializer("f32", raw.view(np.float32))
    g.initializer("i32_2x2", raw.reshape(2, 2))
    g.initializer("u8", raw.view(np.uint8))
    x = g.input("x", FLOAT, [4])
    g.output(g.op.Relu(x), "y")
    m = g.to_model()
    assert not DeduplicateInitializersPass()(m).modified
    assert len(m.graph.initializers) == 4


def test_overridable_inputs_are_never_merged_and_outputs_are_kept():
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [4])
    ones = np.ones(4, np.float32)
    plain = g.initializer("plain", ones)
    out_init = g.initializer("as_output", ones)
    g.output(g.op.Add(x, plain), "y")
    m = g.to_model()
    m.graph.outputs.append(out_init)
    default = Value("default", TensorType(FLOAT, (4,)))
    m.graph.add_input(default)
    m.graph.add_initializer(default, Tensor.from_numpy(ones.copy()))
    before = to_onnx(m)
    assert DeduplicateInitializersPass()(m).modified
    assert sorted(m.graph.initializers) == ["as_output", "default"]
    assert list(m.graph)[0].inputs[1] is out_init
    assert_same_outputs(before, m, X)


def _encoded_model() -> Model:
    g = GraphBuilder(opset=21)
    vals = np.linspace(-1, 1, 8, dtype=np.float32)
    g.encoded_initializer("q1", vals, storage_type=TensorProto.INT8)
    g.encoded_initializer("q2", vals, storage_type=TensorProto.INT8)  # same layout and bytes
    q1 = g.model.graph.encoded_initializers["q1"].const.header
    # same codes, other scale: other meaning
    g.encoded_initializer("q3", codes=bytes(q1.raw_data), storage_type=TensorProto.INT8,
                          scale=np.float32(0.5), logical_type=TensorType(FLOAT, (8,)))
    # same codes and scale, other logical shape
    g.encoded_initializer("q4", codes=bytes(q1.raw_data), storage_type=TensorProto.INT8,
                          scale=q1.affine.scale.array(), logical_type=TensorType(FLOAT, (2, 4)))
    ref = g.declare_struct_type("rec", [("a", TensorType(TensorProto.INT8, (8,)))])
    g.encoded_initializer("s1", struct_type=ref, codes=bytes(q1.raw_data))
    g.encoded_initializer("s2", struct_type=ref, codes=bytes(q1.raw_data))
    other = g.declare_struct_type("rec2", [("b", TensorType(TensorProto.UINT8, (8,)))])
    g.encoded_initializer("s3", struct_type=other, codes=bytes(q1.raw_data))
    x = g.input("x", FLOAT, [4])
    g.output(g.op.Relu(x), "y")
    return g.to_model()


def test_encoded_initializers_merge_only_with_the_same_layout_and_logical_type():
    m = _encoded_model()
    assert DeduplicateInitializersPass()(m).modified
    assert sorted(m.graph.encoded_initializers) == ["q1", "q3", "q4", "s1", "s3"]
    assert len(m.struct_types) == 2
    assert_sound(m)


def _counting(reads: list[str]) -> type:
    """A Tensor class that records the name of every tensor whose payload is read whole."""

    class Counting(Tensor):
        __slots__ = ()

        def tobytes(self):
            reads.append(self.name)
            return super().tobytes()

    return Counting


def test_only_candidates_are_read_and_each_payload_is_hashed_once():
    reads: list[str] = []
    Counting = _counting(reads)

    g = GraphBuilder(opset=21)
    for name, arr in (("u1", np.zeros(3, np.float32)), ("u2", np.zeros(5, np.float32)),
                      ("d1", np.ones(4, np.float32)), ("d2", np.ones(4, np.float32))):
        g.initializer(name, Counting(TensorProto.FLOAT, arr.shape, array=arr))
    x = g.input("x", FLOAT, [4])
    g.output(g.op.Relu(x), "y")
    m = g.to_model()
    DeduplicateInitializersPass()(m)
    assert sorted(reads) == ["d1", "d2"]
    assert sorted(m.graph.initializers) == ["d1", "u1", "u2"]


def test_subgraph_initializers_are_deduplicated_in_their_graph():
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [4])
    cond = g.input("c", TensorProto.BOOL, [])
    then_b, else_b = g.subgraph("then"), g.subgraph("else")
    k1 = then_b.initializer("k1", np.full(4, 3.0, np.float32))
    k2 = then_b.initializer("k2", np.full(4, 3.0, np.float32))
    t = then_b.op.Add(then_b.op.Mul(x, k1), k2)
    t.type = TensorType(FLOAT, (4,))
    then_b.graph.outputs.append(t)
    e = else_b.op.Neg(x)
    e.type = TensorType(FLOAT, (4,))
    else_b.graph.outputs.append(e)
    g.output(g.op.If(cond, then_branch=then_b, else_branch=else_b), "y", type=TensorType(FLOAT, (4,)))
    m = g.to_model()
    before = to_onnx(m)
    assert DeduplicateInitializersPass()(m).modified
    assert list(then_b.graph.initializers) == ["k1"]
    for flag in (True, False):
        assert_same_outputs(before, m, {**X, "c": np.array(flag)})


def test_payloads_whose_ends_differ_are_never_read_whole_and_middles_still_count():
    reads: list[str] = []
    Counting = _counting(reads)

    base = np.arange(1000, dtype=np.float32)
    middle = base.copy()
    middle[500] = -1.0  # same first and last 32 bytes as base
    other_end = base.copy()
    other_end[-1] = -1.0
    g = GraphBuilder(opset=21)
    for name, arr in (("a", base), ("b", middle), ("c", other_end), ("d", base.copy())):
        g.initializer(name, Counting(TensorProto.FLOAT, arr.shape, array=arr))
    # the same values as raw little-endian bytes (the loader's form) merge with the array form
    g.initializer("e", Tensor(TensorProto.FLOAT, base.shape, raw=base.tobytes()))
    x = g.input("x", FLOAT, [1000])
    y = x
    for name in "abcde":
        y = g.op.Add(y, next(v for v in g.graph.all_initializers() if v.name == name))
    g.output(y, "y")
    m = g.to_model()
    before = to_onnx(m)
    reads.clear()  # serializing read every payload
    assert DeduplicateInitializersPass()(m).modified
    assert sorted(m.graph.initializers) == ["a", "b", "c"]
    assert "c" not in reads and sorted(set(reads)) == ["a", "b", "d"]
    assert_same_outputs(before, m, {"x": np.linspace(-1, 1, 1000, dtype=np.float32)})


def test_serialized_payloads_are_probed_so_three_of_a_shape_need_no_hash(monkeypatch):
    # float_data payloads (as Paddle writes them) have no raw bytes: their probes come from
    # the parsed arrays, so two equal ones are compared directly and the third is left out
    import hashlib

    from onnx import helper

    hashed: list[int] = []
    blake2b = hashlib.blake2b
    monkeypatch.setattr(hashlib, "blake2b", lambda data, **kw: hashed.append(len(data)) or blake2b(data, **kw))
    base = np.arange(100, dtype=np.float32)
    other = base.copy()
    other[0] = -1.0
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [100])
    y = x
    for name, arr in (("a", base), ("b", base), ("c", other)):
        proto = helper.make_tensor(name, TensorProto.FLOAT, arr.shape, arr.tolist()).SerializeToString()
        y = g.op.Add(y, g.initializer(name, Tensor(TensorProto.FLOAT, arr.shape, proto=proto)))
    g.output(y, "y")
    m = g.to_model()
    before = to_onnx(m)
    assert DeduplicateInitializersPass()(m).modified
    assert sorted(m.graph.initializers) == ["a", "c"] and hashed == []
    assert_same_outputs(before, m, {"x": np.linspace(-1, 1, 100, dtype=np.float32)})
