"""Writing outputs without damaging other files.

Two guarantees for every file a command or the API writes:

* **Atomic replacement.** A file is written to a temporary name beside its
  target and renamed over it only once complete (:func:`atomic_path`,
  :func:`write_json`, :func:`copy_file`): a write that fails part-way leaves the
  previous file as it was, and a reader never sees half a file.
* **No clobbering.** :func:`check_targets` refuses, before anything is written,
  a target that is the command's own input (its model file or one of the data
  files it references) or a file that another model in the target's folder
  references as external data. The references are read with
  :func:`external_locations`, which parses only a model's skeleton (large inline
  payloads are skipped on the wire, external ones never opened)::

      check_targets(["out/model.onnx", "out/model.onnx.data"],
                    inputs=["src/model.onnx"], replaces="out/model.onnx")
      # OutputConflictError: out/model.onnx.data: out/other.onnx keeps its
      # weights there; writing it would change what out/other.onnx computes
"""
from __future__ import annotations

import contextlib
import json
import mmap
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

from onnxforge.proto_ext.errors import OnnxforgeError, WireError

__all__ = ["OutputConflictError", "atomic_files", "atomic_path", "check_targets", "copy_file", "data_file_name",
           "external_locations", "model_files", "model_skeleton", "replace_all", "write_json"]


class OutputConflictError(OnnxforgeError, ValueError):
    """Writing an output would overwrite the input or a file another model uses."""


def data_file_name(model_path: str | os.PathLike[str]) -> str:
    """The external-data file name of a written model: ``out.onnx`` -> ``out.onnx.data``."""
    return os.path.basename(os.fspath(model_path)) + ".data"


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike[str], *, mode: int = 0o644) -> Iterator[str]:
    """A temporary path beside ``target`` to write; renamed over ``target`` when the
    block ends without an exception, removed otherwise (``target`` untouched).

    ::

        with atomic_path("out/feedback.json") as tmp:
            with open(tmp, "w") as fh:
                fh.write("{}")
    """
    target = os.fspath(target)
    folder = os.path.dirname(os.path.abspath(target))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(target)}.", suffix=".tmp", dir=folder)
    os.close(fd)
    try:
        yield tmp
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def replace_all(moves: Iterable[tuple[str, str]]) -> None:
    """Rename each ``(temporary, target)`` pair in order, as one step: when a rename
    fails, the targets already replaced get their previous files back (kept under a
    second hard link meanwhile) before the error is raised. Used for a model and its
    data file, which must change together."""
    done: list[tuple[str, str | None]] = []  # replaced target, link to its previous file
    links: list[str] = []
    try:
        for temp, target in moves:
            backup = None
            if os.path.isfile(target) and not os.path.islink(target):
                backup = f"{target}.{uuid.uuid4().hex[:12]}.bak"
                try:
                    os.link(target, backup)
                    links.append(backup)
                except OSError:  # no hard links here: the previous file cannot come back
                    backup = None
            os.replace(temp, target)
            done.append((target, backup))
    except BaseException:
        for target, backup in reversed(done):
            with contextlib.suppress(OSError):
                if backup is not None:
                    os.replace(backup, target)
                else:
                    os.unlink(target)
        raise
    finally:
        for link in links:
            with contextlib.suppress(OSError):
                os.unlink(link)


@contextlib.contextmanager
def atomic_files(folder: str | os.PathLike[str], names: Iterable[str]) -> Iterator[str]:
    """A temporary folder inside ``folder`` to write the files ``names`` into; when the
    block ends without an exception each one written is renamed into ``folder``, in the
    order given (data files before the model that references them). The temporary
    folder is removed either way, so a failure leaves ``folder``'s files as they were.

    ::

        with atomic_files("out", ["model.onnx.data", "model.onnx"]) as stage:
            onnx.save_model(proto, os.path.join(stage, "model.onnx"), ...)
    """
    folder = os.fspath(folder)
    stage = tempfile.mkdtemp(prefix=".onnxforge-", suffix=".tmp", dir=folder)
    try:
        yield stage
        moves = []
        for name in names:
            staged = os.path.join(stage, name)
            if os.path.lexists(staged):
                os.chmod(staged, 0o644)
                moves.append((staged, os.path.join(folder, name)))
        replace_all(moves)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def write_json(target: str | os.PathLike[str], data: Any, *, indent: int = 2) -> None:
    """Write ``data`` as JSON to ``target`` through a temporary file."""
    with atomic_path(target) as tmp:
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=indent)


def copy_file(source: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
    """Copy ``source``'s bytes to ``target`` through a temporary file."""
    with atomic_path(target) as tmp:
        shutil.copyfile(source, tmp)


# ----------------------------------------------------------------------- references


def model_skeleton(path: str) -> bytes | None:
    """The model file's bytes without its large main-graph payloads, mapped and scanned
    once (None: not a readable model file)."""
    from onnxforge.proto_ext.wirescan import strip_payloads

    try:
        with open(path, "rb") as fh:
            if os.fstat(fh.fileno()).st_size == 0:
                return None
            mapping = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError:
        return None
    try:
        return bytes(strip_payloads(mapping, min_size=1024).skeleton)
    except WireError:
        return None
    finally:
        with contextlib.suppress(BufferError):
            mapping.close()


def external_locations(model_path: str | os.PathLike[str]) -> set[str]:
    """The external-data files (normalized, relative to the model's folder) that the model
    file references anywhere: initializers, sparse and encoded initializers, tensor
    attributes, subgraphs and local functions. No payload is read; a file that is not a
    readable model gives an empty set."""
    from google.protobuf.message import DecodeError

    from onnxforge.proto_ext import schema
    from onnxforge.proto_ext.verify.core import iter_graphs
    from onnxforge.proto_ext.verify.external_rules import external_refs
    from onnxforge.proto_ext.view import view_from_proto

    skeleton = model_skeleton(os.fspath(model_path))
    if skeleton is None:
        return set()
    try:
        view = view_from_proto(schema.parse_model(skeleton))
    except (DecodeError, OnnxforgeError, ValueError):
        return set()
    entries = [e for _, e in external_refs(view)]
    entries += [e.external_data for g in iter_graphs(view) for e in g.encoded]
    return {os.path.normpath(v) for es in entries for k, v in es if k == "location" and v}


def model_files(model_path: str | os.PathLike[str]) -> list[str]:
    """The model file and the external-data files it references (absolute paths)."""
    path = os.path.abspath(os.fspath(model_path))
    folder = os.path.dirname(path)
    return [path] + sorted(os.path.join(folder, loc) for loc in external_locations(path))


def _same(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.normcase(os.path.abspath(a)) == os.path.normcase(os.path.abspath(b))


def _users(folder: str, skip: str | None) -> Iterator[tuple[str, str]]:
    """``(model path, referenced file path)`` for the ``*.onnx`` files of ``folder``."""
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return
    for name in names:
        path = os.path.join(folder, name)
        if not name.endswith(".onnx") or not os.path.isfile(path):
            continue
        if skip is not None and _same(path, skip):
            continue
        for loc in external_locations(path):
            yield path, os.path.join(folder, loc)


def check_targets(targets: Iterable[str | os.PathLike[str]], *, inputs: Iterable[str | os.PathLike[str]] = (),
                  replaces: str | os.PathLike[str] | None = None) -> None:
    """Raise :class:`OutputConflictError` naming the first target that must not be written.

    ``targets``: the files a command is about to write. ``inputs``: its input model
    files (each with the data files it references is protected). ``replaces``: the
    model file the command writes, whose own references do not count (writing over an
    output written before stays possible while no other model uses its data)."""
    paths = [os.path.abspath(os.fspath(t)) for t in targets]
    existing = [p for p in paths if os.path.lexists(p)]
    if not existing:
        return
    for model in inputs:
        for protected in model_files(model):
            for t in existing:
                if _same(t, protected):
                    kind = "the input model" if _same(protected, os.fspath(model)) \
                        else f"external data of the input model {os.fspath(model)}"
                    raise OutputConflictError(
                        f"{t}: is {kind}; writing it would destroy the input. Choose another output path")
    replaced = None if replaces is None else os.path.abspath(os.fspath(replaces))
    folders = sorted({os.path.dirname(t) for t in existing})
    for folder in folders:
        for user, used in _users(folder, replaced):
            for t in existing:
                if _same(t, used):
                    raise OutputConflictError(
                        f"{t}: {user} keeps its external data there; writing it would change what "
                        f"{os.path.basename(user)} computes. Choose another output path or folder")
