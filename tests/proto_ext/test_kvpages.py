"""Page formats of the paged KV cache: sizes, hand-built worked examples, codecs, wire form."""
from __future__ import annotations

import struct

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto

import onnxforge as of
from onnxforge.proto_ext import schema
from onnxforge.proto_ext.catalogue import Catalogue
from onnxforge.proto_ext.codecs import kvcache as kc
from onnxforge.proto_ext.codecs import kvpages as kp
from onnxforge.proto_ext.codecs.decode import decode_encoded
from onnxforge.proto_ext.convert import encoded_from_proto, struct_from_proto
from onnxforge.proto_ext.errors import VerificationError
from onnxforge.proto_ext.sizes import LayoutCache
from onnxforge.proto_ext.types import StructType

H, P, D = 1, 4, 32  # the smallest geometry: 8 rows of 32 values, 256 values per page
ROWS = 2 * H * P
CODEBOOK = np.array([-1.0, -0.25, 0.25, 1.0], np.float32)


def _root_bytes(fmt: str, geo: tuple[int, int, int]) -> int:
    decls = kp.page_declarations(fmt, *geo)
    return LayoutCache(Catalogue(decls)).element_bytes(StructType(kind="type_ref", type_ref=decls[-1].type_id))


# -- sizes ----------------------------------------------------------------------------------

@pytest.mark.parametrize("geo", [(1, 4, 32), (4, 16, 64), (2, 8, 128)])
def test_record_sizes_times_records_equal_the_table(geo):
    h, p, d = geo
    rows, blocks = 2 * h * p, d // 32
    table = {"float32": rows * d * 4, "float16": rows * d * 2, "int8": rows * (4 + d),
             "int4": rows * blocks * 18, "fp8": rows * (4 + d),
             "int2": h * d * (4 + p // 4) + h * p * blocks * 12, "codebook": rows * blocks * 12}
    records = {"float32": rows, "float16": rows, "int8": rows, "fp8": rows, "int4": rows * blocks,
               "codebook": rows * blocks, "int2": 1}
    for fmt in kp.FORMATS:
        assert kp.page_nbytes(fmt, h, p, d) == table[fmt]
        assert _root_bytes(fmt, geo) * records[fmt] == table[fmt], fmt


def test_int4_is_18_bytes_per_32_values_and_codebook_12():
    assert _root_bytes("int4", (3, 8, 96)) == 18
    assert _root_bytes("codebook", (3, 8, 96)) == 12
    # q4_0-like: 18 / (32 * 2) of float16's bytes
    assert kp.page_nbytes("int4", 4, 16, 64) / kp.page_nbytes("float16", 4, 16, 64) == pytest.approx(0.28125)


def test_int2_record_is_the_whole_page_with_nested_group_arrays():
    decls = kp.page_declarations("int2", 2, 8, 64)
    layout = LayoutCache(Catalogue(decls)).record_layout(StructType(kind="type_ref", type_ref=decls[-1].type_id))
    shapes = {leaf.path: leaf.shape for leaf in layout.leaves}
    assert shapes == {"keys.scale": (2, 64), "keys.min": (2, 64), "keys.codes.code": (2, 64, 8),
                      "values.scale": (2, 8, 2), "values.min": (2, 8, 2), "values.codes.code": (2, 8, 2, 32)}
    assert kp.int2_geometry(layout) == (2, 8, 64)


def test_codebook_reuses_the_specification_types():
    decls = kp.page_declarations("codebook", H, P, D, first_id=1101)
    assert [(d.type_id, d.name) for d in decls] == [
        (1101, "CODEBOOK2_BLOCK_32"), (1102, "SCALED_CODEBOOK2_BLOCK_32"), (1103, "ONNXFORGE_KV_CODEBOOK2_PAGE")]
    protos = kp.page_struct_types("codebook", H, P, D, first_id=1101)
    assert [struct_from_proto(p) for p in protos] == decls


# -- worked examples, bytes built by hand from PAGED_FORMATS.md ------------------------------------

def _f16(v: float) -> bytes:
    return struct.pack("<e", v)


def test_float32_and_float16_examples():
    vals = [i * 0.5 - 40 for i in range(ROWS * D)]
    want = np.array(vals, np.float32).reshape(2, H, P, D)
    assert np.array_equal(kp.decode_page("float32", struct.pack(f"<{len(vals)}f", *vals), H, P, D), want)
    assert np.array_equal(kp.decode_page("float16", struct.pack(f"<{len(vals)}e", *vals), H, P, D), want)


def test_int8_example():
    payload, want = b"", []
    for r in range(ROWS):
        scale = 0.5 * (r + 1)
        codes = [d - 16 for d in range(D)]
        payload += struct.pack("<f", scale) + struct.pack(f"<{D}b", *codes)
        want += [scale * c for c in codes]
    got = kp.decode_page("int8", payload, H, P, D)
    assert np.array_equal(got.reshape(-1), np.array(want, np.float32))


def test_int4_example_low_nibble_first():
    payload, want = b"", []
    for r in range(ROWS):
        scale = 0.25 * (r + 1)
        codes = [j % 16 for j in range(32)]
        packed = bytes(codes[2 * k] | (codes[2 * k + 1] << 4) for k in range(16))
        payload += _f16(scale) + packed
        want += [scale * (c - 8) for c in codes]
    assert payload[2:4] == b"\x10\x32"  # element 0 low nibble, element 1 high nibble
    got = kp.decode_page("int4", payload, H, P, D)
    assert np.array_equal(got.reshape(-1), np.array(want, np.float32))


def test_the_module_docstring_int4_record():
    record = bytes.fromhex("0038" + "98badcfe10325476" * 2)
    got = kp.decode_page("int4", record * ROWS, H, P, D)[0, 0, 0]
    want = [0.5 * (c - 8) for c in [*range(8, 16), *range(8)] * 2]
    assert got.tolist() == want


def test_fp8_example():
    # e4m3fn: 0x38 = 1.0, 0x40 = 2.0, 0xB8 = -1.0, 0x3C = 1.5, 0x01 = 2**-9 (smallest subnormal)
    codes = bytes([0x38, 0x40, 0xB8, 0x3C, 0x01, 0x00, 0x7E, 0xFE] * 4)
    table = [1.0, 2.0, -1.0, 1.5, 2.0 ** -9, 0.0, 448.0, -448.0] * 4
    payload, want = b"", []
    for r in range(ROWS):
        payload += struct.pack("<f", float(r + 1)) + codes
        want += [(r + 1) * v for v in table]
    got = kp.decode_page("fp8", payload, H, P, D)
    assert np.array_equal(got.reshape(-1), np.array(want, np.float32))


def test_int2_example_keys_per_channel_values_per_block():
    k_part = b""
    for d in range(D):  # channel (h=0, d): scale 0.5, min -1, token t's code = (t + d) % 4
        codes = [(t + d) % 4 for t in range(P)]
        k_part += _f16(0.5) + _f16(-1.0) + bytes([codes[0] | codes[1] << 2 | codes[2] << 4 | codes[3] << 6])
    v_part = b""
    for t in range(P):  # row (h=0, t), one block: scale 0.25, min t, codes 0,1,2,3 repeated (0xE4)
        v_part += _f16(0.25) + _f16(float(t)) + b"\xe4" * 8
    got = kp.decode_page("int2", k_part + v_part, H, P, D)
    keys = np.array([[-1.0 + 0.5 * ((t + d) % 4) for d in range(D)] for t in range(P)], np.float32)
    values = np.array([[t + 0.25 * (i % 4) for i in range(D)] for t in range(P)], np.float32)
    assert np.array_equal(got[0, 0], keys)
    assert np.array_equal(got[1, 0], values)


def test_codebook_example_is_the_specification_record():
    record = bytes.fromhex("E4E4E4E4E4E4E4E4") + bytes.fromhex("00000040")  # scale FLOAT 2.0
    got = kp.decode_page("codebook", record * ROWS, H, P, D)
    assert np.array_equal(got.reshape(-1), np.tile(np.array([-2.0, -0.5, 0.5, 2.0], np.float32), ROWS * 8))


def _reference_decode(fmt: str, b: bytes, h: int, p: int, d: int) -> np.ndarray:
    """PAGED_FORMATS.md's decode written directly over the bytes (no struct machinery)."""
    u = np.frombuffer(b, np.uint8)
    rows, nb = 2 * h * p, d // 32

    def nibbles(a: np.ndarray) -> np.ndarray:  # element 2k = low nibble of byte k
        return np.stack([a & 15, a >> 4], axis=-1).reshape(*a.shape[:-1], -1)

    def crumbs(a: np.ndarray) -> np.ndarray:  # element 4k + j = bits [2j, 2j + 2) of byte k
        return np.stack([(a >> (2 * j)) & 3 for j in range(4)], axis=-1).reshape(*a.shape[:-1], -1)

    with np.errstate(over="ignore", invalid="ignore"):
        if fmt == "float32":
            out = u.view("<f4").astype(np.float32)
        elif fmt == "float16":
            out = u.view("<f2").astype(np.float32)
        elif fmt in ("int8", "fp8"):
            r = u.reshape(rows, 4 + d)
            scale = r[:, :4].copy().view("<f4")
            codes = r[:, 4:].copy().view(np.int8 if fmt == "int8" else ml_dtypes.float8_e4m3fn)
            out = scale * codes.astype(np.float32)
        elif fmt == "int4":
            r = u.reshape(rows * nb, 18)
            out = r[:, :2].copy().view("<f2").astype(np.float32) * (nibbles(r[:, 2:]).astype(np.float32) - 8)
        elif fmt == "codebook":
            r = u.reshape(rows * nb, 12)
            out = CODEBOOK[crumbs(r[:, :8])] * r[:, 8:].copy().view("<f4")
        else:
            kbytes = h * d * (4 + p // 4)
            k = u[:kbytes].reshape(h, d, 4 + p // 4)
            kv = (k[..., 2:4].copy().view("<f2").astype(np.float32)
                  + k[..., :2].copy().view("<f2").astype(np.float32) * crumbs(k[..., 4:]).astype(np.float32))
            v = u[kbytes:].reshape(h, p, nb, 12)
            vv = (v[..., 2:4].copy().view("<f2").astype(np.float32)
                  + v[..., :2].copy().view("<f2").astype(np.float32) * crumbs(v[..., 4:]).astype(np.float32))
            out = np.stack([kv.transpose(0, 2, 1), vv.reshape(h, p, d)])
    return out.reshape(2, h, p, d)


@pytest.mark.parametrize("fmt", kp.FORMATS)
def test_any_bytes_decode_bit_exactly_like_the_reference(fmt):
    rng = np.random.default_rng(99)
    for geo in [(1, 4, 32), (2, 8, 64), (3, 12, 96)]:
        payload = rng.integers(0, 256, kp.page_nbytes(fmt, *geo), dtype=np.uint8).tobytes()
        got, want = kp.decode_page(fmt, payload, *geo), _reference_decode(fmt, payload, *geo)
        assert got.dtype == np.float32 and got.shape == want.shape
        assert np.array_equal(got.view(np.uint32), want.astype(np.float32).view(np.uint32)) or \
            np.array_equal(got, want, equal_nan=True)


# -- encoders ---------------------------------------------------------------------------------

def _page(rng: np.random.Generator, h: int = 2, p: int = 8, d: int = 64) -> np.ndarray:
    x = rng.standard_normal((2, h, p, d)) * rng.uniform(0.1, 4.0, size=(2, h, p, 1))
    return x.astype(np.float32)


def _bound(fmt: str, x: np.ndarray) -> np.ndarray:
    """Largest error the format's math allows, per element (float64)."""
    x = x.astype(np.float64)
    rows = np.abs(x).max(axis=-1, keepdims=True)
    blocks = np.abs(x.reshape(*x.shape[:-1], -1, 32)).max(axis=-1, keepdims=True)
    blocks = np.broadcast_to(blocks, (*x.shape[:-1], x.shape[-1] // 32, 32)).reshape(x.shape)
    eps = 1e-6 * (np.abs(x) + rows)
    if fmt == "float32":
        return np.zeros_like(x)
    if fmt == "float16":
        return np.abs(x) * 2.0 ** -11 + 2.0 ** -24
    if fmt == "int8":
        return rows / 254 + eps
    if fmt == "int4":  # |d| = amax / 8 per block; clamping at 15 costs at most one step
        return blocks / 8 * (1 + 2.0 ** -7) + eps
    if fmt == "fp8":
        return np.abs(x) * 2.0 ** -4 + rows / 448 * 2.0 ** -10 + eps
    if fmt == "codebook":  # nearest of [-1, -.25, .25, 1]: half the widest gap, 0.375
        return blocks * 0.375 + eps
    # int2: half a step of (hi - lo) / 3 per group, plus float16 rounding of min and scale
    k = x[0]
    krange = (k.max(axis=1, keepdims=True) - k.min(axis=1, keepdims=True))
    kabs = np.abs(k).max(axis=1, keepdims=True)
    v = x[1].reshape(*x.shape[1:-1], -1, 32)
    vrange = v.max(axis=-1, keepdims=True) - v.min(axis=-1, keepdims=True)
    vabs = np.abs(v).max(axis=-1, keepdims=True)
    kb = np.broadcast_to(krange / 6 + kabs * 2.0 ** -9, k.shape)
    vb = np.broadcast_to(vrange / 6 + vabs * 2.0 ** -9, v.shape).reshape(k.shape)
    return np.stack([kb, vb]) + eps


@pytest.mark.parametrize("fmt", kp.FORMATS)
def test_encode_decode_round_trip_within_the_format_bound(fmt):
    rng = np.random.default_rng(7)
    for _ in range(3):
        x = _page(rng)
        payload = kp.encode_page(fmt, x)
        assert len(payload) == kp.page_nbytes(fmt, 2, 8, 64)
        err = np.abs(kp.decode_page(fmt, payload, 2, 8, 64).astype(np.float64) - x.astype(np.float64))
        assert (err <= _bound(fmt, x)).all(), float((err - _bound(fmt, x)).max())
        assert kp.encode_page(fmt, x) == payload  # deterministic


def test_int4_encoder_follows_q4_0():
    x = np.zeros((2, 1, 4, 32), np.float32)
    x[0, 0, 0, :4] = [4.0, -2.0, 1.0, -1.0]  # m = 4.0, d = -0.5, codes rint(x / -0.5) + 8
    payload = kp.encode_page("int4", x)
    assert payload[:2] == _f16(-0.5)
    assert payload[2] == (0 | 12 << 4) and payload[3] == (6 | 10 << 4)  # codes 0, 12, 6, 10
    assert kp.decode_page("int4", payload, 1, 4, 32)[0, 0, 0, :4].tolist() == [4.0, -2.0, 1.0, -1.0]


def test_rounding_is_half_to_even():
    x = np.zeros((2, 1, 4, 32), np.float32)
    x[0, 0, 0, 0], x[0, 0, 0, 1], x[0, 0, 0, 2] = 127.0, 0.5, 1.5  # scale 1: 0.5 -> 0, 1.5 -> 2
    payload = kp.encode_page("int8", x)
    assert struct.unpack("<f", payload[:4])[0] == 1.0
    assert struct.unpack("<3b", payload[4:7]) == (127, 0, 2)


def test_zero_rows_encode_to_zero_scales_and_codes():
    x = np.zeros((2, 1, 4, 32), np.float32)
    for fmt in kp.FORMATS:
        assert not kp.decode_page(fmt, kp.encode_page(fmt, x), 1, 4, 32).any(), fmt
    assert kp.encode_page("int8", x) == bytes(kp.page_nbytes("int8", 1, 4, 32))


# -- encoded values and the catalogue ---------------------------------------------------------------

@pytest.mark.parametrize("fmt", kp.FORMATS)
def test_encoded_value_round_trips_through_serialization(fmt):
    x = _page(np.random.default_rng(3), 2, 8, 64)
    payload = kp.encode_page(fmt, x)
    decls = kp.page_struct_types(fmt, 2, 8, 64, first_id=5001)
    ev = kp.page_encoded_value(fmt, payload, 2, 8, 64, decls[-1].type_id, name="page")
    back = schema.parse("EncodedValueProto", ev.SerializeToString())
    header = encoded_from_proto(back)
    assert header.logical_type == kp.page_logical_type(2, 8, 64)
    got = decode_encoded(header, Catalogue([struct_from_proto(d) for d in decls]))
    assert np.array_equal(got, kp.decode_page(fmt, payload, 2, 8, 64))
    # a model holding the page decodes it through the facade and verifies
    m = schema.ModelProto(ir_version=10)
    m.opset_import.add(domain="", version=21)
    m.graph.name = "g"
    m.struct_types.extend(decls)
    m.graph.encoded_initializer.add().CopyFrom(back)
    assert of.check(m) == []
    assert np.array_equal(of.decode_value(m, "page"), got)


def test_declare_page_types_reuses_identical_declarations():
    entries: list[StructType] = []
    a = kp.declare_page_types(entries, "int8", 2, 8, 64)
    assert kp.declare_page_types(entries, "int8", 2, 8, 64) == a
    b = kp.declare_page_types(entries, "int8", 2, 8, 128)  # another geometry, another declaration
    c1 = kp.declare_page_types(entries, "codebook", 2, 8, 64)
    # 32-value block records do not depend on the geometry: one declaration serves every cache
    assert kp.declare_page_types(entries, "codebook", 2, 16, 64) == c1
    assert kp.declare_page_types(entries, "int4", 2, 8, 64) == kp.declare_page_types(entries, "int4", 4, 16, 128)
    assert len({a, b, c1}) == 3
    assert [e.name for e in entries].count("CODEBOOK2_BLOCK_32") == 1
    assert len({e.type_id for e in entries}) == len(entries)


# -- the cache value on the wire -----------------------------------------------------------------------

def _cache(rng: np.random.Generator) -> kc.PagedCacheValue:
    fmts = ["float32", "float16", "int8", "int4", "fp8", "int2", "codebook", None, None]
    pages = tuple(None if f is None else (f, kp.encode_page(f, _page(rng))) for f in fmts)
    return kc.PagedCacheValue(2, 64, 8, len(fmts), length=7 * 8 - 3, pages=pages,
                              formats=("float32", "int8", "int4", "int2"))


def test_cache_round_trip_decodes_identically():
    rng = np.random.default_rng(11)
    caches = {"cache.0": _cache(rng), "cache.1": kc.PagedCacheValue(2, 64, 8, 4)}
    data = kc.cache_to_bytes(caches)
    back = kc.cache_from_bytes(data)
    assert back == caches
    value = back["cache.0"]
    assert value.page_formats() == ["float32", "float16", "int8", "int4", "fp8", "int2", "codebook", None, None]
    assert (value.length, value.formats, value.capacity) == (53, ("float32", "int8", "int4", "int2"), 72)
    for i in range(7):
        assert np.array_equal(value.decode(i), caches["cache.0"].decode(i))
    assert back["cache.1"].page_formats() == [None] * 4 and back["cache.1"].length == 0


def test_wire_form_verifies_and_names_its_parts():
    m = kc.cache_to_proto({"c": _cache(np.random.default_rng(1))})
    assert of.check(m) == []
    names = [e.name for e in m.graph.encoded_initializer]
    assert names == [f"c.pages[{i}]" for i in range(7)]
    assert [i.name for i in m.graph.initializer] == ["c.length"]
    container = [s for s in m.struct_types if s.name == kc.CACHE_STRUCT_NAME]
    assert len(container) == 1 and m.graph.input[0].type.struct_type.type_ref == container[0].type_id


def test_catalogue_reordering_changes_nothing():
    caches = {"c": _cache(np.random.default_rng(5))}
    m = kc.cache_to_proto(caches)
    reordered = schema.ModelProto()
    reordered.CopyFrom(m)
    del reordered.struct_types[:]
    reordered.struct_types.extend(reversed(list(m.struct_types)))
    assert of.check(reordered) == []
    assert kc.cache_from_proto(reordered) == caches


def test_from_cache_reads_a_runtime_cache_object():
    class Runtime:  # the attributes the backend's PagedKVCache offers
        kv_heads, head_dim, page_size, num_pages, length, formats = 1, 32, 4, 2, 3, ("int8",)

        def page_formats(self):
            return ["int8", None]

        def page_payload(self, i):
            return np.frombuffer(kp.encode_page("int8", np.ones((2, 1, 4, 32), np.float32)), np.uint8)

    v = kc.PagedCacheValue.from_cache(Runtime())
    assert v.page_formats() == ["int8", None] and v.length == 3
    assert np.array_equal(v.decode(0), np.ones((2, 1, 4, 32), np.float32))


def test_a_corrupted_wire_form_does_not_load():
    m = kc.cache_to_proto({"c": _cache(np.random.default_rng(2))})
    m.graph.encoded_initializer[2].logical_type.tensor_type.elem_type = TensorProto.FLOAT16
    with pytest.raises(VerificationError) as info:
        kc.cache_from_proto(m)
    assert info.value.rules == ["K8"] and "page 2" in str(info.value)


# -- bad input -------------------------------------------------------------------------------------

def test_bad_input_raises_page_format_errors():
    with pytest.raises(kp.PageFormatError, match="unknown page format 'int3'"):
        kp.encode_page("int3", np.zeros((2, 1, 4, 32), np.float32))
    with pytest.raises(kp.PageFormatError, match="multiple of 32"):
        kp.page_nbytes("int4", 1, 4, 48)
    with pytest.raises(kp.PageFormatError, match="multiple of 4"):
        kp.page_nbytes("int2", 1, 6, 32)
    with pytest.raises(kp.PageFormatError, match="has 576 bytes, the payload has 575"):
        kp.decode_page("int4", bytes(575), 2, 8, 32)
    with pytest.raises(kp.PageFormatError, match=r"\[2, H, P, D\]"):
        kp.encode_page("int8", np.zeros((1, 1, 4, 32), np.float32))
    with pytest.raises(kp.PageFormatError, match="length=9 is not in"):
        kc.PagedCacheValue(1, 32, 4, 2, length=9)
    with pytest.raises(kp.PageFormatError, match="page 1 holds tokens below length 5"):
        kc.PagedCacheValue(1, 32, 4, 2, length=5, pages=(("int8", bytes(288)), None))
    with pytest.raises(kp.PageFormatError, match="page 0: a int8 page"):
        kc.PagedCacheValue(1, 32, 4, 2, pages=(("int8", bytes(10)), None))
    with pytest.raises(kp.PageFormatError, match="unknown page format 'q8'"):
        kc.PagedCacheValue(1, 32, 4, 2, formats=("q8",))
