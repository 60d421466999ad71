"""Shape and data-movement operators, with shape arithmetic on known contents.

``Shape``, ``Size``, ``Constant`` and initializers produce known (possibly
symbolic) contents; ``Gather``, ``Unsqueeze``, ``Squeeze``, ``Concat``, ``Slice``,
``Reshape``, ``Transpose``, ``Expand``, ``Tile``, ``Split`` and ``Range`` carry them
along, so ``Reshape`` / ``Expand`` / ``ConstantOfShape`` / ``Range`` / ``Slice``
targets resolve symbolically::

    s = Shape(x)                 # [batch, seq, 128]
    t = Concat(s[0:2], [4, 32])  # [batch, seq, 4, 32]
    Reshape(x, t)                # FLOAT[batch, seq, 4, 32]

Slice bounds on a symbolic dimension are assumed in range (``x[:, :16]`` on a
dimension ``n`` has length 16; a bound of magnitude 2**31 or more means "to the
end"), which is what a valid model guarantees.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, TypeGuard

import numpy as np
from onnx import TensorProto
from onnxforge.graphbuilder.shapes.infer._base import NodeInference, broadcast_shapes, register
from onnxforge.graphbuilder.shapes.context import MAX_CONST_ELEMENTS, trackable
from onnxforge.graphbuilder.shapes.symtensor import SymTensor
from onnxforge.graphbuilder.shapes.symbolic import (
    Dim,
    SymExpr,
    as_dim,
    ceildiv,
    dims_equal,
    floordiv,
    product,
    sum_dims,
)
from onnxforge.graphbuilder.ir.tensors import Tensor

__all__: list[str] = []

INT64 = TensorProto.INT64
_BIG = 2 ** 31


def _concrete(dims: Any) -> TypeGuard[Sequence[int]]:
    return dims is not None and all(isinstance(d, int) for d in dims)


def _tensor_value(t: Tensor) -> SymTensor | None:
    return SymTensor.from_tensor(t) if trackable(t.dtype, t.size) else None


def _static_length(op: NodeInference, i: int) -> int | None:
    """The length of input ``i`` when it is a 1-D tensor of known length (a shape whose
    content is unknown still has a known rank)."""
    s = op.shape(i)
    return s[0] if s is not None and len(s) == 1 and isinstance(s[0], int) else None


def _unknown_dims(n: int | None) -> list[None] | None:
    return None if n is None else [None] * n


def _reshape_value(op: NodeInference, dims: Sequence[Any]) -> None:
    """Carry input 0's known content to output 0 with the (concrete) shape ``dims``."""
    v = op.value(0)
    if v is not None:
        op.set_value(0, SymTensor(v.elem_type, v.data.reshape(tuple(dims))))


@register("Constant")
def _constant(op: NodeInference) -> None:
    t = op.attr("value")
    if isinstance(t, Tensor):
        v = _tensor_value(t)
        if v is not None:
            op.set_value(0, v)
        else:
            op.set(0, t.dtype, t.dims)
        return
    for name, elem, read in (("value_int", INT64, op.int_attr), ("value_ints", INT64, op.ints_attr),
                             ("value_float", TensorProto.FLOAT, op.float_attr),
                             ("value_floats", TensorProto.FLOAT, op.floats_attr)):
        vals = read(name)
        if vals is not None:
            op.set_value(0, SymTensor.of(elem, vals, (len(vals),) if isinstance(vals, list) else ()))
            return
    if op.attr("value_string") is not None:
        op.set(0, TensorProto.STRING, ())
    elif op.attr("value_strings") is not None:
        op.set(0, TensorProto.STRING, (len(op.attr("value_strings")),))


@register("ConstantOfShape")
def _constant_of_shape(op: NodeInference) -> None:
    fill = op.attr("value")
    elem = fill.dtype if isinstance(fill, Tensor) else TensorProto.FLOAT
    dims = op.ints(0)
    if dims is None:
        op.set(0, elem, _unknown_dims(_static_length(op, 0)))
        return
    if any(isinstance(d, int) and d < 0 for d in dims):
        op.fail(f"negative dimension in target shape {dims}")
    op.set(0, elem, dims)
    fill_value = _tensor_value(fill) if isinstance(fill, Tensor) else SymTensor.of(elem, 0.0)
    if fill_value is not None and fill_value.size == 1 and _concrete(dims) \
            and math.prod(dims) <= MAX_CONST_ELEMENTS:
        op.set_value(0, SymTensor.of(elem, fill_value.flat() * math.prod(dims), dims))


@register("Shape")
def _shape(op: NodeInference) -> None:
    s = op.shape(0)
    if s is None:
        op.set(0, INT64, [None])
        return
    r = len(s)
    start = op.int_attr("start", 0)
    end = op.int_attr("end", r)
    start = min(max(start + r if start < 0 else start, 0), r)
    end = min(max(end + r if end < 0 else end, 0), r)
    dims = list(s[start:end]) if end > start else []
    op.set_value(0, SymTensor.of(INT64, dims, (len(dims),)))


@register("Size")
def _size(op: NodeInference) -> None:
    s = op.shape(0)
    op.set_value(0, SymTensor.of(INT64, None if s is None else product(s), ()))


@register("Gather")
def _gather(op: NodeInference) -> None:
    data, idx = op.shape(0), op.shape(1)
    elem = op.elem(0)
    r = op.rank(0)
    if r is None:
        op.set(0, elem, None)
        return
    a = op.norm_axis(op.int_attr("axis", 0), r)
    out = None if data is None or idx is None else list(data[:a]) + list(idx) + list(data[a + 1:])
    op.set(0, elem, out)
    dv, iv = op.value(0), op.value(1)
    if dv is not None and iv is not None and iv.is_concrete():
        n = dv.shape[a]
        ind = np.array(iv.data.tolist(), dtype=np.int64).reshape(iv.shape)
        if ((ind < -n) | (ind >= n)).any():
            op.fail(f"index out of range for a dimension of size {n}: {iv.data.tolist()}")
        ind = np.where(ind < 0, ind + n, ind)
        op.set_value(0, SymTensor(dv.elem_type, np.take(dv.data, ind, axis=a)))


@register("GatherElements")
def _gather_elements(op: NodeInference) -> None:
    op.same_as_input(0, 1, elem=op.elem(0))


@register("GatherND")
def _gather_nd(op: NodeInference) -> None:
    d, q = op.shape(0), op.shape(1)
    b = op.int_attr("batch_dims", 0)
    if d is None or q is None or not q or not isinstance(q[-1], int):
        op.set(0, op.elem(0), None)
        return
    if b + q[-1] > len(d):
        op.fail(f"indices address {q[-1]} dimensions after {b} batch dimensions of a rank-{len(d)} tensor")
    op.set(0, op.elem(0), list(q[:-1]) + list(d[b + q[-1]:]))


@register("Unsqueeze")
def _unsqueeze(op: NodeInference) -> None:
    axes = op.axes()
    s, r = op.shape(0), op.rank(0)
    if axes is None or r is None:
        n = _static_length(op, 1)
        op.set(0, op.elem(0), None if r is None or n is None else [None] * (r + n))
        return
    out_r = r + len(axes)
    norm = sorted(op.norm_axis(a, out_r, "unsqueeze axis") for a in axes)
    if len(set(norm)) != len(norm):
        op.fail(f"repeated axis in {axes}")
    dims: list[Dim] = list(s) if s is not None else [None] * r
    for a in norm:
        dims.insert(a, 1)
    op.set(0, op.elem(0), dims)
    _reshape_value(op, dims)


@register("Squeeze")
def _squeeze(op: NodeInference) -> None:
    axes = op.axes()
    s = op.shape(0)
    if axes is None or s is None:
        op.set(0, op.elem(0), None)
        return
    if not axes:
        if not _concrete(s):
            op.set(0, op.elem(0), None)
            return
        keep: list[Dim] = [d for d in s if d != 1]
    else:
        norm = {op.norm_axis(a, len(s), "squeeze axis") for a in axes}
        for a in norm:
            if isinstance(s[a], int) and s[a] != 1:
                op.fail(f"cannot squeeze axis {a} of size {s[a]}")
        keep = [d for i, d in enumerate(s) if i not in norm]
    op.set(0, op.elem(0), keep)
    _reshape_value(op, keep)


@register("Reshape")
def _reshape(op: NodeInference) -> None:
    target = op.ints(1)
    s = op.shape(0)
    elem = op.elem(0)
    if target is None:
        op.set(0, elem, _unknown_dims(_static_length(op, 1)))
        return
    allowzero = op.int_attr("allowzero", 0)
    out: list[Dim] = []
    neg = None
    for i, t in enumerate(target):
        if isinstance(t, int) and t == 0 and not allowzero:
            if s is not None and i >= len(s):
                op.fail(f"target {target} copies dimension {i} of a rank-{len(s)} input")
            out.append(s[i] if s is not None else None)
        elif isinstance(t, int) and t == -1:
            if neg is not None:
                op.fail(f"target {target} has more than one -1")
            neg = i
            out.append(None)
        elif isinstance(t, int) and t < -1:
            op.fail(f"invalid target dimension {t}")
        else:
            out.append(t)
    total = product(s) if s is not None else None
    if neg is not None and total is not None:
        rest = product(out[:neg] + out[neg + 1:])
        if rest is not None and rest != 0:
            if isinstance(total, int) and isinstance(rest, int) and total % rest:
                op.fail(f"cannot reshape {s} ({total} elements) into {target}")
            out[neg] = as_dim(floordiv(total, rest))
    if total is not None and product(out) is not None and dims_equal(total, product(out)) is False:
        op.fail(f"cannot reshape {list(s)} into {out}: element counts differ")
    op.set(0, elem, out)
    if _concrete(out):
        _reshape_value(op, out)


@register("Flatten")
def _flatten(op: NodeInference) -> None:
    s = op.shape(0)
    if s is None:
        op.set(0, op.elem(0), [None, None])
        return
    r = len(s)
    a = op.int_attr("axis", 1)
    if not -r <= a <= r:
        op.fail(f"axis {a} is out of range for rank {r}")
    a = a + r if a < 0 else a
    op.set(0, op.elem(0), [product(s[:a]), product(s[a:])])


@register("Transpose")
def _transpose(op: NodeInference) -> None:
    r = op.rank(0)
    if r is None:
        op.set(0, op.elem(0), None)
        return
    perm = op.ints_attr("perm")
    perm = list(range(r))[::-1] if perm is None else perm
    if sorted(op.norm_axis(p, r, "perm entry") for p in perm) != list(range(r)):
        op.fail(f"perm {perm} is not a permutation of {r} axes")
    perm = [p + r if p < 0 else p for p in perm]
    s = op.shape(0)
    op.set(0, op.elem(0), None if s is None else [s[p] for p in perm])
    v = op.value(0)
    if v is not None:
        op.set_value(0, SymTensor(v.elem_type, np.transpose(v.data, perm)))


@register("Concat")
def _concat(op: NodeInference) -> None:
    idx = [i for i in range(op.n_inputs) if op.has(i)]
    elem = next((op.elem(i) for i in idx if op.elem(i)), 0)
    shapes = [op.shape(i) for i in idx]
    known = [s for s in shapes if s is not None]
    if not known:
        op.set(0, elem, None)
        return
    r = len(known[0])
    if any(len(s) != r for s in known):
        op.fail(f"inputs have different ranks: {[len(s) for s in known]}")
    a = op.norm_axis(op.int_attr("axis", 0), r)
    out: list[Dim] = []
    for k in range(r):
        if k == a:
            out.append(sum_dims(s[a] for s in shapes) if len(known) == len(shapes) else None)
            continue
        d: Dim = None
        for s in known:
            x = s[k]
            op.check_dims(d, x, f"dimension {k} of the inputs")
            if x is not None and (d is None or (isinstance(x, int) and not isinstance(d, int))):
                d = x
        out.append(d)
    op.set(0, elem, out)
    vals = [op.value(i) for i in idx]
    if all(v is not None for v in vals) and vals:
        op.set_value(0, SymTensor(vals[0].elem_type, np.concatenate([v.data for v in vals], axis=a)))


@register("Split")
def _split(op: NodeInference) -> None:
    s = op.shape(0)
    elem = op.elem(0)
    n = op.n_outputs
    if s is None:
        for i in range(n):
            op.set(i, elem, None)
        return
    a = op.norm_axis(op.int_attr("axis", 0), len(s))
    d = s[a]
    sizes: list[Dim] | None
    split_attr = op.ints_attr("split")
    if split_attr is not None:
        sizes = list(split_attr)
    elif op.has(1):
        sizes = op.ints(1)
    else:
        num = op.int_attr("num_outputs")
        if d is None:
            sizes = [None] * n
        elif num is None:
            if isinstance(d, int) and d % n:
                op.fail(f"dimension {d} does not split evenly into {n} outputs")
            sizes = [as_dim(floordiv(d, n))] * n
        else:
            part = as_dim(ceildiv(d, num))
            sizes = [part] * (num - 1) + [as_dim(d - part * (num - 1))]
    if sizes is None:
        sizes = [None] * n
    if len(sizes) != n:
        op.fail(f"{len(sizes)} split sizes for {n} outputs")
    total = sum_dims(sizes)
    if total is not None and dims_equal(total, d) is False:
        op.fail(f"split sizes {sizes} do not add up to dimension {d}")
    for i, size in enumerate(sizes):
        op.set(i, elem, list(s[:a]) + [size] + list(s[a + 1:]))
    v = op.value(0)
    if v is not None and _concrete(sizes):
        offsets = np.cumsum(sizes)[:-1].tolist()
        for i, piece in enumerate(np.split(v.data, offsets, axis=a)):
            op.set_value(i, SymTensor(v.elem_type, piece))


def _slice_len(d: Dim, start: Any, end: Any, step: Any) -> Dim:
    """Length of ``d[start:end:step]`` (ONNX clamping; symbolic bounds assumed in range)."""
    if start is None or end is None or not isinstance(step, int) or d is None:
        return None
    if isinstance(d, int) and isinstance(start, int) and isinstance(end, int):
        return len(range(*slice(start, end, step).indices(d)))
    if step > 0:
        st = (d + start if start < 0 else start) if isinstance(start, int) else start
        if isinstance(start, int) and start >= _BIG:
            return 0
        if isinstance(end, int):
            en = d if end >= _BIG else (0 if end <= -_BIG else (d + end if end < 0 else end))
        else:
            en = end
        n = as_dim(ceildiv(en - st, step))
    else:
        if isinstance(start, int):
            st = d - 1 if start >= _BIG else (d + start if start < 0 else start)
        else:
            st = start
        if isinstance(end, int):
            en = -1 if end <= -_BIG else (d + end if end < 0 else end)
        else:
            en = end
        n = as_dim(ceildiv(st - en, -step))
    return max(n, 0) if isinstance(n, int) else n


@register("Slice")
def _slice(op: NodeInference) -> None:
    s = op.shape(0)
    elem = op.elem(0)
    if s is None:
        op.set(0, elem, None)
        return
    r = len(s)
    starts_attr = op.ints_attr("starts")
    if starts_attr is not None:  # opset < 10: bounds are attributes
        starts = list(starts_attr)
        ends = op.ints_attr("ends", [])
        axes = op.ints_attr("axes")
        axes = list(range(len(starts))) if axes is None else axes
        steps: list[Any] | None = [1] * len(starts)
    else:
        starts, ends = op.ints(1), op.ints(2)
        axes = op.const_ints(3) if op.has(3) else (list(range(len(starts))) if starts is not None else None)
        steps = op.ints(4) if op.has(4) else ([1] * len(starts) if starts is not None else None)
    if axes is None:
        op.set(0, elem, [None] * r)
        return
    axes = [op.norm_axis(a, r, "slice axis") for a in axes]
    out = list(s)
    if starts is None or ends is None or steps is None or not len(starts) == len(ends) == len(axes) == len(steps):
        if starts is not None and ends is not None and steps is not None:
            op.fail(f"starts/ends/axes/steps have different lengths: {starts}, {ends}, {axes}, {steps}")
        for a in axes:
            out[a] = None
        op.set(0, elem, out)
        return
    for st, en, a, sp in zip(starts, ends, axes, steps):
        if sp == 0:
            op.fail("slice step 0")
        out[a] = _slice_len(s[a], st, en, sp)
    op.set(0, elem, out)
    v = op.value(0)
    if v is not None and all(isinstance(x, int) for x in (*starts, *ends, *steps)):
        index = [slice(None)] * r
        for st, en, a, sp in zip(starts, ends, axes, steps):
            index[a] = slice(st, en, sp)
        op.set_value(0, SymTensor(v.elem_type, v.data[tuple(index)]))


@register("Expand")
def _expand(op: NodeInference) -> None:
    target = op.ints(1)
    s = op.shape(0)
    elem = op.elem(0)
    if target is None:
        n = _static_length(op, 1)  # each data dimension other than 1 survives the broadcast
        op.set(0, elem, None if n is None or s is None else broadcast_shapes(op, s, [None] * n))
        return
    out = broadcast_shapes(op, s, target)
    op.set(0, elem, out)
    v = op.value(0)
    if v is not None and _concrete(out) and min(out, default=0) >= 0 and math.prod(out) <= MAX_CONST_ELEMENTS:
        op.set_value(0, SymTensor(v.elem_type, np.broadcast_to(v.data, tuple(out)).copy()))


@register("Range")
def _range(op: NodeInference) -> None:
    elem = op.elem(0) or op.elem(1) or op.elem(2)
    vals = [op.value(i) for i in range(3)]
    if any(v is None or v.size != 1 for v in vals):
        op.set(0, elem, [None])
        return
    start, limit, delta = (v.flat()[0] for v in vals)
    if any(x is None for x in (start, limit, delta)) or isinstance(delta, SymExpr):
        op.set(0, elem, [None])
        return
    if delta == 0:
        op.fail("Range with delta 0")
    if isinstance(start, (SymExpr, int)) and isinstance(limit, (SymExpr, int)) and isinstance(delta, int):
        span = limit - start if delta > 0 else start - limit
        n = as_dim(ceildiv(span, abs(delta)))
        if isinstance(n, int):
            n = max(n, 0)
    elif isinstance(start, SymExpr) or isinstance(limit, SymExpr):
        n = None
    else:
        n = max(math.ceil((limit - start) / delta), 0)
    op.set(0, elem, [n])
    if isinstance(n, int) and n <= MAX_CONST_ELEMENTS:
        op.set_value(0, SymTensor.of(elem, [start + i * delta for i in range(n)], (n,)))


@register("Tile")
def _tile(op: NodeInference) -> None:
    s = op.shape(0)
    reps = op.ints(1)
    if s is None:
        op.set(0, op.elem(0), None)
        return
    if reps is None:
        op.set(0, op.elem(0), [None] * len(s))
        return
    if len(reps) != len(s):
        op.fail(f"{len(reps)} repeats for a rank-{len(s)} input")
    op.set(0, op.elem(0), [None if d is None or k is None else as_dim(d * k) for d, k in zip(s, reps)])
    v = op.value(0)
    if v is not None and _concrete(reps) and min(reps, default=0) >= 0 \
            and v.size * math.prod(reps) <= MAX_CONST_ELEMENTS:
        op.set_value(0, SymTensor(v.elem_type, np.tile(v.data, reps)))


@register("Pad")
def _pad(op: NodeInference) -> None:
    s = op.shape(0)
    if s is None:
        op.set(0, op.elem(0), None)
        return
    r = len(s)
    pads = op.ints_attr("pads")
    if pads is None:
        pads = op.ints(1)
    axes = op.const_ints(3) if op.has(3) else list(range(r))
    if pads is None or axes is None:
        op.set(0, op.elem(0), [None] * r)
        return
    axes = [op.norm_axis(a, r, "pad axis") for a in axes]
    if len(pads) != 2 * len(axes):
        op.fail(f"{len(pads)} pads for {len(axes)} axes")
    out = list(s)
    for k, a in enumerate(axes):
        out[a] = sum_dims([s[a], pads[k], pads[k + len(axes)]])
    op.set(0, op.elem(0), out)


@register("ScatterND", "ScatterElements", "Scatter", "TensorScatter")
def _scatter(op: NodeInference) -> None:
    op.same_as_input()


@register("NonZero")
def _nonzero(op: NodeInference) -> None:
    r = op.rank(0)
    op.set(0, INT64, [r, op.fresh("nz")])


@register("TopK")
def _topk(op: NodeInference) -> None:
    s = op.shape(0)
    k_attr = op.int_attr("k") if op.version < 10 else None  # TopK-1: k is an attribute
    k = [k_attr] if k_attr is not None else op.ints(1)
    out = None
    if s is not None:
        a = op.norm_axis(op.int_attr("axis", -1), len(s))
        out = list(s)
        out[a] = k[0] if k is not None and len(k) == 1 else None
    op.set(0, op.elem(0), out)
    op.set(1, INT64, out)


@register("OneHot")
def _one_hot(op: NodeInference) -> None:
    s = op.shape(0)
    depth = op.value(1)
    d = depth.flat()[0] if depth is not None and depth.size == 1 else None
    d = int(d) if isinstance(d, float) and d.is_integer() else d
    elem = op.elem(2)
    if s is None:
        op.set(0, elem, None)
        return
    a = op.int_attr("axis", -1)
    a = op.norm_axis(a, len(s) + 1)
    out = list(s)
    out.insert(a, d if not isinstance(d, float) else None)
    op.set(0, elem, out)


@register("EyeLike")
def _eye_like(op: NodeInference) -> None:
    op.same_as_input(elem=op.int_attr("dtype") or op.elem(0))
