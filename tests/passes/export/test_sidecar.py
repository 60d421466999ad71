"""Sidecar files: the data files of a model are read from a wire scan, never ``onnx.load``."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

import onnxforge as of
from onnxforge.passes.export.sidecar import copy_sidecar_files, model_data_files
from tests.graphbuilder.serde.test_one_load import _model


@pytest.fixture
def no_onnx_load(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("onnx.load called: the sidecar code reads data-file names from the wire")

    for name in ("load", "load_model", "load_from_string", "load_model_from_string"):
        monkeypatch.setattr(onnx, name, refuse)


def _genai_folder(folder: Path) -> Path:
    """model.onnx with its payloads (dense and encoded) in weights.bin, a genai_config.json
    naming it, and a tokenizer."""
    folder.mkdir()
    of.save(of.load(_model()), folder / "model.onnx", external_data="weights.bin")
    (folder / "genai_config.json").write_text(json.dumps(
        {"model": {"decoder": {"filename": "model.onnx", "inputs": {"input_ids": "x"},
                               "outputs": {"logits": "y"}}}}))
    (folder / "tokenizer.json").write_text("{}")
    return folder / "model.onnx"


def test_model_data_files_reads_the_wire(tmp_path: Path, no_onnx_load: None) -> None:
    src = _genai_folder(tmp_path / "src")
    assert model_data_files(src) == {"weights.bin"}
    of.save(of.load(_model()), tmp_path / "inline.onnx")
    assert model_data_files(tmp_path / "inline.onnx") == set()
    (tmp_path / "empty.onnx").write_bytes(b"")
    (tmp_path / "garbage.onnx").write_bytes(b"\x3a\xff\xff\xff\x0f location")
    for unreadable in ("empty.onnx", "garbage.onnx", "missing.onnx", "."):
        assert model_data_files(tmp_path / unreadable) == set()


def test_copy_sidecar_files_skips_the_data_files_it_scanned(tmp_path: Path, no_onnx_load: None) -> None:
    src = _genai_folder(tmp_path / "src")
    out = tmp_path / "out"
    model = of.load(src)
    of.save(model, out / "model.opt.onnx")
    result = copy_sidecar_files(src.parent, out, model_filename="model.opt.onnx", model=model,
                                source_model="model.onnx")
    assert sorted(result.copied) == ["tokenizer.json"]  # not weights.bin: model.onnx's data
    assert sorted(p.name for p in out.iterdir()) == ["genai_config.changes.json", "genai_config.json",
                                                     "model.opt.onnx", "model.opt.onnx.data", "tokenizer.json"]
    config = json.loads((out / "genai_config.json").read_text())
    assert config["model"]["decoder"]["filename"] == "model.opt.onnx"
    np.testing.assert_array_equal(of.decode_value(of.load(out / "model.opt.onnx"), "w"),
                                  np.arange(1024, dtype=np.float32))
