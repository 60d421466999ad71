"""State files: written atomically under the state's lock, every byte checked (format
version, header digest, a SHA-256 per payload, zero padding) and the declared identity
matched before a restore touches the state."""
from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import struct
import zipfile

import numpy as np
import pytest
from onnx import TensorProto

import onnxforge as of
from onnxforge.graphbuilder.builder.graph_builder import GraphBuilder, struct_ref
from onnxforge.graphbuilder.ir.core import READ_WRITE
from onnxforge.kernels_cy.runtime import statefile
from onnxforge.kernels_cy.errors import (
    StateBusyError,
    StateClosedError,
    StateError,
    StateFileError,
    StateInitError,
)
from onnxforge.kernels_cy.paged.pages import PagedKVCache
from onnxforge.kernels_cy.runtime.state import make_state
from onnxforge.proto_ext.codecs.kvcache import cache_declaration
from onnxforge.proto_ext.types import StructType

F, F16, I64 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.INT64
CAP = 8


# -- models -------------------------------------------------------------------------------------

def _cache_model(cap: int = CAP, elem: int = F, name: str = "cache", reduce: str = "ReduceSum"):
    """cache [1, cap, 4] READ_WRITE <- CacheUpdate(cache, values, pos); a reduction on the side."""
    g = GraphBuilder(opset=23)
    cache = g.input(name, elem, [1, cap, 4], access=READ_WRITE)
    values = g.input("values", elem, [1, 2, 4])
    pos = g.input("pos", I64, [])
    upd = g.op.CacheUpdate(cache, values, pos)
    g.output(getattr(g.op, reduce)(upd, keepdims=0), "total")
    g.output(upd, "updated")
    g.bind(cache, "updated")
    return g.to_model()


def _feeds(pos: int, v: float = 1.0, dtype=np.float32) -> dict:
    return {"values": np.full((1, 2, 4), v, dtype), "pos": np.array(pos, np.int64)}


def _paged_model(page: int = 4, pages: int = 4, formats: tuple[str, ...] = ("float32", "int8"),
                 heads: int = 2):
    """cache: ONNXFORGE_PAGED_KV_CACHE (READ_WRITE) -> PagedCacheUpdate -> PagedAttention."""
    g = GraphBuilder(opset=23)
    g.model.struct_types.append(cache_declaration(heads, page, 32, pages, formats, type_id=2000))
    cache = g.input("cache", type=struct_ref(2000), access=READ_WRITE)
    key = g.input("key", F, [1, heads, "n", 32])
    value = g.input("value", F, [1, heads, "n", 32])
    query = g.input("query", F, [1, 2 * heads, "n", 32])
    pos = g.input("position", I64, [])
    upd = g.op.PagedCacheUpdate(cache, key, value, pos)
    g.output(g.op.PagedAttention(query, upd, num_heads=2 * heads, kv_num_heads=heads), "y")
    g.output(upd, "updated_cache")
    g.bind(cache, "updated_cache")
    return g.to_model()


def _paged_feeds(rng, pos: int, n: int) -> dict:
    return {"key": rng.standard_normal((1, 2, n, 32)).astype(np.float32),
            "value": rng.standard_normal((1, 2, n, 32)).astype(np.float32),
            "query": rng.standard_normal((1, 4, n, 32)).astype(np.float32),
            "position": np.array(pos, np.int64)}


def _struct_model():
    """cache: struct(Cache) <- Identity(cache); y = Relu(x)."""
    g = GraphBuilder(opset=23)
    cache = g.input("cache", type=StructType(name="Cache"))
    x = g.input("x", F, [2])
    g.output(g.op.Relu(x), "y")
    g.output(g.op.Identity(cache), "cache_next", type=StructType(name="Cache"))
    g.bind(cache, "cache_next")
    return g.to_model()


def _cache_state():
    st = make_state(_cache_model())
    st.run(_feeds(0, 1.5))
    st.run(_feeds(2, 2.5))
    return st


def _paged_state():
    rng = np.random.default_rng(3)
    st = make_state(_paged_model())
    st.run(_paged_feeds(rng, 0, 7))  # 7 tokens: page 0 ages to int8, page 1 float32
    st.run(_paged_feeds(rng, 7, 2))
    return st


# -- the file's parts, to forge consistent files and to flip bytes ------------------------------

def _parts(path) -> tuple[int, dict, bytes]:
    data = open(path, "rb").read()
    assert data.startswith(statefile.MAGIC)
    at = len(statefile.MAGIC)
    version, n = struct.unpack_from("<IQ", data, at)
    at += 12
    header = json.loads(data[at:at + n])
    at += n + 32
    at += -at % 64
    return version, header, data[at:]


def _write_parts(path, header: dict, payload: bytes, version: int = statefile.VERSION) -> None:
    """A file whose header digest is right: only the checks after it can refuse it."""
    text = json.dumps(header).encode()
    head = statefile.MAGIC + struct.pack("<IQ", version, len(text)) + text + hashlib.sha256(text).digest()
    open(path, "wb").write(head + bytes(-len(head) % 64) + payload)


def _forge(src, dst, edit) -> None:
    version, header, payload = _parts(src)
    payload = bytearray(payload)
    edit(header, payload)
    _write_parts(dst, header, bytes(payload), version)


def _fingerprint(st) -> dict:
    """Everything a restore could change, deep-copied."""
    out: dict = {"lengths": st.lengths, "addresses": st.addresses()}
    for k, v in st.values.items():
        if isinstance(v, PagedKVCache):
            out[k] = (v.length, v.page_formats(), [None if f is None else v.page_payload(i).tobytes()
                                                   for i, f in enumerate(v.page_formats())])
        elif isinstance(v, dict):
            out[k] = {f: a.tobytes() for f, a in v.items()}
        else:
            out[k] = (v.dtype, v.shape, v.tobytes())
    return out


# -- round trips ----------------------------------------------------------------------------------

def test_arrays_and_lengths_round_trip_and_the_header_records_the_identity(tmp_path):
    st = _cache_state()
    path = tmp_path / "state.bin"
    st.save(path)
    version, header, _ = _parts(path)
    assert version == statefile.VERSION == header["version"] and header["format"] == "onnxforge.state"
    (rec,) = header["bindings"]
    assert {k: rec[k] for k in ("name", "read_write", "dtype", "shape", "value", "capacity", "length")} == {
        "name": "cache", "read_write": True, "dtype": "float32", "shape": [1, CAP, 4], "value": "array",
        "capacity": CAP, "length": 4}
    (pay,) = rec["payloads"]
    assert pay["sha256"] == hashlib.sha256(st.values["cache"].tobytes()).hexdigest()
    again = make_state(_cache_model(), initial=path)
    np.testing.assert_array_equal(again.values["cache"], st.values["cache"])
    assert again.lengths == st.lengths == {"cache": 4}
    assert again.values["cache"].base is not None or again.values["cache"].flags.owndata
    np.testing.assert_array_equal(again.run(_feeds(4, 3.0))["updated"], st.run(_feeds(4, 3.0))["updated"])


def test_a_paged_cache_round_trips_page_by_page(tmp_path):
    st = _paged_state()
    cache = st.values["cache"]
    assert cache.page_formats() == ["int8", "int8", "float32", None] and cache.length == 9
    path = tmp_path / "paged.state"
    st.save(path)
    rec = _parts(path)[1]["bindings"][0]
    assert rec["value"] == "paged" and rec["paged"] == {
        "kv_heads": 2, "head_dim": 32, "page_size": 4, "num_pages": 4, "capacity": 16,
        "formats": ["float32", "int8"], "length": 9}
    again = make_state(_paged_model(), initial=path)
    got = again.values["cache"]
    assert got.length == 9 and got.page_formats() == cache.page_formats()
    for i in range(3):
        assert got.page_payload(i).tobytes() == cache.page_payload(i).tobytes()
    rng = np.random.default_rng(11)
    feeds = _paged_feeds(rng, 9, 1)
    np.testing.assert_array_equal(again.run(feeds)["y"], st.run(feeds)["y"])


def test_struct_fields_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    value = {"key": rng.standard_normal((1, 2, 8, 4), dtype=np.float32), "length": np.array(3, np.int64)}
    st = make_state(_struct_model(), initial={"cache": value})
    path = tmp_path / "s"
    st.save(path)
    got = make_state(_struct_model(), initial=path).values["cache"]
    assert set(got) == {"key", "length"}
    for k, a in value.items():
        assert got[k].dtype == a.dtype
        np.testing.assert_array_equal(got[k], a)


def test_a_file_from_another_model_with_identical_declarations_restores(tmp_path):
    st = _cache_state()
    path = tmp_path / "state"
    st.save(path)
    other = make_state(_cache_model(reduce="ReduceMax"), initial=path)  # another graph, same bindings
    np.testing.assert_array_equal(other.values["cache"], st.values["cache"])
    assert other.lengths == {"cache": 4}


def test_the_error_is_exported_and_restore_errors_stay_state_init_errors():
    assert of.StateFileError is StateFileError
    assert issubclass(StateFileError, StateInitError)


# -- identity ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("model, words", [
    (lambda: _cache_model(elem=F16), "dtype 'float32', but the model declares 'float16'"),
    (lambda: _cache_model(cap=16), "shape [1, 8, 4], but the model declares [1, 16, 4]"),
    (lambda: _cache_model(name="kv"), "no value for bound input(s) ['kv']"),
    (_paged_model, "saved as 'array', but the model declares a paged cache"),
])
def test_a_contiguous_file_with_another_declared_identity_is_refused(tmp_path, model, words):
    path = tmp_path / "state"
    _cache_state().save(path)
    with pytest.raises(StateFileError, match=str(path)) as e:
        make_state(model(), initial=path)
    assert words in str(e.value)
    assert e.value.path == str(path)


@pytest.mark.parametrize("kw, words", [
    ({"page": 8, "pages": 2}, "page_size 4, num_pages 4, but the model declares page_size 8, num_pages 2"),
    ({"pages": 8}, "num_pages 4, capacity 16, but the model declares num_pages 8, capacity 32"),
    ({"formats": ("float32", "int4")}, "formats ['float32', 'int8'], but the model declares "
                                       "formats ['float32', 'int4']"),
    ({"formats": ("float32",)}, "formats ['float32', 'int8']"),
    ({"heads": 1}, "kv_heads 2"),
])
def test_a_paged_file_with_another_geometry_or_policy_is_refused(tmp_path, kw, words):
    path = tmp_path / "paged"
    _paged_state().save(path)
    with pytest.raises(StateFileError) as e:
        make_state(_paged_model(**kw), initial=path)
    assert words in str(e.value)


def _set_length(n):
    def edit(h, _):
        h["bindings"][0]["length"] = n
    return edit


def _set(key, value, payload: bool = False):
    def edit(h, _):
        (h["bindings"][0]["payloads"][0] if payload else h["bindings"][0])[key] = value
    return edit


def _drop(key):
    def edit(h, _):
        h["bindings"][0]["payloads"][0].pop(key)
    return edit


def _flip_payload(h, data):
    data[5] ^= 0x10  # the header still holds the old checksum


def _forged_paged_length(h, data, n: int = 10**12):
    h["bindings"][0]["paged"]["length"] = n


@pytest.mark.parametrize("edit, words", [
    (_set_length(10**12), "published length 1000000000000 exceeds its capacity 8"),
    (_set_length(-1), "published length -1 is negative"),
    (_set_length([3, 2]), "2 published lengths for batch 1"),
    (_set_length("4"), "is not an int"),
    (_set("capacity", 9), "saved with capacity 9, but its array gives 8"),
    (lambda h, _: h["bindings"].clear(), "holds no value for bound input(s) ['cache']"),
    (lambda h, _: h["bindings"].append(dict(h["bindings"][0], name="x")), "which the model does not bind"),
    (lambda h, _: h["bindings"].append(h["bindings"][0]), "recorded twice"),
    (_flip_payload, "checksum mismatch"),
    (_drop("sha256"), "no SHA-256 checksum"),
    (_set("sha256", "0" * 64, payload=True), "checksum mismatch"),
    (_set("dtype", "float64", payload=True), "nbytes 128 is not that of float64"),
    (_set("shape", [1, 4, 8], payload=True), "the array has shape [1, 4, 8]"),
    (_set("offset", 64, payload=True), "at offset 64, expected 0"),
    (_set("dtype", "object", payload=True), "unknown dtype 'object'"),
    (_set("read_write", False), "saved with read_write False"),
    (lambda h, _: h.update(byteorder="big" if h["byteorder"] == "little" else "little"), "-endian machine"),
    (lambda h, _: h.update(version=3), "version 2"),
])
def test_a_forged_header_with_a_valid_digest_is_still_refused(tmp_path, edit, words):
    good, bad = tmp_path / "good", tmp_path / "bad"
    _cache_state().save(good)
    _forge(good, bad, edit)
    with pytest.raises(StateFileError) as e:
        make_state(_cache_model(), initial=bad)
    assert words in str(e.value) and str(bad) in str(e.value)


@pytest.mark.parametrize("edit, words", [
    (_forged_paged_length, "length 1000000000000 exceeds its capacity 16"),
    (lambda h, d: _forged_paged_length(h, d, -1), "length -1 is negative"),
    (_flip_payload, "checksum mismatch"),
])
def test_a_forged_paged_file_is_refused(tmp_path, edit, words):
    good, bad = tmp_path / "good", tmp_path / "bad"
    _paged_state().save(good)
    _forge(good, bad, edit)
    with pytest.raises(StateFileError, match=words):
        make_state(_paged_model(), initial=bad)


def test_pages_that_disagree_with_the_header_are_refused(tmp_path):
    """A payload whose checksum is right but whose pages hold another length."""
    good, bad = tmp_path / "good", tmp_path / "bad"
    _paged_state().save(good)

    def edit(h, data):
        h["bindings"][0]["paged"]["length"] = 8
    _forge(good, bad, edit)
    with pytest.raises(StateFileError, match="its pages hold length 9, the header records length 8"):
        make_state(_paged_model(), initial=bad)


# -- damaged and foreign files --------------------------------------------------------------------

def _old_format_file(path) -> None:
    """What State.save wrote before checksums: an .npz of arrays plus json entries."""
    with open(path, "wb") as fh:
        np.savez(fh, cache=np.zeros((1, CAP, 4), np.float32),
                 **{"onnxforge.lengths": np.array(json.dumps({"cache": 0})),
                    "onnxforge.fields": np.array("{}")})


def _zip_of_other_things(path) -> None:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("readme.txt", "hello")
        z.writestr("data/config.json", "{}")


def _npz_of_other_arrays(path) -> None:
    with open(path, "wb") as fh:
        np.savez(fh, a=np.arange(3), b=np.ones((2, 2)))


@pytest.mark.parametrize("make, words", [
    (_old_format_file, "format 1"),
    (_zip_of_other_things, "a zip archive of other things (readme.txt, data/config.json)"),
    (_npz_of_other_arrays, "a zip archive of other things (a.npy, b.npy)"),
    (lambda p: open(p, "wb").write(os.urandom(4096)), "not an onnxforge state file"),
    (lambda p: open(p, "wb").write(b"PK\x03\x04" + os.urandom(200)), "damaged zip archive"),
    (lambda p: open(p, "wb").write(b""), "truncated"),
    (lambda p: open(p, "wb").write(statefile.MAGIC[:7]), "truncated"),
    (lambda p: open(p, "wb").write(statefile.MAGIC), "truncated"),
    (lambda p: open(p, "w").write("cache = [0, 0, 0]\n"), "not an onnxforge state file"),
    (lambda p: _write_parts(p, {"format": "onnxforge.state"}, b"", version=1), "format version 1"),
    (lambda p: _write_parts(p, [1, 2], b""), "does not name the onnxforge.state format"),
])
def test_a_foreign_or_old_file_is_refused(tmp_path, make, words):
    path = tmp_path / "state.npz"
    make(path)
    with pytest.raises(StateFileError) as e:
        make_state(_cache_model(), initial=path)
    assert words in str(e.value) and str(path) in str(e.value)


def test_a_missing_file_is_a_state_file_error(tmp_path):
    with pytest.raises(StateFileError, match="cannot read saved state"):
        make_state(_cache_model(), initial=tmp_path / "missing")


@pytest.mark.parametrize("state", [_cache_state, _paged_state])
def test_every_truncation_is_refused(tmp_path, state):
    good = tmp_path / "good"
    state().save(good)
    data = good.read_bytes()
    cut = tmp_path / "cut"
    model = _cache_model() if state is _cache_state else _paged_model()
    for n in sorted({*range(0, len(data), max(1, len(data) // 200)), len(data) - 1}):
        cut.write_bytes(data[:n])
        with pytest.raises(StateFileError):
            make_state(model, initial=cut)
    cut.write_bytes(data + b"\0")
    with pytest.raises(StateFileError, match="longer than its payloads"):
        make_state(model, initial=cut)


def test_every_single_bit_flip_is_refused(tmp_path):
    """No byte of the file is unchecked: flipping any bit of any byte is a StateFileError."""
    good = tmp_path / "good"
    _cache_state().save(good)
    data = good.read_bytes()
    bad = tmp_path / "bad"
    model = _cache_model()
    for i in range(len(data)):
        flipped = bytearray(data)
        flipped[i] ^= 1 << (i % 8)
        bad.write_bytes(bytes(flipped))
        with pytest.raises(StateFileError):
            make_state(model, initial=bad)


def test_bit_flips_in_page_payloads_are_refused(tmp_path):
    good = tmp_path / "good"
    _paged_state().save(good)
    data = good.read_bytes()
    start = len(data) - len(_parts(good)[2])  # the paged cache's wire form, pages included
    bad = tmp_path / "bad"
    model = _paged_model()
    for i in range(start, len(data), 97):
        flipped = bytearray(data)
        flipped[i] ^= 0x80
        bad.write_bytes(bytes(flipped))
        with pytest.raises(StateFileError):
            make_state(model, initial=bad)


@pytest.mark.parametrize("state, model", [(_cache_state, _cache_model), (_paged_state, _paged_model)])
def test_reset_with_a_bad_file_leaves_values_and_lengths_as_they_were(tmp_path, state, model):
    st = state()
    good = tmp_path / "good"
    st.save(good)
    other = tmp_path / "other"
    _cache_state().save(other)
    data = good.read_bytes()
    bad = tmp_path / "bad"
    before = _fingerprint(st)

    def writes():
        yield lambda: bad.write_bytes(data[: len(data) // 2])  # truncated
        flipped = bytearray(data)
        flipped[-70] ^= 4
        yield lambda: bad.write_bytes(bytes(flipped))  # a payload bit flipped
        yield lambda: bad.write_bytes(os.urandom(1000))  # foreign
        yield lambda: _old_format_file(bad)
        yield lambda: _forge(good, bad, _forged_paged_length if state is _paged_state else _set_length(10**12))
        if state is _paged_state:
            yield lambda: bad.write_bytes(other.read_bytes())  # another declared identity
    for write in writes():
        write()
        with pytest.raises(StateFileError):
            st.reset(bad)
        assert _fingerprint(st) == before
    st.reset(good)  # still usable, and a good file restores
    assert st.lengths == before["lengths"]


# -- writing ------------------------------------------------------------------------------------------

class _DiskFull(io.RawIOBase):
    """A temporary file that takes ``room`` bytes, then fails like a full disk."""

    def __init__(self, fh, room: int):
        self.fh, self.room = fh, room

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        b = memoryview(b).cast("B")
        if len(b) > self.room:
            self.fh.write(b[: self.room])
            self.room = 0
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(b)
        return self.fh.write(b)

    def fileno(self) -> int:
        return self.fh.fileno()

    def flush(self) -> None:
        if not self.fh.closed:
            self.fh.flush()

    def close(self) -> None:
        self.fh.close()
        super().close()


@pytest.mark.parametrize("fraction", [0.0, 0.01, 0.5, 0.99])
def test_a_full_disk_leaves_the_previous_file_byte_identical_and_no_temporary_file(tmp_path, monkeypatch,
                                                                                  fraction):
    st = _cache_state()
    path = tmp_path / "state"
    st.save(path)
    before = path.read_bytes()
    st.run(_feeds(4, 9.0))
    real = statefile._open_temp
    room = int(fraction * len(before))  # the disk fills part-way through the new file
    monkeypatch.setattr(statefile, "_open_temp", lambda p: _DiskFull(real(p), room))
    with pytest.raises(OSError) as e:
        st.save(path)
    assert e.value.errno == errno.ENOSPC
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["state"]
    monkeypatch.undo()
    st.save(path)  # the state is unchanged and saves again
    assert make_state(_cache_model(), initial=path).lengths == {"cache": 6}


@pytest.mark.parametrize("fails", ["fsync", "replace"])
def test_a_failing_fsync_or_rename_leaves_the_previous_file(tmp_path, monkeypatch, fails):
    st = _cache_state()
    path = tmp_path / "state"
    st.save(path)
    before = path.read_bytes()
    st.run(_feeds(4, 9.0))

    def boom(*args):
        raise OSError(errno.EIO, "injected")
    monkeypatch.setattr(statefile.os, fails, boom)
    with pytest.raises(OSError, match="injected"):
        st.save(path)
    monkeypatch.undo()
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["state"]


def test_the_temporary_file_is_beside_the_target_and_replaced_onto_it(tmp_path, monkeypatch):
    seen: list[str] = []
    real = statefile._open_temp

    def spy(p):
        seen.append(p)
        return real(p)
    monkeypatch.setattr(statefile, "_open_temp", spy)
    path = tmp_path / "sub" / "state.bin"
    path.parent.mkdir()
    path.write_bytes(b"old")
    _cache_state().save(path)
    (tmp,) = seen
    assert os.path.dirname(tmp) == str(path.parent)
    assert os.path.basename(tmp).startswith(".state.bin.") and tmp.endswith(".tmp")
    assert not os.path.exists(tmp) and os.listdir(path.parent) == ["state.bin"]
    assert path.read_bytes().startswith(statefile.MAGIC)


def test_save_holds_the_lock_and_refuses_an_active_run(tmp_path, monkeypatch):
    st = _cache_state()
    seen: list[BaseException] = []

    def during_run(k):
        try:
            st.save(tmp_path / "during")
        except StateBusyError as e:
            seen.append(e)
    st.run(_feeds(4), after_step=during_run)
    assert seen and "State.save" in str(seen[0]) and not (tmp_path / "during").exists()

    real = statefile._open_temp

    def run_meanwhile(p):
        with pytest.raises(StateBusyError):
            st.run(_feeds(6))
        with pytest.raises(StateBusyError):
            st.reset()
        return real(p)
    monkeypatch.setattr(statefile, "_open_temp", run_meanwhile)
    st.save(tmp_path / "s")
    assert make_state(_cache_model(), initial=tmp_path / "s").lengths == {"cache": 6}


def test_a_closed_state_or_a_runtime_object_writes_nothing(tmp_path):
    class Opaque:
        nbytes = 8
        length = 0

        def buffer_addresses(self):
            return {0: 1}
    st = make_state(_struct_model(), initial={"cache": Opaque()})
    with pytest.raises(StateError, match="runtime object"):
        st.save(tmp_path / "s")
    st.close()
    with pytest.raises(StateClosedError):
        st.save(tmp_path / "s")
    assert os.listdir(tmp_path) == []


def test_fields_are_stored_in_native_byte_order_and_strings_are_refused(tmp_path):
    st = make_state(_struct_model(), initial={"cache": {"k": np.arange(4, dtype=">f4")}})
    st.save(tmp_path / "s")
    got = make_state(_struct_model(), initial=tmp_path / "s").values["cache"]["k"]
    assert got.dtype == np.float32 and got.dtype.isnative
    np.testing.assert_array_equal(got, [0, 1, 2, 3])
    st = make_state(_struct_model(), initial={"cache": {"s": np.array(["a"])}})
    with pytest.raises(StateError, match="'cache.s' holds <U1, which a state file cannot hold"):
        st.save(tmp_path / "t")
    assert os.listdir(tmp_path) == ["s"]
