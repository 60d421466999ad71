"""Attributes and output geometry of ONNX Conv and ConvTranspose.

:func:`parse` reads and checks a node's attributes once at plan time (anything the
kernels cannot honour is a typed plan-time error); :func:`conv_geometry` and
:func:`transpose_geometry` turn them, with the shapes of one call, into leading pads
and output extents, so one plan serves every input size. :meth:`Geometry.lift` gives
the 3-D form the compiled loops take (1-D and 2-D convolutions are 3-D ones with
leading extents of 1).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from onnxforge.kernels_cy.ops.base import NodeSpec

__all__ = ["ConvAttrs", "Geometry", "conv_geometry", "parse", "size", "transpose_geometry"]

AUTO_PADS = frozenset({"NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"})
MAX_RANK = 3  # spatial dimensions the compiled loops cover


@dataclass(frozen=True, slots=True)
class ConvAttrs:
    """A node's attributes; ``None`` where the attribute is absent (its default depends
    on the spatial rank, known per call)."""

    auto_pad: str
    group: int
    pads: tuple[int, ...] | None
    strides: tuple[int, ...] | None
    dilations: tuple[int, ...] | None
    kernel_shape: tuple[int, ...] | None
    output_padding: tuple[int, ...] | None = None
    output_shape: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class Geometry:
    """One call's spatial geometry (each tuple has one entry per spatial dimension)."""

    ins: tuple[int, ...]
    outs: tuple[int, ...]
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads: tuple[int, ...]  # leading pads; the trailing ones follow from the extents

    def lift(self) -> tuple[tuple[int, ...], ...]:
        """``(ins, outs, kernel, strides, dilations, pads)`` as 3-tuples."""
        k = MAX_RANK - len(self.ins)
        one, zero = (1,) * k, (0,) * k
        return (one + self.ins, one + self.outs, one + self.kernel, one + self.strides,
                one + self.dilations, zero + self.pads)


def _tuple(spec: NodeSpec, name: str, minimum: int) -> tuple[int, ...] | None:
    v = spec.ints(name)
    if v is None:
        return None
    if any(i < minimum for i in v):
        raise spec.fail(f"attribute {name}={v} must hold values >= {minimum}")
    return tuple(v)


def parse(spec: NodeSpec, transpose: bool) -> ConvAttrs:
    """The node's attributes, checked for what the kernels support."""
    auto_pad = spec.choice("auto_pad", "NOTSET", AUTO_PADS)
    group = spec.int("group", 1)
    if group < 1:
        raise spec.fail(f"group={group} must be >= 1")
    pads = _tuple(spec, "pads", 0)
    if pads is not None and len(pads) % 2:
        raise spec.fail(f"pads={list(pads)} must hold a begin and an end per spatial axis")
    a = ConvAttrs(auto_pad, group, pads, _tuple(spec, "strides", 1), _tuple(spec, "dilations", 1),
                  _tuple(spec, "kernel_shape", 1),
                  _tuple(spec, "output_padding", 0) if transpose else None,
                  _tuple(spec, "output_shape", 0) if transpose else None)
    if not transpose:
        for name in ("output_padding", "output_shape"):
            if name in spec.attrs:
                raise spec.fail(f"attribute {name!r} is not a Conv attribute")
    lengths = {name: len(v) for name, v in (("strides", a.strides), ("dilations", a.dilations),
                                            ("kernel_shape", a.kernel_shape),
                                            ("output_padding", a.output_padding),
                                            ("output_shape", a.output_shape)) if v is not None}
    if pads is not None:
        lengths["pads/2"] = len(pads) // 2
    if len(set(lengths.values())) > 1:
        raise spec.fail(f"attributes disagree on the number of spatial axes: {lengths}")
    if lengths and not 1 <= next(iter(lengths.values())) <= MAX_RANK:
        raise spec.fail(f"only 1-D, 2-D and 3-D convolutions are supported (attributes {lengths})")
    return a


def _per_axis(v: tuple[int, ...] | None, nd: int, default: int, name: str,
              error: Callable[[str], Exception], count: int = 1) -> tuple[int, ...]:
    if v is None:
        return (default,) * (nd * count)
    if len(v) != nd * count:
        raise error(f"{name}={list(v)} has {len(v)} values for {nd} spatial axes")
    return v


def _common(a: ConvAttrs, x_shape: Sequence[int], w_shape: Sequence[int],
            error: Callable[[str], Exception]
            ) -> tuple[int, tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """Rank, kernel, strides, dilations and pads (begins then ends) of one call, checked."""
    nd = len(x_shape) - 2
    if not 1 <= nd <= MAX_RANK:
        raise error(f"input must have rank 3, 4 or 5 (1-D to 3-D), got shape {list(x_shape)}")
    if len(w_shape) != len(x_shape):
        raise error(f"W has shape {list(w_shape)}, expected rank {len(x_shape)} like X {list(x_shape)}")
    kernel = tuple(int(k) for k in w_shape[2:])
    if a.kernel_shape is not None and a.kernel_shape != kernel:
        raise error(f"kernel_shape={list(a.kernel_shape)} disagrees with W's shape {list(w_shape)}")
    if min(kernel) < 1:
        raise error(f"W has an empty kernel: shape {list(w_shape)}")
    strides = _per_axis(a.strides, nd, 1, "strides", error)
    dilations = _per_axis(a.dilations, nd, 1, "dilations", error)
    pads = _per_axis(a.pads, nd, 0, "pads", error, 2)
    return nd, kernel, strides, dilations, pads


def conv_geometry(a: ConvAttrs, x_shape: Sequence[int], w_shape: Sequence[int],
                  error: Callable[[str], Exception]) -> Geometry:
    """Conv: ``out = floor((in + pad_begin + pad_end - ((k - 1) * d + 1)) / s) + 1``; with
    SAME_* ``out = ceil(in / s)`` and the total padding split evenly, the odd one at the
    end (SAME_UPPER) or at the beginning (SAME_LOWER)."""
    nd, kernel, strides, dilations, pads = _common(a, x_shape, w_shape, error)
    ins = tuple(int(i) for i in x_shape[2:])
    begins, outs = [], []
    for i in range(nd):
        ek = (kernel[i] - 1) * dilations[i] + 1
        if a.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            out = -(-ins[i] // strides[i])
            total = max(0, (out - 1) * strides[i] + ek - ins[i])
            begin = total // 2 if a.auto_pad == "SAME_UPPER" else total - total // 2
        else:
            begin, end = (0, 0) if a.auto_pad == "VALID" else (pads[i], pads[i + nd])
            span = ins[i] + begin + end
            if span < ek:
                raise error(f"spatial axis {i}: the dilated kernel ({ek}) is larger than the padded "
                            f"input ({span}); X shape {list(x_shape)}, W shape {list(w_shape)}")
            out = (span - ek) // strides[i] + 1
        begins.append(begin)
        outs.append(out)
    return Geometry(ins, tuple(outs), kernel, strides, dilations, tuple(begins))


def transpose_geometry(a: ConvAttrs, x_shape: Sequence[int], w_shape: Sequence[int],
                       error: Callable[[str], Exception]) -> Geometry:
    """ConvTranspose: the full extent is ``s * (in - 1) + output_padding + (k - 1) * d + 1``;
    explicit pads crop it, or ``output_shape`` (else, with SAME_*, ``in * s``) fixes the
    output and the total padding ``full - out`` is split as the spec says: ``total // 2``
    at the beginning for SAME_UPPER, ``total - total // 2`` otherwise. An output past the
    full extent (a negative total, e.g. a stride larger than the kernel) has no padding
    to split: it starts at position 0 and ends in zeros, as onnxruntime does."""
    nd, kernel, strides, dilations, pads = _common(a, x_shape, w_shape, error)
    ins = tuple(int(i) for i in x_shape[2:])
    if min(ins) < 1:
        raise error(f"ConvTranspose needs non-empty spatial extents, X has shape {list(x_shape)}")
    out_pad = _per_axis(a.output_padding, nd, 0, "output_padding", error)
    target = None if a.output_shape is None else _per_axis(a.output_shape, nd, 0, "output_shape", error)
    if target is None and a.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        target = tuple(i * s for i, s in zip(ins, strides))
    begins, outs = [], []
    for i in range(nd):
        full = strides[i] * (ins[i] - 1) + out_pad[i] + (kernel[i] - 1) * dilations[i] + 1
        if target is not None:
            total = max(0, full - target[i])
            begin = total // 2 if a.auto_pad == "SAME_UPPER" else total - total // 2
            out = target[i]
        else:
            begin, end = (0, 0) if a.auto_pad == "VALID" else (pads[i], pads[i + nd])
            out = full - begin - end
            if out < 1:
                raise error(f"spatial axis {i}: pads {begin} + {end} leave no output of the full "
                            f"extent {full}; X shape {list(x_shape)}, W shape {list(w_shape)}")
        begins.append(begin)
        outs.append(out)
    return Geometry(ins, tuple(outs), kernel, strides, dilations, tuple(begins))


def size(shape: Sequence[int]) -> int:
    """The number of elements of ``shape``."""
    return math.prod(shape)
