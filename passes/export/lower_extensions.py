"""Lowering of onnxforge's extensions to standard ONNX, on the IR.

Each lowering replaces one extension construct by standard operators that
compute the same logical values, statelessly:

* an **affine encoded initializer** becomes its integer codes as a dense
  initializer of the storage type (packed by onnx), its scale (and zero point)
  as initializers, and one ``DequantizeLinear`` (``axis`` / ``block_size``)
  producing the logical value::

      w: EncodedValue(affine INT4, axis 0, block 16)   ->   w = DequantizeLinear(w_q, w_scale, w_zp,
                                                                            axis=0, block_size=16)

* a **struct-encoded initializer** whose type has a decoder ``FunctionProto``
  becomes one dense initializer per leaf field (sub-byte integer leaves stay
  packed and are cast to the decoder's int8 / uint8 input when the target opset
  allows), a call of the decoder (inlined at the protobuf stage) and a
  ``Reshape`` (plus ``Cast``) to the logical type::

      w: EncodedValue(Int4Block records)   ->   raw = decode_Int4Block(w.codes, w.scale)
                                                w = Cast(Reshape(raw, [32, 64]), to=FLOAT)

* ``ai.onnxforge::CacheUpdate(cache, values, position)`` becomes
  ``TensorScatter(cache, values, write_indices)`` (opset 24, the position
  broadcast to ``[batch]``) or, below opset 24, ``ScatterElements`` with the
  indices ``position[b] + j`` (the same result);
* ``PagedCacheUpdate`` and ``PagedAttention`` (and their ragged forms) have no lowering: export rejects
  them with :data:`UNLOWERABLE_EXTENSIONS`' reason (a paged cache has no
  standard form);
* **persistent bindings** of the main graph are removed and returned as a
  ``{input: output}`` mapping (recorded by the driver in ``metadata_props``);
* **aliases** (``output_alias``, ``alias_of``, ``access``) are stripped: the
  stateless graph computes every aliased value functionally.

The module also holds :class:`Emitter` and :class:`LowerContext`, the small
toolkit every lowering (here and in :mod:`.lower_ort`) uses to add nodes and
initializers with fresh names and to replace values.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from onnx import TensorProto

from onnxforge.proto_ext.errors import OnnxforgeError, VerificationError
from onnxforge.graphbuilder.ir.core import READ_ONLY, Graph, Model, Node, Value
from onnxforge.graphbuilder.ir.names import NameScope
from onnxforge.graphbuilder.builder.opschemas import ONNXFORGE_DOMAIN
from onnxforge.graphbuilder.ir.tensors import EncodedTensor, Tensor, np_dtype, onnx_dtype
from onnxforge.passes.framework.domains import is_default_domain
from onnxforge.passes.framework.invariants import containers
from onnxforge.passes.framework.records import make_attrs
from onnxforge.proto_ext.catalogue import Catalogue
from onnxforge.proto_ext.types import EncodedValue, StructType, TensorType, Type

__all__ = [
    "DECODER_DOMAIN",
    "EXTENSION_NODE_LOWERINGS",
    "NEW_NODE",
    "Emitter",
    "LowerContext",
    "LoweringError",
    "NodeLowering",
    "UNLOWERABLE_EXTENSIONS",
    "affine_opset",
    "decoder_output_type",
    "elem_type",
    "encoded_initializer_issue",
    "encoded_initializer_opset",
    "lower_bindings",
    "lower_encoded_initializer",
    "strip_aliases",
    "struct_typed",
    "tensor_rank",
    "tensor_shape",
]

DECODER_DOMAIN = "onnxforge.export.decoder"
"""Domain of the temporary call nodes of struct decoders (inlined at the protobuf stage)."""

NEW_NODE = "onnxforge.export.new"
"""``Node.meta`` key marking nodes a lowering emitted at the target opset."""

_SUBBYTE_STORAGE: dict[int, int] = {TensorProto.INT4: 4, TensorProto.UINT4: 4, TensorProto.INT2: 2,
                    TensorProto.UINT2: 2}


class LoweringError(OnnxforgeError, ValueError):
    """A lowering met a construct it had accepted but cannot express after all."""


# --------------------------------------------------------------------------- toolkit


class Emitter:
    """Adds nodes and initializers with names unused anywhere in the model.

    Every node it emits is marked ``node.meta[NEW_NODE] = True`` (it is written
    at the target opset), unless ``new=False``.
    """

    def __init__(self, model: Model):
        self._names = NameScope.from_model(model, sep="__")
        self._consts: dict[tuple[int, str, tuple[int, ...], bytes], Value] = {}

    def fresh(self, hint: str) -> str:
        """A name not used in the model (``hint`` itself when free)."""
        return self._names.fresh(hint)

    def node(self, graph: Graph, before: Node | None, op_type: str, inputs: Sequence[Value | None],
             n_outputs: int = 1, *, domain: str = "", name: str = "", new: bool = True,
             **attrs: Any) -> tuple[Value, ...]:
        """Insert ``op_type(*inputs)`` before ``before`` (or append); returns its outputs."""
        base = name or op_type
        outs = [self.fresh(f"{base}_out{i}" if n_outputs > 1 else f"{base}_out")
                for i in range(n_outputs)]
        node = Node(domain, op_type, list(inputs), outs, name=self.fresh(base),
                    attributes=make_attrs(attrs, LoweringError, f"emitted {op_type} node {base!r}"))
        if new:
            node.meta[NEW_NODE] = True
        if before is None:
            graph.append(node)
        else:
            graph.insert_before(before, node)
        return node.outputs

    def initializer(self, graph: Graph, tensor: Tensor | np.ndarray, hint: str) -> Value:
        """A dense initializer holding ``tensor``."""
        # np.ascontiguousarray would turn a 0-d array into shape (1,)
        t = tensor if isinstance(tensor, Tensor) else Tensor.from_numpy(np.array(tensor, order="C"))
        v = Value(self.fresh(hint), TensorType(t.dtype, tuple(t.dims)))
        graph.add_initializer(v, t)
        return v

    def const(self, graph: Graph, array: Any, hint: str = "const") -> Value:
        """A small constant initializer, shared by identical requests in one graph."""
        arr = np.array(array, order="C")  # keeps 0-d arrays scalar
        key = (id(graph), arr.dtype.str, arr.shape, arr.tobytes())
        v = self._consts.get(key)
        if v is None or v.graph is not graph or v.const is None:
            v = self.initializer(graph, arr, hint)
            self._consts[key] = v
        return v

    @staticmethod
    def replace(old: Value, new: Value) -> None:
        """Point every use of ``old`` (nodes, graph outputs, bindings) at ``new``; a new
        node's output ``new`` also takes ``old``'s type (when it has none), metadata
        and, once ``old`` is gone (:meth:`finish_renames`), its name."""
        old.replace_all_uses_with(new)
        producer = new.producer()
        if producer is None or not (producer.meta.get(NEW_NODE) or producer.domain == DECODER_DOMAIN):
            return
        if new.type is None:
            new.type = old.type
        new.metadata.update(old.metadata)
        new.meta["export_rename_to"] = old.name

    @staticmethod
    def finish_renames(model: Model) -> None:
        """Give replacement values the names of the values they replaced (once those
        are removed), so graph outputs and weights keep their names."""
        for g in model.all_graphs():
            pending = [v for v in g.values() if "export_rename_to" in v.meta]
            if not pending:
                continue
            by_name = {v.name: v for v in g.values()}
            for v in pending:
                target = v.meta.pop("export_rename_to")
                if target == v.name or by_name.get(target, v) is not v:
                    continue
                by_name.pop(v.name, None)
                v.name = target
                by_name[target] = v


@dataclass
class LowerContext:
    """State shared by the lowerings of one export."""

    model: Model
    target_opset: int
    emitter: Emitter
    catalogue: Catalogue
    keep_domains: frozenset[str] = frozenset()
    decoders: dict[str, bytes] = field(default_factory=dict)  # call op_type -> FunctionProto bytes
    anchors: dict[int, Node | None] = field(default_factory=dict)

    def anchor(self, graph: Graph) -> Node | None:
        """The node before which nodes that only read initializers are inserted: the
        graph's first node before any lowering ran (None for an empty graph: append)."""
        key = id(graph)
        if key not in self.anchors:
            self.anchors[key] = next(iter(graph), None)
        return self.anchors[key]

    def remove_node(self, node: Node) -> None:
        g = node.graph
        if g is None:
            return
        g.remove(node, safe=True)


@dataclass(frozen=True, slots=True)
class NodeLowering:
    """How one operator is lowered.

    ``check(node, ctx)`` returns why the node cannot be lowered (None when it
    can); ``opset(node)`` is the lowest target opset the emitted operators need
    and ``preferred(node)`` the opset the default target is raised to;
    ``lower(node, ctx)`` rewrites it in place.
    """

    domain: str
    op_type: str
    check: Callable[[Node, LowerContext], str | None]
    lower: Callable[[Node, LowerContext], None]
    opset: Callable[[Node], int]
    preferred: Callable[[Node], int]


# --------------------------------------------------------------------------- shapes


def tensor_shape(v: Value | None) -> tuple[Any, ...] | None:
    """The shape of a tensor-typed value when its rank is known."""
    if v is None or not isinstance(v.type, TensorType) or v.type.shape is None:
        return None
    return tuple(v.type.shape)


def tensor_rank(v: Value | None) -> int | None:
    s = tensor_shape(v)
    return None if s is None else len(s)


def elem_type(v: Value | None) -> int | None:
    if v is None or not isinstance(v.type, TensorType):
        return None
    return v.type.elem_type


# --------------------------------------------------------------------------- encoded initializers


def _logical(header: EncodedValue) -> TensorType | None:
    lt = header.logical_type
    if isinstance(lt, TensorType) and lt.shape is not None and all(
            isinstance(d, int) and d >= 0 for d in lt.shape):
        return lt
    return None


def affine_opset(storage_type: int, block_size: int | None) -> int:
    """Lowest opset whose DequantizeLinear takes this storage type and layout."""
    if storage_type in (TensorProto.INT2, TensorProto.UINT2):
        return 25
    if storage_type in (TensorProto.INT4, TensorProto.UINT4) or block_size:
        return 21
    if storage_type in (TensorProto.INT8, TensorProto.UINT8):
        return 13
    return 21


def _resolve(header: EncodedValue, catalogue: Catalogue) -> StructType | None:
    st = header.struct_type
    return catalogue.resolve(st) if st.kind == "type_ref" else st


def encoded_initializer_opset(header: EncodedValue, catalogue: Catalogue) -> tuple[int, int]:
    """``(lowest, preferred)`` target opset for lowering this encoded value."""
    if header.affine is not None:
        op = affine_opset(header.affine.storage_type, header.affine.block_size)
        return op, op
    decl = _resolve(header, catalogue)
    pref = 1
    if decl is not None and decl.decoder is not None:
        pref = _function_opset(decl.decoder.proto)
    return 1, pref


def _function_opset(proto: bytes) -> int:
    """Default-domain opset a decoder FunctionProto was written for (1 if none)."""
    import onnx

    fn = onnx.FunctionProto()
    fn.ParseFromString(proto)
    for op in fn.opset_import:
        if is_default_domain(op.domain):
            return int(op.version)
    return 1


def decoder_output_type(proto: bytes, inputs: dict[str, Type]) -> int | None:
    """Element type of a decoder FunctionProto's output for the given input types, by
    onnx shape inference (None when it cannot tell)."""
    import onnx

    fn = onnx.FunctionProto()
    fn.ParseFromString(proto)
    vis = []
    for name in fn.input:
        t = inputs.get(name)
        if not isinstance(t, TensorType):
            return None
        vis.append(onnx.helper.make_tensor_value_info(name, t.elem_type, list(t.shape or ())))
    graph = onnx.helper.make_graph(list(fn.node), "decoder", vis,
                                   [onnx.helper.make_empty_tensor_value_info(o) for o in fn.output])
    wrapper = onnx.helper.make_model(graph, opset_imports=list(fn.opset_import))
    wrapper.ir_version = onnx.IR_VERSION
    try:
        typed = onnx.shape_inference.infer_shapes(wrapper)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError):
        return None
    out = typed.graph.output[0].type
    if out.HasField("tensor_type") and out.tensor_type.elem_type:
        return int(out.tensor_type.elem_type)
    return None


def encoded_initializer_issue(value: Value, ctx: LowerContext, path: str) -> list[tuple[str, str]]:
    """Why an encoded initializer cannot be lowered: ``[(path, reason)]`` (empty if it can)."""
    enc = value.const
    header: EncodedValue = enc.header
    issues: list[tuple[str, str]] = []
    if value.is_graph_input():
        issues.append((path, "an encoded initializer that is also a graph input (an overridable "
                             "default) has no standard form"))
    if (header.affine is None) == (header.struct_type is None):
        issues.append((path, "exactly one layout (affine or struct_type) must be set"))
        return issues
    lt = _logical(header)
    if header.affine is not None:
        a = header.affine
        if lt is None:
            issues.append((f"{path}.logical_type", "an affine value needs a tensor logical type "
                                                   "with concrete dims"))
        if a.scale is None:
            issues.append((f"{path}.affine.scale", "missing"))
        need = affine_opset(a.storage_type, a.block_size)
        if ctx.target_opset < need:
            issues.append((f"{path}.affine", f"DequantizeLinear of "
                                             f"{TensorProto.DataType.Name(a.storage_type)}"
                                             f"{' blocked' if a.block_size else ''} needs opset "
                                             f">= {need}, the target is {ctx.target_opset}"))
        return issues
    decl = _resolve(header, ctx.catalogue)
    if decl is None:
        issues.append((f"{path}.struct_type", "unresolved struct type reference"))
        return issues
    label = decl.name or f"type_id={decl.type_id}"
    if decl.decoder is None:
        issues.append((f"{path}.struct_type",
                       f"custom layout {label!r} has no decoder FunctionProto; standard ONNX "
                       "cannot decode it"))
    if lt is None:
        issues.append((f"{path}.logical_type",
                       f"struct layout {label!r} without a tensor logical type with concrete dims "
                       "has no standard tensor form"))
    if decl.decoder is not None and len(decl.decoder.outputs) != 1:
        issues.append((f"{path}.struct_type.decoder", "a decoder has exactly one output"))
    return issues


def _payload(value: Value, ctx: LowerContext, path: str) -> Any:
    """The payload bytes: the mapping the loader made of an external payload, or the
    inline bytes, or (for a header that still only references its file) a fresh mapping."""
    from onnxforge.proto_ext.codecs.decode import payload_of

    enc: EncodedTensor = value.const  # type: ignore[assignment]  # called for encoded initializers
    header = enc.header
    if enc.external is not None and len(header.raw_data):
        return header.raw_data
    return payload_of(header, ctx.model.model_dir, path)


def lower_encoded_initializer(value: Value, ctx: LowerContext, path: str) -> None:
    """Replace one encoded initializer by standard initializers and nodes."""
    header: EncodedValue = value.const.header
    if header.affine is not None:
        _lower_affine(value, ctx, path)
    else:
        _lower_struct(value, ctx, path)


def _lower_affine(value: Value, ctx: LowerContext, path: str) -> None:
    from onnxforge.proto_ext.codecs.affine import affine_payload_nbytes

    g: Graph = value.graph  # type: ignore[assignment]  # initializers live in graphs
    em = ctx.emitter
    header: EncodedValue = value.const.header
    a = header.affine
    lt = _logical(header)
    shape = tuple(int(d) for d in lt.shape)
    payload = _payload(value, ctx, path)
    need = affine_payload_nbytes(a.storage_type, shape)
    if len(payload) != need:
        raise LoweringError(f"{path}: payload holds {len(payload)} bytes, the logical shape "
                            f"{shape} needs {need}")
    codes = Tensor(a.storage_type, shape, raw=payload)
    q = em.initializer(g, codes, f"{value.name}_quantized")
    scale_arr = np.asarray(a.scale.array())
    scale = em.initializer(g, scale_arr, f"{value.name}_scale")
    zp = None
    if a.zero_point is not None:
        zp_arr = np.asarray(a.zero_point.array())
        want = np_dtype(a.storage_type)
        if zp_arr.dtype != want:
            zp_arr = zp_arr.astype(np.int64).astype(want)
        zp = em.initializer(g, zp_arr, f"{value.name}_zero_point")
    attrs: dict[str, Any] = {}
    if a.axis is not None:
        attrs["axis"] = int(a.axis)
    if a.block_size:
        attrs["block_size"] = int(a.block_size)
    anchor = ctx.anchor(g)
    (y,) = em.node(g, anchor, "DequantizeLinear", [q, scale, zp], name=f"{value.name}/dequantize",
                   **attrs)
    scale_type = onnx_dtype(scale_arr.dtype)
    if lt.elem_type != scale_type:
        y.type = TensorType(scale_type, shape)
        (y,) = em.node(g, anchor, "Cast", [y], name=f"{value.name}/cast", to=int(lt.elem_type))
    y.type = TensorType(lt.elem_type, shape)
    em.replace(value, y)
    g.remove_initializer(value)


def _sanitize(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", name) or "struct"


def _lower_struct(value: Value, ctx: LowerContext, path: str) -> None:
    from onnxforge.proto_ext.codecs.records import read_fields
    from onnxforge.proto_ext.codecs.bits import pack_codes
    from onnxforge.proto_ext.sizes import record_layout

    g: Graph = value.graph  # type: ignore[assignment]  # initializers live in graphs
    em = ctx.emitter
    header: EncodedValue = value.const.header
    decl = _resolve(header, ctx.catalogue)
    lt = _logical(header)
    shape = tuple(int(d) for d in lt.shape)
    payload = _payload(value, ctx, path)
    try:
        layout = record_layout(header.struct_type, ctx.catalogue, f"{path}.struct_type")
        fields = read_fields(payload, layout, path)
    except VerificationError as exc:
        raise LoweringError(f"{path}: not byte-decodable: {exc}") from exc
    leaves = {leaf.path: leaf for leaf in layout.leaves}
    fn_inputs = list(decl.decoder.inputs)
    missing = [i for i in fn_inputs if i not in fields]
    if missing:
        raise LoweringError(f"{path}.struct_type.decoder: inputs {missing} are not leaves of the "
                            f"struct (leaves: {list(fields)})")
    anchor = ctx.anchor(g)
    args: list[Value] = []
    for leaf_path in fn_inputs:
        arr = np.ascontiguousarray(fields[leaf_path])
        leaf = leaves[leaf_path]
        hint = f"{value.name}.{leaf_path}" if leaf_path else f"{value.name}.records"
        bits = _SUBBYTE_STORAGE.get(leaf.elem_type) if leaf.kind == "tensor" else None
        if bits is not None and ctx.target_opset >= (25 if bits == 2 else 21):
            # keep the codes packed; the decoder receives them widened to int8 / uint8
            packed = Tensor(leaf.elem_type, arr.shape, raw=pack_codes(arr, bits))
            v = em.initializer(g, packed, hint)
            signed = leaf.elem_type in (TensorProto.INT4, TensorProto.INT2)
            to = TensorProto.INT8 if signed else TensorProto.UINT8
            (v,) = em.node(g, anchor, "Cast", [v], name=f"{hint}/widen", to=to)
            v.type = TensorType(to, tuple(arr.shape))
        else:
            v = em.initializer(g, arr, hint)
        args.append(v)
    op = f"decode_{_sanitize(decl.name or str(decl.type_id))}_{decl.type_id or 0}"
    ctx.decoders[op] = decl.decoder.proto
    ctx.model.opset_imports.setdefault(DECODER_DOMAIN, 1)
    (raw,) = em.node(g, anchor, op, args, domain=DECODER_DOMAIN, name=f"{value.name}/decode",
                     new=False)
    shape_v = em.const(g, np.array(shape, dtype=np.int64), f"{value.name}_shape")
    (y,) = em.node(g, anchor, "Reshape", [raw, shape_v], name=f"{value.name}/reshape")
    leaf_types = {p: v.type for p, v in zip(fn_inputs, args)}
    if decoder_output_type(decl.decoder.proto, leaf_types) != lt.elem_type:
        (y,) = em.node(g, anchor, "Cast", [y], name=f"{value.name}/cast", to=int(lt.elem_type))
    y.type = TensorType(lt.elem_type, shape)
    em.replace(value, y)
    g.remove_initializer(value)


# --------------------------------------------------------------------------- CacheUpdate


def _cache_axis(node: Node) -> int:
    return int(node.attr("axis", -2))


def _check_cache_update(node: Node, ctx: LowerContext) -> str | None:
    ins = list(node.inputs) + [None] * (3 - len(node.inputs))
    if len(node.inputs) != 3 or any(v is None for v in ins[:3]):
        return "CacheUpdate needs its three inputs (cache, values, position)"
    pos_t = elem_type(ins[2])
    if pos_t is not None and pos_t != TensorProto.INT64:
        return "CacheUpdate position must be int64"
    rank = tensor_rank(ins[0])
    axis = _cache_axis(node)
    if rank is not None:
        if not -rank <= axis < rank:
            return f"axis {axis} is out of range for a rank-{rank} cache"
        if axis % rank == 0:
            return "a cache update along the batch axis (axis 0) has no standard form"
    elif ctx.target_opset < 24 or axis == 0:
        return ("the cache's rank is unknown; the ScatterElements form used below opset 24 needs "
                "it (give the cache input a shape)")
    return None


def _lower_cache_update(node: Node, ctx: LowerContext) -> None:
    g: Graph = node.graph  # type: ignore[assignment]  # local functions are inlined before lowering
    em = ctx.emitter
    cache, values, position = node.inputs[:3]
    axis = _cache_axis(node)
    name = node.name or "CacheUpdate"
    flat = em.const(g, np.array([-1], np.int64), "minus_one_1d")
    (pos1d,) = em.node(g, node, "Reshape", [position, flat], name=f"{name}/position")
    if ctx.target_opset >= 24:
        # write_indices = broadcast(position, [batch])
        (cshape,) = em.node(g, node, "Shape", [cache], name=f"{name}/cache_shape", start=0, end=1)
        (idx,) = em.node(g, node, "Expand", [pos1d, cshape], name=f"{name}/write_indices")
        (out,) = em.node(g, node, "TensorScatter", [cache, values, idx], name=name, axis=axis,
                         mode="linear")
    else:
        # indices[b, ..., j, ...] = position[b] + j along axis; ScatterElements writes them
        rank = tensor_rank(cache)
        ax = axis % rank
        (vshape,) = em.node(g, node, "Shape", [values], name=f"{name}/values_shape")
        ax_i = em.const(g, np.array([ax], np.int64), "axis_1d")
        (n,) = em.node(g, node, "Gather", [vshape, ax_i], name=f"{name}/count", axis=0)
        zero = em.const(g, np.array(0, np.int64), "zero")
        one = em.const(g, np.array(1, np.int64), "one")
        scalar = em.const(g, np.zeros((0,), np.int64), "scalar_shape")
        (n0,) = em.node(g, node, "Reshape", [n, scalar], name=f"{name}/count_scalar")
        (j,) = em.node(g, node, "Range", [zero, n0, one], name=f"{name}/offsets")
        j_shape = [1] * rank
        j_shape[ax] = -1
        (j,) = em.node(g, node, "Reshape", [j, em.const(g, np.array(j_shape, np.int64), "j_shape")],
                       name=f"{name}/offsets_nd")
        p_shape = [1] * rank
        p_shape[0] = -1
        (p,) = em.node(g, node, "Reshape", [pos1d, em.const(g, np.array(p_shape, np.int64), "p_shape")],
                       name=f"{name}/position_nd")
        (idx,) = em.node(g, node, "Add", [p, j], name=f"{name}/indices")
        (idx,) = em.node(g, node, "Expand", [idx, vshape], name=f"{name}/indices_full")
        (out,) = em.node(g, node, "ScatterElements", [cache, idx, values], name=name, axis=ax)
    old = node.outputs[0]
    out.type = old.type
    em.replace(old, out)
    node.output_alias = []
    ctx.remove_node(node)


def _cache_update_opset(node: Node) -> int:
    return 13


def _cache_update_preferred(node: Node) -> int:
    return 24


EXTENSION_NODE_LOWERINGS: dict[tuple[str, str], NodeLowering] = {
    (ONNXFORGE_DOMAIN, "CacheUpdate"): NodeLowering(
        ONNXFORGE_DOMAIN, "CacheUpdate", _check_cache_update, _lower_cache_update,
        _cache_update_opset, _cache_update_preferred),
}
"""Lowerings of ``ai.onnxforge`` operators, keyed by ``(domain, op_type)``."""

_PAGED_WHY = ("a paged KV cache has no standard ONNX form: its pages are runtime-owned encoded values, "
              "each in its own format, updated in place; run the model on onnxforge's backend, or "
              "build it with a contiguous cache (CacheUpdate) to export it")
UNLOWERABLE_EXTENSIONS: dict[tuple[str, str], str] = {
    (ONNXFORGE_DOMAIN, "PagedCacheUpdate"): _PAGED_WHY,
    (ONNXFORGE_DOMAIN, "PagedAttention"): _PAGED_WHY,
    (ONNXFORGE_DOMAIN, "RaggedPagedCacheUpdate"): _PAGED_WHY,
    (ONNXFORGE_DOMAIN, "RaggedPagedAttention"): _PAGED_WHY,
}
"""``ai.onnxforge`` operators standard export rejects on purpose, with the reason."""


# --------------------------------------------------------------------------- bindings, aliases


def lower_bindings(model: Model) -> dict[str, str]:
    """Remove the main graph's persistent bindings; returns ``{input: output}``."""
    feedback = {i.name: o.name for i, o in model.graph.bindings}
    model.graph.bindings = []
    return feedback


def strip_aliases(model: Model) -> int:
    """Remove every ``output_alias``, ``alias_of`` and ``READ_WRITE`` access; returns how many."""
    count = 0
    for c in containers(model):
        values = list(c.inputs) + list(c.outputs)
        for n in c:
            if n.output_alias:
                count += len(n.output_alias)
                n.output_alias = []
            values.extend(n.outputs)
        for v in values:
            if v.alias_of is not None or v.access != READ_ONLY:
                count += 1
                v.alias_of = None
                v.access = READ_ONLY
    return count


def struct_typed(t: Type) -> bool:
    """True if a value type is, or contains, a struct type."""
    from onnxforge.proto_ext.types import MapType, OptionalType, SequenceType

    if isinstance(t, StructType):
        return True
    if isinstance(t, (SequenceType, OptionalType)):
        return struct_typed(t.elem)
    if isinstance(t, MapType):
        return struct_typed(t.value)
    return False


