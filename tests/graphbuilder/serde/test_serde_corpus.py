"""Round trips (load -> save -> compare canonical forms) over every corpus at hand.

* every model shipped in the onnx wheel's backend test data;
* every node test case that ``onnx.backend.test.loader`` generates (the
  generated models are cached between runs in pytest's cache folder);
* models using every extension kind (struct catalogue with the values
  specification's worked examples, encoded initializers with affine and struct
  layouts, persistent bindings, aliases, access, struct-typed graph inputs, a
  subgraph reading outer values, a local function with a READ_WRITE input),
  inline and with external data;
* the real exported decoders of ``tests/conftest.py``.
"""
from __future__ import annotations

import glob
import hashlib
import os
import struct
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnxforge.graphbuilder import serde
from onnxforge.graphbuilder.serde import canonical
from onnxforge.graphbuilder.ir.core import Model
from onnxforge.proto_ext import schema
from tests.proto_ext.helpers import (
    affine_layout,
    array_type,
    category_type,
    constant,
    encoded,
    model_with,
    ref_type,
    spec_catalogue,
    struct_decl,
    tensor_type,
    value_info,
)

DATA = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")
STOCK_MODELS = sorted(glob.glob(os.path.join(DATA, "*", "*", "model.onnx")))
NODE_CHUNKS = 8
DECODERS = ("torch20", "torch23", "genai_fp32", "genai_int4")


def round_trip_differences(source: Path, out_dir: Path, **save_kwargs: Any) -> list[str]:
    """Load ``source``, save it into ``out_dir``, compare canonical forms."""
    model = serde.load(source)
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / "model.onnx"
    serde.save(model, target, **save_kwargs)
    return canonical.differences(source, target)


def bytes_round_trip_differences(data: bytes) -> list[str]:
    """Round trip through bytes (no files)."""
    out = serde.to_bytes(serde.load(data))
    if out == data:
        return []
    return canonical.differences(data, out)


# --------------------------------------------------------------------------- stock corpora


def test_stock_corpus_is_present() -> None:
    assert len(STOCK_MODELS) >= 100


@pytest.mark.parametrize("path", STOCK_MODELS, ids=lambda p: os.path.relpath(p, DATA))
def test_stock_model_round_trip(path: str, tmp_path: Path) -> None:
    assert round_trip_differences(Path(path), tmp_path / "out") == []
    # the stock reader sees the same model
    assert onnx.load(str(tmp_path / "out" / "model.onnx")) == onnx.load(path)


def _generate_node_cases() -> list[tuple[str, bytes]]:
    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = load_model_tests(kind="node")
    return [(c.name, c.model.SerializeToString()) for c in cases]


def _pack(cases: list[tuple[str, bytes]]) -> bytes:
    out = [struct.pack("<I", len(cases))]
    for name, data in cases:
        raw = name.encode()
        out.append(struct.pack("<II", len(raw), len(data)))
        out.append(raw)
        out.append(data)
    return b"".join(out)


def _unpack(blob: bytes) -> list[tuple[str, bytes]]:
    (count,) = struct.unpack_from("<I", blob, 0)
    pos, out = 4, []
    for _ in range(count):
        n, m = struct.unpack_from("<II", blob, pos)
        pos += 8
        out.append((blob[pos:pos + n].decode(), blob[pos + n:pos + n + m]))
        pos += n + m
    return out


@pytest.fixture(scope="session")
def node_cases(request: pytest.FixtureRequest) -> list[tuple[str, bytes]]:
    """(name, serialized model) of every generated node test case, cached per onnx version."""
    cache = getattr(request.config, "cache", None)
    if cache is None:  # pytest's cache plugin is disabled
        return _generate_node_cases()
    path = Path(cache.mkdir("onnxforge-node-cases")) / f"onnx-{onnx.__version__}.bin"
    if path.exists():
        blob = path.read_bytes()
        digest, body = blob[:32], blob[32:]
        if hashlib.sha256(body).digest() == digest:
            return _unpack(body)
    cases = _generate_node_cases()
    body = _pack(cases)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(hashlib.sha256(body).digest() + body)
    os.replace(tmp, path)
    return cases


def test_node_case_count(node_cases: list[tuple[str, bytes]]) -> None:
    assert len(node_cases) >= 1800
    assert sum(name.endswith("_expanded") for name, _ in node_cases) >= 400


@pytest.mark.parametrize("chunk", range(NODE_CHUNKS))
def test_node_cases_round_trip(node_cases: list[tuple[str, bytes]], chunk: int) -> None:
    failures = []
    for name, data in node_cases[chunk::NODE_CHUNKS]:
        diff = bytes_round_trip_differences(data)
        if diff:
            failures.append(f"{name}: {diff[:3]}")
    assert failures == []


def test_node_cases_round_trip_through_files(node_cases: list[tuple[str, bytes]],
                                             tmp_path: Path) -> None:
    """A sample through real files (memory-mapped loading, streamed saving)."""
    for name, data in node_cases[::97]:
        src = tmp_path / name / "model.onnx"
        src.parent.mkdir()
        src.write_bytes(data)
        assert round_trip_differences(src, tmp_path / name / "out") == [], name


# --------------------------------------------------------------------------- extension models


def _f(dims: Any = ()) -> Any:
    return tensor_type(TensorProto.FLOAT, dims)


def catalogue_model() -> Any:
    """The specification's catalogue (1003, 1002, 1101, 1102, 2001) with encoded values."""
    rng = np.random.default_rng(0)
    records_1002 = rng.integers(0, 255, 64, dtype=np.uint8).tobytes() + struct.pack("<fq", 0.125, 0)
    inline_decl = struct_decl(None, "inline", [("codes", array_type(TensorProto.INT8, 16)),
                                               ("scale", _f([]))])
    return model_with(
        struct_types=spec_catalogue(),
        encoded=[
            encoded("w_2001", type_ref=2001, raw_data=rng.bytes(2560), logical=_f([4096])),
            encoded("w_1003", type_ref=1003, raw_data=rng.bytes(64), logical=_f([128])),
            encoded("w_1002", type_ref=1002, raw_data=records_1002, logical=_f([128])),
            encoded("w_1102_small", type_ref=1102, raw_data=bytes([0xE4] * 8) + struct.pack("<f", 2.0),
                    logical=_f([32])),
            encoded("w_1102", type_ref=1102, raw_data=rng.bytes(1536), logical=_f([4096])),
            encoded("w_inline", struct=inline_decl, raw_data=rng.bytes(200), logical=_f([160])),
            encoded("w_affine", affine=affine_layout(
                TensorProto.INT4, constant(TensorProto.FLOAT, [4], [0.5, 0.25, 1.0, 2.0]),
                constant(TensorProto.INT8, [4], [0, 1, -1, 2]), axis=0, block_size=32),
                raw_data=rng.bytes(64), logical=_f([4, 32])),
        ],
        inputs=[("x", _f([4096])), ("w_1003", ref_type(1003))],
        outputs=[("y", _f([4096]))],
        nodes=[helper.make_node("Identity", ["x"], ["y"], name="id")],
    )


def stateful_model() -> Any:
    """Persistent bindings, a mandatory alias, access, alias_of, struct-typed inputs."""
    rw = value_info("past", _f(["b", 2, "cap", 32]))
    rw.access = schema.READ_WRITE
    present = value_info("present", _f(["b", 2, "cap", 32]))
    present.alias_of = "past"
    counter_in = value_info("count", tensor_type(TensorProto.INT64, []))
    counter_out = value_info("count_next", tensor_type(TensorProto.INT64, []))
    upd = schema.NodeProto(op_type="CacheUpdate", domain="ai.onnxforge", name="upd",
                           input=["past", "kv", "pos"], output=["present"])
    upd.attribute.add(name="axis", type=schema.AttributeProto.INT, i=-2)
    upd.output_alias.add(output_index=0, input_index=0, kind=schema.MUST_ALIAS)
    m = model_with(
        struct_types=spec_catalogue()[:1],
        inputs=[rw, ("kv", _f(["b", 2, "n", 32])), ("pos", tensor_type(TensorProto.INT64, [])),
                counter_in, ("blocks", ref_type(2001)), ("any", category_type())],
        outputs=[present, counter_out, ("blocks_out", ref_type(2001))],
        nodes=[upd,
               helper.make_node("Add", ["count", "one"], ["count_next"], name="inc"),
               helper.make_node("Identity", ["blocks"], ["blocks_out"], name="pass")],
        initializers=[helper.make_tensor("one", TensorProto.INT64, [], [1])],
        bindings=[("past", "present"), ("count", "count_next")],
    )
    m.opset_import.add(domain="ai.onnxforge", version=1)
    return m


def subgraph_model() -> Any:
    """An If whose branches read outer values (an input, an initializer, a node output)."""
    then_g = helper.make_graph(
        [helper.make_node("Add", ["x", "h"], ["t_out"], name="then_add"),
         helper.make_node("Mul", ["t_out", "c"], ["then_y"], name="then_mul")],
        "then", [], [helper.make_tensor_value_info("then_y", TensorProto.FLOAT, [4])])
    else_g = helper.make_graph(
        [helper.make_node("Neg", ["h"], ["else_y"], name="else_neg")],
        "else", [], [helper.make_tensor_value_info("else_y", TensorProto.FLOAT, [4])])
    loop_body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Add", ["acc_in", "h"], ["acc_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [4])])
    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["h"], name="relu"),
         helper.make_node("If", ["cond"], ["y"], name="if", then_branch=then_g, else_branch=else_g),
         helper.make_node("Loop", ["trip", "", "y"], ["z"], name="loop", body=loop_body)],
        "outer",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4]),
         helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
         helper.make_tensor_value_info("trip", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [4])],
        [helper.make_tensor("c", TensorProto.FLOAT, [4], [1, 2, 3, 4])],
        value_info=[helper.make_tensor_value_info("h", TensorProto.FLOAT, [4])])
    return schema.from_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)]))


def function_model() -> Any:
    """A local function with a READ_WRITE formal input, attributes, defaults, value_info."""
    fn = schema.FunctionProto(name="Append", domain="local")
    fn.input.extend(["cache", "values", "pos"])
    fn.output.extend(["out"])
    fn.attribute.append("axis")
    default = fn.attribute_proto.add(name="scale", type=schema.AttributeProto.FLOAT, f=1.0)
    del default
    upd = fn.node.add(op_type="CacheUpdate", domain="ai.onnxforge", input=["cache", "values", "pos"],
                      output=["out"])
    ref = upd.attribute.add(name="axis", type=schema.AttributeProto.INT)
    ref.ref_attr_name = "axis"
    upd.output_alias.add(output_index=0, input_index=0, kind=schema.MUST_ALIAS)
    fn.opset_import.add(domain="ai.onnxforge", version=1)
    fn.opset_import.add(domain="", version=23)
    cache_vi = fn.value_info.add(name="cache")
    cache_vi.CopyFrom(value_info("cache", _f(["b", "cap", 8])))
    cache_vi.access = schema.READ_WRITE
    out_vi = fn.value_info.add()
    out_vi.CopyFrom(value_info("out", _f(["b", "cap", 8])))
    out_vi.alias_of = "cache"
    fn.doc_string = "appends in place"
    fn.metadata_props.add(key="k", value="v")
    rw = value_info("state", _f(["b", "cap", 8]))
    rw.access = schema.READ_WRITE
    call = helper.make_node("Append", ["state", "new", "p"], ["state_out"], domain="local",
                            name="call", axis=-2)
    m = model_with(
        inputs=[rw, ("new", _f(["b", 1, 8])), ("p", tensor_type(TensorProto.INT64, []))],
        outputs=[("state_out", _f(["b", "cap", 8]))],
        nodes=[call], functions=[fn])
    m.opset_import.add(domain="local", version=1)
    m.opset_import.add(domain="ai.onnxforge", version=1)
    return m


def everything_model() -> Any:
    """Metadata, doc strings and unmodeled fields on every message kind."""
    m = catalogue_model()
    m.doc_string = "model doc"
    m.domain = "test.domain"
    m.model_version = 7
    m.producer_version = "1.0"
    m.metadata_props.add(key="b", value="2")
    m.metadata_props.add(key="a", value="1")
    g = m.graph
    g.doc_string = "graph doc"
    g.metadata_props.add(key="g", value="1")
    g.input[0].doc_string = "input doc"
    g.input[0].metadata_props.add(key="vi", value="x")
    n = g.node[0]
    n.doc_string = "node doc"
    n.metadata_props.add(key="src", value="line 1")
    n.overload = "ov"
    g.encoded_initializer[0].doc_string = "encoded doc"
    t = g.initializer.add()
    t.CopyFrom(schema.from_onnx(helper.make_tensor("dense", TensorProto.FLOAT, [300],
                                                   np.arange(300, dtype=np.float32).tobytes(),
                                                   raw=True)))
    t.doc_string = "tensor doc"
    t.metadata_props.add(key="t", value="1")
    typed = g.initializer.add()
    typed.CopyFrom(schema.from_onnx(helper.make_tensor("typed", TensorProto.INT64, [3], [1, 2, 3])))
    strings = g.initializer.add()
    strings.CopyFrom(schema.from_onnx(helper.make_tensor("strs", TensorProto.STRING, [2], [b"a", b"b"])))
    training = m.training_info.add()
    training.algorithm.name = "train"
    training.update_binding.add(key="w", value="w_new")
    return m


def extension_models() -> dict[str, Any]:
    """Name -> extended ModelProto of every extension corpus model."""
    return {"catalogue": catalogue_model(), "stateful": stateful_model(),
            "subgraph": subgraph_model(), "function": function_model(),
            "everything": everything_model()}


@pytest.mark.parametrize("name", sorted(extension_models()))
def test_extension_model_round_trip(name: str, tmp_path: Path) -> None:
    msg = extension_models()[name]
    data = msg.SerializeToString()
    assert bytes_round_trip_differences(data) == []
    src = tmp_path / "src" / "model.onnx"
    src.parent.mkdir()
    src.write_bytes(data)
    assert round_trip_differences(src, tmp_path / "out") == []
    # the IR sees the extensions as first-class objects
    model = serde.load(src)
    assert isinstance(model, Model)
    assert serde.to_bytes(model) == data


@pytest.mark.parametrize("name", sorted(extension_models()))
def test_extension_model_round_trip_with_external_data(name: str, tmp_path: Path) -> None:
    msg = extension_models()[name]
    src_dir = tmp_path / "src"
    src_dir.mkdir()
    model = serde.load(msg.SerializeToString())
    serde.save(model, src_dir / "model.onnx", external_data="weights.bin", size_threshold=64)
    assert canonical.differences(msg, src_dir / "model.onnx") == []
    # external in, external out (copied to a new folder), still the same model
    assert round_trip_differences(src_dir / "model.onnx", tmp_path / "out") == []
    assert canonical.differences(msg, tmp_path / "out" / "model.onnx") == []


# --------------------------------------------------------------------------- real decoders


@pytest.mark.parametrize("variant", DECODERS)
def test_decoder_round_trip(decoder_models: dict[str, Path], variant: str, tmp_path: Path) -> None:
    source = decoder_models[variant]
    assert round_trip_differences(source, tmp_path / "same_layout") == []
    assert round_trip_differences(source, tmp_path / "one_file", external_data="w.bin") == []
    # and the stock reader agrees with the source on the saved model
    saved = onnx.load(str(tmp_path / "same_layout" / "model.onnx"))
    original = onnx.load(str(source))
    assert saved == original
