"""Small models for the backend tests (built with onnx.helper or GraphBuilder)."""
from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper


def onnx_model(nodes: list[Any], inputs: list[Any], outputs: list[Any], *, opset: int = 23,
               initializers: list[Any] = (), domains: dict[str, int] | None = None) -> onnx.ModelProto:
    """A ModelProto of one graph (default opset 23, plus ``domains``)."""
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in (domains or {}).items()]
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    return helper.make_model(g, opset_imports=opsets, ir_version=10)


def tensor(name: str, elem: int, shape: list[Any] | None) -> Any:
    return helper.make_tensor_value_info(name, elem, shape)


F = TensorProto.FLOAT
I64 = TensorProto.INT64


def reference(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The outputs of onnx.reference for ``model``."""
    from onnx.reference import ReferenceEvaluator

    return [np.asarray(o) for o in ReferenceEvaluator(model).run(None, feeds)]
