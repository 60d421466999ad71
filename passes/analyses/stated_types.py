"""Element types and static shapes that the graph states without shape inference.

A rule that needs only a value's element type (``Cast(x, to=T)`` is ``x`` when ``x``
is already ``T``), its rank, the static shape of a small shape vector or some dims of
a reshaped tensor asks here first: the operators' definitions fix them for most values
from a few producers up, and asking the ``shapes`` analysis infers every node the
value depends on::

    s = Shape(x)            # INT64, of shape [rank(x)]: rank(x) from x's producers
    t = Slice(s, ...)       # INT64: Slice keeps its input's element type
    u = Cast(t, to=INT64)   # -> t (stated_elem_type(t) == INT64)
    h = Transpose(Reshape(x, [0, 3, 2, 4]), [2, 0, 1, 3])   # stated_dims(h) == (2, None, 3, 4)

Only the default domain is read, and only what the operator definitions fix for
every opset: each answer agrees with inference wherever inference knows it, and is
None (ask the analysis) everywhere else.
"""
from __future__ import annotations

from onnxforge.graphbuilder.ir.core import Graph, Node, Value
from onnxforge.graphbuilder.ir.tensors import Tensor
from onnxforge.passes.framework.domains import DEFAULT_DOMAINS
from onnxforge.passes.rewrites.fold import constant_value
from onnxforge.proto_ext.types import TensorProto, TensorType

__all__ = ["stated_dims", "stated_elem_type", "stated_rank", "stated_shape"]

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
    "LayerNormalization", "LRN", "Dropout", "Pad", "Transpose", "Resize", "CumSum", "Slice",
})
# Output 0 has the rank of the broadcast of every input (the largest rank).
_BROADCAST = frozenset({
    "Add", "Sub", "Mul", "Div", "Pow", "Mod", "Max", "Min", "Sum", "Mean", "Equal",
    "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor", "Where", "PRelu",
    "BitShift",
    "Concat",  # its inputs share one rank
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
    keep their input's rank (reductions that keep their dims among them) and broadcasting
    ones, the rank is the largest rank met at those ends; a ``MatMul`` of two inputs of
    rank 2 or more has the larger rank. ``limit`` bounds the values walked."""
    return _rank(v, [limit], {}, 0)


_REDUCTIONS = frozenset({
    "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
    "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare",
})
_MAX_NESTED = 64


def _rank(v: Value | None, budget: list[int], memo: dict[int, int | None], depth: int) -> int | None:
    """:func:`stated_rank` with ``budget[0]`` values left to walk (shared with the walks it
    starts for ``MatMul`` inputs, whose ranks ``memo`` keeps)."""
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
        budget[0] -= 1
        if budget[0] < 0:
            return None
        p = u.producer()
        if p is None:
            r = _input_rank(u)
            if r is None:
                return None
            best = max(best, r)
            continue
        if p.domain not in DEFAULT_DOMAINS or not p.inputs:
            return None
        op = p.op_type
        if op == "Split" and p.inputs[0] is not None:  # every piece keeps the input's rank
            stack.append(p.inputs[0])
            continue
        if u.index != 0:
            return None
        if op == "Shape" or op == "Size":
            best = max(best, 1 if op == "Shape" else 0)
        elif op == "Flatten":
            best = max(best, 2)
        elif op == "Reshape":  # the target's length, whatever its entries (-1, 0)
            target = stated_shape(p.inputs[1]) if len(p.inputs) > 1 else None
            if target is None or len(target) != 1:
                return None
            best = max(best, target[0])
        elif op == "MatMul":  # batch dims broadcast; a 1-D input would drop one
            ranks = [_exact_rank(w, budget, memo, depth) for w in p.inputs] if len(p.inputs) == 2 else [None]
            if any(r is None or r < 2 for r in ranks):
                return None
            best = max(best, *ranks)  # type: ignore[arg-type]
        elif op == "Squeeze" or op == "Unsqueeze":  # as many dims fewer or more as axes given
            axes = _axes(p)
            r = _exact_rank(p.inputs[0], budget, memo, depth)
            if axes is None or r is None:
                return None
            best = max(best, r - axes if op == "Squeeze" else r + axes)
        elif op == "Expand":  # the broadcast of the input and a shape of stated length
            n = stated_shape(p.inputs[1]) if len(p.inputs) == 2 else None
            if n is None or len(n) != 1 or p.inputs[0] is None:
                return None
            best = max(best, n[0])
            stack.append(p.inputs[0])
        elif op in _REDUCTIONS and p.attr("keepdims", 1) == 0:  # one dim fewer per axis
            axes = _reduced_axes(p)
            r = _exact_rank(p.inputs[0], budget, memo, depth)
            if axes is None or r is None:
                return None
            best = max(best, r - axes)
        elif op in _BROADCAST:
            if any(w is None for w in p.inputs):
                return None
            stack.extend(p.inputs)  # type: ignore[arg-type]
        elif (op in _SAME_RANK or (op in _REDUCTIONS and p.attr("keepdims", 1) != 0)) and p.inputs[0] is not None:
            stack.append(p.inputs[0])
        else:
            return None
    return best if best >= 0 else None


def _exact_rank(w: Value | None, budget: list[int], memo: dict[int, int | None], depth: int) -> int | None:
    """The rank of one operand, walked on its own (an operator whose rank is not its
    inputs' largest) and kept in ``memo``."""
    if w is None or depth >= _MAX_NESTED:
        return None
    if id(w) not in memo:
        memo[id(w)] = _rank(w, budget, memo, depth + 1)
    return memo[id(w)]


def _axes_list(node: Node) -> list[int] | None:
    """The axes a Squeeze, Unsqueeze or reduction names: its attribute (older opsets) or
    its constant second input; None when it names none or they are computed."""
    got = node.attr("axes")
    if got is not None:
        return [int(a) for a in got]
    return _const_vector(node.inputs[1]) if len(node.inputs) > 1 else None


def _reduced_axes(node: Node) -> int | None:
    """How many distinct axes a reduction that drops them names; None when it names none
    (then it reduces every axis, or none at all)."""
    got = _axes_list(node)
    return len(set(got)) if got else None


def _axes(node: Node) -> int | None:
    """How many axes a Squeeze or Unsqueeze names, or None (a Squeeze without axes drops
    the dims that are 1, which only shapes tell)."""
    got = _axes_list(node)
    return None if got is None else len(got)


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
        if op == "Concat" and p.attr("axis") in (0, -1):  # of vectors: their lengths add up
            parts = [stated_shape(w, depth - 1) if w is not None else None for w in p.inputs]
            if any(s is None or len(s) != 1 for s in parts):
                return None
            return (sum(s[0] for s in parts),)  # type: ignore[index]
        if op == "Slice":
            return _sliced_vector(p, depth)
        if op == "Gather" and p.attr("axis", 0) in (0, -1) and len(p.inputs) == 2:  # of a vector
            data, index = (stated_shape(w, depth - 1) for w in p.inputs)
            return index if data is not None and len(data) == 1 else None
        if op == "Unsqueeze":
            return _unsqueezed(p, stated_shape(p.inputs[0], depth - 1))  # type: ignore[return-value]
        if op not in _SAME_SHAPE:
            return None
        v = p.inputs[0]
        depth -= 1
    return None


def _unsqueezed(node: Node, src: tuple[int | None, ...] | None) -> tuple[int | None, ...] | None:
    """The dims of an Unsqueeze of dims ``src``: a 1 at each of its axes (attribute or
    constant input), ``src`` in order at the others."""
    axes = _axes_list(node)
    if src is None or axes is None:
        return None
    r = len(src) + len(axes)
    at = sorted(a + r if a < 0 else a for a in axes)
    if len(set(at)) != len(at) or any(not 0 <= a < r for a in at):
        return None
    rest = iter(src)
    return tuple(1 if i in at else next(rest) for i in range(r))


def _sliced_vector(node: Node, depth: int) -> tuple[int, ...] | None:
    """The shape of a unit-step Slice of a vector of stated length, with constant bounds."""
    ins = list(node.inputs) + [None] * (5 - len(node.inputs))
    if node.attributes or len(node.inputs) < 3:
        return None
    length = stated_shape(ins[0], depth - 1)
    bounds = [_const_vector(w) for w in ins[1:3]]
    if length is None or len(length) != 1 or any(b is None or len(b) != 1 for b in bounds):
        return None
    for w, ok in ((ins[3], (0, -1)), (ins[4], (1,))):
        if w is not None:
            got = _const_vector(w)
            if got is None or len(got) != 1 or got[0] not in ok:
                return None
    (start,), (end,) = bounds  # type: ignore[misc]
    return (len(range(length[0])[start:end]),)  # ONNX clamps a unit step as Python does


def _const_vector(v: Value | None) -> list[int] | None:
    """The entries of a constant integer vector (:func:`~onnxforge.passes.rewrites.fold.constant_value`:
    an initializer no run can override, or a Constant node's)."""
    a = constant_value(v)
    if a is None or a.ndim != 1 or a.dtype.name not in ("int64", "int32"):
        return None
    return [int(x) for x in a]


def stated_dims(v: Value | None, depth: int = _MAX_DEPTH) -> tuple[int | None, ...] | None:
    """The dims of ``v`` that its producers fix, None for each one they leave open (the
    rank is known): an initializer's, a main-graph input's declared dims (numbers only),
    a shape vector's (:func:`stated_shape`), a ``Reshape`` to a target whose entries are
    constants or of stated count (its positive entries; a 0 copies the input's dim), a
    ``Conv``'s batch and output channels, an ``Unsqueeze`` or ``Transpose`` of stated
    dims, through operators that keep their input's shape; else None. Each dim given
    agrees with inference."""
    while v is not None and depth > 0:
        p = v.producer()
        if p is None:
            if isinstance(v.const, Tensor):
                return tuple(v.const.dims)
            t = _fed_type(v)
            if t is None or t.shape is None:
                return None
            return tuple(d if type(d) is int and d >= 0 else None for d in t.shape)
        if p.domain not in DEFAULT_DOMAINS or v.index != 0 or not p.inputs or p.inputs[0] is None:
            return None
        op = p.op_type
        if op == "Reshape":
            target = _target_entries(p.inputs[1], depth - 1) if len(p.inputs) > 1 else None
            if target is None or any(d is not None and d < -1 for d in target):
                return None
            copy = p.attr("allowzero", 0) == 0
            src = stated_dims(p.inputs[0], depth - 1) if copy and 0 in target else None
            return tuple(d if d is not None and (d > 0 or (d == 0 and not copy)) else
                         (src[i] if d == 0 and src is not None and i < len(src) else None)
                         for i, d in enumerate(target))
        if op in ("Shape", "Size", "Concat", "Slice", "Gather"):  # shape vectors and such
            return stated_shape(v, depth)
        if op == "Conv" and len(p.inputs) > 1 and p.inputs[1] is not None \
                and isinstance(p.inputs[1].const, Tensor):  # [batch, W's output channels, ...]
            w = p.inputs[1].const.dims
            src = stated_dims(p.inputs[0], depth - 1)
            if len(w) < 3 or (src is not None and len(src) != len(w)):
                return None
            return (src[0] if src is not None else None, w[0], *([None] * (len(w) - 2)))
        if op == "Unsqueeze":
            return _unsqueezed(p, stated_dims(p.inputs[0], depth - 1))
        if op == "Transpose":
            src = stated_dims(p.inputs[0], depth - 1)
            if src is None:
                return None
            perm = p.attr("perm")
            perm = list(range(len(src)))[::-1] if perm is None else [int(a) for a in perm]
            if sorted(perm) != list(range(len(src))):
                return None
            return tuple(src[a] for a in perm)
        if op not in _SAME_SHAPE:
            return None
        v = p.inputs[0]
        depth -= 1
    return None


def _target_entries(v: Value | None, depth: int) -> list[int | None] | None:
    """The entries of a shape vector: a constant's, or a Concat's of constant pieces and
    pieces of stated length whose entries are left open (None); None when its length is
    not stated."""
    got = _const_vector(v)
    if got is not None or v is None or depth <= 0:
        return got  # type: ignore[return-value]
    p = v.producer()
    if p is None or p.op_type != "Concat" or p.domain not in DEFAULT_DOMAINS or p.attr("axis") not in (0, -1):
        return None
    out: list[int | None] = []
    for w in p.inputs:
        part: list[int | None] | None = _const_vector(w)  # type: ignore[assignment]
        if part is None:
            n = stated_shape(w, depth - 1)
            if n is None or len(n) != 1:
                return None
            part = [None] * n[0]
        out.extend(part)
    return out
