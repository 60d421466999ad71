"""Safe external data: parse, confine, bounds-check and memory-map payload files.

Dense ``TensorProto`` payloads and ``EncodedValueProto`` payloads may live in
files next to the model (``data_location == EXTERNAL``). This module handles
those references without protobuf: callers pass the ``external_data`` entries
as ``(key, value)`` string pairs.

Every check happens before a single payload byte is read:

* :func:`parse_external_entries` enforces rule P4 (known keys, each at most
  once, non-empty ``location``, base-10 non-negative ``offset``/``length``).
* :func:`resolve_location` enforces rule P5: ``location`` is a relative path
  that stays inside the model directory after symlinks are resolved and names
  an existing regular file; :func:`check_location` does the part of it that
  needs no file system, :func:`check_extent` adds the bounds check below.
* :meth:`ExternalDataCache.map` checks ``offset + length`` against the file
  size, then maps the file read-only and returns a read-only ``memoryview``
  of exactly the referenced bytes. Tensors stored in one file share one
  mapping; a returned view keeps its mapping alive on its own.

Example::

    ref = parse_external_entries(
        [("location", "weights.bin"), ("offset", "4096"), ("length", "64")],
        path="graph.initializer['w'].external_data",
    )
    with ExternalDataCache("/models/m") as cache:
        view = cache.map(ref, "graph.initializer['w'].external_data")
        w = as_numpy(view, "<f4", (4, 4))   # read-only, zero-copy

Backslashes in ``location`` are path separators only on Windows; on other
systems they are literal name characters, but a ``..`` component is rejected
with either separator so that a model is unsafe nowhere.

The optional ``checksum`` entry is kept but not verified: verifying it would
read the whole file, which memory mapping exists to avoid.

A mapped file must not be truncated while views of it are alive: the
operating system reports access beyond the new end as a bus error.
"""
from __future__ import annotations

import math
import mmap
import os
import re
import stat
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path, PureWindowsPath
from typing import Any

import numpy as np
import numpy.typing as npt

from onnxforge.proto_ext.errors import ExternalDataError

__all__ = [
    "ExternalDataCache",
    "ExternalRef",
    "as_numpy",
    "check_extent",
    "check_location",
    "map_external",
    "parse_external_entries",
    "resolve_location",
    "write_external",
]

_KEYS = ("location", "offset", "length", "checksum")
_DECIMAL = re.compile(r"[0-9]+", re.ASCII)
_INT64_MAX = 2**63 - 1
_SEPARATORS = re.compile(r"[\\/]")
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_BINARY = getattr(os, "O_BINARY", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def _error(rule: str, path: str, message: str) -> ExternalDataError:
    return ExternalDataError(message, rule=rule, path=path)


@dataclass(frozen=True, slots=True)
class ExternalRef:
    """Where a payload lives: ``length`` bytes at ``offset`` of the file ``location``.

    ``location`` is relative to the model directory. ``length`` ``None`` means
    "up to the end of the file" (allowed for dense tensors only).
    """

    location: str
    offset: int = 0
    length: int | None = None
    checksum: str | None = None

    def to_entries(self) -> list[tuple[str, str]]:
        """The ``external_data`` key/value pairs that :func:`parse_external_entries` reads back."""
        entries = [("location", self.location), ("offset", str(self.offset))]
        if self.length is not None:
            entries.append(("length", str(self.length)))
        if self.checksum is not None:
            entries.append(("checksum", self.checksum))
        return entries


def _parse_int(key: str, value: str, path: str) -> int:
    if not _DECIMAL.fullmatch(value):
        raise _error("P4", path, f"{key}={value!r} is not a non-negative base-10 integer")
    digits = value.lstrip("0") or "0"
    if len(digits) > 19 or int(digits) > _INT64_MAX:
        raise _error("P4", path, f"{key}={value!r} does not fit in a signed 64-bit integer")
    return int(digits)


def parse_external_entries(
    entries: Iterable[tuple[str, str]],
    *,
    path: str,
    require_length: bool = False,
) -> ExternalRef:
    """Validate ``external_data`` key/value pairs (rule P4) and build an :class:`ExternalRef`.

    Keys must be among ``location``, ``offset``, ``length`` and ``checksum``,
    each at most once; ``location`` is required and non-empty; ``offset``
    (default 0) and ``length`` are non-negative base-10 integers.
    ``require_length=True`` (encoded values) makes ``length`` mandatory.
    Raises :class:`ExternalDataError` naming ``path`` and the broken rule.
    """
    seen: dict[str, str] = {}
    for index, entry in enumerate(entries):
        if (
            not isinstance(entry, tuple)
            or len(entry) != 2
            or not isinstance(entry[0], str)
            or not isinstance(entry[1], str)
        ):
            raise _error("P4", path, f"entry #{index} is {entry!r}, expected a (key, value) pair of strings")
        key, value = entry
        if key not in _KEYS:
            raise _error("P4", path, f"unknown key {key!r}; allowed keys are {', '.join(_KEYS)}")
        if key in seen:
            raise _error("P4", path, f"key {key!r} occurs more than once")
        seen[key] = value
    location = seen.get("location")
    if location is None:
        raise _error("P4", path, "missing required key 'location'")
    if not location:
        raise _error("P4", path, "'location' is empty")
    offset = _parse_int("offset", seen["offset"], path) if "offset" in seen else 0
    length = _parse_int("length", seen["length"], path) if "length" in seen else None
    if require_length and length is None:
        raise _error("P4", path, "missing required key 'length' (external encoded payloads state their length)")
    return ExternalRef(location=location, offset=offset, length=length, checksum=seen.get("checksum"))


def check_location(location: object, *, path: str) -> str:
    """Lexical P5 checks, which need no file system access (for when the model
    directory is unknown): a non-empty string without NUL bytes, relative, with no
    ``..`` component. Returns ``location``; raises :class:`ExternalDataError`."""
    if not isinstance(location, str):
        raise _error("P5", path, f"location must be a string, got {type(location).__name__}")
    if not location:
        raise _error("P5", path, "location is empty")
    if "\0" in location:
        raise _error("P5", path, f"location {location!r} contains a NUL byte")
    windows = PureWindowsPath(location)
    if location[0] in "/\\" or windows.drive or windows.root or os.path.isabs(location):
        raise _error("P5", path, f"location {location!r} is absolute; it must be relative to the model directory")
    if ".." in _SEPARATORS.split(location):
        raise _error("P5", path, f"location {location!r} has a '..' component; it must stay inside the model directory")
    return location


def _real_dir(model_dir: str | os.PathLike[str], path: str) -> str:
    try:
        text = os.fspath(model_dir)
    except TypeError:
        raise _error("P5", path, f"model directory must be a path, got {type(model_dir).__name__}") from None
    if not isinstance(text, str) or "\0" in text:
        raise _error("P5", path, f"model directory {text!r} is not a valid path")
    return os.path.realpath(text)


def _inside(directory: str, candidate: str) -> bool:
    directory, candidate = os.path.normcase(directory), os.path.normcase(candidate)
    try:
        return os.path.commonpath([directory, candidate]) == directory
    except ValueError:  # different drives on Windows
        return False


def _resolve(model_dir: str | os.PathLike[str], location: str, path: str) -> tuple[str, os.stat_result]:
    check_location(location, path=path)
    directory = _real_dir(model_dir, path)
    target = os.path.realpath(os.path.join(directory, location))
    if not _inside(directory, target):
        raise _error(
            "P5", path, f"location {location!r} resolves to {target!r}, outside the model directory {directory!r}"
        )
    try:
        info = os.stat(target)
    except FileNotFoundError:
        raise _error("P5", path, f"location {location!r}: file {target!r} does not exist") from None
    except OSError as exc:
        raise _error("P5", path, f"location {location!r}: cannot stat {target!r}: {exc.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise _error("P5", path, f"location {location!r}: {target!r} is not a regular file")
    return target, info


def resolve_location(model_dir: str | os.PathLike[str], location: str, *, path: str) -> Path:
    """Return the real path of ``location`` inside ``model_dir`` (rule P5).

    Rejected, without opening the file: non-string or empty locations, NUL
    bytes, absolute paths (``/x``, ``C:\\x``, ``C:x``, ``\\\\server\\share``,
    ``\\x``), any ``..`` component (``/`` or ``\\`` separated), targets that
    leave the model directory once symlinks are resolved, and targets that
    do not exist or are not regular files. Raises :class:`ExternalDataError`
    naming ``path``.
    """
    return Path(_resolve(model_dir, location, path)[0])


def _checked_range(ref: ExternalRef, size: int, path: str) -> tuple[int, int]:
    """``(offset, length)`` of ``ref`` once it is known to fit in ``size`` bytes."""
    offset, length = ref.offset, ref.length
    if type(offset) is not int or offset < 0:
        raise _error("P4", path, f"offset={offset!r} is not a non-negative integer")
    if length is not None and (type(length) is not int or length < 0):
        raise _error("P4", path, f"length={length!r} is not a non-negative integer")
    if offset > size:
        raise _error("P5", path, f"offset {offset} lies beyond the end of {ref.location!r} ({size} bytes)")
    if length is None:
        length = size - offset
    elif offset + length > size:
        raise _error(
            "P5",
            path,
            f"offset {offset} + length {length} = {offset + length} exceeds the size of {ref.location!r} ({size} bytes)",
        )
    return offset, length


def _extent(model_dir: str | os.PathLike[str], ref: ExternalRef, path: str
            ) -> tuple[str, os.stat_result, int, int]:
    """Real path, stat result, offset and length of ``ref`` once P5 holds for it."""
    if not isinstance(ref, ExternalRef):
        raise _error("P4", path, f"expected an ExternalRef, got {type(ref).__name__}")
    target, info = _resolve(model_dir, ref.location, path)
    offset, length = _checked_range(ref, info.st_size, path)
    return target, info, offset, length


def check_extent(model_dir: str | os.PathLike[str], ref: ExternalRef, *, path: str) -> int:
    """Check rule P5 for ``ref`` without opening the file: the location resolves to a
    regular file inside ``model_dir`` and ``[offset, offset + length)`` fits in it.
    Returns the length in bytes; raises :class:`ExternalDataError` naming ``path``."""
    return _extent(model_dir, ref, path)[3]


_Key = tuple[str, int, int, int, int]


def _try_close(mapping: mmap.mmap) -> None:
    """Close ``mapping`` unless views still export it; those keep it alive until released."""
    try:
        mapping.close()
    except BufferError:
        pass


class ExternalDataCache:
    """Read-only mappings of the external data files of one model directory.

    One mapping per file version (real path, device, inode, size, mtime): many
    tensors in one file share it. Views returned by :meth:`map` keep their
    mapping alive, so :meth:`close` never invalidates a view still in use; it
    only drops the cache's references (mappings without live views are
    unmapped at once, the others when their last view goes away).
    """

    __slots__ = ("_directory", "_lock", "_maps")

    def __init__(self, model_dir: str | os.PathLike[str]) -> None:
        self._directory = model_dir
        self._lock = threading.Lock()
        self._maps: dict[_Key, mmap.mmap] = {}

    @property
    def model_dir(self) -> str | os.PathLike[str]:
        """The directory that every ``location`` is relative to."""
        return self._directory

    def __len__(self) -> int:
        """Number of live mappings held by the cache."""
        return len(self._maps)

    def __enter__(self) -> ExternalDataCache:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def map(self, ref: ExternalRef, path: str) -> memoryview:
        """Read-only view of the bytes ``[ref.offset, ref.offset + ref.length)``.

        Checks the location (P5) and the bounds against the file size before
        opening the file. A zero-length range gives an empty view without
        mapping anything. Raises :class:`ExternalDataError` naming ``path``.
        """
        target, info, offset, length = _extent(self._directory, ref, path)
        if length == 0:
            return memoryview(b"")
        key: _Key = (target, info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
        with self._lock:
            mapping = self._maps.get(key)
            if mapping is None:
                mapping = self._open(key, ref.location, path)
                for old in [k for k in self._maps if k[0] == target]:
                    _try_close(self._maps.pop(old))
                self._maps[key] = mapping
        return memoryview(mapping)[offset : offset + length]

    @staticmethod
    def _open(key: _Key, location: str, path: str) -> mmap.mmap:
        target, dev, ino, size, mtime_ns = key
        try:
            fd = os.open(target, os.O_RDONLY | _O_CLOEXEC | _O_BINARY | _O_NOFOLLOW)
        except OSError as exc:
            raise _error("P5", path, f"location {location!r}: cannot open {target!r}: {exc.strerror}") from None
        try:
            now = os.fstat(fd)
            if (now.st_dev, now.st_ino, now.st_size, now.st_mtime_ns) != (dev, ino, size, mtime_ns):
                raise _error("P5", path, f"location {location!r}: {target!r} changed while it was being opened")
            try:
                return mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
            except (OSError, ValueError) as exc:
                raise _error("P5", path, f"location {location!r}: cannot map {target!r}: {exc}") from None
        finally:
            os.close(fd)

    def close(self) -> None:
        """Drop every mapping; views already handed out stay valid."""
        with self._lock:
            maps, self._maps = self._maps, {}
        for mapping in maps.values():
            _try_close(mapping)


def map_external(model_dir: str | os.PathLike[str], ref: ExternalRef, *, path: str) -> memoryview:
    """One-off :meth:`ExternalDataCache.map` with a fresh cache; the view keeps its mapping alive."""
    cache = ExternalDataCache(model_dir)
    try:
        return cache.map(ref, path)
    finally:
        cache.close()


def _write_all(fd: int, data: memoryview) -> None:
    while data:
        written = os.write(fd, data)
        data = data[written:]


def write_external(
    path_dir: str | os.PathLike[str],
    location: str,
    data: Any,
    *,
    align: int = 4096,
    path: str | None = None,
) -> ExternalRef:
    """Append ``data`` to the file ``location`` in ``path_dir``; return where it landed.

    The payload starts at the next multiple of ``align`` (zero padding is
    written before it), so memory-mapped arrays are aligned. Missing parent
    directories inside ``path_dir`` are created. The location is checked like
    :func:`resolve_location` (relative, no ``..``, no symlink leading outside,
    a regular file if it exists). ``data`` is any C-contiguous bytes-like
    object. One writer per file at a time. Raises :class:`ExternalDataError`
    naming ``path`` (default: the location).
    """
    where = path if path is not None else f"external_data[{location!r}]"
    if type(align) is not int or align < 1:
        raise _error("P5", where, f"align={align!r} must be a positive integer")
    try:
        payload = memoryview(data)
    except TypeError:
        raise _error("P5", where, f"data of type {type(data).__name__} is not bytes-like") from None
    if not payload.c_contiguous:
        raise _error("P5", where, "data is not C-contiguous")
    payload = payload.cast("B") if payload.ndim != 1 or payload.format != "B" else payload
    check_location(location, path=where)
    directory = _real_dir(path_dir, where)
    if not os.path.isdir(directory):
        raise _error("P5", where, f"model directory {directory!r} does not exist or is not a directory")
    target = os.path.realpath(os.path.join(directory, location))
    if not _inside(directory, target) or target == directory:
        raise _error("P5", where, f"location {location!r} resolves to {target!r}, outside the model directory")
    parent = os.path.dirname(target)
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as exc:
        raise _error("P5", where, f"cannot create directory {parent!r}: {exc.strerror}") from None
    if os.path.realpath(parent) != parent:
        raise _error("P5", where, f"directory {parent!r} changed while it was being created")
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_APPEND | _O_CLOEXEC | _O_BINARY | _O_NOFOLLOW, 0o644)
    except OSError as exc:
        raise _error("P5", where, f"location {location!r}: cannot open {target!r} for writing: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _error("P5", where, f"location {location!r}: {target!r} is not a regular file")
        size = info.st_size
        if payload.nbytes == 0:
            return ExternalRef(location=location, offset=size, length=0)
        padding = -size % align
        if padding:
            _write_all(fd, memoryview(bytes(padding)))
        _write_all(fd, payload)
    except OSError as exc:
        raise _error("P5", where, f"location {location!r}: cannot write {target!r}: {exc.strerror}") from None
    finally:
        os.close(fd)
    return ExternalRef(location=location, offset=size + padding, length=payload.nbytes)


def as_numpy(
    view: memoryview,
    dtype: npt.DTypeLike,
    shape: Sequence[int] | int,
    *,
    path: str = "external data",
) -> npt.NDArray[Any]:
    """Read-only, zero-copy array of ``shape`` and ``dtype`` over ``view``.

    ONNX payloads are little-endian: pass an explicit ``"<"`` dtype on
    big-endian hosts. Raises :class:`ExternalDataError` naming ``path`` when
    ``view.nbytes`` differs from ``product(shape) * itemsize``.
    """
    if not isinstance(view, memoryview):
        raise _error("P5", path, f"expected a memoryview, got {type(view).__name__}")
    if not view.c_contiguous:
        raise _error("P5", path, "the view is not C-contiguous")
    try:
        dt = np.dtype(dtype)
    except TypeError as exc:
        raise _error("P5", path, f"invalid dtype {dtype!r}: {exc}") from None
    if dt.hasobject or dt.itemsize == 0:
        raise _error("P5", path, f"dtype {dt} cannot describe raw bytes")
    dims = (shape,) if isinstance(shape, int) else tuple(shape)
    if any(type(d) is not int and not isinstance(d, np.integer) for d in dims) or any(d < 0 for d in dims):
        raise _error("P5", path, f"shape {shape!r} must be a sequence of non-negative integers")
    dims = tuple(int(d) for d in dims)
    count = math.prod(dims)
    if count * dt.itemsize != view.nbytes:
        raise _error(
            "P5",
            path,
            f"payload has {view.nbytes} bytes, but {dt} {list(dims)} needs {count} * {dt.itemsize} = "
            f"{count * dt.itemsize} bytes",
        )
    array = np.frombuffer(view, dtype=dt, count=count).reshape(dims)
    array.flags.writeable = False
    return array
