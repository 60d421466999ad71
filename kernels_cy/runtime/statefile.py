"""State files: what :meth:`State.save` writes and ``make_state(model, initial=path)`` or
:meth:`State.reset` reads back.

Layout (format version 2; every integer little-endian)::

    offset 0   magic     b"\\x89onnxforge.state\\r\\n\\x1a\\n"   (20 bytes)
    20         version   uint32 = 2
    24         H         uint64, bytes of the header
    32         header    H bytes of UTF-8 JSON (below)
    32 + H     digest    32 bytes: SHA-256 of the header bytes
               padding   zero bytes up to a multiple of 64
    data       payloads  one after another, each followed by zero bytes up to a multiple of
                         64; the file ends after the last one's padding

The header names the format and version, the byte order, and one record per bound
input, in the model's binding order::

    {"format": "onnxforge.state", "version": 2, "byteorder": "little",
     "bindings": [
       {"name": "cache", "read_write": true, "dtype": "float32", "shape": [1, 64, 4],
        "value": "array", "capacity": 64, "length": 5,
        "payloads": [{"field": null, "dtype": "float32", "shape": [1, 64, 4],
                      "offset": 0, "nbytes": 1024, "sha256": "..."}]},
       {"name": "kv", "read_write": true, "dtype": null, "shape": null, "value": "paged",
        "paged": {"kv_heads": 2, "head_dim": 32, "page_size": 4, "num_pages": 16,
                  "capacity": 64, "formats": ["float32", "int8"], "length": 13},
        "payloads": [{"field": null, "dtype": "uint8", "shape": [5310], ...}]}]}

``dtype`` and ``shape`` of a binding are what the model declares for the input (a
symbolic dimension by its name, a struct input ``null``); ``value`` says how the value
is held: one array, a dict of field arrays (``"fields"``, a payload per field), or a
paged cache (``"paged"``: one payload, the cache's wire form of
:mod:`onnxforge.proto_ext.codecs.kvcache`, every page's encoded bytes). A READ_WRITE
array records its capacity (its size along the token axis: the axis its in-place
writer appends along, ``CacheUpdate``'s ``axis`` or ``GroupQueryAttention``'s sequence
axis, else -2) and its published length (an int, or one per batch row).

Guarantees. :func:`write_state` writes a temporary file beside the target, flushes and
fsyncs it, renames it onto the target and fsyncs the folder where the platform allows:
a reader sees the previous file or the new one, never a mix, and a failure (a full
disk...) removes the temporary file and re-raises, the previous file untouched.
:func:`read_state` checks every byte before it returns anything: the magic, the
version, the header's digest, that every padding byte is zero, each payload's
SHA-256, that the file ends where the last payload does, and the declared identity
against the restoring state's (each bound input's name, dtype, shape and kind, each
capacity and published length, a paged cache's page size, page count, KV heads, head
dimension and format policy); any failure is a :class:`StateFileError` naming the
file and what is wrong. The model itself is never hashed: a file saved from another
model with identical declarations restores.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import struct
import sys
import zipfile
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any, cast

import numpy as np
from onnxforge.graphbuilder.ir.core import Model
from onnxforge.kernels_cy.errors import BackendError, StateError, StateFileError
from onnxforge.kernels_cy.runtime.session import Length

__all__ = ["FORMAT", "MAGIC", "VERSION", "PagedGeometry", "Slot", "read_state", "token_axis",
           "write_state"]

FORMAT = "onnxforge.state"
VERSION = 2
MAGIC = b"\x89onnxforge.state\r\n\x1a\n"
_ALIGN = 64
_PREFIX = struct.Struct("<IQ")  # version, header bytes
_DIGEST = 32
_MAX_HEADER = 64 << 20  # a header larger than this is not one this module wrote
_CHUNK = 16 << 20
_OLD_MEMBERS = ("onnxforge.lengths.npy", "onnxforge.fields.npy", "onnxforge.paged.npy")


@dataclass(frozen=True, slots=True)
class PagedGeometry:
    """The identity of a paged cache: geometry, page count and format policy."""

    kv_heads: int
    head_dim: int
    page_size: int
    num_pages: int
    formats: tuple[str, ...]

    @property
    def capacity(self) -> int:
        return self.num_pages * self.page_size

    def as_json(self) -> dict[str, Any]:
        return {"kv_heads": self.kv_heads, "head_dim": self.head_dim, "page_size": self.page_size,
                "num_pages": self.num_pages, "capacity": self.capacity, "formats": list(self.formats)}


@dataclass(frozen=True, slots=True)
class Slot:
    """What a state declares for one bound input: the identity a state file must match."""

    name: str
    dtype: np.dtype | None  # None: a struct input
    shape: tuple[int | str | None, ...] | None
    read_write: bool
    paged: PagedGeometry | None = None  # the model types the input as a paged cache of this geometry
    axis: int | None = None  # token axis of a READ_WRITE array (None: the default, -2)

    def declared(self) -> dict[str, Any]:
        return {"name": self.name, "read_write": self.read_write,
                "dtype": None if self.dtype is None else self.dtype.name,
                "shape": None if self.shape is None else list(self.shape)}


def token_axis(model: Model, name: str) -> int | None:
    """The axis along which the model writes input ``name`` in place (its capacity axis):
    ``CacheUpdate``'s ``axis``, ``GroupQueryAttention``'s sequence axis (2) for its past
    key and value, else None (the default, -2). Reads the input's uses, not the graph."""
    inp = next((v for v in model.graph.inputs if v.name == name), None)
    if inp is None:
        return None
    for node, index in inp.uses():
        if node.op_type == "CacheUpdate" and index == 0:
            return int(node.attr("axis", -2))
        if node.op_type == "GroupQueryAttention" and index in (3, 4):
            return 2
    return None


def _capacity(slot: Slot, shape: Sequence[int]) -> int | None:
    """Size of a READ_WRITE array along its token axis (None: a scalar, or not READ_WRITE)."""
    if not slot.read_write or not shape:
        return None
    axis = -2 if slot.axis is None else slot.axis
    if len(shape) == 1:
        axis = 0
    if not -len(shape) <= axis < len(shape):
        return None
    return int(shape[axis])


# -- dtypes ------------------------------------------------------------------------------------

_DTYPES: dict[str, np.dtype] = {}


def _dtype(name: str) -> np.dtype | None:
    """The numpy dtype a state file may hold under ``name`` (every ONNX element type numpy
    represents, by its numpy name), or None."""
    if not _DTYPES:
        from onnx import TensorProto

        from onnxforge.proto_ext.dtypes import np_dtype
        from onnxforge.proto_ext.errors import CodecError

        for code in TensorProto.DataType.values():
            with contextlib.suppress(CodecError):
                d = np_dtype(code)
                if d != np.dtype(object):
                    _DTYPES[d.name] = d
    return _DTYPES.get(name)


def _digest(a: np.ndarray) -> str:
    h = hashlib.sha256()
    if a.size:
        h.update(_bytes_view(a))
    return h.hexdigest()


def _bytes_view(a: np.ndarray) -> memoryview:
    """The bytes of a C-contiguous, non-empty array (no copy)."""
    return memoryview(cast(Any, a.reshape(-1).view(np.uint8)))


def _pad(n: int) -> int:
    return -n % _ALIGN


# -- writing -----------------------------------------------------------------------------------

@dataclass(slots=True)
class _Payload:
    binding: int
    field: str | None
    array: np.ndarray  # C-contiguous
    offset: int = 0

    def record(self) -> dict[str, Any]:
        return {"field": self.field, "dtype": self.array.dtype.name, "shape": list(self.array.shape),
                "offset": self.offset, "nbytes": int(self.array.nbytes), "sha256": _digest(self.array)}


def _json_length(v: Length) -> int | list[int]:
    return int(v) if isinstance(v, (int, np.integer)) else [int(x) for x in v]


def _storable(what: str, a: Any) -> np.ndarray:
    """``a`` as the file holds it: C-contiguous, native byte order (a copy only if needed)."""
    if not isinstance(a, np.ndarray) or _dtype(a.dtype.name) is None:
        raise StateError(f"State.save: {what!r} holds {getattr(a, 'dtype', type(a).__name__)}, which a "
                         f"state file cannot hold (numeric and boolean arrays only)")
    if not a.dtype.isnative:
        a = a.astype(a.dtype.newbyteorder("="))
    return np.ascontiguousarray(a)


def write_state(path: str | os.PathLike, slots: Sequence[Slot], values: Mapping[str, Any],
                lengths: Mapping[str, Length]) -> None:
    """Write ``values`` (by bound input: an array, a dict of field arrays or a
    :class:`~onnxforge.kernels_cy.paged.pages.PagedKVCache`) and the published ``lengths`` of
    the READ_WRITE arrays to ``path``, atomically (see the module docstring).

    A value of another kind (a runtime object with no file form) is a
    :class:`StateError` raised before any file is created; an ``OSError`` while writing
    propagates after the temporary file is removed, the previous file untouched."""
    from onnxforge.kernels_cy.paged.pages import PagedKVCache

    records: list[dict[str, Any]] = []
    payloads: list[_Payload] = []
    for i, slot in enumerate(slots):
        a = values[slot.name]
        rec = slot.declared()
        if isinstance(a, np.ndarray):
            a = _storable(slot.name, a)
            rec.update(value="array", capacity=_capacity(slot, a.shape),
                       length=_json_length(lengths[slot.name]) if slot.name in lengths else None)
            payloads.append(_Payload(i, None, a))
        elif isinstance(a, dict):
            rec.update(value="fields")
            payloads.extend(_Payload(i, f, _storable(f"{slot.name}.{f}", x)) for f, x in a.items())
        elif isinstance(a, PagedKVCache):
            from onnxforge.proto_ext.codecs.kvcache import PagedCacheValue, cache_to_bytes

            geometry = PagedGeometry(a.kv_heads, a.head_dim, a.page_size, a.num_pages, tuple(a.formats))
            rec.update(value="paged", paged={**geometry.as_json(), "length": int(a.length)})
            data = cache_to_bytes({slot.name: PagedCacheValue.from_cache(a)})
            payloads.append(_Payload(i, None, np.frombuffer(data, np.uint8)))
        else:
            raise StateError(f"State.save: bound input {slot.name!r} holds a {type(a).__name__} runtime "
                             f"object, which has no file form to write")
        records.append(rec)
    end = 0
    for p in payloads:
        p.offset = end
        end += p.array.nbytes + _pad(p.array.nbytes)
    for p in payloads:
        records[p.binding].setdefault("payloads", []).append(p.record())
    for rec in records:
        rec.setdefault("payloads", [])
    header = json.dumps({"format": FORMAT, "version": VERSION, "byteorder": sys.byteorder,
                         "bindings": records}, separators=(",", ":")).encode()

    def write(fh: IO[bytes]) -> None:
        head = MAGIC + _PREFIX.pack(VERSION, len(header)) + header + hashlib.sha256(header).digest()
        fh.write(head + bytes(_pad(len(head))))
        for p in payloads:
            if p.array.nbytes:
                fh.write(_bytes_view(p.array))
            fh.write(bytes(_pad(p.array.nbytes)))

    _replace_atomically(path, write)


def _open_temp(path: str) -> IO[bytes]:
    """A new file at ``path`` for writing (it must not exist); the write tests wrap it."""
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0),
                             0o666), "wb")


def _replace_atomically(path: str | os.PathLike, write: Callable[[IO[bytes]], None]) -> None:
    """``write`` a temporary file beside ``path``, fsync it, rename it onto ``path`` and
    fsync the folder; on any failure remove the temporary file and re-raise."""
    target = os.path.abspath(os.fspath(path))
    folder, name = os.path.split(target)
    tmp = os.path.join(folder, f".{name}.{secrets.token_hex(8)}.tmp")
    try:
        with _open_temp(tmp) as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_folder(folder)


def _fsync_folder(folder: str) -> None:
    """Make the rename durable where the platform lets a folder be fsynced."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # e.g. a file system that refuses fsync on folders: the rename is done
        pass
    finally:
        os.close(fd)


# -- reading -----------------------------------------------------------------------------------

class _Reader:
    """Exact reads from the state file, every failure a StateFileError naming it."""

    def __init__(self, path: str, fh: IO[bytes], size: int):
        self.path, self.fh, self.size = path, fh, size
        self.pos = 0

    def fail(self, what: str) -> StateFileError:
        return StateFileError(f"state file {self.path!r}: {what}; nothing was restored", path=self.path)

    def read(self, n: int, what: str) -> bytes:
        if self.pos + n > self.size:
            raise self.fail(f"truncated: {what} needs {n} bytes at offset {self.pos}, the file has "
                            f"{self.size} bytes")
        data = self.fh.read(n)
        if len(data) != n:
            raise self.fail(f"truncated while reading {what}")
        self.pos += n
        return data

    def zeros(self, n: int, what: str) -> None:
        if any(self.read(n, what)):
            raise self.fail(f"{what} holds nonzero bytes (the file is corrupted)")

    def into(self, a: np.ndarray, what: str) -> None:
        """Fill ``a`` (C-contiguous) with the next ``a.nbytes`` bytes."""
        n = a.nbytes
        if self.pos + n > self.size:
            raise self.fail(f"truncated: {what} needs {n} bytes at offset {self.pos}, the file has "
                            f"{self.size} bytes")
        view = _bytes_view(a) if n else memoryview(bytearray())
        done = 0
        while done < n:
            got = cast(Any, self.fh).readinto(view[done:done + _CHUNK])
            if not got:
                raise self.fail(f"truncated while reading {what}")
            done += got
        self.pos += n


def read_state(path: str | os.PathLike, slots: Sequence[Slot]
               ) -> tuple[dict[str, Any], dict[str, Length]]:
    """The values and published lengths a state file holds for a state declaring ``slots``,
    every byte and the whole declared identity checked (see the module docstring); a
    :class:`StateFileError` otherwise. The arrays are new, writable and C-contiguous,
    the paged caches new :class:`~onnxforge.kernels_cy.paged.pages.PagedKVCache` objects."""
    p = os.fspath(path)
    try:
        with open(p, "rb") as fh:
            r = _Reader(p, fh, os.fstat(fh.fileno()).st_size)
            body = _header(r)
            plan = _match(r, body, slots)
            return _payloads(r, plan)
    except StateFileError:
        raise
    except OSError as e:
        raise StateFileError(f"cannot read saved state {p!r}: {e}", path=p) from None
    except (ValueError, TypeError, KeyError, IndexError, OverflowError, MemoryError, EOFError,
            UnicodeDecodeError, zlib.error, struct.error) as e:  # a defect of the file this module missed
        raise StateFileError(f"state file {p!r} does not restore: {type(e).__name__}: {e}; nothing "
                             f"was restored", path=p) from None


def _header(r: _Reader) -> dict[str, Any]:
    head = r.fh.read(len(MAGIC))
    r.pos = len(head)
    if head != MAGIC:
        if head.startswith(b"PK"):
            raise r.fail(_zip_verdict(r.path))
        if len(head) < len(MAGIC) and MAGIC.startswith(head):
            raise r.fail(f"truncated: {len(head)} bytes, not even the file signature")
        raise r.fail("not an onnxforge state file (no state file signature)")
    version, n = _PREFIX.unpack(r.read(_PREFIX.size, "the version and header size"))
    if version != VERSION:
        raise r.fail(f"format version {version}, but this onnxforge reads version {VERSION}")
    if n > min(r.size, _MAX_HEADER):
        raise r.fail(f"header size {n} exceeds the file ({r.size} bytes): truncated or corrupted")
    data = r.read(n, "the header")
    digest = r.read(_DIGEST, "the header checksum")
    if hashlib.sha256(data).digest() != digest:
        raise r.fail("the header checksum does not match (the file is corrupted)")
    r.zeros(_pad(r.pos), "the padding after the header")
    try:
        body = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:  # only a writer's defect gets here
        raise r.fail(f"the header is not JSON ({e})") from None
    _check(r, isinstance(body, dict) and body.get("format") == FORMAT and body.get("version") == VERSION,
           "the header does not name the onnxforge.state format, version 2")
    _check(r, body.get("byteorder") == sys.byteorder,
           f"written on a {body.get('byteorder')}-endian machine; this one is {sys.byteorder}-endian")
    _check(r, isinstance(body.get("bindings"), list), "the header lists no bindings")
    return body


def _zip_verdict(path: str) -> str:
    """Why a zip archive is no state file: the old format, or something else."""
    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError):
        return "a damaged zip archive, not an onnxforge state file"
    if any(m in names for m in _OLD_MEMBERS):
        return ("written by an older onnxforge in format 1 (an .npz without checksums or declared "
                "identity), which cannot be checked; restore it with that version and save it again")
    shown = ", ".join(names[:6]) + (", ..." if len(names) > 6 else "")
    return f"a zip archive of other things ({shown}), not an onnxforge state file"


def _check(r: _Reader, ok: bool, what: str) -> None:
    if not ok:
        raise r.fail(what)


def _is_int(v: Any, low: int = 0) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= low


@dataclass(slots=True)
class _Entry:
    """One payload to read: where it goes, what it must be."""

    slot: Slot
    field: str | None
    dtype: np.dtype
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    sha256: str


@dataclass(slots=True)
class _Plan:
    slots: list[tuple[Slot, dict[str, Any]]]
    entries: list[_Entry]


def _match(r: _Reader, body: dict[str, Any], slots: Sequence[Slot]) -> _Plan:
    """Check the header's records against the state's declarations; the payloads to read."""
    recs = body["bindings"]
    by_name: dict[str, dict[str, Any]] = {}
    for i, rec in enumerate(recs):
        _check(r, isinstance(rec, dict) and isinstance(rec.get("name"), str),
               f"bindings[{i}] of the header is not a binding record")
        _check(r, rec["name"] not in by_name, f"bound input {rec['name']!r} is recorded twice")
        by_name[rec["name"]] = rec
    missing = [s.name for s in slots if s.name not in by_name]
    if missing:
        raise r.fail(f"holds no value for bound input(s) {missing} of the model")
    extra = [n for n in by_name if n not in {s.name for s in slots}]
    if extra:
        raise r.fail(f"holds bound input(s) {extra}, which the model does not bind; it binds "
                     f"{[s.name for s in slots]}")
    plan = _Plan([], [])
    for slot in slots:
        rec = by_name[slot.name]
        what = f"bound input {slot.name!r}"
        kind = rec.get("value")
        if slot.dtype is not None:
            _check(r, kind == "array", f"{what}: saved as {kind!r}, but the model declares a tensor")
        elif slot.paged is not None:
            _check(r, kind == "paged", f"{what}: saved as {kind!r}, but the model declares a paged "
                                       f"cache ({_geometry_text(slot.paged.as_json())})")
        else:
            _check(r, kind in ("fields", "paged"), f"{what}: saved as {kind!r}, not a struct value")
        for key, want in slot.declared().items():
            got = rec.get(key)
            if json.dumps(got) != json.dumps(want):  # strictly: true is not 1
                raise r.fail(f"{what}: saved with {key} {got!r}, but the model declares {want!r}")
        if kind == "paged":
            _check_paged(r, slot, rec.get("paged"))
        payloads = rec.get("payloads")
        _check(r, isinstance(payloads, list), f"{what}: the header lists no payloads")
        if kind != "fields":
            _check(r, len(payloads) == 1, f"{what}: {len(payloads)} payloads recorded, one expected")
        fields: set[str] = set()
        for j, pay in enumerate(payloads):
            entry = _entry(r, slot, kind, j, pay)
            if kind == "fields":
                _check(r, isinstance(entry.field, str) and bool(entry.field) and "." not in entry.field
                       and entry.field not in fields, f"{what}: payload {j} has no distinct field name")
                fields.add(str(entry.field))
            else:
                _check(r, entry.field is None, f"{what}: payload {j} names a field of a non-struct value")
            plan.entries.append(entry)
        if kind == "array":
            _check_length(r, slot, rec, plan.entries[-1].shape)
        plan.slots.append((slot, rec))
    end = 0
    for e in plan.entries:
        _check(r, e.offset == end, f"payload of {e.slot.name!r} at offset {e.offset}, expected {end}")
        end += e.nbytes + _pad(e.nbytes)
    data_end = r.pos + end
    if data_end != r.size:
        state = "truncated" if data_end > r.size else "longer than its payloads"
        raise r.fail(f"{state}: the payloads end at byte {data_end}, the file has {r.size} bytes")
    return plan


def _geometry_text(g: Mapping[str, Any]) -> str:
    return ", ".join(f"{k} {g.get(k)!r}" for k in ("page_size", "num_pages", "kv_heads", "head_dim",
                                                   "formats"))


def _check_paged(r: _Reader, slot: Slot, g: Any) -> None:
    what = f"paged cache {slot.name!r}"
    keys = ("kv_heads", "head_dim", "page_size", "num_pages", "capacity", "length")
    if isinstance(g, dict) and isinstance(g.get("length"), int) and g["length"] < 0:
        raise r.fail(f"{what}: length {g['length']} is negative")
    _check(r, isinstance(g, dict) and all(_is_int(g.get(k)) for k in keys)
           and isinstance(g.get("formats"), list) and all(isinstance(f, str) for f in g["formats"]),
           f"{what}: the header records no page geometry")
    _check(r, g["capacity"] == g["num_pages"] * g["page_size"],
           f"{what}: capacity {g['capacity']} is not num_pages * page_size")
    if g["length"] > g["capacity"]:
        raise r.fail(f"{what}: length {g['length']} exceeds its capacity {g['capacity']}")
    if slot.paged is not None:
        want = slot.paged.as_json()
        diff = [k for k in ("page_size", "num_pages", "capacity", "kv_heads", "head_dim", "formats")
                if g[k] != want[k]]
        if diff:
            raise r.fail(f"{what}: saved with " + ", ".join(f"{k} {g[k]!r}" for k in diff)
                         + ", but the model declares " + ", ".join(f"{k} {want[k]!r}" for k in diff))


def _entry(r: _Reader, slot: Slot, kind: Any, j: int, pay: Any) -> _Entry:
    what = f"bound input {slot.name!r}, payload {j}"
    _check(r, isinstance(pay, dict), f"{what}: not a payload record")
    dtype = _dtype(pay.get("dtype")) if isinstance(pay.get("dtype"), str) else None
    if dtype is None:
        raise r.fail(f"{what}: unknown dtype {pay.get('dtype')!r}")
    shape = pay.get("shape")
    _check(r, isinstance(shape, list) and all(_is_int(d) for d in shape), f"{what}: no valid shape")
    nbytes = dtype.itemsize
    for d in shape:
        nbytes *= d
    _check(r, pay.get("nbytes") == nbytes and _is_int(pay.get("offset")),
           f"{what}: nbytes {pay.get('nbytes')!r} is not that of {dtype.name} {shape}")
    digest = pay.get("sha256")
    _check(r, isinstance(digest, str) and len(digest) == 64,
           f"{what}: no SHA-256 checksum recorded")
    if kind == "array" and slot.dtype is not None and slot.shape is not None:
        _check(r, dtype == slot.dtype, f"bound input {slot.name!r}: the array is {dtype.name}, but the "
                                       f"model declares {slot.dtype.name}")
        bad = len(shape) != len(slot.shape) or any(_is_int(d) and d != n for d, n in zip(slot.shape, shape))
        _check(r, not bad, f"bound input {slot.name!r}: the array has shape {shape}, but the model "
                           f"declares {list(slot.shape)}")
    if kind == "paged":
        _check(r, dtype == np.dtype(np.uint8) and len(shape) == 1,
               f"paged cache {slot.name!r}: its payload is not bytes")
    return _Entry(slot, pay.get("field"), dtype, tuple(shape), pay["offset"], nbytes, digest)


def _check_length(r: _Reader, slot: Slot, rec: dict[str, Any], shape: tuple[int, ...]) -> None:
    what = f"bound input {slot.name!r}"
    capacity = _capacity(slot, shape)
    _check(r, rec.get("capacity") == capacity,
           f"{what}: saved with capacity {rec.get('capacity')!r}, but its array gives {capacity!r}")
    length = rec.get("length")
    if not slot.read_write:
        _check(r, length is None, f"{what}: a READ_ONLY input has no published length")
        return
    rows = [length] if not isinstance(length, list) else length
    _check(r, bool(rows) and all(isinstance(n, int) and not isinstance(n, bool) for n in rows),
           f"{what}: published length {length!r} is not an int or one int per batch row")
    if isinstance(length, list):
        _check(r, len(rows) in (1, shape[0] if shape else 1),
               f"{what}: {len(rows)} published lengths for batch {shape[0] if shape else 1}")
    low, high = min(rows), max(rows)
    if low < 0:
        raise r.fail(f"{what}: published length {length} is negative")
    if high > (capacity or 0):
        raise r.fail(f"{what}: published length {length} exceeds its capacity {capacity or 0}")


def _payloads(r: _Reader, plan: _Plan) -> tuple[dict[str, Any], dict[str, Length]]:
    """Read and verify every payload, then build the values; nothing is built before the
    last byte is checked."""
    got: list[np.ndarray] = []
    for e in plan.entries:
        what = f"the payload of {e.slot.name!r}" + (f" field {e.field!r}" if e.field else "")
        a = np.empty(e.shape, e.dtype)
        r.into(a, what)
        if _digest(a) != e.sha256:
            raise r.fail(f"{what}: checksum mismatch (the file is corrupted)")
        r.zeros(_pad(e.nbytes), f"the padding after {what}")
        got.append(a)
    _check(r, not r.fh.read(1), "longer than its payloads")
    values: dict[str, Any] = {}
    lengths: dict[str, Length] = {}
    arrays: Iterator[np.ndarray] = iter(got)
    entries = iter(plan.entries)
    for slot, rec in plan.slots:
        kind = rec["value"]
        if kind == "fields":
            values[slot.name] = {next(entries).field: next(arrays) for _ in rec["payloads"]}
            continue
        next(entries)
        a = next(arrays)
        if kind == "paged":
            values[slot.name] = _paged(r, slot, rec["paged"], a)
            continue
        values[slot.name] = a
        if slot.read_write:
            n = rec["length"]
            lengths[slot.name] = tuple(n) if isinstance(n, list) else n
    return values, lengths


def _paged(r: _Reader, slot: Slot, g: dict[str, Any], data: np.ndarray) -> Any:
    """A new cache from its wire form, each page verified (rules K6-K9) and matched to the record."""
    from onnxforge.kernels_cy.paged.pages import PagedKVCache
    from onnxforge.proto_ext.codecs.kvcache import cache_from_bytes
    from onnxforge.proto_ext.errors import OnnxforgeError

    what = f"paged cache {slot.name!r}"
    try:
        caches = cache_from_bytes(data.tobytes())
    except (OnnxforgeError, ValueError) as e:
        raise r.fail(f"{what} does not load: {e}") from None
    v = caches.get(slot.name)
    if v is None or len(caches) != 1:
        raise r.fail(f"{what}: its payload holds the caches {sorted(caches)}")
    held = {"kv_heads": v.kv_heads, "head_dim": v.head_dim, "page_size": v.page_size,
            "num_pages": v.num_pages, "formats": list(v.formats), "length": v.length}
    diff = [k for k, x in held.items() if g[k] != x]
    if diff:
        raise r.fail(f"{what}: its pages hold " + ", ".join(f"{k} {held[k]!r}" for k in diff)
                     + ", the header records " + ", ".join(f"{k} {g[k]!r}" for k in diff))
    try:
        c = PagedKVCache(v.kv_heads, v.head_dim, v.page_size, v.num_pages, formats=v.formats)
        for i, page in enumerate(v.pages):
            if page is not None:
                c.set_page(i, page[0], np.frombuffer(page[1], np.uint8).copy())
        c.set_length(v.length)
    except BackendError as e:
        raise r.fail(f"{what}: {e}") from None
    return c
