"""Evaluating one node on constant arrays: the one definition used by constant folding
(:func:`evaluate_node`) and by the backend's reference fallback (:func:`one_node_model`,
:func:`reference_evaluator`).

:func:`evaluate_node` tries numpy first: the arithmetic and data-movement nodes in
:func:`_direct`, then Slice, Split, Gather, Cast and ConstantOfShape in
:data:`EVALUATORS`. Each computes exactly what ``onnx.reference`` computes for the
node (the same indexing, element types and defaults), without serializing the node
and building an evaluator for it. An evaluator returns None for a case it does not
cover, and any error it meets counts as None: ``onnx.reference`` then runs the node
as a one-node model (:func:`one_node_model`), and decides (refusing the same inputs).

Before / after (in ``constant_folding``)::

    s = Slice(W, [0], [16], [1])      # W a [4, 32] initializer
    ->  init s = W[:, 0:16]            (no ModelProto built for the one node)
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from onnx import TensorProto

from onnxforge.graphbuilder.ir.core import Attr, Graph, Model, Node, Value
from onnxforge.graphbuilder.ir.tensors import Tensor
from onnxforge.proto_ext.dtypes import onnx_dtype
from onnxforge.proto_ext.types import TensorType, Type

__all__ = ["EVALUATORS", "evaluate", "evaluate_node", "one_node_model", "reference_evaluator"]

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


def _axes(node: Node, arrays: Arrays, opset: int) -> list[int] | None:
    if opset >= 13:
        return None if len(arrays) < 2 or arrays[1] is None else [int(a) for a in arrays[1].reshape(-1)]
    got = node.attr("axes")
    return None if got is None else [int(a) for a in got]


def _direct(node: Node, arrays: Arrays, opset: int) -> list[np.ndarray] | None:
    op = node.op_type
    x = arrays[0] if arrays else None
    if op in ("Add", "Sub", "Mul", "Div") and len(arrays) == 2 and arrays[1] is not None and x is not None:
        y = arrays[1]
        if x.dtype != y.dtype or (op == "Div" and x.dtype.kind != "f") or x.dtype.kind == "b":
            return None
        fn = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide}[op]
        return [np.asarray(fn(x, y)).astype(x.dtype, copy=False)]
    if x is None:
        return None
    if op == "Neg" and x.dtype.kind in "if":
        return [np.negative(x)]
    if op == "Relu" and x.dtype.kind in "if":
        # x < 0 ? 0 : x, as onnxruntime computes it: -0.0 and NaN pass through unchanged
        # (np.maximum(x, 0), the reference implementation, turns -0.0 into +0.0).
        return [np.where(x < 0, np.zeros((), x.dtype), x)]
    if op == "Identity":
        return [x.copy()]
    if op == "Transpose":
        perm = node.attr("perm")
        return [np.ascontiguousarray(np.transpose(x, None if perm is None else list(perm)))]
    if op == "Reshape" and len(arrays) == 2 and arrays[1] is not None:
        shape = [int(d) for d in arrays[1].reshape(-1)]
        if not node.attr("allowzero", 0):
            shape = [x.shape[i] if d == 0 and i < x.ndim else d for i, d in enumerate(shape)]
        return [x.reshape(shape).copy()]
    if op == "Unsqueeze":
        axes = _axes(node, arrays, opset)
        if axes is None:
            return None
        rank = x.ndim + len(axes)
        return [np.expand_dims(x, tuple(sorted(a + rank if a < 0 else a for a in axes))).copy()]
    if op == "Squeeze":
        axes = _axes(node, arrays, opset)
        if axes is None:
            return [np.squeeze(x).copy()]
        return [np.squeeze(x, tuple(a + x.ndim if a < 0 else a for a in axes)).copy()]
    if op == "Concat" and all(a is not None for a in arrays):
        if len({a.dtype for a in arrays}) != 1:
            return None
        return [np.concatenate(arrays, axis=int(node.attr("axis", 0)))]
    if op == "Shape":
        start = int(node.attr("start", 0))
        end = node.attr("end")
        dims = x.shape[start:] if end is None else x.shape[start:int(end)]
        return [np.array(dims, dtype=np.int64)]
    return None


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


def one_node_model(domain: str, op_type: str, attributes: Iterable[Attr], inputs: Sequence[Type | None],
                   outputs: Sequence[Type | None], opsets: Mapping[str, int], *, overload: str = "") -> Any:
    """A serialized-ready ``onnx.ModelProto`` holding one node: inputs ``in0, in1, ...`` of
    the given types (None: an absent optional input), outputs ``out0, out1, ...`` (typed
    where a type is given), the model's opset imports. The attributes are copied."""
    from onnxforge.graphbuilder.serde import to_onnx

    g = Graph(op_type)
    ins: list[Value | None] = []
    for k, t in enumerate(inputs):
        if t is None:
            ins.append(None)
            continue
        v = Value(f"in{k}", t)
        g.add_input(v)
        ins.append(v)
    node = g.append(Node(domain, op_type, ins, [f"out{j}" for j in range(len(outputs))], name=op_type,
                         attributes=[Attr(a.name, a.type, a.value) for a in attributes], overload=overload))
    for o, t in zip(node.outputs, outputs):
        if t is not None:
            o.type = t
        g.outputs.append(o)
    return to_onnx(Model(g, opset_imports=dict(opsets), ir_version=10))


def reference_evaluator(model: Any) -> Any:
    """``onnx.reference``'s evaluator of a (one-node) ModelProto; imported on first need."""
    from onnx.reference import ReferenceEvaluator

    return ReferenceEvaluator(model)


def _reference(node: Node, arrays: Arrays, opsets: Mapping[str, int]) -> list[np.ndarray] | None:
    types = [None if a is None else TensorType(onnx_dtype(a.dtype), tuple(a.shape)) for a in arrays]
    feeds = {f"in{k}": a for k, a in enumerate(arrays) if a is not None}
    try:
        model = one_node_model(node.domain, node.op_type, node.attributes.values(), types,
                               [None] * len(node.outputs), opsets, overload=node.overload)
        results = reference_evaluator(model).run(None, feeds)
    except (ValueError, TypeError, RuntimeError, NotImplementedError, IndexError, KeyError,
            ArithmeticError, AttributeError):
        return None  # not evaluable here: the node stays as it is
    return [np.asarray(r) for r in results]


def evaluate_node(node: Node, arrays: Arrays, opset: int, opsets: Mapping[str, int]) -> list[np.ndarray] | None:
    """The results of ``node`` on constant ``arrays`` (None for an absent input): numpy
    where it computes what ``onnx.reference`` does, else ``onnx.reference`` itself; None
    when neither evaluates it. ``opset``: the node's domain version, ``opsets``: every
    import in scope."""
    results = _direct(node, arrays, opset)
    if results is None:
        results = evaluate(node, arrays, opset)
    if results is None:
        results = _reference(node, arrays, opsets)
    return results
