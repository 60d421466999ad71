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

``PagedCacheUpdate(cache, key, value, position) -> updated_cache``: the updated
cache keeps the cache's type (a struct category, or a reference to the cache
container) and aliases it; key and value are the same float type, rank 4, batch
1 and equal dimensions; position is an int64 scalar::

    cache: struct(*), key/value: FLOAT[1, 4, n, 64], position: INT64[]  ->  updated: struct(*)

``PagedAttention(query, cache[, total_length]) -> output`` has the query's type
and shape; query is a float tensor [1, num_heads, S, D] and the cache a struct::

    query: FLOAT16[1, 8, S, 64], cache: struct(*)  ->  output: FLOAT16[1, 8, S, 64]
"""
from __future__ import annotations

from onnx import TensorProto
from onnxforge.graphbuilder.shapes.infer._base import NodeInference, register
from onnxforge.graphbuilder.builder.opschemas import ONNXFORGE_DOMAIN
from onnxforge.graphbuilder.shapes.symbolic import as_dim
from onnxforge.proto_ext.types import StructType, TensorType, type_name

__all__ = ["CACHE_TYPES", "KV_TYPES", "ONNXFORGE"]

ONNXFORGE = ONNXFORGE_DOMAIN
CACHE_TYPES = frozenset({TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.INT8,
                         TensorProto.UINT8})
KV_TYPES = frozenset({TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16})


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


def _paged_cache(op: NodeInference, i: int) -> None:
    t = op.type(i)
    if t is not None and not isinstance(t, StructType):
        op.fail(f"input {i} (the paged cache) must be a struct value (TypeProto.struct_type), got {t}")


def _int64_scalar(op: NodeInference, i: int, what: str) -> None:
    t = op.tensor(i)
    if t is None:
        return
    if t.elem_type and t.elem_type != TensorProto.INT64:
        op.fail(f"{what} must be int64, got {type_name(t.elem_type)}")
    if t.shape is not None and len(t.shape) != 0:
        op.fail(f"{what} must be a scalar, got rank {len(t.shape)}")


def _kv_tensor(op: NodeInference, i: int, what: str) -> TensorType | None:
    t = op.tensor(i)
    if t is None:
        return None
    if t.elem_type and t.elem_type not in KV_TYPES:
        op.fail(f"{what} element type {type_name(t.elem_type)} is not one of "
                f"{sorted(type_name(k) for k in KV_TYPES)}")
    if t.shape is not None:
        if len(t.shape) != 4:
            op.fail(f"{what} must have rank 4 [1, heads, n, head_dim], got rank {len(t.shape)}")
        op.check_dims(t.shape[0], 1, f"{what} batch (a paged cache holds one sequence)")
    return t if isinstance(t, TensorType) else None


def _cache_and_kv(op: NodeInference) -> TensorType | None:
    """The cache (input 0) and the key and value (inputs 1, 2) of a cache update; the key's type."""
    _paged_cache(op, 0)
    key, value = _kv_tensor(op, 1, "key"), _kv_tensor(op, 2, "value")
    if key is not None and value is not None:
        if key.elem_type and value.elem_type and key.elem_type != value.elem_type:
            op.fail(f"value is {type_name(value.elem_type)} but key is {type_name(key.elem_type)}")
        if key.shape is not None and value.shape is not None:
            for k, (a, b) in enumerate(zip(key.shape, value.shape)):
                op.check_dims(a, b, f"dimension {k} of key and value")
    return key


@register("PagedCacheUpdate", domain=ONNXFORGE)
def _paged_cache_update(op: NodeInference) -> None:
    key = _cache_and_kv(op)
    _int64_scalar(op, 3, "position")
    op.alias(0, 0)
    op.set_type(0, op.type(0))


@register("PagedAttention", domain=ONNXFORGE)
def _paged_attention(op: NodeInference) -> None:
    query = _kv_tensor(op, 0, "query")
    _paged_cache(op, 1)
    if op.has(2):
        _int64_scalar(op, 2, "total_length")
    heads, kv = op.int_attr("num_heads"), op.int_attr("kv_num_heads")
    for name, v in (("num_heads", heads), ("kv_num_heads", kv)):
        if v is not None and v < 1:
            op.fail(f"{name} must be >= 1, got {v}")
    if heads is not None and kv is not None and heads % kv:
        op.fail(f"num_heads {heads} is not a multiple of kv_num_heads {kv}")
    if query is not None and query.shape is not None and heads is not None:
        op.check_dims(query.shape[1], heads, "query heads (dimension 1) and num_heads")
    if query is not None:
        op.set(0, query.elem_type, query.shape)


def _int64_rank(op: NodeInference, i: int, rank: int, what: str) -> TensorType | None:
    t = op.tensor(i)
    if t is None:
        return None
    if t.elem_type and t.elem_type != TensorProto.INT64:
        op.fail(f"{what} must be int64, got {type_name(t.elem_type)}")
    if t.shape is not None and len(t.shape) != rank:
        op.fail(f"{what} must have rank {rank}, got rank {len(t.shape)}")
    return t if isinstance(t, TensorType) else None


@register("RaggedPagedCacheUpdate", domain=ONNXFORGE)
def _ragged_cache_update(op: NodeInference) -> None:
    key = _cache_and_kv(op)
    _int64_rank(op, 3, 1, "sequence_starts")
    pos = _int64_rank(op, 4, 2, "position_ids")
    if pos is not None and pos.shape is not None:
        op.check_dims(pos.shape[0], 1, "position_ids dimension 0")
        if key is not None and key.shape is not None:
            op.check_dims(pos.shape[1], key.shape[2], "position_ids rows and key rows")
    op.alias(0, 0)
    op.set_type(0, op.type(0))


@register("RaggedPagedAttention", domain=ONNXFORGE)
def _ragged_attention(op: NodeInference) -> None:
    _paged_attention(op)
    _int64_rank(op, 2, 1, "sequence_starts")
