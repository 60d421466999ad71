"""``onnxforge run``: the command function and its parser (onnxforge/commands/run.py)."""
from __future__ import annotations

import argparse
import json

import numpy as np
import pytest
from onnx import helper

from onnxforge.commands.run import add_run_parser, run_command
from onnxforge.kernels_cy.errors import FeedError
from tests.kernels_cy.helpers import F, onnx_model, tensor


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="onnxforge")
    add_run_parser(p.add_subparsers(dest="command", required=True))
    return p


@pytest.fixture()
def files(tmp_path):
    m = onnx_model([helper.make_node("Mul", ["x", "x"], ["y"])], [tensor("x", F, ["n"])], [tensor("y", F, ["n"])])
    model = tmp_path / "m.onnx"
    model.write_bytes(m.SerializeToString())
    feeds = tmp_path / "in.npz"
    np.savez(feeds, x=np.arange(3, dtype=np.float32))
    return model, feeds, tmp_path


def test_run_prints_outputs_and_writes_npz(files, capsys):
    model, feeds, tmp = files
    out = tmp / "out.npz"
    args = _parser().parse_args(["run", str(model), "--inputs", str(feeds), "-o", str(out), "--threads", "1"])
    assert args.func(args) == 0
    text = capsys.readouterr().out
    assert "y" in text and "float32" in text and "[3]" in text and "allocated 12 B" in text
    np.testing.assert_array_equal(np.load(out)["y"], [0, 1, 4])


def test_run_json(files, capsys):
    model, feeds, _ = files
    args = _parser().parse_args(["run", str(model), "--inputs", str(feeds), "--json"])
    assert run_command(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["outputs"] == [{"name": "y", "dtype": "float32", "shape": [3]}]
    assert report["allocated_bytes"] == 12 and report["copied_bytes"] == 0 and report["steps"] == 1


def test_run_with_a_wrong_feed_is_a_typed_error(files, tmp_path):
    model, _, _ = files
    bad = tmp_path / "bad.npz"
    np.savez(bad, z=np.zeros(2))
    args = _parser().parse_args(["run", str(model), "--inputs", str(bad)])
    with pytest.raises(FeedError, match="unknown feed"):
        run_command(args)
