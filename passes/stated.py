"""Element types and static shapes that the graph states without shape inference.

A rule that needs only a value's element type (``Cast(x, to=T)`` is ``x`` when ``x``
is already ``T``), or the static shape of a small shape vector, asks here first: the
operators' definitions fix them for most values from a few producers up, and asking
the ``shapes`` analysis costs a walk of the whole model::

    s = Shape(x)            # INT64, of shape [rank(x)]: rank(x) from x's producers
    t = Slice(s, ...)       # INT64: Slice keeps its input's element type
    u = Cast(t, to=INT64)   # -> t (stated_elem_type(t) == INT64)

Only the default domain is read, and only what the operator definitions fix for
every opset: each answer agrees with inference wherever inference knows it, and is
None (ask the analysis) everywhere else.
"""
from __future__ import annotations

from onnxforge.graphbuilder.ir import Graph, Value
from onnxforge.graphbuilder.tensors import Tensor
from onnxforge.passes.domains import DEFAULT_DOMAINS
from onnxforge.proto_ext.types import TensorProto, TensorType

__all__ = ["stated_elem_type", "stated_rank", "stated_shape"]

_MAX_DEPTH = 16

# Output 0 has the element type of input 0: the operator's constraint ties them (the
# binary operators tie every input and the output to one type variable ``T``).
_SAME_AS_INPUT0 = frozenset({
    "Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Transpose", "Slice",
    "Gather", "GatherElements", "GatherND", "Concat", "Expand", "Tile", "Neg", "Abs",
    "Relu", "Add", "Sub", "Mul", "Div", "Max", "Min", "Split", "Pad", "Clip",
    # the float operators of vision and audio models (their data and output share ``T``)
    "Conv", "ConvTranspose", "MaxPool", "AveragePool", "GlobalAveragePool",
    "GlobalMaxPool", "BatchNormalization", "InstanceNormalization", "LayerNormalization",
    "MatMul", "Gemm", "Sigmoid", "Tanh", "Exp", "Log", "Sqrt", "Softmax", "LogSoftmax",
    "Pow", "LSTM", "GRU", "RNN",
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
            t = _fed_type(v)
            return None if t is None else t.elem_type or None
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


# Output 0 has the rank (and, for the first group, the shape) of input 0.
_SAME_SHAPE = frozenset({
    "Identity", "Cast", "Neg", "Abs", "Relu", "Sigmoid", "Tanh", "Exp", "Log", "Sqrt",
    "Erf", "Floor", "Ceil", "Round", "Reciprocal", "Not", "Sign", "Softplus", "Elu",
    "Selu", "LeakyRelu", "HardSigmoid", "HardSwish", "Clip", "Softmax", "LogSoftmax",
})
_SAME_RANK = _SAME_SHAPE | frozenset({
    "Conv", "ConvTranspose", "AveragePool", "MaxPool", "GlobalAveragePool",
    "GlobalMaxPool", "LpPool", "BatchNormalization", "InstanceNormalization",
    "LayerNormalization", "LRN", "Dropout", "Pad", "Transpose", "Resize", "CumSum",
})
# Output 0 has the rank of the broadcast of every input (the largest rank).
_BROADCAST = frozenset({
    "Add", "Sub", "Mul", "Div", "Pow", "Mod", "Max", "Min", "Sum", "Mean", "Equal",
    "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor", "Where", "PRelu",
    "BitShift",
})


def _fed_type(v: Value) -> TensorType | None:
    """The declared tensor type of a main-graph input that is no initializer: what a run
    must feed (its dims may be symbolic)."""
    g = v.graph
    if (v.const is None and v.producer() is None and isinstance(g, Graph) and g.parent is None
            and v.is_graph_input() and isinstance(v.type, TensorType)):
        return v.type
    return None


def _declared_shape(v: Value) -> tuple[int, ...] | None:
    """An initializer's dims, or a fed input's declared shape when every dim is known."""
    c = v.const
    if isinstance(c, Tensor):
        return tuple(c.dims)
    t = _fed_type(v)
    if t is not None and t.shape is not None and all(type(d) is int and d >= 0 for d in t.shape):
        return tuple(t.shape)
    return None


def stated_rank(v: Value | None, limit: int = 4096) -> int | None:
    """The rank of ``v`` that its producers fix, back to initializers, main-graph inputs
    of declared rank, ``Shape``, ``Size`` and ``Flatten`` outputs and ``Reshape`` outputs
    of a target whose length is stated, else None. Through operators that
    keep their input's rank and broadcasting ones, the rank is the largest rank met at
    those ends; ``limit`` bounds the values walked."""
    if v is None:
        return None
    best = -1
    seen: set[int] = set()
    stack = [v]
    while stack:
        u = stack.pop()
        if id(u) in seen:
            continue
        seen.add(id(u))
        if len(seen) > limit:
            return None
        p = u.producer()
        if p is None:
            r = _input_rank(u)
            if r is None:
                return None
            best = max(best, r)
            continue
        if p.domain not in DEFAULT_DOMAINS or u.index != 0 or not p.inputs:
            return None
        op = p.op_type
        if op == "Shape" or op == "Size":
            best = max(best, 1 if op == "Shape" else 0)
        elif op == "Flatten":
            best = max(best, 2)
        elif op == "Reshape":  # the target's length, whatever its entries (-1, 0)
            target = stated_shape(p.inputs[1]) if len(p.inputs) > 1 else None
            if target is None or len(target) != 1:
                return None
            best = max(best, target[0])
        elif op in _BROADCAST:
            if any(w is None for w in p.inputs):
                return None
            stack.extend(p.inputs)  # type: ignore[arg-type]
        elif op in _SAME_RANK and p.inputs[0] is not None:
            stack.append(p.inputs[0])
        else:
            return None
    return best if best >= 0 else None


def _input_rank(v: Value) -> int | None:
    """The rank of an initializer, or of a fed input's declared shape."""
    c = v.const
    if isinstance(c, Tensor):
        return len(c.dims)
    t = _fed_type(v)
    return None if t is None or t.shape is None else len(t.shape)


def stated_shape(v: Value | None, depth: int = _MAX_DEPTH) -> tuple[int, ...] | None:
    """The static shape of ``v`` that its producers fix: an initializer's dims, a
    main-graph input's declared static shape, ``Shape(x)``'s ``[rank(x)]`` (rank from
    :func:`stated_rank`), ``Size``'s ``[]``, through operators that keep their input's
    shape; else None."""
    while v is not None and depth > 0:
        p = v.producer()
        if p is None:
            return _declared_shape(v)
        if p.domain not in DEFAULT_DOMAINS or v.index != 0 or not p.inputs:
            return None
        op = p.op_type
        if op == "Shape":
            if p.attr("start") is not None or p.attr("end") is not None:
                return None
            r = stated_rank(p.inputs[0])
            return None if r is None else (r,)
        if op == "Size":
            return ()
        if op not in _SAME_SHAPE:
            return None
        v = p.inputs[0]
        depth -= 1
    return None
