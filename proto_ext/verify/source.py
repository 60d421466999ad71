"""Static-rule violations of a model as it arrives: a path, bytes, a message or the IR.

A path or bytes is checked on its wire view before any IR is built, so nothing the
IR cannot hold (a second definition of a name, a dangling reference) escapes as an
untyped error from the loader, and the large payloads are never copied: the file is
memory-mapped, its main-graph payloads are stripped from the bytes that protobuf
parses, and the rules read only their sizes::

    violations = source_violations("model.onnx")     # [] when every rule holds

A loader that builds the IR anyway (``serde.load(source, verify=True)``, behind the
facade's ``load_verified`` and the backend's ``InferenceSession``) maps, strips and
parses the model once and checks that very message with :func:`parsed_violations`,
the one definition of what :func:`source_violations` checks.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from onnxforge.proto_ext.errors import Violation, WireError

__all__ = ["VIEW_MIN", "parsed_violations", "source_violations", "strip_source"]

VIEW_MIN = 1024
"""Payloads at least this large are viewed in place, not parsed (``serde.STRIP_MIN`` too)."""


def strip_source(data: Any, min_size: int = VIEW_MIN) -> Any:
    """:func:`~onnxforge.proto_ext.wirescan.strip_payloads` of a model's bytes, with a
    malformed model reported as :class:`WireError` ``cannot parse ModelProto: ...``, as
    protobuf's own parse reports it."""
    from onnxforge.proto_ext.wirescan import strip_payloads

    try:
        return strip_payloads(data, min_size=min_size)
    except WireError as exc:
        raise WireError(f"cannot parse ModelProto: {exc}") from None


def parsed_violations(message: Any, payloads: Mapping[tuple[str, int], Any],
                      model_dir: str | None) -> list[Violation]:
    """Every static-rule violation (the wire checks, every registered rule, then X1) of
    a ``ModelProto`` parsed from a stripped skeleton, whose stripped main-graph payloads
    are ``payloads`` (``wirescan.payload_views``: ``(kind, index) -> view``).

    ``message`` is only read (unknown fields included: rule W1 reads them), so the
    caller may decode the IR from it afterwards."""
    from onnxforge.proto_ext.convert import encoded_from_proto
    from onnxforge.proto_ext.verify import check_view
    from onnxforge.proto_ext.verify.wire import wire_violations
    from onnxforge.proto_ext.view import view_from_proto
    from onnxforge.proto_ext.wirescan import KIND_ENCODED

    view = view_from_proto(message, model_dir)
    if payloads:
        encoded = message.graph.encoded_initializer
        for (kind, index), payload in payloads.items():
            if kind == KIND_ENCODED:
                view.graph.encoded[index] = encoded_from_proto(encoded[index], raw_data=payload)
    return check_view(view, wire_violations(message))


def _bytes_violations(data: Any, model_dir: str | None) -> list[Violation]:
    """Static-rule violations of serialized model bytes (``bytes`` or an ``mmap``), found on
    the wire view like :func:`check` does, but without copying the large main-graph
    payloads: the rules need only their sizes, which views of ``data`` give."""
    from onnxforge.proto_ext import schema
    from onnxforge.proto_ext.wirescan import payload_views

    stripped = strip_source(data)
    message = schema.parse_model(stripped.skeleton)
    views = payload_views(data, stripped) if stripped.payloads else {}
    return parsed_violations(message, views, model_dir)


def _path_violations(path: str, model_dir: str | None) -> list[Violation]:
    from onnxforge.proto_ext.schema import model_file_error
    from onnxforge.proto_ext.wirescan import map_model_file, release_map

    folder = model_dir if model_dir is not None else os.path.dirname(os.path.abspath(path))
    try:
        mapping = map_model_file(path)
    except OSError as exc:
        raise model_file_error(path, exc) from None
    try:
        return _bytes_violations(mapping, folder)
    finally:
        release_map(mapping)


def source_violations(model: Any, model_dir: str | None = None) -> list[Violation]:
    """Every static-rule violation of an input model: on its wire view when it is a path,
    bytes or a message (before the IR is built), on the IR's own view otherwise."""
    from onnxforge.proto_ext.verify import check as _check

    if isinstance(model, (str, os.PathLike)):
        return _path_violations(os.fspath(model), model_dir)
    if isinstance(model, (bytes, bytearray, memoryview)):
        return _bytes_violations(model, model_dir)
    return _check(model, model_dir)
