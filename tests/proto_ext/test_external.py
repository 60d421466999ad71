"""External data: P4 parsing, P5 confinement and bounds, shared read-only mappings."""
from __future__ import annotations

import gc
import mmap
import os
import re
from collections.abc import Iterator
from typing import Any
from pathlib import Path

import numpy as np
import pytest

from onnxforge.errors import ExternalDataError
from onnxforge.proto_ext import external
from onnxforge.proto_ext.external import (
    ExternalDataCache,
    ExternalRef,
    as_numpy,
    map_external,
    parse_external_entries,
    resolve_location,
    write_external,
)

PATH = "graph.initializer['w'].external_data"
PAYLOAD = bytes(range(256)) * 4  # 1024 bytes


@pytest.fixture()
def model_dir(tmp_path: Path) -> Path:
    """A model directory with ``w.bin`` (1024 known bytes) and an outside secret file."""
    root = tmp_path / "model"
    root.mkdir()
    (root / "w.bin").write_bytes(PAYLOAD)
    (root / "sub").mkdir()
    (root / "sub" / "inner.bin").write_bytes(b"inner")
    (tmp_path / "secret.bin").write_bytes(b"secret" * 10)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "w.bin").write_bytes(b"outside")
    return root


@pytest.fixture()
def no_reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Fail the test if the code under test opens or maps any file."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"file access attempted: {args!r}")

    with monkeypatch.context() as patch:
        patch.setattr(external.os, "open", refuse)
        patch.setattr(external.mmap, "mmap", refuse)
        yield


def _raises_naming_path(rule: str) -> Any:
    """``pytest.raises`` for an ExternalDataError that cites ``rule`` and names PATH."""
    return pytest.raises(ExternalDataError, match=rf"^\[{rule}\] {re.escape(PATH)}: ")


# ---------------------------------------------------------------- P4 parsing


def test_parse_full_and_round_trip() -> None:
    ref = parse_external_entries(
        [("location", "w.bin"), ("offset", "4096"), ("length", "0064"), ("checksum", "abc")], path=PATH
    )
    assert ref == ExternalRef("w.bin", 4096, 64, "abc")
    assert parse_external_entries(ref.to_entries(), path=PATH, require_length=True) == ref


def test_parse_defaults() -> None:
    ref = parse_external_entries([("location", "w.bin")], path=PATH)
    assert (ref.offset, ref.length, ref.checksum) == (0, None, None)


@pytest.mark.parametrize(
    ("entries", "fragment"),
    [
        ([("location", "a"), ("location", "b")], "'location' occurs more than once"),
        ([("location", "a"), ("length", "1"), ("length", "1")], "'length' occurs more than once"),
        ([("location", "a"), ("basepath", "/tmp")], "unknown key 'basepath'"),
        ([("offset", "0"), ("length", "4")], "missing required key 'location'"),
        ([("location", ""), ("length", "4")], "'location' is empty"),
        ([("location", "a"), ("offset", "-1")], "offset='-1' is not a non-negative base-10 integer"),
        ([("location", "a"), ("offset", "1.5")], "offset='1.5' is not"),
        ([("location", "a"), ("offset", "0x10")], "offset='0x10' is not"),
        ([("location", "a"), ("offset", " 1")], "offset=' 1' is not"),
        ([("location", "a"), ("offset", "+1")], "offset='+1' is not"),
        ([("location", "a"), ("offset", "")], "offset='' is not"),
        ([("location", "a"), ("offset", "\u0661")], "is not a non-negative base-10"),
        ([("location", "a"), ("length", "-4")], "length='-4' is not"),
        ([("location", "a"), ("length", "9" * 25)], "does not fit in a signed 64-bit"),
        ([("location", "a"), ("key-only",)], "expected a (key, value) pair"),
        ([("location", 3)], "expected a (key, value) pair"),
    ],
)
def test_parse_rejects(entries: list[tuple[str, str]], fragment: str) -> None:
    with _raises_naming_path("P4") as info:
        parse_external_entries(entries, path=PATH)
    assert fragment in str(info.value)


def test_parse_requires_length_for_encoded_values() -> None:
    assert parse_external_entries([("location", "a")], path=PATH).length is None
    with _raises_naming_path("P4") as info:
        parse_external_entries([("location", "a"), ("offset", "0")], path=PATH, require_length=True)
    assert "missing required key 'length'" in str(info.value)


# ------------------------------------------------------- P5 location checks


@pytest.mark.parametrize(
    ("location", "fragment"),
    [
        ("", "location is empty"),
        ("w.bin\0x", "NUL byte"),
        ("/etc/passwd", "is absolute"),
        ("C:\\x\\w.bin", "is absolute"),
        ("C:/x/w.bin", "is absolute"),
        ("c:w.bin", "is absolute"),
        ("\\\\server\\share\\w.bin", "is absolute"),
        ("//server/share/w.bin", "is absolute"),
        ("\\w.bin", "is absolute"),
        ("..", "'..' component"),
        ("../secret.bin", "'..' component"),
        ("sub/../../secret.bin", "'..' component"),
        ("sub/../w.bin", "'..' component"),
        ("..\\secret.bin", "'..' component"),
        ("sub\\..\\..\\secret.bin", "'..' component"),
    ],
)
def test_unsafe_location_text_rejected_before_reading(
    model_dir: Path, no_reads: None, location: str, fragment: str
) -> None:
    with _raises_naming_path("P5") as info:
        resolve_location(model_dir, location, path=PATH)
    assert fragment in str(info.value)
    with _raises_naming_path("P5"):
        map_external(model_dir, ExternalRef(location, 0, 1), path=PATH)


def test_symlinked_file_escaping_rejected(model_dir: Path, no_reads: None) -> None:
    os.symlink(model_dir.parent / "secret.bin", model_dir / "link.bin")
    with _raises_naming_path("P5") as info:
        resolve_location(model_dir, "link.bin", path=PATH)
    assert "outside the model directory" in str(info.value)
    with _raises_naming_path("P5"):
        map_external(model_dir, ExternalRef("link.bin", 0, 6), path=PATH)


def test_symlinked_directory_escaping_rejected(model_dir: Path, no_reads: None) -> None:
    os.symlink(model_dir.parent / "outside", model_dir / "data", target_is_directory=True)
    with _raises_naming_path("P5") as info:
        resolve_location(model_dir, "data/w.bin", path=PATH)
    assert "outside the model directory" in str(info.value)
    with _raises_naming_path("P5"):
        map_external(model_dir, ExternalRef("data/w.bin", 0, 7), path=PATH)


def test_symlink_staying_inside_is_accepted(model_dir: Path) -> None:
    os.symlink("sub/inner.bin", model_dir / "alias.bin")
    resolved = resolve_location(model_dir, "alias.bin", path=PATH)
    assert resolved == (model_dir / "sub" / "inner.bin").resolve()
    assert bytes(map_external(model_dir, ExternalRef("alias.bin"), path=PATH)) == b"inner"


def test_missing_file_rejected(model_dir: Path, no_reads: None) -> None:
    with _raises_naming_path("P5") as info:
        resolve_location(model_dir, "nope.bin", path=PATH)
    assert "does not exist" in str(info.value)


def test_directory_rejected(model_dir: Path, no_reads: None) -> None:
    for location in ("sub", "."):
        with _raises_naming_path("P5") as info:
            resolve_location(model_dir, location, path=PATH)
        assert "not a regular file" in str(info.value)


def test_resolve_returns_real_path(model_dir: Path) -> None:
    assert resolve_location(str(model_dir), "sub/inner.bin", path=PATH) == (model_dir / "sub/inner.bin").resolve()
    assert resolve_location(model_dir, "./w.bin", path=PATH) == (model_dir / "w.bin").resolve()


# ------------------------------------------------------------------ bounds


@pytest.mark.parametrize(
    ("offset", "length", "fragment"),
    [
        (1000, 25, "offset 1000 + length 25 = 1025 exceeds the size of 'w.bin' (1024 bytes)"),
        (0, 1025, "exceeds the size"),
        (1025, None, "offset 1025 lies beyond the end"),
        (1025, 0, "offset 1025 lies beyond the end"),
        (1, 2**63 - 1, "exceeds the size"),
    ],
)
def test_out_of_bounds_rejected_before_reading(
    model_dir: Path, no_reads: None, offset: int, length: int | None, fragment: str
) -> None:
    with _raises_naming_path("P5") as info:
        map_external(model_dir, ExternalRef("w.bin", offset, length), path=PATH)
    assert fragment in str(info.value)


@pytest.mark.parametrize(("offset", "length"), [(-1, 4), ("0", 4), (0, -4), (0, 1.5), (True, 4)])
def test_malformed_ref_rejected_before_reading(
    model_dir: Path, no_reads: None, offset: object, length: object
) -> None:
    with _raises_naming_path("P4"):
        map_external(model_dir, ExternalRef("w.bin", offset, length), path=PATH)  # type: ignore[arg-type]


def test_zero_length_is_empty_without_mapping(model_dir: Path, no_reads: None) -> None:
    for ref in (ExternalRef("w.bin", 1024, None), ExternalRef("w.bin", 1024, 0), ExternalRef("w.bin", 5, 0)):
        view = map_external(model_dir, ref, path=PATH)
        assert view.nbytes == 0 and view.readonly


# ---------------------------------------------------------------- mapping


def test_map_returns_exact_read_only_bytes(model_dir: Path) -> None:
    view = map_external(model_dir, ExternalRef("w.bin", 10, 20), path=PATH)
    assert bytes(view) == PAYLOAD[10:30]
    assert view.readonly
    assert isinstance(view.obj, mmap.mmap)
    with pytest.raises(TypeError):
        view[0] = 1
    rest = map_external(model_dir, ExternalRef("w.bin", 1000), path=PATH)
    assert bytes(rest) == PAYLOAD[1000:]


def test_arrays_share_one_mapping(model_dir: Path) -> None:
    with ExternalDataCache(model_dir) as cache:
        a = cache.map(ExternalRef("w.bin", 0, 64), PATH)
        b = cache.map(ExternalRef("w.bin", 32, 64), PATH)
        c = cache.map(ExternalRef("w.bin", 512, 64), PATH)
        assert len(cache) == 1
        assert a.obj is b.obj is c.obj
        x = as_numpy(a, "<u4", (4, 4))
        y = as_numpy(b, "<u4", (16,))
        z = as_numpy(c, np.uint8, 64)
    assert not x.flags.writeable and not y.flags.writeable and not z.flags.writeable
    assert np.shares_memory(x, y)
    assert not np.shares_memory(x, z)
    assert np.array_equal(x.ravel(), np.frombuffer(PAYLOAD[:64], "<u4"))
    assert np.array_equal(z, np.frombuffer(PAYLOAD[512:576], np.uint8))
    # The base chain ends at the mapping: no copy was made.
    base: object = x
    while isinstance(base, np.ndarray):
        base = base.base
    assert isinstance(base, memoryview) and base.obj is a.obj
    with pytest.raises(ValueError):
        x[0, 0] = 1


def test_separate_files_get_separate_mappings(model_dir: Path) -> None:
    with ExternalDataCache(model_dir) as cache:
        a = cache.map(ExternalRef("w.bin", 0, 4), PATH)
        b = cache.map(ExternalRef("sub/inner.bin", 0, 5), PATH)
        assert len(cache) == 2 and a.obj is not b.obj
        assert bytes(b) == b"inner"
    assert len(cache) == 0


def test_close_keeps_live_views_valid(model_dir: Path) -> None:
    cache = ExternalDataCache(model_dir)
    live = cache.map(ExternalRef("w.bin", 100, 8), PATH)
    released = cache.map(ExternalRef("sub/inner.bin", 0, 5), PATH)
    array = as_numpy(cache.map(ExternalRef("w.bin", 200, 16), PATH), "<u2", (8,))
    kept_map, freed_map = live.obj, released.obj
    released.release()
    cache.close()
    assert len(cache) == 0
    assert freed_map.closed  # no view left: unmapped at once
    assert not kept_map.closed  # views still use it
    assert bytes(live) == PAYLOAD[100:108]
    assert np.array_equal(array, np.frombuffer(PAYLOAD[200:216], "<u2"))
    cache.close()  # idempotent


def test_modified_file_gets_a_new_mapping(model_dir: Path) -> None:
    with ExternalDataCache(model_dir) as cache:
        old = cache.map(ExternalRef("w.bin", 0, 16), PATH)
        ref = write_external(model_dir, "w.bin", b"appended", align=64)
        new = cache.map(ref, PATH)
        assert bytes(new) == b"appended"
        assert len(cache) == 1 and new.obj is not old.obj
        assert bytes(old) == PAYLOAD[:16]


def test_as_numpy_rejects_length_mismatch(model_dir: Path) -> None:
    view = map_external(model_dir, ExternalRef("w.bin", 0, 10), path=PATH)
    with pytest.raises(ExternalDataError, match=r"payload has 10 bytes, but float32 \[3\] needs 3 \* 4 = 12"):
        as_numpy(view, np.float32, (3,), path=PATH)
    with pytest.raises(ExternalDataError, match="non-negative integers"):
        as_numpy(view, np.uint8, (-1, -10), path=PATH)
    with pytest.raises(ExternalDataError, match="cannot describe raw bytes"):
        as_numpy(view, object, (1,), path=PATH)
    empty = as_numpy(memoryview(b""), np.float32, (0, 3))
    assert empty.shape == (0, 3) and not empty.flags.writeable


# ---------------------------------------------------------------- writing


def test_write_external_aligns_and_round_trips(tmp_path: Path) -> None:
    first = write_external(tmp_path, "data/weights.bin", b"abc", align=16)
    second = write_external(tmp_path, "data/weights.bin", np.arange(4, dtype="<f4"), align=16)
    third = write_external(tmp_path, "data/weights.bin", b"", align=16)
    assert first == ExternalRef("data/weights.bin", 0, 3)
    assert second == ExternalRef("data/weights.bin", 16, 16)
    assert third == ExternalRef("data/weights.bin", 32, 0)
    raw = (tmp_path / "data" / "weights.bin").read_bytes()
    assert raw == b"abc" + bytes(13) + np.arange(4, dtype="<f4").tobytes()
    with ExternalDataCache(tmp_path) as cache:
        assert bytes(cache.map(first, PATH)) == b"abc"
        values = as_numpy(cache.map(second, PATH), "<f4", (2, 2))
        assert np.array_equal(values, [[0, 1], [2, 3]])
        assert values.ctypes.data % 16 == 0


@pytest.mark.parametrize("location", ["../x.bin", "/tmp/x.bin", "C:\\x.bin", "a\\..\\..\\x.bin", "", ".", "link/x.bin"])
def test_write_external_refuses_unsafe_locations(tmp_path: Path, location: str) -> None:
    root = tmp_path / "model"
    root.mkdir()
    (tmp_path / "outside").mkdir()
    os.symlink(tmp_path / "outside", root / "link", target_is_directory=True)
    with pytest.raises(ExternalDataError, match=r"^\[P5\] " + re.escape(PATH)):
        write_external(root, location, b"x", path=PATH)
    assert list((tmp_path / "outside").iterdir()) == []
    assert sorted(p.name for p in root.iterdir()) == ["link"]


def test_write_external_refuses_symlinked_file_escaping(tmp_path: Path) -> None:
    root = tmp_path / "model"
    root.mkdir()
    (tmp_path / "victim.bin").write_bytes(b"keep")
    os.symlink(tmp_path / "victim.bin", root / "w.bin")
    with pytest.raises(ExternalDataError, match=r"outside the model directory") as info:
        write_external(root, "w.bin", b"x")
    assert "'w.bin'" in str(info.value)
    assert (tmp_path / "victim.bin").read_bytes() == b"keep"


def test_write_external_rejects_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ExternalDataError, match="align=0"):
        write_external(tmp_path, "w.bin", b"x", align=0)
    with pytest.raises(ExternalDataError, match="not bytes-like"):
        write_external(tmp_path, "w.bin", "text")
    with pytest.raises(ExternalDataError, match="not C-contiguous"):
        write_external(tmp_path, "w.bin", np.arange(8, dtype=np.uint8)[::2])
    assert not (tmp_path / "w.bin").exists()


# ------------------------------------------------------------------ memory


def _rss_bytes() -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("VmRSS missing from /proc/self/status")


def test_large_sparse_file_is_not_read(tmp_path: Path) -> None:
    size = 64 * 1024 * 1024
    path = tmp_path / "big.bin"
    with open(path, "wb") as handle:
        handle.truncate(size)
        handle.seek(size // 2)
        handle.write(b"\x01\x02\x03\x04")
    gc.collect()
    before = _rss_bytes()
    with ExternalDataCache(tmp_path) as cache:
        whole = cache.map(ExternalRef("big.bin"), PATH)
        small = cache.map(ExternalRef("big.bin", size // 2, 4), PATH)
        values = as_numpy(small, np.uint8, (4,))
        assert whole.nbytes == size
        assert values.tolist() == [1, 2, 3, 4]
        after = _rss_bytes()
    assert after - before < 4 * 1024 * 1024, f"RSS grew by {after - before} bytes"
