"""Standard-ONNX export: lowering of onnxforge's extensions and of onnxruntime-only
operators, target-opset conversion, checks, and the sidecar writer.

    from onnxforge.passes.export import to_standard_onnx, export_to_dir

    proto = to_standard_onnx(model)                 # onnx.ModelProto, or ExportError
    export_to_dir("in/model.onnx", "out/")          # model.onnx, feedback.json, genai_config.json
"""
from __future__ import annotations

from onnxforge.passes.export.feedback import export_to_dir, read_feedback
from onnxforge.passes.export.sidecar import (
    ConfigChange,
    SidecarError,
    SidecarResult,
    copy_sidecar_files,
)
from onnxforge.passes.export.standard import (
    FEEDBACK_KEY,
    Construct,
    collect_constructs,
    non_standard_nodes,
    to_standard_onnx,
)

__all__ = [
    "FEEDBACK_KEY",
    "ConfigChange",
    "Construct",
    "SidecarError",
    "SidecarResult",
    "collect_constructs",
    "copy_sidecar_files",
    "export_to_dir",
    "non_standard_nodes",
    "read_feedback",
    "to_standard_onnx",
]
