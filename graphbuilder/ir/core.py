"""The in-memory IR: Model, Graph, Function, Node, Value, Attr. Protobuf-free.

The IR owns def-use tracking: a :class:`Value` knows its producer and its uses,
and every mutator (``Node.set_input``, ``Graph.remove``, ``Value.replace_all_uses_with``...)
keeps them current, so no pass rescans a graph to find consumers.

Nodes of a graph or function sit in an intrusive doubly linked list: insertion
and removal are O(1) and iteration tolerates removal of the current node.

Extensions are first-class: ``Model.struct_types`` (the catalogue),
``Graph.encoded_initializers``, ``Graph.bindings`` (persistent bindings as pairs
of Values, so renames follow), ``Node.output_alias`` (port-level aliases) and
``Value.alias_of`` / ``Value.access`` (value-level aliases).

Example::

    g = Graph(name="g")
    x = g.add_input(Value("x", TensorType(FLOAT, (4,))))
    n = g.append(Node("", "Relu", [x], ["y"]))
    g.outputs.append(n.outputs[0])
    assert x.uses() == [(n, 0)] and n.outputs[0].producer() is n
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from onnxforge.proto_ext.errors import OnnxforgeError
from onnxforge.graphbuilder.ir.tensors import EncodedTensor, Tensor
from onnxforge.proto_ext.types import StructType, Type

if TYPE_CHECKING:
    from onnxforge.proto_ext.view import ModelView

__all__ = [
    "IRError",
    "Attr",
    "AttrType",
    "Alias",
    "Value",
    "Node",
    "Graph",
    "Function",
    "Model",
    "READ_ONLY",
    "READ_WRITE",
    "MUST_ALIAS",
]

READ_ONLY = 0
READ_WRITE = 1
MUST_ALIAS = 1


class IRError(OnnxforgeError, ValueError):
    """An IR mutation that would break an invariant (SSA, def-use, ownership)."""


class AttrType:
    """AttributeProto.AttributeType codes."""

    UNDEFINED, FLOAT, INT, STRING, TENSOR, GRAPH = 0, 1, 2, 3, 4, 5
    FLOATS, INTS, STRINGS, TENSORS, GRAPHS = 6, 7, 8, 9, 10
    SPARSE_TENSOR, SPARSE_TENSORS, TYPE_PROTO, TYPE_PROTOS = 11, 12, 13, 14


@dataclass(slots=True)
class Attr:
    """A node attribute. ``value`` is a Python scalar/list, a :class:`Tensor`, a
    :class:`Graph` (or list of them), a type record, or opaque serialized bytes for
    sparse tensors. ``ref_attr_name`` marks a reference to a function attribute."""

    name: str
    type: int
    value: Any = None
    doc_string: str = ""
    ref_attr_name: str = ""
    extra: bytes = b""

    def graphs(self) -> list["Graph"]:
        if self.type == AttrType.GRAPH and self.value is not None:
            return [self.value]
        if self.type == AttrType.GRAPHS:
            return list(self.value or [])
        return []


@dataclass(slots=True, frozen=True)
class Alias:
    """Port-level alias of a node: output ``output_index`` must be the storage of
    input ``input_index`` (``kind`` 1 = MUST_ALIAS)."""

    output_index: int
    input_index: int
    kind: int = MUST_ALIAS


_GRAPH, _GRAPHS = AttrType.GRAPH, AttrType.GRAPHS


def _collect_subgraphs(body: "_Body", out: list["Graph"]) -> None:
    """Append the subgraphs of ``body``'s nodes, each followed by its own, depth first
    (plain recursion: a walk of every graph is asked for by most passes)."""
    n = body._head
    while n is not None:
        if n.attributes:
            for a in n.attributes.values():
                t = a.type
                if t == _GRAPH:
                    if a.value is not None:
                        out.append(a.value)
                        _collect_subgraphs(a.value, out)
                elif t == _GRAPHS and a.value:
                    for sg in a.value:
                        out.append(sg)
                        _collect_subgraphs(sg, out)
        n = n._next


def _collect_graphs(g: "Graph", out: list["Graph"]) -> None:
    out.append(g)
    _collect_subgraphs(g, out)


class Value:
    """An SSA value: produced by at most one node (or a graph input / initializer)."""

    __slots__ = ("name", "type", "_producer", "_index", "_uses", "graph", "doc_string",
                 "metadata", "access", "alias_of", "const", "has_value_info", "extra", "meta",
                 "__weakref__")

    def __init__(self, name: str = "", type: Type = None, *, doc_string: str = "",
                 access: int = READ_ONLY, alias_of: "Value | str | None" = None):
        self.name = name
        self.type = type
        self._producer: Node | None = None
        self._index: int = -1
        self._uses: dict[tuple[Node, int], None] = {}
        self.graph: Graph | Function | None = None
        self.doc_string = doc_string
        self.metadata: dict[str, str] = {}
        self.access = access
        self.alias_of = alias_of  # a Value once resolved; a name while unresolved
        self.const: Tensor | EncodedTensor | None = None  # set for initializers
        self.has_value_info = False
        self.extra = b""  # serialized unknown ValueInfoProto fields
        self.meta: dict[str, Any] = {}  # analysis results (not serialized)

    # -- def-use --------------------------------------------------------------
    def producer(self) -> "Node | None":
        return self._producer

    @property
    def index(self) -> int:
        """Output port index in the producer (-1 if not a node output)."""
        return self._index

    def uses(self) -> list[tuple["Node", int]]:
        """Snapshot of ``(consumer, input index)`` pairs."""
        return list(self._uses)

    def num_uses(self) -> int:
        return len(self._uses)

    def consumers(self) -> list["Node"]:
        return list(dict.fromkeys(n for n, _ in self._uses))

    def replace_all_uses_with(self, other: "Value", *, outputs: bool = True, aliases: bool = True) -> None:
        """Point every consumer of ``self`` at ``other`` (and the ``alias_of`` that named
        ``self`` on the consumers' outputs, and on the outputs of the nodes and subgraphs
        enclosing a consumer that captures ``self``); with ``outputs`` also graph outputs
        and persistent bindings that name ``self``. ``aliases=False`` skips the search for
        ``alias_of`` references: for a caller that knows the model declares none
        (:func:`~onnxforge.graphbuilder.ir.storage.declares_state` is False)."""
        for node, i in list(self._uses):
            node.set_input(i, other)
            if not aliases:
                continue
            n: Node | None = node
            while n is not None:  # the consumer and, for a subgraph capture, its owners
                for o in n._outputs:
                    if o.alias_of is self:
                        o.alias_of = other
                g = n.graph
                if not isinstance(g, Graph):
                    break
                for o in g.outputs:
                    if o.alias_of is self:
                        o.alias_of = other
                n = g.parent
        if outputs and self.graph is not None:
            self.graph._replace_output(self, other)

    # -- classification -------------------------------------------------------
    def is_graph_input(self) -> bool:
        return self.graph is not None and self._producer is None and self in self.graph._input_set

    def is_graph_output(self) -> bool:
        return self.graph is not None and self.graph.is_output(self)

    def is_initializer(self) -> bool:
        return self.const is not None

    def is_encoded(self) -> bool:
        return isinstance(self.const, EncodedTensor)

    def aliased_input(self) -> "Value | None":
        """The value whose storage this value must share, if any (one hop; the root of a
        chain and every other storage fact come from ``graphbuilder.ir.storage.Storage``)."""
        if isinstance(self.alias_of, Value):
            return self.alias_of
        p = self._producer
        if p is not None:
            for a in p.output_alias:
                if a.output_index == self._index and a.kind == MUST_ALIAS:
                    if 0 <= a.input_index < len(p.inputs):
                        return p.inputs[a.input_index]
        return None

    def __repr__(self) -> str:
        return f"Value({self.name!r}, {self.type})"


class Node:
    """An operator application. Inputs may be ``None`` (omitted optional input)."""

    __slots__ = ("domain", "op_type", "overload", "name", "_inputs", "_outputs", "attributes",
                 "doc_string", "metadata", "output_alias", "graph", "_prev", "_next", "extra",
                 "meta", "__weakref__")

    def __init__(self, domain: str, op_type: str, inputs: Sequence[Value | None] = (),
                 outputs: Sequence[Value | str] | int = 1, *, name: str = "",
                 attributes: Iterable[Attr] | dict[str, Attr] = (), overload: str = "",
                 doc_string: str = "", output_alias: Iterable[Alias] = ()):
        self.domain = domain
        self.op_type = op_type
        self.overload = overload
        self.name = name
        self.doc_string = doc_string
        self.metadata: dict[str, str] = {}
        self.attributes: dict[str, Attr] = (dict(attributes) if isinstance(attributes, dict)
                                            else {a.name: a for a in attributes})
        for a in self.attributes.values():
            for sg in a.graphs():
                sg.parent = self  # a subgraph knows the node that owns it
        self.output_alias: list[Alias] = list(output_alias)
        self.graph: Graph | Function | None = None
        self._prev: Node | None = None
        self._next: Node | None = None
        self.extra = b""
        self.meta: dict[str, Any] = {}
        if isinstance(outputs, int):
            outputs = [""] * outputs
        outs = [Value(o) if isinstance(o, str) else o for o in outputs]
        seen: set[int] = set()
        for v in outs:  # checked first: a refused node leaves its inputs' uses untouched
            if v._producer is not None or id(v) in seen:
                raise IRError(f"value {v.name!r} already has a producer (SSA)")
            if v.const is not None or v.is_graph_input():
                raise IRError(f"value {v.name!r} is a graph input or initializer; "
                              "it cannot also be a node output (SSA)")
            seen.add(id(v))
        self._inputs: list[Value | None] = []
        for v in inputs:
            self._inputs.append(v)
            if v is not None:
                v._uses[(self, len(self._inputs) - 1)] = None
        self._outputs: list[Value] = []
        for i, v in enumerate(outs):
            v._producer, v._index = self, i
            self._outputs.append(v)

    # -- ports ----------------------------------------------------------------
    @property
    def inputs(self) -> tuple[Value | None, ...]:
        return tuple(self._inputs)

    @property
    def outputs(self) -> tuple[Value, ...]:
        return tuple(self._outputs)

    def set_input(self, index: int, value: Value | None) -> None:
        old = self._inputs[index]
        if old is value:
            return
        if old is not None:
            old._uses.pop((self, index), None)
        self._inputs[index] = value
        if value is not None:
            value._uses[(self, index)] = None

    def append_input(self, value: Value | None) -> None:
        self._inputs.append(None)
        self.set_input(len(self._inputs) - 1, value)

    def resize_inputs(self, n: int) -> None:
        """Drop trailing inputs beyond ``n`` (or pad with ``None``)."""
        while len(self._inputs) > n:
            self.set_input(len(self._inputs) - 1, None)
            self._inputs.pop()
        while len(self._inputs) < n:
            self._inputs.append(None)

    def replace_input_with(self, old: Value, new: Value | None) -> None:
        for i, v in enumerate(self._inputs):
            if v is old:
                self.set_input(i, new)

    def detach_inputs(self) -> None:
        for i in range(len(self._inputs)):
            self.set_input(i, None)

    # -- attributes ---------------------------------------------------
    def attr(self, name: str, default: Any = None) -> Any:
        a = self.attributes.get(name)
        return default if a is None else a.value

    def subgraphs(self) -> list["Graph"]:
        out: list[Graph] = []
        for a in self.attributes.values():
            t = a.type  # inlined Attr.graphs: this is asked of every node by every model walk
            if t == _GRAPH:
                if a.value is not None:
                    out.append(a.value)
            elif t == _GRAPHS and a.value:
                out.extend(a.value)
        return out

    @property
    def op_id(self) -> tuple[str, str, str]:
        return (self.domain, self.op_type, self.overload)

    def __repr__(self) -> str:
        ins = ", ".join("" if v is None else v.name for v in self._inputs)
        outs = ", ".join(v.name for v in self._outputs)
        dom = f"{self.domain}::" if self.domain else ""
        return f"Node({self.name!r}: {outs} = {dom}{self.op_type}({ins}))"


class _Body:
    """What graphs and function bodies share: an intrusive doubly linked list of
    nodes with ownership bookkeeping, and the formal inputs and outputs."""

    _input_kind = "graph input"  # how error messages name an input

    def __init__(self) -> None:
        self._head: Node | None = None
        self._tail: Node | None = None
        self._count = 0
        self.inputs: list[Value] = []
        self._input_set: set[Value] = set()
        self.outputs: list[Value] = []

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[Node]:
        n = self._head
        while n is not None:
            nxt = n._next
            yield n
            n = nxt

    def __reversed__(self) -> Iterator[Node]:
        n = self._tail
        while n is not None:
            prv = n._prev
            yield n
            n = prv

    @property
    def nodes(self) -> list[Node]:
        return list(self)

    # -- boundary ----------------------------------------------------------------------
    def add_input(self, value: Value) -> Value:
        if value._producer is not None:
            raise IRError(f"{self._input_kind} {value.name!r} cannot have a producer")
        value.graph = self  # type: ignore[assignment]
        self.inputs.append(value)
        self._input_set.add(value)
        return value

    def is_output(self, v: Value) -> bool:
        for o in self.outputs:
            if o is v:
                return True
        return False

    def _replace_output(self, old: Value, new: Value) -> None:
        for i, o in enumerate(self.outputs):
            if o is old:
                self.outputs[i] = new

    # -- linking -----------------------------------------------------------------------
    def _adopt(self, node: Node) -> None:
        if node.graph is not None:
            raise IRError(f"{node!r} already belongs to a graph")
        node.graph = self  # type: ignore[assignment]
        for v in node._outputs:
            v.graph = self  # type: ignore[assignment]
        self._count += 1

    def _check_owned(self, node: Node) -> None:
        if node.graph is not self:
            raise IRError(f"{node!r} is not in this graph")

    def _link(self, node: Node, prev: Node | None, nxt: Node | None) -> None:
        """Link ``node`` between the adjacent ``prev`` and ``nxt`` (None: the list's ends)."""
        node._prev, node._next = prev, nxt
        if prev is None:
            self._head = node
        else:
            prev._next = node
        if nxt is None:
            self._tail = node
        else:
            nxt._prev = node

    def _unlink(self, node: Node) -> None:
        """Take ``node`` out of the list without touching def-use or ownership."""
        if node._prev is None:
            self._head = node._next
        else:
            node._prev._next = node._next
        if node._next is None:
            self._tail = node._prev
        else:
            node._next._prev = node._prev
        node._prev = node._next = None

    # -- mutation ----------------------------------------------------------------------
    def append(self, node: Node) -> Node:
        self._adopt(node)
        self._link(node, self._tail, None)
        return node

    def extend(self, nodes: Iterable[Node]) -> None:
        for n in nodes:
            self.append(n)

    def insert_after(self, anchor: Node, node: Node) -> Node:
        self._check_owned(anchor)
        self._adopt(node)
        self._link(node, anchor, anchor._next)
        return node

    def insert_before(self, anchor: Node, node: Node) -> Node:
        self._check_owned(anchor)
        self._adopt(node)
        self._link(node, anchor._prev, anchor)
        return node

    def remove(self, node: Node, *, safe: bool = True) -> None:
        """Unlink ``node``; with ``safe`` its outputs must be unused and not graph outputs."""
        self._check_owned(node)
        if safe:
            for v in node._outputs:
                if v._uses:
                    raise IRError(f"cannot remove {node!r}: output {v.name!r} is still used "
                                  f"by {v.consumers()[0]!r}")
                if self.is_output(v):
                    raise IRError(f"cannot remove {node!r}: {v.name!r} is a graph output")
        node.detach_inputs()
        self._unlink(node)
        node.graph = None
        self._count -= 1

    def move_to_end(self, node: Node) -> None:
        """Relink ``node`` at the end without touching def-use (used by sorting)."""
        self._check_owned(node)
        self._unlink(node)
        self._link(node, self._tail, None)

    def reorder(self, order: Sequence[Node]) -> None:
        """Relink the nodes in ``order`` (a permutation of the current nodes)."""
        if len(order) != self._count or len({id(n) for n in order}) != self._count:
            raise IRError("reorder needs a permutation of the graph's nodes")
        for n in order:  # checked before relinking anything
            self._check_owned(n)
        prev = None
        for n in order:
            n._prev = prev
            if prev is None:
                self._head = n
            else:
                prev._next = n
            prev = n
        if prev is not None:
            prev._next = None
        self._tail = prev


class Graph(_Body):
    """A graph: inputs, outputs, initializers (dense, sparse, encoded), nodes,
    persistent bindings. ``parent`` is the node owning this graph as an attribute."""

    def __init__(self, name: str = "", *, doc_string: str = ""):
        super().__init__()
        self.name = name
        self.doc_string = doc_string
        self.metadata: dict[str, str] = {}
        self.initializers: dict[str, Value] = {}
        self.encoded_initializers: dict[str, Value] = {}
        self.sparse_initializers: dict[str, bytes] = {}  # name -> serialized SparseTensorProto (opaque)
        self.bindings: list[tuple[Value, Value]] = []
        self.value_info_order: list[str] = []
        self.parent: Node | None = None
        self.extra = b""

    # -- inputs / outputs ----------------------------------------------------------
    def remove_input(self, value: Value) -> None:
        if value._uses:
            raise IRError(f"graph input {value.name!r} is still used")
        if value not in self._input_set:
            raise IRError(f"{value.name!r} is not an input of this graph")
        if any(i is value for i, _ in self.bindings):
            raise IRError(f"graph input {value.name!r} has a persistent binding")
        self.inputs.remove(value)
        self._input_set.discard(value)

    def _replace_output(self, old: Value, new: Value) -> None:
        super()._replace_output(old, new)
        if self.bindings:
            self.bindings = [(i, new if o is old else o) for i, o in self.bindings]

    # -- initializers ----------------------------------------------------------------
    def add_initializer(self, value: Value, tensor: Tensor | EncodedTensor) -> Value:
        """Register ``value`` as an initializer holding ``tensor`` (dense or encoded)."""
        if value._producer is not None:
            raise IRError(f"initializer {value.name!r} cannot have a producer")
        name = value.name
        if self._initializer_name_used(name):
            raise IRError(f"duplicate initializer name {name!r} (rule N2)")
        value.const = tensor
        value.graph = self
        if isinstance(tensor, EncodedTensor):
            tensor.name = name
            self.encoded_initializers[name] = value
        else:
            tensor.name = name
            self.initializers[name] = value
        return value

    def remove_initializer(self, value: Value) -> None:
        if value._uses or self.is_output(value):
            raise IRError(f"initializer {value.name!r} is still used")
        self.initializers.pop(value.name, None)
        self.encoded_initializers.pop(value.name, None)
        if value in self._input_set:
            self.remove_input(value)
        value.const = None

    def all_initializers(self) -> Iterator[Value]:
        yield from self.initializers.values()
        yield from self.encoded_initializers.values()

    def _initializer_name_used(self, name: str) -> bool:
        return (name in self.initializers or name in self.encoded_initializers
                or name in self.sparse_initializers)

    def rename_initializer(self, value: Value, new_name: str) -> None:
        table = self.encoded_initializers if value.is_encoded() else self.initializers
        if table.get(value.name) is not value:
            raise IRError(f"{value.name!r} is not an initializer of this graph")
        if new_name == value.name:
            return
        if self._initializer_name_used(new_name):
            raise IRError(f"initializer name {new_name!r} already used (rule N2)")
        del table[value.name]
        value.name = new_name
        value.const.name = new_name
        table[new_name] = value

    # -- traversal -------------------------------------------------------------------
    def all_graphs(self) -> Iterator["Graph"]:
        """This graph and every subgraph, depth first (as they are when asked: a snapshot)."""
        out: list[Graph] = []
        _collect_graphs(self, out)
        return iter(out)

    def all_nodes(self) -> Iterator[Node]:
        """The nodes of this graph and of every subgraph, graph by graph (a snapshot)."""
        out: list[Node] = []
        for g in self.all_graphs():
            n = g._head
            while n is not None:
                out.append(n)
                n = n._next
        return iter(out)

    def values(self) -> Iterator[Value]:
        """Every value defined in this graph (inputs, initializers, node outputs)."""
        seen: set[int] = set()
        for v in self.inputs:
            seen.add(id(v))
            yield v
        for v in self.all_initializers():
            if id(v) not in seen:
                yield v
        for n in self:
            yield from n._outputs

    def path(self) -> str:
        """Object path used in messages (``graph`` or ``graph.node[...].attribute[...]``)."""
        if self.parent is None:
            return "graph"
        owner = self.parent.graph
        base = owner.path() if owner is not None else "?"
        for a in self.parent.attributes.values():
            gs = a.graphs()
            for k, g in enumerate(gs):
                if g is self:
                    suffix = ".g" if a.type == AttrType.GRAPH else f".graphs[{k}]"
                    return f"{base}.node({self.parent.name!r}).attribute[{a.name!r}]{suffix}"
        return f"{base}.node({self.parent.name!r})"

    def __repr__(self) -> str:
        return f"Graph({self.name!r}, {len(self)} nodes)"


class Function(_Body):
    """A local function (FunctionProto): formal inputs/outputs are Values."""

    _input_kind = "function input"

    def __init__(self, domain: str, name: str, *, overload: str = "", doc_string: str = ""):
        super().__init__()
        self.domain = domain
        self.name = name
        self.overload = overload
        self.doc_string = doc_string
        self.metadata: dict[str, str] = {}
        self.attributes: list[str] = []
        self.attribute_defaults: dict[str, Attr] = {}
        self.opset_imports: dict[str, int] = {}
        self.value_info_order: list[str] = []
        self.extra = b""

    @property
    def id(self) -> tuple[str, str, str]:
        return (self.domain, self.name, self.overload)

    def all_graphs(self) -> Iterator[Graph]:
        """Every subgraph of the body's nodes, depth first (a snapshot)."""
        out: list[Graph] = []
        _collect_subgraphs(self, out)
        return iter(out)

    def path(self) -> str:
        return f"functions[{self.domain + '::' + self.name!r}]"

    def __repr__(self) -> str:
        return f"Function({self.domain}::{self.name}, {len(self)} nodes)"


@dataclass(slots=True)
class Model:
    """A model: graph, opset imports, local functions, struct-type catalogue, metadata."""

    graph: Graph
    opset_imports: dict[str, int] = field(default_factory=lambda: {"": 23})
    ir_version: int = 10
    producer_name: str = "onnxforge"
    producer_version: str = ""
    domain: str = ""
    model_version: int = 0
    doc_string: str = ""
    metadata: dict[str, str] = field(default_factory=dict)
    functions: dict[tuple[str, str, str], Function] = field(default_factory=dict)
    struct_types: list[StructType] = field(default_factory=list)
    model_dir: str | None = None  # folder external data is resolved against
    extra: bytes = b""  # serialized ModelProto fields the IR does not model
    has_fields: set[str] = field(default_factory=set)  # optional scalar fields present on load

    def function(self, domain: str, name: str, overload: str = "") -> Function | None:
        return self.functions.get((domain, name, overload))

    def add_function(self, fn: Function) -> Function:
        if fn.id in self.functions:
            raise IRError(f"duplicate local function {fn.domain}::{fn.name}")
        self.functions[fn.id] = fn
        return fn

    def all_graphs(self) -> Iterator[Graph]:
        yield from self.graph.all_graphs()
        for f in self.functions.values():
            yield from f.all_graphs()

    def verification_view(self) -> ModelView:
        """The read-only view :func:`onnxforge.verify` checks (built without serializing)."""
        from onnxforge.graphbuilder.ir.view import model_view  # view.py imports this module

        return model_view(self)
