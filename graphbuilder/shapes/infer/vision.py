"""Convolution, pooling, resampling and detection operators.

Spatial output sizes follow the operators' formulas, kept symbolic::

    Conv(X[N, C, h, w], W[M, C, 3, 3], pads=[1, 1, 1, 1], strides=[2, 2])
      -> [N, M, (h + 1)//2 + ... ]   i.e. floor((h + 2 - 3) / 2) + 1 == (h - 1)//2 + 1

    NOTSET:               floor((in + pad_begin + pad_end - ((k - 1)*d + 1)) / s) + 1
    ceil_mode (pools):    ceil(...) + 1, minus one when the last window would start
                          in the end padding (decided on numbers only)
    VALID:                ceil((in - ((k - 1)*d + 1) + 1) / s)
    SAME_UPPER/LOWER:     ceil(in / s)

``ConvTranspose`` uses ``s*(in - 1) + output_padding + ((k - 1)*d + 1) - pads``
(``in*s`` for the SAME modes) unless ``output_shape`` is given. ``Resize`` and
``Upsample`` multiply by known scales (``floor(in*scale)``) or take known
``sizes``; a size that depends on a float scale and a symbolic input is unknown.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from onnx import TensorProto
from onnxforge.graphbuilder.shapes.infer._base import NodeInference, register
from onnxforge.graphbuilder.shapes.symbolic import Dim, SymExpr, as_dim, ceildiv, floordiv

__all__ = ["conv_spatial", "pool_spatial"]

INT64 = TensorProto.INT64


def _auto_pad(op: NodeInference) -> str:
    a = op.attr("auto_pad", b"NOTSET")
    return (a.decode() if isinstance(a, bytes) else str(a)) or "NOTSET"


def _window(op: NodeInference, n: int) -> tuple[list[int], list[int], list[int], str]:
    """strides, dilations, pads (2n) and auto_pad of a sliding-window operator."""
    strides = op.ints_attr("strides") or [1] * n
    dil = op.ints_attr("dilations") or [1] * n
    pads = op.ints_attr("pads") or [0] * (2 * n)
    if len(strides) != n or len(dil) != n or len(pads) != 2 * n:
        op.fail(f"strides {strides}, dilations {dil} and pads {pads} do not fit {n} spatial axes")
    return strides, dil, pads, _auto_pad(op)


def _out_size(d: Dim, k: int, s: int, dil: int, pb: int, pe: int, mode: str, ceil: bool,
              last_window: bool = True) -> Dim:
    """Output length of one spatial axis of a convolution or pooling window."""
    if d is None:
        return None
    ek = (k - 1) * dil + 1
    if mode in ("SAME_UPPER", "SAME_LOWER"):
        return as_dim(ceildiv(d, s))
    if mode == "VALID":
        return as_dim(ceildiv(d - ek + 1, s))
    span = d + pb + pe - ek
    if not ceil:
        return as_dim(floordiv(span, s) + 1)
    if not last_window:
        return as_dim(ceildiv(span, s) + 1)
    if not isinstance(d, int):
        return None  # the last-window correction cannot be decided on a symbol
    n = -(-(d + pb + pe - ek) // s) + 1  # span, now known to be an int
    if (n - 1) * s >= d + pb:
        n -= 1
    return n


def conv_spatial(op: NodeInference, spatial: Sequence[Dim], kernel: Sequence[Dim],
                 ceil: bool = False) -> list[Dim]:
    """Output spatial dimensions of a convolution or pooling window. In ceil mode a
    window starting in the end padding is dropped from opset 22 on (as onnx infers)."""
    n = len(spatial)
    strides, dil, pads, mode = _window(op, n)
    out: list[Dim] = []
    for i in range(n):
        k = kernel[i]
        if not isinstance(k, int):
            out.append(None)
            continue
        out.append(_out_size(spatial[i], k, strides[i], dil[i], pads[i], pads[i + n], mode, ceil,
                             op.version >= 22))
    return out


def pool_spatial(op: NodeInference, spatial: Sequence[Dim]) -> list[Dim]:
    kernel = op.ints_attr("kernel_shape")
    if kernel is None or len(kernel) != len(spatial):
        op.fail(f"kernel_shape {kernel} does not fit {len(spatial)} spatial axes")
    return conv_spatial(op, spatial, kernel, ceil=bool(op.int_attr("ceil_mode", 0)))


def _rank_from(op: NodeInference, *inputs: int) -> int | None:
    for i in inputs:
        r = op.rank(i) if op.has(i) else None
        if r is not None:
            return r
    return None


@register("Conv", "ConvInteger", "QLinearConv", "DeformConv")
def _conv(op: NodeInference) -> None:
    kind = op.node.op_type
    xi, wi = (0, 3) if kind == "QLinearConv" else (0, 1)
    x, w = op.shape(xi), op.shape(wi)
    elem = {"ConvInteger": TensorProto.INT32, "QLinearConv": op.elem(7)}.get(kind, op.elem(0))
    r = _rank_from(op, xi, wi)
    if r is None:
        op.set(0, elem, None)
        return
    if r < 3 and kind != "QLinearConv":
        op.fail(f"input rank {r} has no spatial axis")
    kernel: Sequence[Dim] = op.ints_attr("kernel_shape") or (list(w[2:]) if w is not None else [None] * (r - 2))
    spatial = list(x[2:]) if x is not None else [None] * (r - 2)
    if len(kernel) != r - 2:
        op.fail(f"kernel_shape {kernel} does not fit {r - 2} spatial axes")
    out = [x[0] if x is not None else None, w[0] if w is not None else None]
    out += conv_spatial(op, spatial, kernel)
    if kind == "DeformConv":
        off = op.shape(2)
        if off is not None and len(off) == r:
            out[2:] = [a if a is not None else b for a, b in zip(out[2:], off[2:])]
    op.set(0, elem, out)


@register("ConvTranspose")
def _conv_transpose(op: NodeInference) -> None:
    x, w = op.shape(0), op.shape(1)
    r = _rank_from(op, 0, 1)
    elem = op.elem(0)
    if r is None:
        op.set(0, elem, None)
        return
    n = r - 2
    group = op.int_attr("group", 1) or 1
    m = None if w is None or w[1] is None else as_dim(w[1] * group)
    out: list[Dim] = [x[0] if x is not None else None, m]
    output_shape = op.ints_attr("output_shape")
    if output_shape is not None:
        out += list(output_shape[-n:])
        op.set(0, elem, out)
        return
    kernel: Sequence[Dim] = op.ints_attr("kernel_shape") or (list(w[2:]) if w is not None else [None] * n)
    strides, dil, pads, mode = _window(op, n)
    opad = op.ints_attr("output_padding") or [0] * n
    for i in range(n):
        d = x[2 + i] if x is not None else None
        k = kernel[i]
        if d is None or not isinstance(k, int):
            out.append(None)
        elif mode in ("SAME_UPPER", "SAME_LOWER"):
            out.append(as_dim(d * strides[i]))
        else:
            out.append(as_dim(strides[i] * (d - 1) + opad[i] + (k - 1) * dil[i] + 1 - pads[i] - pads[i + n]))
    op.set(0, elem, out)


@register("MaxPool", "AveragePool", "LpPool")
def _pool(op: NodeInference) -> None:
    x = op.shape(0)
    elem = op.elem(0)
    if x is None:
        op.set(0, elem, None)
        if op.has_output(1):
            op.set(1, INT64, None)
        return
    out = [x[0], x[1]] + pool_spatial(op, x[2:])
    op.set(0, elem, out)
    if op.has_output(1):
        op.set(1, INT64, out)


@register("GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool")
def _global_pool(op: NodeInference) -> None:
    x = op.shape(0)
    op.set(0, op.elem(0), None if x is None else list(x[:2]) + [1] * (len(x) - 2))


@register("MaxRoiPool")
def _max_roi_pool(op: NodeInference) -> None:
    x, rois = op.shape(0), op.shape(1)
    pooled = op.ints_attr("pooled_shape") or []
    if x is None:
        op.set(0, op.elem(0), None)
        return
    op.set(0, op.elem(0), [rois[0] if rois is not None else None, x[1], *pooled])


@register("MaxUnpool")
def _max_unpool(op: NodeInference) -> None:
    x = op.shape(0)
    if op.has(2):
        target_shape = op.shape(2)
        op.set(0, op.elem(0), [None] * target_shape[0]
               if target_shape is not None and isinstance(target_shape[0], int) else None)
        target = op.ints(2)
        if target is not None:
            op.set(0, op.elem(0), target)
        return
    if x is None:
        op.set(0, op.elem(0), None)
        return
    n = len(x) - 2
    kernel = op.ints_attr("kernel_shape") or [1] * n
    strides = op.ints_attr("strides") or [1] * n
    pads = op.ints_attr("pads") or [0] * (2 * n)
    out = list(x[:2]) + [None if d is None else as_dim(strides[i] * (d - 1) + kernel[i] - pads[i] - pads[i + n])
                         for i, d in enumerate(x[2:])]
    op.set(0, op.elem(0), out)


@register("Col2Im")
def _col2im(op: NodeInference) -> None:
    x = op.shape(0)
    image = op.ints(1)
    block = op.ints(2)
    n: Dim = None
    for i in (1, 2):
        s = op.shape(i)
        if n is None and s is not None and len(s) == 1 and isinstance(s[0], int):
            n = s[0]
    for name, per in (("pads", 2), ("strides", 1), ("dilations", 1)):
        a = op.ints_attr(name)
        if n is None and a:
            n = len(a) // per
    if x is None or not isinstance(n, int):
        op.set(0, op.elem(0), None)
        return
    c: Dim = None
    if block is not None and x[1] is not None:
        c = as_dim(floordiv(x[1], math.prod(block))) if all(isinstance(b, int) for b in block) else None
    op.set(0, op.elem(0), [x[0], c, *(image if image is not None else [None] * n)])


@register("DepthToSpace", "SpaceToDepth")
def _depth_space(op: NodeInference) -> None:
    x = op.shape(0)
    b = op.int_attr("blocksize")
    if x is None or not b:
        op.set(0, op.elem(0), None if x is None else [None] * len(x))
        return
    if len(x) != 4:
        op.fail(f"input must be 4-D, got rank {len(x)}")
    n, c, h, w = x
    if op.node.op_type == "DepthToSpace":
        if isinstance(c, int) and c % (b * b):
            op.fail(f"channels {c} are not a multiple of blocksize**2 = {b * b}")
        out = [n, None if c is None else as_dim(floordiv(c, b * b)),
               None if h is None else as_dim(h * b), None if w is None else as_dim(w * b)]
    else:
        out = [n, None if c is None else as_dim(c * b * b),
               None if h is None else as_dim(floordiv(h, b)), None if w is None else as_dim(floordiv(w, b))]
    op.set(0, op.elem(0), out)


def _scaled(d: Dim, scale: Any) -> Dim:
    """``floor(d * scale)``: exact for numbers; on a symbol only for integral scales."""
    if d is None or scale is None or isinstance(scale, SymExpr):
        return None
    if isinstance(d, int):
        return math.floor(d * float(scale))
    f = float(scale)
    if f.is_integer():
        return as_dim(d * int(f))
    inv = 1.0 / f if f else 0.0
    if inv and inv.is_integer():
        return as_dim(floordiv(d, int(inv)))
    return None


def _float_list(op: NodeInference, i: int) -> list[Any] | None:
    v = op.value(i) if op.has(i) else None
    return None if v is None or len(v.shape) != 1 else v.flat()


@register("Resize", "Upsample")
def _resize(op: NodeInference) -> None:
    x = op.shape(0)
    elem = op.elem(0)
    r = op.rank(0)
    if op.node.op_type == "Upsample" or op.version < 11:
        scales = op.floats_attr("scales") if op.version < 9 else None
        scales = scales if scales is not None else _float_list(op, 1)
        sizes = None
        scale_input, size_input = 1, None
    else:
        scales, sizes = _float_list(op, 2), op.ints(3) if op.has(3) else None
        scale_input, size_input = 2, 3
    if r is None:
        for i in (scale_input, size_input):
            if i is not None and op.has(i):
                s = op.shape(i)
                if s is not None and len(s) == 1 and isinstance(s[0], int) and s[0] > 0:
                    r = s[0]
    if r is None:
        op.set(0, elem, None)
        return
    axes = op.ints_attr("axes")
    axes = list(range(r)) if axes is None else [op.norm_axis(a, r) for a in axes]
    dims: list[Dim] = list(x) if x is not None else [None] * r
    out: list[Dim] = list(dims)
    keep = op.attr("keep_aspect_ratio_policy", b"stretch")
    keep = keep.decode() if isinstance(keep, bytes) else str(keep)
    if sizes is not None and len(sizes) == len(axes):
        if keep != "stretch":
            if not all(isinstance(dims[a], int) and isinstance(s, int) for a, s in zip(axes, sizes)):
                op.set(0, elem, [d if i not in axes else None for i, d in enumerate(dims)])
                return
            ratios = [s / dims[a] for a, s in zip(axes, sizes)]
            scale = min(ratios) if keep == "not_larger" else max(ratios)
            for a in axes:
                out[a] = math.floor(dims[a] * scale + 0.5)
        else:
            for a, s in zip(axes, sizes):
                out[a] = s
    elif scales is not None and len(scales) == len(axes) and (size_input is None or not op.has(size_input)
                                                             or op.has(scale_input)):
        for a, factor in zip(axes, scales):
            out[a] = _scaled(dims[a], factor)
    else:
        for a in axes:
            out[a] = None
    op.set(0, elem, out)


@register("RoiAlign")
def _roi_align(op: NodeInference) -> None:
    x, rois = op.shape(0), op.shape(1)
    ni = op.shape(2)
    n = rois[0] if rois is not None else (ni[0] if ni is not None else None)
    op.set(0, op.elem(0), [n, x[1] if x is not None else None, op.int_attr("output_height", 1),
                           op.int_attr("output_width", 1)])


@register("NonMaxSuppression")
def _nms(op: NodeInference) -> None:
    op.set(0, INT64, [op.fresh("nms"), 3])


@register("GridSample")
def _grid_sample(op: NodeInference) -> None:
    x, g = op.shape(0), op.shape(1)
    r = _rank_from(op, 0, 1)
    if r is None:
        op.set(0, op.elem(0), None)
        return
    out: list[Dim] = [x[0] if x is not None else (g[0] if g is not None else None),
                      x[1] if x is not None else None]
    out += list(g[1:-1]) if g is not None else [None] * (r - 2)
    op.set(0, op.elem(0), out)


@register("AffineGrid")
def _affine_grid(op: NodeInference) -> None:
    size = op.ints(1)
    n = op.shape(1)
    if size is None:
        k = n[0] if n is not None and isinstance(n[0], int) else None
        op.set(0, op.elem(0), None if k is None else [None] * (k - 1) + [k - 2])
        return
    spatial = list(size[2:])
    op.set(0, op.elem(0), [size[0], *spatial, len(spatial)])


@register("CenterCropPad")
def _center_crop_pad(op: NodeInference) -> None:
    x = op.shape(0)
    r = op.rank(0)
    target = op.ints(1)
    if r is None:
        op.set(0, op.elem(0), None)
        return
    axes = op.ints_attr("axes")
    axes = list(range(r)) if axes is None else [op.norm_axis(a, r) for a in axes]
    out: list[Dim] = list(x) if x is not None else [None] * r
    for k, a in enumerate(axes):
        out[a] = target[k] if target is not None and k < len(target) else None
    op.set(0, op.elem(0), out)


@register("ImageDecoder")
def _image_decoder(op: NodeInference) -> None:
    fmt = op.attr("pixel_format", b"RGB")
    fmt = fmt.decode() if isinstance(fmt, bytes) else str(fmt)
    op.set(0, TensorProto.UINT8, [None, None, 1 if fmt == "Grayscale" else 3])


@register("CausalConvWithState")
def _causal_conv_with_state(op: NodeInference) -> None:
    x, w = op.shape(0), op.shape(1)
    elem = op.elem(0)
    op.same_as_input()
    if op.has_output(1):
        k = w[-1] if w is not None else None
        state = None
        if x is not None:
            state = list(x[:-1]) + [None if not isinstance(k, int) else k - 1]
        op.set(1, elem, state if not op.has(3) or op.shape(3) is None else op.shape(3))
