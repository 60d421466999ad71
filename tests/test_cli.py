"""The command line: exit codes (0 ok, 1 invalid model, 2 usage or file error), output,
errors on stderr without tracebacks, and verification before optimize and export."""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys

import numpy as np
import pytest
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
                          capture_output=True, text=True, timeout=120, check=False)
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
    assert "cache buffers kept their addresses across every step: yes" in text
    assert "8. onnxruntime on the standard export: the same 24 tokens" in text
    table = text.split("on onnxforge's CPU backend")[1].split("cache buffers kept")[0]
    steps = [row.split() for row in table.splitlines() if row.split()[:1] and row.split()[0].isdigit()]
    assert len(steps) == 24
    assert all(row[-1] == "0" for row in steps)  # no payload byte copied in any step
    assert len({row[-2] for row in steps[1:]}) == 1  # one-token steps allocate the same bytes


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


def test_optimize_opset_23_fuses_an_opset_20_export(tmp_path, capsys, decoder_models):
    # the opset-20 torch export's decomposed attention and RMS norms become the opset-23
    # operators; without --opset the file keeps its opset; a refused raise is a clean error
    import onnxforge as of

    out = tmp_path / "o23.onnx"
    assert main(["optimize", str(decoder_models["torch20"]), "-o", str(out), "--opset", "23", "--json", "-q"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert "opset23_fusion" in [p["name"] for p in report["passes"]]
    m = of.load(str(out))
    assert m.opset_imports[""] == 23 and sum(n.op_type == "Attention" for n in m.graph) == 4
    assert main(["optimize", str(decoder_models["torch20"]), "-o", str(tmp_path / "o20.onnx"), "-q"]) == 0
    assert of.load(str(tmp_path / "o20.onnx")).opset_imports[""] == 20
    g = of.GraphBuilder(opset=13)
    x = g.input("x", TensorProto.FLOAT, [2, 8])
    r = g.op.Reciprocal(g.op.Sqrt(g.op.Add(g.op.ReduceMean(g.op.Pow(x, g.initializer("two", np.array(2.0, np.float32))),
                                                           axes=[-1]), g.initializer("eps", np.array(1e-5, np.float32)))))
    g.output(g.op.Mul(x, r), "y")
    src = tmp_path / "m13.onnx"
    of.save(g.to_model(), str(src))
    capsys.readouterr()
    assert main(["optimize", str(src), "-o", str(tmp_path / "m23.onnx"), "--opset", "23", "-q"]) != 0
    err = capsys.readouterr().err
    assert "ReduceMean" in err and "Traceback" not in err


def test_optimize_unknown_pass_is_a_clean_error(tmp_path, capsys):
    assert main(["optimize", "builtin:decoder", "-o", str(tmp_path / "o.onnx"),
                 "--passes", "nonsense"]) == 2
    assert "nonsense" in capsys.readouterr().err


# --------------------------------------------------------------- invalid input is refused


def _two_definitions_of_y():
    """y = Relu(x) and y = Neg(x): two nodes define one output (rule N3)."""
    from onnx import helper

    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu"),
                           helper.make_node("Neg", ["x"], ["y"], name="neg")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])


def _duplicate_initializer():
    """Two initializers named ``w`` (rule N2): the IR keeps one, the wire shows both."""
    from onnx import helper

    w = numpy_helper.from_array(np.ones(2, np.float32), "w")
    g = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])], [w, w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])


def test_api_optimize_and_export_refuse_an_invalid_model(tmp_path):
    import onnxforge as of

    m = _two_definitions_of_y()
    path = _write(tmp_path, m)
    for source in (m, path, m.SerializeToString()):
        for fn in (of.optimize, of.to_standard_onnx):
            with pytest.raises(of.VerificationError) as info:
                fn(source)
            assert info.value.rules == ["N3"]
            assert info.value.violations[0].path == "graph.node[1]('neg').output[0]"
    ir = of.load(m)
    with pytest.raises(of.VerificationError):
        of.optimize(ir)
    assert [n.op_type for n in ir.graph] == ["Relu", "Neg"]  # never rewritten
    with pytest.raises(of.VerificationError):
        of.to_standard_onnx(ir)


def test_optimize_checks_the_wire_not_only_the_ir(tmp_path):
    import onnxforge as of
    from onnxforge.api import load_verified

    path = _write(tmp_path, _duplicate_initializer())
    with pytest.raises(of.VerificationError) as info:
        of.optimize(path)
    assert info.value.rules == ["N2"]
    with pytest.raises(of.VerificationError):
        load_verified(path)
    assert of.check(of.load(path)) == []  # the IR holds one ``w``: only the wire shows both


@pytest.mark.parametrize("command", ["optimize", "export"])
def test_cli_refuses_an_invalid_model_with_exit_one(tmp_path, capsys, command):
    path = _write(tmp_path, _two_definitions_of_y())
    out = tmp_path / ("o.onnx" if command == "optimize" else "out")
    assert main([command, path, "-o", str(out)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "[N3] graph.node[1]('neg').output[0]: 'y' is already defined" in captured.err
    assert "Traceback" not in captured.err
    assert not out.exists()


def test_api_optimize_accepts_a_valid_model_unchanged_in_behaviour(tmp_path):
    import onnxforge as of

    out = of.optimize(_write(tmp_path, _every_extension_model(True)))
    of.verify(out)



# ------------------------------------------------------------- one read of the model file


def test_optimize_command_reads_the_model_once(tmp_path, capsys, monkeypatch):
    # onnxforge optimize runs onnxforge.optimize's steps: one map, payload scan and parse
    from onnxforge.passes.framework.pipeline import DEFAULT_PIPELINE
    from tests.graphbuilder.serde.test_one_load import ONCE, Reads, _model

    path = _write(tmp_path, _model())
    reads = Reads(monkeypatch, path)
    assert main(["optimize", path, "-o", str(tmp_path / "o.onnx"), "--json", "-q"]) == 0
    assert reads.counts == ONCE
    report = json.loads(capsys.readouterr().out)
    assert list(report) == ["load_seconds", "save_seconds", "before", "after", "passes", "output", "sidecar"]
    assert [p["name"] for p in report["passes"]] == list(DEFAULT_PIPELINE)
    assert list(report["passes"][0]) == ["name", "seconds", "modified", "nodes_before", "nodes_after"]
    assert report["before"] == {"nodes": 2, "initializers": 2, "initializer_bytes": 4096 + 1024}


def test_optimize_command_copies_sidecars_without_onnx_load(tmp_path, capsys, monkeypatch):
    from tests.passes.export.test_sidecar import _genai_folder

    src = _genai_folder(tmp_path / "src")
    for name in ("load", "load_model"):
        monkeypatch.setattr("onnx." + name, lambda *a, **k: pytest.fail("onnx.load called"))
    out = tmp_path / "out" / "model.onnx"
    assert main(["optimize", str(src), "-o", str(out), "--json", "-q"]) == 0
    sidecar = json.loads(capsys.readouterr().out)["sidecar"]
    assert list(sidecar["copied"]) == ["tokenizer.json"]  # weights.bin is the source model's data
    assert sorted(p.name for p in out.parent.iterdir()) == ["genai_config.changes.json", "genai_config.json",
                                                            "model.onnx", "model.onnx.data", "tokenizer.json"]


def test_generate_command_reads_the_model_once_and_its_config_beside_it(tmp_path, monkeypatch):
    from onnxforge.commands import generate as gen
    from onnxforge.graphbuilder.ir.core import Model
    from tests.graphbuilder.serde.test_one_load import ONCE, Reads, _model

    path = _write(tmp_path, _model())
    calls = []
    monkeypatch.setattr(gen, "generate", lambda model, *a, **k: calls.append((model, k)) or {"tokens": []})
    reads = Reads(monkeypatch, path)
    assert main(["generate", path, "--prompt-ids", "1", "--new", "1", "--json", "-q"]) == 0
    assert reads.counts == ONCE
    (model, kwargs), = calls
    assert isinstance(model, Model) and kwargs["config_from"] == path

# ---------------------------------------------------------------------- output paths


def test_optimize_output_that_is_a_folder(tmp_path, capsys):
    assert main(["optimize", "builtin:decoder", "-o", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "is a folder" in err and "Traceback" not in err


@pytest.mark.parametrize("command", ["export", "demo"])
def test_folder_output_that_is_a_file(tmp_path, capsys, command):
    target = tmp_path / "taken"
    target.write_text("x")
    argv = [command, "builtin:decoder", "-o", str(target)] if command == "export" \
        else [command, "-o", str(target)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "exists and is not a folder" in err and "Traceback" not in err
    assert target.read_text() == "x"


@pytest.mark.parametrize("command", ["optimize", "export"])
def test_output_below_a_file(tmp_path, capsys, command):
    (tmp_path / "file").write_text("x")
    assert main([command, "builtin:decoder", "-o", str(tmp_path / "file" / "out")]) == 2
    err = capsys.readouterr().err
    assert "is not a folder" in err and "Traceback" not in err


@pytest.mark.parametrize("command", ["optimize", "export"])
def test_output_in_a_folder_that_is_not_writable(tmp_path, capsys, monkeypatch, command):
    import os

    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    if os.geteuid() == 0:  # permission bits do not stop root: make access() say what they mean
        real = os.access
        monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if os.fspath(p) == str(locked)
                            else real(p, mode, **kw))
    try:
        assert main([command, "builtin:decoder", "-o", str(locked / "out")]) == 2
    finally:
        locked.chmod(0o700)
    err = capsys.readouterr().err
    assert "is not writable" in err and "Traceback" not in err


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc")
def test_a_write_that_fails_midway_is_a_clean_error(capsys):
    # /proc takes no new files, whoever asks: the failure shows only when saving
    assert main(["optimize", "builtin:decoder", "-o", "/proc/onnxforge-test.onnx"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot write /proc/onnxforge-test.onnx") and "Traceback" not in err


# -------------------------------------------------------------------------- options


@pytest.mark.parametrize("spec", ["", " ", "dce,", ",dce"])
def test_empty_pass_names_are_an_error(tmp_path, capsys, spec):
    out = tmp_path / "o.onnx"
    assert main(["optimize", "builtin:decoder", "-o", str(out), "--passes", spec]) == 2
    captured = capsys.readouterr()
    assert "--passes" in captured.err and captured.out == ""
    assert not out.exists()


def test_named_passes_run_alone(tmp_path, capsys):
    assert main(["optimize", "builtin:decoder", "-o", str(tmp_path / "o.onnx"), "--passes", "dce",
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [p["name"] for p in report["passes"]] == ["dce"]
    assert report["output"] == str(tmp_path / "o.onnx")


def test_version(capsys):
    import onnxforge
    from onnxforge._compiled import MODULES

    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    # the suite runs on an install, where every listed module is compiled (tests/test_compiled.py)
    n = len(MODULES)
    out = capsys.readouterr().out.strip()
    assert out == f"onnxforge {onnxforge.__version__} ({n} of {n} optimizer modules compiled)"


def test_version_counts_the_modules_that_run_from_source():
    from onnxforge._compiled import MODULES, PURE_ENV

    proc = subprocess.run([sys.executable, "-m", "onnxforge", "--version"], capture_output=True, text=True,
                          timeout=120, check=False, env={**os.environ, PURE_ENV: "1"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith(f"(0 of {len(MODULES)} optimizer modules compiled)")


def test_python_dash_m_onnxforge(tmp_path):
    import onnxforge

    path = _write(tmp_path, _every_extension_model(True))
    proc = subprocess.run([sys.executable, "-m", "onnxforge", "verify", path],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("OK")
    proc = subprocess.run([sys.executable, "-m", "onnxforge", "--version"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.stdout.strip().startswith(f"onnxforge {onnxforge.__version__} (")


def test_errors_have_no_traceback_unless_asked(capsys):
    assert main(["verify", "/nonexistent/model.onnx"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err
    for argv in (["--traceback", "verify", "/nonexistent/model.onnx"],
                 ["verify", "/nonexistent/model.onnx", "--traceback"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "Traceback (most recent call last)" in err and "no such model file" in err


def test_an_unexpected_error_is_one_line(capsys, monkeypatch):
    import onnxforge.report

    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(onnxforge.report, "summarize", broken)
    assert main(["inspect", "builtin:decoder"]) == 2
    err = capsys.readouterr().err
    assert "RuntimeError: boom" in err and "--traceback" in err and "Traceback (" not in err


def test_a_closed_pipe_is_no_error():
    # the reader is gone before the first write, as with `| head -1` on long output
    proc = subprocess.Popen([sys.executable, "-m", "onnxforge", "inspect", "builtin:decoder", "--values"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0
    assert "BrokenPipeError" not in err and "Traceback" not in err and "Exception ignored" not in err


def test_head_reads_the_first_line_quietly():
    cmd = f"{shlex.quote(sys.executable)} -m onnxforge inspect builtin:decoder --values | head -1"
    proc = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, timeout=120, check=False)
    assert proc.stdout.startswith("graph 'onnxforge_decoder'") and proc.stdout.count("\n") == 1
    assert proc.stderr == ""


def test_export_json_reports_what_was_written_and_changed(tmp_path, capsys):
    out = tmp_path / "std"
    assert main(["export", "builtin:decoder", "-o", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["output"] == str(out)
    assert report["written"] == {"model": str(out / "model.onnx"), "feedback": str(out / "feedback.json")}
    assert report["opset_imports"]["before"]["ai.onnxforge"] == 1
    assert "ai.onnxforge" not in report["opset_imports"]["after"]
    assert report["opset_imports"]["after"][""] >= report["opset_imports"]["before"][""]
    assert "ai.onnxforge::CacheUpdate" in report["ops_removed"]
    assert report["feedback"] == json.loads((out / "feedback.json").read_text())
    assert len(report["feedback"]) == 4 and report["genai_config_updated"] is False
    assert report["nodes"]["before"] > 0 and report["nodes"]["after"] > 0


def test_export_json_from_a_file(tmp_path, capsys):
    import onnxforge as of
    from onnxforge.samples import build_builtin

    src = tmp_path / "decoder.onnx"
    of.save(build_builtin("decoder"), src)
    assert main(["export", str(src), "-o", str(tmp_path / "std"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert "ai.onnxforge::CacheUpdate" in report["ops_removed"]


def _examples() -> dict[str, str]:
    from onnxforge.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    out = {}
    for name, p in sub.choices.items():
        lines = (p.epilog or "").splitlines()
        assert "example:" in lines, f"{name} --help has no example"
        out[name] = lines[lines.index("example:") + 1].strip()
    return out


def test_every_command_has_a_help_example():
    assert set(_examples()) == {"inspect", "verify", "optimize", "export", "run", "stateful", "generate",
                                "serve", "demo"}
    assert _examples()["serve"].startswith("onnxforge serve ")  # it serves until stopped: tests/serve runs it


@pytest.mark.parametrize("command", ["inspect", "verify", "optimize", "export", "run", "stateful",
                                     "generate", "demo"])
def test_each_help_example_runs_as_printed(command, tmp_path, monkeypatch, capsys):
    example = _examples()[command]
    assert example.startswith(f"onnxforge {command}")
    monkeypatch.chdir(tmp_path)
    assert main(shlex.split(example)[1:]) == 0
    assert capsys.readouterr().out


def test_help_shows_the_example(capsys):
    with pytest.raises(SystemExit):
        main(["optimize", "--help"])
    assert "onnxforge optimize builtin:decoder -o decoder.opt.onnx" in capsys.readouterr().out


def test_run_writes_outputs_equal_to_onnxruntime(tmp_path, capsys):
    import numpy as np
    import onnxruntime as ort

    import onnxforge as of
    from onnxforge.samples import build_builtin

    std = of.to_standard_onnx(build_builtin("decoder"))
    sess = ort.InferenceSession(std.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feeds = {}
    for i in sess.get_inputs():
        shape = [d if isinstance(d, int) else 1 for d in i.shape]
        if "int64" in i.type:
            feeds[i.name] = np.zeros(shape, np.int64)
        else:
            feeds[i.name] = rng.standard_normal(shape).astype(np.float32)
    feeds = {k: v for k, v in feeds.items() if k in {x.name for x in sess.get_inputs()}}
    want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    np.savez(tmp_path / "in.npz", **feeds)
    out = tmp_path / "out.npz"
    assert main(["run", "builtin:decoder", "--inputs", str(tmp_path / "in.npz"), "-o", str(out),
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["model"] == "builtin:decoder" and report["allocated_bytes"] > 0
    with np.load(out) as got:
        np.testing.assert_allclose(got["logits"], want["logits"], rtol=1e-5, atol=1e-5)


def test_run_rejects_a_feed_the_model_does_not_have(tmp_path, capsys):
    import numpy as np

    np.savez(tmp_path / "in.npz", nonsense=np.zeros(3, np.float32))
    assert main(["run", "builtin:decoder", "--inputs", str(tmp_path / "in.npz")]) != 0
    err = capsys.readouterr().err
    assert "nonsense" in err and "Traceback" not in err


def test_optimize_of_a_genai_folder_copies_its_sidecar_files(decoder_models, tmp_path, capsys):
    src = decoder_models["genai_fp32"]
    out = tmp_path / "opt"
    out.mkdir()
    assert main(["optimize", str(src), "-o", str(out / "model.onnx"), "--json", "-q"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["sidecar"] is not None
    config = json.loads((out / "genai_config.json").read_text())
    assert config["model"]["decoder"]["filename"] == "model.onnx"
    assert (out / "tokenizer.json").read_bytes() == (src.parent / "tokenizer.json").read_bytes()


# ----------------------------------------------------------------------------- stateful


def test_stateful_binds_a_recurrent_state_and_reports_it(tmp_path, capsys):
    import onnxforge as of

    out = tmp_path / "rnn.onnx"
    assert main(["stateful", "builtin:rnn", "-o", str(out), "--max-length", "1", "--bind", "state=stateN",
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["capacity"] == 1
    assert report["bindings"] == [{"input": "state", "output": "stateN", "in_place": False, "shape": [1, 8]}]
    model = of.load(out)
    assert [(i.name, o.name) for i, o in model.graph.bindings] == [("state", "stateN")]


@pytest.mark.parametrize("argv, message", [
    (["--bind", "state"], "expected INPUT=OUTPUT"),
    ([], "no past/present pairs found"),
    (["--bind", "state=nope"], "'nope'"),
])
def test_stateful_usage_errors_exit_2_without_a_traceback(tmp_path, capsys, argv, message):
    code = main(["stateful", "builtin:rnn", "-o", str(tmp_path / "o.onnx"), "--max-length", "1", *argv])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err
    assert not (tmp_path / "o.onnx").exists()


@pytest.mark.slow
def test_stateful_converts_a_genai_decoder_and_copies_its_config(decoder_models, tmp_path, capsys):
    out = tmp_path / "stateful" / "model.onnx"
    src = decoder_models["genai_fp32"]
    assert main(["stateful", str(src), "-o", str(out), "--max-length", "64"]) == 0
    text = capsys.readouterr().out
    assert "bound past_key_values.0.key <- present.0.key  (in place, capacity 64)" in text
    assert json.loads((out.parent / "genai_config.json").read_text())["model"]["decoder"]["filename"] == "model.onnx"


@pytest.mark.slow
def test_stateful_converts_a_torch_decoder(decoder_models, tmp_path, capsys):
    out = tmp_path / "model.onnx"
    assert main(["stateful", str(decoder_models["torch23"]), "-o", str(out), "--max-length", "32",
                 "--batch", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert len(report["bindings"]) == 8 and all(b["in_place"] for b in report["bindings"])
    assert report["bindings"][0]["shape"] == [1, 2, 32, 32]
