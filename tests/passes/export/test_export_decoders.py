"""Standard export of the real exported decoders (torch.onnx at opsets 20 / 23 and the
onnxruntime-genai builder's fp32 and int4 models): standard, checked, and numerically
equal to the originals in onnxruntime."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from onnxforge.passes.export import export_to_dir, non_standard_nodes, read_feedback, to_standard_onnx
from tests.fixtures.decoders import load_io_info, random_decoder_feeds

VARIANTS = ("torch20", "torch23", "genai_fp32", "genai_int4")


def _session(proto: onnx.ModelProto) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    # keep onnxruntime's DequantizeLinear + MatMul fusion at float accuracy (level 0)
    so.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "0")
    return ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _original(path: Path) -> onnx.ModelProto:
    proto = onnx.load(str(path))  # external data is read from the model's folder
    for node in proto.graph.node:
        if node.op_type == "MatMulNBits":
            for a in node.attribute:
                if a.name == "accuracy_level":
                    a.i = 0
    return proto


@pytest.fixture(scope="module")
def exported(decoder_models) -> dict[str, onnx.ModelProto]:
    return {v: to_standard_onnx(decoder_models[v]) for v in VARIANTS}


@pytest.mark.parametrize("variant", VARIANTS)
def test_real_decoder_exports_standard(variant: str, exported, decoder_models) -> None:
    proto = exported[variant]
    onnx.checker.check_model(proto, full_check=True)
    assert non_standard_nodes(proto) == []
    assert all(n.domain in ("", "ai.onnx") for n in proto.graph.node)
    version = {op.domain: op.version for op in proto.opset_import}[""]
    assert version == {"torch20": 20, "torch23": 23, "genai_fp32": 23, "genai_int4": 23}[variant]
    info = load_io_info(decoder_models[variant])
    assert [i.name for i in proto.graph.input] == [v["name"] for v in info["inputs"]]
    assert [o.name for o in proto.graph.output] == [v["name"] for v in info["outputs"]]
    if variant.startswith("genai"):
        types = {n.op_type for n in proto.graph.node}
        assert {"Attention", "RotaryEmbedding", "RMSNormalization"} <= types
        assert ("DequantizeLinear" in types) == (variant == "genai_int4")


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("past", [0, 3])
def test_real_decoder_matches_original(variant: str, past: int, exported, decoder_models) -> None:
    path = decoder_models[variant]
    feeds = random_decoder_feeds(path, past=past, seq=4, seed=past + 11)
    expected = _session(_original(path)).run(None, feeds)
    got = _session(exported[variant]).run(None, feeds)
    assert len(got) == len(expected)
    diff = max(float(np.abs(a - b).max()) for a, b in zip(expected, got))
    assert diff <= 1e-5, diff


def test_lower_false_rejects_onnxruntime_operators(decoder_models) -> None:
    from onnxforge.errors import ExportError

    with pytest.raises(ExportError) as info:
        to_standard_onnx(decoder_models["genai_int4"], lower=False)
    found = dict(info.value.constructs)
    ops = [r.split(" ")[0] for r in found.values()]
    assert ops.count("com.microsoft::MatMulNBits") == 21
    assert ops.count("com.microsoft::GroupQueryAttention") == 4
    assert ops.count("SimplifiedLayerNormalization") == 9
    assert all(p.startswith("graph.node[") for p in found)


def test_keep_com_microsoft_for_onnxruntime(decoder_models) -> None:
    path = decoder_models["genai_fp32"]
    kept = to_standard_onnx(path, keep_domains=["com.microsoft"])
    onnx.checker.check_model(kept, full_check=True)
    ops = {(n.domain, n.op_type) for n in kept.graph.node}
    assert ("com.microsoft", "GroupQueryAttention") in ops
    assert ("", "SimplifiedLayerNormalization") not in ops  # always lowered (not in a kept domain)
    feeds = random_decoder_feeds(path, past=2, seq=3, seed=4)
    a = _session(_original(path)).run(None, feeds)
    b = _session(kept).run(None, feeds)
    assert max(float(np.abs(x - y).max()) for x, y in zip(a, b)) <= 1e-5


def test_export_to_dir_writes_model_feedback_and_genai_config(decoder_models, tmp_path) -> None:
    src = decoder_models["genai_int4"]
    written = export_to_dir(src, tmp_path / "out")
    out = Path(written["model"])
    assert out == tmp_path / "out" / "model.onnx"
    onnx.checker.check_model(str(out), full_check=True)
    assert json.loads((tmp_path / "out" / "feedback.json").read_text()) == {}
    cfg = json.loads((tmp_path / "out" / "genai_config.json").read_text())
    source_cfg = json.loads((src.parent / "genai_config.json").read_text())
    assert source_cfg["search"]["past_present_share_buffer"] is True
    assert cfg["search"]["past_present_share_buffer"] is False
    # the change is recorded, with its reason, next to the configuration
    changes = json.loads(Path(written["genai_config_changes"]).read_text())
    assert [(c["key"], c["before"], c["after"]) for c in changes] == [
        ("search.past_present_share_buffer", True, False)]
    assert "GroupQueryAttention" in changes[0]["reason"]
    assert not (tmp_path / "out" / "model.onnx.data").exists()  # the source's data is not copied
    assert cfg["model"]["decoder"]["filename"] == "model.onnx"
    assert cfg["model"]["decoder"]["inputs"] == source_cfg["model"]["decoder"]["inputs"]
    assert (tmp_path / "out" / "tokenizer.json").is_file()
    # external data on request, loadable from the folder
    written = export_to_dir(src, tmp_path / "ext", external_data=True)
    assert Path(written["external_data"]).stat().st_size > 100_000
    proto = onnx.load(written["model"])
    feeds = random_decoder_feeds(src, past=1, seq=2)
    a = _session(proto).run(None, feeds)
    b = _session(_original(src)).run(None, feeds)
    assert max(float(np.abs(x - y).max()) for x, y in zip(a, b)) <= 1e-5


def test_export_to_dir_builtin_decoder_feedback(tmp_path) -> None:
    from onnxforge.samples import build_decoder

    written = export_to_dir(build_decoder(), tmp_path)
    fb = json.loads(Path(written["feedback"]).read_text())
    assert fb == {f"cache.{l}.{k}": f"present.{l}.{k}" for l in range(2) for k in ("key", "value")}
    assert "genai_config" not in written
    assert read_feedback(onnx.load(written["model"])) == fb


def test_exported_genai_folder_generates_the_same_tokens(decoder_models, tmp_path) -> None:
    import onnxruntime_genai as og
    src = decoder_models["genai_fp32"]
    export_to_dir(src, tmp_path)
    runs = []
    for folder in (src.parent, tmp_path):
        model = og.Model(str(folder))
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=16, do_sample=False)
        gen = og.Generator(model, params)
        gen.append_tokens(np.array([[1, 5, 9, 17]], dtype=np.int32))
        tokens = []
        while not gen.is_done():
            gen.generate_next_token()
            tokens.append(int(gen.get_next_tokens()[0]))
        runs.append(tokens)
    assert len(runs[0]) == 12 and runs[0] == runs[1]


def _generate(folder: Path, prompt: list[int], max_length: int = 16) -> list[int]:
    import onnxruntime_genai as og

    model = og.Model(str(folder))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=max_length, do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens(np.array([prompt], dtype=np.int32))
    tokens = []
    while not gen.is_done():
        gen.generate_next_token()
        tokens.append(int(gen.get_next_tokens()[0]))
    return tokens


def test_export_keeping_com_microsoft_changes_only_the_filename(decoder_models, tmp_path) -> None:
    src = decoder_models["genai_fp32"]
    written = export_to_dir(src, tmp_path, keep_domains=["com.microsoft"], filename="decoder.onnx")
    cfg = json.loads(Path(written["genai_config"]).read_text())
    assert cfg["search"]["past_present_share_buffer"] is True  # GroupQueryAttention kept
    changes = json.loads(Path(written["genai_config_changes"]).read_text())
    assert [(c["key"], c["before"], c["after"]) for c in changes] == [
        ("model.decoder.filename", "model.onnx", "decoder.onnx")]
    assert _generate(tmp_path, [3, 8, 21]) == _generate(src.parent, [3, 8, 21])


def test_optimized_genai_folder_with_sidecar_files_generates_the_same_tokens(decoder_models,
                                                                           tmp_path) -> None:
    import onnxforge as of
    from onnxforge.passes.export.sidecar import copy_sidecar_files

    src = decoder_models["genai_fp32"]
    optimized = of.optimize(str(src))
    of.save(optimized, tmp_path / "model.opt.onnx")
    result = copy_sidecar_files(src.parent, tmp_path, model_filename="model.opt.onnx", model=optimized)
    assert {"tokenizer.json", "tokenizer_config.json"} <= set(result.copied)
    assert "model.onnx" not in result.copied and "model.onnx.data" not in result.copied
    assert [str(c) for c in result.changes] == [
        ('genai_config.json: model.decoder.filename: "model.onnx" -> "model.opt.onnx" '
         "(the decoder is the rewritten model)")]
    assert json.loads(Path(result.changes_file).read_text()) == [c.to_json() for c in result.changes]
    cfg = json.loads((tmp_path / "genai_config.json").read_text())
    assert cfg["model"]["decoder"]["filename"] == "model.opt.onnx"
    assert cfg["search"]["past_present_share_buffer"] is True
    expected = _generate(src.parent, [1, 5, 9, 17])
    assert len(expected) == 12 and _generate(tmp_path, [1, 5, 9, 17]) == expected


def test_sidecar_refuses_a_config_naming_missing_outputs(decoder_models, tmp_path) -> None:
    from onnxforge.errors import ExportError
    from onnxforge.passes.export.sidecar import copy_sidecar_files

    src = decoder_models["genai_fp32"]
    proto = onnx.load(str(src), load_external_data=False)
    del proto.graph.output[0]  # logits
    with pytest.raises(ExportError) as info:
        copy_sidecar_files(src.parent, tmp_path, model_filename="model.onnx", model=proto)
    (path, reason), = info.value.constructs
    assert path == "genai_config.model.decoder.outputs.logits" and "'logits'" in reason


def test_sidecar_refuses_to_copy_into_the_source_folder(decoder_models) -> None:
    from onnxforge.passes.export.sidecar import SidecarError, copy_sidecar_files

    src = decoder_models["genai_fp32"]
    before = (src.parent / "genai_config.json").read_bytes()
    with pytest.raises(SidecarError, match="the output folder is the source folder"):
        copy_sidecar_files(src.parent, src.parent, model_filename="model.opt.onnx", model=src)
    assert (src.parent / "genai_config.json").read_bytes() == before
