"""Generators for shape and data-movement operators: views (Reshape, Squeeze, Unsqueeze,
Flatten, Identity, Slice), Shape/Size, Concat, Expand, Transpose, Gather*, ScatterND,
Split, Tile, Trilu, Pad, Range, ConstantOfShape, Constant and TensorScatter."""
from __future__ import annotations

from typing import Any

import numpy as np
from onnx import helper, numpy_helper

from tests.fuzz.case import F32, FLOATS, NUMERIC, SIGNED, Case, Draw

__all__ = ["GENERATORS"]

I64 = np.dtype(np.int64)
DATA = NUMERIC + (np.dtype(np.bool_),)
PAD_TYPES = tuple(np.dtype(t) for t in (np.float32, np.float32, np.float64, np.int32, np.int64, np.int8, np.uint8))


def _data(d: Draw, rank: int | None = None, lo: int = 0) -> np.ndarray:
    return d.values(d.pick(DATA), d.shape(rank, lo=lo))


def _maybe_const(d: Draw, *names: str) -> frozenset[str]:
    """Index/shape inputs are initializers half of the time (plan-time checks)."""
    return frozenset(n for n in names if d.chance(0.5))


def _axis(d: Draw, rank: int, hostile: float = 0.04) -> int:
    if rank == 0 or d.chance(hostile):
        return d.pick([rank, -rank - 1, rank + 3])
    return d.int(-rank, rank - 1)


def reshape(d: Draw) -> Case:
    x = _data(d)
    n = x.size
    target: list[int] = []
    rest = n
    for _ in range(d.int(0, 3)):
        f = d.pick([k for k in (1, 2, 3, 4) if rest % k == 0] or [1]) if rest else d.pick([0, 1, 2])
        target.append(f)
        rest = rest // f if f and rest else rest
    target.append(rest)
    if d.chance(0.3) and n:
        target[d.int(0, len(target) - 1)] = -1
    allowzero = d.int(0, 1) if d.chance(0.3) else None
    if allowzero is None and d.chance(0.2) and x.ndim and len(target) >= 1:
        target[0] = 0  # copy dimension 0
    if d.chance(0.05):
        target.append(3)  # hostile: wrong element count
    attrs = {} if allowzero is None else {"allowzero": allowzero}
    if allowzero and 0 in target and -1 in target:
        target[target.index(-1)] = 1
    return Case("Reshape", [("x", x), ("shape", np.array(target, I64))], attrs, consts=_maybe_const(d, "shape"))


def squeeze(d: Draw) -> Case:
    x = _data(d)
    ones = [i for i, s in enumerate(x.shape) if s == 1]
    if d.chance(0.3):
        return Case("Squeeze", [("x", x)])
    axes = [a - x.ndim if d.chance(0.4) else a for a in ones if d.chance(0.7)]
    if d.chance(0.1):
        axes.append(_axis(d, x.ndim, hostile=0.5))
    return Case("Squeeze", [("x", x), ("axes", np.array(axes, I64))], consts=_maybe_const(d, "axes"))


def unsqueeze(d: Draw) -> Case:
    x = _data(d, ) if d.chance(0.9) else d.values(F32, ())
    k = d.int(1, 3)
    r = x.ndim + k
    axes = list(d.rng.choice(np.arange(-r, r), size=k, replace=False))
    axes = [int(a) for a in axes]
    if len({a % r for a in axes}) != k and not d.chance(0.1):
        axes = sorted({a % r for a in axes})
    if d.chance(0.04):
        axes[0] = r + 1
    return Case("Unsqueeze", [("x", x), ("axes", np.array(axes, I64))], consts=_maybe_const(d, "axes"))


def flatten(d: Draw) -> Case:
    x = _data(d)
    return Case("Flatten", [("x", x)], {"axis": d.int(-x.ndim, x.ndim)} if d.chance(0.8) else {})


def identity(d: Draw) -> Case:
    return Case("Identity", [("x", _data(d))])


SLICE_ENDS = (2**63 - 1, -2**63, 2**31 - 1, -2**31)


def slice_(d: Draw) -> Case:
    x = _data(d, lo=1)
    k = d.int(1, x.ndim)
    axes = [int(a) for a in d.rng.choice(x.ndim, size=k, replace=False)]
    starts, ends, steps = [], [], []
    for a in axes:
        n = x.shape[a]
        starts.append(d.pick(SLICE_ENDS) if d.chance(0.1) else d.int(-n - 3, n + 3))
        ends.append(d.pick(SLICE_ENDS) if d.chance(0.2) else d.int(-n - 3, n + 3))
        steps.append(d.pick([1, 1, 2, 3, -1, -1, -2, -3, 7]))
    axes = [a - x.ndim if d.chance(0.3) else a for a in axes]
    ins = [("x", x), ("starts", np.array(starts, I64)), ("ends", np.array(ends, I64))]
    case = Case("Slice", ins)
    if not d.chance(0.2) or steps != [1] * k:
        ins.append(("axes", np.array(axes, I64)))
        ins.append(("steps", np.array(steps, I64)))
    case.consts = _maybe_const(d, "starts", "ends", "axes", "steps")
    if any(s < 0 for s in steps) and (any(e >= 2**31 - 1 for e in ends) or
                                       any(s < -x.shape[a] for s, a in zip(starts, axes))):
        case.oracle = "spec"  # the two oracles depart from the specification here (known.py)
    return case


def shape(d: Draw) -> Case:
    x = _data(d)
    attrs: dict[str, Any] = {}
    if d.chance(0.5):
        attrs["start"] = d.int(-x.ndim - 2, x.ndim + 2)
    if d.chance(0.5):
        attrs["end"] = d.int(-x.ndim - 2, x.ndim + 2)
    return Case("Shape", [("x", x)], attrs)


def size(d: Draw) -> Case:
    return Case("Size", [("x", _data(d))])


def concat(d: Draw) -> Case:
    dt = d.pick(DATA)
    base = list(d.shape(lo=1))
    a = d.int(0, len(base) - 1)
    xs = []
    for i in range(d.int(1, 4)):
        s = list(base)
        s[a] = d.dim()
        if d.chance(0.03):
            s[(a + 1) % len(s)] += 1  # hostile: another axis differs
        xs.append((f"x{i}", d.values(dt, tuple(s))))
    return Case("Concat", xs, {"axis": a - len(base) if d.chance(0.3) else a})


def expand(d: Draw) -> Case:
    sa, sb = d.broadcast_pair()
    x = d.values(d.pick(DATA), sa)
    return Case("Expand", [("x", x), ("shape", np.array(sb, I64))], consts=_maybe_const(d, "shape"))


def transpose(d: Draw) -> Case:
    x = _data(d)
    if d.chance(0.2) or not x.ndim:
        return Case("Transpose", [("x", x)])
    perm = [int(p) for p in d.rng.permutation(x.ndim)]
    if d.chance(0.03) and perm:
        perm[0] = perm[-1] if len(perm) > 1 else 5
    return Case("Transpose", [("x", x)], {"perm": perm})


def gather(d: Draw) -> Case:
    x = _data(d, lo=1)
    a = _axis(d, x.ndim)
    n = x.shape[a % x.ndim] if -x.ndim <= a < x.ndim else 1
    idx = d.indices(n, d.shape(hi=3), dtype=d.pick([np.int64, np.int32]))
    return Case("Gather", [("x", x), ("i", idx)], {"axis": a}, consts=_maybe_const(d, "i"))


def gather_elements(d: Draw) -> Case:
    x = _data(d, lo=1)
    a = _axis(d, x.ndim, hostile=0.02)
    aa = a % x.ndim if -x.ndim <= a < x.ndim else 0
    shp = [s if d.chance(0.85) else d.int(0, s) for s in x.shape]
    shp[aa] = d.int(0, 4)
    idx = d.indices(x.shape[aa], tuple(shp), dtype=d.pick([np.int64, np.int32]))
    case = Case("GatherElements", [("x", x), ("i", idx)], {"axis": a})
    if any(s != t for i, (s, t) in enumerate(zip(shp, x.shape)) if i != aa):
        case.oracle = "ort"  # onnx.reference refuses indices smaller than the data off the axis
    return case


def gather_nd(d: Draw) -> Case:
    x = _data(d, lo=1)
    b = d.int(0, max(0, x.ndim - 1)) if d.chance(0.3) else 0
    k = d.int(1, x.ndim - b) if x.ndim - b >= 1 else 1
    lead = x.shape[:b]
    mid = d.shape(hi=2)
    idx = np.stack([d.indices(x.shape[b + j] if b + j < x.ndim else 1, lead + mid) for j in range(k)], axis=-1)
    case = Case("GatherND", [("x", x), ("i", idx)], {"batch_dims": b} if b or d.chance(0.3) else {})
    if b and x.shape[b:b + k] and 0 in x.shape[:b]:
        case.oracle = "ort"
    return case


def scatter_nd(d: Draw) -> Case:
    x = d.values(d.pick(NUMERIC), d.shape(lo=1))
    k = d.int(1, x.ndim)
    mid = d.shape(hi=2)
    if not d.chance(0.05):
        # distinct index tuples: duplicate ones are undefined for reduction "none"
        mid = (min(int(np.prod(mid, dtype=np.int64)), int(np.prod(x.shape[:k], dtype=np.int64))),)
    cells = int(np.prod(x.shape[:k], dtype=np.int64))
    m = int(np.prod(mid, dtype=np.int64))
    flat = d.rng.choice(cells, size=m, replace=False) if m <= cells else d.rng.integers(0, max(cells, 1), m)
    idx = np.stack(np.unravel_index(flat, x.shape[:k]), axis=-1).reshape(mid + (k,)).astype(np.int64) if cells \
        else np.zeros(mid + (k,), np.int64)
    neg = d.rng.random(idx.shape) < 0.3
    idx = np.where(neg, idx - np.array(x.shape[:k], np.int64), idx)
    if idx.size and d.chance(0.05):
        idx.reshape(-1)[0] = x.shape[0] + 1  # hostile
    upd = d.values(x.dtype, mid + x.shape[k:])
    red = d.pick(["none", "none", "add", "mul", "max", "min"])
    return Case("ScatterND", [("x", x), ("i", idx), ("u", upd)], {"reduction": red} if red != "none" else {})


def split(d: Draw) -> Case:
    x = _data(d, lo=1)
    a = d.int(-x.ndim, x.ndim - 1)
    n = x.shape[a]
    k = d.int(1, 4)
    if d.chance(0.5):
        cuts = sorted(int(c) for c in d.rng.integers(0, n + 1, size=k - 1))
        sizes = [hi - lo for lo, hi in zip([0] + cuts, cuts + [n])]
        if d.chance(0.06):
            sizes[-1] += d.pick([1, -1, -n - 1])  # hostile: wrong total or negative
        return Case("Split", [("x", x), ("split", np.array(sizes, I64))], {"axis": a}, n_out=k,
                    consts=_maybe_const(d, "split"))
    if n and k > n:
        k = n
    case = Case("Split", [("x", x)], {"axis": a, "num_outputs": k}, n_out=k, opset=18)
    if n % k and -(-n // k) * (k - 1) >= n:
        case.out_of_spec = "split-num-outputs-leaves-empty"
    return case


def tile(d: Draw) -> Case:
    x = _data(d)
    reps = [d.int(0, 3) for _ in range(x.ndim)]
    if d.chance(0.03):
        reps.append(2)
    return Case("Tile", [("x", x), ("r", np.array(reps, I64))], consts=_maybe_const(d, "r"))


def trilu(d: Draw) -> Case:
    x = _data(d, lo=2)
    k = np.array(d.int(-4, 4), I64) if d.chance(0.6) else None
    return Case("Trilu", [("x", x), ("k", k)], {"upper": d.int(0, 1)} if d.chance(0.7) else {})


def pad(d: Draw) -> Case:
    # the types onnxruntime pads (the second opinion on negative pads, which onnx.reference refuses)
    x = d.values(d.pick(PAD_TYPES), d.shape(lo=1))
    mode = d.pick(["constant", "constant", "reflect", "edge", "wrap"])
    r = x.ndim
    axes = None
    if d.chance(0.3):
        axes = [int(a) for a in d.rng.choice(r, size=d.int(1, r), replace=False)]
    k = r if axes is None else len(axes)
    lo_bound = 0 if mode != "constant" else -2
    pads = [d.int(lo_bound, 3) for _ in range(2 * k)]
    value = d.values(x.dtype, ()) if mode == "constant" and d.chance(0.5) else None
    ins = [("x", x), ("pads", np.array(pads, I64)), ("value", value)]
    if axes is not None:
        ins.append(("axes", np.array(axes, I64)))
    case = Case("Pad", ins, {"mode": mode})
    ax = range(r) if axes is None else axes
    if mode in ("reflect", "wrap") and any(x.shape[a] == 0 or max(pads[i], pads[i + k]) >= x.shape[a]
                                           for i, a in enumerate(ax)):
        case.out_of_spec = "pad-reflect-beyond-edge"
    if mode == "edge" and any(x.shape[a] == 0 and (pads[i] or pads[i + k]) for i, a in enumerate(ax)):
        case.out_of_spec = "pad-edge-of-empty"
    return case


def range_(d: Draw) -> Case:
    dt = d.pick([np.dtype(np.float32), np.dtype(np.int64), np.dtype(np.int32), np.dtype(np.float64)])
    s = d.values(dt, (), lo=-10, hi=10, special=0)
    l = d.values(dt, (), lo=-10, hi=10, special=0)
    delta = d.values(dt, (), lo=-3, hi=3, special=0)
    if delta == 0:
        delta = np.array(1, dt)
    return Case("Range", [("s", s), ("l", l), ("d", delta)])


def constant_of_shape(d: Draw) -> Case:
    shp = np.array(d.shape(), I64)
    attrs = {}
    if d.chance(0.7):
        dt = d.pick(NUMERIC)
        attrs["value"] = numpy_helper.from_array(d.values(dt, (1,)), "value")
    return Case("ConstantOfShape", [("shape", shp)], attrs, consts=_maybe_const(d, "shape"))


def constant(d: Draw) -> Case:
    kind = d.pick(["value", "value_float", "value_floats", "value_int", "value_ints"])
    if kind == "value":
        v: Any = numpy_helper.from_array(d.values(d.pick(NUMERIC), d.shape()), "v")
    elif kind == "value_float":
        v = float(d.values(F32, (), special=0))
    elif kind == "value_floats":
        v = [float(t) for t in d.values(F32, (d.int(1, 4),), special=0)]
    elif kind == "value_int":
        v = d.int(-100, 100)
    else:
        v = [d.int(-100, 100) for _ in range(d.int(1, 4))]
    return Case("Constant", [], {kind: v})


def tensor_scatter(d: Draw) -> Case:
    b, h, cap, hd = d.int(1, 3), d.int(1, 2), d.int(1, 8), d.int(1, 4)
    n = d.int(0, cap)
    cache = d.values(F32, (b, h, cap, hd))
    upd = d.values(F32, (b, h, n, hd))
    mode = d.pick(["linear", "circular"])
    hi = cap if mode == "circular" else cap - n
    wi = np.array([d.int(0, hi) for _ in range(b)], I64) if d.chance(0.7) else None
    if wi is not None and d.chance(0.04):
        wi[0] = cap + 1
    return Case("TensorScatter", [("cache", cache), ("upd", upd), ("wi", wi)], {"mode": mode, "axis": -2},
                opset=24)


GENERATORS: dict[tuple[str, str], Any] = {
    ("", "Reshape"): reshape, ("", "Squeeze"): squeeze, ("", "Unsqueeze"): unsqueeze,
    ("", "Flatten"): flatten, ("", "Identity"): identity, ("", "Slice"): slice_, ("", "Shape"): shape,
    ("", "Size"): size, ("", "Concat"): concat, ("", "Expand"): expand, ("", "Transpose"): transpose,
    ("", "Gather"): gather, ("", "GatherElements"): gather_elements, ("", "GatherND"): gather_nd,
    ("", "ScatterND"): scatter_nd, ("", "Split"): split, ("", "Tile"): tile, ("", "Trilu"): trilu,
    ("", "Pad"): pad, ("", "Range"): range_, ("", "ConstantOfShape"): constant_of_shape,
    ("", "Constant"): constant, ("", "TensorScatter"): tensor_scatter,
}
_ = helper


def spec_slice(inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Slice as the specification words it (start clamped into [0, n] or [0, n - 1], end into
    [0, n] or [-1, n - 1] by the step's sign), for the cases where both oracles depart from it."""
    x = inputs["x"]
    starts, ends = [int(v) for v in inputs["starts"]], [int(v) for v in inputs["ends"]]
    axes = [int(a) for a in inputs.get("axes", np.arange(len(starts)))]
    steps = [int(s) for s in inputs.get("steps", np.ones(len(starts), np.int64))]
    if len(set(a % x.ndim for a in axes)) != len(axes) or any(not -x.ndim <= a < x.ndim for a in axes):
        raise ValueError("bad axes")
    index = [slice(None)] * x.ndim
    for s, e, a, st in zip(starts, ends, axes, steps):
        n = x.shape[a]
        s, e = (s + n if s < 0 else s), (e + n if e < 0 else e)
        if st > 0:
            s, e = min(max(s, 0), n), min(max(e, 0), n)
            idx = list(range(s, e, st))
        else:
            s, e = min(max(s, 0), n - 1), min(max(e, -1), n - 1)
            idx = list(range(s, e, st))
        index[a] = np.array(idx, np.int64)
    out = x
    for a, ix in enumerate(index):
        if isinstance(ix, np.ndarray):
            out = np.take(out, ix, axis=a)
    return [out]
