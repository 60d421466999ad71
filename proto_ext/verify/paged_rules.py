"""Static rules of the paged KV cache (K1-K12; RULES_PAGED.md has them in RULES.md's style).

Sources: M = ``spec/mutable-execution-cache.rst`` (M5 *Heterogeneous paged
cache*, M4 *Runtime contract*, M2 *Required alias*), V =
``spec/custom-quantized-persistent-values.md`` (V10 *Quantized and paged caches
use the same feedback*, V6 *One element type, many payload lengths*), D =
``DESIGN.md`` (D4 *Typing encoded values as graph values*, D5 *Decoder
registry*), F = the page formats document (``proto_ext/codecs/kvpages.py``).

- K1 PagedCacheUpdate takes inputs (cache, key, value, position), all given, and one output; output_alias {0, 0, MUST_ALIAS} is present. [M5, M2]
- K2 The cache input of PagedCacheUpdate and PagedAttention is typed TypeProto.struct_type: a category or a reference to an ONNXFORGE_PAGED_KV_CACHE declaration; PagedCacheUpdate's cache has a READ_WRITE root. [M5, M4, D4]
- K3 PagedCacheUpdate: key and value share T in {FLOAT, FLOAT16, BFLOAT16}, have rank 4 and equal concrete dims, dim 0 is 1; position is INT64 []; with a container reference, dim 1 == H, dim 3 == D and a constant position + n <= capacity. [M5, F]
- K4 PagedAttention takes (query, cache[, total_length]) and one output; query has a float T, rank 4 and dim 0 == 1; total_length is INT64 []; a typed output has the query's type. [M5]
- K5 PagedAttention attributes: num_heads and kv_num_heads are integers >= 1 with num_heads % kv_num_heads == 0; query dim 1 == num_heads where concrete; scale, if set, is finite and > 0; with a container reference, kv_num_heads == H and query dim 3 == D. [M5]
- K6 An ONNXFORGE_PAGED_KV_CACHE declaration has fields pages (sequence of a struct category), length (INT64 []), constants page_shape (INT64 [4] = [2, H, P, D], each >= 1) and capacity (INT64 [] >= 1); D % 32 == 0, P % 4 == 0 and the page size P divides the capacity; metadata onnxforge.paged.formats, if set, lists known format names. [M4, V10, F]
- K7 A page of a cache (encoded initializer "<cache>.pages[<i>]" where graph input <cache> is typed by a container reference) and every encoded value whose layout is named "ONNXFORGE_KV_..." uses a struct layout named by one of the seven format names (unknown formats rejected) with the structure its decoder reads (codebook table [-1, -0.25, 0.25, 1] included). [D5, F]
- K8 Such a page decodes to the container's logical element type and page shape: logical_type is FLOAT [2, H, P, D] (the container's, or for a value outside a cache its own concrete dims), the declaration's geometry equals it, and records x values per record == 2*H*P*D. [M5, V6, V10]
- K9 In a graph holding pages or the length of a cache: page ids are in [0, num_pages) (num_pages = capacity / P) and unique; "<cache>.length" is an INT64 [] initializer (reading: one integer element) with 0 <= length <= capacity; every page holding a token below length is present. [M4, V10]
- K10 RaggedPagedCacheUpdate takes inputs (cache, key, value, sequence_starts, position_ids), all given, and one output; output_alias {0, 0, MUST_ALIAS} is present; the cache is typed as in K2 and has a READ_WRITE root. [M5, M2, M4]
- K11 RaggedPagedCacheUpdate: key and value share T in {FLOAT, FLOAT16, BFLOAT16}, have rank 4 and dim 0 is 1; with a container reference, dim 1 == H and dim 3 == D; sequence_starts is INT64 of rank 1 and position_ids INT64 of rank 2. [M5, F]
- K12 RaggedPagedAttention takes (query, cache, sequence_starts) and one output; query has a float T, rank 4 and dim 0 == 1; sequence_starts is INT64 of rank 1; its attributes follow K5. [M5]

Example (the wire form of ``codecs.kvcache``; every rule holds)::

    struct_types  7001 ONNXFORGE_KV_INT4_PAGE, 7002 ONNXFORGE_PAGED_KV_CACHE (page_shape [2, 2, 8, 64],
                  capacity 32)
    graph input   cache: struct_type {type_ref: 7002}
    encoded       'cache.pages[0]': struct_type {type_ref: 7001}, FLOAT[2, 2, 8, 64], 1152 bytes
    initializer   'cache.length' = 5
"""
from __future__ import annotations

import math

import numpy as np
from onnx import TensorProto

from onnxforge.proto_ext.aliasing import ModelAliases, Scope, root_text, rw_root, type_of
from onnxforge.proto_ext.codecs.kvcache import CACHE_STRUCT_NAME, FORMATS_KEY, length_name, parse_page_name
from onnxforge.proto_ext.codecs.kvpages import (
    CODEBOOK_TABLE,
    FORMAT_OF_STRUCT,
    STRUCT_NAMES,
    declared_elements,
)
from onnxforge.proto_ext.codecs.registry import get_decoder
from onnxforge.proto_ext.errors import CodecError
from onnxforge.proto_ext.schema import MUST_ALIAS
from onnxforge.proto_ext.sizes import RecordLayout, SizeError
from onnxforge.proto_ext.types import (
    EncodedValue,
    SequenceType,
    StructType,
    TensorType,
    Type,
    type_name,
)
from onnxforge.proto_ext.verify.core import Report, iter_graphs, register
from onnxforge.proto_ext.view import GraphView, ModelView, NodeView

__all__ = ["PAGED_DOMAIN", "Geometry", "check_paged", "container_geometry"]

PAGED_DOMAIN = "ai.onnxforge"
_KV_TYPES = frozenset({TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16})
_PAGE_PREFIX = "ONNXFORGE_KV_"
_OPS = ("PagedCacheUpdate", "PagedAttention", "RaggedPagedCacheUpdate", "RaggedPagedAttention")
Geometry = tuple[int, int, int, int]  # (H, P, D, capacity)


@register("paged")
def check_paged(view: ModelView, report: Report) -> None:
    """K1-K12 over every graph and local function of ``view``."""
    containers: dict[int, Geometry | None] = {}
    for i, decl in enumerate(view.struct_types):
        if decl.name == CACHE_STRUCT_NAME and decl.type_id:
            path = f"model.struct_types[{i}](type_id={decl.type_id})"
            containers.setdefault(decl.type_id, _check_container(decl, path, report))
    bodies = [g.nodes for g in iter_graphs(view)] + [f.nodes for f in view.functions]
    if any(n.domain == PAGED_DOMAIN and n.op_type in _OPS for nodes in bodies for n in nodes):
        aliases = ModelAliases(view)
        for s in aliases.scopes:
            for node in s.nodes:
                if node.domain != PAGED_DOMAIN:
                    continue
                if node.op_type == "PagedCacheUpdate":
                    _update(aliases, s, node, containers, report)
                elif node.op_type == "PagedAttention":
                    _attention(s, node, containers, report)
                elif node.op_type == "RaggedPagedCacheUpdate":
                    _ragged_update(aliases, s, node, containers, report)
                elif node.op_type == "RaggedPagedAttention":
                    _ragged_attention(s, node, containers, report)
    for g in iter_graphs(view):
        _pages(g, containers, report)


# -- the container declaration (K6) --------------------------------------------------------------

def container_geometry(decl: StructType) -> Geometry | None:
    """``(H, P, D, capacity)`` of a well-formed ONNXFORGE_PAGED_KV_CACHE declaration, else None."""
    consts = {f.name: f.constant for f in decl.fields if f.constant is not None}
    try:
        shape = consts["page_shape"].array() if "page_shape" in consts else None
        cap = consts["capacity"].array() if "capacity" in consts else None
    except CodecError:
        return None
    if shape is None or cap is None or shape.dtype != np.int64 or shape.shape != (4,) or \
            cap.dtype != np.int64 or cap.shape != ():
        return None
    two, H, P, D = (int(v) for v in shape)
    if two != 2 or min(H, P, D) < 1 or int(cap) < 1:
        return None
    return H, P, D, int(cap)


def _check_container(decl: StructType, path: str, report: Report) -> Geometry | None:
    problems: list[str] = []
    if decl.kind != "structure":
        report.add("K6", path, f"{CACHE_STRUCT_NAME} must be a structure, not {decl.kind}")
        return None
    fields = {f.name: f for f in decl.fields}
    pages = fields.get("pages")
    if pages is None or not (isinstance(pages.type, SequenceType) and isinstance(pages.type.elem, StructType)
                             and pages.type.elem.kind is None):
        problems.append("field 'pages' must be a sequence of a struct category")
    length = fields.get("length")
    if length is None or length.type != TensorType(TensorProto.INT64, ()):
        problems.append("field 'length' must be INT64 []")
    geo = container_geometry(decl)
    if geo is None:
        problems.append("constants page_shape (INT64 [4] = [2, H, P, D], each >= 1) and capacity "
                        "(INT64 [], >= 1) are required")
    else:
        H, P, D, cap = geo
        if D % 32:
            problems.append(f"head size D={D} is not a multiple of 32")
        if P % 4:
            problems.append(f"page size P={P} is not a multiple of 4")
        if cap % P:
            problems.append(f"page size {P} does not divide the capacity {cap}")
    meta = dict(decl.metadata)
    if FORMATS_KEY in meta:
        names = meta[FORMATS_KEY].split(",")
        bad = [n for n in names if n not in STRUCT_NAMES]
        if bad or not names:
            problems.append(f"metadata {FORMATS_KEY}={meta[FORMATS_KEY]!r} names unknown formats {bad} "
                            f"(known: {', '.join(STRUCT_NAMES)})")
    for p in problems:
        report.add("K6", path, p)
    return None if problems else geo


def _geometry_of(t: Type, containers: dict[int, Geometry | None]) -> Geometry | None:
    if isinstance(t, StructType) and t.kind == "type_ref":
        return containers.get(t.type_ref or 0)
    return None


def _cache_type(s: Scope, node: NodeView, index: int, containers: dict[int, Geometry | None],
                report: Report) -> Geometry | None:
    # K2: the cache is a struct category or a container reference.
    name = node.inputs[index]
    t = type_of(s, name)
    if t is None:
        return None
    ok = isinstance(t, StructType) and (t.kind is None or (t.kind == "type_ref" and t.type_ref in containers))
    if not ok:
        report.add("K2", f"{node.path}.input[{index}]",
                   f"cache {name!r} is {t}; it must be typed TypeProto.struct_type: a category or a "
                   f"reference to an {CACHE_STRUCT_NAME} declaration")
        return None
    return _geometry_of(t, containers)


# -- PagedCacheUpdate (K1-K3) -------------------------------------------------------------------

def _ints(s: Scope | None, name: str) -> tuple[int, ...] | None:
    while s is not None:
        if name in s.defs:
            return s.ints.get(name)
        s = s.parent
    return None


def _update(a: ModelAliases, s: Scope, node: NodeView, containers: dict[int, Geometry | None],
            report: Report) -> None:
    p = node.path
    if len(node.inputs) != 4 or not all(node.inputs) or len(node.outputs) != 1 or not node.outputs[0]:
        report.add("K1", p, "PagedCacheUpdate takes inputs (cache, key, value, position) and one output")
        return
    if not any(al.output_index == 0 and al.input_index == 0 and al.kind == MUST_ALIAS for al in node.output_alias):
        report.add("K1", f"{p}.output_alias",
                   "PagedCacheUpdate needs output_alias {output_index: 0, input_index: 0, kind: MUST_ALIAS}")
    geo = _cache_type(s, node, 0, containers, report)
    r = a.root(s, node.inputs[0])
    if r is not None and not rw_root(r):
        report.add("K2", f"{p}.input[0]", f"the cache {node.inputs[0]!r} is updated in place, but its root "
                                          f"is {root_text(r)}, not a READ_WRITE input")
    key, value, position = (type_of(s, n) for n in node.inputs[1:])
    for i, t in ((1, key), (2, value)):
        if t is None:
            continue
        if not isinstance(t, TensorType) or t.elem_type not in _KV_TYPES:
            report.add("K3", f"{p}.input[{i}]", f"{node.inputs[i]!r} is {t}; key and value are FLOAT, "
                                                f"FLOAT16 or BFLOAT16 tensors [1, Hkv, n, D]")
        elif t.shape is not None and len(t.shape) != 4:
            report.add("K3", f"{p}.input[{i}]", f"{node.inputs[i]!r} has rank {len(t.shape)}, not 4")
        elif t.shape is not None and isinstance(t.shape[0], int) and t.shape[0] != 1:
            report.add("K3", f"{p}.input[{i}]", f"{node.inputs[i]!r} has batch {t.shape[0]}; a paged cache "
                                                f"holds one sequence (batch 1)")
    if isinstance(key, TensorType) and isinstance(value, TensorType):
        _same_kv(node, key, value, report)
    if position is not None and not (isinstance(position, TensorType) and position.elem_type == TensorProto.INT64
                                     and (position.shape is None or len(position.shape) == 0)):
        report.add("K3", f"{p}.input[3]", f"position {node.inputs[3]!r} must be INT64 [], not {position}")
    if geo is not None and isinstance(key, TensorType) and key.shape is not None and len(key.shape) == 4:
        H, _P, D, cap = geo
        for dim, want, what in ((1, H, "kv heads"), (3, D, "head size")):
            got = key.shape[dim]
            if isinstance(got, int) and got != want:
                report.add("K3", f"{p}.input[1]", f"key dimension {dim} ({what}) is {got}, the cache "
                                                  f"has {want}")
        n = key.shape[2]
        positions = _ints(s, node.inputs[3])
        if positions and isinstance(n, int):
            bad = [q for q in positions if q < 0 or q + n > cap]
            if bad:
                report.add("K3", f"{p}.input[3]", f"position {bad[0]} + {n} tokens does not fit the "
                                                  f"capacity {cap}")


def _same_kv(node: NodeView, key: TensorType, value: TensorType, report: Report) -> None:
    if key.elem_type != value.elem_type:
        report.add("K3", f"{node.path}.input[2]", f"value is {type_name(value.elem_type)}, key is "
                                                  f"{type_name(key.elem_type)}")
    if key.shape is None or value.shape is None or len(key.shape) != len(value.shape):
        return
    for i, (k, v) in enumerate(zip(key.shape, value.shape)):
        if isinstance(k, int) and isinstance(v, int) and k != v:
            report.add("K3", f"{node.path}.input[2]", f"value dimension {i} is {v}, key has {k}")


# -- the ragged batch form (K10-K12) ------------------------------------------------------------

def _int64_of_rank(s: Scope, node: NodeView, i: int, rank: int, what: str, rule: str, report: Report) -> None:
    t = type_of(s, node.inputs[i])
    if t is not None and not (isinstance(t, TensorType) and t.elem_type == TensorProto.INT64
                              and (t.shape is None or len(t.shape) == rank)):
        report.add(rule, f"{node.path}.input[{i}]", f"{what} {node.inputs[i]!r} must be INT64 of rank {rank}, "
                                                    f"not {t}")


def _ragged_update(a: ModelAliases, s: Scope, node: NodeView, containers: dict[int, Geometry | None],
                   report: Report) -> None:
    p = node.path
    if len(node.inputs) != 5 or not all(node.inputs) or len(node.outputs) != 1 or not node.outputs[0]:
        report.add("K10", p, "RaggedPagedCacheUpdate takes inputs (cache, key, value, sequence_starts, "
                             "position_ids) and one output")
        return
    if not any(al.output_index == 0 and al.input_index == 0 and al.kind == MUST_ALIAS for al in node.output_alias):
        report.add("K10", f"{p}.output_alias", "RaggedPagedCacheUpdate needs output_alias {output_index: 0, "
                                               "input_index: 0, kind: MUST_ALIAS}")
    geo = _cache_type(s, node, 0, containers, report)
    r = a.root(s, node.inputs[0])
    if r is not None and not rw_root(r):
        report.add("K10", f"{p}.input[0]", f"the cache batch {node.inputs[0]!r} is updated in place, but its "
                                           f"root is {root_text(r)}, not a READ_WRITE input")
    key, value = type_of(s, node.inputs[1]), type_of(s, node.inputs[2])
    for i, t in ((1, key), (2, value)):
        if t is None:
            continue
        if not isinstance(t, TensorType) or t.elem_type not in _KV_TYPES or (t.shape is not None and (
                len(t.shape) != 4 or (isinstance(t.shape[0], int) and t.shape[0] != 1))):
            report.add("K11", f"{p}.input[{i}]", f"{node.inputs[i]!r} is {t}; key and value are FLOAT, FLOAT16 "
                                                 f"or BFLOAT16 tensors [1, Hkv, T, D] (all sequences' rows)")
        elif geo is not None and t.shape is not None:
            for dim, want in ((1, geo[0]), (3, geo[2])):
                if isinstance(t.shape[dim], int) and t.shape[dim] != want:
                    report.add("K11", f"{p}.input[{i}]", f"dimension {dim} is {t.shape[dim]}, the cache has "
                                                         f"{want}")
    if isinstance(key, TensorType) and isinstance(value, TensorType) and key.elem_type != value.elem_type:
        report.add("K11", f"{p}.input[2]", f"value is {type_name(value.elem_type)}, key is "
                                           f"{type_name(key.elem_type)}")
    _int64_of_rank(s, node, 3, 1, "sequence_starts", "K11", report)
    _int64_of_rank(s, node, 4, 2, "position_ids", "K11", report)


def _ragged_attention(s: Scope, node: NodeView, containers: dict[int, Geometry | None], report: Report) -> None:
    p = node.path
    if len(node.inputs) != 3 or not all(node.inputs) or len(node.outputs) != 1 or not node.outputs[0]:
        report.add("K12", p, "RaggedPagedAttention takes inputs (query, cache, sequence_starts) and one output")
        return
    geo = _cache_type(s, node, 1, containers, report)
    q = type_of(s, node.inputs[0])
    qshape = None
    if q is not None:
        if not isinstance(q, TensorType) or q.elem_type not in _KV_TYPES or (q.shape is not None and (
                len(q.shape) != 4 or (isinstance(q.shape[0], int) and q.shape[0] != 1))):
            report.add("K12", f"{p}.input[0]", f"query {node.inputs[0]!r} is {q}; it must be a FLOAT, FLOAT16 "
                                               f"or BFLOAT16 tensor [1, Hq, T, D]")
        else:
            qshape = q.shape
    _int64_of_rank(s, node, 2, 1, "sequence_starts", "K12", report)
    _attention_attributes(node, qshape, geo, report)


# -- PagedAttention (K4, K5) --------------------------------------------------------------------

def _attention(s: Scope, node: NodeView, containers: dict[int, Geometry | None], report: Report) -> None:
    p = node.path
    if not 2 <= len(node.inputs) <= 3 or not node.inputs[0] or not node.inputs[1] or \
            len(node.outputs) != 1 or not node.outputs[0]:
        report.add("K4", p, "PagedAttention takes inputs (query, cache[, total_length]) and one output")
        return
    geo = _cache_type(s, node, 1, containers, report)
    q = type_of(s, node.inputs[0])
    qshape = None
    if q is not None:
        if not isinstance(q, TensorType) or q.elem_type not in _KV_TYPES:
            report.add("K4", f"{p}.input[0]", f"query {node.inputs[0]!r} is {q}; it must be a FLOAT, "
                                              f"FLOAT16 or BFLOAT16 tensor [1, Hq, S, D]")
        elif q.shape is not None and len(q.shape) != 4:
            report.add("K4", f"{p}.input[0]", f"query {node.inputs[0]!r} has rank {len(q.shape)}, not 4")
        elif q.shape is not None:
            qshape = q.shape
            if isinstance(q.shape[0], int) and q.shape[0] != 1:
                report.add("K4", f"{p}.input[0]", f"query batch is {q.shape[0]}; a paged cache holds "
                                                  f"one sequence (batch 1)")
    if len(node.inputs) == 3 and node.inputs[2]:
        tl = type_of(s, node.inputs[2])
        if tl is not None and not (isinstance(tl, TensorType) and tl.elem_type == TensorProto.INT64
                                   and (tl.shape is None or len(tl.shape) == 0)):
            report.add("K4", f"{p}.input[2]", f"total_length {node.inputs[2]!r} must be INT64 [], not {tl}")
    out = type_of(s, node.outputs[0])
    if isinstance(out, TensorType) and isinstance(q, TensorType) and (qshape is not None or q.shape is None):
        same_elem = out.elem_type in (0, q.elem_type)
        same_dims = out.shape is None or q.shape is None or (len(out.shape) == len(q.shape) and all(
            not (isinstance(a, int) and isinstance(b, int)) or a == b for a, b in zip(out.shape, q.shape)))
        if not (same_elem and same_dims):
            report.add("K4", f"{p}.output[0]", f"output {out} must have the query's type {q}")
    _attention_attributes(node, qshape, geo, report)


def _attention_attributes(node: NodeView, qshape: tuple | None, geo: Geometry | None, report: Report) -> None:
    p = node.path
    heads = node.attributes.get("num_heads")
    kv = node.attributes.get("kv_num_heads")
    for name, v in (("num_heads", heads), ("kv_num_heads", kv)):
        if not isinstance(v, int) or v < 1:
            report.add("K5", f"{p}.attribute[{name!r}]", f"{name} must be an integer >= 1, got {v!r}")
    scale = node.attributes.get("scale")
    if scale is not None and not (isinstance(scale, float) and math.isfinite(scale) and scale > 0):
        report.add("K5", f"{p}.attribute['scale']", f"scale must be a finite float > 0, got {scale!r}")
    if not (isinstance(heads, int) and isinstance(kv, int) and heads >= 1 and kv >= 1):
        return
    if heads % kv:
        report.add("K5", p, f"num_heads {heads} is not a multiple of kv_num_heads {kv}")
    if qshape is not None and isinstance(qshape[1], int) and qshape[1] != heads:
        report.add("K5", f"{p}.input[0]", f"query has {qshape[1]} heads, num_heads is {heads}")
    if geo is not None:
        H, _P, D, _cap = geo
        if kv != H:
            report.add("K5", f"{p}.attribute['kv_num_heads']", f"kv_num_heads {kv} differs from the "
                                                              f"cache's {H} kv heads")
        if qshape is not None and isinstance(qshape[3], int) and qshape[3] != D:
            report.add("K5", f"{p}.input[0]", f"query head size {qshape[3]} differs from the cache's {D}")


# -- pages of serialized caches (K7-K9) ---------------------------------------------------------

def _pages(g: GraphView, containers: dict[int, Geometry | None], report: Report) -> None:
    caches: dict[str, Geometry | None] = {}
    for spec in g.inputs:
        t = spec.type
        if isinstance(t, StructType) and t.kind == "type_ref" and t.type_ref in containers:
            caches[spec.name] = containers[t.type_ref]
    seen: dict[str, set[int]] = {name: set() for name in caches}
    for j, ev in enumerate(g.encoded):
        path = f"{g.path}.encoded_initializer[{ev.name!r}]" if ev.name else f"{g.path}.encoded_initializer[{j}]"
        parsed = parse_page_name(ev.name)
        in_cache = parsed is not None and parsed[0] in caches
        decl = _layout_decl(ev, report)
        if not in_cache and (decl is None or not decl.name.startswith(_PAGE_PREFIX)):
            continue  # not a page: the P/S rules cover it
        where = f"page {parsed[1]} of cache {parsed[0]!r}" if in_cache and parsed else "page value"
        geo = caches[parsed[0]] if in_cache and parsed else None
        if in_cache and parsed:
            cache, index = parsed
            if geo is not None and index >= geo[3] // geo[1]:
                report.add("K9", path, f"{where}: page id {index} is outside [0, {geo[3] // geo[1]})")
            seen[cache].add(index)
        _page(ev, decl, path, where, geo, in_cache, report)
    for name, geo in caches.items():
        # a cache input with neither pages nor a length here is fed at run time (a model's input)
        serialized = bool(seen[name]) or length_name(name) in g.initializers
        if geo is not None and serialized:
            _length(g, name, geo, seen[name], report)


def _layout_decl(ev: EncodedValue, report: Report) -> StructType | None:
    st = ev.struct_type
    if st is None:
        return None
    return report.catalogue.resolve(st) if st.kind == "type_ref" else st


def _page(ev: EncodedValue, decl: StructType | None, path: str, where: str, geo: Geometry | None,
          in_cache: bool, report: Report) -> None:
    fmt = FORMAT_OF_STRUCT.get(decl.name) if decl is not None else None
    if fmt is None:
        what = "an affine layout" if ev.affine is not None else (
            f"struct type {decl.name!r}" if decl is not None else "no resolvable struct layout")
        report.add("K7", path, f"{where}: {what} is not a page format (the formats are "
                               f"{', '.join(STRUCT_NAMES.values())})")
        return
    try:
        layout = report.layouts.record_layout(ev.struct_type, f"{path}.struct_type")
    except SizeError:
        return  # the C, T, S or P rules report it
    native = get_decoder(decl.name)
    try:
        if native is not None:
            native.check(layout, f"{path}.struct_type")
        per_record, fixed = declared_elements(fmt, layout)
    except (CodecError, KeyError) as exc:
        report.add("K7", f"{path}.struct_type", f"{where}: the {fmt} declaration {decl.name!r} does not have "
                                                f"the format's structure: {exc}")
        return
    if fmt == "codebook" and not _codebook_table_ok(layout):
        report.add("K7", f"{path}.struct_type", f"{where}: the codebook table must be {CODEBOOK_TABLE.tolist()}")
        return
    _page_shape(ev, fmt, layout.bytes, per_record, fixed, path, where, geo, in_cache, report)


def _codebook_table_ok(layout: RecordLayout) -> bool:
    try:
        table = layout.leaf("block.quantized.codebook").constant.array()
    except (KeyError, AttributeError, CodecError):
        return False
    return table.dtype == np.float32 and table.shape == (4,) and bool(np.array_equal(table, CODEBOOK_TABLE))


def _page_shape(ev: EncodedValue, fmt: str, record_bytes: int, per_record: int, fixed: dict[str, int],
                path: str, where: str, geo: Geometry | None, in_cache: bool, report: Report) -> None:
    lt = ev.logical_type
    if in_cache and geo is None:
        return  # the container is malformed (K6)
    if geo is not None:
        H, P, D, _cap = geo
        want: tuple[int, ...] = (2, H, P, D)
    elif isinstance(lt, TensorType) and lt.shape is not None and len(lt.shape) == 4 and \
            all(isinstance(d, int) for d in lt.shape) and lt.shape[0] == 2:
        want = tuple(lt.shape)
    else:
        report.add("K8", f"{path}.logical_type", f"{where}: a page's logical type is FLOAT [2, H, P, D], "
                                                 f"got {lt}")
        return
    if not (isinstance(lt, TensorType) and lt.elem_type == TensorProto.FLOAT and lt.shape == want):
        report.add("K8", f"{path}.logical_type", f"{where}: logical type {lt} differs from the cache's "
                                                 f"FLOAT{list(want)}")
    _, H, P, D = want
    for k, v in fixed.items():
        have = {"H": H, "P": P, "D": D}[k]
        if v != have:
            report.add("K8", f"{path}.struct_type", f"{where}: the {fmt} declaration encodes {k}={v}, the "
                                                    f"page shape has {k}={have}")
            return
    payload = ev.inline_nbytes() if not ev.is_external else None
    if payload is None or payload % record_bytes:
        return  # external extents and partial records are P/S matters
    decoded = payload // record_bytes * per_record
    if decoded != 2 * H * P * D:
        report.add("K8", path, f"{where}: {payload} bytes of {fmt} records decode to {decoded} values, the "
                               f"page shape {list(want)} has {2 * H * P * D}")


def _length(g: GraphView, cache: str, geo: Geometry, held: set[int], report: Report) -> None:
    H, P, D, cap = geo
    name = length_name(cache)
    path = f"{g.path}.initializer[{name!r}]"
    values = g.int_values.get(name)
    if name not in g.initializers or values is None or len(values) != 1:
        report.add("K9", path, f"cache {cache!r} needs an INT64 [] initializer {name!r} (its valid length)")
        return
    length = values[0]
    if not 0 <= length <= cap:
        report.add("K9", path, f"cache {cache!r}: length {length} is outside [0, capacity={cap}]")
        return
    missing = [i for i in range(-(-length // P)) if i not in held]
    if missing:
        report.add("K9", f"{g.path}.encoded_initializer", f"cache {cache!r}: page {missing[0]} holds tokens "
                                                          f"below length {length} but is missing")
