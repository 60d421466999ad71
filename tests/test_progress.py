"""Progress bars of the command line: shown for large models, hidden for small ones and ``--quiet``."""
from __future__ import annotations

import pytest

from onnxforge import progress
from onnxforge.cli import main
from onnxforge.samples import builtin_model


def test_stages_names_each_stage_and_completes(capsys):
    with progress.stages("export", ["load", "write"], enabled=True) as step:
        step("load")
        step("write")
    err = capsys.readouterr().err
    assert "export" in err and "load" in err and "write" in err
    assert "2/2" in err


def test_stages_disabled_prints_nothing(capsys):
    with progress.stages("export", ["load"], enabled=False) as step:
        step("load")
    assert capsys.readouterr().err == ""


def test_is_large_counts_the_external_data_beside_the_model(tmp_path):
    model = tmp_path / "m.onnx"
    model.write_bytes(b"x" * 10)
    assert not progress.is_large(model, min_bytes=100)
    (tmp_path / "m.onnx.data").write_bytes(b"x" * 95)
    assert progress.is_large(model, min_bytes=100)
    (tmp_path / "other.onnx.data").write_bytes(b"x" * 1000)  # another model's data does not count
    assert progress.is_large(model, min_bytes=106) is False
    assert not progress.is_large("builtin:decoder", min_bytes=0)
    assert not progress.is_large(tmp_path / "missing.onnx", min_bytes=0)


@pytest.fixture()
def model_file(tmp_path):
    path = tmp_path / "decoder.onnx"
    path.write_bytes(builtin_model("decoder").SerializeToString())
    return str(path)


@pytest.mark.parametrize("command, bar", [
    (["inspect", "{m}"], "inspect"),
    (["export", "{m}", "-o", "{d}"], "export"),
    (["optimize", "{m}", "-o", "{d}/o.onnx"], "load"),
])
def test_commands_show_a_bar_for_a_large_model_and_not_with_quiet(monkeypatch, capsys, tmp_path,
                                                                   model_file, command, bar):
    monkeypatch.setattr(progress, "PROGRESS_MIN_BYTES", 0)
    argv = [a.format(m=model_file, d=tmp_path / "out") for a in command]
    assert main(argv) == 0
    assert f"{bar}:" in capsys.readouterr().err
    assert main([*argv, "--quiet"]) == 0
    assert f"{bar}:" not in capsys.readouterr().err


def test_small_models_get_no_bar(capsys, model_file):
    assert main(["inspect", model_file]) == 0
    assert "inspect:" not in capsys.readouterr().err
