"""Sidecar files of a model folder, and the onnxruntime-genai configuration.

A model folder made by the onnxruntime-genai builder holds more than the model:
``genai_config.json``, the tokenizer files, chat templates... onnxruntime-genai
loads the folder, not the file. :func:`copy_sidecar_files` copies those files
next to a rewritten model (``optimize`` or ``export`` output) so the new folder
runs the same way::

    src/model.onnx  src/model.onnx.data  src/genai_config.json  src/tokenizer.json ...
        -> out/model.opt.onnx (written by the caller)
           out/genai_config.json          decoder.filename = "model.opt.onnx"
           out/genai_config.changes.json  [{"key": "model.decoder.filename", ...}]
           out/tokenizer.json ...

What is copied: every regular top-level file of the source folder except ONNX
models and their external data, plus the ONNX models (and their data) that
``genai_config.json`` names other than the decoder being replaced (the parts of
a multi-model pipeline). The source model, its data and the files the caller
lists in ``exclude`` are never copied.

Every change made to ``genai_config.json`` is a :class:`ConfigChange` (key,
before, after, reason), returned in :class:`SidecarResult` and written to
``genai_config.changes.json`` next to the configuration. The rules: the
decoder's ``filename`` names the new model; ``search.past_present_share_buffer``
stays true only while the graph keeps an operator that shares the past and
present buffers (``com.microsoft::GroupQueryAttention``): a standard lowering
computes a present cache distinct from its past input; for a stateful model
(``max_length`` given) ``search.max_length`` becomes its cache capacity, while
``model.context_length`` stays the model's. Input and output names
the configuration lists that the model lacks are an
:class:`~onnxforge.errors.ExportError`.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import onnx
from onnxforge.passes.export.opset import proto_graphs
from onnxforge.proto_ext.errors import ExportError, OnnxforgeError
from onnxforge.proto_ext.outputs import copy_file, write_json

__all__ = [
    "CHANGES_FILE",
    "GENAI_CONFIG",
    "ConfigChange",
    "SidecarError",
    "SidecarResult",
    "copy_sidecar_files",
    "genai_config_changes",
    "model_data_files",
]

GENAI_CONFIG = "genai_config.json"
CHANGES_FILE = "genai_config.changes.json"
_SHARING_OPS = {("com.microsoft", "GroupQueryAttention"), ("com.microsoft", "PagedAttention")}
_OPTIONAL_INPUTS = ("position_ids", "attention_mask")  # GenAI feeds them only when present


class SidecarError(OnnxforgeError, ValueError):
    """Sidecar files cannot be copied as asked (e.g. into their own folder)."""


@dataclass(frozen=True)
class ConfigChange:
    """One change made to ``genai_config.json``; ``before`` is None when the key was absent."""

    key: str
    before: Any
    after: Any
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "before": self.before, "after": self.after, "reason": self.reason}

    def __str__(self) -> str:
        before = "(absent)" if self.before is None else json.dumps(self.before)
        return f"{GENAI_CONFIG}: {self.key}: {before} -> {json.dumps(self.after)} ({self.reason})"


@dataclass
class SidecarResult:
    """What :func:`copy_sidecar_files` wrote: ``copied`` maps each source file name to
    its copy; ``genai_config`` / ``changes_file`` are the written configuration and
    its change record (None without a configuration)."""

    copied: dict[str, str] = field(default_factory=dict)
    genai_config: str | None = None
    changes_file: str | None = None
    changes: list[ConfigChange] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"copied": dict(self.copied), "genai_config": self.genai_config,
                "changes_file": self.changes_file,
                "genai_config_changes": [c.to_json() for c in self.changes]}


# --------------------------------------------------------------------------- model facts


def _model_facts(model: Any) -> tuple[set[str], set[str], bool]:
    """``(input names, output names, shares past/present buffers)`` of an IR model, a
    ModelProto or a model file."""
    from onnxforge.graphbuilder.ir.core import Model

    if isinstance(model, Model):
        g = model.graph
        shares = any((n.domain, n.op_type) in _SHARING_OPS for sub in model.all_graphs() for n in sub)
        return {v.name for v in g.inputs}, {v.name for v in g.outputs}, shares
    if isinstance(model, (str, os.PathLike)):
        model = _skeleton_proto(model)
    if not isinstance(model, onnx.ModelProto):
        raise TypeError(f"expected an IR Model, a ModelProto or a path, got {type(model).__name__}")
    shares = any((n.domain, n.op_type) in _SHARING_OPS for g, _ in proto_graphs(model.graph)
                 for n in g.node)
    return {i.name for i in model.graph.input}, {o.name for o in model.graph.output}, shares


def _skeleton_proto(path: str | os.PathLike[str]) -> onnx.ModelProto:
    """The ModelProto of a model file without its large payloads (mapped and scanned once,
    no payload copied)."""
    from onnxforge.proto_ext.errors import ModelFileError
    from onnxforge.proto_ext.outputs import model_skeleton

    skeleton = model_skeleton(os.fspath(path))
    if skeleton is None:
        raise ModelFileError(f"{os.fspath(path)}: not a readable ONNX model file")
    return onnx.ModelProto.FromString(skeleton)


def _matches(pattern: str, name: str) -> bool:
    head, _, tail = pattern.partition("%d")
    if not (name.startswith(head) and name.endswith(tail)) or len(name) <= len(head) + len(tail):
        return False
    return name[len(head):len(name) - len(tail)].isdigit()


def _check_names(decoder: dict[str, Any], inputs: set[str], outputs: set[str]) -> None:
    problems: list[tuple[str, str]] = []
    for section, names in (("inputs", inputs), ("outputs", outputs)):
        for key, pattern in dict(decoder.get(section, {})).items():
            if not isinstance(pattern, str):
                continue
            if "%d" in pattern:
                if not any(_matches(pattern, n) for n in names):
                    problems.append((f"genai_config.model.decoder.{section}.{key}",
                                     f"{pattern!r} matches no {section[:-1]} of the model"))
            elif pattern not in names and not (section == "inputs" and key in _OPTIONAL_INPUTS):
                problems.append((f"genai_config.model.decoder.{section}.{key}",
                                 f"{pattern!r} is not an {section[:-1]} of the model"))
    if problems:
        raise ExportError(problems)


def genai_config_changes(config: dict[str, Any], model: Any, filename: str, *,
                         max_length: int | None = None) -> tuple[dict[str, Any], list[ConfigChange]]:
    """The configuration describing ``model`` (IR Model, ModelProto or path) written
    as ``filename``, and the list of changes made to ``config`` (not modified).

    ``max_length``: the token capacity of the model's caches (a stateful model);
    ``search.max_length`` is set to it so that onnxruntime-genai stops generating
    where the caches end (``model.context_length`` stays the model's)."""
    out = json.loads(json.dumps(config))
    changes: list[ConfigChange] = []
    inputs, outputs, shares = _model_facts(model)
    decoder = out.setdefault("model", {}).setdefault("decoder", {})
    _check_names(decoder, inputs, outputs)
    old_name = decoder.get("filename")
    if old_name != filename:
        decoder["filename"] = filename
        changes.append(ConfigChange("model.decoder.filename", old_name, filename,
                                    "the decoder is the rewritten model"))
    search = out.setdefault("search", {})
    old_share = search.get("past_present_share_buffer")
    if not shares and old_share is not False:
        search["past_present_share_buffer"] = False
        changes.append(ConfigChange(
            "search.past_present_share_buffer", old_share, False,
            "the model has no operator that writes its present cache into the past buffer "
            "(the standard lowering of GroupQueryAttention returns a new present tensor of "
            "length past + new)"))
    if max_length is not None and search.get("max_length") != max_length:
        changes.append(ConfigChange("search.max_length", search.get("max_length"), max_length,
                                    f"the model's caches hold {max_length} tokens (stateful --max-length)"))
        search["max_length"] = max_length
    return out, changes


# --------------------------------------------------------------------------- copying


def model_data_files(path: str | os.PathLike[str]) -> set[str]:
    """The external-data file names (relative to the model's folder, normalized) of a
    model file; empty when it has none or cannot be read as a model.

    Read from a wire scan of the mapped file
    (:func:`~onnxforge.proto_ext.wirescan.external_locations`): no payload is read and
    no protobuf object is built."""
    from onnxforge.proto_ext.errors import WireError
    from onnxforge.proto_ext.wirescan import external_locations, map_model_file, release_map

    try:
        mapping = map_model_file(path)
    except (OSError, ValueError):  # missing, unreadable or empty (WireError is a ValueError)
        return set()
    try:
        return {os.path.normpath(location) for location in external_locations(mapping)}
    except WireError:
        return set()
    finally:
        release_map(mapping)


def _referenced_models(config: dict[str, Any], decoder_file: str | None) -> set[str]:
    """ONNX files named by ``filename`` keys of the configuration's ``model`` section,
    except the decoder being replaced."""
    found: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                if k == "filename" and isinstance(v, str):
                    found.add(os.path.normpath(v))
                else:
                    walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(config.get("model", {}))
    found.discard(os.path.normpath(decoder_file) if decoder_file else "")
    return found


def copy_sidecar_files(src_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str], *,
                       model_filename: str, model: Any = None,
                       source_model: str | None = None,
                       exclude: Iterable[str] = (),
                       max_length: int | None = None) -> SidecarResult:
    """Copy the sidecar files of ``src_dir`` into ``out_dir`` next to the rewritten model
    ``out_dir/model_filename`` (which the caller has written).

    Args:
        model: the rewritten model (IR Model, ModelProto or path), whose inputs,
            outputs and operators decide the configuration's changes; defaults to
            ``out_dir/model_filename``.
        source_model: the source model's file name in ``src_dir`` (default: the
            configuration's decoder ``filename``); it and its external data are not
            copied.
        exclude: more file names not to copy (the files the caller wrote).
        max_length: the token capacity of a stateful model's caches, written to the
            configuration's ``search.max_length``.

    Returns:
        A :class:`SidecarResult`; ``genai_config.json`` is rewritten (see the module
        docstring) and its changes recorded in ``genai_config.changes.json``. Every
        file is written to a temporary name beside its target and renamed.

    Raises:
        SidecarError: ``out_dir`` is ``src_dir``.
        ExportError: the configuration names inputs or outputs the model lacks.
        OSError: a file cannot be read or written.
    """
    src, out = os.fspath(src_dir), os.fspath(out_dir)
    if os.path.isdir(out) and os.path.samefile(src, out):
        raise SidecarError(f"{out}: the output folder is the source folder; its sidecar files "
                           f"(and {GENAI_CONFIG}, which names the source model) stay as they are")
    result = SidecarResult()
    config: dict[str, Any] | None = None
    cfg_src = os.path.join(src, GENAI_CONFIG)
    if os.path.isfile(cfg_src):
        with open(cfg_src, encoding="utf-8") as fh:
            config = json.load(fh)
    if source_model is None and config is not None:
        source_model = config.get("model", {}).get("decoder", {}).get("filename")
    skip = {os.path.normpath(model_filename), GENAI_CONFIG, CHANGES_FILE}
    skip |= {os.path.normpath(x) for x in exclude}
    skip |= model_data_files(os.path.join(out, model_filename))
    if source_model:
        skip.add(os.path.normpath(source_model))
        skip |= model_data_files(os.path.join(src, source_model))
    wanted = _referenced_models(config, source_model) if config is not None else set()
    wanted_data = set().union(*(model_data_files(os.path.join(src, f)) for f in wanted)) if wanted else set()
    os.makedirs(out, exist_ok=True)
    for name in sorted(os.listdir(src)):
        path = os.path.join(src, name)
        if not os.path.isfile(path) or name in skip:
            continue
        is_model_part = name.endswith((".onnx", ".onnx.data", ".onnx_data"))
        if is_model_part and name not in wanted and name not in wanted_data:
            continue
        dst = os.path.join(out, name)
        if os.path.abspath(dst) != os.path.abspath(path):
            copy_file(path, dst)
        result.copied[name] = dst
    if config is not None:
        target = model if model is not None else os.path.join(out, model_filename)
        new_config, result.changes = genai_config_changes(config, target, model_filename,
                                                          max_length=max_length)
        result.genai_config = os.path.join(out, GENAI_CONFIG)
        write_json(result.genai_config, new_config, indent=4)
        result.changes_file = os.path.join(out, CHANGES_FILE)
        write_json(result.changes_file, [c.to_json() for c in result.changes])
    return result
