"""A verified load reads the model once: one map, one payload scan, one parse.

``serde.load(source, verify=True)`` checks the static rules on the message it then
decodes; the facade's ``load_verified`` and ``optimize``, the backend's
``InferenceSession`` and the command line's ``optimize`` all load through it. The
counters below spy on ``mmap.mmap`` (maps of the model file), ``strip_payloads`` and
``schema.parse_model`` / ``schema.parse("ModelProto", ...)`` while they run.
"""
from __future__ import annotations

import mmap
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxforge as of
from onnxforge.api import load_verified
from onnxforge.errors import ModelFileError, VerificationError, WireError
from onnxforge.graphbuilder import serde
from onnxforge.proto_ext import schema, wirescan
from onnxforge.proto_ext.verify.source import source_violations

UNKNOWN = b"\xd2\x41\x03abc"  # field 1050, LEN "abc": no onnx or onnxforge message declares it


def _model(*, unknown: bool = False) -> Any:
    """y = (x + w) * q: ``w`` a 4 KiB dense initializer and ``q`` a 1 KiB affine INT8
    encoded one, both inline (so both are stripped and viewed, and the rules read the
    encoded payload's size from its view); ``unknown`` adds an unknown field to a node."""
    g = helper.make_graph([helper.make_node("Add", ["x", "w"], ["t"]), helper.make_node("Mul", ["t", "q"], ["y"])],
                          "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1024])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1024])],
                          [numpy_helper.from_array(np.arange(1024, dtype=np.float32), "w")])
    m = schema.from_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)]))
    q = m.graph.encoded_initializer.add(name="q")
    q.affine.storage_type = TensorProto.INT8
    q.affine.scale.CopyFrom(schema.from_onnx(numpy_helper.from_array(np.float32(0.5), "")))
    q.logical_type.tensor_type.elem_type = TensorProto.FLOAT
    q.logical_type.tensor_type.shape.dim.add(dim_value=1024)
    q.raw_data = bytes(range(128)) * 8
    if unknown:
        m.graph.node[1].MergeFromString(UNKNOWN)
    return m


def _write(tmp_path: Path, m: Any, name: str = "m.onnx") -> str:
    path = tmp_path / name
    path.write_bytes(m.SerializeToString())
    return str(path)


class Reads:
    """Counts the reads of one model file while installed (see the module docstring)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, path: str | None = None) -> None:
        self.identity = None if path is None else self._identity(os.stat(path))
        self.maps = self.strips = self.parses = self.model_parses = 0
        reads = self

        class SpyMap(mmap.mmap):  # a subclass: isinstance(x, mmap.mmap) keeps working
            def __new__(cls, fileno: int, *args: Any, **kwargs: Any) -> Any:
                if reads.identity is None or reads._identity(os.fstat(fileno)) == reads.identity:
                    reads.maps += 1
                return super().__new__(cls, fileno, *args, **kwargs)

        real_strip, real_parse_model, real_parse = wirescan.strip_payloads, schema.parse_model, schema.parse

        def strip(*args: Any, **kwargs: Any) -> Any:
            reads.strips += 1
            return real_strip(*args, **kwargs)

        def parse_model(data: Any) -> Any:
            reads.parses += 1
            return real_parse_model(data)

        def parse(name: str, data: Any) -> Any:  # every ModelProto parse, whoever asks
            reads.model_parses += name == "ModelProto"
            return real_parse(name, data)

        monkeypatch.setattr(mmap, "mmap", SpyMap)
        monkeypatch.setattr(wirescan, "strip_payloads", strip)
        monkeypatch.setattr(serde, "strip_payloads", strip)  # imported by name
        monkeypatch.setattr(schema, "parse_model", parse_model)
        monkeypatch.setattr(schema, "parse", parse)

    @staticmethod
    def _identity(st: os.stat_result) -> tuple[int, int]:
        return st.st_dev, st.st_ino

    @property
    def counts(self) -> tuple[int, int, int, int]:
        """(maps of the model file, strip_payloads, parse_model, ModelProto parses)."""
        return self.maps, self.strips, self.parses, self.model_parses


ONCE = (1, 1, 1, 1)


def test_load_verified_reads_a_file_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(tmp_path, _model())
    reads = Reads(monkeypatch, path)
    m = load_verified(path)
    assert reads.counts == ONCE
    assert serde.to_bytes(m) == _model().SerializeToString()  # the IR of that one parse, lossless


def test_optimize_reads_a_file_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(tmp_path, _model())
    reads = Reads(monkeypatch, path)
    out = of.optimize(path)
    assert reads.counts == ONCE
    assert [n.op_type for n in out.graph] == ["Add", "Mul"]


@pytest.mark.parametrize("backend", ["InferenceSession", "make_state"])
def test_the_backend_reads_a_file_once(backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(tmp_path, _model())
    reads = Reads(monkeypatch, path)
    runner = getattr(of, backend)(path)
    assert reads.counts == ONCE
    x = np.ones(1024, np.float32)
    y = runner.run(None, {"x": x})[0] if backend == "InferenceSession" else runner.run({"x": x})["y"]
    q = np.frombuffer(bytes(range(128)) * 8, np.int8).astype(np.float32) * 0.5
    np.testing.assert_array_equal(y, (1 + np.arange(1024, dtype=np.float32)) * q)


@pytest.mark.parametrize("kind", ["bytes", "message"])
def test_bytes_and_messages_are_parsed_once(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    msg = _model()
    source = msg.SerializeToString() if kind == "bytes" else schema.to_onnx(msg)
    reads = Reads(monkeypatch)
    load_verified(source)
    assert reads.counts[1:] == (1, 1, 1)


def test_a_model_with_unknown_fields_is_parsed_twice_and_keeps_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the discard that proves a model clean changes the parsed message: a model that
    # holds unknown fields is parsed again to keep them (still one map and one scan)
    msg = _model(unknown=True)
    path = _write(tmp_path, msg)
    reads = Reads(monkeypatch, path)
    m = load_verified(path)
    assert reads.counts == (1, 1, 2, 2)
    assert serde.to_bytes(m) == msg.SerializeToString()
    assert list(m.graph)[1].extra


def _two_definitions_of_y() -> Any:
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu"),
                           helper.make_node("Neg", ["x"], ["y"], name="neg")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])


def test_violations_are_raised_before_any_ir_is_built(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(tmp_path, _two_definitions_of_y())
    built = []
    monkeypatch.setattr(serde.Decoder, "model", lambda self, mp: built.append(mp))
    reads = Reads(monkeypatch, path)
    with pytest.raises(VerificationError) as info:
        serde.load(path, verify=True)
    assert info.value.violations == source_violations(path)  # the one definition of the rules
    assert info.value.rules == ["N3"] and built == []
    assert reads.counts[:3] == (2, 2, 2)  # this load, then source_violations' own read


def test_a_wire_violation_is_found_on_the_shared_parse(tmp_path: Path) -> None:
    # rule W1 reads unknown fields: it runs before the clean check discards them
    msg = _model()
    msg.graph.input[0].MergeFromString(b"\xc0\x3e\x07")  # access (1000) = 7, no such enum value
    path = _write(tmp_path, msg)
    with pytest.raises(VerificationError) as info:
        load_verified(path)
    assert info.value.rules == ["W1"] and info.value.violations == source_violations(path)


def test_bad_files_fail_as_the_checks_report_them(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match="no such model file"):
        serde.load(tmp_path / "missing.onnx", verify=True)
    with pytest.raises(ModelFileError, match="is a directory"):
        load_verified(str(tmp_path))
    (tmp_path / "empty.onnx").write_bytes(b"")
    with pytest.raises(WireError, match="is empty: not an ONNX model"):
        load_verified(str(tmp_path / "empty.onnx"))
    (tmp_path / "bad.onnx").write_bytes(b"\x3a\xff\xff\xff\x0f")
    with pytest.raises(WireError, match="^cannot parse ModelProto: ") as verified:
        load_verified(str(tmp_path / "bad.onnx"))
    with pytest.raises(WireError) as checked:
        source_violations(str(tmp_path / "bad.onnx"))
    assert str(verified.value) == str(checked.value)
    with pytest.raises(TypeError, match="expected a model path, bytes or a ModelProto, got int"):
        load_verified(3)


def test_optimize_checks_pass_names_before_reading_and_reports_progress(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from onnxforge.api import Optimization
    from onnxforge.passes.framework.pass_manager import PassError

    path = _write(tmp_path, _model())
    reads = Reads(monkeypatch, path)
    with pytest.raises(PassError, match="nonsense"):
        of.optimize(path, passes=["nonsense"])
    assert reads.counts == (0, 0, 0, 0)
    seen: list[Any] = []
    run = Optimization(["identity_elimination", "dce"], progress=seen.append)
    model = run.load(path)
    assert run(model) is model and reads.counts == ONCE
    assert [r.name for r in seen] == ["identity_elimination", "dce"] and seen == run.records
    assert "identity_elimination" in run.report()
