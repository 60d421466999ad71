"""Shape and data-movement kernels.

Views (``fresh = False``): Reshape, Squeeze, Unsqueeze, Flatten, Identity and Slice
return numpy views of their input where liveness allows it
(:func:`~onnxforge.passes.analyses.liveness.may_view`; elsewhere the planner wraps
them in :class:`FreshCopy`); a view that needs a contiguous input it does not have
copies once and reports it as materialized. Everything else returns new arrays.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from onnxforge.kernels_cy.ops import fast
from onnxforge.kernels_cy.ops.base import Kernel, NodeSpec, register

__all__ = ["FreshCopy", "checked_axes", "reshape_target"]


def reshape_target(shape: Any, data_shape: tuple[int, ...], allowzero: int) -> tuple[int, ...]:
    """The concrete target of ONNX Reshape (0 copies a dimension unless ``allowzero``)."""
    out = shape.tolist() if isinstance(shape, np.ndarray) else [int(d) for d in shape]
    if not allowzero:
        for i, d in enumerate(out):
            if d == 0:
                out[i] = data_shape[i]
    return tuple(out)


class _View(Kernel):
    fresh = False
    views_input = True  # a copy returned instead of a view is counted by the run loop

    def _reshape(self, x: np.ndarray, shape: Any) -> np.ndarray:
        if x.flags.c_contiguous:
            return x.reshape(shape)
        return np.ascontiguousarray(x).reshape(shape)


@register("", "Reshape")
class Reshape(_View):
    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.allowzero = spec.int("allowzero", 0)
        c = spec.const(1)
        self.static = None
        if c is not None and (self.allowzero or not np.any(c == 0)):
            self.static = tuple(int(d) for d in c)
        if c is not None and c.ndim == 1 and fast.ReshapeCall is not None:
            self.run = fast.ReshapeCall(c.tolist(), bool(self.allowzero), self._run)  # type: ignore[method-assign]

    def run(self, x, shape=None):
        return self._run(x, shape)

    def _run(self, x, shape=None):
        if self.static is not None:
            return self._reshape(x, self.static)
        return self._reshape(x, reshape_target(shape, x.shape, self.allowzero))


def _axes(spec: NodeSpec, index: int) -> list[int] | None:
    if spec.opset < 13 or (spec.op_type in ("Squeeze", "Unsqueeze") and spec.opset < 13):
        return spec.ints("axes")
    c = spec.const(index)
    return None if c is None else [int(a) for a in np.ravel(c)]


def checked_axes(axes: list[int], rank: int, what: str, fail: Any) -> tuple[int, ...]:
    """``axes`` normalized into ``[0, rank)``; out of range or repeated raises ``fail(message)``."""
    out = []
    for a in axes:
        if not -rank <= a < rank:
            raise fail(f"{what} axis {a} is out of range for rank {rank}")
        out.append(a % rank)
    if len(set(out)) != len(out):
        raise fail(f"{what} axes {axes} repeat an axis")
    return tuple(out)


@register("", "Squeeze")
class Squeeze(_View):
    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.axes = _axes(spec, 1)
        self.dynamic = spec.opset >= 13 and spec.has_input(1) and self.axes is None

    def run(self, x, axes=None):
        ax = self.axes
        if self.dynamic:
            ax = [int(a) for a in np.ravel(axes)]
        if ax is None:
            ax = [i for i, d in enumerate(x.shape) if d == 1]
        ax = checked_axes(ax, x.ndim, "Squeeze", self.error)
        for a in ax:
            if x.shape[a] != 1:
                raise self.error(f"cannot squeeze axis {a} of shape {x.shape}")
        return np.squeeze(x, axis=ax) if ax else x.view()


@register("", "Unsqueeze")
class Unsqueeze(_View):
    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.axes = _axes(spec, 1)
        if self.axes is not None and len(set(self.axes)) != len(self.axes):
            raise spec.fail(f"Unsqueeze axes {self.axes} repeat an axis")

    def run(self, x, axes=None):
        ax = self.axes if self.axes is not None else [int(a) for a in np.ravel(axes)]
        r = x.ndim + len(ax)
        ax = sorted(checked_axes(ax, r, "Unsqueeze", self.error))
        shape = list(x.shape)
        for a in ax:
            shape.insert(a, 1)
        return x.reshape(shape)


@register("", "Flatten")
class Flatten(_View):
    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.axis = spec.int("axis", 1)

    def run(self, x):
        a = self.axis + x.ndim if self.axis < 0 else self.axis
        outer = int(np.prod(x.shape[:a], dtype=np.int64))
        inner = int(np.prod(x.shape[a:], dtype=np.int64))
        return self._reshape(x, (outer, inner))


@register("", "Identity")
class Identity(_View):
    def run(self, x):
        return x


@register("", "Slice")
class Slice(_View):
    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.legacy = spec.opset < 10
        if self.legacy:
            self.starts = spec.ints("starts")
            self.ends = spec.ints("ends")
            self.axes_attr = spec.ints("axes")

    def run(self, x, starts=None, ends=None, axes=None, steps=None):
        if self.legacy:
            starts, ends, axes = self.starts, self.ends, self.axes_attr
        starts = [int(s) for s in np.ravel(starts)]
        ends = [int(e) for e in np.ravel(ends)]
        k = len(starts)
        axes = list(range(k)) if axes is None else [int(a) for a in np.ravel(axes)]
        steps = [1] * k if steps is None else [int(s) for s in np.ravel(steps)]
        if not len(ends) == len(axes) == len(steps) == k:
            raise self.error(f"starts, ends, axes and steps differ in length ({k}, {len(ends)}, "
                             f"{len(axes)}, {len(steps)})")
        axes = list(checked_axes(axes, x.ndim, "Slice", self.error))
        index = [slice(None)] * x.ndim
        for s, e, a, st in zip(starts, ends, axes, steps):
            if st == 0:
                raise self.error("slice step 0")
            n = x.shape[a]
            s = s + n if s < 0 else s
            e = e + n if e < 0 else e
            if st > 0:  # both clamped into [0, n]
                s, e = max(0, min(n, s)), max(0, min(n, e))
            else:  # start into [0, n - 1], end into [-1, n - 1] (-1: through element 0)
                s, e = max(0, min(n - 1, s)), max(-1, min(n - 1, e))
                if e < 0:
                    e = None
            index[a] = slice(s, e, st)
        return x[tuple(index)]


@register("", "Shape")
class Shape(Kernel):
    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.start = spec.attrs.get("start", 0)
        self.end = spec.attrs.get("end")

    def run(self, x):
        r = x.ndim
        s = self.start + r if self.start < 0 else self.start
        e = r if self.end is None else (self.end + r if self.end < 0 else self.end)
        s, e = max(0, min(r, s)), max(0, min(r, e))
        return np.array(x.shape[s:e], dtype=np.int64)


@register("", "Size")
class Size(Kernel):
    def run(self, x):
        return np.array(x.size, dtype=np.int64)


@register("", "Concat")
class Concat(Kernel):
    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.axis = spec.int("axis")

    def run(self, *xs):
        return np.concatenate(xs, axis=self.axis % xs[0].ndim if xs[0].ndim else 0)


@register("", "Expand")
class Expand(Kernel):
    def run(self, x, shape):
        target = _broadcast(x.shape, shape.tolist() if isinstance(shape, np.ndarray) else [int(d) for d in shape])
        if target is None:
            raise self.error(f"shape {list(x.shape)} cannot be expanded to {[int(d) for d in shape]}")
        out = np.empty(target, dtype=x.dtype)
        out[...] = x
        return out


@register("", "Transpose")
class Transpose(Kernel):
    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.perm = spec.ints("perm")

    def run(self, x):
        perm = self.perm if self.perm is not None else list(range(x.ndim))[::-1]
        return np.ascontiguousarray(np.transpose(x, perm)) if x.ndim > 1 else np.array(x, copy=True)


@register("", "Gather")
class Gather(Kernel):
    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.axis = spec.int("axis", 0)

    def run(self, x, idx):
        if not -x.ndim <= self.axis < x.ndim:
            raise self.error(f"Gather axis {self.axis} is out of range for rank {x.ndim}")
        a = self.axis % x.ndim
        try:  # numpy's take checks the range and wraps negative indices like ONNX
            return np.asarray(np.take(x, idx, axis=a))
        except (IndexError, TypeError):
            n = x.shape[a]
            raise self.error(f"Gather index out of range [{-n}, {n})") from None


def _checked_indices(kernel: Kernel, idx: np.ndarray, dims: Any, what: str) -> np.ndarray:
    """int64 copy of ``idx`` with negatives wrapped once; each index ``i`` along the last
    axis of ``dims`` (broadcast) must lie in ``[-dims, dims)`` or a KernelError is raised."""
    if idx.dtype.kind not in "iu":
        raise kernel.error(f"{what} indices must be integers, got {idx.dtype}")
    ii = idx.astype(np.int64)
    d = np.asarray(dims, dtype=np.int64)
    bad = (ii < -d) | (ii >= d)
    if bad.any():
        pos = tuple(int(v) for v in np.argwhere(bad)[0])
        raise kernel.error(f"{what} index out of range: {int(ii[pos])} at {list(pos)} for a "
                           f"dimension of {int(np.broadcast_to(d, ii.shape)[pos])}")
    return np.where(ii < 0, ii + d, ii)


@register("", "GatherElements")
class GatherElements(Kernel):
    """``out[i0, ..., ik, ...] = x[i0, ..., idx[i0, ..., ik, ...], ...]`` with ``k = axis``:
    the output has the indices' shape."""

    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.axis = spec.int("axis", 0)

    def run(self, x, idx):
        r = x.ndim
        if idx.ndim != r or r == 0:
            raise self.error(f"indices rank {idx.ndim} must equal the data rank {r} (>= 1)")
        if not -r <= self.axis < r:
            raise self.error(f"axis {self.axis} is out of range for rank {r}")
        a = self.axis % r
        for i in range(r):
            if i != a and idx.shape[i] > x.shape[i]:
                raise self.error(f"indices shape {list(idx.shape)} exceeds the data shape "
                                 f"{list(x.shape)} on axis {i}")
        ii = _checked_indices(self, idx, x.shape[a], "GatherElements")
        grid = list(np.indices(idx.shape, sparse=True))
        grid[a] = ii
        return np.ascontiguousarray(x[tuple(grid)]).reshape(idx.shape)


@register("", "GatherND")
class GatherND(Kernel):
    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.b = spec.int("batch_dims", 0)
        if self.b < 0:
            raise spec.fail(f"batch_dims={self.b} must not be negative")

    def run(self, x, idx):
        b = self.b
        if idx.ndim < 1 or idx.ndim <= b or x.ndim <= b:
            raise self.error(f"batch_dims={b} needs data and indices of rank > {b}, got ranks "
                             f"{x.ndim} and {idx.ndim}")
        if x.shape[:b] != idx.shape[:b]:
            raise self.error(f"the first batch_dims={b} dimensions of data {list(x.shape)} and "
                             f"indices {list(idx.shape)} differ")
        k = idx.shape[-1]
        if k > x.ndim - b:
            raise self.error(f"indices last dimension {k} exceeds the data rank {x.ndim} - batch_dims {b}")
        ii = _checked_indices(self, idx, x.shape[b:b + k], "GatherND")
        bshape = x.shape[:b]
        nb = int(np.prod(bshape, dtype=np.int64))
        tail = x.shape[b + k:]
        xr = x.reshape((nb,) + x.shape[b:])
        m = int(np.prod(idx.shape[b:-1], dtype=np.int64))
        ir = ii.reshape((nb, m, k))
        batch = np.broadcast_to(np.arange(nb, dtype=np.int64)[:, None], (nb, m))
        out = xr[(batch,) + tuple(ir[..., j] for j in range(k))]  # [nb, m] + tail
        return np.ascontiguousarray(out).reshape(idx.shape[:-1] + tail)


@register("", "ScatterND")
class ScatterND(Kernel):
    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.reduction = spec.choice("reduction", "none", {"none", "add", "mul", "max", "min"})

    def run(self, x, idx, upd):
        if idx.ndim < 1:
            raise self.error("indices must have rank >= 1")
        k = idx.shape[-1]
        if k > x.ndim:
            raise self.error(f"indices last dimension {k} exceeds the data rank {x.ndim}")
        want = idx.shape[:-1] + x.shape[k:]
        if upd.shape != want:
            raise self.error(f"updates shape {list(upd.shape)} must be {list(want)}")
        ii = _checked_indices(self, idx, x.shape[:k], "ScatterND")  # checked before any write
        out = np.array(x, copy=True)
        flat_idx = ii.reshape(-1, k)
        flat_upd = upd.reshape((flat_idx.shape[0],) + x.shape[k:])
        for i in range(flat_idx.shape[0]):
            t = tuple(int(v) for v in flat_idx[i])
            if self.reduction == "none":
                out[t] = flat_upd[i]
            elif self.reduction == "add":
                out[t] += flat_upd[i]
            elif self.reduction == "mul":
                out[t] *= flat_upd[i]
            elif self.reduction == "max":
                out[t] = np.maximum(out[t], flat_upd[i])
            else:
                out[t] = np.minimum(out[t], flat_upd[i])
        return out


@register("", "Range")
class Range(Kernel):
    def run(self, start, limit, delta):
        s, l, d = start.item(), limit.item(), delta.item()
        n = max(int(np.ceil((l - s) / d)), 0)
        return (s + np.arange(n, dtype=np.float64 if start.dtype.kind == "f" else np.int64) * d).astype(start.dtype)


@register("", "ConstantOfShape")
class ConstantOfShape(Kernel):
    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        v = spec.attrs.get("value")
        self.value = np.zeros(1, dtype=np.float32) if v is None else np.asarray(v).reshape(-1)

    def run(self, shape):
        return np.full(tuple(int(d) for d in shape), self.value[0], dtype=self.value.dtype)


@register("", "Constant")
class Constant(Kernel):
    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        a = spec.attrs
        if "value" in a:
            v = np.asarray(a["value"])
        elif "value_float" in a:
            v = np.array(a["value_float"], dtype=np.float32)
        elif "value_floats" in a:
            v = np.array(a["value_floats"], dtype=np.float32)
        elif "value_int" in a:
            v = np.array(a["value_int"], dtype=np.int64)
        elif "value_ints" in a:
            v = np.array(a["value_ints"], dtype=np.int64)
        elif "value_string" in a:
            v = np.array(a["value_string"], dtype=object)
        elif "value_strings" in a:
            v = np.array(a["value_strings"], dtype=object)
        else:
            raise spec.fail("Constant needs one of value, value_float(s), value_int(s), value_string(s)")
        self.value = v

    def run(self):
        return np.array(self.value, copy=True)


@register("", "Split")
class Split(Kernel):
    """Parts along ``axis``: the ``split`` sizes (attribute before opset 13, else input 1),
    or ``num_outputs`` / the output count equal parts (the last one smaller when the
    extent does not divide). One output is one array, several a tuple; always new buffers."""

    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.axis = spec.int("axis", 0)
        self.n = spec.n_outputs
        num = spec.attrs.get("num_outputs")
        if num is not None and int(num) != self.n:
            raise spec.fail(f"num_outputs={num} but the node has {self.n} outputs")
        self.split_attr = spec.ints("split") if spec.opset < 13 else None
        const = spec.const(1) if spec.n_inputs > 1 else None
        if const is not None:
            self.split_attr = [int(v) for v in np.ravel(const)]
        if self.split_attr is not None:
            self._check_sizes(self.split_attr, spec.fail)
        # for a constant split: the slices, built once (a negative axis counts from the end)
        self.slices = None
        if self.split_attr is not None:
            ax = self.axis
            lead = (slice(None),) * ax if ax >= 0 else (Ellipsis,)
            tail = () if ax >= 0 else (slice(None),) * (-ax - 1)
            bounds = np.cumsum([0] + self.split_attr).tolist()
            self.slices = [lead + (slice(lo, hi),) + tail for lo, hi in zip(bounds[:-1], bounds[1:])]
            self.extent = bounds[-1]
            self.min_rank = ax + 1 if ax >= 0 else -ax
            if fast.SplitCall is not None and self.n > 1:
                self.run = fast.SplitCall(self.split_attr, ax, self._run)  # type: ignore[method-assign]

    def _check_sizes(self, sizes: list[int], fail: Any) -> None:
        if len(sizes) != self.n:
            raise fail(f"split has {len(sizes)} sizes for {self.n} outputs")
        if any(v < 0 for v in sizes):
            raise fail(f"split sizes {sizes} must not be negative")

    def run(self, x, split=None):
        return self._run(x, split)

    def _run(self, x, split=None):
        if not -x.ndim <= self.axis < x.ndim:
            raise self.error(f"axis {self.axis} is out of range for rank {x.ndim}")
        a = self.axis % x.ndim
        n = x.shape[a]
        if self.slices is not None and x.shape[a] == self.extent:
            outs = [np.array(x[sl], copy=True) for sl in self.slices]  # new buffers, never views
            return outs[0] if self.n == 1 else tuple(outs)
        sizes = self.split_attr
        if sizes is None and split is not None:
            sizes = [int(v) for v in np.ravel(split)]
            self._check_sizes(sizes, self.error)
        if sizes is None:
            k = self.n
            size = -(-n // k)
            sizes = [max(0, min(size, n - i * size)) for i in range(k)]
        if sum(sizes) != n:
            raise self.error(f"split sizes {sizes} add up to {sum(sizes)}, not the extent {n} of axis {a}")
        lead = (slice(None),) * a
        outs = []
        lo = 0
        for size in sizes:
            hi = lo + size
            outs.append(np.array(x[lead + (slice(lo, hi),)], copy=True))  # a new buffer, never a view
            lo = hi
        return outs[0] if self.n == 1 else tuple(outs)


@register("", "Tile")
class Tile(Kernel):
    def run(self, x, reps):
        return np.tile(x, tuple(int(r) for r in reps))


@register("", "Trilu")
class Trilu(Kernel):
    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.upper = spec.int("upper", 1)

    def run(self, x, k=None):
        kk = 0 if k is None else int(k)
        return np.triu(x, kk) if self.upper else np.tril(x, kk)


@register("", "Pad")
class Pad(Kernel):
    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.mode = spec.choice("mode", "constant", {"constant", "reflect", "edge", "wrap"})
        self.pads_attr = spec.ints("pads") if spec.opset < 11 else None
        self.value_attr = spec.attrs.get("value", 0.0)

    def run(self, x, pads=None, value=None, axes=None):
        pads = self.pads_attr if pads is None else [int(p) for p in pads]
        r = x.ndim
        axes = list(range(r)) if axes is None else [int(a) % r for a in axes]
        k = len(axes)
        width = [(0, 0)] * r
        for i, a in enumerate(axes):
            width[a] = (pads[i], pads[i + k])
        # pad by the positive amounts, then crop by the negative ones (a crop may eat padding)
        crop = [slice(None)] * r
        width2 = []
        for a, (lo, hi) in enumerate(width):
            n = x.shape[a] + max(lo, 0) + max(hi, 0)
            if x.shape[a] + lo + hi < 0:
                raise self.error(f"pads ({lo}, {hi}) crop more than the {x.shape[a]} elements of axis {a}")
            crop[a] = slice(max(-lo, 0), n - max(-hi, 0))
            width2.append((max(lo, 0), max(hi, 0)))
        if self.mode == "constant":
            v = self.value_attr if value is None or value.size == 0 else value.reshape(-1)[0]
            y = np.pad(x, width2, mode="constant", constant_values=v)
        else:
            y = np.pad(x, width2, mode=self.mode)
        return np.ascontiguousarray(y[tuple(crop)])


@register("", "TensorScatter")
class TensorScatter(Kernel):
    """opset 24: write ``update`` into a copy of ``past_cache`` at ``write_indices`` per batch."""

    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.axis = spec.int("axis", -2)
        self.mode = spec.choice("mode", "linear", {"linear", "circular"})

    def run(self, cache, update, write_indices=None):
        out = np.array(cache, copy=True)
        a = self.axis % cache.ndim
        if a == 0:
            raise self.error("TensorScatter axis must not be the batch axis")
        n = update.shape[a]
        cap = cache.shape[a]
        for b in range(cache.shape[0]):
            start = 0 if write_indices is None else int(write_indices[b])
            pos = np.arange(start, start + n)
            if self.mode == "circular":
                pos %= cap
            elif start + n > cap or start < 0:
                raise self.error(f"write index {start} + {n} exceeds the capacity {cap}")
            idx = [slice(None)] * (cache.ndim - 1)
            idx[a - 1] = pos
            row = out[b]
            row[tuple(idx)] = update[b]
        return out


class FreshCopy(Kernel):
    """A view kernel at a node whose output liveness gives a buffer of its own
    (:func:`~onnxforge.passes.analyses.liveness.may_view` is False: a Slice whose steps
    are not stated ones): the output is copied when it shares the input's storage, and
    counted as allocated."""

    fresh = True
    views_input = False

    def __init__(self, view: Kernel):
        self.spec_path = view.spec_path
        self.view = view

    def run(self, x, *rest):
        out = self.view.run(x, *rest)
        if isinstance(out, np.ndarray) and isinstance(x, np.ndarray) and np.may_share_memory(out, x):
            return np.array(out, copy=True, order="C")
        return out


class Materialize:
    """Copies a view before its storage is written in place (L13); counted as copied."""

    fresh = False
    uses_context = True
    views_input = False

    def run(self, ctx, view, storage):
        if isinstance(view, np.ndarray) and np.may_share_memory(view, storage):
            c = np.array(view, copy=True)
            ctx.mem.materialized(c.nbytes)
            return c
        return view


def _broadcast(xs: tuple[int, ...], target: list[int]) -> tuple[int, ...] | None:
    """numpy broadcasting of ``xs`` with ``target`` (None when they do not broadcast)."""
    n = max(len(xs), len(target))
    a = (1,) * (n - len(xs)) + tuple(xs)
    b = [1] * (n - len(target)) + target
    out = []
    for p, q in zip(a, b):
        if p == q or q == 1:
            out.append(p)
        elif p == 1:
            out.append(q)
        else:
            return None
    return tuple(out)
