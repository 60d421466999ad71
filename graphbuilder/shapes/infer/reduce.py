"""Reductions (``ReduceSum``, ``ReduceMean``...) and ``ArgMax`` / ``ArgMin``.

Axes come from the ``axes`` attribute (older opsets) or the second input; when
that input is given but its content is unknown, only the rank is known (with
``keepdims=1``) or nothing at all.
"""
from __future__ import annotations

from onnx import TensorProto
from onnxforge.graphbuilder.shapes.infer._base import INT_TYPES, NodeInference, register
from onnxforge.graphbuilder.shapes.symtensor import SymTensor
from onnxforge.graphbuilder.shapes.symbolic import Dim, SymExpr, product, sum_dims

__all__: list[str] = []

_REDUCE = ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
           "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare")


def _reduced(op: NodeInference, axes: list[int] | None, keepdims: bool) -> list[Dim] | None:
    s = op.shape(0)
    if s is None:
        return None
    r = len(s)
    if axes is None:
        return [None] * r if keepdims else None
    norm = {op.norm_axis(a, r, "reduce axis") for a in axes} if axes else set(range(r))
    if keepdims:
        return [1 if i in norm else d for i, d in enumerate(s)]
    return [d for i, d in enumerate(s) if i not in norm]


@register(*_REDUCE)
def _reduce(op: NodeInference) -> None:
    keepdims = bool(op.int_attr("keepdims", 1))
    axes = op.axes()
    if axes == [] and op.int_attr("noop_with_empty_axes", 0):
        op.same_as_input()
        op.set_value(0, op.value(0))
        return
    op.set(0, op.elem(0), _reduced(op, axes, keepdims))
    v = op.value(0)
    kind = op.node.op_type
    if v is None or axes is None or op.elem(0) not in INT_TYPES or kind not in (
            "ReduceSum", "ReduceProd", "ReduceMax", "ReduceMin"):
        return
    if axes and (len(v.shape) != 1 or len(axes) != 1):
        return
    items = v.flat()
    if any(x is None for x in items):
        return
    if kind == "ReduceSum":
        res = sum_dims(items)
    elif kind == "ReduceProd":
        res = product(items)
    elif not items or any(isinstance(x, SymExpr) for x in items):  # no max / min of nothing
        return
    else:
        res = max(items) if kind == "ReduceMax" else min(items)
    if res is not None:
        shape = [1] * len(v.shape) if keepdims else []
        op.set_value(0, SymTensor.of(v.elem_type, [res], shape))


@register("ArgMax", "ArgMin")
def _arg(op: NodeInference) -> None:
    keepdims = bool(op.int_attr("keepdims", 1))
    op.set(0, TensorProto.INT64, _reduced(op, [op.int_attr("axis", 0)], keepdims))
