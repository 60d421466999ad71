"""Initializer deduplication, dense and encoded.

Initializers of one graph holding the same value are merged into the first
one; uses of the others read it and the others are removed. "The same value"
means equal payload bytes *and* equal meaning: a dense tensor's element type and
dims, an encoded value's layout (affine parameters or struct type), logical
type and value type. Equal bytes with a different dtype, shape, layout or
logical type are not duplicates.

Before / after::

    graph(x) -> y                          graph(x) -> y
      init a = float32[4] {1, 2, 3, 4}       init a = float32[4] {1, 2, 3, 4}
      init b = float32[4] {1, 2, 3, 4}       init c = int32[4] (same bytes as a)
      init c = int32[4] (same bytes as a)    t = Add(x, a)
      t = Add(x, a)                          y = Mul(t, a)
      y = Mul(t, b)

Payloads are read only for candidates: initializers are first grouped by
(type, dims, byte length) without reading bytes, then by the first and last 32
bytes of their payloads (a serialized payload is parsed for them, once); within
a group of three or more left each payload is hashed once with blake2b and, on a
hash hit, compared byte for byte (two are compared directly). Graph inputs with
a default (initializers that are also inputs) and initializers that are graph
outputs are never merged away.
"""
from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
from onnx import TensorProto

from onnxforge.graphbuilder.ir.core import Graph, Model, Value
from onnxforge.graphbuilder.ir.tensors import EncodedTensor, Tensor
from onnxforge.passes.framework.invariants import containers
from onnxforge.passes.framework.pass_manager import ALL, Pass, PassResult, register_pass
from onnxforge.passes.rewrites.rename import replace_value

__all__ = ["DeduplicateInitializersPass", "deduplicate_initializers"]


def _dense_group(t: Tensor) -> tuple:
    return ("dense", t.dtype, t.dims, t.nbytes)


def _dense_bytes(t: Tensor) -> Any:
    if t.dtype == TensorProto.STRING:
        return repr(t.numpy().tolist()).encode()
    return t.tobytes()


def _encoded_group(v: Value, t: EncodedTensor) -> tuple | None:
    h = t.header
    payload = t.payload
    if len(payload) != t.nbytes:  # payload not reachable without reading external data
        return None
    layout: tuple = (h.affine, h.struct_type, h.logical_type, h.has_logical_type, v.type)
    try:
        hash(layout)
    except TypeError:
        layout = (t.content_key()[0], repr(h.logical_type), repr(v.type))
    return ("encoded", layout, len(payload))


def _merge_group(g: Graph, members: list[tuple[Value, Any]]) -> int:
    """``members``: (value, payload) pairs of one group; merge equal payloads."""
    kept: dict[bytes, list[tuple[Value, Any]]] = {}
    removed = 0
    for v, data in members:
        # two candidates (the usual case once probes agree) are compared directly: one
        # comparison reads both once, hashing would read both and compare them still
        digest = b"" if len(members) == 2 else hashlib.blake2b(data, digest_size=32).digest()
        same = kept.setdefault(digest, [])
        target = None
        for kv, kdata in same:
            if kdata == data or bytes(kdata) == bytes(data):
                target = kv
                break
        if target is None:
            same.append((v, data))
            continue
        if replace_value(v, target):
            g.remove_initializer(v)
            removed += 1
    return removed


_PROBE = 32
"""Bytes compared from each end of a payload before a whole payload is hashed."""

_PROBE_DTYPES = frozenset({
    TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BOOL,
    TensorProto.INT8, TensorProto.INT16, TensorProto.INT32, TensorProto.INT64,
    TensorProto.UINT8, TensorProto.UINT16, TensorProto.UINT32, TensorProto.UINT64,
})


def _probe(v: Value) -> bytes | None:
    """The first and last :data:`_PROBE` bytes of ``v``'s payload (equal payloads have equal
    probes), read without copying the payload (a serialized one, such as Paddle's
    ``float_data``, is parsed: once, the tensor keeps the array); None when it cannot be
    read so."""
    t = v.const
    if isinstance(t, EncodedTensor):
        data = t.payload
    elif isinstance(t, Tensor) and t.raw is not None and t.dtype != TensorProto.STRING:
        data = t.raw
    elif isinstance(t, Tensor) and (t.array is not None or t.proto is not None) and t.dtype in _PROBE_DTYPES \
            and (a := t.numpy()).dtype.isnative:
        n = a.size
        k = -(-_PROBE // max(1, a.itemsize))
        if n <= 2 * k:
            return bytes(np.ascontiguousarray(a).tobytes())
        return a.flat[:k].tobytes()[:_PROBE] + a.flat[n - k:n].tobytes()[-_PROBE:]
    else:
        return None
    if len(data) <= 2 * _PROBE:
        return bytes(data)
    return bytes(data[:_PROBE]) + bytes(data[len(data) - _PROBE:])


def _candidates(values: list[Value]) -> list[list[Value]]:
    """``values`` (one group, in order) split by payload probe into the sub-groups of two or
    more that may hold equal payloads (the whole group when a payload has no probe)."""
    probes: dict[bytes, list[Value]] = {}
    for v in values:
        p = _probe(v)
        if p is None:
            return [values]
        probes.setdefault(p, []).append(v)
    return [vs for vs in probes.values() if len(vs) > 1]


def _dedup_graph(g: Graph) -> int:
    inputs = {id(v) for v in g.inputs}  # overridable at run time: never merged either way
    outputs = {id(v) for v in g.outputs}  # may be kept, never dropped
    groups: dict[tuple, list[Value]] = {}
    for v in g.all_initializers():
        if id(v) in inputs:
            continue
        t = v.const
        if isinstance(t, EncodedTensor):
            key = _encoded_group(v, t)
        elif isinstance(t, Tensor):
            key = _dense_group(t)
        else:
            key = None
        if key is not None:
            groups.setdefault(key, []).append(v)
    removed = 0
    for values in groups.values():
        if len(values) < 2:
            continue
        values.sort(key=lambda v: id(v) not in outputs)  # stable: outputs become the kept ones
        for same in _candidates(values):
            members = [(v, v.const.payload if isinstance(v.const, EncodedTensor) else _dense_bytes(v.const))
                       for v in same]
            removed += _merge_group(g, members)
    return removed


def deduplicate_initializers(model: Model) -> int:
    """Merge equal initializers in every graph and subgraph (of the main graph and of local
    functions); returns how many were removed."""
    return sum(_dedup_graph(g) for g in list(containers(model)) if isinstance(g, Graph))


@register_pass
class DeduplicateInitializersPass(Pass):
    """Merge initializers holding the same bytes with the same meaning (module docstring)."""

    name = "dedup_initializers"
    # readers move to the kept copy: last uses change, merged values go
    invalidates = ALL
    preserves = ()
    declares_storage = False
    runs_after = ("constant_folding",)

    def call(self, model: Model) -> PassResult:
        return PassResult(model, deduplicate_initializers(model) > 0)
