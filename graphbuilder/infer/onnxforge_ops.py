"""Operators of the ``ai.onnxforge`` domain (version 1).

``CacheUpdate(cache, values, position) -> updated_cache`` (attribute ``axis``,
default -2): the output has the cache's type and is, by the operator's
contract, the cache's storage, so the rule puts output 0 and input 0 in one
alias class even when the node carries no ``output_alias``. The rule checks
that ``values`` matches the cache (element type, rank, every dimension but the
sequence axis), that ``position`` is an int64 scalar or ``[batch]``, and that
``position + n <= capacity`` whenever that is decidable (numbers, or symbolic
expressions whose difference is a number)::

    cache: FLOAT[b, 2, 64, 32], values: FLOAT[b, 2, seq, 32], position = 62
    -> seq is unknown: accepted;  values FLOAT[b, 2, 3, 32]: ShapeError (62 + 3 > 64)
"""
from __future__ import annotations

from onnx import TensorProto
from onnxforge.graphbuilder.infer._base import NodeInference, register
from onnxforge.graphbuilder.opschemas import ONNXFORGE_DOMAIN
from onnxforge.graphbuilder.symbolic import as_dim
from onnxforge.proto_ext.types import type_name

__all__ = ["CACHE_TYPES", "ONNXFORGE"]

ONNXFORGE = ONNXFORGE_DOMAIN
CACHE_TYPES = frozenset({TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.INT8,
                         TensorProto.UINT8})


@register("CacheUpdate", domain=ONNXFORGE)
def _cache_update(op: NodeInference) -> None:
    cache, values = op.tensor(0), op.tensor(1)
    if cache is not None and cache.elem_type and cache.elem_type not in CACHE_TYPES:
        op.fail(f"cache element type {type_name(cache.elem_type)} is not one of "
                f"{sorted(type_name(t) for t in CACHE_TYPES)}")
    if cache is not None and values is not None and cache.elem_type and values.elem_type \
            and cache.elem_type != values.elem_type:
        op.fail(f"values are {type_name(values.elem_type)} but the cache is {type_name(cache.elem_type)}")
    pos_t = op.tensor(2)
    if pos_t is not None:
        if pos_t.elem_type and pos_t.elem_type != TensorProto.INT64:
            op.fail(f"position must be int64, got {type_name(pos_t.elem_type)}")
        if pos_t.shape is not None and len(pos_t.shape) > 1:
            op.fail(f"position must be a scalar or [batch], got rank {len(pos_t.shape)}")
    cs = cache.shape if cache is not None else None
    vs = values.shape if values is not None else None
    axis = op.int_attr("axis", -2)
    if cs is not None:
        a = op.norm_axis(axis, len(cs), "cache axis")
        if vs is not None:
            if len(vs) != len(cs):
                op.fail(f"values have rank {len(vs)} but the cache has rank {len(cs)}")
            for k, (c, v) in enumerate(zip(cs, vs)):
                if k != a:
                    op.check_dims(c, v, f"dimension {k} of values and cache")
            _check_capacity(op, cs[a], vs[a])
    op.alias(0, 0)
    if cache is not None:
        op.set(0, cache.elem_type, cs)


def _check_capacity(op: NodeInference, capacity: object, n: object) -> None:
    pos = op.ints(2)
    if pos is None or capacity is None or n is None:
        return
    for p in pos:
        if p is None:
            continue
        if isinstance(p, int) and p < 0:
            op.fail(f"position {p} is negative")
        room = as_dim(capacity - (p + n))
        if isinstance(room, int) and room < 0:
            op.fail(f"position {p} + {n} new entries exceeds the capacity {capacity}")
