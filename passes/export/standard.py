"""Export to standard ONNX: collect, lower, convert, check.

``to_standard_onnx(model)`` returns a stock ``onnx.ModelProto`` whose every
node is in the default (or ``ai.onnx.ml``) domain with a schema at the target
opset, with no extension field left, that passes
``onnx.checker.check_model(full_check=True)``. The checker alone is not
enough (it accepts unknown domains), so every node is also checked against
the schema registry.

The driver works in four steps:

1. **collect** every non-standard construct of the model with its path:
   encoded initializers, the struct-type catalogue, persistent bindings,
   aliases, struct-typed graph values, and nodes outside the standard domains
   (``ai.onnxforge`` operators, onnxruntime operators, unknown custom
   operators, calls of local functions);
2. **decide**: with ``lower=False`` every construct is an error; otherwise a
   construct without a lowering, or whose lowering cannot express it at the
   target opset, is an error. All errors are raised together in one
   :class:`~onnxforge.errors.ExportError`, never only the first, and nothing
   is dropped silently;
3. **lower** on the IR (:mod:`.lower_extensions`, :mod:`.lower_ort`), then
   remove dead code;
4. **serialize, convert and check**: the IR becomes a ``ModelProto``, existing
   nodes are converted to the target opset (:mod:`.opset`), struct decoders
   are inlined, persistent bindings are recorded in ``metadata_props`` under
   ``onnxforge.feedback`` as JSON ``{input: output}``.

Before / after for the built-in stateful decoder::

    cache.0.key (READ_WRITE) --CacheUpdate--> present.0.key (alias_of, bound)
    w1: EncodedValue(affine INT4 blocked)     lm_head: EncodedValue(Int4Block)

    cache.0.key --TensorScatter--> present.0.key    metadata_props["onnxforge.feedback"] =
    w1 = DequantizeLinear(w1_quantized, ...)          {"cache.0.key": "present.0.key", ...}
    lm_head = Reshape(<Int4Block decoder body>(Cast(lm_head.codes), lm_head.scale), [32, 64])

Value annotations that contradict onnx shape inference (some exporters write
them) are dropped from ``value_info``: they are hints, the values are unchanged.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import onnx
import onnx.inliner
import onnx.shape_inference
import onnx.version_converter

from onnxforge.proto_ext.errors import ExportError, OnnxforgeError
from onnxforge.graphbuilder.ir.core import READ_ONLY, Graph, Model, Node, Value
from onnxforge.graphbuilder.builder.opschemas import get_schema
from onnxforge.passes.framework.domains import canonical_domain, imported_version, is_default_domain
from onnxforge.passes.export.lower_extensions import (
    DECODER_DOMAIN,
    EXTENSION_NODE_LOWERINGS,
    UNLOWERABLE_EXTENSIONS,
    Emitter,
    LowerContext,
    NodeLowering,
    encoded_initializer_issue,
    encoded_initializer_opset,
    lower_bindings,
    lower_encoded_initializer,
    strip_aliases,
    struct_typed,
)
from onnxforge.passes.export.lower_ort import ORT_NODE_LOWERINGS
from onnxforge.passes.export.opset import convert_opset, mark_pending, proto_graphs
from onnxforge.proto_ext.catalogue import Catalogue

__all__ = [
    "FEEDBACK_KEY",
    "STANDARD_DOMAINS",
    "NODE_LOWERINGS",
    "Construct",
    "collect_constructs",
    "drop_conflicting_value_info",
    "non_standard_nodes",
    "to_standard_onnx",
    "unknown_field_paths",
]

FEEDBACK_KEY = "onnxforge.feedback"
"""``metadata_props`` key of the lowered persistent bindings (JSON ``{input: output}``)."""

STANDARD_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml"})
"""Domains whose operators count as standard (when they have a schema at the opset)."""

NODE_LOWERINGS: dict[tuple[str, str], NodeLowering] = {**EXTENSION_NODE_LOWERINGS,
                                                       **ORT_NODE_LOWERINGS}
"""Every operator lowering, keyed by ``(domain, op_type)``."""

INLINE_LIMIT = 1_800_000_000
"""Models whose weights stay under this many bytes get every payload inline in the result."""


@dataclass
class Construct:
    """One non-standard construct: where it is, what it is, and how to lower it.

    ``issues(ctx)`` lists why it cannot be lowered at the context's target opset
    (empty when it can); ``apply(ctx)`` lowers it; ``opset`` / ``preferred`` are
    the lowest and the preferred target opset of its lowering.
    """

    path: str
    what: str
    issues: Callable[[LowerContext], list[tuple[str, str]]] | None = None
    apply: Callable[[LowerContext], None] | None = None
    opset: int = 1
    preferred: int = 1
    order: int = 0  # encoded initializers (0) first, then nodes (1), then the rest (2)

    @property
    def lowerable(self) -> bool:
        return self.apply is not None


def _node_path(graph_path: str, index: int, node: Node) -> str:
    return f"{graph_path}.node[{index}]({node.name!r})"


def _is_standard_node(node: Node, opsets: dict[str, int]) -> bool:
    dom = canonical_domain(node.domain)
    if dom not in STANDARD_DOMAINS:
        return False
    version = imported_version(opsets, dom)
    return version is not None and get_schema(node.op_type, version, dom) is not None


def _keep_set(keep_domains: Iterable[str]) -> frozenset[str]:
    """The domains to keep, canonical; one domain may be given as a plain string."""
    if isinstance(keep_domains, str):
        keep_domains = (keep_domains,)
    domains = tuple(keep_domains) if isinstance(keep_domains, Iterable) else None
    if domains is None or not all(isinstance(d, str) for d in domains):
        raise ExportError([("keep_domains", f"must be domain names (strings), got {keep_domains!r}")])
    return frozenset(canonical_domain(d) for d in domains)


def _node_construct(node: Node, path: str, model: Model, keep: frozenset[str]) -> Construct | None:
    dom = canonical_domain(node.domain)
    if dom in keep:
        return None
    if (node.domain, node.op_type, node.overload) in model.functions:
        return Construct(path, f"call of local function {node.domain}::{node.op_type} (standard "
                               "export inlines local functions when lowering)")
    if _is_standard_node(node, model.opset_imports):
        return None
    rule = NODE_LOWERINGS.get((dom, node.op_type))
    label = f"{dom + '::' if dom else ''}{node.op_type}"
    if rule is None:
        if (dom, node.op_type) in UNLOWERABLE_EXTENSIONS:
            why = f"{label} cannot be exported: {UNLOWERABLE_EXTENSIONS[(dom, node.op_type)]}"
        elif dom in STANDARD_DOMAINS:
            version = imported_version(model.opset_imports, dom)
            why = (f"operator {label} has no schema at opset {version}" if version is not None
                   else f"domain of {label} is not imported")
        else:
            why = (f"unknown custom operator {label}: not standard ONNX and no lowering "
                   f"(keep_domains=[{dom!r}] keeps it for a runtime that has it)")
        return Construct(path, why)

    def issues(ctx: LowerContext, rule: NodeLowering = rule) -> list[tuple[str, str]]:
        out = []
        need = rule.opset(node)
        if ctx.target_opset < need:
            out.append((path, f"lowering {label} needs opset >= {need}, the target is "
                              f"{ctx.target_opset}"))
        why = rule.check(node, ctx)
        if why:
            out.append((path, f"{label} cannot be lowered: {why}"))
        return out

    def apply(ctx: LowerContext, rule: NodeLowering = rule) -> None:
        rule.lower(node, ctx)

    return Construct(path, f"{label} is not standard ONNX (a lowering exists)", issues,
                     apply, rule.opset(node), rule.preferred(node), order=1)


def _value_type_constructs(g: Graph, gp: str) -> list[Construct]:
    out = []
    for v in g.inputs:
        if struct_typed(v.type):
            out.append(Construct(f"{gp}.input[{v.name!r}].type.struct_type",
                                 "a struct-typed graph input has no standard type and no lowering"))
    for v in g.outputs:
        if struct_typed(v.type):
            out.append(Construct(f"{gp}.output[{v.name!r}].type.struct_type",
                                 "a struct-typed graph output has no standard type and no lowering"))
    io = {id(v) for v in g.inputs} | {id(v) for v in g.outputs}
    for n in g:
        for v in n.outputs:
            if id(v) not in io and v.has_value_info and struct_typed(v.type):
                out.append(Construct(f"{gp}.value_info[{v.name!r}].type.struct_type",
                                     "a struct-typed value has no standard type and no lowering"))
    return out


def _no_issues(ctx: LowerContext) -> list[tuple[str, str]]:
    return []


def _handled_by_driver(ctx: LowerContext) -> None:
    """Lowered by the driver in one sweep (bindings, aliases, catalogue)."""


def _driver_construct(path: str, what: str) -> Construct:
    return Construct(path, what, _no_issues, _handled_by_driver, order=2)


def _alias_constructs(g: Graph, gp: str) -> list[Construct]:
    why = "(extension; stripped: the stateless graph computes the value functionally)"
    out = []
    for v in g.inputs:
        if v.access != READ_ONLY:
            out.append(_driver_construct(f"{gp}.input[{v.name!r}].access",
                                         f"READ_WRITE access annotation {why}"))
    outputs = {id(v) for v in g.outputs}
    for v in g.outputs:
        if v.alias_of is not None:
            out.append(_driver_construct(f"{gp}.output[{v.name!r}].alias_of",
                                         f"alias_of annotation {why}"))
    for n in g:
        for v in n.outputs:
            if v.alias_of is not None and id(v) not in outputs:
                out.append(_driver_construct(f"{gp}.value_info[{v.name!r}].alias_of",
                                             f"alias_of annotation {why}"))
    return out


def collect_constructs(model: Model, keep_domains: Iterable[str] = ()) -> list[Construct]:
    """Every non-standard construct of ``model``, with its path, in model order."""
    keep = _keep_set(keep_domains)
    catalogue = Catalogue(model.struct_types)
    out: list[Construct] = []
    if model.struct_types:
        out.append(_driver_construct("model.struct_types", f"{len(model.struct_types)} struct "
                                     "type declaration(s) (extension; dropped once the values "
                                     "that use them are lowered)"))
    for g in model.all_graphs():
        gp = g.path()
        for name, v in g.encoded_initializers.items():
            path = f"{gp}.encoded_initializer[{name!r}]"
            lo, pref = encoded_initializer_opset(v.const.header, catalogue)

            def issues(ctx: LowerContext, v: Value = v, path: str = path) -> list[tuple[str, str]]:
                return encoded_initializer_issue(v, ctx, path)

            def apply(ctx: LowerContext, v: Value = v, path: str = path) -> None:
                lower_encoded_initializer(v, ctx, path)

            out.append(Construct(path, "encoded initializer (extension; lowerable)", issues, apply,
                                 lo, pref, order=0))
        for k, (i, o) in enumerate(g.bindings):
            path = f"{gp}.persistent_bindings[{k}]({i.name!r} <- {o.name!r})"
            if g.parent is None:
                out.append(_driver_construct(path, "persistent binding (extension; recorded in "
                                                   f"metadata_props[{FEEDBACK_KEY!r}])"))
            else:
                out.append(Construct(path, "a persistent binding inside a subgraph has no standard "
                                           "form"))
        out.extend(_value_type_constructs(g, gp))
        out.extend(_alias_constructs(g, gp))
        for idx, n in enumerate(g):
            c = _node_construct(n, _node_path(gp, idx, n), model, keep)
            if c is not None:
                out.append(c)
            if n.output_alias:
                out.append(_driver_construct(f"{_node_path(gp, idx, n)}.output_alias",
                                             "output_alias annotation (extension; stripped: the "
                                             "stateless graph computes the value functionally)"))
    return out


# --------------------------------------------------------------------------- loading


def _load_copy(model: Any) -> Model:
    """A private IR copy of ``model`` (IR Model, ModelProto, bytes or path)."""
    from onnxforge.graphbuilder import serde

    if isinstance(model, Model):
        return serde.from_bytes(serde.to_bytes(model), model_dir=model.model_dir)
    return serde.load(model)


def _inline_functions(model: Model) -> Model:
    """Inline every local function (protobuf-level inliner; keeps extension fields)."""
    from onnxforge.graphbuilder import serde

    proto = serde.to_onnx(model)
    try:
        proto = onnx.inliner.inline_local_functions(proto, convert_version=True)
    except Exception as exc:  # the inliner raises several exception types
        raise ExportError([("model.functions", f"local functions cannot be inlined: {exc}")]) from exc
    del proto.functions[:]
    return serde.load(proto, model_dir=model.model_dir)


def _inline_payloads(model: Model) -> None:
    """Make external payloads inline (already mapped) so the result is self-contained,
    unless the weights are too large for one protobuf message."""
    tensors = [v.const for g in model.all_graphs() for v in g.initializers.values()]
    total = sum(t.nbytes for t in tensors)
    if total >= INLINE_LIMIT:
        return
    for t in tensors:
        if t.external is not None and t.raw is not None:
            t.external = None


# --------------------------------------------------------------------------- checks


def non_standard_nodes(proto: onnx.ModelProto, keep_domains: Iterable[str] = ()) -> list[tuple[str, str]]:
    """``(path, reason)`` of every node of ``proto``'s graph and subgraphs that is not in
    a standard domain with a schema at the model's opset (except the domains in
    ``keep_domains``), and of every local function left in ``proto``."""
    keep = _keep_set(keep_domains)
    opsets = {canonical_domain(op.domain): int(op.version) for op in proto.opset_import}
    out: list[tuple[str, str]] = []
    for g, gp in proto_graphs(proto.graph):
        for i, n in enumerate(g.node):
            dom = canonical_domain(n.domain)
            if dom in keep:
                continue
            label = f"{dom + '::' if dom else ''}{n.op_type}"
            path = f"{gp}.node[{i}]({n.name!r})"
            if dom not in STANDARD_DOMAINS:
                out.append((path, f"operator {label} is not in a standard domain"))
            elif dom not in opsets:
                out.append((path, f"domain of {label} is not imported"))
            elif get_schema(n.op_type, opsets[dom], dom) is None:
                out.append((path, f"operator {label} has no schema at opset {opsets[dom]}"))
    for f in proto.functions:
        out.append((f"functions[{f.domain + '::' + f.name!r}]", "a local function remains"))
    return out


def unknown_field_paths(proto: onnx.ModelProto) -> list[str]:
    """Paths of the messages of ``proto`` that carry fields stock ONNX does not define
    (extension fields of onnxforge or of another tool). Tensor payloads are not read."""
    from google.protobuf.unknown_fields import UnknownFieldSet

    out: list[str] = []
    stack: list[tuple[Any, str]] = [(proto, "model")]
    while stack:
        msg, path = stack.pop()
        if len(UnknownFieldSet(msg)):
            out.append(path)
        if msg.DESCRIPTOR.name in ("TensorProto", "StringStringEntryProto"):
            continue
        for fd in msg.DESCRIPTOR.fields:
            if fd.message_type is None:
                continue
            value = getattr(msg, fd.name)
            if fd.is_repeated:
                for i, item in enumerate(value):
                    stack.append((item, f"{path}.{fd.name}[{i}]"))
            elif msg.HasField(fd.name):
                stack.append((value, f"{path}.{fd.name}"))
    return sorted("graph" + p[len("model.graph"):] if p.startswith("model.graph") else p for p in out)


def _leftover_extensions(model: Model) -> list[tuple[str, str]]:
    """Extension content still present after lowering (an internal consistency check)."""
    out = []
    if model.struct_types:
        out.append(("model.struct_types", "struct types remain after lowering"))
    for g in model.all_graphs():
        for name in g.encoded_initializers:
            out.append((f"{g.path()}.encoded_initializer[{name!r}]", "not lowered"))
        if g.bindings:
            out.append((f"{g.path()}.persistent_bindings", "not lowered"))
    return out


def _drop_unused_imports(model: Model, keep: frozenset[str]) -> None:
    used = {canonical_domain(n.domain) for g in model.all_graphs() for n in g}
    for fn in model.functions.values():
        used.update(canonical_domain(n.domain) for n in fn)
    for dom in list(model.opset_imports):
        d = canonical_domain(dom)
        if d in STANDARD_DOMAINS or d in keep or d in used:
            continue
        del model.opset_imports[dom]


def _input_types(proto: onnx.ModelProto, op: str) -> list[Any] | None:
    """Value infos of the inputs of the first call of decoder ``op`` (None if unknown)."""
    typed = onnx.shape_inference.infer_shapes(proto)
    known = {vi.name: vi for vi in list(typed.graph.value_info) + list(typed.graph.input)}
    inits = {t.name: t for t in proto.graph.initializer}
    for g, _ in proto_graphs(proto.graph):
        for n in g.node:
            if n.domain == DECODER_DOMAIN and n.op_type == op:
                out = []
                for name in n.input:
                    if name in inits:
                        t = inits[name]
                        out.append(onnx.helper.make_tensor_value_info(name, t.data_type, list(t.dims)))
                    elif name in known:
                        out.append(known[name])
                    else:
                        return None
                return out
    return None


def _convert_function(fn: onnx.FunctionProto, inputs: list[Any] | None, target: int) -> None:
    """Rewrite a decoder body written for another default-domain opset at ``target``."""
    own = next((int(o.version) for o in fn.opset_import if is_default_domain(o.domain)), None)
    if own is None or own == target:
        return
    if inputs is None:
        raise ExportError([(f"decoder {fn.name!r}", "the types of its inputs are unknown, so its "
                                                   f"opset-{own} body cannot be converted to {target}")])
    vis = [onnx.helper.make_tensor_value_info(i, vi.type.tensor_type.elem_type,
                                              [d.dim_value for d in vi.type.tensor_type.shape.dim])
           for i, vi in zip(fn.input, inputs)]
    graph = onnx.helper.make_graph(list(fn.node), "decoder", vis,
                                   [onnx.helper.make_empty_tensor_value_info(o) for o in fn.output])
    wrapper = onnx.helper.make_model(graph, opset_imports=list(fn.opset_import))
    wrapper.ir_version = onnx.IR_VERSION
    typed = onnx.shape_inference.infer_shapes(wrapper)
    del wrapper.graph.output[:]
    wrapper.graph.output.extend(typed.graph.output)
    converted = onnx.version_converter.convert_version(wrapper, target)
    del fn.node[:]
    fn.node.extend(converted.graph.node)
    ops = [o for o in fn.opset_import if not is_default_domain(o.domain)]
    del fn.opset_import[:]
    fn.opset_import.append(onnx.helper.make_opsetid("", target))
    fn.opset_import.extend(ops)


def _inline_decoders(proto: onnx.ModelProto, decoders: dict[str, bytes], target: int) -> onnx.ModelProto:
    """Inline the struct decoders' FunctionProtos at their call nodes (bodies written
    for another opset are converted to ``target`` first)."""
    if not decoders:
        return proto
    try:
        for op, blob in decoders.items():
            fn = onnx.FunctionProto()
            fn.ParseFromString(blob)
            fn.domain = DECODER_DOMAIN
            fn.name = op
            _convert_function(fn, _input_types(proto, op), target)
            proto.functions.append(fn)
        if not any(op.domain == DECODER_DOMAIN for op in proto.opset_import):
            proto.opset_import.append(onnx.helper.make_opsetid(DECODER_DOMAIN, 1))
        proto = onnx.inliner.inline_local_functions(proto, convert_version=False)
    except ExportError:
        raise
    except Exception as exc:  # the converter and the inliner raise several exception types
        raise ExportError([(f"model.struct_types(decoder {op!r})", f"decoder function cannot be "
                                                                  f"inlined: {exc}")
                           for op in decoders]) from exc
    kept = [f for f in proto.functions if f.domain != DECODER_DOMAIN]
    del proto.functions[:]
    proto.functions.extend(kept)
    ops = [op for op in proto.opset_import if op.domain != DECODER_DOMAIN]
    del proto.opset_import[:]
    proto.opset_import.extend(ops)
    return proto


def _conflicts(declared: Any, inferred: Any) -> bool:
    a, b = declared.tensor_type, inferred.tensor_type
    if not declared.HasField("tensor_type") or not inferred.HasField("tensor_type"):
        return False
    if a.elem_type and b.elem_type and a.elem_type != b.elem_type:
        return True
    if not a.HasField("shape") or not b.HasField("shape"):
        return False
    if len(a.shape.dim) != len(b.shape.dim):
        return True
    return any(x.HasField("dim_value") and y.HasField("dim_value") and x.dim_value != y.dim_value
               for x, y in zip(a.shape.dim, b.shape.dim))


def drop_conflicting_value_info(proto: onnx.ModelProto) -> list[str]:
    """Remove main-graph ``value_info`` annotations that contradict onnx shape inference
    (some exporters write wrong ones, e.g. a rank-0 shape for a 1-D constant); returns
    their names. Annotations are hints, not semantics: the values are unchanged."""
    probe = onnx.ModelProto()
    probe.CopyFrom(proto)
    del probe.graph.value_info[:]
    try:
        inferred = onnx.shape_inference.infer_shapes(probe).graph.value_info
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError):
        return []
    by_name = {vi.name: vi.type for vi in inferred}
    keep, dropped = [], []
    for vi in proto.graph.value_info:
        t = by_name.get(vi.name)
        if t is not None and _conflicts(vi.type, t):
            dropped.append(vi.name)
        else:
            keep.append(vi)
    if dropped:
        del proto.graph.value_info[:]
        proto.graph.value_info.extend(keep)
    return dropped


def _set_metadata(proto: onnx.ModelProto, key: str, value: str) -> None:
    props = [p for p in proto.metadata_props if p.key != key]
    del proto.metadata_props[:]
    proto.metadata_props.extend(props)
    proto.metadata_props.append(onnx.StringStringEntryProto(key=key, value=value))


# --------------------------------------------------------------------------- driver


def to_standard_onnx(model: Any, *, target_opset: int | None = None,
                     keep_domains: Iterable[str] = (), lower: bool = True) -> onnx.ModelProto:
    """Export ``model`` (IR Model, ModelProto, bytes or path) to standard ONNX.

    Args:
        target_opset: default-domain opset of the result; by default the model's
            own, raised to the lowest that has every operator the lowerings emit.
        keep_domains: custom domains whose operators are kept as they are (e.g.
            ``["com.microsoft"]`` for an onnxruntime target).
        lower: with False, nothing is lowered and every non-standard construct
            is an error.

    Returns:
        A stock ``onnx.ModelProto`` that passes ``check_model(full_check=True)``;
        lowered persistent bindings are in ``metadata_props["onnxforge.feedback"]``.
        Weights are inline unless they exceed :data:`INLINE_LIMIT` (then they keep
        their external references, relative to the source model's folder).

    Raises:
        ExportError: listing every construct that cannot be exported, each with
            its path, or the checker's complaint about the result.
    """
    from onnxforge.graphbuilder import serde
    from onnxforge.passes.rewrites.dce import eliminate_dead_code

    newest = onnx.defs.onnx_opset_version()
    if target_opset is not None and (isinstance(target_opset, bool) or not isinstance(target_opset, int)
                                     or not 1 <= target_opset <= newest):
        raise ExportError([("target_opset", f"must be an int from 1 to {newest} (the newest opset the "
                                            f"installed onnx knows), got {target_opset!r}")])
    keep = _keep_set(keep_domains)
    ir = _load_copy(model)
    if lower and ir.functions:
        ir = _inline_functions(ir)
    constructs = collect_constructs(ir, keep)
    own = imported_version(ir.opset_imports, "")
    decoders: dict[str, bytes] = {}
    feedback: dict[str, str] = {}
    if not lower:
        if constructs:
            raise ExportError([(c.path, c.what) for c in constructs])
        target = target_opset or own or newest
    else:
        if target_opset is not None:
            target = target_opset
        else:
            target = max([own or 1] + [c.preferred for c in constructs if c.lowerable])
        ctx = LowerContext(ir, target, Emitter(ir), Catalogue(ir.struct_types), keep)
        errors: list[tuple[str, str]] = []
        for c in constructs:
            errors.extend(c.issues(ctx) if c.lowerable else [(c.path, c.what)])
        if errors:
            raise ExportError(errors)
        for c in sorted((c for c in constructs if c.lowerable), key=lambda c: c.order):
            try:
                c.apply(ctx)
            except ExportError:
                raise
            except (OnnxforgeError, ValueError) as exc:
                raise ExportError([(c.path, f"lowering failed: {exc}")]) from exc
        Emitter.finish_renames(ir)
        feedback = lower_bindings(ir)
        strip_aliases(ir)
        ir.struct_types = []
        eliminate_dead_code(ir, remove_encoded_initializers=False, remove_functions=True)
        _drop_unused_imports(ir, keep)
        decoders = ctx.decoders
        leftover = _leftover_extensions(ir)
        if leftover:
            raise ExportError(leftover)
    _inline_payloads(ir)
    mark_pending(ir)
    proto = serde.to_onnx(ir)
    proto = convert_opset(proto, target)
    proto = _inline_decoders(proto, decoders, target)
    if feedback:
        _set_metadata(proto, FEEDBACK_KEY, json.dumps(feedback))
    drop_conflicting_value_info(proto)
    problems = non_standard_nodes(proto, keep)
    problems.extend((p, "fields that standard ONNX does not define (an extension of another tool)")
                    for p in unknown_field_paths(proto))
    if problems:
        raise ExportError(problems)
    try:
        onnx.checker.check_model(proto, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        raise ExportError([("model", f"onnx.checker rejects the exported model: {exc}")]) from exc
    return proto
