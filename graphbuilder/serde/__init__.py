"""Lossless conversion between extended ONNX protobuf and the IR; model load and save.

This package is the only part of ``graphbuilder`` that touches protobuf.

Loading from a file memory-maps it, strips the main graph's inline payloads of
at least 1 KiB from the wire bytes (:mod:`onnxforge.proto_ext.wirescan`),
parses the small remainder and gives each stripped tensor a read-only
memoryview into the mapping: no payload is copied. ``load(source, verify=True)``
checks every static rule on that parsed message before it builds any IR
(:func:`onnxforge.proto_ext.verify.source.parsed_violations`), so a verified load
maps, scans and parses the model once. External data is mapped
too (:mod:`onnxforge.proto_ext.external`), after its location has been
checked; a payload is never read during loading, so a model with terabytes of
external data loads in the time its graph takes.

Saving streams those payloads back with
:func:`~onnxforge.proto_ext.wirescan.write_model` (again without copies), keeps
external payloads external (in ``<file name>.data`` beside the written model,
never in a file another model may share), or writes every large payload to one
external file when asked.

Nothing is dropped: fields the IR does not model (unknown fields, training
info, device configurations...) travel in the ``extra`` bytes of the IR object
that owns them and are written back, so ``save(load(m))`` equals ``m`` up to
what :mod:`onnxforge.graphbuilder.serde.canonical` normalizes (value_info order,
external-vs-inline storage, map order).

Example::

    from onnxforge.graphbuilder import serde

    m = serde.load("model.onnx")            # weights memory-mapped, not read
    m.graph.name = "renamed"
    serde.save(m, "out/model.onnx")          # external payloads -> out/model.onnx.data
    serde.save(m, "out2/model.onnx", external_data="weights.bin")
"""
from __future__ import annotations

import contextlib
import gc
import io
import os
import tempfile
from typing import IO, Any, Union

import onnx

from onnxforge.proto_ext.errors import VerificationError, WireError
from onnxforge.graphbuilder.ir.core import Model
from onnxforge.graphbuilder.serde._decode import Decoder
from onnxforge.graphbuilder.serde._encode import Encoder, PayloadPlan
from onnxforge.proto_ext import schema
from onnxforge.proto_ext.external import ExternalDataCache
from onnxforge.proto_ext.wirescan import (
    map_model_file,
    payload_views,
    release_map,
    strip_payloads,
    write_model,
)

__all__ = [
    "Source",
    "from_bytes",
    "from_proto",
    "load",
    "save",
    "to_bytes",
    "to_onnx",
    "to_proto",
    "write",
]

PathLike = Union[str, "os.PathLike[str]"]
Source = Union[PathLike, bytes, bytearray, memoryview, Any]
"""A path, serialized bytes, or a ModelProto (stock ``onnx`` or extended)."""

STRIP_MIN = 1024
"""Main-graph payloads of at least this many bytes are held as views, never copied."""


@contextlib.contextmanager
def _no_gc():
    """Pause the cyclic garbage collector while a model's object graph is built.

    A model is hundreds of thousands of new container objects that all stay
    alive; collecting while they are created only re-scans them. When the
    collector was enabled and nothing is frozen, the new objects are then moved
    into the oldest generation (``gc.freeze()`` + ``gc.unfreeze()``, two list
    splices) instead of being scanned by the next young collection; they are
    collected like any long-lived object by later full collections."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            if gc.get_freeze_count() == 0:
                gc.freeze()
                gc.unfreeze()
            gc.enable()


def _parse_checked(mp: Any, skeleton: bytes) -> tuple[Any, bool]:
    """``mp`` (the ModelProto parsed from ``skeleton``) and ``clean``: True when no
    message of it holds unknown fields.

    The check discards unknown fields and serializes again: identical bytes prove that
    nothing was discarded, and ``mp`` is returned, so a model without unknown fields is
    parsed once. Otherwise the bytes are parsed a second time, unknown fields kept, and
    every message is probed on its own: that second parse is what a model holding
    unknown fields costs (bytes that another writer encoded otherwise than protobuf's
    serializer, which the comparison cannot tell from them, pay it too). The discard
    changes ``mp``: whatever reads its unknown fields (rule W1 of the verifier) runs
    before this."""
    mp.DiscardUnknownFields()
    if mp.SerializeToString() == skeleton:
        return mp, True
    return schema.parse_model(skeleton), False


def _decode_data(data: Any, model_dir: str | None, *, verify: bool = False) -> Model:
    """The IR of serialized model bytes: stripped, parsed once, verified on that parse
    when asked (every violation raised before any IR is built), then decoded."""
    if verify:
        from onnxforge.proto_ext.verify.source import parsed_violations, strip_source

        stripped = strip_source(data, STRIP_MIN)
    else:
        stripped = strip_payloads(data, min_size=STRIP_MIN)
    views = payload_views(data, stripped) if stripped.payloads else {}
    mp = schema.parse_model(stripped.skeleton)
    if verify:
        violations = parsed_violations(mp, views, model_dir)
        if violations:
            raise VerificationError(violations)
    mp, clean = _parse_checked(mp, stripped.skeleton)
    cache = ExternalDataCache(model_dir) if model_dir is not None else None
    try:
        with _no_gc():
            return Decoder(clean=clean, payloads=views, cache=cache, model_dir=model_dir).model(mp)
    finally:
        if cache is not None:
            cache.close()


def from_bytes(data: bytes | bytearray | memoryview, *, model_dir: PathLike | None = None,
               verify: bool = False) -> Model:
    """IR model from serialized (extended) ModelProto bytes.

    Large inline payloads become views into ``data`` (keep it unmodified while
    the model lives). External data is resolved against ``model_dir``; without
    it external tensors keep their reference but no payload. ``verify``: see :func:`load`."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"from_bytes expects bytes-like data, got {type(data).__name__}")
    return _decode_data(data, None if model_dir is None else os.fspath(model_dir), verify=verify)


def from_proto(msg: Any, *, model_dir: PathLike | None = None, verify: bool = False) -> Model:
    """IR model from a ModelProto message (extended class, or stock ``onnx.ModelProto``).

    The message is not modified; the model shares nothing with it. It is serialized
    once and loaded like bytes. ``verify``: see :func:`load`."""
    if verify:
        return from_bytes(schema.model_message_bytes(msg), model_dir=model_dir, verify=True)
    if not hasattr(msg, "SerializeToString") or getattr(msg, "DESCRIPTOR", None) is None \
            or msg.DESCRIPTOR.name != "ModelProto":
        raise TypeError(f"from_proto expects a ModelProto, got {type(msg).__name__}")
    return from_bytes(msg.SerializeToString(), model_dir=model_dir)


def _load_path(path: PathLike, model_dir: PathLike | None, verify: bool) -> Model:
    path = os.fspath(path)
    folder = os.fspath(model_dir) if model_dir is not None else os.path.dirname(os.path.abspath(path))
    try:
        mapping = map_model_file(path)
    except OSError as exc:
        if not verify:
            raise
        raise schema.model_file_error(path, exc) from None
    try:
        return _decode_data(mapping, folder, verify=verify)
    finally:
        release_map(mapping)  # unmapped now, or with the last payload view of the model


def load(source: Source, *, model_dir: PathLike | None = None, verify: bool = False) -> Model:
    """Load a model from a path, bytes, or a ModelProto (stock or extended).

    From a path the file is memory-mapped and ``model_dir`` defaults to its
    folder; inline payloads of at least 1 KiB and every external payload are
    views into file mappings (read-only, zero copy, nothing read yet). Unsafe
    external locations raise :class:`~onnxforge.errors.ExternalDataError`
    before any payload byte is read; a persistent binding that names no graph
    input/output raises :class:`~onnxforge.errors.VerificationError` (rule B2).

    ``verify=True`` checks every static rule (the wire checks and X1 included) on
    the message the model is decoded from, before any IR is built or any external
    payload is mapped: :class:`~onnxforge.errors.VerificationError` lists every
    violation. The model is mapped, scanned and parsed once all the same (a model
    that holds unknown fields is parsed a second time, to keep them). A path
    that cannot be opened then raises :class:`~onnxforge.errors.ModelFileError`, a
    malformed model :class:`~onnxforge.errors.WireError` ``cannot parse ModelProto``,
    as :func:`~onnxforge.proto_ext.verify.source.source_violations` reports them.
    Without it loading does not otherwise verify the model."""
    if isinstance(source, (str, os.PathLike)):
        return _load_path(source, model_dir, verify)
    if isinstance(source, (bytes, bytearray, memoryview)):
        return from_bytes(source, model_dir=model_dir, verify=verify)
    if isinstance(source, Model):
        raise TypeError("load expects a path, bytes or a ModelProto, got an IR Model")
    return from_proto(source, model_dir=model_dir, verify=verify)


def _encode(model: Model, plan: PayloadPlan) -> Any:
    with _no_gc():
        try:
            return Encoder(plan).model(model)
        except UnicodeDecodeError as exc:  # protobuf refuses such text; a loaded model keeps it as bytes
            raise WireError(f"a text field of the model holds {bytes(exc.object[:64])!r}, which is not UTF-8 "
                            "(ONNX strings are UTF-8); fix or remove it before saving") from None


def to_proto(model: Model, *, include_payloads: bool = True) -> Any:
    """Extended ``ModelProto`` of ``model``.

    External payloads stay external references (relative to ``model.model_dir``).
    With ``include_payloads=False`` the main graph's inline payloads of at least
    1 KiB are left out (their ``raw_data`` is absent)."""
    plan = PayloadPlan(stream_min=None if include_payloads else STRIP_MIN,
                       model_dir=model.model_dir)
    return _encode(model, plan)


def to_onnx(model: Model) -> onnx.ModelProto:
    """Stock ``onnx.ModelProto`` of ``model``; extensions ride as unknown fields."""
    out = onnx.ModelProto()
    out.ParseFromString(to_bytes(model))
    return out


def _stream(model: Model, fh: IO[bytes], plan: PayloadPlan) -> int:
    msg = _encode(model, plan)
    skeleton = msg.SerializeToString()
    del msg
    return write_model(fh, skeleton, plan.streamed)


def write(model: Model, fh: IO[bytes]) -> int:
    """Stream ``model`` as a serialized extended ModelProto to the binary file ``fh``.

    Large main-graph payloads are written straight from their buffers; external
    payloads stay external references. Returns the number of bytes written."""
    return _stream(model, fh, PayloadPlan(stream_min=STRIP_MIN, model_dir=model.model_dir))


def to_bytes(model: Model) -> bytes:
    """Serialized extended ModelProto of ``model`` (external payloads stay external)."""
    buf = io.BytesIO()
    write(model, buf)
    return buf.getvalue()


def save(model: Model, path: PathLike, *, external_data: str | None = None,
         size_threshold: int = 1024, all_tensors_to_one_file: bool = True) -> None:
    """Write ``model`` to ``path`` as extended ONNX, losslessly.

    Without ``external_data`` inline payloads stay inline (streamed from their
    buffers) and the payloads that were external are written to one file named
    after the model, ``<file name>.data`` beside it (``out.onnx`` ->
    ``out.onnx.data``), whatever file they came from: two models saved into one
    folder never share a data file. References that already point into that file
    in that folder are left as they are (saving a model over itself copies
    nothing). With ``external_data`` (a location relative to the model's folder)
    every payload of at least ``size_threshold`` bytes, and every payload that was
    external, is written there (or, with ``all_tensors_to_one_file=False``, to one
    file per tensor next to it). The model and data files are written to
    temporary names and renamed once complete, so a failed save leaves existing
    files as they were and saving over the file a model was loaded from is safe."""
    if isinstance(size_threshold, bool) or not isinstance(size_threshold, int) or size_threshold < 0:
        raise ValueError(f"size_threshold must be a non-negative int, got {size_threshold!r}")
    path = os.fspath(path)
    out_dir = os.path.dirname(os.path.abspath(path))
    os.makedirs(out_dir, exist_ok=True)
    own = external_data is None
    location = os.path.basename(path) + ".data" if own else external_data
    for keep in (None, False):  # False: a mixed file (some references kept, some written) is rewritten whole
        plan = PayloadPlan(stream_min=STRIP_MIN, out_dir=out_dir, model_dir=model.model_dir,
                           location=location, threshold=size_threshold,
                           one_file=all_tensors_to_one_file or own, only_external=own, _keep=keep)
        if _save_with(model, path, out_dir, plan):
            return


def _save_with(model: Model, path: str, out_dir: str, plan: PayloadPlan) -> bool:
    """Write ``model`` by ``plan``; False (nothing written) when the plan kept references
    into a file it also writes."""
    fd, tmp = tempfile.mkstemp(prefix=".onnxforge-", suffix=".tmp", dir=out_dir)
    try:
        with os.fdopen(fd, "wb") as fh:
            _stream(model, fh, plan)
        if plan.mixed and plan.only_external:
            plan.abort()
            os.unlink(tmp)
            return False
        os.chmod(tmp, 0o644)
        plan.commit(then=(tmp, path))  # the data files, then the model: together or not at all
        return True
    except BaseException:
        plan.abort()
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
