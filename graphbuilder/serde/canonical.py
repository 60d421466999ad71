"""Canonical form of a ModelProto, for comparing models by meaning rather than by bytes.

Two models are equivalent when their canonical forms are equal. The canonical
form keeps everything (nodes, attributes, initializer bytes, value infos,
functions, metadata, extensions, unknown fields) and normalizes only what has
no meaning:

* ``value_info`` order (graphs, subgraphs, functions): sorted by name;
* external versus inline storage of the same bytes: external payloads (dense
  tensors anywhere, sparse tensor parts, encoded values) are read and inlined;
* map order: ``metadata_props`` entries sorted by key, ``opset_import`` by
  domain.

Example::

    from onnxforge.graphbuilder import serde
    from onnxforge.graphbuilder.serde import canonical

    serde.save(serde.load("a.onnx"), "b.onnx")
    assert not canonical.differences("a.onnx", "b.onnx")
"""
from __future__ import annotations

import os
from typing import Any, Union

from google.protobuf.message import Message

from onnxforge.proto_ext.errors import ExternalDataError
from onnxforge.proto_ext import schema
from onnxforge.proto_ext.external import ExternalDataCache, parse_external_entries

__all__ = ["canonical_bytes", "canonical_proto", "differences", "equivalent"]

Source = Union[str, "os.PathLike[str]", bytes, bytearray, memoryview, Any]

_EXTERNAL = 1
_SORTED = {
    "value_info": lambda m: (m.name, m.SerializeToString()),
    "metadata_props": lambda m: (m.key, m.value, m.SerializeToString()),
    "opset_import": lambda m: (m.domain, m.version, m.SerializeToString()),
}


def _read(source: Source, model_dir: str | os.PathLike[str] | None) -> tuple[Any, str | None]:
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        with open(path, "rb") as fh:
            data = fh.read()
        folder = os.fspath(model_dir) if model_dir is not None else os.path.dirname(os.path.abspath(path))
        return schema.parse_model(data), folder
    folder = None if model_dir is None else os.fspath(model_dir)
    if isinstance(source, (bytes, bytearray, memoryview)):
        return schema.parse_model(source), folder
    if isinstance(source, Message) and source.DESCRIPTOR.name == "ModelProto":
        return schema.parse_model(source.SerializeToString()), folder
    raise TypeError(f"expected a path, bytes or a ModelProto, got {type(source).__name__}")


class _Inliner:
    def __init__(self, model_dir: str | None):
        self.cache = ExternalDataCache(model_dir) if model_dir is not None else None

    def inline(self, msg: Any, path: str) -> None:
        if self.cache is None:
            raise ExternalDataError(f"{path}: external data but no model folder to read it from")
        entries = [(e.key, e.value) for e in msg.external_data]
        ref = parse_external_entries(entries, path=f"{path}.external_data")
        view = self.cache.map(ref, path)
        msg.raw_data = bytes(view)
        view.release()
        msg.ClearField("external_data")
        msg.ClearField("data_location")

    def close(self) -> None:
        if self.cache is not None:
            self.cache.close()


def _normalize(msg: Any, path: str, inliner: _Inliner) -> None:
    kind = msg.DESCRIPTOR.name
    if kind in ("TensorProto", "EncodedValueProto") and msg.HasField("data_location") \
            and msg.data_location == _EXTERNAL:
        inliner.inline(msg, path)
    for fd, value in msg.ListFields():
        if fd.type != fd.TYPE_MESSAGE:
            continue
        name = fd.name
        if fd.is_repeated:
            key = _SORTED.get(name)
            for i, item in enumerate(value):
                _normalize(item, f"{path}.{name}[{i}]", inliner)
            if key is not None and len(value) > 1:
                items = sorted(value, key=key)
                blobs = [m.SerializeToString() for m in items]
                del value[:]
                for b in blobs:
                    value.add().ParseFromString(b)
        else:
            _normalize(value, f"{path}.{name}", inliner)


def canonical_proto(source: Source, *, model_dir: str | os.PathLike[str] | None = None) -> Any:
    """The canonical extended ``ModelProto`` of ``source`` (a path, bytes or a ModelProto).

    External payloads are read from ``model_dir`` (default: the folder of a path
    source); a model with external data and no folder raises ExternalDataError."""
    msg, folder = _read(source, model_dir)
    inliner = _Inliner(folder)
    try:
        _normalize(msg, "model", inliner)
    finally:
        inliner.close()
    return msg


def canonical_bytes(source: Source, *, model_dir: str | os.PathLike[str] | None = None) -> bytes:
    """Deterministic serialization of :func:`canonical_proto`."""
    return canonical_proto(source, model_dir=model_dir).SerializeToString(deterministic=True)


def _diff(a: Any, b: Any, path: str, out: list[str], limit: int) -> None:
    if len(out) >= limit:
        return
    start = len(out)
    fa = {fd.name: (fd, v) for fd, v in a.ListFields()}
    fb = {fd.name: (fd, v) for fd, v in b.ListFields()}
    for name in sorted(set(fa) | set(fb), key=lambda n: a.DESCRIPTOR.fields_by_name[n].number):
        if len(out) >= limit:
            return
        if name not in fa or name not in fb:
            side = "second" if name not in fa else "first"
            out.append(f"{path}.{name}: only in the {side} model")
            continue
        fd, va = fa[name]
        vb = fb[name][1]
        if fd.type == fd.TYPE_MESSAGE:
            if fd.is_repeated:
                if len(va) != len(vb):
                    out.append(f"{path}.{name}: {len(va)} vs {len(vb)} entries")
                    continue
                for i, (x, y) in enumerate(zip(va, vb, strict=True)):
                    _diff(x, y, f"{path}.{name}[{i}]", out, limit)
            else:
                _diff(va, vb, f"{path}.{name}", out, limit)
        elif (list(va) if fd.is_repeated else va) != (list(vb) if fd.is_repeated else vb):
            sa, sb = _short(va, fd.is_repeated), _short(vb, fd.is_repeated)
            out.append(f"{path}.{name}: {sa} vs {sb}")
    if len(out) == start and a.SerializeToString(deterministic=True) \
            != b.SerializeToString(deterministic=True):
        out.append(f"{path}: unknown fields differ")


def _short(v: Any, repeated: bool) -> str:
    text = repr(list(v) if repeated else v)
    return text if len(text) <= 80 else text[:77] + "..."


def differences(a: Source, b: Source, *, model_dir_a: str | os.PathLike[str] | None = None,
                model_dir_b: str | os.PathLike[str] | None = None, limit: int = 20) -> list[str]:
    """Paths (``model.graph.node[3].attribute[0].i: 1 vs 2``) where the canonical forms of
    ``a`` and ``b`` differ; empty when the models are equivalent."""
    ca = canonical_proto(a, model_dir=model_dir_a)
    cb = canonical_proto(b, model_dir=model_dir_b)
    if ca.SerializeToString(deterministic=True) == cb.SerializeToString(deterministic=True):
        return []
    out: list[str] = []
    _diff(ca, cb, "model", out, limit)
    return out or ["model: serialized forms differ"]


def equivalent(a: Source, b: Source, *, model_dir_a: str | os.PathLike[str] | None = None,
               model_dir_b: str | os.PathLike[str] | None = None) -> bool:
    """True when ``a`` and ``b`` have equal canonical forms."""
    return canonical_bytes(a, model_dir=model_dir_a) == canonical_bytes(b, model_dir=model_dir_b)
