"""Static-rule violations of a model as it arrives: a path, bytes, a message or the IR.

A path or bytes is checked on its wire view before any IR is built, so nothing the
IR cannot hold (a second definition of a name, a dangling reference) escapes as an
untyped error from the loader, and the large payloads are never copied: the file is
memory-mapped and the rules read only their sizes. The facade's ``load_verified`` and
the backend's ``InferenceSession`` check their inputs here::

    violations = source_violations("model.onnx")     # [] when every rule holds
"""
from __future__ import annotations

import mmap
import os
from typing import Any

from onnxforge.proto_ext.errors import Violation, WireError

__all__ = ["source_violations"]

_VIEW_MIN = 1024  # payloads at least this large are viewed in place, not parsed


def _bytes_violations(data: Any, model_dir: str | None) -> list[Violation]:
    """Static-rule violations of serialized model bytes (``bytes`` or an ``mmap``), found on
    the wire view like :func:`check` does, but without copying the large main-graph
    payloads: the rules need only their sizes, which views of ``data`` give."""
    from onnxforge.proto_ext import schema
    from onnxforge.proto_ext.convert import encoded_from_proto
    from onnxforge.proto_ext.verify import check_view
    from onnxforge.proto_ext.verify.wire import wire_violations
    from onnxforge.proto_ext.view import view_from_proto
    from onnxforge.proto_ext.wirescan import KIND_ENCODED, payload_views, strip_payloads

    try:
        stripped = strip_payloads(data, min_size=_VIEW_MIN)
    except WireError as exc:
        raise WireError(f"cannot parse ModelProto: {exc}") from None
    message = schema.parse_model(stripped.skeleton)
    view = view_from_proto(message, model_dir)
    if stripped.payloads:
        encoded = message.graph.encoded_initializer
        for (kind, index), payload in payload_views(data, stripped).items():
            if kind == KIND_ENCODED:
                view.graph.encoded[index] = encoded_from_proto(encoded[index], raw_data=payload)
    return check_view(view, wire_violations(message))


def _path_violations(path: str, model_dir: str | None) -> list[Violation]:
    from onnxforge.proto_ext.schema import model_file_error

    folder = model_dir if model_dir is not None else os.path.dirname(os.path.abspath(path))
    try:
        with open(path, "rb") as fh:
            if os.fstat(fh.fileno()).st_size == 0:
                raise WireError(f"{path!r} is empty: not an ONNX model")
            mapping = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as exc:
        raise model_file_error(path, exc) from None
    try:
        return _bytes_violations(mapping, folder)
    finally:
        try:
            mapping.close()
        except BufferError:  # a view still refers to it; it is unmapped with the last one
            pass


def _input_violations(model: Any, model_dir: str | None) -> list[Violation]:
    """Every static-rule violation of an input model: on its wire view when it is a path,
    bytes or a message (before the IR is built, so nothing the IR cannot hold, such as a
    second definition of a name, escapes), on the IR's own view otherwise."""
    from onnxforge.proto_ext.verify import check as _check

    if isinstance(model, (str, os.PathLike)):
        return _path_violations(os.fspath(model), model_dir)
    if isinstance(model, (bytes, bytearray, memoryview)):
        return _bytes_violations(model, model_dir)
    return _check(model, model_dir)


def source_violations(model: Any, model_dir: str | None = None) -> list[Violation]:
    """Every static-rule violation of an input model: on its wire view when it is a path,
    bytes or a message (before the IR is built), on the IR's own view otherwise."""
    from onnxforge.proto_ext.verify import check as _check

    if isinstance(model, (str, os.PathLike)):
        return _path_violations(os.fspath(model), model_dir)
    if isinstance(model, (bytes, bytearray, memoryview)):
        return _bytes_violations(model, model_dir)
    return _check(model, model_dir)
