"""numpy dtypes of ``TensorProto`` element types, and back.

One table for every layer: the codecs read payloads with it, and the IR
(``graphbuilder``) may import it, since the wire layer imports nothing above
itself. The low-bit and float8 types map to their ``ml_dtypes`` types (one
element per byte in memory); STRING and UNDEFINED have no numpy dtype.

    np_dtype(TensorProto.BFLOAT16)      # dtype(bfloat16)
    onnx_dtype(np.int8)                 # TensorProto.INT8 == 3
"""
from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import ml_dtypes
import numpy as np
from onnx import TensorProto

from onnxforge.proto_ext.errors import CodecError

__all__ = ["NUMPY_DTYPES", "np_dtype", "onnx_dtype"]


def _table() -> dict[int, np.dtype]:
    table: dict[int, Any] = {
        TensorProto.FLOAT: np.float32, TensorProto.DOUBLE: np.float64, TensorProto.FLOAT16: np.float16,
        TensorProto.INT8: np.int8, TensorProto.UINT8: np.uint8, TensorProto.INT16: np.int16,
        TensorProto.UINT16: np.uint16, TensorProto.INT32: np.int32, TensorProto.UINT32: np.uint32,
        TensorProto.INT64: np.int64, TensorProto.UINT64: np.uint64, TensorProto.BOOL: np.bool_,
        TensorProto.COMPLEX64: np.complex64, TensorProto.COMPLEX128: np.complex128,
        TensorProto.BFLOAT16: ml_dtypes.bfloat16, TensorProto.FLOAT8E4M3FN: ml_dtypes.float8_e4m3fn,
        TensorProto.FLOAT8E4M3FNUZ: ml_dtypes.float8_e4m3fnuz, TensorProto.FLOAT8E5M2: ml_dtypes.float8_e5m2,
        TensorProto.FLOAT8E5M2FNUZ: ml_dtypes.float8_e5m2fnuz, TensorProto.INT4: ml_dtypes.int4,
        TensorProto.UINT4: ml_dtypes.uint4,
    }
    # types that only newer ml_dtypes releases provide
    for code, name in ((TensorProto.INT2, "int2"), (TensorProto.UINT2, "uint2"),
                       (TensorProto.FLOAT4E2M1, "float4_e2m1fn"),
                       (TensorProto.FLOAT8E8M0, "float8_e8m0fnu")):
        if hasattr(ml_dtypes, name):
            table[code] = getattr(ml_dtypes, name)
    return {code: np.dtype(t) for code, t in table.items()}


NUMPY_DTYPES: Mapping[int, np.dtype] = MappingProxyType(_table())
"""TensorProto element type -> numpy dtype, for every type numpy (with ml_dtypes) can hold."""

_ELEM_TYPES: dict[np.dtype, int] = {dt: code for code, dt in NUMPY_DTYPES.items()}


def np_dtype(code: int) -> np.dtype:
    """numpy dtype of a TensorProto element type (ml_dtypes for the low-bit ones)."""
    try:
        return NUMPY_DTYPES[code]
    except KeyError:
        raise CodecError(f"no numpy dtype for TensorProto element type {code}") from None


def onnx_dtype(dtype: Any) -> int:
    """TensorProto element type of a numpy dtype (or anything ``numpy.dtype`` accepts)."""
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise CodecError(f"{dtype!r} is not a numpy dtype") from None
    try:
        return _ELEM_TYPES[dt]
    except KeyError:
        raise CodecError(f"no TensorProto element type for numpy dtype {dt}") from None
