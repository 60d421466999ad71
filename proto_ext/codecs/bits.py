"""Low-bit packing of integer codes and little-endian bit-field reads.

Packing follows ``TensorProto.raw_data`` for sub-byte element types: codes are
laid out consecutively, least-significant bits first, so code ``i`` of width
``b`` occupies bits ``[i*b, (i+1)*b)`` of the little-endian bit string, and the
unused high bits of the last byte are zero (rule R9)::

    pack_codes(np.array([1, -2, 3, -8, 7]), 4)          == b"\\xe1\\x83\\x07"
    pack_codes(np.array([0, 1, 2, 3, 3, 2, 1, 0]), 2)   == b"\\xe4\\x1b"

Every routine is vectorized with numpy; Python loops run over bit positions
within a byte or a group of bytes (at most 9 iterations), never over elements.
"""
from __future__ import annotations

from typing import Any, Union

import ml_dtypes
import numpy as np

from onnxforge.proto_ext.errors import CodecError

__all__ = [
    "BufferLike",
    "ML_INT_DTYPES",
    "check_padding_zero",
    "packed_nbytes",
    "pack_codes",
    "read_bitfield",
    "read_bitfield_array",
    "read_bitfields_at",
    "unpack_codes",
]

BufferLike = Union[bytes, bytearray, memoryview, np.ndarray]
"""Anything holding packed bytes: a bytes-like object or a uint8 numpy array."""

ML_INT_DTYPES: dict[np.dtype, np.dtype] = {
    np.dtype(ml_dtypes.int2): np.dtype(np.int8),
    np.dtype(ml_dtypes.uint2): np.dtype(np.uint8),
    np.dtype(ml_dtypes.int4): np.dtype(np.int8),
    np.dtype(ml_dtypes.uint4): np.dtype(np.uint8),
}
"""ml_dtypes' narrow integer types (one element per byte; they count as integer codes),
each with the numpy integer type that holds its values."""


def _check_bits(bits: int) -> int:
    if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)) or not 1 <= int(bits) <= 8:
        raise CodecError(f"code width bits={bits!r} is not an integer in 1..8")
    return int(bits)


def _check_count(count: int) -> int:
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or int(count) < 0:
        raise CodecError(f"code count={count!r} is not a non-negative integer")
    return int(count)


def packed_nbytes(count: int, bits: int) -> int:
    """Bytes that ``count`` codes of ``bits`` bits occupy: ``ceil(count * bits / 8)``."""
    return (_check_count(count) * _check_bits(bits) + 7) // 8


def _byte_view(buf: BufferLike, needed: int, what: str) -> np.ndarray:
    """A 1-D uint8 view of the first ``needed`` bytes of ``buf`` (read-only if ``buf`` is).

    Nothing is copied unless ``buf`` is a non-contiguous numpy array.
    """
    if isinstance(buf, np.ndarray):
        if buf.dtype != np.uint8:
            raise CodecError(f"{what}: a numpy buffer must have dtype uint8, got {buf.dtype}")
        flat = buf.reshape(-1)
        if flat.size < needed:
            raise CodecError(f"{what}: buffer holds {flat.size} bytes, at least {needed} are needed")
        return flat[:needed]
    try:
        view = memoryview(buf)
    except TypeError as exc:
        raise CodecError(f"{what}: expected bytes, memoryview or a uint8 array, got {type(buf).__name__}") from exc
    if not view.c_contiguous:
        raise CodecError(f"{what}: the buffer is not contiguous")
    if view.nbytes < needed:
        raise CodecError(f"{what}: buffer holds {view.nbytes} bytes, at least {needed} are needed")
    if view.ndim != 1 or view.format not in ("B", "b", "c"):
        view = view.cast("B")
    return np.frombuffer(view, dtype=np.uint8, count=needed)


def _low_bytes(codes: np.ndarray) -> np.ndarray:
    """Codes as a flat uint8 array holding each code's low 8 bits (two's complement)."""
    arr = np.asarray(codes)
    target = ML_INT_DTYPES.get(arr.dtype)
    if target is not None:
        arr = arr.astype(target)
    elif arr.dtype.kind not in "iub":
        raise CodecError(f"codes must be integers, got dtype {arr.dtype}")
    return arr.reshape(-1).astype(np.uint8, copy=False)


def pack_codes(codes: np.ndarray, bits: int) -> bytes:
    """Pack integer ``codes`` (any shape, row-major) into ``ceil(n * bits / 8)`` bytes.

    Only the low ``bits`` bits of each code are stored (two's complement for
    negative codes), least-significant bits first; the unused high bits of the
    last byte are zero. ``codes`` may be any numpy integer or bool array, or an
    ml_dtypes int2/uint2/int4/uint4 array.
    """
    bits = _check_bits(bits)
    u = _low_bytes(codes)
    n = u.size
    if bits == 8:
        return u.tobytes()
    mask = np.uint8((1 << bits) - 1)
    nbytes = (n * bits + 7) // 8
    if 8 % bits == 0:
        per_byte = 8 // bits
        out = np.zeros(nbytes, dtype=np.uint8)
        for j in range(per_byte):
            part = u[j::per_byte]
            if part.size:
                out[: part.size] |= (part & mask) << np.uint8(j * bits)
        return out.tobytes()
    # Widths 3, 5, 6, 7: eight codes fill exactly `bits` bytes; assemble each
    # group of eight in a little-endian uint64 and keep its first `bits` bytes.
    groups = (n + 7) // 8
    acc = np.zeros(groups, dtype="<u8")
    for j in range(8):
        part = u[j::8]
        if part.size:
            acc[: part.size] |= (part & mask).astype("<u8") << np.uint64(j * bits)
    grouped = acc.view(np.uint8).reshape(groups, 8)[:, :bits]
    return grouped.tobytes()[:nbytes]


def unpack_codes(buf: BufferLike, bits: int, count: int, signed: bool) -> np.ndarray:
    """Unpack ``count`` codes of ``bits`` bits from the start of ``buf``.

    Returns a 1-D int8 array (sign-extended) when ``signed``, else uint8. Only
    the first ``ceil(count * bits / 8)`` bytes are read; a longer buffer is
    fine, a shorter one raises CodecError. For ``bits == 8`` the result is a
    view of ``buf`` (no copy; read-only when ``buf`` is). The padding bits are
    not checked here: see :func:`check_padding_zero`.
    """
    bits = _check_bits(bits)
    count = _check_count(count)
    nbytes = (count * bits + 7) // 8
    b = _byte_view(buf, nbytes, f"unpacking {count} codes of {bits} bits")
    if bits == 8:
        return b.view(np.int8) if signed else b
    mask = np.uint8((1 << bits) - 1)
    if 8 % bits == 0:
        per_byte = 8 // bits
        out = np.empty(nbytes * per_byte, dtype=np.uint8)
        cols = out.reshape(nbytes, per_byte)
        for j in range(per_byte):
            col = cols[:, j]
            if signed:
                # Move code j to the top of the byte; the arithmetic shift below
                # brings it down with its sign bit replicated.
                np.left_shift(b, np.uint8(8 - (j + 1) * bits), out=col)
            else:
                np.right_shift(b, np.uint8(j * bits), out=col)
                np.bitwise_and(col, mask, out=col)
    else:
        groups = (count + 7) // 8
        staged = np.zeros(groups * 8, dtype=np.uint8)
        staged_rows = staged.reshape(groups, 8)
        flat = np.zeros(groups * bits, dtype=np.uint8)
        flat[:nbytes] = b
        staged_rows[:, :bits] = flat.reshape(groups, bits)
        acc = staged.view("<u8")
        out = np.empty(groups * 8, dtype=np.uint8)
        cols = out.reshape(groups, 8)
        for j in range(8):
            cols[:, j] = (acc >> np.uint64(j * bits)) & np.uint64(mask)
        if signed:
            np.left_shift(out, np.uint8(8 - bits), out=out)
    if signed:
        sview = out.view(np.int8)
        np.right_shift(sview, np.int8(8 - bits), out=sview)
        return sview[:count]
    return out[:count]


def check_padding_zero(buf: BufferLike, bits: int, count: int) -> None:
    """Raise CodecError (rule R9) if unused high bits of the last payload byte are set.

    The payload is the first ``ceil(count * bits / 8)`` bytes of ``buf``; when
    ``count * bits`` is a multiple of 8 there is no padding and nothing to check.
    """
    bits = _check_bits(bits)
    count = _check_count(count)
    nbytes = (count * bits + 7) // 8
    b = _byte_view(buf, nbytes, f"checking padding of {count} codes of {bits} bits")
    used = (count * bits) % 8
    if used == 0:
        return
    last = int(b[nbytes - 1])
    if last >> used:
        raise CodecError(
            f"R9: the {8 - used} unused high bit(s) of the last payload byte (index {nbytes - 1}) "
            f"must be zero, found byte 0x{last:02x} after {count} codes of {bits} bits"
        )


def _check_records(records: np.ndarray, bit_width: int) -> None:
    if not isinstance(records, np.ndarray) or records.dtype != np.uint8 or records.ndim != 2:
        desc = f"{records.dtype} array of rank {records.ndim}" if isinstance(records, np.ndarray) else type(records).__name__
        raise CodecError(f"records must be a 2-D uint8 array (records, record_bytes), got {desc}")
    if isinstance(bit_width, bool) or not isinstance(bit_width, (int, np.integer)) or not 1 <= bit_width <= 64:
        raise CodecError(f"bit_width={bit_width!r} is not an integer in 1..64")


def _check_end(records: np.ndarray, start: int, end: int) -> None:
    if end > records.shape[1] * 8:
        raise CodecError(
            f"bit field(s) [{start}, {end}) extend past the {records.shape[1]}-byte "
            f"({records.shape[1] * 8}-bit) record"
        )


def _gather_fields(records: np.ndarray, starts: np.ndarray, width: int) -> np.ndarray:
    """uint64 ``(R, len(starts))``: the ``width``-bit field at each bit offset of ``starts``
    (int64, in bounds) of every record."""
    first_byte = starts // 8
    shift = (starts % 8).astype(np.uint64)
    last_col = records.shape[1] - 1
    acc = np.zeros((records.shape[0], starts.size), dtype=np.uint64)
    # A field touches at most 9 bytes (64 bits starting mid-byte).
    for i in range((7 + width + 7) // 8):
        # Byte i of a field's span lands at field bit 8*i - shift; it matters only below width.
        lands = 8 * i - shift.astype(np.int64)
        needed = lands < width
        if not needed.any():
            break
        cols = np.minimum(first_byte + i, last_col)
        part = records[:, cols].astype(np.uint64)
        if i == 0:
            part >>= shift
        else:
            part <<= np.where(needed, lands, 0).astype(np.uint64)
            part *= needed.astype(np.uint64)
        acc |= part
    if width < 64:
        acc &= np.uint64((1 << width) - 1)
    return acc


def read_bitfield_array(records: np.ndarray, bit_offset: int, bit_width: int, count: int) -> np.ndarray:
    """Read ``count`` consecutive little-endian bit fields from every record.

    ``records`` is a uint8 array ``(R, record_bytes)``. Field ``k`` occupies
    record bits ``[bit_offset + k*bit_width, bit_offset + (k+1)*bit_width)``
    (bit ``i`` of a record is bit ``i % 8`` of byte ``i // 8``); ``bit_width``
    is 1..64. Returns uint64 ``(R, count)``: for each record,
    ``int.from_bytes(record, "little") >> (bit_offset + k*bit_width) & (2**bit_width - 1)``.
    """
    _check_records(records, bit_width)
    if isinstance(bit_offset, bool) or not isinstance(bit_offset, (int, np.integer)) or bit_offset < 0:
        raise CodecError(f"bit_offset={bit_offset!r} is not a non-negative integer")
    offset, width, count = int(bit_offset), int(bit_width), _check_count(count)
    _check_end(records, offset, offset + count * width)
    n_rec = records.shape[0]
    if count == 0 or n_rec == 0:
        return np.zeros((n_rec, count), dtype=np.uint64)
    if offset % 8 == 0 and width in (8, 16, 32, 64):
        size = width // 8
        start = offset // 8
        chunk = np.ascontiguousarray(records[:, start : start + count * size])
        return chunk.view(f"<u{size}").astype(np.uint64)
    return _gather_fields(records, offset + np.arange(count, dtype=np.int64) * width, width)


def read_bitfields_at(records: np.ndarray, bit_offsets: Any, bit_width: int) -> np.ndarray:
    """Read the ``bit_width``-bit field (1..64) starting at each of ``bit_offsets`` from
    every record, in one pass: uint64 ``(R, len(bit_offsets))``, bit order as in
    :func:`read_bitfield_array`. The offsets may come in any order and any spacing."""
    _check_records(records, bit_width)
    starts = np.asarray(bit_offsets)
    if starts.size and starts.dtype.kind not in "iu":
        raise CodecError(f"bit offsets must be integers, got dtype {starts.dtype}")
    starts = starts.astype(np.int64, copy=False).reshape(-1)
    width = int(bit_width)
    if starts.size == 0 or records.shape[0] == 0:
        return np.zeros((records.shape[0], starts.size), dtype=np.uint64)
    low = int(starts.min())
    if low < 0:
        raise CodecError(f"bit offset {low} is negative")
    _check_end(records, low, int(starts.max()) + width)
    return _gather_fields(records, starts, width)


def read_bitfield(records: np.ndarray, bit_offset: int, bit_width: int) -> np.ndarray:
    """Read one little-endian bit field of ``bit_width`` (1..64) bits from every record.

    Returns uint64 ``(R,)``; see :func:`read_bitfield_array` for the bit order.
    """
    return read_bitfield_array(records, bit_offset, bit_width, 1)[:, 0]
