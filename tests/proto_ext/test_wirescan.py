"""Wire scanner: strip inline payloads without copies, stream them back byte-identically."""
from __future__ import annotations

import glob
import io
import json
import mmap
import os
import subprocess
import sys
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxforge.errors import WireError
from onnxforge.proto_ext import schema
from onnxforge.proto_ext.wirescan import (
    KIND_ENCODED,
    KIND_INITIALIZER,
    PayloadRef,
    StrippedModel,
    payload_views,
    strip_payloads,
    write_model,
)
from tests.proto_ext.helpers import (
    encoded,
    model_with,
    spec_catalogue,
    tensor_type,
)

DATA_DIR = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")
BACKEND_MODELS = sorted(glob.glob(os.path.join(DATA_DIR, "*", "*", "model.onnx")))


# --------------------------------------------------------------------------- helpers


def roundtrip(data: Any, min_size: int) -> tuple[StrippedModel, bytes]:
    """Strip ``data`` and write it back; return (stripped, written bytes)."""
    stripped = strip_payloads(data, min_size=min_size)
    views = payload_views(data, stripped)
    out = io.BytesIO()
    n = write_model(out, stripped.skeleton, views)
    for v in views.values():
        v.release()
    assert n == len(out.getvalue())
    return stripped, out.getvalue()


def reattached(cls: Any, data: bytes, stripped: StrippedModel) -> Any:
    """Parse the skeleton with ``cls`` and set every stripped raw_data back from ``data``."""
    msg = cls()
    msg.ParseFromString(stripped.skeleton)
    for ref in stripped.payloads:
        if ref.kind == KIND_INITIALIZER:
            target = msg.graph.initializer[ref.index]
        else:
            target = msg.graph.encoded_initializer[ref.index]
        assert not target.HasField("raw_data")
        target.raw_data = data[ref.offset:ref.offset + ref.length]
    return msg


def tensor(name: str, nbytes: int, seed: int = 0) -> TensorProto:
    """A uint8 initializer with ``nbytes`` of raw_data."""
    arr = np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)
    return numpy_helper.from_array(arr, name)


def ext_model() -> Any:
    """An extended model: struct types, encoded initializers (inline and external),
    dense initializers of several sizes, persistent bindings, a subgraph with its own
    large initializer and a local function."""
    big_sub = tensor("sub_w", 4096, seed=9)
    then_g = helper.make_graph([helper.make_node("Identity", ["sub_w"], ["t_out"])], "then", [],
                               [helper.make_tensor_value_info("t_out", TensorProto.UINT8, [4096])],
                               [big_sub])
    else_g = helper.make_graph([helper.make_node("Identity", ["sub_w"], ["e_out"])], "else", [],
                               [helper.make_tensor_value_info("e_out", TensorProto.UINT8, [4096])],
                               [big_sub])
    if_node = helper.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g)
    fn = helper.make_function("local", "F", ["a"], ["b"],
                              [helper.make_node("Identity", ["a"], ["b"])],
                              [helper.make_opsetid("", 23)])
    fp = TensorProto.FLOAT
    return model_with(
        struct_types=spec_catalogue(),
        encoded=[
            encoded("q0", type_ref=2001, raw_data=bytes(range(256)) * 10,
                    logical=tensor_type(fp, [4096])),
            encoded("q1", type_ref=2001, raw_data=b"\x01" * 20, logical=tensor_type(fp, [32])),
            encoded("q2", type_ref=1002, external=[("location", "w.bin"), ("offset", "0")],
                    logical=tensor_type(fp, [128])),
            encoded("q3", type_ref=1101, raw_data=bytes(range(200)) * 20,
                    logical=tensor_type(fp, [32 * 500])),
        ],
        initializers=[tensor("w0", 3000, 1), tensor("w1", 10, 2), tensor("w2", 1024, 3),
                      tensor("w3", 1023, 4)],
        inputs=[("cond", tensor_type(TensorProto.BOOL, [])),
                ("past", tensor_type(fp, ["n"]))],
        outputs=[("y", tensor_type(TensorProto.UINT8, [4096])),
                 ("present", tensor_type(fp, ["n"]))],
        nodes=[if_node, helper.make_node("Identity", ["past"], ["present"])],
        functions=[fn],
        bindings=[("past", "present")],
    )


def chain_model_bytes(n: int) -> bytes:
    """A serialized chain of ``n`` nodes over float32[64] with an initializer (256 bytes)
    every fourth node and a Constant node value every fourth node."""
    m = onnx.ModelProto(ir_version=10)
    m.opset_import.add(domain="", version=21)
    g = m.graph
    g.name = "chain"
    vals = [numpy_helper.from_array(np.full(64, 1.0 + k / 1000, np.float32)).raw_data
            for k in range(10)]
    prev = "x"
    for i in range(n):
        out = f"t{i}"
        if i % 4 == 1:
            init = g.initializer.add(name=f"C{i}", data_type=TensorProto.FLOAT, dims=[64])
            init.raw_data = vals[i % 10]
            g.node.add(op_type="Add", input=[prev, f"C{i}"], output=[out], name=f"n{i}")
        elif i % 4 == 2:
            node = g.node.add(op_type="Constant", output=[out], name=f"c{i}")
            attr = node.attribute.add(name="value", type=onnx.AttributeProto.TENSOR)
            attr.t.data_type = TensorProto.FLOAT
            attr.t.dims.append(64)
            attr.t.raw_data = vals[(i * 7) % 10]
        else:
            g.node.add(op_type="Identity", input=[prev], output=[out], name=f"n{i}")
        prev = out
    g.input.append(helper.make_tensor_value_info("x", TensorProto.FLOAT, [64]))
    g.output.append(helper.make_tensor_value_info(prev, TensorProto.FLOAT, [64]))
    return m.SerializeToString()


# --------------------------------------------------------------------------- (a) onnx backend data


def test_backend_data_present() -> None:
    assert len(BACKEND_MODELS) >= 100


@pytest.mark.parametrize("min_size", [0, 1024])
@pytest.mark.parametrize("path", BACKEND_MODELS,
                         ids=[os.path.relpath(p, DATA_DIR) for p in BACKEND_MODELS])
def test_backend_models_roundtrip(path: str, min_size: int) -> None:
    data = Path(path).read_bytes()
    original = onnx.ModelProto()
    original.ParseFromString(data)
    stripped, written = roundtrip(data, min_size)
    assert written == data
    skel = onnx.ModelProto()
    skel.ParseFromString(stripped.skeleton)
    refs = {r.index: r for r in stripped.payloads}
    assert all(r.kind == KIND_INITIALIZER for r in stripped.payloads)
    assert len(skel.graph.initializer) == len(original.graph.initializer)
    for i, (t_skel, t_orig) in enumerate(zip(skel.graph.initializer, original.graph.initializer)):
        expect_stripped = t_orig.HasField("raw_data") and len(t_orig.raw_data) >= min_size
        assert (i in refs) == expect_stripped
        if expect_stripped:
            assert not t_skel.HasField("raw_data")
            assert data[refs[i].offset:refs[i].offset + refs[i].length] == t_orig.raw_data
            assert refs[i].length == len(t_orig.raw_data)
        else:
            assert t_skel == t_orig
    assert len(stripped.skeleton) == len(data) - sum(
        r.length + 1 + len(_varint(r.length)) for r in stripped.payloads) - _prefix_shrink(
        original, stripped)
    assert reattached(onnx.ModelProto, data, stripped) == original


def _varint(v: int) -> bytes:
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def _prefix_shrink(original: onnx.ModelProto, stripped: StrippedModel) -> int:
    """Bytes saved by shorter length prefixes of the rewritten initializers and graph."""
    saved = 0
    if not stripped.payloads:
        return 0
    for ref in stripped.payloads:
        t = original.graph.initializer[ref.index]
        old = t.ByteSize()
        new = old - ref.length - 1 - len(_varint(ref.length))
        saved += len(_varint(old)) - len(_varint(new))
    g_old = original.graph.ByteSize()
    g_new = g_old - sum(r.length + 1 + len(_varint(r.length)) for r in stripped.payloads) - saved
    return saved + len(_varint(g_old)) - len(_varint(g_new))


def test_backend_skeletons_hold_only_non_payload_bytes() -> None:
    total_payload = total_skeleton = total = expected_payload = 0
    for path in BACKEND_MODELS:
        data = Path(path).read_bytes()
        model = onnx.ModelProto()
        model.ParseFromString(data)
        expected_payload += sum(len(t.raw_data) for t in model.graph.initializer)
        stripped = strip_payloads(data, min_size=0)
        total += len(data)
        total_payload += stripped.payload_bytes
        total_skeleton += len(stripped.skeleton)
    assert total_payload == expected_payload > 0
    assert total_skeleton + total_payload < total


# --------------------------------------------------------------------------- (b) extensions


@pytest.mark.parametrize("min_size", [0, 1024, 4096])
def test_extended_model_roundtrip(min_size: int) -> None:
    model = ext_model()
    data = model.SerializeToString()
    stripped, written = roundtrip(data, min_size)
    assert written == data
    assert reattached(schema.ModelProto, data, stripped) == model

    expected = {(KIND_INITIALIZER, i) for i, t in enumerate(model.graph.initializer)
                if len(t.raw_data) >= min_size}
    expected |= {(KIND_ENCODED, i) for i, e in enumerate(model.graph.encoded_initializer)
                 if e.HasField("raw_data") and len(e.raw_data) >= min_size}
    assert {r.key for r in stripped.payloads} == expected

    skel = schema.parse_model(stripped.skeleton)
    # extension content survives in the skeleton
    assert [s.type_id for s in skel.struct_types] == [2001, 1003, 1002, 1101, 1102]
    assert [(b.input_name, b.output_name) for b in skel.graph.persistent_bindings] == [
        ("past", "present")]
    assert skel.graph.encoded_initializer[2].external_data[0].value == "w.bin"
    # subgraph initializers stay inline whatever min_size is
    then_branch = skel.graph.node[0].attribute[0].g
    assert len(then_branch.initializer[0].raw_data) == 4096
    assert skel.functions[0].name == "F"


def test_extended_model_roundtrip_as_stock_onnx() -> None:
    """Serialized by stock onnx, the extensions are unknown fields placed after the
    known ones; the round trip is still byte-identical."""
    stock = schema.to_onnx(ext_model())
    data = stock.SerializeToString()
    stripped, written = roundtrip(data, 0)
    assert written == data
    assert KIND_ENCODED in {r.kind for r in stripped.payloads}
    assert reattached(schema.ModelProto, data, stripped) == schema.parse_model(data)


def test_encoded_payload_refs_point_at_the_payload() -> None:
    model = ext_model()
    data = model.SerializeToString()
    stripped = strip_payloads(data, min_size=100)
    views = payload_views(data, stripped)
    assert set(views) == {(KIND_INITIALIZER, 0), (KIND_INITIALIZER, 2), (KIND_INITIALIZER, 3),
                          (KIND_ENCODED, 0), (KIND_ENCODED, 3)}
    assert views[(KIND_ENCODED, 0)] == model.graph.encoded_initializer[0].raw_data
    assert views[(KIND_ENCODED, 3)] == model.graph.encoded_initializer[3].raw_data
    assert views[(KIND_INITIALIZER, 3)] == model.graph.initializer[3].raw_data
    assert all(v.readonly for v in views.values())


def test_min_size_boundary() -> None:
    data = model_with(initializers=[tensor("a", 1024), tensor("b", 1023)]).SerializeToString()
    stripped = strip_payloads(data)
    assert [(r.kind, r.index, r.length) for r in stripped.payloads] == [(KIND_INITIALIZER, 0, 1024)]
    assert len(stripped.skeleton) < len(data) - 1024


def test_no_payloads_returns_model_unchanged() -> None:
    data = model_with(initializers=[tensor("a", 8)]).SerializeToString()
    stripped = strip_payloads(data)
    assert stripped.skeleton == data and stripped.payloads == []
    out = io.BytesIO()
    assert write_model(out, data, {}) == len(data)
    assert out.getvalue() == data


def test_payload_views_are_zero_copy() -> None:
    data = bytearray(model_with(initializers=[tensor("a", 5000)]).SerializeToString())
    stripped = strip_payloads(data)
    (ref,) = stripped.payloads
    view = payload_views(data, stripped)[ref.key]
    base = np.frombuffer(data, np.uint8).ctypes.data
    assert np.frombuffer(view, np.uint8).ctypes.data == base + ref.offset
    assert view.readonly
    data[ref.offset] ^= 0xFF  # the view sees the buffer's bytes
    assert view[0] == data[ref.offset]


def test_payload_views_rejects_foreign_refs() -> None:
    bogus = StrippedModel(b"", [PayloadRef(KIND_INITIALIZER, 0, 10, 100)])
    with pytest.raises(WireError, match="outside the data"):
        payload_views(b"\x00" * 50, bogus)


# --------------------------------------------------------------------------- write_model


def test_write_model_inserts_raw_data_in_field_order() -> None:
    t = TensorProto(name="w", data_type=TensorProto.UINT8, dims=[4], doc_string="doc")
    t.external_data.add(key="k", value="v")  # field 13, after raw_data
    t.metadata_props.add(key="m", value="n")  # field 16
    m = onnx.ModelProto(ir_version=10)
    m.graph.initializer.append(t)
    ev = schema.EncodedValueProto(name="e")  # fields 3 (logical_type), 6, 7 around raw_data 4
    ev.logical_type.CopyFrom(tensor_type(TensorProto.FLOAT, [2]))
    ev.data_location = 0
    skeleton_model = schema.from_onnx(m)
    skeleton_model.graph.encoded_initializer.append(ev)
    skeleton = skeleton_model.SerializeToString()

    payloads = {(KIND_INITIALIZER, 0): np.arange(4, dtype=np.uint8),
                (KIND_ENCODED, 0): bytearray(b"\x00\x01" * 200)}
    out = io.BytesIO()
    n = write_model(out, skeleton, payloads)
    full = schema.ModelProto()
    full.CopyFrom(skeleton_model)
    full.graph.initializer[0].raw_data = bytes(range(4))
    full.graph.encoded_initializer[0].raw_data = b"\x00\x01" * 200
    assert out.getvalue() == full.SerializeToString()
    assert n == full.ByteSize()


class _Recorder(io.RawIOBase):
    """A raw file that records each write call and accepts at most ``limit`` bytes per call."""

    def __init__(self, limit: int | None = None) -> None:
        self.calls: list[int] = []
        self.buf = bytearray()
        self.limit = limit

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        with memoryview(b) as mv:
            chunk = mv.cast("B")[: self.limit] if self.limit else mv.cast("B")
            self.calls.append(len(chunk))
            self.buf += chunk
            return len(chunk)


def test_write_model_writes_payloads_directly_and_handles_short_writes() -> None:
    data = model_with(initializers=[tensor("a", 50_000), tensor("b", 3), tensor("c", 70_000)]
                      ).SerializeToString()
    stripped = strip_payloads(data)
    rec = _Recorder()
    assert write_model(rec, stripped.skeleton, payload_views(data, stripped)) == len(data)
    assert bytes(rec.buf) == data
    assert 50_000 in rec.calls and 70_000 in rec.calls  # one call per payload
    short = _Recorder(limit=4096)
    assert write_model(short, stripped.skeleton, payload_views(data, stripped)) == len(data)
    assert bytes(short.buf) == data


def test_write_model_errors_write_nothing() -> None:
    data = model_with(initializers=[tensor("a", 2000)]).SerializeToString()
    stripped = strip_payloads(data)
    out = io.BytesIO()
    with pytest.raises(WireError, match=r"initializer\[1\]"):
        write_model(out, stripped.skeleton, {(KIND_INITIALIZER, 1): b"x"})
    with pytest.raises(WireError, match=r"encoded\[0\]"):
        write_model(out, stripped.skeleton, {(KIND_ENCODED, 0): b"x"})
    with pytest.raises(WireError, match="already holds raw_data"):
        write_model(out, data, {(KIND_INITIALIZER, 0): b"x"})
    with pytest.raises(ValueError, match="payload key"):
        write_model(out, stripped.skeleton, {("dense", 0): b"x"})
    with pytest.raises(TypeError, match="bytes-like"):
        write_model(out, stripped.skeleton,
                    {(KIND_INITIALIZER, 0): "text"})  # type: ignore[dict-item]
    with pytest.raises(WireError):
        write_model(out, stripped.skeleton[:-3], {(KIND_INITIALIZER, 0): b"x"})
    assert out.getvalue() == b""


# --------------------------------------------------------------------------- wire details


def test_duplicate_raw_data_fields_keep_protobuf_semantics() -> None:
    """A scalar field written twice: protobuf keeps the last one; both are stripped."""
    t = TensorProto(name="w", data_type=TensorProto.UINT8, dims=[2000])
    first = TensorProto(raw_data=b"\x07" * 1500).SerializeToString()
    last = TensorProto(raw_data=b"\x09" * 2000).SerializeToString()
    t_bytes = t.SerializeToString() + first + last
    graph = b"\x2a" + _varint(len(t_bytes)) + t_bytes  # GraphProto.initializer (5)
    data = b"\x08\x0a" + b"\x3a" + _varint(len(graph)) + graph
    stripped = strip_payloads(data)
    (ref,) = stripped.payloads
    assert data[ref.offset:ref.offset + ref.length] == b"\x09" * 2000
    parsed = onnx.ModelProto()
    parsed.ParseFromString(data)
    assert reattached(onnx.ModelProto, data, stripped) == parsed


def test_out_of_order_fields_round_trip_semantically() -> None:
    """Bytes not written in field order: the written model parses to the same message."""
    t_bytes = (TensorProto(doc_string="late").SerializeToString()
               + TensorProto(raw_data=b"\x05" * 3000).SerializeToString()
               + TensorProto(name="w", dims=[3000], data_type=2).SerializeToString())
    graph = b"\x2a" + _varint(len(t_bytes)) + t_bytes
    data = b"\x3a" + _varint(len(graph)) + graph + b"\x08\x0a"
    stripped, written = roundtrip(data, 1024)
    a, b = onnx.ModelProto(), onnx.ModelProto()
    a.ParseFromString(data)
    b.ParseFromString(written)
    assert a == b and len(written) == len(data)


def test_graph_written_twice_merges_with_continuing_indices() -> None:
    """Protobuf merges a repeated occurrence of ``graph``; indices continue across them."""
    g1 = onnx.GraphProto(initializer=[tensor("a", 1500, 1)]).SerializeToString()
    g2 = onnx.GraphProto(initializer=[tensor("b", 1600, 2)]).SerializeToString()
    data = b"\x3a" + _varint(len(g1)) + g1 + b"\x3a" + _varint(len(g2)) + g2
    stripped, written = roundtrip(data, 1024)
    assert [(r.index, r.length) for r in stripped.payloads] == [(0, 1500), (1, 1600)]
    assert written == data
    parsed = onnx.ModelProto()
    parsed.ParseFromString(data)
    assert reattached(onnx.ModelProto, data, stripped) == parsed


def test_all_wire_types_are_skipped() -> None:
    """Unknown fields of wire types 0, 1, 2 and 5 at every scanned level."""
    # fields 1000 (varint), 1001 (fixed64), 1002 (fixed32), 1010 (length-delimited)
    extra = b"\xc0\x3e\x96\x01" + b"\xc9\x3e" + b"\x11" * 8 + b"\xd5\x3e" + b"\x22" * 4 \
        + b"\x92\x3f\x02ab"
    t = tensor("w", 1500).SerializeToString() + extra
    graph = extra + b"\x2a" + _varint(len(t)) + t + extra
    data = extra + b"\x3a" + _varint(len(graph)) + graph + extra
    stripped, written = roundtrip(data, 0)
    assert written == data
    assert [r.length for r in stripped.payloads] == [1500]


# --------------------------------------------------------------------------- (d) malformed


def _model_around(graph: bytes) -> bytes:
    return b"\x08\x0a\x3a" + _varint(len(graph)) + graph


@pytest.mark.parametrize("data, match", [
    (b"\x08", "truncated varint"),                                  # model: varint value missing
    (b"\x08\x80", "truncated varint"),                              # model: varint cut off
    (b"\x80", "truncated varint"),                                  # model: key cut off
    (b"\x08" + b"\xff" * 11, "longer than 10 bytes"),
    (b"\x3a\x05\x00", "runs past the end"),                         # model: graph too long
    (b"\x3a\x80", "truncated varint"),                              # model: length cut off
    (b"\x0b\x0c", "group wire type 3"),                             # model: start group
    (b"\x0c", "group wire type 4"),                                 # model: end group
    (b"\x0e", "invalid wire type 6"),
    (b"\x02\x00", "field number 0"),
    (b"\x09\x00\x00", "truncated fixed-width"),                     # fixed64 cut off
    (b"\x0d\x00", "truncated fixed-width"),                         # fixed32 cut off
    (_model_around(b"\x0a\x05ab"), "runs past the end"),            # graph: node too long
    (_model_around(b"\x2a\x02\x08"), "runs past the end"),          # graph: init past graph end
    (_model_around(b"\x13"), "group wire type 3"),                  # graph: group
    (_model_around(b"\x10"), "truncated varint"),                   # graph: varint cut off
    (_model_around(b"\x2a\x04\x4a\x05ab"), "runs past the end"),    # tensor: raw_data too long
    (_model_around(b"\x2a\x02\x0b\x00"), "group wire type 3"),      # tensor: group
    (_model_around(b"\x2a\x01\x08"), "truncated varint"),           # tensor: dims cut off
    (_model_around(b"\xc2\x3e\x03\x22\x05a"), "runs past the end"),  # encoded: raw_data too long
])
def test_malformed_inputs_raise_wire_error(data: bytes, match: str) -> None:
    with pytest.raises(WireError, match=match):
        strip_payloads(data, min_size=0)


def test_truncated_real_model_raises() -> None:
    data = model_with(initializers=[tensor("a", 3000)]).SerializeToString()
    for cut in (1, 5, len(data) // 2, len(data) - 1):
        with pytest.raises(WireError):
            strip_payloads(data[:cut])


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="min_size"):
        strip_payloads(b"", min_size=-1)
    with pytest.raises(TypeError, match="expected bytes"):
        strip_payloads("text")  # type: ignore[arg-type]
    assert strip_payloads(b"").skeleton == b""
    arr = np.frombuffer(model_with(initializers=[tensor("a", 2048)]).SerializeToString(), np.uint8)
    assert [r.length for r in strip_payloads(arr).payloads] == [2048]  # any contiguous buffer
    with pytest.raises(TypeError, match="non-contiguous"):
        strip_payloads(arr[::2])


# --------------------------------------------------------------------------- (c) 200 MB mmap


BIG_ELEMENTS = 50_000_000  # float32: 200 MB

_MAKE_BIG = """
import sys, numpy as np, onnx
from onnx import helper, numpy_helper, TensorProto
w = numpy_helper.from_array(np.zeros({n}, np.float32), "w")
g = helper.make_graph([helper.make_node("Identity", ["w"], ["y"])], "big", [],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [{n}])], [w])
onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)]), sys.argv[1])
"""

_MEASURE_RSS = """
import json, mmap, sys
from onnxforge.proto_ext.wirescan import strip_payloads

def status():
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmHWM", "VmRSS")):
                k, v = line.split(":")
                out[k] = int(v.split()[0]) * 1024
    return out

def mapping_rss(path):
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            first = line.split(" ", 1)[0]
            if "-" in first and ":" not in first:
                inside = line.rstrip().endswith(path)
            elif inside and line.startswith("Rss:"):
                total += int(line.split()[1]) * 1024
    return total

path = sys.argv[1]
with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the peak RSS
    except OSError:
        pass
    before = status()
    stripped = strip_payloads(mm)
    after = status()
    print(json.dumps({"rss_before": before["VmRSS"], "hwm_after": after["VmHWM"],
                      "rss_after": after["VmRSS"], "mapping_rss": mapping_rss(path),
                      "payloads": [[r.offset, r.length] for r in stripped.payloads],
                      "skeleton": len(stripped.skeleton)}))
"""


@pytest.fixture(scope="module")
def big_model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A 200 MB single-initializer model written by ``onnx.save`` (in a child process, so
    this process's memory stays untouched)."""
    path = tmp_path_factory.mktemp("big") / "big.onnx"
    subprocess.run([sys.executable, "-c", _MAKE_BIG.format(n=BIG_ELEMENTS), str(path)],
                   check=True, timeout=120)
    yield path
    path.unlink()


def test_big_model_strip_rss(big_model: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", _MEASURE_RSS, str(big_model)], check=True,
                          capture_output=True, text=True, timeout=120)
    r = json.loads(proc.stdout)
    assert r["payloads"][0][1] == BIG_ELEMENTS * 4
    assert r["skeleton"] < 1000
    # only pages around the payload are touched (plus the kernel's fault-around)
    assert r["mapping_rss"] < 16 << 20
    assert r["hwm_after"] - r["rss_before"] - r["mapping_rss"] < 20 << 20
    assert r["rss_after"] - r["rss_before"] < 20 << 20


def test_big_model_zero_copy_and_roundtrip(big_model: Path, tmp_path: Path) -> None:
    with open(big_model, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        tracemalloc.start()
        try:
            stripped = strip_payloads(mm)
            _, peak_strip = tracemalloc.get_traced_memory()
            tracemalloc.reset_peak()
            views = payload_views(mm, stripped)
            _, peak_views = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak_strip < 5 << 20 and peak_views < 1 << 20
        (ref,) = stripped.payloads
        assert ref.kind == KIND_INITIALIZER and ref.index == 0 and ref.length == BIG_ELEMENTS * 4
        view = views[ref.key]
        base = np.frombuffer(mm, np.uint8).ctypes.data
        addr = np.frombuffer(view, np.uint8).ctypes.data
        assert addr == base + ref.offset
        assert _inside_file_mapping(addr, ref.length, big_model)

        skel = onnx.ModelProto()
        skel.ParseFromString(stripped.skeleton)
        assert skel.graph.initializer[0].name == "w"
        assert not skel.graph.initializer[0].HasField("raw_data")
        assert list(skel.graph.initializer[0].dims) == [BIG_ELEMENTS]

        out_path = tmp_path / "copy.onnx"
        tracemalloc.start()
        try:
            with open(out_path, "wb") as out:
                n = write_model(out, stripped.skeleton, views)
            _, peak_write = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak_write < 5 << 20
        assert n == len(mm) == out_path.stat().st_size
        with open(out_path, "rb") as fh2, \
                mmap.mmap(fh2.fileno(), 0, access=mmap.ACCESS_READ) as copy:
            assert _same_bytes(copy, mm)
        view.release()
        views.clear()
    # the mapping closed cleanly: no view of it was left behind


def _same_bytes(a: mmap.mmap, b: mmap.mmap, chunk: int = 16 << 20) -> bool:
    if len(a) != len(b):
        return False
    with memoryview(a) as va, memoryview(b) as vb:
        return all(va[i:i + chunk] == vb[i:i + chunk] for i in range(0, len(a), chunk))


def _inside_file_mapping(addr: int, length: int, path: Path) -> bool:
    """Whether ``[addr, addr + length)`` lies in a mapping of ``path`` (per /proc/self/maps)."""
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 6 and parts[-1] == str(path):
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                if lo <= addr and addr + length <= hi:
                    return True
    return False


# --------------------------------------------------------------------------- large graphs


def test_strip_on_20000_node_chain() -> None:
    data = chain_model_bytes(20_000)
    stripped = strip_payloads(data)
    assert stripped.payloads == []  # 256-byte initializers stay inline by default
    stripped, written = roundtrip(data, 0)
    assert len(stripped.payloads) == 5000 and written == data


# --------------------------------------------------------------------------- external references


def _external(name: str, location: str, **entries: str) -> TensorProto:
    """A float tensor of 4 elements whose payload is external, at ``location``."""
    t = numpy_helper.from_array(np.zeros(4, np.float32), name)
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    t.external_data.add(key="location", value=location)
    for key, value in entries.items():
        t.external_data.add(key=key, value=value)
    return t


def _external_everywhere() -> Any:
    """External tensors in every place a tensor can sit, in this wire order:
    b (a Constant), d and c (an If branch's Constant and initializer), a (twice, an
    initializer), f (a sparse initializer's values), g (an encoded initializer), e (a
    local function's Constant); plus references without a location and an inline
    initializer whose doc string says ``location``."""
    then = helper.make_graph([helper.make_node("Constant", [], ["d0"], value=_external("d0", "sub/d.bin"))],
                             "then", [], [helper.make_tensor_value_info("d0", TensorProto.FLOAT, [4])],
                             [_external("c0", "c.bin")])
    nodes = [helper.make_node("Constant", [], ["b0"], value=_external("b0", "b.bin")),
             helper.make_node("If", ["cond"], ["z"], then_branch=then, else_branch=then)]
    inline = numpy_helper.from_array(np.zeros(2, np.float32), "inline")
    inline.doc_string = "location: nowhere"
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
                          [helper.make_tensor_value_info("z", TensorProto.FLOAT, [4])],
                          [_external("a0", "a.bin"), _external("a1", "a.bin", offset="16"), inline])
    sparse = g.sparse_initializer.add()
    sparse.values.CopyFrom(_external("f0", "f.bin"))
    sparse.indices.CopyFrom(numpy_helper.from_array(np.arange(4, dtype=np.int64), "f0_i"))
    sparse.dims.append(8)
    no_location = _external("n0", "n.bin")
    del no_location.external_data[0]  # an offset only: no file named
    no_location.external_data.add(key="offset", value="0")
    g.initializer.append(no_location)
    fn = helper.make_function("local", "F", [], ["e0"],
                              [helper.make_node("Constant", [], ["e0"], value=_external("e0", "e.bin"))],
                              [helper.make_opsetid("", 21)])
    stock = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], functions=[fn])
    m = schema.from_onnx(stock)
    enc = m.graph.encoded_initializer.add(name="g0")
    enc.external_data.add(key="location", value="g.bin")
    return m


EVERY_LOCATION = ["b.bin", "sub/d.bin", "c.bin", "a.bin", "f.bin", "g.bin", "e.bin"]


def test_external_locations_lists_every_reference_once_in_wire_order() -> None:
    from onnxforge.proto_ext.wirescan import external_locations

    data = _external_everywhere().SerializeToString()
    assert external_locations(data) == EVERY_LOCATION
    assert external_locations(memoryview(data)) == EVERY_LOCATION  # walked without the search
    assert external_locations(bytearray(data)) == EVERY_LOCATION
    # onnx's own enumeration agrees where it looks (not at sparse or encoded initializers)
    from onnx.external_data_helper import _get_all_tensors

    stock = onnx.load_from_string(data)
    theirs = {e.value for t in _get_all_tensors(stock) for e in t.external_data if e.key == "location"}
    assert theirs == set(EVERY_LOCATION) - {"f.bin", "g.bin"}


def test_external_locations_of_a_model_without_external_data(tmp_path: Path) -> None:
    from onnxforge.proto_ext.wirescan import external_locations, map_model_file, release_map

    inline = model_with(initializers=[numpy_helper.from_array(np.ones(512, np.float32), "w")])
    assert external_locations(inline.SerializeToString()) == []
    path = tmp_path / "m.onnx"
    path.write_bytes(_external_everywhere().SerializeToString())
    mapping = map_model_file(path)
    try:
        assert external_locations(mapping) == EVERY_LOCATION
    finally:
        release_map(mapping)
    (tmp_path / "empty.onnx").write_bytes(b"")
    with pytest.raises(WireError, match="empty"):
        map_model_file(tmp_path / "empty.onnx")


def test_external_locations_of_malformed_bytes() -> None:
    from onnxforge.proto_ext.wirescan import external_locations

    data = _external_everywhere().SerializeToString()
    with pytest.raises(WireError):
        external_locations(data[:-5])
