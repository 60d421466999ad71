"""GraphBuilder: the authoring API.

    g = GraphBuilder(opset=23)
    x = g.input("x", FLOAT, ["batch", 8])
    w = g.initializer("w", np.ones((8, 4), np.float32))
    y = g.op.MatMul(x, w)
    g.output(y, "y")
    model = g.to_model()          # IR Model; g.to_onnx() gives an onnx.ModelProto

Nodes are validated as they are added, against the operator schemas of the
declared opsets (``opschemas.check_node``): an unknown operator, a wrong input
count, an empty required input or a wrong attribute type raises at the call and
leaves the graph unchanged. Attributes are first adjusted to the schema where that
loses nothing (``alpha=1`` for a FLOAT, ``perm=0`` for INTS). Names are made unique
automatically. ``g.op.X(...)`` builds a node of the default domain (or of
``ai.onnxforge`` for its operators: ``g.op.CacheUpdate``); ``g.op["com.microsoft"].Y``
picks another domain.

Stateful authoring:

    cache = g.input("cache", FLOAT, [1, 64, 8], access=READ_WRITE)
    upd = g.op.CacheUpdate(cache, values, position)   # output_alias {0, 0, MUST_ALIAS} and
    g.output(upd, "updated_cache")                     # alias_of "cache" set automatically
    g.bind("cache", "updated_cache")                   # persistent binding
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from onnxforge.proto_ext.errors import OnnxforgeError
from onnxforge.graphbuilder.ir.core import (
    MUST_ALIAS,
    READ_ONLY,
    READ_WRITE,
    Alias,
    Attr,
    AttrType,
    Function,
    Graph,
    Model,
    Node,
    Value,
)
from onnxforge.graphbuilder.ir.names import NameScope
from onnxforge.graphbuilder.builder.opschemas import (
    ONNXFORGE_DOMAIN,
    ONNXFORGE_VERSION,
    check_node,
    resolve_schema,
)
from onnxforge.graphbuilder.ir.tensors import EncodedTensor, Tensor, np_dtype, onnx_dtype
from onnxforge.proto_ext.convert import constant_from_numpy, function_blob_from_proto
from onnxforge.proto_ext.types import (
    AffineLayout,
    ArrayKind,
    BitPackingKind,
    Component,
    Constant,
    EncodedValue,
    FunctionBlob,
    StructField,
    StructType,
    TensorType,
    Type,
)

__all__ = ["GraphBuilder", "BuildError", "attr_from_value", "struct_ref", "tensor_type", "READ_ONLY", "READ_WRITE"]

# Operators of the ai.onnxforge domain reachable through ``g.op``.
_ONNXFORGE_OPS = frozenset({"CacheUpdate", "PagedCacheUpdate", "PagedAttention", "RaggedPagedCacheUpdate",
                            "RaggedPagedAttention"})
# Port aliases every node of these operators carries.
_BUILTIN_ALIASES = {(ONNXFORGE_DOMAIN, "CacheUpdate"): (Alias(0, 0, MUST_ALIAS),),
                    (ONNXFORGE_DOMAIN, "PagedCacheUpdate"): (Alias(0, 0, MUST_ALIAS),),
                    (ONNXFORGE_DOMAIN, "RaggedPagedCacheUpdate"): (Alias(0, 0, MUST_ALIAS),)}


class BuildError(OnnxforgeError, ValueError):
    """An authoring call that cannot produce a valid model."""


def tensor_type(dtype: Any, shape: Sequence[int | str | None] | None) -> TensorType:
    """``TensorType`` from a numpy dtype or TensorProto code and a shape list."""
    code = dtype if isinstance(dtype, int) else onnx_dtype(dtype)
    return TensorType(code, None if shape is None else tuple(shape))


def struct_ref(type_id: int) -> StructType:
    """A ``type_ref`` to a catalogue declaration (for value types and fields)."""
    return StructType(kind="type_ref", type_ref=type_id)


def attr_from_value(name: str, value: Any) -> Attr:
    """Python value -> Attr with the AttributeProto type inferred from the value."""
    if isinstance(value, Attr):
        return value
    if isinstance(value, (bool, np.bool_, int, np.integer)):
        return Attr(name, AttrType.INT, int(value))
    if isinstance(value, (float, np.floating)):
        return Attr(name, AttrType.FLOAT, float(value))
    if isinstance(value, str):
        return Attr(name, AttrType.STRING, value.encode())
    if isinstance(value, bytes):
        return Attr(name, AttrType.STRING, value)
    if isinstance(value, Tensor):
        return Attr(name, AttrType.TENSOR, value)
    if isinstance(value, np.ndarray):
        return Attr(name, AttrType.TENSOR, Tensor.from_numpy(value))
    if isinstance(value, Graph):
        return Attr(name, AttrType.GRAPH, value)
    if isinstance(value, GraphBuilder):
        return Attr(name, AttrType.GRAPH, value.graph)
    if isinstance(value, (list, tuple)):
        items = list(value)
        if all(isinstance(v, (bool, np.bool_, int, np.integer)) for v in items):
            return Attr(name, AttrType.INTS, [int(v) for v in items])
        if all(isinstance(v, (int, float, np.integer, np.floating)) for v in items):
            return Attr(name, AttrType.FLOATS, [float(v) for v in items])
        if all(isinstance(v, (str, bytes)) for v in items):
            return Attr(name, AttrType.STRINGS, [v.encode() if isinstance(v, str) else v for v in items])
        if all(isinstance(v, (Graph, GraphBuilder)) for v in items):
            return Attr(name, AttrType.GRAPHS, [v.graph if isinstance(v, GraphBuilder) else v for v in items])
        if all(isinstance(v, (Tensor, np.ndarray)) for v in items):
            return Attr(name, AttrType.TENSORS,
                        [v if isinstance(v, Tensor) else Tensor.from_numpy(v) for v in items])
    raise BuildError(f"attribute {name!r}: cannot infer an attribute type for {type(value).__name__}")


_FLOAT_FROM_INT = (AttrType.INT, AttrType.FLOAT)


def _coerce(attr: Attr, schema: Any) -> Attr:
    """Adjust an inferred attribute type to the schema's (int given for a float...)."""
    if schema is None or attr.name not in schema.attributes:
        return attr
    want = int(schema.attributes[attr.name].type)
    if want == attr.type:
        return attr
    if want == AttrType.FLOAT and attr.type == AttrType.INT:
        return Attr(attr.name, AttrType.FLOAT, float(attr.value))
    if want == AttrType.FLOATS and attr.type == AttrType.INTS:
        return Attr(attr.name, AttrType.FLOATS, [float(v) for v in attr.value])
    scalar_of = {AttrType.INTS: AttrType.INT, AttrType.FLOATS: AttrType.FLOAT,
                 AttrType.STRINGS: AttrType.STRING}
    if scalar_of.get(want) == attr.type:
        return Attr(attr.name, want, [attr.value])
    if want == AttrType.FLOATS and attr.type == AttrType.INT:
        return Attr(attr.name, want, [float(attr.value)])
    if attr.type == AttrType.INTS and not attr.value and want in (
            AttrType.STRINGS, AttrType.TENSORS, AttrType.GRAPHS):
        return Attr(attr.name, want, [])  # [] was inferred as INTS
    return attr


class _Ops:
    """``g.op.Name(*inputs, **attributes)``; ``g.op["domain"]`` selects a domain."""

    __slots__ = ("_builder", "_domain")

    def __init__(self, builder: "GraphBuilder", domain: str | None = None):
        self._builder = builder
        self._domain = domain

    def __getitem__(self, domain: str) -> "_Ops":
        return _Ops(self._builder, domain)

    def __getattr__(self, op_type: str):
        if op_type.startswith("_"):
            raise AttributeError(op_type)
        domain = self._domain
        if domain is None:
            domain = ONNXFORGE_DOMAIN if op_type in _ONNXFORGE_OPS else ""

        def make(*inputs: Any, _outputs: int | Sequence[str] = 1, _name: str = "", **attrs: Any):
            node = self._builder.make_node(op_type, list(inputs), _outputs, domain=domain,
                                           name=_name, **attrs)
            outs = node.outputs
            return outs[0] if len(outs) == 1 else outs

        make.__name__ = op_type
        return make


class GraphBuilder:
    """Builds a :class:`~onnxforge.graphbuilder.ir.core.Model` (or a subgraph / function body)."""

    def __init__(self, opset: int = 23, *, name: str = "main", domains: dict[str, int] | None = None,
                 model: Model | None = None, parent: "GraphBuilder | None" = None,
                 infer_shapes: bool = True):
        if model is None:
            opsets = {"": opset}
            opsets.update(domains or {})
            model = Model(Graph(name), opset_imports=opsets)
        self.model = model
        self.graph: Graph | Function = model.graph
        self.parent = parent
        self._scope: NameScope = NameScope.from_model(model) if parent is None else parent._scope
        self.op = _Ops(self)
        self._shapes = None
        self._infer = infer_shapes

    # -- construction ----------------------------------------------------------------
    @classmethod
    def from_model(cls, model: Model, *, infer_shapes: bool = True) -> "GraphBuilder":
        """Continue editing an existing model (its values keep their names)."""
        return cls(model=model, infer_shapes=infer_shapes)

    @property
    def opsets(self) -> dict[str, int]:
        if isinstance(self.graph, Function):
            return self.graph.opset_imports
        if self.parent is not None:  # a control-flow body follows its enclosing scope
            return self.parent.opsets
        return self.model.opset_imports

    def unique_name(self, base: str) -> str:
        """A name not used anywhere in the model, derived from ``base``."""
        return self._scope.fresh(base)

    def _claim(self, name: str, what: str) -> str:
        if not self._scope.claim(name):
            raise BuildError(f"{what} name {name!r} is already used in the model (SSA: one definition)")
        return name

    # -- shapes ------------------------------------------------------------------------
    @property
    def shapes(self):
        """The model's ShapesContext (created on first use)."""
        if self._shapes is None:
            root = self
            while root.parent is not None:
                root = root.parent
            if root._shapes is None:
                from onnxforge.graphbuilder.shapes.context import ShapesContext

                root._shapes = ShapesContext(root.model)
            self._shapes = root._shapes
        return self._shapes

    def _infer_node(self, node: Node) -> None:
        if self._infer:
            self.shapes.infer_node(node)

    # -- values --------------------------------------------------------------------------
    def input(self, name: str, dtype: Any = None, shape: Sequence[int | str | None] | None = None, *,
              type: Type = None, access: int = READ_ONLY) -> Value:
        """Add a graph input (``type=`` for non-tensor or struct types)."""
        t = type if type is not None else (None if dtype is None else tensor_type(dtype, shape))
        v = Value(self._claim(name, "input"), t, access=access)
        self.graph.add_input(v)
        return v

    def output(self, value: Value, name: str | None = None, *, alias_of: Value | str | None = None,
               type: Type = None) -> Value:
        """Mark ``value`` as a graph output, renaming it to ``name`` if given.

        The alias of an output produced through a MUST_ALIAS port is recorded as
        ``alias_of`` automatically; ``alias_of=`` declares it explicitly.
        """
        _check_value(value, "output")
        if name is not None and name != value.name:
            if (value.is_graph_input() or value.is_initializer() or value.is_graph_output()
                    or value.graph is not self.graph):
                # renaming would rename an input, a weight, another output or an outer value
                value = self.op.Identity(value)
            old = value.name
            value.name = self._claim(name, "output")
            self._scope.discard(old)
        if type is not None:
            value.type = type
        self.graph.outputs.append(value)
        src = value.aliased_input()
        if alias_of is not None:
            self.alias(value, alias_of)
        elif src is not None:
            value.alias_of = src
        return value

    def initializer(self, name: str, array: Any) -> Value:
        """A dense initializer from a numpy array (or a :class:`Tensor`)."""
        tensor = array if isinstance(array, Tensor) else Tensor.from_numpy(np.asarray(array))
        v = Value(self._claim(name, "initializer"), TensorType(tensor.dtype, tensor.dims))
        self.graph.add_initializer(v, tensor)
        return v

    def constant(self, array: Any, name: str = "const") -> Value:
        """A ``Constant`` node (use :meth:`initializer` for weights)."""
        out = self.unique_name(name)
        self._scope.discard(out)  # make_node claims it
        return self.make_node("Constant", [], [out], value=Tensor.from_numpy(np.asarray(array))).outputs[0]

    def encoded_initializer(self, name: str, values: Any = None, *, storage_type: int | None = None,
                            scale: Any = None, zero_point: Any = None, axis: int | None = None,
                            block_size: int | None = None, codes: bytes | None = None,
                            struct_type: StructType | int | None = None,
                            logical_type: Type = None) -> Value:
        """An encoded (quantized) initializer.

        * Affine from float ``values``: give ``storage_type`` (INT4, INT8...) and
          optionally ``axis``/``block_size``; ``scale``/``zero_point`` are chosen by
          min/max when omitted.
        * Affine from existing ``codes`` (packed bytes): give ``storage_type``, ``scale``,
          ``logical_type`` (and ``zero_point``/``axis``/``block_size``).
        * Struct records: give ``struct_type`` (a type_id or StructType) and ``codes``
          (the record bytes) and optionally ``logical_type``.
        """
        if struct_type is not None:
            if codes is None:
                raise BuildError(f"encoded initializer {name!r}: struct layouts need `codes` bytes")
            st = struct_ref(struct_type) if isinstance(struct_type, int) else struct_type
            header = EncodedValue(name=name, struct_type=st, logical_type=logical_type,
                                  has_logical_type=logical_type is not None, raw_data=bytes(codes))
        else:
            if storage_type is None:
                raise BuildError(f"encoded initializer {name!r}: give storage_type or struct_type")
            from onnxforge.proto_ext.codecs.affine import affine_encode, choose_affine_params

            if codes is None:
                if values is None:
                    raise BuildError(f"encoded initializer {name!r}: give values or codes")
                x = np.asarray(values)
                if scale is not None and not isinstance(scale, (np.ndarray, np.generic)) \
                        and x.dtype.kind == "f":
                    scale = np.asarray(scale, dtype=x.dtype)  # a Python float keeps x's precision
                if scale is None:
                    scale, zp = choose_affine_params(x, storage_type, axis=axis, block_size=block_size)
                    zero_point = zp if zero_point is None else zero_point
                codes = affine_encode(x, storage_type, np.asarray(scale), zero_point, axis, block_size)
                logical_type = TensorType(onnx_dtype(np.asarray(scale).dtype), tuple(x.shape))
            elif logical_type is None or scale is None:
                raise BuildError(f"encoded initializer {name!r}: wrapping codes needs scale and "
                                 "logical_type")
            scale_arr = np.asarray(scale)
            zp_constant = None
            if zero_point is not None:
                zp_constant = _constant(np.asarray(zero_point).astype(np_dtype(storage_type)))
            header = EncodedValue(
                name=name,
                affine=AffineLayout(storage_type, _constant(scale_arr), zp_constant, axis, block_size),
                logical_type=logical_type, has_logical_type=True, raw_data=bytes(codes))
        v = Value(self._claim(name, "initializer"), logical_type)
        self.graph.add_initializer(v, EncodedTensor(header))
        return v

    # -- struct catalogue ------------------------------------------------------------------
    def declare_struct_type(self, name: str, fields: Sequence[tuple[str, Any]] | None = None, *,
                            array: tuple[Type, int] | None = None,
                            bit_packing: tuple[Sequence[tuple[str, int]], int] | None = None,
                            decoder: Any = None, encoder: Any = None, type_id: int | None = None,
                            doc_string: str = "", metadata: dict[str, str] | None = None) -> StructType:
        """Add a declaration to the model's catalogue; returns a ``type_ref`` to it.

        ``fields`` are ``(name, type_or_constant)`` pairs: a type record (``TensorType``,
        ``struct_ref(...)``...) or a numpy array for a constant field. ``decoder`` /
        ``encoder`` are ``onnx.FunctionProto`` messages.
        """
        used = {s.type_id for s in self.model.struct_types}
        if type_id is None:
            type_id = max(used | {999}) + 1
        elif isinstance(type_id, bool) or not isinstance(type_id, int) or type_id <= 0:
            raise BuildError(f"struct type {name!r}: type_id must be a positive integer, got {type_id!r} "
                             "(rule C1)")
        elif type_id in used:
            raise BuildError(f"struct type_id {type_id} is already declared (rule C2)")
        kinds = [k for k, v in (("structure", fields), ("array", array), ("bit_packing", bit_packing))
                 if v is not None]
        if len(kinds) != 1:
            raise BuildError(f"struct type {name!r}: give exactly one of fields, array, bit_packing")
        sfields: tuple[StructField, ...] = ()
        arr = bp = None
        if fields is not None:
            sfields = tuple(
                StructField(fname, None, _constant(np.asarray(f)), has_type=False)
                if isinstance(f, (np.ndarray, np.generic, list, float, int))
                else StructField(fname, f, None, has_type=True)
                for fname, f in fields)
        elif array is not None:
            try:
                elem, length = array
                arr = ArrayKind(elem, int(length))
            except (TypeError, ValueError) as exc:
                raise BuildError(f"struct type {name!r}: array must be (element type, length): {exc}") from None
        else:
            try:
                comps, dim = bit_packing  # type: ignore[misc]
                bp = BitPackingKind(tuple(Component(c, int(w)) for c, w in comps), int(dim))
            except (TypeError, ValueError) as exc:
                raise BuildError(f"struct type {name!r}: bit_packing must be ([(component, bits), ...], "
                                 f"dim): {exc}") from None
        decl = StructType(kind=kinds[0], fields=sfields, array=arr, bit_packing=bp,
                          decoder=_function_blob(decoder), encoder=_function_blob(encoder),
                          name=name, doc_string=doc_string,
                          metadata=tuple((metadata or {}).items()), type_id=type_id)
        self.model.struct_types.append(decl)
        return struct_ref(type_id)

    # -- nodes -------------------------------------------------------------------------------
    def make_node(self, op_type: str, inputs: Sequence[Value | None], outputs: int | Sequence[str] = 1,
                  *, domain: str = "", name: str = "", output_alias: Iterable[Alias] | None = None,
                  **attributes: Any) -> Node:
        """Add a node after validating it against its schema; returns the node."""
        for i, v in enumerate(inputs):
            if v is not None and not isinstance(v, Value):
                raise BuildError(f"{op_type}: input {i} is a {type(v).__name__}, not a Value "
                                 "(use g.initializer / g.constant for data)")
        attrs = [attr_from_value(k, v) for k, v in attributes.items() if v is not None]
        node_name = self.unique_name(name or op_type)
        where = f"{self.graph.path()}.node({node_name!r})"
        if domain == ONNXFORGE_DOMAIN and ONNXFORGE_DOMAIN not in self.opsets:
            self.opsets[ONNXFORGE_DOMAIN] = ONNXFORGE_VERSION
        attrs = [_coerce(a, resolve_schema(op_type, domain, self.opsets)) for a in attrs]
        check_node(op_type, domain, len(inputs), outputs if isinstance(outputs, int) else len(outputs),
                   {a.name: a.type for a in attrs}, self.opsets, where,
                   missing=[i for i, v in enumerate(inputs) if v is None])
        if isinstance(outputs, int):
            out_names = [self.unique_name(f"{node_name}_out{i}" if outputs > 1 else node_name + "_out")
                         for i in range(outputs)]
        else:
            out_names = [self._claim(o, "output") if o else "" for o in outputs]
        aliases = list(output_alias) if output_alias is not None else list(
            _BUILTIN_ALIASES.get((domain, op_type), ()))
        node = Node(domain, op_type, inputs, out_names, name=node_name, attributes=attrs,
                    output_alias=aliases)
        for a in aliases:
            if not (0 <= a.output_index < len(node.outputs) and 0 <= a.input_index < len(inputs)):
                raise BuildError(f"{where}: output_alias {a} is out of range (rule L1)")
            if inputs[a.input_index] is None:
                raise BuildError(f"{where}: output_alias names an empty input (rule L1)")
        self.graph.append(node)
        try:
            self._infer_node(node)
        except Exception:
            self.graph.remove(node, safe=False)  # a failed call leaves the graph unchanged
            raise
        return node

    # -- state and aliases ---------------------------------------------------------------
    def _value(self, v: Value | str, what: str) -> Value:
        if isinstance(v, Value):
            return v
        for cand in (*self.graph.inputs, *self.graph.outputs):
            if cand.name == v:
                return cand
        raise BuildError(f"{what}: no graph input or output named {v!r}")

    def bind(self, input: Value | str, output: Value | str) -> None:
        """Declare a persistent binding: ``output`` feeds ``input`` on the next call."""
        if self.parent is not None or not isinstance(self.graph, Graph) or self.graph.parent is not None:
            raise BuildError("persistent bindings are only allowed in the main graph (rule B1)")
        vi = self._value(input, "bind")
        vo = self._value(output, "bind")
        if not vi.is_graph_input():
            raise BuildError(f"bind: {vi.name!r} is not a graph input (rule B2)")
        if not vo.is_graph_output():
            raise BuildError(f"bind: {vo.name!r} is not a graph output (rule B2)")
        for i, o in self.graph.bindings:
            if i is vi or o is vo:
                raise BuildError(f"bind: {vi.name!r} or {vo.name!r} is already bound (rule B3)")
        self.graph.bindings.append((vi, vo))

    def alias(self, output: Value, input: Value | str) -> None:
        """Declare that ``output`` must be the storage of ``input`` (``alias_of``); the
        producing node's ``output_alias`` port entry is added to match."""
        _check_value(output, "alias")
        src = self._value(input, "alias") if isinstance(input, str) else input
        _check_value(src, "alias")
        if output.is_graph_input() or output.is_initializer():
            raise BuildError(f"alias: {output.name!r} is a graph input or initializer and cannot "
                             "alias another value (rule L2)")
        node = output.producer()
        if node is not None:
            idx = [i for i, v in enumerate(node.inputs) if v is src]
            if not idx:
                raise BuildError(f"alias: {output.name!r} is produced by {node!r}, which does not "
                                 f"read {src.name!r} (rule L3)")
            port = [a for a in node.output_alias if a.output_index == output.index]
            if port and port[0].input_index not in idx:
                raise BuildError(f"alias: {output.name!r} already aliases input {port[0].input_index} "
                                 f"of {node!r}, not {src.name!r} (rule L3)")
            if not port:
                node.output_alias.append(Alias(output.index, idx[0], MUST_ALIAS))
        output.alias_of = src
        if src.is_graph_input() and src.access != READ_WRITE:
            src.access = READ_WRITE

    # -- subgraphs and functions -----------------------------------------------------------
    def _child(self, body: Graph | Function, scope: NameScope) -> "GraphBuilder":
        """A builder of ``body`` nested in this one (no shape inference of its own)."""
        child = GraphBuilder.__new__(GraphBuilder)
        child.model = self.model
        child.graph = body
        child.parent = self
        child._scope = scope
        child.op = _Ops(child)
        child._shapes = None
        child._infer = False
        return child

    def subgraph(self, name: str = "body") -> "GraphBuilder":
        """A builder for a control-flow body; it may use values of this builder (outer scope)."""
        return self._child(Graph(self.unique_name(name)), self._scope)

    def function(self, domain: str, name: str, inputs: Sequence[str], *,
                 opsets: dict[str, int] | None = None) -> "GraphBuilder":
        """A builder for a local function body; call ``g.op[domain].name(...)`` afterwards."""
        fn = Function(domain, name)
        fn.opset_imports = dict(opsets or self.opsets)
        fb = self._child(fn, NameScope())
        for i in inputs:
            fn.add_input(Value(fb._claim(i, "function input")))
        self.model.add_function(fn)
        if domain not in self.opsets:
            self.opsets[domain] = 1
        return fb

    # -- results ---------------------------------------------------------------------------
    def to_model(self) -> Model:
        return self.model

    def to_onnx(self):
        """The model as an ``onnx.ModelProto`` (extensions ride as unknown fields)."""
        from onnxforge.graphbuilder.serde import to_onnx

        return to_onnx(self.model)


def _check_value(v: Any, what: str) -> None:
    if not isinstance(v, Value):
        raise BuildError(f"{what}: expected a Value, got {type(v).__name__}")


def _constant(arr: np.ndarray) -> Constant:
    return constant_from_numpy(np.asarray(arr))


def _function_blob(f: Any) -> FunctionBlob | None:
    if f is None or isinstance(f, FunctionBlob):
        return f
    return function_blob_from_proto(f)
