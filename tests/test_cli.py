"""The command line: verify / inspect exit codes and output."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
from onnx import TensorProto, numpy_helper

from onnxforge.cli import main
from onnxforge.proto_ext import schema
from tests.proto_ext.test_schema import _every_extension_model


def _write(tmp_path, m, name="m.onnx"):
    path = tmp_path / name
    path.write_bytes(m.SerializeToString())
    return str(path)


def test_verify_ok_exits_zero(tmp_path, capsys):
    path = _write(tmp_path, _every_extension_model(True))
    assert main(["verify", path]) == 0
    assert "OK" in capsys.readouterr().out


def test_verify_prints_each_violation_and_exits_one(tmp_path, capsys):
    m = _every_extension_model(True)
    m.graph.encoded_initializer[1].raw_data = b"\x01\x02"  # A8: 4 codes need 4 bytes
    m.graph.persistent_bindings.add(input_name="cache", output_name="nope")  # B2 and B3
    path = _write(tmp_path, m)
    assert main(["verify", path]) == 1
    out = capsys.readouterr().out.splitlines()
    assert any(line.startswith("[A8] graph.encoded_initializer['q']") for line in out)
    assert any(line.startswith("[B2] graph.persistent_bindings[1]") for line in out)
    assert main(["verify", "--json", path]) == 1
    records = json.loads(capsys.readouterr().out)
    assert {"A8", "B2"} <= {r["rule"] for r in records}


def test_verify_garbage_file_is_a_clean_error(tmp_path, capsys):
    path = tmp_path / "bad.onnx"
    path.write_bytes(b"\xff\xff\xff\xff")
    assert main(["verify", str(path)]) == 2
    assert "cannot parse" in capsys.readouterr().err


def test_verify_missing_file(capsys):
    assert main(["verify", "/nonexistent/model.onnx"]) == 2
    assert "no such model file" in capsys.readouterr().err


def test_inspect_json_lists_extensions(tmp_path, capsys):
    m = _every_extension_model(True)
    big = numpy_helper.from_array(np.zeros((16, 8), np.float32), "dense")
    m.graph.initializer.add().CopyFrom(schema.from_onnx(big))
    path = _write(tmp_path, m)
    assert main(["inspect", "--json", path]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["opsets"] == {"": 21, "ai.onnxforge": 1}
    assert s["op_histogram"] == {"ai.onnxforge::CacheUpdate": 1, "Identity": 1}
    assert s["initializers"] == {"count": 1, "bytes": 16 * 8 * 4}
    assert [e["name"] for e in s["encoded_initializers"]] == ["w", "q"]
    assert s["encoded_initializers"][0]["bytes"] == 40
    assert s["encoded_initializers"][1]["layout"] == "affine INT8"
    assert s["struct_types"][0]["name"] == "Int4Block"
    assert s["persistent_bindings"] == [{"input": "cache", "output": "updated"}]
    assert s["aliases"][0]["output"] == "updated" and s["aliases"][0]["input"] == "cache"
    assert s["inputs"][0] == {"name": "cache", "type": "FLOAT[1, 8, 4]", "access": "READ_WRITE"}


def test_inspect_text(tmp_path, capsys):
    path = _write(tmp_path, _every_extension_model(True))
    assert main(["inspect", path]) == 0
    out = capsys.readouterr().out
    assert "cache: FLOAT[1, 8, 4]  (READ_WRITE)" in out
    assert "cache <- updated" in out
    assert "type_id=2001 'Int4Block'" in out


def test_console_script_entry_point(tmp_path):
    path = _write(tmp_path, _every_extension_model(True))
    proc = subprocess.run([sys.executable, "-m", "onnxforge.cli", "verify", path],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("OK")


def test_inspect_builtin_decoder_shows_symbolic_shapes(capsys):
    assert main(["inspect", "--json", "--values", "builtin:decoder"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["outputs"][0] == {"name": "logits", "type": "FLOAT[1, seq, 64]"}
    assert s["inputs"][2]["access"] == "READ_WRITE"
    assert len(s["persistent_bindings"]) == 4
    assert s["values"]["present.0.key"] == "FLOAT[1, 2, 64, 8]"


def test_export_writes_standard_model_and_feedback(tmp_path, capsys):
    import onnx

    assert main(["export", "builtin:decoder", "-o", str(tmp_path / "out")]) == 0
    std = onnx.load(str(tmp_path / "out" / "model.onnx"))
    onnx.checker.check_model(std, full_check=True)
    assert all(n.domain in ("", "ai.onnx") for n in std.graph.node)
    feedback = json.loads((tmp_path / "out" / "feedback.json").read_text())
    assert feedback["cache.0.key"] == "present.0.key" and len(feedback) == 4


def test_demo_runs_end_to_end(tmp_path):
    import io

    from onnxforge.samples import run_demo

    out = io.StringIO()
    assert run_demo(str(tmp_path / "demo"), out=out) == 0
    text = out.getvalue()
    assert (tmp_path / "demo" / "decoder.onnx").exists()
    assert (tmp_path / "demo" / "decoder.standard.onnx").exists()
    assert "6. onnxruntime decoded 8 tokens" in text


def test_optimize_reports_and_preserves_declarations(tmp_path, capsys):
    import onnxforge as of

    out = tmp_path / "opt.onnx"
    assert main(["optimize", "builtin:decoder", "-o", str(out), "--json", "--debug"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [p["name"] for p in report["passes"]][-1] == "dce"
    assert report["after"]["nodes"] <= report["before"]["nodes"]
    m = of.load(str(out))
    of.verify(m)
    assert len(m.graph.bindings) == 4
    assert len(m.graph.encoded_initializers) == 5
    assert sum(1 for n in m.graph if n.op_type == "CacheUpdate") == 4


def test_optimize_unknown_pass_is_a_clean_error(tmp_path, capsys):
    assert main(["optimize", "builtin:decoder", "-o", str(tmp_path / "o.onnx"),
                 "--passes", "nonsense"]) == 2
    assert "nonsense" in capsys.readouterr().err
