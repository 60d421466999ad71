"""Rule P7: every external reference obeys P4 and P5, whatever holds it.

Each kind of tensor that can live in an external file (a dense initializer, a
sparse initializer's values or indices, a Constant node's tensor in the main
graph, in a subgraph and in a local function, an encoded initializer) is paired
with each unsafe or broken reference: an absolute path, a ``..`` that leaves the
folder, a symlink that resolves outside it, a missing file, a range past the end
of the file and malformed entries. ``of.verify`` must raise with the rule, and
``onnxforge verify`` must exit 1 naming the rule and the object.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from onnx import AttributeProto, TensorProto, helper

import onnxforge as of
from onnxforge.cli import main
from onnxforge.proto_ext import schema
from onnxforge.proto_ext.verify.external_rules import external_refs
from onnxforge.proto_ext.view import view_from_proto
from tests.proto_ext.helpers import affine_layout, encoded, ext, model_with, tensor_type

FLOAT = TensorProto.FLOAT
DATA_FILE = "w.bin"
DATA_SIZE = 16

Entries = list[tuple[str, str]]


def external_tensor(name: str, elem: int, dims: list[int], entries: Entries) -> Any:
    """A TensorProto whose payload is the external reference ``entries``."""
    t = schema.TensorProto(name=name, data_type=elem, dims=dims, data_location=TensorProto.EXTERNAL)
    for k, v in entries:
        t.external_data.add(key=k, value=v)
    return t


def _add_model(init_name: str, **kw: Any) -> Any:
    """y = Add(x, init_name), over FLOAT[4]."""
    nodes = kw.pop("nodes", [])
    return model_with(inputs=[("x", tensor_type(FLOAT, [4]))], outputs=[("y", tensor_type(FLOAT, [4]))],
                      nodes=[*nodes, helper.make_node("Add", ["x", init_name], ["y"])], **kw)


def _constant(name: str, entries: Entries) -> Any:
    n = ext(helper.make_node("Constant", [], [name], name=f"const_{name}"), "NodeProto")
    a = n.attribute.add(name="value", type=AttributeProto.TENSOR)
    a.t.CopyFrom(external_tensor(f"{name}_t", FLOAT, [4], entries))
    return n


def dense(entries: Entries) -> Any:
    return _add_model("w", initializers=[external_tensor("w", FLOAT, [4], entries)])


def _sparse(values: Any, indices: Any) -> Any:
    m = _add_model("sw")
    s = m.graph.sparse_initializer.add()
    s.values.CopyFrom(values)
    s.indices.CopyFrom(indices)
    s.dims.extend([4])
    return m


def sparse_values(entries: Entries) -> Any:
    indices = ext(helper.make_tensor("sw_idx", TensorProto.INT64, [2], [0, 3]), "TensorProto")
    return _sparse(external_tensor("sw", FLOAT, [2], entries), indices)


def sparse_indices(entries: Entries) -> Any:
    values = ext(helper.make_tensor("sw", FLOAT, [2], [1.0, 2.0]), "TensorProto")
    return _sparse(values, external_tensor("sw_idx", TensorProto.INT64, [2], entries))


def constant(entries: Entries) -> Any:
    return _add_model("cw", nodes=[_constant("cw", entries)])


def subgraph_constant(entries: Entries) -> Any:
    then_g = schema.GraphProto(name="then")
    then_g.node.append(_constant("cw", entries))
    then_g.output.add(name="cw")
    else_g = schema.GraphProto(name="else")
    else_g.node.append(ext(helper.make_node("Identity", ["x"], ["e"]), "NodeProto"))
    else_g.output.add(name="e")
    cond = ext(helper.make_tensor("c", TensorProto.BOOL, [], [True]), "TensorProto")
    n = schema.NodeProto(op_type="If", name="if", input=["c"], output=["z"])
    for attr, g in (("then_branch", then_g), ("else_branch", else_g)):
        n.attribute.add(name=attr, type=AttributeProto.GRAPH).g.CopyFrom(g)
    return _add_model("z", nodes=[n], initializers=[cond])


def function_constant(entries: Entries) -> Any:
    f = schema.FunctionProto(name="f", domain="pkg", input=[], output=["cw"])
    f.opset_import.add(domain="", version=23)
    f.node.append(_constant("cw", entries))
    m = _add_model("z", nodes=[helper.make_node("f", [], ["z"], domain="pkg")], functions=[f])
    m.opset_import.add(domain="pkg", version=1)
    return m


def encoded_initializer(entries: Entries) -> Any:
    scale = helper.make_tensor("scale", FLOAT, [], [0.5])
    q = encoded("q", affine=affine_layout(TensorProto.INT8, scale), logical=tensor_type(FLOAT, [4]),
                external=entries)
    return _add_model("z", nodes=[helper.make_node("Identity", ["q"], ["z"])], encoded=[q])


# (builder, bytes the reference names, the path of the violation)
KINDS: dict[str, tuple[Callable[[Entries], Any], int, str]] = {
    "dense": (dense, 16, "graph.initializer['w'].external_data"),
    "sparse_values": (sparse_values, 8, "graph.sparse_initializer['sw'].values.external_data"),
    "sparse_indices": (sparse_indices, 16, "graph.sparse_initializer['sw'].indices.external_data"),
    "constant": (constant, 16, "graph.node[0]('const_cw').attribute['value'].t.external_data"),
    "subgraph_constant": (subgraph_constant, 16,
                          ("graph.node[0]('if').attribute['then_branch'].g.node[0]('const_cw')"
                           ".attribute['value'].t.external_data")),
    "function_constant": (function_constant, 16,
                          "functions['pkg::f'].node[0]('const_cw').attribute['value'].t.external_data"),
    "encoded": (encoded_initializer, 4, "graph.encoded_initializer['q'].external_data"),
}


def _entries(location: str, offset: int, length: int) -> Entries:
    return [("location", location), ("offset", str(offset)), ("length", str(length))]


# name -> (entries for a reference of ``n`` bytes, rule)
BAD: dict[str, tuple[Callable[[int], Entries], str]] = {
    "absolute": (lambda n: _entries("/etc/passwd", 0, n), "P5"),
    "dotdot": (lambda n: _entries("../../x", 0, n), "P5"),
    "symlink_outside": (lambda n: _entries("link.bin", 0, n), "P5"),
    "missing_file": (lambda n: _entries("missing.bin", 0, n), "P5"),
    "past_end": (lambda n: _entries(DATA_FILE, DATA_SIZE - n + 1, n), "P5"),
    "unknown_key": (lambda n: [*_entries(DATA_FILE, 0, n), ("size", str(n))], "P4"),
    "bad_offset": (lambda n: [("location", DATA_FILE), ("offset", "-1"), ("length", str(n))], "P4"),
    "no_location": (lambda n: [("offset", "0"), ("length", str(n))], "P4"),
}


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    """A model folder with a 16-byte data file and a link to a file outside it."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / DATA_FILE).write_bytes(np.arange(4, dtype=np.float32).tobytes())
    outside = tmp_path / "outside.bin"
    outside.write_bytes(bytes(DATA_SIZE))
    os.symlink(outside, folder / "link.bin")
    return folder


def _save(m: Any, folder: Path) -> str:
    path = folder / "m.onnx"
    path.write_bytes(m.SerializeToString())
    return str(path)


@pytest.mark.parametrize("kind", KINDS)
def test_a_safe_external_reference_passes(kind: str, model_dir: Path, capsys) -> None:
    build, nbytes, _ = KINDS[kind]
    path = _save(build(_entries(DATA_FILE, 0, nbytes)), model_dir)
    of.verify(path)
    assert main(["verify", path]) == 0
    assert capsys.readouterr().out.strip().endswith("OK")
    model = of.load(path)
    assert of.check(model) == []


@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize("kind", KINDS)
def test_an_unsafe_reference_is_reported(kind: str, bad: str, model_dir: Path, capsys) -> None:
    build, nbytes, where = KINDS[kind]
    make_entries, rule = BAD[bad]
    path = _save(build(make_entries(nbytes)), model_dir)
    with pytest.raises(of.VerificationError) as info:
        of.verify(path)
    assert info.value.rules == [rule], str(info.value)
    assert info.value.violations[0].path == where
    assert main(["verify", path]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"[{rule}] {where}:"), out


@pytest.mark.parametrize("kind", ["dense", "constant", "encoded"])
def test_optimize_and_export_refuse_an_unsafe_reference(kind: str, model_dir: Path, capsys) -> None:
    build, nbytes, where = KINDS[kind]
    path = _save(build(_entries("/etc/passwd", 0, nbytes)), model_dir)
    with pytest.raises(of.VerificationError) as info:
        of.optimize(path)
    assert info.value.rules == ["P5"]
    with pytest.raises(of.VerificationError):
        of.to_standard_onnx(path)
    out = model_dir / "opt.onnx"
    assert main(["optimize", path, "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert f"[P5] {where}:" in err and "/etc/passwd" in err
    assert not out.exists()
    assert main(["export", path, "-o", str(model_dir / "std")]) == 1
    assert f"[P5] {where}:" in capsys.readouterr().err
    assert not (model_dir / "std").exists()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("location", ["/etc/passwd", "../../x"])
def test_the_ir_view_checks_references_it_did_not_map(kind: str, location: str) -> None:
    # loaded from bytes, without a folder: nothing was mapped, the location is checked as text
    build, nbytes, where = KINDS[kind]
    model = of.load(build(_entries(location, 0, nbytes)).SerializeToString())
    violations = of.check(model)
    assert [(v.rule, v.path) for v in violations] == [("P5", where)]


@pytest.mark.parametrize("kind", ["dense", "sparse_indices", "constant", "encoded"])
def test_the_ir_view_sees_a_data_file_that_went_away(kind: str, model_dir: Path) -> None:
    build, nbytes, where = KINDS[kind]
    path = _save(build(_entries(DATA_FILE, 0, nbytes)), model_dir)
    model = of.load(path)
    assert of.check(model) == []
    (model_dir / DATA_FILE).unlink()
    (v,) = of.check(model)
    assert (v.rule, v.path) == ("P5", where) and "does not exist" in v.message


def test_the_loader_and_verify_agree_on_what_is_unsafe(model_dir: Path) -> None:
    path = _save(dense(_entries("link.bin", 0, 16)), model_dir)
    with pytest.raises(of.ExternalDataError) as loaded:
        of.load(path)
    (v,) = of.check(path)
    assert loaded.value.rule == v.rule == "P5" and "outside the model directory" in v.message
    assert loaded.value.path.startswith("graph.initializer")


def test_external_refs_lists_every_holder_in_order() -> None:
    m = constant(_entries(DATA_FILE, 0, 16))
    m.graph.initializer.append(external_tensor("w", FLOAT, [4], _entries(DATA_FILE, 0, 16)))
    view = view_from_proto(m)
    assert [p for p, _ in external_refs(view)] == [
        "graph.initializer['w'].external_data",
        "graph.node[0]('const_cw').attribute['value'].t.external_data",
    ]
    assert dict(next(iter(external_refs(view)))[1]) == {"location": DATA_FILE, "offset": "0",
                                                          "length": "16"}


def test_inline_and_default_tensors_are_no_references() -> None:
    m = dense(_entries(DATA_FILE, 0, 16))
    t = m.graph.initializer[0]
    t.data_location = TensorProto.DEFAULT
    t.raw_data = bytes(16)
    assert list(external_refs(view_from_proto(m))) == []
