"""The export folder writer: ``model.onnx`` (+ external data), ``feedback.json``,
and ``genai_config.json`` when the source came with one.

::

    export_to_dir("genai_int4/model.onnx", "out/")
    # out/model.onnx          standard ONNX (external data in model.onnx.data when large)
    # out/feedback.json       {"cache.0.key": "present.0.key", ...}  (persistent bindings)
    # out/genai_config.json   the source's config, with filename and past/present sharing updated
    # out/genai_config.changes.json  what was changed in it, and why

``feedback.json`` holds the lowered persistent bindings: after each call, feed
the value of each output as the named input of the next call. A model without
bindings gets an empty mapping.

The onnxruntime-genai configuration and the other sidecar files of the source
folder (tokenizer files...) are copied by
:func:`~onnxforge.passes.export.sidecar.copy_sidecar_files`: the decoder's
``filename`` names the written file and ``search.past_present_share_buffer``
becomes false unless the exported graph still shares past and present buffers
(a kept ``com.microsoft::GroupQueryAttention``). Each change is recorded in
``genai_config.changes.json`` (see :class:`~onnxforge.passes.export.sidecar.ConfigChange`).
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import Any

import onnx

from onnxforge.proto_ext.errors import ExportError
from onnxforge.proto_ext.outputs import atomic_files, data_file_name, write_json
from onnxforge.passes.export.sidecar import GENAI_CONFIG, copy_sidecar_files, genai_config_changes
from onnxforge.passes.export.standard import FEEDBACK_KEY, to_standard_onnx

__all__ = ["EXTERNAL_THRESHOLD", "export_to_dir", "read_feedback", "update_genai_config"]

EXTERNAL_THRESHOLD = 256 * 1024 * 1024
"""Models whose weights reach this many bytes are written with external data."""

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


def update_genai_config(config: dict[str, Any], proto: onnx.ModelProto, filename: str) -> dict[str, Any]:
    """A copy of an onnxruntime-genai configuration describing the exported ``proto``
    (the changes themselves: :func:`~onnxforge.passes.export.sidecar.genai_config_changes`)."""
    return genai_config_changes(config, proto, filename)[0]


def _weights_bytes(proto: onnx.ModelProto) -> int:
    return sum(len(t.raw_data) for t in proto.graph.initializer)


def export_to_dir(model: Any, out_dir: str | os.PathLike[str], *, target_opset: int | None = None,
                  keep_domains: Iterable[str] = (), filename: str = "model.onnx",
                  external_data: bool | None = None) -> dict[str, str]:
    """Export ``model`` (IR Model, ModelProto, bytes or path) to standard ONNX in ``out_dir``.

    Writes ``filename`` (with ``filename + ".data"`` external data when
    ``external_data`` is True, or by default when the weights reach
    :data:`EXTERNAL_THRESHOLD`), ``feedback.json``, and, when the source model's
    folder has a ``genai_config.json``, the updated configuration, the record of
    its changes (``genai_config.changes.json``, key ``"genai_config_changes"``)
    and the folder's other sidecar files (tokenizer files...), so onnxruntime-genai
    can load the folder. Returns ``{kind or file name: path}`` of the files written.
    Every file is written to a temporary name and renamed, so a failure leaves the
    folder's previous files intact.
    """
    out_dir = os.fspath(out_dir)
    src = _source_dir(model)
    proto = to_standard_onnx(model, target_opset=target_opset, keep_domains=keep_domains)
    os.makedirs(out_dir, exist_ok=True)  # after the export: a refused model leaves no folder
    written: dict[str, str] = {}
    model_path = os.path.join(out_dir, filename)
    big = _weights_bytes(proto) >= EXTERNAL_THRESHOLD if external_data is None else external_data
    data_name = data_file_name(filename)
    # written in a folder of their own, then renamed beside the other files: a failed
    # write leaves the previous model and data as they were
    with atomic_files(out_dir, [data_name, filename]) as stage:
        if big:
            onnx.save_model(proto, os.path.join(stage, filename), save_as_external_data=True,
                            all_tensors_to_one_file=True, location=data_name, size_threshold=1024)
        else:
            onnx.save_model(proto, os.path.join(stage, filename))
    if big:
        written["external_data"] = os.path.join(out_dir, data_name)
    written["model"] = model_path
    fb_path = os.path.join(out_dir, FEEDBACK_FILE)
    write_json(fb_path, read_feedback(proto))
    written["feedback"] = fb_path
    if src is not None and os.path.isfile(os.path.join(src, GENAI_CONFIG)):
        sidecar = copy_sidecar_files(src, out_dir, model_filename=filename, model=proto,
                                     source_model=_source_name(model),
                                     exclude=[FEEDBACK_FILE, filename + ".data"])
        written["genai_config"] = sidecar.genai_config or ""
        written["genai_config_changes"] = sidecar.changes_file or ""
        written.update(sidecar.copied)
    return written


def _source_name(model: Any) -> str | None:
    if isinstance(model, (str, os.PathLike)):
        return os.path.basename(os.fspath(model))
    return None
