"""Element types that the graph states without shape inference.

A rule that needs only a value's element type (``Cast(x, to=T)`` is ``x`` when ``x``
is already ``T``) asks :func:`stated_elem_type` first: the operators' type
constraints fix it for most values from a few producers up, and asking the
``shapes`` analysis costs a walk of the whole model::

    s = Shape(x)            # INT64, whatever x is
    t = Slice(s, ...)       # INT64: Slice keeps its input's element type
    u = Cast(t, to=INT64)   # -> t (stated_elem_type(t) == INT64)

Only the default domain is read, and only what the operator definitions fix for
every opset: the answer agrees with inference wherever inference knows the type,
and is None (ask the analysis) everywhere else.
"""
from __future__ import annotations

from onnxforge.graphbuilder.ir import Graph, Value
from onnxforge.graphbuilder.tensors import Tensor
from onnxforge.passes.domains import DEFAULT_DOMAINS
from onnxforge.proto_ext.types import TensorProto, TensorType

__all__ = ["stated_elem_type"]

_MAX_DEPTH = 16

# Output 0 has the element type of input 0: the operator's constraint ties them (the
# binary operators tie every input and the output to one type variable ``T``).
_SAME_AS_INPUT0 = frozenset({
    "Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Transpose", "Slice",
    "Gather", "GatherElements", "GatherND", "Concat", "Expand", "Tile", "Neg", "Abs",
    "Relu", "Add", "Sub", "Mul", "Div", "Max", "Min", "Split",
})
# Output 0 is always INT64.
_INT64_OUT = frozenset({"Shape", "Size", "NonZero", "ArgMax", "ArgMin"})
# Output 0 is always BOOL.
_BOOL_OUT = frozenset({"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Not",
                       "And", "Or", "Xor", "IsNaN", "IsInf"})


def stated_elem_type(v: Value | None, depth: int = _MAX_DEPTH) -> int | None:
    """The element type of ``v`` that its producers' type constraints fix (or its
    initializer's payload, or a main-graph input's declared type), else None."""
    while v is not None and depth > 0:
        c = v.const
        if isinstance(c, Tensor):
            return c.dtype
        p = v.producer()
        if p is None:
            g = v.graph
            if (c is None and isinstance(g, Graph) and g.parent is None and v.is_graph_input()
                    and isinstance(v.type, TensorType)):
                return v.type.elem_type or None  # what a run must feed
            return None
        if p.domain not in DEFAULT_DOMAINS:
            return None
        op = p.op_type
        if op in _INT64_OUT and v.index == 0:
            return TensorProto.INT64
        if op in _BOOL_OUT and v.index == 0:
            return TensorProto.BOOL
        if op == "Cast" and v.index == 0:
            to = p.attr("to")
            return to if isinstance(to, int) and to else None
        if op == "Where" and v.index == 0 and len(p.inputs) == 3:
            v = p.inputs[1]  # Where(cond, x, y): T of x and y
        elif (op in _SAME_AS_INPUT0 and p.inputs and (v.index == 0 or op == "Split")):
            v = p.inputs[0]
        else:
            return None
        depth -= 1
    return None
