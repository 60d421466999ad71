"""numpy evaluation of Slice, Split, Gather, Cast and ConstantOfShape for constant folding.

Each evaluator computes exactly what ``onnx.reference`` computes for the node (the
same indexing, element types and defaults), without serializing the node and
building an evaluator for it. An evaluator returns None for a case it does not
cover, and any error it meets makes :func:`evaluate` return None: the caller then
asks ``onnx.reference``, which decides (and refuses the same inputs).

Before / after (in ``constant_folding``)::

    s = Slice(W, [0], [16], [1])      # W a [4, 32] initializer
    ->  init s = W[:, 0:16]            (no ModelProto built for the one node)
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
from onnx import TensorProto

from onnxforge.graphbuilder.ir.core import Node
from onnxforge.graphbuilder.ir.tensors import Tensor

__all__ = ["EVALUATORS", "evaluate"]

Arrays = list[np.ndarray | None]

_CAST_TARGETS: dict[int, type] = {
    TensorProto.FLOAT: np.float32, TensorProto.DOUBLE: np.float64, TensorProto.FLOAT16: np.float16,
    TensorProto.BOOL: np.bool_,
    TensorProto.INT8: np.int8, TensorProto.INT16: np.int16, TensorProto.INT32: np.int32,
    TensorProto.INT64: np.int64, TensorProto.UINT8: np.uint8, TensorProto.UINT16: np.uint16,
    TensorProto.UINT32: np.uint32, TensorProto.UINT64: np.uint64,
}
"""Element types whose Cast is a plain ``astype`` in onnx.reference (no float8, no string)."""


def _slice(node: Node, arrays: Arrays, opset: int) -> list[np.ndarray] | None:
    # inputs (data, starts, ends, axes, steps) from opset 10; python slices, as the reference
    if opset < 10 or len(arrays) < 3 or any(a is None for a in arrays[:3]):
        return None
    data, starts, ends = arrays[0], arrays[1].reshape(-1), arrays[2].reshape(-1)
    axes = arrays[3] if len(arrays) > 3 else None
    steps = arrays[4] if len(arrays) > 4 else None
    if arrays[1].ndim > 1 or arrays[2].ndim > 1 or any(a is not None and a.ndim != 1 for a in (axes, steps)):
        return None
    if axes is None:
        if steps is None:
            slices = [slice(s, e) for s, e in zip(starts, ends)]
        else:
            slices = [slice(s, e, d) for s, e, d in zip(starts, ends, steps)]
    else:
        slices = [slice(0, n) for n in data.shape]
        if steps is None:
            for s, e, a in zip(starts, ends, axes):
                slices[a] = slice(s, e)
        else:
            for s, e, a, d in zip(starts, ends, axes, steps):
                slices[a] = slice(s, e, d)
    return [data[tuple(slices)].copy()]


def _split(node: Node, arrays: Arrays, opset: int) -> list[np.ndarray] | None:
    mat = arrays[0]
    axis = int(node.attr("axis", 0))
    if opset >= 13:
        given = arrays[1] if len(arrays) > 1 else None
        if given is not None and given.ndim != 1:
            return None
        split = None if given is None else [int(s) for s in given]
    else:
        got = node.attr("split")
        split = None if got is None else [int(s) for s in got]
    n_outputs = (node.attr("num_outputs") if opset >= 18 else None) or len(node.outputs)
    if split is None:
        if mat.shape[axis] % n_outputs == 0:
            split = [mat.shape[axis] // n_outputs] * n_outputs
        else:
            split = [mat.shape[axis] // n_outputs + 1] * n_outputs
            split[-1] += mat.shape[axis] - sum(split)
    index = [slice(0, n) for n in mat.shape]
    out, pos = [], 0
    for s in split:
        index[axis] = slice(pos, pos + s)
        pos += s
        out.append(mat[tuple(index)].copy())
    return out


def _gather(node: Node, arrays: Arrays, opset: int) -> list[np.ndarray] | None:
    if len(arrays) != 2 or arrays[1] is None or arrays[1].dtype.kind not in "iu":
        return None
    x, indices = arrays[0], arrays[1]
    # as the reference: copied only when not contiguous (ascontiguousarray makes a 0-d array 1-d)
    if not x.flags["C_CONTIGUOUS"]:
        x = np.ascontiguousarray(x)
    if not indices.flags["C_CONTIGUOUS"]:
        indices = np.ascontiguousarray(indices)
    return [np.asarray(np.take(x, indices, axis=int(node.attr("axis", 0))))]


def _cast(node: Node, arrays: Arrays, opset: int) -> list[np.ndarray] | None:
    target = _CAST_TARGETS.get(node.attr("to"))
    if target is None:
        return None
    return [np.asarray(arrays[0].astype(target))]


def _constant_of_shape(node: Node, arrays: Arrays, opset: int) -> list[np.ndarray] | None:
    if arrays[0].dtype.kind not in "iu":
        return None
    t = node.attr("value")
    if t is None:
        value = np.array(0, dtype=np.float32)
    elif isinstance(t, Tensor):
        held = t.numpy()
        if held.size != 1 or held.dtype.kind not in "biuf":
            return None  # the reference refuses the first; the second is its call
        value = held.flat[0]
    else:
        return None
    return [np.full(tuple(arrays[0]), value)]


EVALUATORS: dict[str, Callable[[Node, Arrays, int], list[np.ndarray] | None]] = {
    "Slice": _slice,
    "Split": _split,
    "Gather": _gather,
    "Cast": _cast,
    "ConstantOfShape": _constant_of_shape,
}


def evaluate(node: Node, arrays: Arrays, opset: int) -> list[np.ndarray] | None:
    """The results of ``node`` (default domain, opset ``opset``) on constant ``arrays``,
    or None when no evaluator here covers it (then onnx.reference decides)."""
    fn = EVALUATORS.get(node.op_type)
    if fn is None or not arrays or arrays[0] is None:
        return None
    try:
        return fn(node, arrays, opset)
    except (ValueError, TypeError, IndexError, OverflowError):
        return None  # what the reference does with these inputs is its call
