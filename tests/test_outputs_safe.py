"""Outputs never damage other files: external data named after the written model, no
command overwrites its input or another model's data, writes are atomic, the copied
genai_config.json matches a stateful model's capacity, and generate stays in context."""
from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxforge as of
from onnxforge.cli import main
from onnxforge.samples import build_builtin
from onnxforge.proto_ext.outputs import (
    OutputConflictError,
    atomic_files,
    check_targets,
    external_locations,
    replace_all,
    write_json,
)


def _external_model(folder: Path, seed: int, name: str = "model.onnx") -> Path:
    """``Y = X @ W + B`` with W (16 KiB) and B in ``model.onnx.data``: the layout every
    onnxruntime-genai folder uses, so two such folders use the same data file name."""
    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), "W")
    b = numpy_helper.from_array(rng.standard_normal(64).astype(np.float32), "B")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["XW"]), helper.make_node("Add", ["XW", "B"], ["Y"])],
        "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 64])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 64])], [w, b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(folder / name), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="model.onnx.data", size_threshold=0)
    return folder / name


def _ort(path: Path, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, {"X": x})[0]


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _x() -> np.ndarray:
    return np.random.default_rng(7).standard_normal((2, 64)).astype(np.float32)


# ------------------------------------------------------------------- data file names


def test_two_models_optimized_into_one_folder_compute_their_own_outputs(tmp_path, capsys):
    a = _external_model(tmp_path / "a", seed=1)
    b = _external_model(tmp_path / "b", seed=2)
    out = tmp_path / "out"
    assert main(["optimize", str(a), "-o", str(out / "a.onnx"), "-q"]) == 0
    assert main(["optimize", str(b), "-o", str(out / "b.onnx"), "-q"]) == 0
    assert external_locations(out / "a.onnx") == {"a.onnx.data"}
    assert external_locations(out / "b.onnx") == {"b.onnx.data"}
    assert not (out / "model.onnx.data").exists()
    x = _x()
    np.testing.assert_allclose(_ort(out / "a.onnx", x), _ort(a, x), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(_ort(out / "b.onnx", x), _ort(b, x), rtol=1e-5, atol=1e-5)
    assert not np.allclose(_ort(a, x), _ort(b, x))


def test_api_save_names_the_data_file_after_the_model(tmp_path):
    src = _external_model(tmp_path / "src", seed=3)
    of.save(of.load(src), tmp_path / "src" / "copy.onnx")  # same folder, another name
    assert external_locations(tmp_path / "src" / "copy.onnx") == {"copy.onnx.data"}
    x = _x()
    np.testing.assert_allclose(_ort(tmp_path / "src" / "copy.onnx", x), _ort(src, x), rtol=1e-6)


def test_a_model_referencing_the_target_data_file_and_another_is_rewritten_whole(tmp_path):
    """Some references already point into ``out.onnx.data``, others elsewhere: the data
    file is written anew with every payload, not partly kept and partly overwritten."""
    folder = tmp_path / "m"
    src = _external_model(folder, seed=4, name="out.onnx")  # W and B in model.onnx.data
    proto = onnx.load(str(src), load_external_data=False)
    for e in proto.graph.initializer[0].external_data:  # W moves to out.onnx.data
        if e.key == "location":
            e.value = "out.onnx.data"
    shutil.copyfile(folder / "model.onnx.data", folder / "out.onnx.data")
    mixed = folder / "mixed.onnx"
    mixed.write_bytes(proto.SerializeToString())
    expected = _ort(src, _x())
    of.save(of.load(mixed), folder / "out.onnx")
    assert external_locations(folder / "out.onnx") == {"out.onnx.data"}
    np.testing.assert_allclose(_ort(folder / "out.onnx", _x()), expected, rtol=1e-6)


# ------------------------------------------------------------------ refusing to clobber


def test_export_into_the_input_folder_refuses_and_leaves_the_input_alone(tmp_path, capsys):
    src = tmp_path / "src"
    src.mkdir()
    of.save(build_builtin("decoder"), src / "model.onnx",
            external_data="model.onnx.data", size_threshold=0)
    before = _snapshot(src)
    assert main(["export", str(src / "model.onnx"), "-o", str(src)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {src / 'model.onnx'}: is the input model") and "Traceback" not in err
    assert _snapshot(src) == before  # byte-identical, and nothing new in the folder


@pytest.mark.parametrize("command", ["optimize", "stateful"])
def test_a_command_writing_over_its_input_refuses(tmp_path, capsys, command):
    src = _external_model(tmp_path / "src", seed=5)
    before = _snapshot(tmp_path / "src")
    extra = ["--max-length", "4", "--bind", "X=Y"] if command == "stateful" else []
    assert main([command, str(src), "-o", str(src), *extra]) == 2
    err = capsys.readouterr().err
    assert f"{src}: is the input model" in err and "Traceback" not in err
    assert _snapshot(tmp_path / "src") == before


def test_writing_the_input_data_file_refuses(tmp_path, capsys):
    src = _external_model(tmp_path / "src", seed=5, name="m.onnx")  # its data: model.onnx.data
    before = _snapshot(tmp_path / "src")
    assert main(["optimize", str(src), "-o", str(tmp_path / "src" / "model.onnx"), "-q"]) == 2
    err = capsys.readouterr().err
    assert "model.onnx.data: is external data of the input model" in err
    assert _snapshot(tmp_path / "src") == before


@pytest.mark.parametrize("command", ["optimize", "export", "stateful"])
def test_a_data_file_another_model_uses_is_not_overwritten(tmp_path, capsys, command):
    out = tmp_path / "out"
    other = _external_model(out, seed=6, name="other.onnx")
    proto = onnx.load(str(other), load_external_data=False)  # other.onnx keeps W in target.onnx.data
    target = "model.onnx" if command == "export" else "target.onnx"
    for t in proto.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = target + ".data"
    other.write_bytes(proto.SerializeToString())
    os.replace(out / "model.onnx.data", out / f"{target}.data")
    before = _snapshot(out)
    argv = {"optimize": ["optimize", "builtin:decoder", "-o", str(out / target)],
            "export": ["export", "builtin:decoder", "-o", str(out)],
            "stateful": ["stateful", "builtin:rnn", "-o", str(out / target), "--max-length", "1",
                         "--bind", "state=stateN"]}[command]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{out / target}.data: {other} keeps its external data there" in err
    assert _snapshot(out) == before


def test_rerunning_optimize_to_the_same_output_works(tmp_path, capsys):
    src = _external_model(tmp_path / "src", seed=8)
    out = tmp_path / "out" / "opt.onnx"
    assert main(["optimize", str(src), "-o", str(out), "-q"]) == 0
    assert main(["optimize", str(src), "-o", str(out), "-q"]) == 0  # only opt.onnx uses opt.onnx.data
    np.testing.assert_allclose(_ort(out, _x()), _ort(src, _x()), rtol=1e-5, atol=1e-5)
    assert sorted(p.name for p in out.parent.iterdir()) == ["opt.onnx", "opt.onnx.data"]


def test_check_targets_ignores_missing_files_and_unrelated_models(tmp_path):
    _external_model(tmp_path, seed=9, name="a.onnx")
    (tmp_path / "notes.onnx").write_bytes(b"not a model")
    check_targets([tmp_path / "b.onnx", tmp_path / "b.onnx.data"], inputs=[tmp_path / "a.onnx"])
    with pytest.raises(OutputConflictError, match="a.onnx keeps its external data there"):
        check_targets([tmp_path / "model.onnx.data"])


# ---------------------------------------------------------------------- atomic writes


def _fail_midway(fh, *args, **kwargs):
    """A model writer that writes a little, then fails like a full disk."""
    fh.write(b"partial")
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_failing_model_write_leaves_the_previous_output_intact(tmp_path, capsys, monkeypatch):
    import onnxforge.graphbuilder.serde as serde

    src = _external_model(tmp_path / "src", seed=10)
    out = tmp_path / "out" / "opt.onnx"
    assert main(["optimize", str(src), "-o", str(out), "-q"]) == 0
    before = _snapshot(out.parent)
    monkeypatch.setattr(serde, "write_model", _fail_midway)
    assert main(["optimize", str(src), "-o", str(out), "-q"]) == 2
    assert "No space left on device" in capsys.readouterr().err
    assert _snapshot(out.parent) == before  # no temporary file left either


def test_a_failing_model_rename_puts_the_previous_data_file_back(tmp_path, capsys, monkeypatch):
    src = _external_model(tmp_path / "src", seed=11)
    out = tmp_path / "out" / "opt.onnx"
    assert main(["optimize", str(src), "-o", str(out), "-q"]) == 0
    before = _snapshot(out.parent)
    real = os.replace

    def replace(a, b, *args, **kwargs):  # the data file moves into place, the model does not
        if os.fspath(b) == str(out):
            raise OSError(errno.EIO, "Input/output error", os.fspath(a), None, os.fspath(b))
        return real(a, b, *args, **kwargs)

    monkeypatch.setattr(os, "replace", replace)
    other = _external_model(tmp_path / "other", seed=12)  # other weights: a different data file
    assert main(["optimize", str(other), "-o", str(out), "-q"]) == 2
    assert "Input/output error" in capsys.readouterr().err
    monkeypatch.setattr(os, "replace", real)
    assert _snapshot(out.parent) == before
    np.testing.assert_allclose(_ort(out, _x()), _ort(src, _x()), rtol=1e-5, atol=1e-5)


def test_a_failing_export_leaves_the_previous_export_intact(tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    assert main(["export", "builtin:decoder", "-o", str(out)]) == 0
    capsys.readouterr()
    before = _snapshot(out)
    real = onnx.save_model

    def save_model(proto, path, *args, **kwargs):
        real(proto, path, *args, **kwargs)  # the whole model is written, then the disk fills
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(onnx, "save_model", save_model)
    assert main(["export", "builtin:decoder", "-o", str(out)]) == 2
    monkeypatch.setattr(onnx, "save_model", real)
    assert _snapshot(out) == before


def test_a_failing_json_write_leaves_the_previous_file(tmp_path, monkeypatch):
    target = tmp_path / "feedback.json"
    write_json(target, {"a": "b"})

    def dump(obj, fh, **kwargs):
        fh.write("{\"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(json, "dump", dump)
    with pytest.raises(OSError):
        write_json(target, {"c": "d"})
    assert json.loads(target.read_text()) == {"a": "b"}
    assert [p.name for p in tmp_path.iterdir()] == ["feedback.json"]


def test_replace_all_is_all_or_nothing(tmp_path, monkeypatch):
    (tmp_path / "d").write_text("old data")
    (tmp_path / "m").write_text("old model")
    with atomic_files(tmp_path, ["d"]) as stage:  # a staged folder, renamed into place
        (Path(stage) / "d").write_text("new data")
    assert (tmp_path / "d").read_text() == "new data"
    (tmp_path / "d.tmp").write_text("newer data")
    (tmp_path / "m.tmp").write_text("new model")
    with pytest.raises(FileNotFoundError):
        replace_all([(str(tmp_path / "d.tmp"), str(tmp_path / "d")),
                     (str(tmp_path / "missing"), str(tmp_path / "m"))])
    assert (tmp_path / "d").read_text() == "new data" and (tmp_path / "m").read_text() == "old model"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "m", "m.tmp"]


def test_a_failing_sidecar_copy_leaves_the_previous_copy(decoder_models, tmp_path, capsys, monkeypatch):
    src = decoder_models["genai_fp32"]
    out = tmp_path / "opt"
    assert main(["optimize", str(src), "-o", str(out / "model.onnx"), "-q", "--passes", "dce"]) == 0
    before = (out / "tokenizer.json").read_bytes()
    real = shutil.copyfile

    def copyfile(a, b, *args, **kwargs):
        if os.path.basename(os.fspath(a)) == "tokenizer.json":
            Path(b).write_bytes(b"{\"trunc")
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(a, b, *args, **kwargs)

    monkeypatch.setattr(shutil, "copyfile", copyfile)
    assert main(["optimize", str(src), "-o", str(out / "model.onnx"), "-q", "--passes", "dce"]) == 2
    assert (out / "tokenizer.json").read_bytes() == before
    assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp")]


# ------------------------------------------------------------------ genai max_length


@pytest.mark.slow
def test_stateful_writes_its_capacity_as_the_genai_max_length(decoder_models, tmp_path, capsys):
    src = decoder_models["genai_fp32"]
    out = tmp_path / "stateful" / "model.onnx"
    assert main(["stateful", str(src), "-o", str(out), "--max-length", "256"]) == 0
    assert "genai_config.json: search.max_length: 2048 -> 256" in capsys.readouterr().out
    config = json.loads((out.parent / "genai_config.json").read_text())
    assert config["search"]["max_length"] == 256
    assert config["model"]["context_length"] == 2048  # the model's, unchanged
    changes = json.loads((out.parent / "genai_config.changes.json").read_text())
    assert {"key": "search.max_length", "before": 2048, "after": 256} == \
        {k: v for k, v in next(c for c in changes if c["key"] == "search.max_length").items() if k != "reason"}
    assert external_locations(out) <= {"model.onnx.data"}


# ------------------------------------------------------------------- generate context


def test_generate_clamps_new_tokens_to_the_capacity(capsys):
    assert main(["generate", "builtin:decoder", "--prompt-len", "3", "--new", "3000", "-q", "--json"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert len(report["tokens"]) == 62 and report["clamped"]["context"] == 64
    assert captured.err.startswith("warning: --new 3000 clamped to 62") and "Traceback" not in captured.err


def test_generate_refuses_a_prompt_longer_than_the_context(capsys):
    assert main(["generate", "builtin:decoder", "--prompt-len", "70", "--new", "1", "-q"]) == 2
    err = capsys.readouterr().err
    assert "the prompt has 70 tokens, more than the 64" in err and "Traceback" not in err


def _genai_copy(src: Path, folder: Path, context_length: int | None) -> Path:
    folder.mkdir()
    for name in ("model.onnx", "model.onnx.data"):
        shutil.copyfile(src.parent / name, folder / name)
    if context_length is not None:
        config = json.loads((src.parent / "genai_config.json").read_text())
        config["model"]["context_length"] = context_length
        (folder / "genai_config.json").write_text(json.dumps(config))
    return folder / "model.onnx"


@pytest.mark.slow
def test_generate_clamps_to_the_genai_context_length(decoder_models, tmp_path, capsys):
    model = _genai_copy(decoder_models["genai_fp32"], tmp_path / "g", context_length=8)
    assert main(["generate", str(model), "--prompt-ids", "5,17,42", "--new", "3000", "-q", "--json"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert len(report["tokens"]) == 6
    assert report["clamped"] == {"asked": 3000, "new": 6, "context": 8,
                                 "source": "model.context_length of genai_config.json"}
    assert "warning: --new 3000 clamped to 6" in captured.err
    assert main(["generate", str(model), "--prompt-len", "9", "--new", "1", "-q"]) == 2
    assert "the prompt has 9 tokens, more than the 8" in capsys.readouterr().err


@pytest.mark.slow
def test_generate_without_genai_config_reads_the_rotary_rows(decoder_models, tmp_path):
    from onnxforge.text.generator import context_of as _context

    model = _genai_copy(decoder_models["genai_fp32"], tmp_path / "g", context_length=None)
    assert _context(of.load(model), None) == (2048, "the rows of the rotary cache 'cos_cache'")
