"""ShapesContext: the single source of truth for value types, with per-node inference.

A :class:`ShapesContext` holds the refined type of every value of a model (or of
one graph / function body) and keeps the IR in agreement: every refinement is
written to ``Value.type``. Dimensions are ``int``, :class:`SymExpr` (symbolic,
e.g. ``past + seq``) or ``None`` (unknown); ``dim_param`` strings met in
declared types are parsed into expressions.

Knowledge only grows. :meth:`ShapesContext.set_type` *merges* a new type into
what is known (:func:`~onnxforge.graphbuilder.shapes.type_merge.merge_types`):
an unknown rank or dimension is refined, equal dimensions stay,
and provably different ones (``4`` vs ``5``, ``n`` vs ``n + 1``) raise
:class:`ShapeError`, naming the value, both types and where each came from.
Two dimensions whose relation cannot be decided (``total`` vs ``past + seq``)
keep the existing one (a number wins over a symbol); the pair is recorded in
:attr:`ShapesContext.equalities`. Rules name a size that is fixed but unknown
with a fresh symbol (``_b0`` for an undecidable broadcast, ``_l0`` for a Loop
dimension that changes between iterations, ``_nz0`` for NonZero's count).
Values the context learns nothing about keep whatever the IR holds.

Small constant tensors are tracked as :class:`SymTensor` (elements may be
symbolic), so shape arithmetic such as ``Shape -> Gather -> Unsqueeze ->
Concat -> Reshape`` resolves to symbolic targets::

    ctx = ShapesContext(model)
    ctx.infer_graph()
    ctx.shape_of(present)        # (batch, 2, past_sequence_length + sequence_length, 32)

Aliases (``Node.output_alias`` MUST_ALIAS ports, ``Value.alias_of`` and the
operator rule of ``ai.onnxforge`` CacheUpdate) form equivalence classes whose
members always share one type: what is learned for one name is visible through
the others. :meth:`ShapesContext.alias_root` gives the storage owner of a value,
from the one alias resolution (``graphbuilder.ir.storage``); alias cycles are
reported by the verifier (rule L5).

Per-operator rules live in :mod:`onnxforge.graphbuilder.shapes.infer`. Operators
without a rule and without a local function leave their outputs as declared
(or unknown): nothing is guessed. Local functions are inferred per call site
(formal inputs bound to the actual types), cached by input signature.

Two jobs of the context have modules of their own: speculative inference, which
asks what some assumed types imply (:mod:`~onnxforge.graphbuilder.shapes.speculation`),
and recording per-node results for a later context of the same model, which replays
them (:mod:`~onnxforge.graphbuilder.shapes.replay`).
"""
from __future__ import annotations

from collections.abc import Container, Iterable, Iterator, Sequence
from typing import Any

from onnx import TensorProto
from onnxforge.graphbuilder.ir.core import (
    MUST_ALIAS,
    Attr,
    Function,
    Graph,
    Model,
    Node,
    Value,
)
from onnxforge.graphbuilder.ir.scope_order import (CycleError, captured_reads, in_order_throughout,
                                                    topological_order)
from onnxforge.graphbuilder.ir.storage import Storage
from onnxforge.graphbuilder.ir.tensors import EncodedTensor, Tensor
from onnxforge.graphbuilder.shapes.replay import Record, Seen, infer_recorded, node_label, seed_initializer
from onnxforge.graphbuilder.shapes.speculation import Undecided, assumed_types, check_failure, speculate
from onnxforge.graphbuilder.shapes.symbolic import Dim, SymbolicError, SymExpr, symbol
from onnxforge.graphbuilder.shapes.symtensor import ShapeError, SymTensor
from onnxforge.graphbuilder.shapes.type_merge import TypeConflict, format_type, merge_types, normalize_type
from onnxforge.proto_ext.catalogue import Catalogue
from onnxforge.proto_ext.types import (
    AffineLayout,
    SparseTensorType,
    StructType,
    TensorType,
    Type,
)

__all__ = [
    "MAX_CONST_ELEMENTS",
    "MAX_FLOAT_CONST_ELEMENTS",
    "ShapesContext",
    "trackable",
]

MAX_CONST_ELEMENTS = 1024
"""Integer and boolean constant tensors up to this many elements are tracked element by element."""

MAX_FLOAT_CONST_ELEMENTS = 16
"""Floating-point constants are tracked only up to this size (scalars for Range, fill values)."""

DEFAULT_OPSET = 23

_TRACKED_TYPES = frozenset({
    TensorProto.INT8, TensorProto.INT16, TensorProto.INT32, TensorProto.INT64,
    TensorProto.UINT8, TensorProto.UINT16, TensorProto.UINT32, TensorProto.UINT64,
    TensorProto.BOOL, TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16,
})
_FLOAT_CODES = frozenset({TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16})


def trackable(elem_type: int, size: int) -> bool:
    """Whether a constant of this element type and size is tracked element by element."""
    if elem_type in _FLOAT_CODES:
        return size <= MAX_FLOAT_CONST_ELEMENTS
    return elem_type in _TRACKED_TYPES and size <= MAX_CONST_ELEMENTS


# ----------------------------------------------------------------------------- context


def _default_opsets(target: Model | Graph | Function) -> dict[str, int]:
    if isinstance(target, Model):
        return dict(target.opset_imports)
    if isinstance(target, Function) and target.opset_imports:
        return dict(target.opset_imports)
    return {"": DEFAULT_OPSET}


class ShapesContext:
    """Refined types of every value of a model, graph or function body.

    Args:
        target: a :class:`Model` (its main graph and catalogue), a :class:`Graph`
            or a :class:`Function`.
        trust_declared: seed node outputs from their declared ``Value.type``
            (value_info). With ``False`` only graph inputs, initializers and
            subgraph/function inputs start with their declared types; every
            other type is computed (and overwrites the IR's).
        write_back: write every refined type to ``Value.type``.
        strict: a computed type that contradicts a node output's *declared* type
            (and nothing else) raises :class:`ShapeError`; with ``False`` the
            computed type replaces it and the conflict is listed in
            :attr:`conflicts` (some exporters write wrong value_info).
        opset_imports: opsets to assume (default: the model's or function's).
        memo: record, per node, what its rule read and wrote, for a later context
            (:mod:`onnxforge.graphbuilder.shapes.replay`).
        prior: an earlier ``memo`` context of the same target: a node whose operator,
            attributes, known input types and contents, and output names and declared
            types are what a node of ``prior`` saw takes that result instead of running
            its rule again (control flow, function calls and aliased values always run;
            a result that made fresh symbols serves only the node that made it). Only
            symbols made fresh from then on are numbered after ``prior``'s; every type
            is what a context without ``prior`` infers.
        storage: the model's :class:`~onnxforge.graphbuilder.ir.storage.Storage`, when the
            caller holds one that describes the model as it is (:meth:`alias_root` reads
            it; by default it is built when first needed).
    """

    def __init__(self, target: Model | Graph | Function, *, trust_declared: bool = True,
                 write_back: bool = True, strict: bool = True,
                 opset_imports: dict[str, int] | None = None, memo: bool = False,
                 prior: ShapesContext | None = None, storage: Storage | None = None):
        if not isinstance(target, (Model, Graph, Function)):
            raise TypeError(f"ShapesContext needs a Model, Graph or Function, got {type(target).__name__}")
        self.model: Model | None = target if isinstance(target, Model) else None
        self.graph: Graph | Function = target.graph if isinstance(target, Model) else target
        self.opsets: dict[str, int] = dict(opset_imports) if opset_imports else _default_opsets(target)
        self.catalogue = Catalogue(self.model.struct_types if self.model is not None else ())
        self.trust_declared = trust_declared
        self.write_back = write_back
        self.strict = strict
        self.conflicts: list[str] = []
        """Declared types replaced by computed ones (``strict=False`` only)."""
        self.equalities: list[tuple[Dim, Dim, str]] = []
        """Dimension pairs met on one value whose equality could not be decided (value name last)."""
        self.unknown_ops: dict[tuple[str, str], int] = {}
        """Operators met without a rule or local function, with their count."""
        self._unknown_count = 0
        self._types: dict[Value, Type] = {}
        self._sources: dict[Value, list[str]] = {}
        self._values: dict[Value, SymTensor] = {}
        self._alias_parent: dict[Value, Value] = {}
        self._alias_members: dict[Value, list[Value]] = {}
        self._alias_edges: dict[Value, Value] = {}
        self._attr_env: dict[str, Attr] = {}
        self._counter = [0]
        self._active_calls: set[tuple[str, str, str]] = set()
        self._fn_cache: dict[Any, tuple[list[Type], list[SymTensor | None], list[int | None]]] = {}
        from onnxforge.graphbuilder.shapes import infer as _infer

        self._rules = _infer
        self.replayed = 0
        """Nodes whose inference was taken from ``prior`` (their inputs had not changed)."""
        # every graph is in dependency order (checked in one walk by a whole-graph
        # inference, for the graphs it infers; ``_was_ordered`` keeps the last answer for
        # speculations, which run on the IR unchanged)
        self._ordered = self._was_ordered = False
        self._pinned: dict[Node, list[SymTensor]] | None = None
        self._kept: Container[Node] | None = None
        self._inferred: set[Node] = set()  # the nodes :meth:`infer_for` inferred
        if storage is not None:
            self._storage = storage
        self.live: Container[Node] | None = None
        """Set on a speculation (a :meth:`scratch` that asks whether some types make the model
        fail): the nodes that run whenever their graph runs. An ``If`` whose condition is
        known then infers only the branch that runs, and a rule's error in a node that need
        not run raises :class:`Undecided` instead of :class:`ShapeError`."""
        self._records: dict[Node, Record] | None = {} if memo else None
        self._seeds: dict[Value, tuple] | None = {} if memo else None  # initializers' seeds
        self._prior: dict[Node, Record] | None = None
        self._prior_seeds: dict[Value, tuple] | None = None
        self._prior_index: dict[tuple, list[Record]] | None = None
        self._seen: dict[Node, Seen] | None = {} if memo else None
        self._prior_seen: dict[Node, Seen] | None = None
        if memo and prior is not None and prior._records is not None and prior.graph is self.graph \
                and prior.opsets == self.opsets and prior.trust_declared == trust_declared \
                and prior.strict == strict and not prior.write_back and not write_back:
            self._prior, self._prior_seeds, self._prior_seen = prior._records, prior._seeds, prior._seen
            self._counter = [prior._counter[0]]  # symbols made from here on are new to both

    # -- reading ---------------------------------------------------------------------
    def type_of(self, value: Value | None) -> Type:
        """The refined type of ``value`` (``None`` when nothing is known)."""
        if value is None:
            return None
        if value in self._types:
            return self._types[value]
        return self._seed(value)

    def shape_of(self, value: Value | None) -> tuple[Dim, ...] | None:
        """The shape of a tensor value; ``None`` for an unknown rank or a non-tensor."""
        t = self.type_of(value)
        return t.shape if isinstance(t, (TensorType, SparseTensorType)) else None

    def value_of(self, value: Value | None) -> SymTensor | None:
        """The known (possibly symbolic) content of a small constant tensor, else ``None``."""
        if value is None:
            return None
        if value not in self._types:
            self._seed(value)
        return self._values.get(value)

    def condition_of(self, node: Node) -> bool | None:
        """The value of an ``If`` node's condition when it is known, else None."""
        cond = self.value_of(node.inputs[0]) if node.inputs else None
        if cond is not None and cond.size == 1:
            c = cond.flat()[0]
            if isinstance(c, bool):
                return c
        return None

    def source_of(self, value: Value) -> str:
        """Where the knowledge about ``value`` came from."""
        self.type_of(value)
        return ", then ".join(self._sources.get(value) or ["nothing"])

    def layout_of(self, value: Value) -> StructType | AffineLayout | None:
        """The physical layout of an encoded initializer (its logical type is :meth:`type_of`)."""
        c = value.const
        if isinstance(c, EncodedTensor):
            return c.header.struct_type if c.header.struct_type is not None else c.header.affine
        return None

    def struct_fields(self, value_or_type: Value | StructType) -> dict[str, Type] | None:
        """Field types of a struct-typed value, ``type_ref`` resolved through the catalogue."""
        t = self.type_of(value_or_type) if isinstance(value_or_type, Value) else value_or_type
        if not isinstance(t, StructType):
            return None
        decl = self.catalogue.resolve(t)
        if decl is None or decl.kind != "structure":
            return None
        return {f.name: (normalize_type(f.type) if f.type is not None else
                         (TensorType(f.constant.data_type, f.constant.dims) if f.constant else None))
                for f in decl.fields}

    def opset(self, domain: str) -> int:
        """Version of ``domain`` imported by the model (``ai.onnx`` is the default domain)."""
        d = "" if domain == "ai.onnx" else domain
        v = self.opsets.get(d)
        if v is None and d == "":
            v = self.opsets.get("ai.onnx", DEFAULT_OPSET)
        return 1 if v is None else v

    def fresh_symbol(self, hint: str = "s") -> SymExpr:
        """A new symbol (``_s0``, ``_s1``...) for a dimension whose value is unknown but fixed."""
        n = self._counter[0]
        self._counter[0] += 1
        return symbol(f"_{hint}{n}")

    # -- writing ---------------------------------------------------------------------
    def set_type(self, value: Value, t: Type, source: str = "user") -> Type:
        """Merge ``t`` into what is known about ``value`` (and its aliases); returns the result.

        Raises :class:`ShapeError` naming both constraints when they contradict.
        """
        new = normalize_type(t)
        old = self.type_of(value)
        unknown: list[tuple[Dim, Dim]] = []
        try:
            merged = merge_types(old, new, unknown)
        except TypeConflict as e:
            message = (f"value {value.name!r}: {format_type(old)} (from {self.source_of(value)}) "
                       f"contradicts {format_type(new)} (from {source}): {e.reason}")
            if self.strict or self._sources.get(value) != ["declared type"] or value.producer() is None:
                raise ShapeError(message) from None
            self.conflicts.append(message)
            self._sources[value] = []
            merged, old = new, None
        for a, b in unknown:
            self.equalities.append((a, b, value.name))
        if merged != old:
            for m in self._alias_members.get(self._find(value), (value,)):
                self._store(m, merged, source)
        return merged

    def set_value(self, value: Value, content: SymTensor, source: str = "user") -> None:
        """Record the (possibly symbolic) content of a small tensor; also sets its type."""
        self.set_type(value, TensorType(content.elem_type, content.shape), source)
        if trackable(content.elem_type, content.size):
            self._values[value] = content

    def _store(self, value: Value, t: Type, source: str) -> None:
        self._types[value] = t
        srcs = self._sources.get(value, ())
        if source not in srcs:
            # a new list: a scratch copy shares the lists of its parent
            self._sources[value] = [*srcs[:1], *srcs[1:][-1:], source]  # the origin, the latest two
        if self.write_back and value.type != t:
            value.type = t

    def _seed(self, value: Value) -> Type:
        c = value.const
        if c is not None and self._seeds is not None:
            return seed_initializer(self, value, c)
        return self._seed_value(value, c)

    def _seed_value(self, value: Value, c: Tensor | EncodedTensor | None) -> Type:
        t: Type = None
        src: list[str] = []
        if isinstance(c, Tensor):
            t = TensorType(c.dtype, c.dims)
            src.append("initializer")
            if trackable(c.dtype, c.size):
                self._values[value] = SymTensor.from_tensor(c)
        elif isinstance(c, EncodedTensor):
            h = c.header
            t = normalize_type(h.logical_type) if h.logical_type is not None else h.struct_type
            src.append("encoded initializer (logical type)" if h.logical_type is not None
                       else "encoded initializer (layout)")
        declared = value.type
        if declared is not None and (self.trust_declared or value.producer() is None):
            try:
                t = merge_types(t, normalize_type(declared))
            except TypeConflict as e:
                raise ShapeError(f"value {value.name!r}: declared type {format_type(declared)} contradicts "
                                 f"its {src[0]} {format_type(t)}: {e.reason}") from None
            src.append("declared type")
        self._types[value] = t
        self._sources[value] = src
        return t

    # -- aliases ---------------------------------------------------------------------
    def _find(self, v: Value) -> Value:
        p = self._alias_parent.get(v)
        if p is None:
            return v
        root = self._find(p)
        self._alias_parent[v] = root
        return root

    def alias_class(self, value: Value) -> list[Value]:
        """Every value known to share storage with ``value`` (itself included)."""
        return list(self._alias_members.get(self._find(value), [value]))

    def _aliased_input(self, v: Value) -> Value | None:
        a = v.alias_of
        if isinstance(a, Value):
            return a
        if isinstance(a, str) and a:
            return self._resolve_name(v, a)
        p = v.producer()
        if p is not None:
            for al in p.output_alias:
                if al.output_index == v.index and al.kind == MUST_ALIAS and 0 <= al.input_index < len(p.inputs):
                    return p.inputs[al.input_index]
        return self._alias_edges.get(v)

    def alias_root(self, value: Value) -> Value:
        """The storage owner of ``value``, from the one alias resolution
        (:class:`~onnxforge.graphbuilder.ir.storage.Storage`); alias classes here only
        share types."""
        st = getattr(self, "_storage", None)
        if st is None:
            model = self.model
            if model is None and isinstance(self.graph, Graph):
                model = Model(self.graph)
            if model is None:
                return value
            st = self._storage = Storage(model)
        return st.root(value)

    def _resolve_name(self, v: Value, name: str) -> Value:
        g = v.graph
        while g is not None:
            for cand in _scope_values(g):
                if cand.name == name:
                    return cand
            parent = getattr(g, "parent", None)
            g = parent.graph if parent is not None else None
        raise ShapeError(f"value {v.name!r}: alias_of names {name!r}, which is not defined in its scope")

    def add_alias(self, output: Value, input: Value, source: str = "alias") -> None:
        """Make ``output`` and ``input`` one alias class: merge their types (rejects conflicts)."""
        if output is input:
            return
        ra, rb = self._find(output), self._find(input)
        if ra is rb:
            return
        t_in = self.type_of(input)
        try:
            merged = merge_types(self.type_of(output), t_in)
        except TypeConflict as e:
            raise ShapeError(
                f"alias {output.name!r} -> {input.name!r}: {output.name!r} is "
                f"{format_type(self.type_of(output))} (from {self.source_of(output)}) but "
                f"{input.name!r} is {format_type(t_in)} (from {self.source_of(input)}): {e.reason}") from None
        if self._aliased_input(output) is None:
            self._alias_edges[output] = input
        members = self._alias_members.pop(ra, [ra]) + self._alias_members.pop(rb, [rb])
        self._alias_parent[ra] = rb
        self._alias_members[rb] = members
        for m in members:
            if self.type_of(m) != merged:
                self._store(m, merged, f"{source} ({output.name!r} aliases {input.name!r})")

    def _node_aliases(self, node: Node) -> None:
        where = _node_label(node) if node.output_alias else ""
        for al in node.output_alias:
            if al.kind != MUST_ALIAS:
                continue
            if not (0 <= al.output_index < len(node.outputs) and 0 <= al.input_index < len(node.inputs)) \
                    or node.inputs[al.input_index] is None:
                raise ShapeError(f"{where}: output_alias {al.output_index} -> {al.input_index} names a "
                                 "missing port")
            out, inp = node.outputs[al.output_index], node.inputs[al.input_index]
            declared = out.alias_of
            if declared is not None and declared != "":
                target = declared if isinstance(declared, Value) else self._resolve_name(out, declared)
                if target is not inp:
                    raise ShapeError(f"{where}: output {out.name!r} has alias_of {target.name!r} but "
                                     f"output_alias names input {inp.name!r}")
            self.add_alias(out, inp, f"output_alias of {where}")
        for out in node.outputs:
            if out.alias_of is not None and out.alias_of != "":
                self.add_alias(out, self._aliased_input(out), f"alias_of of {out.name!r}")

    # -- inference -------------------------------------------------------------------
    def infer_node(self, node: Node) -> list[Type]:
        """Infer the output types of one node from what is known of its inputs."""
        if self.live is not None:  # a speculation
            assumed = assumed_types(self, node)
            if assumed is not None:
                return assumed
        if self._records is not None:
            return infer_recorded(self, node)
        return self._infer_node(node)

    def _infer_node(self, node: Node) -> list[Type]:
        rule = self._rules.lookup(node.domain, node.op_type)
        if rule is not None:
            op = self._rules.NodeInference(self, node)
            try:
                rule(op)
            except SymbolicError as e:
                if self.live is not None:  # arithmetic the symbols cannot express: no run fails for it
                    raise Undecided(f"{_node_label(node)}: {e}") from e
                raise ShapeError(f"{_node_label(node)}: {e}") from e
            except ShapeError as e:
                check_failure(self, node, str(e))
                raise
        else:
            fn = self.model.function(node.domain, node.op_type, node.overload) if self.model else None
            if fn is not None:
                try:
                    self._infer_call(node, fn)
                except ShapeError as e:
                    if self.live is not None:
                        raise Undecided(str(e)) from e
                    raise
            else:
                key = (node.domain, node.op_type)
                self.unknown_ops[key] = self.unknown_ops.get(key, 0) + 1
                self._unknown_count += 1
        self._node_aliases(node)
        return [self.type_of(o) for o in node.outputs]

    def infer_graph(self, graph: Graph | Function | None = None) -> ShapesContext:
        """Infer every node of ``graph`` (default: the context's graph) in topological order,
        recursing into control-flow bodies; returns ``self``."""
        g = self.graph if graph is None else graph
        if self._ordered or g is not self.graph:
            return self._infer_graph(g)
        self._ordered = in_order_throughout(g)
        try:
            return self._infer_graph(g)
        finally:
            self._was_ordered, self._ordered = self._ordered, False

    def infer_for(self, values: Iterable[Value | None]) -> ShapesContext:
        """Infer what ``values`` depend on and nothing more: their producers and, before each,
        the producers of its inputs and of the outer values its bodies read, in dependency
        order; returns ``self``.

        A node of an ``If`` branch is inferred on its own (a branch binds no inputs). A node
        of any other body (a ``Loop`` or ``Scan`` body binds inputs its owner computes) is
        inferred with its owner's whole body. Values of local function bodies stay unknown,
        as in :meth:`infer_graph`. Each node's types are the ones a whole-graph inference
        gives it, for a model without aliases: an alias class shares types across nodes
        no ancestor walk follows, so a model that declares storage is inferred whole.
        Nodes inferred once are not inferred again; a later call infers only what is new
        (nodes a rewrite made since)."""
        done = self._inferred
        for v in values:
            if v is None:
                continue
            p = v._producer
            if p is None:
                g = v.graph
                if isinstance(g, Graph) and g.parent is not None and v in g._input_set:
                    p = g.parent  # a body input: its owner binds it
                else:
                    self.type_of(v)  # a graph input or an initializer: seeded
                    continue
            unit = self._demand_unit(p)
            if unit is not None and unit not in done:
                self._infer_upward(unit)
        return self

    def _demand_unit(self, node: Node) -> Node | None:
        """The node to infer for ``node``'s outputs: itself, or the outermost owner of a
        body that binds inputs; None when it lies outside the context's graph (a local
        function's body, a detached node)."""
        unit = node
        g = node.graph
        while isinstance(g, Graph) and g.parent is not None:
            owner = g.parent
            if owner.op_type != "If" or owner.domain not in ("", "ai.onnx"):
                unit = owner
            g = owner.graph
        return unit if g is self.graph else None

    def _infer_upward(self, start: Node) -> None:
        done = self._inferred
        active: set[Node] = set()
        stack: list[tuple[Node, bool]] = [(start, False)]
        while stack:
            n, ready = stack.pop()
            if n in done:
                continue
            if ready:
                active.discard(n)
                self.infer_node(n)
                done.add(n)
                if n.attributes and n.subgraphs():
                    for sg in n.subgraphs():
                        done.update(sg.all_nodes())
                continue
            if n in active:
                raise ShapeError(f"{_node_label(n)} depends on its own outputs")
            active.add(n)
            stack.append((n, True))
            for dep in _demand_deps(n):
                unit = self._demand_unit(dep)
                if unit is not None and unit not in done:
                    stack.append((unit, False))

    def _infer_graph(self, g: Graph | Function) -> ShapesContext:
        for v in g.inputs:
            self.type_of(v)
        if self._ordered:
            order = list(g)
        else:
            try:
                order = topological_order(g)
            except CycleError as e:
                raise ShapeError(str(e)) from None
        for node in order:
            self.infer_node(node)
        for v in g.outputs:
            if v.alias_of is not None and v.alias_of != "":
                self.add_alias(v, self._aliased_input(v), f"alias_of of {v.name!r}")
        return self

    def _infer_call(self, node: Node, fn: Function) -> None:
        """A call of a local function: bind formal inputs to the actual types, infer the body."""
        actual = [self.type_of(v) for v in node.inputs]
        consts = [self.value_of(v) for v in node.inputs]
        attrs = dict(fn.attribute_defaults)
        for a in node.attributes.values():
            attrs[a.name] = self._attr_env.get(a.ref_attr_name, a) if a.ref_attr_name else a
        try:
            key = (fn.id, tuple(actual), tuple(None if c is None else (c.elem_type, c.shape, tuple(map(str, c.flat())))
                                              for c in consts),
                   tuple(sorted((k, _attr_key(a)) for k, a in attrs.items())))
            hash(key)
        except TypeError:
            key = None
        hit = self._fn_cache.get(key) if key is not None else None
        if hit is None:
            if fn.id in self._active_calls:
                raise ShapeError(f"{_node_label(node)}: local function {fn.domain}::{fn.name} calls itself")
            child = ShapesContext(fn, trust_declared=self.trust_declared, write_back=False,
                                  strict=self.strict, opset_imports=fn.opset_imports or self.opsets)
            child.model, child.catalogue, child._counter = self.model, self.catalogue, self._counter
            child._fn_cache, child._attr_env = self._fn_cache, attrs
            child._active_calls = self._active_calls
            for formal, t, c in zip(fn.inputs, actual, consts):
                child.set_type(formal, t, f"argument of {_node_label(node)}")
                if c is not None:
                    child._values[formal] = c
            self._active_calls.add(fn.id)
            try:
                child.infer_graph(fn)
            finally:
                self._active_calls.discard(fn.id)
            index = {id(v): i for i, v in enumerate(fn.inputs)}
            aliases: list[int | None] = []
            for o in fn.outputs:
                root = child.alias_root(o)
                aliases.append(index.get(id(root)) if root is not o else None)
            hit = ([child.type_of(o) for o in fn.outputs], [child.value_of(o) for o in fn.outputs], aliases)
            if key is not None:
                self._fn_cache[key] = hit
        types, values, aliases = hit
        label = f"function {fn.domain}::{fn.name} at {_node_label(node)}"
        for out, t, c, al in zip(node.outputs, types, values, aliases):
            if c is not None:
                self.set_value(out, c, label)
            else:
                self.set_type(out, t, label)
            if al is not None and al < len(node.inputs) and node.inputs[al] is not None:
                self.add_alias(out, node.inputs[al], label)

    def infer_subgraph(self, graph: Graph, input_types: Sequence[Type], source: str) -> list[Type]:
        """Bind the formal inputs of a control-flow body, infer it, return its output types."""
        if len(input_types) != len(graph.inputs):
            raise ShapeError(f"{graph.path()}: body takes {len(graph.inputs)} inputs, "
                             f"{len(input_types)} are bound")
        for v, t in zip(graph.inputs, input_types):
            self.set_type(v, t, source)
        self.infer_graph(graph)
        return [self.type_of(o) for o in graph.outputs]

    def scratch(self) -> ShapesContext:
        """A copy of this context that never writes the IR (for trial inference)."""
        c = ShapesContext.__new__(ShapesContext)
        for k in ("model", "graph", "opsets", "catalogue", "trust_declared", "strict", "_rules", "_counter",
                  "_attr_env", "_active_calls"):
            setattr(c, k, getattr(self, k))
        c.write_back = False
        c.equalities, c.conflicts, c.unknown_ops, c._unknown_count = [], [], {}, 0
        c._types, c._values, c._alias_edges = dict(self._types), dict(self._values), dict(self._alias_edges)
        c._sources = dict(self._sources)  # lists are replaced, never changed in place
        c._alias_parent = dict(self._alias_parent)
        c._alias_members = {k: list(v) for k, v in self._alias_members.items()}
        c._fn_cache = {}
        c._records = c._prior = c._prior_index = c._seeds = c._prior_seeds = c._seen = c._prior_seen = None
        c.replayed = 0
        c.live, c._pinned, c._kept = self.live, self._pinned, self._kept
        # a copy's speculations, like the original's, run on the IR its types describe
        c._ordered, c._was_ordered = False, self._was_ordered
        c._inferred = set(self._inferred)
        return c

    def speculation(self, live: Container[Node], pinned: dict[Node, list[SymTensor]] | None = None,
                    kept: Container[Node] | None = None) -> ShapesContext:
        """A :meth:`scratch` copy that infers what some assumed types imply (see :attr:`live`
        and :mod:`~onnxforge.graphbuilder.shapes.speculation`).

        Declared types that the assumption contradicts are replaced, not errors (value_info
        never makes a run fail). The nodes of ``pinned`` take those output contents instead
        of being inferred; the nodes of ``kept`` (which read nothing the assumption
        changes) keep their results."""
        return speculate(self, live, pinned, kept)

    def forget(self, values: Iterable[Value]) -> None:
        """Drop what is known of ``values``, so that inferring their producers again starts
        from their declared types only."""
        for v in values:
            self._types.pop(v, None)
            self._values.pop(v, None)
            self._sources.pop(v, None)

    def values(self) -> Iterator[tuple[Value, Type]]:
        """Every value with known (or seeded) type, and its type."""
        return iter(list(self._types.items()))


def _attr_key(a: Attr) -> Any:
    """Hashable identity of an attribute value (tensors and graphs by object identity)."""
    v = a.value
    if isinstance(v, (Tensor, Graph)):
        return (a.type, id(v))
    if isinstance(v, list):
        return (a.type, tuple(id(x) if isinstance(x, (Tensor, Graph)) else x for x in v))
    return (a.type, repr(v))


def _node_label(node: Node) -> str:
    return node_label(node.domain, node.op_type, node.name)


def _scope_values(g: Graph | Function) -> Iterable[Value]:
    yield from g.inputs
    if isinstance(g, Graph):
        yield from g.all_initializers()
    for n in g:
        yield from n.outputs


def _demand_deps(node: Node) -> Iterator[Node]:
    """The producers of ``node``'s inputs and of the values its bodies read from outside them."""
    for v in node._inputs:
        if v is not None and v._producer is not None:
            yield v._producer
    if not (node.attributes and node.subgraphs()):
        return
    for sg in node.subgraphs():
        for v in captured_reads(sg):
            if v._producer is not None:
                yield v._producer
