"""Window geometry of the ONNX pooling operators: the output length and the effective
begin / end padding of each spatial axis from ``kernel_shape``, ``strides``,
``dilations``, ``pads``, ``auto_pad`` and ``ceil_mode``.

The rules are the operator specification's (the ones onnxruntime follows):

* ``NOTSET``: ``out = floor((in + pb + pe - ek) / s) + 1`` (``ceil`` with ``ceil_mode``),
  where ``ek = (k - 1) * d + 1``; with ``ceil_mode`` the last window must start inside the
  input or the begin padding, so a window starting at or past ``in + pb`` (padded
  coordinates) is dropped.
* ``VALID``: no padding, ``out = ceil((in - ek + 1) / s)`` (``ceil_mode`` does not apply).
* ``SAME_UPPER`` / ``SAME_LOWER``: ``out = ceil(in / s)``; the padding needed to reach it is
  split evenly, the odd unit at the end (UPPER) or at the beginning (LOWER).

A window of a ``ceil_mode`` output may reach past ``in + pe``; the taps there are outside
both the input and the padding (they count for nothing, not even as padding). Where the
formulas give no window (a kernel longer than the padded axis) the output axis is empty,
as in onnx.reference (onnxruntime's integer division rounds ``-0.5`` up to one window).
"""
from __future__ import annotations

from dataclasses import dataclass

from onnxforge.kernels_cy.ops.base import NodeSpec

__all__ = ["AUTO_PADS", "Axes", "Window", "window_from_spec"]

AUTO_PADS = frozenset({"NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"})


@dataclass(frozen=True, slots=True)
class Axes:
    """The resolved geometry of one input: per spatial axis its input and output length,
    begin / end padding, kernel, stride and dilation."""

    inp: tuple[int, ...]
    out: tuple[int, ...]
    pad_begin: tuple[int, ...]
    pad_end: tuple[int, ...]
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Window:
    """A pooling node's window attributes, validated at plan time."""

    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads: tuple[int, ...]  # 2n: the begin pads, then the end pads
    auto_pad: str
    ceil_mode: bool

    @property
    def rank(self) -> int:
        return len(self.kernel)

    def resolve(self, spatial: tuple[int, ...]) -> Axes:
        """The geometry for an input of spatial shape ``spatial`` (an axis where no window
        fits has output length 0)."""
        n = self.rank
        if len(spatial) != n:
            raise ValueError(f"the input has {len(spatial)} spatial axes, kernel_shape {list(self.kernel)} has {n}")
        out, pb_all, pe_all = [], [], []
        for a in range(n):
            size, k, s, d = spatial[a], self.kernel[a], self.strides[a], self.dilations[a]
            ek = (k - 1) * d + 1
            if self.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
                o = -(-size // s)
                total = max((o - 1) * s + ek - size, 0)
                pb = total // 2 if self.auto_pad == "SAME_UPPER" else total - total // 2
                pe = total - pb
            elif self.auto_pad == "VALID":
                pb = pe = 0
                o = -(-(size - ek + 1) // s)
            else:
                pb, pe = self.pads[a], self.pads[a + n]
                span = size + pb + pe - ek  # may be negative: a kernel longer than the padded axis
                if self.ceil_mode:
                    o = -(-span // s) + 1
                    if (o - 1) * s >= size + pb:  # the last window would start in the end padding
                        o -= 1
                else:
                    o = span // s + 1
            out.append(max(o, 0))  # no window at all: an empty output, as the formulas give
            pb_all.append(pb)
            pe_all.append(pe)
        return Axes(tuple(spatial), tuple(out), tuple(pb_all), tuple(pe_all), self.kernel, self.strides,
                    self.dilations)


def _positive(spec: NodeSpec, name: str, values: list[int] | None, n: int, default: int) -> tuple[int, ...]:
    if values is None:
        return (default,) * n
    if len(values) != n:
        raise spec.fail(f"{name} {values} must have {n} values, one per kernel axis")
    if any(v < 1 for v in values):
        raise spec.fail(f"{name} {values} must be positive")
    return tuple(values)


def window_from_spec(spec: NodeSpec, *, dilations: bool = True, ceil_mode: bool = True) -> Window:
    """Read and check a pooling node's window attributes (``dilations`` / ``ceil_mode``:
    whether the operator version has them; an attribute it lacks is taken as absent)."""
    kernel = spec.ints("kernel_shape")
    if not kernel:
        raise spec.fail("attribute 'kernel_shape' is required")
    n = len(kernel)
    if any(k < 1 for k in kernel):
        raise spec.fail(f"kernel_shape {kernel} must be positive")
    strides = _positive(spec, "strides", spec.ints("strides"), n, 1)
    dil = _positive(spec, "dilations", spec.ints("dilations") if dilations else None, n, 1)
    auto_pad = spec.choice("auto_pad", "NOTSET", AUTO_PADS)
    pads = spec.ints("pads")
    if pads is None:
        pads = [0] * (2 * n)
    if len(pads) != 2 * n:
        raise spec.fail(f"pads {pads} must have {2 * n} values (begin and end of each kernel axis)")
    if any(p < 0 for p in pads):
        raise spec.fail(f"pads {pads} must not be negative")
    if auto_pad != "NOTSET" and any(pads):
        raise spec.fail(f"pads {pads} cannot be given with auto_pad={auto_pad}")
    ceil = bool(spec.choice("ceil_mode", 0, {0, 1})) if ceil_mode else False
    return Window(tuple(kernel), strides, dil, tuple(pads), auto_pad, ceil)
