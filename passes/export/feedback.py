"""The export folder writer: ``model.onnx`` (+ external data), ``feedback.json``,
and ``genai_config.json`` when the source came with one.

::

    export_to_dir("genai_int4/model.onnx", "out/")
    # out/model.onnx          standard ONNX (external data in model.onnx.data when large)
    # out/feedback.json       {"cache.0.key": "present.0.key", ...}  (persistent bindings)
    # out/genai_config.json   the source's config, with filename and past/present sharing updated

``feedback.json`` holds the lowered persistent bindings: after each call, feed
the value of each output as the named input of the next call. A model without
bindings gets an empty mapping.

The onnxruntime-genai configuration is copied with ``model.decoder.filename``
set to the written file and ``search.past_present_share_buffer`` set to false
unless the exported graph still shares past and present buffers (a kept
``com.microsoft::GroupQueryAttention``): the lowered graph's present cache is
``concat(past, new)``, a different tensor from its past input. Input and output
names in the configuration are kept (the export does not rename graph inputs
or outputs); names the configuration lists that the exported model lacks are
reported by :class:`~onnxforge.errors.ExportError`.
"""
from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable
from typing import Any

import onnx

from onnxforge.errors import ExportError
from onnxforge.passes.export.opset import proto_graphs
from onnxforge.passes.export.standard import FEEDBACK_KEY, to_standard_onnx

__all__ = ["EXTERNAL_THRESHOLD", "export_to_dir", "read_feedback", "update_genai_config"]

EXTERNAL_THRESHOLD = 256 * 1024 * 1024
"""Models whose weights reach this many bytes are written with external data."""

GENAI_CONFIG = "genai_config.json"
FEEDBACK_FILE = "feedback.json"


def read_feedback(proto: onnx.ModelProto) -> dict[str, str]:
    """The ``{input: output}`` feedback mapping recorded in an exported model (empty if none)."""
    for p in proto.metadata_props:
        if p.key == FEEDBACK_KEY:
            try:
                data = json.loads(p.value)
            except json.JSONDecodeError as exc:
                raise ExportError([(f"metadata_props[{FEEDBACK_KEY!r}]", f"not JSON: {exc}")]) from exc
            if not isinstance(data, dict):
                raise ExportError([(f"metadata_props[{FEEDBACK_KEY!r}]", "not a JSON object")])
            return {str(k): str(v) for k, v in data.items()}
    return {}


def _source_dir(model: Any) -> str | None:
    if isinstance(model, (str, os.PathLike)):
        return os.path.dirname(os.path.abspath(os.fspath(model)))
    return getattr(model, "model_dir", None)


def _shares_buffers(proto: onnx.ModelProto) -> bool:
    for g, _ in proto_graphs(proto.graph):
        for n in g.node:
            if n.domain == "com.microsoft" and n.op_type in ("GroupQueryAttention", "PagedAttention"):
                return True
    return False


def update_genai_config(config: dict[str, Any], proto: onnx.ModelProto, filename: str) -> dict[str, Any]:
    """A copy of an onnxruntime-genai configuration describing the exported ``proto``."""
    out = json.loads(json.dumps(config))
    decoder = out.setdefault("model", {}).setdefault("decoder", {})
    decoder["filename"] = filename
    inputs = {i.name for i in proto.graph.input}
    outputs = {o.name for o in proto.graph.output}
    problems: list[tuple[str, str]] = []
    for section, names in (("inputs", inputs), ("outputs", outputs)):
        for key, pattern in dict(decoder.get(section, {})).items():
            if not isinstance(pattern, str):
                continue
            if "%d" in pattern:
                if not any(_matches(pattern, n) for n in names):
                    problems.append((f"genai_config.model.decoder.{section}.{key}",
                                     f"{pattern!r} matches no {section[:-1]} of the exported model"))
            elif pattern not in names:
                if key in ("position_ids", "attention_mask") and section == "inputs":
                    continue  # optional inputs GenAI feeds only when the model has them
                problems.append((f"genai_config.model.decoder.{section}.{key}",
                                 f"{pattern!r} is not an {section[:-1]} of the exported model"))
    if problems:
        raise ExportError(problems)
    search = out.setdefault("search", {})
    search["past_present_share_buffer"] = bool(search.get("past_present_share_buffer", False)) and \
        _shares_buffers(proto)
    return out


def _matches(pattern: str, name: str) -> bool:
    head, _, tail = pattern.partition("%d")
    if not (name.startswith(head) and name.endswith(tail)) or len(name) <= len(head) + len(tail):
        return False
    return name[len(head):len(name) - len(tail)].isdigit()


def _weights_bytes(proto: onnx.ModelProto) -> int:
    return sum(len(t.raw_data) for t in proto.graph.initializer)


def export_to_dir(model: Any, out_dir: str | os.PathLike[str], *, target_opset: int | None = None,
                  keep_domains: Iterable[str] = (), filename: str = "model.onnx",
                  external_data: bool | None = None) -> dict[str, str]:
    """Export ``model`` (IR Model, ModelProto, bytes or path) to standard ONNX in ``out_dir``.

    Writes ``filename`` (with ``filename + ".data"`` external data when
    ``external_data`` is True, or by default when the weights reach
    :data:`EXTERNAL_THRESHOLD`), ``feedback.json``, and ``genai_config.json``
    when the source model's folder has one (plus the tokenizer files found next
    to it, so onnxruntime-genai can load the folder). Returns ``{kind: path}`` of
    the files written.
    """
    out_dir = os.fspath(out_dir)
    src = _source_dir(model)
    proto = to_standard_onnx(model, target_opset=target_opset, keep_domains=keep_domains)
    os.makedirs(out_dir, exist_ok=True)  # after the export: a refused model leaves no folder
    written: dict[str, str] = {}
    model_path = os.path.join(out_dir, filename)
    big = _weights_bytes(proto) >= EXTERNAL_THRESHOLD if external_data is None else external_data
    if big:
        data_name = filename + ".data"
        data_path = os.path.join(out_dir, data_name)
        if os.path.exists(data_path):
            os.unlink(data_path)
        onnx.save_model(proto, model_path, save_as_external_data=True, all_tensors_to_one_file=True,
                        location=data_name, size_threshold=1024)
        written["external_data"] = data_path
    else:
        onnx.save_model(proto, model_path)
    written["model"] = model_path
    feedback = read_feedback(proto)
    fb_path = os.path.join(out_dir, FEEDBACK_FILE)
    with open(fb_path, "w", encoding="utf-8") as fh:
        json.dump(feedback, fh, indent=2)
    written["feedback"] = fb_path
    if src is not None and os.path.isfile(os.path.join(src, GENAI_CONFIG)):
        with open(os.path.join(src, GENAI_CONFIG), encoding="utf-8") as fh:
            config = json.load(fh)
        cfg_path = os.path.join(out_dir, GENAI_CONFIG)
        with open(cfg_path, "w", encoding="utf-8") as fh:
            json.dump(update_genai_config(config, proto, filename), fh, indent=4)
        written["genai_config"] = cfg_path
        for extra in os.listdir(src):
            if extra.startswith("tokenizer") or extra in ("special_tokens_map.json", "vocab.json",
                                                          "merges.txt", "chat_template.jinja"):
                dst = os.path.join(out_dir, extra)
                if os.path.abspath(dst) != os.path.abspath(os.path.join(src, extra)):
                    shutil.copyfile(os.path.join(src, extra), dst)
                    written[extra] = dst
    return written
