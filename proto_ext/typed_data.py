"""Serialized TensorProto bytes with a packed typed payload, decoded without a message.

Exporters that write ``float_data`` / ``int64_data`` instead of ``raw_data`` (Paddle's
``paddle2onnx`` among them) make every small constant a typed tensor. Building an
``onnx.TensorProto`` to read one costs more than the rest of its use; the common
layouts are read here straight from the bytes::

    decode_typed(make_tensor("w", FLOAT, [2], [1.0, 2.0]).SerializeToString())
    # array([1., 2.], dtype=float32)

Handled: ``dims``, ``data_type``, ``name``, ``doc_string`` and one packed payload
field matching the element type (FLOAT ``float_data``, DOUBLE ``double_data``, INT32
``int32_data``, INT64 ``int64_data``) or none for an empty tensor. Anything else
(other fields, unpacked or repeated payload chunks, a count that does not match
``dims``, malformed bytes) gives None, and the caller decodes with stock onnx, which
also reports what is wrong.
"""
from __future__ import annotations

import math
from typing import Any

from onnx import TensorProto

from onnxforge.proto_ext.errors import WireError
from onnxforge.proto_ext.wirescan import _varint

__all__ = ["decode_typed"]

# element type -> (payload field number, numpy dtype, fixed width in bytes or 0 for varints)
_LAYOUTS: dict[int, tuple[int, str, int]] = {
    TensorProto.FLOAT: (4, "<f4", 4),
    TensorProto.DOUBLE: (10, "<f8", 8),
    TensorProto.INT32: (5, "<i4", 0),
    TensorProto.INT64: (7, "<i8", 0),
}
_NAME, _DOC = 8, 12
_LEN, _VARINT = 2, 0
_SIGN = 1 << 63


def _signed(v: int) -> int:
    """A varint read as int64: its low 64 bits, two's complement (as protobuf reads it)."""
    v &= 0xFFFF_FFFF_FFFF_FFFF
    return v - (1 << 64) if v >= _SIGN else v


def decode_typed(data: bytes) -> Any | None:
    """The array of a typed TensorProto in one of the common layouts (read-only), else None."""
    try:
        return _decode(memoryview(data))
    except WireError:
        return None


def _decode(buf: memoryview) -> Any | None:
    import numpy as np

    pos, end = 0, len(buf)
    dims: list[int] = []
    dtype = 0
    payload: tuple[int, int, int] | None = None  # (field, start, length)
    while pos < end:
        key = buf[pos]  # the fields read here have one-byte keys
        pos += 1
        if key >= 0x80:
            return None
        field, wire = key >> 3, key & 7
        if field == 1 and wire == _VARINT:
            d, pos = _varint(buf, pos, end)
            dims.append(_signed(d))
        elif field == 1 and wire == _LEN:
            n, pos = _varint(buf, pos, end)
            stop = pos + n
            if stop > end:
                return None
            while pos < stop:
                d, pos = _varint(buf, pos, stop)
                dims.append(_signed(d))
        elif field == 2 and wire == _VARINT and pos < end and buf[pos] < 0x80:
            dtype = buf[pos]
            pos += 1
        elif wire == _LEN and field in (_NAME, _DOC, 4, 5, 7, 10):
            n, pos = _varint(buf, pos, end)
            if pos + n > end:
                return None
            if field not in (_NAME, _DOC):
                if payload is not None:
                    return None  # chunks to concatenate: the stock path
                payload = (field, pos, n)
            pos += n
        else:
            return None
    layout = _LAYOUTS.get(dtype)
    if layout is None or any(d < 0 for d in dims):
        return None
    number, np_type, width = layout
    count = math.prod(dims)
    if payload is None:
        if count:
            return None
        arr = np.zeros(dims, np_type)
    else:
        field, start, n = payload
        if field != number:
            return None
        if width:
            if n != count * width:
                return None
            arr = np.frombuffer(buf, np_type, count, start).reshape(dims)
        else:
            values: list[int] = []
            p, stop = start, start + n
            narrow = dtype == TensorProto.INT32  # int32 fields keep the low 32 bits, as protobuf does
            while p < stop:
                v, p = _varint(buf, p, stop)
                if narrow:
                    v &= 0xFFFFFFFF
                    values.append(v - (1 << 32) if v >= 1 << 31 else v)
                else:
                    values.append(_signed(v))
            if len(values) != count:
                return None
            arr = np.array(values, np_type).reshape(dims)
    arr.flags.writeable = False
    return arr
