"""Low-bit packing and bit-field reads against hand-computed bytes, onnx's own
packing (numpy_helper) and a pure-Python big-integer reference."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from onnx import numpy_helper

from onnxforge.errors import CodecError
from onnxforge.proto_ext.codecs.bits import (
    check_padding_zero,
    pack_codes,
    packed_nbytes,
    read_bitfield,
    read_bitfield_array,
    unpack_codes,
)

COUNTS = [0, 1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 33, 64, 101]


def _ref_pack(codes: list[int], bits: int) -> bytes:
    mask = (1 << bits) - 1
    big = 0
    for i, c in enumerate(codes):
        big |= (int(c) & mask) << (i * bits)
    return big.to_bytes((len(codes) * bits + 7) // 8, "little")


def _ref_unpack(buf: bytes, bits: int, count: int, signed: bool) -> list[int]:
    big = int.from_bytes(buf, "little")
    mask = (1 << bits) - 1
    out = []
    for i in range(count):
        v = (big >> (i * bits)) & mask
        if signed and v >> (bits - 1):
            v -= 1 << bits
        out.append(v)
    return out


# ---- hand-computed bytes ---------------------------------------------------------------


def test_int4_example_from_raw_data_layout() -> None:
    assert pack_codes(np.array([1, -2, 3, -8, 7]), 4) == bytes.fromhex("e18307")
    got = unpack_codes(bytes.fromhex("e18307"), 4, 5, signed=True)
    assert got.dtype == np.int8
    assert got.tolist() == [1, -2, 3, -8, 7]


def test_uint2_example_from_raw_data_layout() -> None:
    assert pack_codes(np.array([0, 1, 2, 3, 3, 2, 1, 0], dtype=np.uint8), 2) == bytes.fromhex("e41b")
    got = unpack_codes(bytes.fromhex("e41b"), 2, 8, signed=False)
    assert got.dtype == np.uint8
    assert got.tolist() == [0, 1, 2, 3, 3, 2, 1, 0]


def test_hand_computed_other_widths() -> None:
    # int2 [-2, -1, 0, 1, 1]: 10 11 00 01 | 01 -> byte0 = 0b01_00_11_10 = 0x4e, byte1 = 0x01
    assert pack_codes(np.array([-2, -1, 0, 1, 1]), 2) == bytes([0x4E, 0x01])
    assert unpack_codes(bytes([0x4E, 0x01]), 2, 5, signed=True).tolist() == [-2, -1, 0, 1, 1]
    # 1-bit [1,0,1,1,0,0,0,1, 1] -> 0b10001101 = 0x8d, then 0x01
    assert pack_codes(np.array([1, 0, 1, 1, 0, 0, 0, 1, 1]), 1) == bytes([0x8D, 0x01])
    # 3-bit [5, 3, 7]: bits 0-2 = 101, 3-5 = 011, 6-8 = 111 -> 0b11_011_101 = 0xdd, 0b1 = 0x01
    assert pack_codes(np.array([5, 3, 7]), 3) == bytes([0xDD, 0x01])
    assert unpack_codes(bytes([0xDD, 0x01]), 3, 3, signed=False).tolist() == [5, 3, 7]
    assert unpack_codes(bytes([0xDD, 0x01]), 3, 3, signed=True).tolist() == [-3, 3, -1]
    # 6-bit [63, 1]: 111111 | 000001 -> 0b01_111111 = 0x7f, 0b0000 = 0x00
    assert pack_codes(np.array([63, 1]), 6) == bytes([0x7F, 0x00])
    # int8 is a byte copy in two's complement
    assert pack_codes(np.array([-1, 127, -128, 0]), 8) == bytes([0xFF, 0x7F, 0x80, 0x00])


def test_only_low_bits_are_stored() -> None:
    # 17 = 0b10001 -> low 4 bits 1; -1 -> 0xf; 0x1ff -> low 8 bits 0xff
    assert pack_codes(np.array([17, -1]), 4) == bytes([0xF1])
    assert pack_codes(np.array([0x1FF], dtype=np.int64), 8) == bytes([0xFF])
    assert pack_codes(np.array([[True, False], [True, True]]), 1) == bytes([0b1101])


# ---- against the big-integer reference and onnx's packing ------------------------------


@pytest.mark.parametrize("bits", range(1, 9))
def test_pack_unpack_match_python_reference(bits: int) -> None:
    rng = np.random.default_rng(bits)
    for count in COUNTS:
        codes = rng.integers(-(1 << 9), 1 << 9, size=count)
        packed = pack_codes(codes, bits)
        assert packed == _ref_pack(codes.tolist(), bits), (bits, count)
        assert len(packed) == packed_nbytes(count, bits)
        for signed in (False, True):
            got = unpack_codes(packed, bits, count, signed)
            assert got.dtype == (np.int8 if signed else np.uint8)
            assert got.tolist() == _ref_unpack(packed, bits, count, signed), (bits, count, signed)


@pytest.mark.parametrize("bits", range(1, 9))
def test_unpack_random_bytes_match_python_reference(bits: int) -> None:
    rng = np.random.default_rng(100 + bits)
    for count in COUNTS:
        raw = rng.integers(0, 256, size=packed_nbytes(count, bits) + 3, dtype=np.uint8).tobytes()
        for signed in (False, True):
            got = unpack_codes(raw, bits, count, signed)
            assert got.tolist() == _ref_unpack(raw[: packed_nbytes(count, bits)], bits, count, signed)


@pytest.mark.parametrize(
    ("dtype", "bits", "lo", "hi"),
    [
        (ml_dtypes.int4, 4, -8, 7),
        (ml_dtypes.uint4, 4, 0, 15),
        (ml_dtypes.int2, 2, -2, 1),
        (ml_dtypes.uint2, 2, 0, 3),
        (np.int8, 8, -128, 127),
        (np.uint8, 8, 0, 255),
    ],
)
def test_matches_onnx_numpy_helper(dtype: type, bits: int, lo: int, hi: int) -> None:
    rng = np.random.default_rng(bits + hi)
    for count in (1, 2, 3, 5, 6, 7, 1000, 1001, 1003):
        values = rng.integers(lo, hi + 1, size=count).astype(dtype)
        tensor = numpy_helper.from_array(values)
        assert pack_codes(values, bits) == tensor.raw_data
        back = unpack_codes(tensor.raw_data, bits, count, signed=lo < 0)
        np.testing.assert_array_equal(back.astype(np.int64), numpy_helper.to_array(tensor).astype(np.int64))


def test_large_array_matches_ml_dtypes() -> None:
    rng = np.random.default_rng(7)
    values = rng.integers(-8, 8, size=1_000_003).astype(ml_dtypes.int4)
    packed = pack_codes(values, 4)
    assert packed == numpy_helper.from_array(values).raw_data
    np.testing.assert_array_equal(unpack_codes(packed, 4, values.size, True), values.astype(np.int8))


# ---- buffers ---------------------------------------------------------------------------


def test_unpack_accepts_buffer_kinds_and_reads_only_the_prefix() -> None:
    raw = bytes.fromhex("e18307ffff")
    expected = [1, -2, 3, -8, 7]
    for buf in (raw, bytearray(raw), memoryview(raw), np.frombuffer(raw, dtype=np.uint8)):
        assert unpack_codes(buf, 4, 5, signed=True).tolist() == expected
    assert unpack_codes(memoryview(raw)[1:], 4, 2, signed=False).tolist() == [3, 8]


def test_unpack_int8_is_a_view() -> None:
    backing = np.arange(10, dtype=np.uint8)
    got = unpack_codes(backing, 8, 6, signed=True)
    assert np.shares_memory(got, backing)
    assert got.dtype == np.int8 and got.tolist() == [0, 1, 2, 3, 4, 5]


def test_unpack_short_buffer_raises() -> None:
    with pytest.raises(CodecError, match="at least 3"):
        unpack_codes(b"\x00\x00", 4, 5, signed=True)
    with pytest.raises(CodecError, match="at least 2"):
        unpack_codes(np.zeros(1, np.uint8), 2, 5, signed=False)


def test_bad_arguments_raise() -> None:
    with pytest.raises(CodecError, match="bits"):
        pack_codes(np.array([1]), 0)
    with pytest.raises(CodecError, match="bits"):
        unpack_codes(b"\x00", 9, 1, signed=False)
    with pytest.raises(CodecError, match="integers"):
        pack_codes(np.array([1.0, 2.0]), 4)
    with pytest.raises(CodecError, match="uint8"):
        unpack_codes(np.zeros(4, np.int16), 4, 2, signed=False)
    with pytest.raises(CodecError, match="count"):
        unpack_codes(b"\x00", 4, -1, signed=False)
    with pytest.raises(CodecError, match="bytes"):
        unpack_codes(12345, 4, 1, signed=False)


def test_check_padding_zero() -> None:
    check_padding_zero(bytes.fromhex("e18307"), 4, 5)
    check_padding_zero(bytes.fromhex("e18387"), 4, 6)  # no padding at an even count
    check_padding_zero(bytes([0x4E, 0x01]), 2, 5)
    with pytest.raises(CodecError, match="R9"):
        check_padding_zero(bytes.fromhex("e18317"), 4, 5)
    with pytest.raises(CodecError, match="R9"):
        check_padding_zero(bytes([0x4E, 0x05]), 2, 5)
    with pytest.raises(CodecError, match="R9"):
        check_padding_zero(bytes([0xDD, 0x81]), 3, 3)
    with pytest.raises(CodecError, match="at least 3"):
        check_padding_zero(b"\xe1", 4, 5)


# ---- bit fields ------------------------------------------------------------------------


def _ref_field(record: bytes, offset: int, width: int) -> int:
    return (int.from_bytes(record, "little") >> offset) & ((1 << width) - 1)


def test_read_bitfield_hand_computed() -> None:
    records = np.array([[0xAB, 0xCD, 0xEF, 0x01], [0x00, 0xF0, 0xFF, 0x80]], dtype=np.uint8)
    # little-endian 0x01efcdab >> 4 & 0xfff = 0xcda; 0x80fff000 >> 4 & 0xfff = 0xf00
    assert read_bitfield(records, 4, 12).tolist() == [0xCDA, 0xF00]
    assert read_bitfield(records, 0, 32).tolist() == [0x01EFCDAB, 0x80FFF000]
    assert read_bitfield(records, 31, 1).tolist() == [0, 1]
    got = read_bitfield(records, 0, 8)
    assert got.dtype == np.uint64 and got.shape == (2,)
    # two consecutive 4-bit fields starting at bit 12: 0xc, 0xf / 0xf, 0xf
    assert read_bitfield_array(records, 12, 4, 2).tolist() == [[0xC, 0xF], [0xF, 0xF]]


def test_read_bitfield_64_bits_at_odd_offset() -> None:
    rng = np.random.default_rng(3)
    records = rng.integers(0, 256, size=(50, 9), dtype=np.uint8)
    for offset in range(9):
        got = read_bitfield(records, offset, 64)
        expected = [_ref_field(r.tobytes(), offset, 64) for r in records]
        assert got.tolist() == expected, offset


def test_read_bitfield_random_against_reference() -> None:
    rng = np.random.default_rng(11)
    records = rng.integers(0, 256, size=(40, 23), dtype=np.uint8)
    blobs = [r.tobytes() for r in records]
    for _ in range(300):
        width = int(rng.integers(1, 65))
        offset = int(rng.integers(0, 23 * 8 - width + 1))
        got = read_bitfield(records, offset, width)
        assert got.tolist() == [_ref_field(b, offset, width) for b in blobs], (offset, width)


def test_read_bitfield_array_random_against_reference() -> None:
    rng = np.random.default_rng(12)
    records = rng.integers(0, 256, size=(17, 40), dtype=np.uint8)
    blobs = [r.tobytes() for r in records]
    cases = [(0, 8, 40), (8, 16, 19), (0, 32, 10), (4, 64, 4), (3, 4, 77), (5, 7, 45), (1, 33, 9), (0, 1, 320)]
    for _ in range(60):
        width = int(rng.integers(1, 65))
        count = int(rng.integers(1, 320 // width + 1))
        offset = int(rng.integers(0, 320 - width * count + 1))
        cases.append((offset, width, count))
    for offset, width, count in cases:
        got = read_bitfield_array(records, offset, width, count)
        assert got.shape == (17, count) and got.dtype == np.uint64
        expected = [[_ref_field(b, offset + k * width, width) for k in range(count)] for b in blobs]
        assert got.tolist() == expected, (offset, width, count)


def test_read_bitfield_errors() -> None:
    records = np.zeros((3, 4), dtype=np.uint8)
    with pytest.raises(CodecError, match="past the 4-byte"):
        read_bitfield(records, 25, 8)
    with pytest.raises(CodecError, match="past the 4-byte"):
        read_bitfield_array(records, 0, 4, 9)
    with pytest.raises(CodecError, match="bit_width"):
        read_bitfield(records, 0, 0)
    with pytest.raises(CodecError, match="bit_width"):
        read_bitfield(np.zeros((3, 16), np.uint8), 0, 65)
    with pytest.raises(CodecError, match="bit_offset"):
        read_bitfield(records, -1, 4)
    with pytest.raises(CodecError, match="2-D uint8"):
        read_bitfield(records.astype(np.int8), 0, 4)
    with pytest.raises(CodecError, match="2-D uint8"):
        read_bitfield(records.reshape(-1), 0, 4)
    assert read_bitfield_array(records, 0, 8, 0).shape == (3, 0)
