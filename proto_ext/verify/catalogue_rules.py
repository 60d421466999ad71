"""Static rules C1-C8, T1-T7, S1-S6, A1-A8 and P1-P6 of RULES.md.

Three registered checks run over the :class:`~onnxforge.proto_ext.view.ModelView`:

* ``C`` (catalogue and identity): every catalogue entry, and every struct type
  wherever it occurs (graph and function value types, encoded-value layouts and
  logical types, struct fields and array elements, sequence/optional/map
  members), in the main graph, every subgraph and every local function.
* ``T`` (struct type structure): every declaration found by the same walk.
* ``P`` (payloads): every encoded initializer of every graph, with the size
  rules S1-S5 for struct layouts and A1-A8 for affine layouts.

Each defect is reported once, under its most specific rule:

* a catalogue entry that is not a declaration is C1 only; a category used as a
  payload layout is P2 only; a reference carrying a type_id is C4 (not C5);
* an encoded value whose layout cannot be sized because a reference does not
  resolve (C1/C2/C3/C7) or a declaration is malformed (T2-T5) gets no S
  violation: the C or T check reports the cause;
* A2 (logical type of an affine value) takes precedence over P6, and the
  shape-dependent affine checks are skipped while A1/A2/A3 fail;
* a payload that would fit a naturally aligned (padded) record but not the
  tight one is reported as S3 (fields are consecutive without padding) instead
  of S5.

Rule C8 holds by construction: resolution goes through ``type_id`` alone, the
cycle check works on the id graph, and every layout check that would depend on
which of several duplicate declarations wins is skipped (C2 reports them).
Rule S6 is a permission: nothing requires a count or a physical shape, so
values sharing a type_ref may have different payload lengths.
"""
from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass

from onnx import TensorProto

from onnxforge.proto_ext.errors import ExternalDataError
from onnxforge.proto_ext.catalogue import Catalogue
from onnxforge.proto_ext.codecs.affine import STORAGE_BITS, affine_payload_nbytes
from onnxforge.proto_ext.external import check_extent, check_location, parse_external_entries
from onnxforge.proto_ext.sizes import LayoutCache, SizeError, field_path
from onnxforge.proto_ext.types import (
    BITS,
    ELEM_TYPES,
    FLOAT_TYPES,
    AffineLayout,
    Constant,
    EncodedValue,
    MapType,
    OptionalType,
    SequenceType,
    SparseTensorType,
    StructType,
    TensorType,
    Type,
    type_name,
)
from onnxforge.proto_ext.verify.core import Report, iter_graphs, register
from onnxforge.proto_ext.view import GraphView, ModelView

__all__ = [
    "StructSite",
    "AFFINE_STORAGE_TYPES",
    "iter_graphs",
    "iter_struct_sites",
    "check_catalogue",
    "check_struct_types",
    "check_encoded_values",
]

AFFINE_STORAGE_TYPES = frozenset(STORAGE_BITS)
# Rules that the size computation may raise and that the P check reports itself;
# the others (C1-C3, C7, T2-T5) are reported by the C and T checks.
_SIZE_RULES = frozenset({"S1", "S2", "S4", "P2"})


@dataclass(frozen=True, slots=True)
class StructSite:
    """One StructTypeProto occurrence: ``where`` is ``"catalogue"`` (a top-level entry),
    ``"layout"`` (an ``EncodedValueProto.struct_type``) or ``"type"`` (a
    ``TypeProto.struct_type``: value types, fields, array elements, members)."""

    struct: StructType
    path: str
    where: str


# -- walking the model -----------------------------------------------------------------------


def _entry_path(index: int, entry: StructType) -> str:
    if entry.type_id:
        return f"struct_types[{index}](type_id={entry.type_id})"
    if entry.name:
        return f"struct_types[{index}]({entry.name!r})"
    return f"struct_types[{index}]"


def _sites_in_type(t: Type, path: str) -> Iterator[StructSite]:
    """Struct occurrences inside a type record found at TypeProto path ``path``."""
    if isinstance(t, StructType):
        yield from _sites_in_struct(t, f"{path}.struct_type", "type")
    elif isinstance(t, (SequenceType, OptionalType)):
        member = "sequence_type" if isinstance(t, SequenceType) else "optional_type"
        yield from _sites_in_type(t.elem, f"{path}.{member}.elem_type")
    elif isinstance(t, MapType):
        yield from _sites_in_type(t.value, f"{path}.map_type.value_type")


def _sites_in_struct(st: StructType, path: str, where: str) -> Iterator[StructSite]:
    yield StructSite(st, path, where)
    for i, f in enumerate(st.fields):
        if f.type is not None:
            yield from _sites_in_type(f.type, f"{field_path(path, f.name, i)}.type")
    if st.array is not None and st.array.element_type is not None:
        yield from _sites_in_type(st.array.element_type, f"{path}.array.element_type")


def _encoded_path(g: GraphView, ev: EncodedValue, index: int) -> str:
    return f"{g.path}.encoded_initializer[{ev.name!r}]" if ev.name else f"{g.path}.encoded_initializer[{index}]"


def iter_struct_sites(view: ModelView) -> Iterator[StructSite]:
    """Every struct type occurrence of the model with its object path."""
    for i, entry in enumerate(view.struct_types):
        yield from _sites_in_struct(entry, _entry_path(i, entry), "catalogue")
    for g in iter_graphs(view):
        for kind, values in (("input", g.inputs), ("output", g.outputs), ("value_info", g.value_infos)):
            for v in values:
                yield from _sites_in_type(v.type, f"{g.path}.{kind}[{v.name!r}].type")
        for j, ev in enumerate(g.encoded):
            epath = _encoded_path(g, ev, j)
            if ev.struct_type is not None:
                yield from _sites_in_struct(ev.struct_type, f"{epath}.struct_type", "layout")
            yield from _sites_in_type(ev.logical_type, f"{epath}.logical_type")
    for f in view.functions:
        for v in f.value_infos:
            yield from _sites_in_type(v.type, f"{f.path}.value_info[{v.name!r}].type")


def _refs_anywhere(st: StructType) -> Iterator[int]:
    """Every type_ref inside ``st`` (through members too), references not followed."""
    for site in _sites_in_struct(st, "", "type"):
        if site.struct.kind == "type_ref":
            yield site.struct.type_ref or 0


# -- C1-C8 ------------------------------------------------------------------------------------


@register("C")
def check_catalogue(view: ModelView, report: Report) -> None:
    """C1-C7 (C8 by construction: nothing here depends on catalogue order)."""
    catalogue = report.catalogue
    where_ids: dict[int, list[int]] = defaultdict(list)
    for i, entry in enumerate(view.struct_types):
        path = _entry_path(i, entry)
        if not entry.is_declaration:
            what = "a reference" if entry.is_reference else "a category (no kind)"
            report.add("C1", path, f"a catalogue entry must be a declaration (structure, array or "
                                   f"bit_packing), not {what}")
        elif not entry.type_id:
            report.add("C1", path, "a catalogue declaration needs a nonzero type_id")
        else:
            where_ids[entry.type_id].append(i)
    for type_id, indices in where_ids.items():
        if len(indices) > 1:
            report.add("C2", _entry_path(indices[0], view.struct_types[indices[0]]),
                       f"type_id={type_id} is declared by struct_types{indices}; "
                       "each type_id has exactly one declaration")

    for site in iter_struct_sites(view):
        if site.where == "catalogue":
            continue  # C1 covers top-level entries
        st, path = site.struct, site.path
        if st.is_reference:
            extra = _reference_extras(st)
            if extra:
                report.add("C4", path, f"a reference sets only type_ref, but also sets {', '.join(extra)}")
            if not st.type_ref or st.type_ref not in catalogue:
                report.add("C3", f"{path}.type_ref",
                           f"type_ref={st.type_ref}: no declaration with this type_id in model.struct_types")
        elif st.is_category:
            if site.where == "layout":
                continue  # P2
            codecs = [n for n in ("decoder", "encoder") if getattr(st, n) is not None]
            if codecs:
                report.add("C6", path, f"a category (struct without kind) has no codecs, but sets "
                                       f"{' and '.join(codecs)}")
            if st.type_id is not None:
                report.add("C5", f"{path}.type_id",
                           f"type_id={st.type_id}: only top-level model.struct_types entries set type_id")
        elif st.type_id is not None:
            report.add("C5", f"{path}.type_id",
                       f"type_id={st.type_id}: only top-level model.struct_types entries set type_id; "
                       "an inline declaration cannot be referenced")
    _check_cycles(view, report)


def _reference_extras(st: StructType) -> list[str]:
    extra = []
    for attr, label in (("decoder", "decoder"), ("encoder", "encoder"), ("type_id", "type_id")):
        if getattr(st, attr) is not None:
            extra.append(label)
    for attr, label in (("name", "name"), ("doc_string", "doc_string"), ("metadata", "metadata_props")):
        if getattr(st, attr):
            extra.append(label)
    return extra


def _check_cycles(view: ModelView, report: Report) -> None:
    """C7 on the graph type_id -> referenced type_ids (all declarations of an id count)."""
    edges: dict[int, set[int]] = defaultdict(set)
    first_entry: dict[int, int] = {}
    for i, entry in enumerate(view.struct_types):
        if entry.is_declaration and entry.type_id:
            first_entry.setdefault(entry.type_id, i)
            edges[entry.type_id].update(r for r in _refs_anywhere(entry) if r in report.catalogue)
    if not any(edges.values()):
        return
    import networkx as nx

    graph = nx.DiGraph()
    for src, dsts in edges.items():
        graph.add_node(src)
        graph.add_edges_from((src, d) for d in dsts)
    for component in nx.strongly_connected_components(graph):
        members = sorted(component)
        head = members[0]
        if len(members) == 1 and not graph.has_edge(head, head):
            continue
        path = _entry_path(first_entry[head], view.struct_types[first_entry[head]])
        if len(members) == 1:
            report.add("C7", path, f"type_id={head} references itself")
        else:
            report.add("C7", path, f"type_ids {members} reference each other in a cycle")


# -- T1-T7 ------------------------------------------------------------------------------------


def _type_problem(t: Type, path: str) -> tuple[str, str] | None:
    """First defect of a TypeProto record (no case set, UNDEFINED or unknown elem_type),
    recursively through members; nested struct types are checked as their own sites."""
    if t is None:
        return path, "the TypeProto has no case set"
    if isinstance(t, (TensorType, SparseTensorType)):
        case = "tensor_type" if isinstance(t, TensorType) else "sparse_tensor_type"
        if t.elem_type not in ELEM_TYPES:
            return f"{path}.{case}.elem_type", f"elem_type {type_name(t.elem_type)} is not a defined element type"
        return None
    if isinstance(t, (SequenceType, OptionalType)):
        member = "sequence_type" if isinstance(t, SequenceType) else "optional_type"
        return _type_problem(t.elem, f"{path}.{member}.elem_type")
    if isinstance(t, MapType):
        if t.key_type not in ELEM_TYPES:
            return f"{path}.map_type.key_type", f"key_type {type_name(t.key_type)} is not a defined element type"
        return _type_problem(t.value, f"{path}.map_type.value_type")
    return None


def _check_names(names: list[str], paths: list[str], what: str, report: Report) -> None:
    """T1 for one parent: non-empty, unique and dot-free names."""
    counts: dict[str, int] = defaultdict(int)
    for name in names:
        counts[name] += 1
    reported: set[str] = set()
    for name, path in zip(names, paths):
        if not name:
            report.add("T1", path, f"the {what} has an empty name")
        elif "." in name:
            report.add("T1", path, f"{what} name {name!r} contains '.', which separates decoder input paths")
        elif counts[name] > 1 and name not in reported:
            reported.add(name)
            report.add("T1", path, f"{what} name {name!r} occurs {counts[name]} times in its parent")


def _check_constant(c: Constant, path: str, report: Report) -> None:
    """T6."""
    if c.data_type not in ELEM_TYPES:
        report.add("T6", path, f"data_type {type_name(c.data_type)} is not a defined element type")
    elif any(d < 0 for d in c.dims):
        report.add("T6", path, f"dims {list(c.dims)} has a negative dimension")
    elif c.stored != math.prod(c.dims):
        report.add("T6", path, f"dims {list(c.dims)} need {math.prod(c.dims)} elements, "
                               f"but {max(c.stored, 0)} are stored")


def _check_declaration(st: StructType, path: str, layouts: LayoutCache, report: Report) -> None:
    """T1-T7 for one declaration."""
    if st.kind == "structure":
        fpaths = [field_path(path, f.name, i) for i, f in enumerate(st.fields)]
        _check_names([f.name for f in st.fields], fpaths, "field", report)
        for f, fpath in zip(st.fields, fpaths):
            has_type = f.type is not None or f.has_type
            if has_type and f.constant is not None:
                report.add("T2", fpath, "the field sets both type and constant")
            elif not has_type and f.constant is None:
                report.add("T2", fpath, "the field sets neither type nor constant")
            elif f.constant is not None:
                _check_constant(f.constant, f"{fpath}.constant", report)
            if has_type:
                problem = _type_problem(f.type, f"{fpath}.type")
                if problem:
                    report.add("T3", *problem)
        _check_decoder(st, path, layouts, report)
    elif st.kind == "array":
        a = st.array
        if a is None or a.element_type is None:
            report.add("T4", f"{path}.array.element_type", "the array sets no element_type")
        else:
            problem = _type_problem(a.element_type, f"{path}.array.element_type")
            if problem:
                report.add("T3", *problem)
        dimension = a.dimension if a is not None else 0
        if dimension < 1:
            report.add("T4", f"{path}.array.dimension", f"dimension {dimension} is not >= 1")
    elif st.kind == "bit_packing":
        b = st.bit_packing
        components = b.components if b is not None else ()
        if not components:
            report.add("T5", f"{path}.bit_packing", "the bit packing has no component")
        cpaths = [f"{path}.bit_packing.component[{i}]" for i in range(len(components))]
        _check_names([c.name for c in components], cpaths, "component", report)
        for c, cpath in zip(components, cpaths):
            if not 1 <= c.bit_width <= 64:
                report.add("T5", f"{cpath}.bit_width", f"bit_width {c.bit_width} is not in 1..64")
        dimension = b.dimension if b is not None else 0
        if dimension < 1:
            report.add("T5", f"{path}.bit_packing.dimension", f"dimension {dimension} is not >= 1")


def _check_decoder(st: StructType, path: str, layouts: LayoutCache, report: Report) -> None:
    """T7: one output, one input per leaf in declaration order, named by dotted path."""
    decoder = st.decoder
    if decoder is None:
        return
    dpath = f"{path}.decoder"
    if len(decoder.outputs) != 1:
        report.add("T7", dpath, f"a decoder has exactly one output, not {len(decoder.outputs)}")
    try:
        count = layouts.leaf_count(st, path)
        if count != len(decoder.inputs):
            shown = layouts.leaf_paths(st, path) if count <= 64 else None
            expected = f": {shown}" if shown is not None else ""
            report.add("T7", dpath, f"the decoder has {len(decoder.inputs)} inputs {list(decoder.inputs)}, "
                                    f"but the structure has {count} leaves{expected}")
            return
        expected_names = layouts.leaf_paths(st, path)
    except SizeError:
        return  # an unresolvable reference: C1/C2/C3/C7 report it
    for i, (got, want) in enumerate(zip(decoder.inputs, expected_names)):
        if got != want:
            report.add("T7", f"{dpath}.input[{i}]",
                       f"input {got!r} should be {want!r}: inputs are the leaves in declaration order "
                       f"{expected_names}")
            return


@register("T")
def check_struct_types(view: ModelView, report: Report) -> None:
    """T1-T7 for every declaration of the model (catalogue and inline)."""
    layouts = report.layouts
    for site in iter_struct_sites(view):
        if site.struct.is_declaration:
            _check_declaration(site.struct, site.path, layouts, report)


# -- P1-P6, S1-S6, A1-A8 ----------------------------------------------------------------------


def _payload_bytes(ev: EncodedValue, path: str, model_dir: str | None, report: Report) -> int | None:
    """P3-P5; the payload size in bytes, or None when it is not known reliably."""
    inline = len(ev.raw_data)
    if inline and ev.external_data:
        report.add("P3", path, f"raw_data ({inline} bytes) and external_data are both set")
        return None
    location = ev.data_location
    if location not in (None, TensorProto.DEFAULT, TensorProto.EXTERNAL):
        report.add("P4", f"{path}.data_location", f"data_location {location!r} is neither DEFAULT nor EXTERNAL")
        return None
    epath = f"{path}.external_data"
    if location != TensorProto.EXTERNAL:
        if ev.external_data:
            report.add("P4", epath, "external_data is set but data_location is not EXTERNAL")
            return None
        return inline
    if inline:
        report.add("P4", f"{path}.data_location", "data_location is EXTERNAL but the payload is inline raw_data")
        return None
    try:
        ref = parse_external_entries(ev.external_data, path=epath, require_length=True)
    except ExternalDataError as exc:
        report.add(exc.rule or "P4", epath, exc.detail)
        return None
    try:
        if model_dir is None:
            check_location(ref.location, path=epath)
        else:
            check_extent(model_dir, ref, path=epath)
    except ExternalDataError as exc:
        report.add(exc.rule or "P5", epath, exc.detail)
    return ref.length


def _natural_bytes(t: Type, catalogue: Catalogue) -> tuple[int, int]:
    """(size, alignment) in bytes of a naturally aligned C-like layout of a type whose
    tight layout is known to be valid: the S3 diagnostic for padded payloads."""
    if isinstance(t, TensorType):
        width, count = BITS[t.elem_type], math.prod(t.shape)
        if width >= 8:
            return count * (width // 8), min(width // 8, 8)
        return (count * width + 7) // 8, 1
    if not isinstance(t, StructType):
        return 0, 1
    if t.kind == "type_ref":
        return _natural_bytes(catalogue.get(t.type_ref), catalogue)
    if t.kind == "array":
        size, align = _natural_bytes(t.array.element_type, catalogue)
        return t.array.dimension * size, align
    if t.kind == "bit_packing":
        return (t.bit_packing.dimension * sum(c.bit_width for c in t.bit_packing.components) + 7) // 8, 1
    offset, struct_align = 0, 1
    for f in t.fields:
        if f.constant is not None:
            continue
        size, align = _natural_bytes(f.type, catalogue)
        offset = -(-offset // align) * align + size
        struct_align = max(struct_align, align)
    return -(-offset // struct_align) * struct_align, struct_align


def _check_struct_payload(ev: EncodedValue, path: str, payload: int | None,
                          layouts: LayoutCache, report: Report) -> None:
    """P2 and S1-S5 for a struct layout."""
    st = ev.struct_type
    spath = f"{path}.struct_type"
    if st.is_category:
        report.add("P2", spath, "a category (struct without kind) is never a payload layout; use a "
                                "type_ref or an inline declaration")
        return
    try:
        element_bytes = layouts.element_bytes(st, spath)
    except SizeError as exc:
        if exc.rule in _SIZE_RULES:
            where = exc.path[len(spath):].lstrip(".") if exc.path.startswith(spath) else exc.path
            report.add(exc.rule, spath, f"not byte-encodable: {where + ': ' if where else ''}{exc.detail}")
        return
    if payload is None or payload % element_bytes == 0:
        return  # S5: payload / element_bytes records (S6: any count is fine)
    try:
        natural: int | None = _natural_bytes(st, layouts.catalogue)[0]
    except RecursionError:  # a very deep reference chain: skip the diagnostic
        natural = None
    if natural and natural != element_bytes and payload % natural == 0:
        report.add("S3", path, f"{payload} payload bytes are {payload // natural} naturally aligned records "
                               f"of {natural} bytes, but fields are consecutive without implicit padding: "
                               f"one record is {element_bytes} bytes")
    else:
        report.add("S5", path, f"{payload} payload bytes are not a whole number of {element_bytes}-byte "
                               f"records ({payload // element_bytes} records + {payload % element_bytes} bytes)")


def _concrete_dims(t: TensorType) -> bool:
    return t.shape is not None and all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in t.shape)


def _check_logical(ev: EncodedValue, path: str, report: Report) -> None:
    """P6 for non-affine values."""
    if not ev.has_logical_type and ev.logical_type is None:
        return
    lpath = f"{path}.logical_type"
    problem = _type_problem(ev.logical_type, lpath)
    if problem:
        report.add("P6", *problem)
    elif isinstance(ev.logical_type, TensorType) and not _concrete_dims(ev.logical_type):
        shape = ev.logical_type.shape
        report.add("P6", lpath, "a tensor logical_type needs concrete dims, got "
                                f"{'no shape' if shape is None else list(shape)}")


def _check_affine(ev: EncodedValue, a: AffineLayout, path: str, payload: int | None,
                  report: Report) -> None:
    """A1-A8."""
    apath = f"{path}.affine"
    storage_ok = a.storage_type in AFFINE_STORAGE_TYPES
    if not storage_ok:
        report.add("A1", f"{apath}.storage_type", f"storage_type {type_name(a.storage_type)} is not one of "
                   "INT8, UINT8, INT4, UINT4, INT2, UINT2")
    lt = ev.logical_type
    dims: tuple[int, ...] | None = None
    if not isinstance(lt, TensorType):
        report.add("A2", f"{path}.logical_type", "an affine value needs a tensor logical_type")
    elif lt.elem_type not in FLOAT_TYPES:
        report.add("A2", f"{path}.logical_type", f"elem_type {type_name(lt.elem_type)} is not FLOAT, "
                                                 "FLOAT16, BFLOAT16 or DOUBLE")
    elif not _concrete_dims(lt):
        report.add("A2", f"{path}.logical_type", "the logical_type needs concrete dims, got "
                   f"{'no shape' if lt.shape is None else list(lt.shape)}")
    else:
        dims = tuple(lt.shape)

    scale = a.scale
    scale_ok = False
    if scale is None:
        report.add("A3", f"{apath}.scale", "scale is not set")
    elif scale.data_type not in FLOAT_TYPES:
        report.add("A3", f"{apath}.scale", f"scale data_type {type_name(scale.data_type)} is not a float type")
    elif any(d < 0 for d in scale.dims) or scale.stored != math.prod(scale.dims):
        report.add("A3", f"{apath}.scale", f"scale dims {list(scale.dims)} do not match its "
                                           f"{max(scale.stored, 0)} stored elements")
    else:
        scale_ok = True

    zp = a.zero_point
    if zp is not None:
        zpath = f"{apath}.zero_point"
        if storage_ok and zp.data_type != a.storage_type:
            report.add("A4", zpath, f"zero_point data_type {type_name(zp.data_type)} is not the storage_type "
                                    f"{type_name(a.storage_type)}")
        elif scale_ok and tuple(zp.dims) != tuple(scale.dims):
            report.add("A4", zpath, f"zero_point dims {list(zp.dims)} differ from scale dims {list(scale.dims)}")
        elif any(d < 0 for d in zp.dims) or zp.stored != math.prod(zp.dims):
            report.add("A4", zpath, f"zero_point dims {list(zp.dims)} do not match its "
                                    f"{max(zp.stored, 0)} stored elements")

    if a.axis is None:
        if a.block_size is not None:
            report.add("A7", f"{apath}.block_size", "block_size is set without an axis")
        if scale_ok and len(scale.dims) != 0:
            report.add("A5", f"{apath}.scale", f"per-tensor quantization (no axis) needs a scalar scale, "
                                               f"got dims {list(scale.dims)}")
    else:
        if a.block_size is not None and a.block_size < 1:
            report.add("A7", f"{apath}.block_size", f"block_size {a.block_size} is not >= 1")
        if dims is not None:
            rank = len(dims)
            if rank == 0 or not -rank <= a.axis < rank:
                report.add("A6", f"{apath}.axis", f"axis {a.axis} is out of range for logical rank {rank}")
            elif scale_ok:
                axis = a.axis % rank
                if a.block_size is None:
                    if tuple(scale.dims) != (dims[axis],):
                        report.add("A6", f"{apath}.scale", f"per-axis scale must have dims [{dims[axis]}], "
                                                           f"got {list(scale.dims)}")
                elif a.block_size >= 1:
                    want = list(dims)
                    want[axis] = -(-dims[axis] // a.block_size)
                    if list(scale.dims) != want:
                        report.add("A7", f"{apath}.scale", f"blocked scale must have dims {want} "
                                   f"(block_size {a.block_size} on axis {a.axis}), got {list(scale.dims)}")

    if storage_ok and dims is not None and payload is not None:
        want_bytes = affine_payload_nbytes(a.storage_type, dims)
        if payload != want_bytes:
            report.add("A8", path, f"{math.prod(dims)} {type_name(a.storage_type)} codes take {want_bytes} "
                                   f"bytes, but the payload has {payload}")


@register("P")
def check_encoded_values(view: ModelView, report: Report) -> None:
    """P1-P6 for every encoded initializer, with S1-S5 (struct) or A1-A8 (affine)."""
    layouts = report.layouts
    for g in iter_graphs(view):
        for j, ev in enumerate(g.encoded):
            path = _encoded_path(g, ev, j)
            chosen = (ev.affine is not None) + (ev.struct_type is not None)
            if chosen != 1:
                report.add("P1", path, "an encoded value sets exactly one layout (affine or struct_type), "
                                       f"this one sets {'none' if chosen == 0 else 'both'}")
            payload = _payload_bytes(ev, path, view.model_dir, report)
            if ev.affine is not None and chosen == 1:
                _check_affine(ev, ev.affine, path, payload, report)
                continue
            if ev.struct_type is not None and chosen == 1:
                _check_struct_payload(ev, path, payload, layouts, report)
            _check_logical(ev, path, report)

