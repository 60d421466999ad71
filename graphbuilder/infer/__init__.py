"""Per-operator shape and type rules used by :class:`~onnxforge.graphbuilder.shapes.ShapesContext`.

Rules are grouped by family: :mod:`.elementwise`, :mod:`.shape_ops`, :mod:`.reduce`,
:mod:`.nn`, :mod:`.attention` (ONNX opset-23 attention operators and the
onnxruntime ``com.microsoft`` ones), :mod:`.control_flow` (``If``/``Loop``/``Scan``),
:mod:`.sequence` and :mod:`.onnxforge_ops` (``ai.onnxforge`` ``CacheUpdate``).

A new rule is a few lines::

    @register("Relu")
    def _relu(op: NodeInference) -> None:
        op.same_as_input()
"""
from __future__ import annotations

from onnxforge.graphbuilder.infer import _base
from onnxforge.graphbuilder.infer._base import *  # noqa: F403  (the rule interface)
from onnxforge.graphbuilder.infer import (  # noqa: F401  (importing registers the rules)
    attention,
    control_flow,
    elementwise,
    nn,
    onnxforge_ops,
    reduce,
    sequence,
    shape_ops,
)

__all__: list[str] = []
__all__ += _base.__all__
