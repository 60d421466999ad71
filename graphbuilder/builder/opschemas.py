"""Operator schemas: lookup in onnx's registry, the ``ai.onnxforge`` domain, and node checks.

``ai.onnxforge`` version 1 operators (CacheUpdate, PagedCacheUpdate,
PagedAttention) are registered in onnx's schema registry at import time, so
GraphBuilder, the verifier and ``onnx.checker`` check them like standard
operators. onnx has no type string for a struct value: the paged cache's
constraint names an opaque type instead (see ``PAGED_CACHE_TYPE``).

``check_node`` validates a node against the schema of its declared opset: the
operator exists, the input/output counts are in range, attributes exist, have
the declared type, and required ones are present. Domains without schemas in
this process (``com.microsoft``...) are accepted unchecked when the model
declares them.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import onnx.defs as defs

from onnxforge.proto_ext.errors import OnnxforgeError

__all__ = [
    "ONNXFORGE_DOMAIN",
    "ONNXFORGE_VERSION",
    "SchemaCheckError",
    "get_schema",
    "resolve_schema",
    "check_node",
    "CHECKED_DOMAINS",
]

ONNXFORGE_DOMAIN = "ai.onnxforge"
ONNXFORGE_VERSION = 1
CHECKED_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml", ONNXFORGE_DOMAIN})


class SchemaCheckError(OnnxforgeError, ValueError):
    """A node does not match its operator schema (unknown op, arity, attribute)."""


def _param(name: str, type_str: str, doc: str,
           option: defs.OpSchema.FormalParameterOption | None = None) -> defs.OpSchema.FormalParameter:
    kwargs: dict[str, Any] = {}
    if option is not None:
        kwargs["param_option"] = option
    return defs.OpSchema.FormalParameter(name, type_str, doc, **kwargs)


def _register() -> None:
    try:
        defs.get_schema("CacheUpdate", ONNXFORGE_VERSION, ONNXFORGE_DOMAIN)
        return
    except defs.SchemaError:
        pass
    cache_update = defs.OpSchema(
        "CacheUpdate",
        ONNXFORGE_DOMAIN,
        ONNXFORGE_VERSION,
        "Writes `values` into `cache` at [position, position + n) along `axis`, in place. "
        "Output 0 must alias input 0 (output_alias {0, 0, MUST_ALIAS}); position + n > capacity "
        "is an error.",
        inputs=[
            _param("cache", "T", "capacity-sized cache [..., capacity, D], bound READ_WRITE"),
            _param("values", "T", "new entries [..., n, D]"),
            _param("position", "tensor(int64)", "write offset: scalar or [batch]"),
        ],
        outputs=[_param("updated_cache", "T", "the same storage as `cache`")],
        type_constraints=[(
            "T",
            ["tensor(float)", "tensor(float16)", "tensor(bfloat16)", "tensor(int8)", "tensor(uint8)"],
            "cache element types",
        )],
        attributes=[
            defs.OpSchema.Attribute("axis", defs.OpSchema.AttrType.INT,
                                    "sequence axis of the cache (default -2)", required=False),
        ],
    )
    defs.register_schema(cache_update)


# onnx's schema registry has no type string for ``TypeProto.struct_type``: the paged cache's
# constraint ``C`` names an opaque type as a stand-in. The real type, a struct category (or a
# reference to an ONNXFORGE_PAGED_KV_CACHE declaration), is checked by the shape rules
# (graphbuilder/shapes/infer/onnxforge_ops.py) and by verifier rule K2 (proto_ext/verify/paged_rules.py).
PAGED_CACHE_TYPE = "opaque(ai.onnxforge,PagedKVCache)"
_KV_FLOATS = ["tensor(float)", "tensor(float16)", "tensor(bfloat16)"]


def _attention_attributes() -> list:
    """The attributes of PagedAttention and RaggedPagedAttention."""
    attr = defs.OpSchema.Attribute
    return [
        attr("scale", defs.OpSchema.AttrType.FLOAT, "scale of the dot products (default 1/sqrt(head_dim))",
             required=False),
        attr("num_heads", defs.OpSchema.AttrType.INT, "query heads (query dimension 1)", required=True),
        attr("kv_num_heads", defs.OpSchema.AttrType.INT, "kv heads of the cache; num_heads is a multiple of it",
             required=True),
    ]


def _register_paged() -> None:
    try:
        defs.get_schema("PagedCacheUpdate", ONNXFORGE_VERSION, ONNXFORGE_DOMAIN)
        return
    except defs.SchemaError:
        pass
    attr = defs.OpSchema.Attribute
    defs.register_schema(defs.OpSchema(
        "PagedCacheUpdate",
        ONNXFORGE_DOMAIN,
        ONNXFORGE_VERSION,
        "Writes `key` and `value` (n tokens) into the paged cache at [position, position + n), "
        "quantizing each token directly into its page's format, in place. Output 0 must alias "
        "input 0 (output_alias {0, 0, MUST_ALIAS}). Updating an existing page allocates nothing; "
        "only a missing page is allocated; a page that ages into the next format of the cache's "
        "policy is replaced alone. position must equal the cache's length and position + n must "
        "not exceed its capacity (num_pages * page_size).",
        inputs=[
            _param("cache", "C", "paged KV cache (TypeProto.struct_type: a category or an "
                                 "ONNXFORGE_PAGED_KV_CACHE reference), bound READ_WRITE"),
            _param("key", "T", "new keys [1, kv_heads, n, head_dim]"),
            _param("value", "T", "new values [1, kv_heads, n, head_dim]"),
            _param("position", "tensor(int64)", "first token written: an int64 scalar"),
        ],
        outputs=[_param("updated_cache", "C", "the same cache (page table and pages) as `cache`")],
        type_constraints=[
            ("C", [PAGED_CACHE_TYPE], "the paged cache: a struct value (see the note in opschemas.py)"),
            ("T", _KV_FLOATS, "key and value element types"),
        ],
    ))
    defs.register_schema(defs.OpSchema(
        "PagedAttention",
        ONNXFORGE_DOMAIN,
        ONNXFORGE_VERSION,
        "Grouped-query attention of `query` over the tokens [0, total_length) of the paged cache "
        "(total_length defaults to the cache's length), causal for S > 1 (query i sits at position "
        "total_length - S + i). Pages are decoded one block per head at a time into a bounded "
        "workspace with an online softmax: the cache is never dequantized as a whole.",
        inputs=[
            _param("query", "T", "queries [1, num_heads, S, head_dim]"),
            _param("cache", "C", "paged KV cache (TypeProto.struct_type), read only"),
            _param("total_length", "tensor(int64)", "tokens attended: an int64 scalar (default: the "
                                                    "cache's length)", defs.OpSchema.FormalParameterOption.Optional),
        ],
        outputs=[_param("output", "T", "attention output [1, num_heads, S, head_dim]")],
        type_constraints=[
            ("T", _KV_FLOATS, "query and output element types"),
            ("C", [PAGED_CACHE_TYPE], "the paged cache: a struct value (see the note in opschemas.py)"),
        ],
        attributes=_attention_attributes(),
    ))




def _register_ragged() -> None:
    try:
        defs.get_schema("RaggedPagedCacheUpdate", ONNXFORGE_VERSION, ONNXFORGE_DOMAIN)
        return
    except defs.SchemaError:
        pass
    attr = defs.OpSchema.Attribute
    starts = _param("sequence_starts", "tensor(int64)", "row offsets of the sequences: [N + 1], "
                                                       "0 = starts[0] <= ... <= starts[N] = T; sequence i "
                                                       "owns rows [starts[i], starts[i + 1])")
    defs.register_schema(defs.OpSchema(
        "RaggedPagedCacheUpdate",
        ONNXFORGE_DOMAIN,
        ONNXFORGE_VERSION,
        "PagedCacheUpdate over a ragged batch: `cache` holds one page table per sequence (one layer), "
        "and sequence i's rows of `key` and `value` are appended to its own pages at "
        "position_ids[0, starts[i]], which must equal the length that sequence's cache holds; its "
        "positions run on by one per row. Output 0 must alias input 0 (MUST_ALIAS). Every sequence's "
        "rows are checked before any page changes.",
        inputs=[
            _param("cache", "C", "one layer's page tables of the batch's sequences (TypeProto.struct_type), "
                                 "bound READ_WRITE"),
            _param("key", "T", "new keys of all sequences [1, kv_heads, T, head_dim]"),
            _param("value", "T", "new values of all sequences [1, kv_heads, T, head_dim]"),
            starts,
            _param("position_ids", "tensor(int64)", "position of every row [1, T]"),
        ],
        outputs=[_param("updated_cache", "C", "the same page tables as `cache`")],
        type_constraints=[
            ("C", [PAGED_CACHE_TYPE], "the paged cache batch: a struct value (see the note above)"),
            ("T", _KV_FLOATS, "key and value element types"),
        ],
    ))
    defs.register_schema(defs.OpSchema(
        "RaggedPagedAttention",
        ONNXFORGE_DOMAIN,
        ONNXFORGE_VERSION,
        "PagedAttention over a ragged batch: sequence i's query rows [starts[i], starts[i + 1]) attend "
        "causally over that sequence's own pages (its cache's length, the rows a RaggedPagedCacheUpdate "
        "of this run appended included); no row sees another sequence.",
        inputs=[
            _param("query", "T", "queries of all sequences [1, num_heads, T, head_dim]"),
            _param("cache", "C", "one layer's page tables of the batch (TypeProto.struct_type), read only"),
            starts,
        ],
        outputs=[_param("output", "T", "attention output [1, num_heads, T, head_dim]")],
        type_constraints=[
            ("T", _KV_FLOATS, "query and output element types"),
            ("C", [PAGED_CACHE_TYPE], "the paged cache batch: a struct value (see the note above)"),
        ],
        attributes=_attention_attributes(),
    ))


_register()
_register_paged()
_register_ragged()


def get_schema(op_type: str, version: int, domain: str) -> defs.OpSchema | None:
    """The schema in force for ``op_type`` at opset ``version`` of ``domain``, or None."""
    try:
        return defs.get_schema(op_type, version, "" if domain == "ai.onnx" else domain)
    except defs.SchemaError:
        return None


# onnx's stub for the AttrType enum omits its __members__ and int conversion
_ATTR_NAMES = {int(v): k for k, v in defs.OpSchema.AttrType.__members__.items()}  # type: ignore[attr-defined]


def _resolve(op_type: str, domain: str, opsets: dict[str, int]) -> tuple[int, bool]:
    """(opset version, checked) for a node of ``domain``; raises if the domain is undeclared."""
    key = "" if domain == "ai.onnx" else domain
    if key not in opsets and not (key == "" and "ai.onnx" in opsets):
        raise SchemaCheckError(f"domain {domain or 'ai.onnx'!r} of {op_type} is not among "
                               f"the model's opset imports {sorted(opsets)}")
    return opsets.get(key, opsets.get("ai.onnx", 0)), key in CHECKED_DOMAINS


def resolve_schema(op_type: str, domain: str, opsets: dict[str, int]) -> defs.OpSchema | None:
    """The schema a node of ``domain::op_type`` is checked against under ``opsets``, or None
    (undeclared or unchecked domain, unknown operator). Never raises."""
    try:
        version, checked = _resolve(op_type, domain, opsets)
    except SchemaCheckError:
        return None
    return get_schema(op_type, version, domain) if checked else None


def check_node(op_type: str, domain: str, n_inputs: int, n_outputs: int,
               attributes: dict[str, int], opsets: dict[str, int], where: str,
               missing: Sequence[int] = ()) -> defs.OpSchema | None:
    """Validate a node; ``attributes`` maps names to AttributeProto type codes and
    ``missing`` lists the positions of omitted (empty) inputs.

    Returns the schema (None for an unchecked custom domain). Raises
    :class:`SchemaCheckError` naming ``where`` and the problem.
    """
    try:
        version, checked = _resolve(op_type, domain, opsets)
    except SchemaCheckError as exc:
        raise SchemaCheckError(f"{where}: {exc}") from None
    if not checked:
        return None
    schema = get_schema(op_type, version, domain)
    if schema is None:
        raise SchemaCheckError(f"{where}: unknown operator {domain + '::' if domain else ''}{op_type} "
                               f"at opset {version}")
    if not schema.min_input <= n_inputs <= schema.max_input:
        raise SchemaCheckError(f"{where}: {op_type}-{schema.since_version} takes {schema.min_input}"
                               f"..{schema.max_input} inputs, got {n_inputs}")
    if not schema.min_output <= n_outputs <= schema.max_output:
        raise SchemaCheckError(f"{where}: {op_type}-{schema.since_version} has {schema.min_output}"
                               f"..{schema.max_output} outputs, got {n_outputs}")
    formal = schema.inputs
    for i in missing:
        if i < len(formal) and formal[i].option == defs.OpSchema.FormalParameterOption.Single:
            raise SchemaCheckError(f"{where}: input {i} ({formal[i].name!r}) of {op_type}-"
                                   f"{schema.since_version} is required, got an empty input")
    for name, code in attributes.items():
        spec = schema.attributes.get(name)
        if spec is None:
            raise SchemaCheckError(f"{where}: {op_type}-{schema.since_version} has no attribute "
                                   f"{name!r} (known: {sorted(schema.attributes)})")
        if int(spec.type) != code:  # type: ignore[call-overload]
            raise SchemaCheckError(
                f"{where}: attribute {name!r} of {op_type} must be {_ATTR_NAMES.get(int(spec.type))}, "  # type: ignore[call-overload]
                f"got {_ATTR_NAMES.get(code, code)}")
    for name, spec in schema.attributes.items():
        if spec.required and name not in attributes:
            raise SchemaCheckError(f"{where}: {op_type}-{schema.since_version} requires attribute {name!r}")
    return schema
