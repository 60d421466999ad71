"""Generic field access over byte-encoded struct records.

``read_fields(payload, layout)`` turns a payload of R records into one numpy
array per leaf, shaped as DESIGN.md's decoder signature prescribes: a
non-constant leaf gets a leading record axis (``array(INT4, 32)`` -> int8
``[R, 32]`` sign-extended; a bit-packing component -> the smallest unsigned type
holding its width ``[R, n]``; ``tensor(FLOAT, [])`` -> float ``[R]``); a
constant leaf is its declared tensor without a record axis. Fields may start at
any bit offset; multi-byte values are little-endian, bits least-significant
first. Byte-aligned leaves are zero-copy strided views of the payload.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
from onnx import TensorProto

from onnxforge.proto_ext.codecs.bits import read_bitfield_array, read_bitfields_at
from onnxforge.proto_ext.dtypes import np_dtype
from onnxforge.proto_ext.sizes import LeafLayout, RecordLayout, record_count

__all__ = ["read_fields", "records_array"]

_SIGNED_SUBBYTE = frozenset({TensorProto.INT4, TensorProto.INT2})
_UNSIGNED_SUBBYTE = frozenset({TensorProto.UINT4, TensorProto.UINT2})
_UINT_FOR_BYTES = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def records_array(payload: Any, element_bytes: int, path: str = "payload") -> np.ndarray:
    """The payload as a read-only uint8 array ``[R, element_bytes]`` (zero copy)."""
    buf = payload if isinstance(payload, np.ndarray) else np.frombuffer(payload, dtype=np.uint8)
    if buf.dtype != np.uint8:
        buf = buf.view(np.uint8)
    n = record_count(int(buf.size), element_bytes, path)
    return buf.reshape(n, element_bytes)


def _leaf_positions(leaf: LeafLayout) -> np.ndarray:
    """Bit offsets of every element of one record's leaf, in row-major order of ``shape``."""
    offsets = np.array([leaf.bit_offset], dtype=np.int64)
    for n, stride in zip(leaf.shape, leaf.strides_bits):
        offsets = (offsets[:, None] + np.arange(n, dtype=np.int64)[None, :] * stride).reshape(-1)
    return offsets


def _aligned_view(flat: np.ndarray, element_bytes: int, R: int, leaf: LeafLayout,
                  dtype: np.dtype) -> np.ndarray | None:
    """Zero-copy strided view when every element starts on a byte boundary."""
    width = leaf.bit_width
    if width % 8 or leaf.bit_offset % 8 or any(s % 8 for s in leaf.strides_bits):
        return None
    if dtype.itemsize * 8 != width or R == 0:
        return None
    strides = (element_bytes,) + tuple(s // 8 for s in leaf.strides_bits)
    view = np.ndarray(shape=(R, *leaf.shape), dtype=dtype.newbyteorder("<"), buffer=flat,
                      offset=leaf.bit_offset // 8, strides=strides)
    view.flags.writeable = False
    return view


def _read_leaf(flat: np.ndarray, records: np.ndarray, leaf: LeafLayout) -> np.ndarray:
    R = records.shape[0]
    if leaf.kind == "bitfield":  # elem_type: the smallest unsigned type holding bit_width
        return _gather_bits(records, leaf).astype(np_dtype(leaf.elem_type)).reshape(R, *leaf.shape)
    et = leaf.elem_type
    if et in _SIGNED_SUBBYTE or et in _UNSIGNED_SUBBYTE:
        raw = _gather_bits(records, leaf).astype(np.int16)
        if et in _SIGNED_SUBBYTE:
            w = leaf.bit_width
            raw = np.where(raw >= (1 << (w - 1)), raw - (1 << w), raw)
            return raw.astype(np.int8).reshape(R, *leaf.shape)
        return raw.astype(np.uint8).reshape(R, *leaf.shape)
    dtype = np_dtype(et)
    view = _aligned_view(flat, records.shape[1], R, leaf, dtype)
    if view is not None:
        return view
    bits = _gather_bits(records, leaf)
    ubytes = dtype.itemsize
    return bits.astype(_UINT_FOR_BYTES[ubytes]).view(dtype).reshape(R, *leaf.shape)


def _gather_bits(records: np.ndarray, leaf: LeafLayout) -> np.ndarray:
    """uint64 ``[R, count]`` of every element's bits (any offset, any stride)."""
    if leaf.count == 0:
        return np.zeros((records.shape[0], 0), dtype=np.uint64)
    shape_strides = leaf.strides_bits
    contiguous = all(
        s == leaf.bit_width * math.prod(leaf.shape[i + 1:]) for i, s in enumerate(shape_strides))
    if contiguous:
        return read_bitfield_array(records, leaf.bit_offset, leaf.bit_width, leaf.count)
    return read_bitfields_at(records, _leaf_positions(leaf), leaf.bit_width)


def read_fields(payload: Any, layout: RecordLayout, path: str = "payload") -> dict[str, np.ndarray]:
    """Every leaf of every record: ``{dotted path: array}`` in declaration order."""
    records = records_array(payload, layout.bytes, path)
    flat = records.reshape(-1)
    out: dict[str, np.ndarray] = {}
    for leaf in layout.leaves:
        if leaf.kind == "constant":
            out[leaf.path] = leaf.constant.array(f"{path}: constant field {leaf.path!r}")
        else:
            out[leaf.path] = _read_leaf(flat, records, leaf)
    return out
