"""Sequence and optional operators: element types flow in and out of containers."""
from __future__ import annotations

from onnx import TensorProto
from onnxforge.graphbuilder.shapes.infer._base import NodeInference, register
from onnxforge.graphbuilder.shapes.infer.control_flow import join_types
from onnxforge.graphbuilder.ir.core import Graph
from onnxforge.proto_ext.types import OptionalType, SequenceType, TensorType, Type

__all__: list[str] = []


@register("SequenceConstruct")
def _construct(op: NodeInference) -> None:
    elem: Type = None
    for i in range(op.n_inputs):
        t = op.type(i)
        elem = t if i == 0 else join_types(elem, t, f"{op.label} element {i}")
    op.set_type(0, SequenceType(elem if elem is not None else TensorType(0, None)))


@register("SequenceEmpty")
def _empty(op: NodeInference) -> None:
    op.set_type(0, SequenceType(TensorType(op.int_attr("dtype", TensorProto.FLOAT) or TensorProto.FLOAT, None)))


@register("SequenceInsert")
def _insert(op: NodeInference) -> None:
    seq = op.type(0)
    if isinstance(seq, SequenceType):
        op.set_type(0, SequenceType(join_types(seq.elem, op.type(1), f"{op.label} element")
                                    or TensorType(op.elem(1), None)))


@register("SequenceErase")
def _erase(op: NodeInference) -> None:
    op.set_type(0, op.type(0))


@register("SequenceAt")
def _at(op: NodeInference) -> None:
    seq = op.type(0)
    if isinstance(seq, SequenceType):
        op.set_type(0, seq.elem)


@register("SequenceLength")
def _length(op: NodeInference) -> None:
    op.set(0, TensorProto.INT64, ())


@register("SplitToSequence")
def _split_to_sequence(op: NodeInference) -> None:
    s = op.shape(0)
    if s is None:
        op.set_type(0, SequenceType(TensorType(op.elem(0), None)))
        return
    a = op.norm_axis(op.int_attr("axis", 0), len(s))
    if not op.has(1) and not op.int_attr("keepdims", 1):
        dims = list(s[:a]) + list(s[a + 1:])
    else:
        dims = list(s[:a]) + [None] + list(s[a + 1:])
    op.set_type(0, SequenceType(TensorType(op.elem(0), tuple(dims))))


@register("ConcatFromSequence")
def _concat_from_sequence(op: NodeInference) -> None:
    seq = op.type(0)
    if not isinstance(seq, SequenceType) or not isinstance(seq.elem, TensorType):
        return
    t = seq.elem
    if t.shape is None:
        op.set(0, t.elem_type, None)
        return
    new_axis = op.int_attr("new_axis", 0)
    r = len(t.shape) + (1 if new_axis else 0)
    a = op.norm_axis(op.int_attr("axis", 0), r)
    dims = list(t.shape)
    if new_axis:
        dims.insert(a, None)
    else:
        dims[a] = None
    op.set(0, t.elem_type, dims)


@register("Optional")
def _optional(op: NodeInference) -> None:
    if op.has(0):
        op.set_type(0, OptionalType(op.type(0) or TensorType(0, None)))


@register("OptionalGetElement")
def _optional_get(op: NodeInference) -> None:
    t = op.type(0)
    op.set_type(0, t.elem if isinstance(t, OptionalType) else t)


@register("OptionalHasElement")
def _optional_has(op: NodeInference) -> None:
    op.set(0, TensorProto.BOOL, ())


@register("SequenceMap")
def _sequence_map(op: NodeInference) -> None:
    """The body runs once per element: sequence inputs bind their element type, tensor
    inputs themselves; each output is a sequence of the body's output type."""
    body = op.attr("body")
    if not isinstance(body, Graph):
        op.fail("needs a body graph")
    bound: list[Type] = []
    for i in range(op.n_inputs):
        t = op.type(i)
        bound.append(t.elem if isinstance(t, SequenceType) else t)
    outs = op.ctx.infer_subgraph(body, bound, f"body of {op.label}")
    for k, t in enumerate(outs):
        op.set_type(k, SequenceType(t if t is not None else TensorType(0, None)))
