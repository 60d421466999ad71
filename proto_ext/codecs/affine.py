"""The affine codec: packed integer codes <-> float tensors.

Decoding and encoding reproduce ``DequantizeLinear`` / ``QuantizeLinear``
(opset 21 and later, including blocked quantization) as ``onnx.reference``
computes them, bit for bit::

    decode:  y = ((float32(code) - zero_point) * scale)  cast to the output type
    encode:  code = saturate(round_half_to_even(x / scale) + zero_point)

The float32 subtraction and the product are evaluated in numpy's promotion of
float32 with the scale's type (float32 for float16 / bfloat16 / float32 scales,
float64 for float64 scales) and then cast; the division of ``encode`` is
evaluated in numpy's promotion of the input's and the scale's types.

Three layouts select which scale (and zero point) applies to an element at
index ``i`` of a tensor of shape ``D``:

- per-tensor: ``axis=None``; ``scale`` is a scalar (rank 0).
- per-axis: ``axis`` set; ``scale`` is 1-D of length ``D[axis]``, indexed by ``i[axis]``.
- blocked: ``axis`` and ``block_size`` set; ``scale`` has the dims of ``D``
  except ``ceil(D[axis] / block_size)`` at ``axis``, and is indexed by ``i``
  with ``i[axis] // block_size`` at ``axis``. The last block may be partial.

A zero point, when given, has the scale's shape and holds integers inside the
storage type's range; without one the zero point is 0. Payloads are packed
least-significant bits first (:mod:`.bits`), with zero padding bits (rule R9).

Where the reference's integer conversion is undefined (infinite inputs, or
``|x / scale| >= 2**31``) encoding saturates to the nearer end of the range.

The module builds and parses no protobuf messages: storage types are plain
``TensorProto.DataType`` integer codes (the ``onnx.TensorProto`` constants).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Optional

import ml_dtypes
import numpy as np
from onnx import TensorProto

from onnxforge.proto_ext.errors import CodecError
from onnxforge.proto_ext.dtypes import np_dtype
from onnxforge.proto_ext.types import FLOAT_TYPES

from .bits import ML_INT_DTYPES, BufferLike, check_padding_zero, pack_codes, unpack_codes

__all__ = [
    "STORAGE_BITS",
    "affine_decode",
    "affine_encode",
    "affine_payload_nbytes",
    "choose_affine_params",
    "dequantize_codes",
    "quantize_codes",
    "storage_range",
]

STORAGE_BITS: dict[int, int] = {
    TensorProto.INT8: 8,
    TensorProto.UINT8: 8,
    TensorProto.INT4: 4,
    TensorProto.UINT4: 4,
    TensorProto.INT2: 2,
    TensorProto.UINT2: 2,
}
"""Bits per code of every affine storage type (TensorProto.DataType codes)."""

_SIGNED: frozenset[int] = frozenset({TensorProto.INT8, TensorProto.INT4, TensorProto.INT2})

_FLOAT_DTYPES: frozenset[np.dtype] = frozenset(np_dtype(t) for t in FLOAT_TYPES)

# Rounded quotients are clamped to this magnitude before the integer conversion:
# far outside every storage range (and every zero point), exact in every float type.
_QUOTIENT_CLAMP = 1024.0

_TYPE_NAMES: dict[int, str] = {t: TensorProto.DataType.Name(t) for t in STORAGE_BITS}


def _storage_bits(storage_type: int) -> int:
    bits = STORAGE_BITS.get(storage_type) if isinstance(storage_type, (int, np.integer)) else None
    if bits is None or isinstance(storage_type, bool):
        allowed = ", ".join(f"{name}={code}" for code, name in _TYPE_NAMES.items())
        raise CodecError(f"storage_type={storage_type!r} is not an affine storage type ({allowed})")
    return bits


def storage_range(storage_type: int) -> tuple[int, int]:
    """Smallest and largest code of ``storage_type``: e.g. INT4 -> (-8, 7), UINT2 -> (0, 3)."""
    bits = _storage_bits(storage_type)
    if int(storage_type) in _SIGNED:
        return -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return 0, (1 << bits) - 1


def affine_payload_nbytes(storage_type: int, shape: tuple[int, ...]) -> int:
    """Payload bytes of a tensor of ``shape``: ``ceil(product(shape) * bits / 8)`` (rule A8)."""
    return (_numel(shape) * _storage_bits(storage_type) + 7) // 8


def _code_dtype(storage_type: int) -> np.dtype:
    return np.dtype(np.int8) if int(storage_type) in _SIGNED else np.dtype(np.uint8)


def _numel(shape: tuple[int, ...]) -> int:
    try:
        dims = tuple(shape)
    except TypeError as exc:
        raise CodecError(f"shape={shape!r} is not a sequence of dimensions") from exc
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 0:
            raise CodecError(f"shape={dims!r}: every dimension must be an integer >= 0")
    return math.prod(int(d) for d in dims)


def _float_array(value: Any, what: str) -> np.ndarray:
    arr = np.asarray(value)
    if arr.dtype not in _FLOAT_DTYPES:
        raise CodecError(f"{what} must be float16, bfloat16, float32 or float64, got dtype {arr.dtype}")
    return arr


def _integers(value: Any, what: str) -> np.ndarray:
    """``value`` as a numpy integer array (ml_dtypes int2/uint2/int4/uint4 widened)."""
    arr = np.asarray(value)
    if arr.dtype in ML_INT_DTYPES:
        return arr.astype(np.int16)
    if arr.dtype.kind not in "iu":
        raise CodecError(f"{what}, got dtype {arr.dtype}")
    return arr


def _check_in_range(values: np.ndarray, storage_type: int, what: str) -> None:
    lo, hi = storage_range(storage_type)
    if values.size and (int(values.min()) < lo or int(values.max()) > hi):
        raise CodecError(
            f"{what} lie in [{int(values.min())}, {int(values.max())}], outside the "
            f"{_TYPE_NAMES[int(storage_type)]} range [{lo}, {hi}]"
        )


def _resolve_layout(
    shape: tuple[int, ...], axis: Optional[int], block_size: Optional[int]
) -> tuple[Optional[int], Optional[int], tuple[int, ...]]:
    """Validate ``axis`` / ``block_size`` for ``shape``; return them normalized with the parameter shape."""
    if block_size is not None:
        if isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer)) or block_size < 1:
            raise CodecError(f"block_size={block_size!r} must be an integer >= 1")
        if axis is None:
            raise CodecError(f"block_size={block_size} needs an axis (blocked quantization)")
    if axis is None:
        return None, None, ()
    rank = len(shape)
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise CodecError(f"axis={axis!r} is not an integer")
    if not -rank <= axis < rank:
        raise CodecError(f"axis={axis} is out of range for a tensor of rank {rank} (shape {tuple(shape)})")
    a = int(axis) % rank
    if block_size is None:
        return a, None, (shape[a],)
    dims = list(shape)
    dims[a] = -(-dims[a] // int(block_size))
    return a, int(block_size), tuple(dims)


class _Layout:
    """Validated quantization parameters of one tensor, with the axis normalized."""

    __slots__ = ("shape", "storage_type", "scale", "zero_point", "axis", "block_size", "param_shape")

    def __init__(
        self,
        shape: tuple[int, ...],
        storage_type: int,
        scale: Any,
        zero_point: Any,
        axis: Optional[int],
        block_size: Optional[int],
    ) -> None:
        _storage_bits(storage_type)
        _numel(shape)
        self.shape: tuple[int, ...] = tuple(int(d) for d in shape)
        self.storage_type = int(storage_type)
        self.axis, self.block_size, self.param_shape = _resolve_layout(self.shape, axis, block_size)
        self.scale = _float_array(scale, "scale")
        if self.scale.shape != self.param_shape:
            raise CodecError(f"scale has shape {self.scale.shape}, expected {self.param_shape} ({self._mode()})")
        self.zero_point = None if zero_point is None else self._check_zero_point(zero_point, self.param_shape)

    def _mode(self) -> str:
        if self.axis is None:
            return "per-tensor: a scalar"
        if self.block_size is None:
            return f"per-axis on axis {self.axis}: 1-D of length shape[{self.axis}]"
        return f"blocked on axis {self.axis} with block_size {self.block_size}"

    def _check_zero_point(self, zero_point: Any, expected: tuple[int, ...]) -> np.ndarray:
        zp = _integers(zero_point, "zero_point must hold integers")
        if zp.shape != expected:
            raise CodecError(f"zero_point has shape {zp.shape}, expected the scale's shape {expected}")
        _check_in_range(zp, self.storage_type, "zero_point values")
        return zp.astype(np.int32)

    def segments(self) -> list[tuple[tuple[Any, ...], tuple[int, ...], list[np.ndarray]]]:
        """Pieces of the tensor that broadcast against views of the parameters.

        Each item is ``(index, shape, params)``: ``data[index].reshape(shape)``
        broadcasts against every array in ``params`` (scale, then zero point if
        any), element for element as the layout prescribes. Nothing is repeated
        to the tensor's size.
        """
        params = [self.scale] + ([] if self.zero_point is None else [self.zero_point])
        whole: tuple[Any, ...] = (Ellipsis,)  # a view even of a rank-0 array
        if self.axis is None:
            return [(whole, self.shape, params)]
        a, dims = self.axis, self.shape
        if self.block_size is None:
            bshape = (1,) * a + (dims[a],) + (1,) * (len(dims) - a - 1)
            return [(whole, dims, [p.reshape(bshape) for p in params])]
        bs = self.block_size
        full, tail = divmod(dims[a], bs)
        pieces: list[tuple[tuple[Any, ...], tuple[int, ...], list[np.ndarray]]] = []
        head = (slice(None),) * a
        if full:
            shape = dims[:a] + (full, bs) + dims[a + 1 :]
            views = [p[head + (slice(0, full),)].reshape(dims[:a] + (full, 1) + dims[a + 1 :]) for p in params]
            pieces.append((head + (slice(0, full * bs),), shape, views))
        if tail:
            shape = dims[:a] + (tail,) + dims[a + 1 :]
            views = [p[head + (slice(full, full + 1),)] for p in params]
            pieces.append((head + (slice(full * bs, dims[a]),), shape, views))
        return pieces


def _out_dtype(out_dtype: Any, scale: np.ndarray) -> np.dtype:
    if out_dtype is None:
        return scale.dtype
    try:
        dt = np.dtype(out_dtype)
    except TypeError as exc:
        raise CodecError(f"out_dtype={out_dtype!r} is not a numpy dtype") from exc
    if dt not in _FLOAT_DTYPES:
        raise CodecError(f"out_dtype must be float16, bfloat16, float32 or float64, got {dt}")
    return dt


def _assemble(layout: _Layout, dtype: np.dtype,
              compute: Callable[[tuple[Any, ...], tuple[int, ...], list[np.ndarray]], np.ndarray]
              ) -> np.ndarray:
    """The tensor whose segment ``index`` (see :meth:`_Layout.segments`) is
    ``compute(index, shape, params)`` cast to ``dtype``."""
    segments = layout.segments()
    if len(segments) == 1:  # the whole tensor: no staging copy
        index, shape, params = segments[0]
        return compute(index, shape, params).astype(dtype, copy=False).reshape(layout.shape)
    out = np.empty(layout.shape, dtype=dtype)
    for index, shape, params in segments:
        out[index] = compute(index, shape, params).astype(dtype, copy=False).reshape(out[index].shape)
    return out


def _dequantize(codes: np.ndarray, layout: _Layout, out_dtype: np.dtype) -> np.ndarray:
    # onnx.reference: (x.astype(float32) - zero_point) * scale, then cast.
    work = np.result_type(np.float32, layout.scale.dtype)

    def segment(index: tuple[Any, ...], shape: tuple[int, ...], params: list[np.ndarray]) -> np.ndarray:
        y = codes[index].reshape(shape).astype(work)
        if len(params) > 1:
            y -= params[1].astype(work)
        y *= params[0]
        return y

    return _assemble(layout, out_dtype, segment)


def dequantize_codes(
    codes: np.ndarray,
    storage_type: int,
    scale: np.ndarray,
    zero_point: Optional[np.ndarray] = None,
    axis: Optional[int] = None,
    block_size: Optional[int] = None,
    out_dtype: Any = None,
) -> np.ndarray:
    """Dequantize unpacked integer ``codes`` (the tensor's shape) like DequantizeLinear.

    Codes must be integers inside ``storage_range(storage_type)``. The result
    has ``codes.shape`` and ``out_dtype`` (default: the scale's dtype).
    """
    arr = _integers(codes, "codes must be integers")
    layout = _Layout(arr.shape, storage_type, scale, zero_point, axis, block_size)
    _check_in_range(arr, layout.storage_type, "codes")
    return _dequantize(arr, layout, _out_dtype(out_dtype, layout.scale))


def affine_decode(
    payload: BufferLike,
    storage_type: int,
    shape: tuple[int, ...],
    scale: np.ndarray,
    zero_point: Optional[np.ndarray] = None,
    axis: Optional[int] = None,
    block_size: Optional[int] = None,
    out_dtype: Any = None,
) -> np.ndarray:
    """Decode a packed affine payload into a float tensor of ``shape``.

    ``payload`` holds exactly ``ceil(product(shape) * bits / 8)`` bytes of
    packed codes (bytes, memoryview or a uint8 array); its padding bits must
    be zero (R9). The result's dtype is ``out_dtype`` or else the scale's dtype.
    Raises CodecError for a wrong payload length, nonzero padding, or scale /
    zero point shapes that do not match the layout.

    >>> affine_decode(b"\\xe1\\x83\\x07", TensorProto.INT4, (5,), np.float32(0.5))
    array([ 0.5, -1. ,  1.5, -4. ,  3.5], dtype=float32)
    """
    layout = _Layout(shape, storage_type, scale, zero_point, axis, block_size)
    dtype = _out_dtype(out_dtype, layout.scale)
    bits = STORAGE_BITS[layout.storage_type]
    count = _numel(layout.shape)
    expected = (count * bits + 7) // 8
    if isinstance(payload, np.ndarray):
        actual = payload.nbytes
    else:
        try:
            actual = memoryview(payload).nbytes
        except TypeError as exc:
            raise CodecError(
                f"affine payload must be bytes, memoryview or a uint8 array, got {type(payload).__name__}"
            ) from exc
    if actual != expected:
        raise CodecError(
            f"affine payload holds {actual} bytes; {count} {_TYPE_NAMES[layout.storage_type]} "
            f"codes of shape {layout.shape} need exactly {expected}"
        )
    check_padding_zero(payload, bits, count)
    codes = unpack_codes(payload, bits, count, layout.storage_type in _SIGNED).reshape(layout.shape)
    return _dequantize(codes, layout, dtype)


def quantize_codes(
    x: np.ndarray,
    storage_type: int,
    scale: np.ndarray,
    zero_point: Optional[np.ndarray] = None,
    axis: Optional[int] = None,
    block_size: Optional[int] = None,
) -> np.ndarray:
    """Quantize float ``x`` to integer codes like QuantizeLinear (saturating).

    ``code = clip(round_half_to_even(x / scale) + zero_point, lo, hi)`` with
    ``(lo, hi) = storage_range(storage_type)``; returns int8 codes for signed
    storage types, uint8 for unsigned ones, with ``x.shape``. Infinities
    saturate to ``lo`` or ``hi`` (the reference implementation's integer
    conversion is undefined there); NaN inputs and zero or non-finite scales
    raise CodecError.
    """
    arr = _float_array(x, "x")
    layout = _Layout(arr.shape, storage_type, scale, zero_point, axis, block_size)
    if layout.scale.size and not (np.all(np.isfinite(layout.scale)) and np.all(layout.scale != 0)):
        raise CodecError("scale must be finite and nonzero to quantize")
    if arr.size and np.isnan(arr).any():
        raise CodecError(f"x holds {int(np.isnan(arr).sum())} NaN value(s), which have no code")
    lo, hi = storage_range(layout.storage_type)

    def segment(index: tuple[Any, ...], shape: tuple[int, ...], params: list[np.ndarray]) -> np.ndarray:
        q = np.asarray(np.rint(arr[index].reshape(shape) / params[0]))
        np.clip(q, -_QUOTIENT_CLAMP, _QUOTIENT_CLAMP, out=q)
        codes = q.astype(np.int32)
        if len(params) > 1:
            codes += params[1]
        np.clip(codes, lo, hi, out=codes)
        return codes

    return _assemble(layout, _code_dtype(layout.storage_type), segment)


def affine_encode(
    x: np.ndarray,
    storage_type: int,
    scale: np.ndarray,
    zero_point: Optional[np.ndarray] = None,
    axis: Optional[int] = None,
    block_size: Optional[int] = None,
) -> bytes:
    """Quantize ``x`` (see :func:`quantize_codes`) and pack the codes row-major.

    Returns ``ceil(x.size * bits / 8)`` bytes with zero padding bits, the same
    bytes ``onnx.numpy_helper.from_array`` stores in ``raw_data`` for
    QuantizeLinear's output.
    """
    codes = quantize_codes(x, storage_type, scale, zero_point, axis, block_size)
    return pack_codes(codes, STORAGE_BITS[int(storage_type)])


def choose_affine_params(
    x: np.ndarray,
    storage_type: int,
    axis: Optional[int] = None,
    block_size: Optional[int] = None,
    symmetric: bool = True,
) -> tuple[np.ndarray, Optional[np.ndarray]]:
    """Min/max scale and zero point for encoding ``x`` in ``storage_type``.

    Statistics are taken per group: the whole tensor (``axis=None``), each
    index along ``axis``, or each block of ``block_size`` along ``axis``.
    With ``(lo, hi) = storage_range(storage_type)``:

    - symmetric, signed storage: ``scale = max|x| / hi``, no zero point
      (``max|x| / 127`` for INT8, ``/ 7`` for INT4, ``/ 1`` for INT2);
    - symmetric, unsigned storage: ``zero_point = (hi + 1) // 2`` and
      ``scale = max|x| / (hi - zero_point)`` (128 and ``/ 127`` for UINT8);
    - asymmetric: ``m = min(x.min(), 0)``, ``M = max(x.max(), 0)``,
      ``scale = (M - m) / (hi - lo)``,
      ``zero_point = clip(round_half_to_even(lo - m / scale), lo, hi)``, with
      the scale already rounded to ``x``'s dtype.

    A group whose range is zero gets ``scale = 1``; a scale below the smallest
    normal number of ``x``'s dtype is raised to it. Statistics are computed
    in float64; the scale is returned in ``x``'s dtype, the zero point as int8
    (signed storage) or uint8 (unsigned storage), both shaped as the layout
    requires (:func:`affine_encode` accepts them directly).
    """
    arr = _float_array(x, "x")
    if arr.size and not np.isfinite(arr).all():
        raise CodecError("x holds NaN or infinite values; no finite scale covers them")
    _storage_bits(storage_type)
    norm_axis, norm_block, pshape = _resolve_layout(arr.shape, axis, block_size)
    lo, hi = storage_range(storage_type)
    data = arr.astype(np.float64)
    if data.size == 0:
        gmin = np.zeros(pshape)
        gmax = np.zeros(pshape)
    else:
        gmin = _group_reduce(np.minimum, data, norm_axis, norm_block)
        gmax = _group_reduce(np.maximum, data, norm_axis, norm_block)
    signed = int(storage_type) in _SIGNED
    zp_val: Optional[np.ndarray] = None
    if symmetric:
        amax = np.maximum(np.abs(gmin), np.abs(gmax))
        if signed:
            scale64 = amax / hi
        else:
            mid = (hi + 1) // 2
            zp_val = np.full(pshape, float(mid))
            scale64 = amax / (hi - mid)
    else:
        low = np.minimum(gmin, 0.0)
        scale64 = (np.maximum(gmax, 0.0) - low) / (hi - lo)
    # A zero range gets scale 1; a scale below the dtype's smallest normal is raised
    # to it (quotients then only shrink, so nothing saturates).
    scale64 = np.where(scale64 > 0, scale64, 1.0)
    scale64 = np.maximum(scale64, float(ml_dtypes.finfo(arr.dtype).tiny))
    scale = np.asarray(scale64.astype(arr.dtype)).reshape(pshape)
    if not symmetric:
        zp_val = np.clip(np.rint(lo - low / scale.astype(np.float64)), lo, hi)
    if zp_val is None:
        return scale, None
    return scale, np.asarray(zp_val.astype(_code_dtype(storage_type))).reshape(pshape)


def _group_reduce(op: np.ufunc, data: np.ndarray, axis: Optional[int], block_size: Optional[int]) -> np.ndarray:
    """Reduce ``data`` (non-empty) over each quantization group of the layout."""
    if axis is None:
        return op.reduce(data, axis=None)
    if block_size is None:
        others = tuple(i for i in range(data.ndim) if i != axis)
        return op.reduce(data, axis=others)
    starts = np.arange(0, data.shape[axis], block_size)
    return op.reduceat(data, starts, axis=axis)
