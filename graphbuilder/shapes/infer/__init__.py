"""Per-operator shape and type rules used by :class:`~onnxforge.graphbuilder.shapes.context.ShapesContext`.

Rules are grouped by family: :mod:`.elementwise`, :mod:`.shape_ops`, :mod:`.reduce`,
:mod:`.nn`, :mod:`.attention` (ONNX opset-23 attention operators and the
onnxruntime ``com.microsoft`` ones), :mod:`.vision` (convolution, pooling,
resampling, detection), :mod:`.recurrent` (``RNN``/``GRU``/``LSTM``, linear
attention), :mod:`.misc` (quantization, ``Einsum``, spectral, random, losses,
strings, data-dependent lengths, training), :mod:`.ml` (``ai.onnx.ml``),
:mod:`.control_flow` (``If``/``Loop``/``Scan``), :mod:`.sequence` and
:mod:`.onnxforge_ops` (``ai.onnxforge`` ``CacheUpdate``).

Every operator of the default and ``ai.onnx.ml`` domains (and of onnx's preview
domains) that ``onnx.shape_inference`` types has a rule at every opset from 7;
``tests/graphbuilder/shapes/test_infer_corpus.py`` checks them against onnx on its
backend node-test corpus.

A new rule is a few lines::

    @register("Relu")
    def _relu(op: NodeInference) -> None:
        op.same_as_input()
"""
from __future__ import annotations

from onnxforge.graphbuilder.shapes.infer import (  # noqa: F401  (importing registers the rules)
    _base,
    attention,
    control_flow,
    elementwise,
    misc,
    ml,
    nn,
    onnxforge_ops,
    recurrent,
    reduce,
    sequence,
    shape_ops,
    vision,
)
from onnxforge.graphbuilder.shapes.infer._base import *

__all__: list[str] = []
__all__ += _base.__all__
