"""Inlining of local functions.

A call of a model-local function is replaced by a copy of the function body:
formal inputs read the call's actual inputs, attribute references
(``ref_attr_name``) take the call's attribute (or the function's default; an
attribute that is neither given nor defaulted is left out), every copied value
and node gets a fresh name (``<call>__<name>``), and the call's outputs hand
their names, types, bindings and aliases over to the copied values, so no
consumer, graph output or binding notices. Aliases travel through the call: a
body value with ``alias_of`` a formal input is aliased to the actual input, and
MUST_ALIAS ports of copied nodes are kept.

Before / after (``f(a, b) = Mul(Add(a, b), b)``)::

    graph(x, y) -> z                   graph(x, y) -> z
      z = local.f(x, y)                  call__t = Add(x, y)
                                         z = Mul(call__t, y)

Calls inside copied bodies are expanded in turn (a recursion deeper than
``max_depth`` raises :class:`InlineError`). A function whose opset imports
disagree with those in force where it is called (the model's, or the calling
function's) is left as a call. Inlined functions that are no longer called are
removed unless a struct type's decoder or encoder body might call them.
"""
from __future__ import annotations

from collections.abc import Iterable
from functools import cache, partial

from onnxforge.proto_ext.errors import OnnxforgeError
from onnxforge.graphbuilder.ir.core import (
    Attr,
    AttrType,
    Function,
    Graph,
    Model,
    Node,
    Value,
)
from onnxforge.passes.framework.domains import imported_version, opsets_in_scope
from onnxforge.passes.framework.invariants import called_functions
from onnxforge.passes.framework.pass_manager import (
    ALL,
    Pass,
    PassError,
    PassResult,
    check_int_option,
    register_pass,
)
from onnxforge.passes.framework.records import copy_tensor
from onnxforge.passes.rewrites.rename import NameScope, erase_node, transfer_value

__all__ = ["InlineError", "InlinePass", "inline_functions"]

FunctionId = tuple[str, str, str]


class InlineError(OnnxforgeError, ValueError):
    """A call cannot be inlined (recursive functions, malformed body)."""


class _Inliner:
    def __init__(self, model: Model, selected: set[FunctionId], max_depth: int):
        self.model = model
        self.selected = selected
        self.max_depth = max_depth
        self.names = cache(partial(NameScope.from_model, model))  # built when a name is first needed
        self.inlined = 0

    # -- opsets ---------------------------------------------------------------------------
    @staticmethod
    def _compatible(fn: Function, opsets: dict[str, int]) -> bool:
        for dom, ver in fn.opset_imports.items():
            have = imported_version(opsets, dom)
            if have is not None and have != ver:
                return False
        return True

    # -- cloning --------------------------------------------------------------------------
    def _clone_value(self, v: Value, prefix: str) -> Value:
        nv = Value(self.names().fresh(f"{prefix}__{v.name}" if v.name else ""), v.type,
                   doc_string=v.doc_string)
        nv.metadata.update(v.metadata)
        nv.has_value_info = v.has_value_info
        return nv

    def _attrs(self, node: Node, call: Node, fn: Function, vmap: dict[int, Value | None],
               prefix: str) -> list[Attr]:
        out: list[Attr] = []
        for a in node.attributes.values():
            if a.ref_attr_name:
                actual = call.attributes.get(a.ref_attr_name) or fn.attribute_defaults.get(a.ref_attr_name)
                if actual is None:
                    continue
                out.append(Attr(a.name, actual.type, actual.value, a.doc_string, actual.ref_attr_name,
                                actual.extra))
            elif a.type == AttrType.GRAPH and a.value is not None:
                out.append(Attr(a.name, a.type, self._clone_graph(a.value, call, fn, vmap, prefix),
                                a.doc_string, "", a.extra))
            elif a.type == AttrType.GRAPHS:
                out.append(Attr(a.name, a.type, [self._clone_graph(g, call, fn, vmap, prefix)
                                                  for g in (a.value or [])], a.doc_string, "", a.extra))
            else:
                out.append(Attr(a.name, a.type, a.value, a.doc_string, "", a.extra))
        return out

    def _clone_node(self, node: Node, call: Node, fn: Function, vmap: dict[int, Value | None],
                    prefix: str) -> Node:
        ins: list[Value | None] = []
        for v in node.inputs:
            if v is None:
                ins.append(None)
            elif id(v) in vmap:
                ins.append(vmap[id(v)])
            else:
                raise InlineError(f"{fn.path()}: {node!r} reads {v.name!r}, which the function "
                                  "body does not define")
        outs = [self._clone_value(o, prefix) for o in node.outputs]
        for o, no in zip(node.outputs, outs):
            vmap[id(o)] = no
        attrs = self._attrs(node, call, fn, vmap, prefix)
        clone = Node(node.domain, node.op_type, ins, outs,
                     name=self.names().fresh(f"{prefix}__{node.name or node.op_type}"),
                     attributes=attrs, overload=node.overload, doc_string=node.doc_string,
                     output_alias=list(node.output_alias))
        clone.metadata.update(node.metadata)
        return clone

    def _clone_graph(self, g: Graph, call: Node, fn: Function, vmap: dict[int, Value | None],
                     prefix: str) -> Graph:
        ng = Graph(self.names().fresh(f"{prefix}__{g.name}" if g.name else prefix), doc_string=g.doc_string)
        ng.metadata.update(g.metadata)
        ng.extra = g.extra
        for v in g.inputs:
            nv = self._clone_value(v, prefix)
            nv.access = v.access
            vmap[id(v)] = nv
            ng.add_input(nv)
        for v in g.all_initializers():
            known = vmap.get(id(v))
            nv = known if known is not None else self._clone_value(v, prefix)
            vmap[id(v)] = nv
            ng.add_initializer(nv, copy_tensor(v.const))
        ng.sparse_initializers.update(g.sparse_initializers)
        for n in g:
            ng.append(self._clone_node(n, call, fn, vmap, prefix))
        for o in g.outputs:
            got = vmap.get(id(o), o)
            ng.outputs.append(got if got is not None else o)
        self._map_aliases(g, vmap)
        return ng

    def _map_aliases(self, body: Graph | Function, vmap: dict[int, Value | None]) -> None:
        for n in body:
            for o in n.outputs:
                if isinstance(o.alias_of, Value):
                    vmap_o = vmap.get(id(o))
                    if vmap_o is not None:
                        vmap_o.alias_of = vmap.get(id(o.alias_of), o.alias_of)
        for o in body.outputs:
            if isinstance(o.alias_of, Value):
                vmap_o = vmap.get(id(o))
                target = vmap.get(id(o.alias_of), o.alias_of)
                if vmap_o is not None and vmap_o.alias_of is None and target is not None \
                        and vmap_o.producer() is not None:
                    vmap_o.alias_of = target

    # -- expansion ------------------------------------------------------------------------
    def expand(self, c: Graph | Function, call: Node, depth: int) -> list[Node] | None:
        key = (call.domain, call.op_type, call.overload)
        fn = self.model.functions[key]
        if depth > self.max_depth:
            raise InlineError(f"{c.path()}: inlining {fn.domain}::{fn.name} exceeds depth "
                              f"{self.max_depth}: the local functions call each other recursively")
        opsets = opsets_in_scope(self.model, c)
        if not self._compatible(fn, opsets):
            return None
        for dom, ver in fn.opset_imports.items():  # the body's domains are imported where it lands
            if imported_version(opsets, dom) is None:
                opsets[dom] = ver
        prefix = call.name or fn.name
        vmap: dict[int, Value | None] = {}
        for k, formal in enumerate(fn.inputs):
            vmap[id(formal)] = call.inputs[k] if k < len(call.inputs) else None
        inserted: list[Node] = []
        for n in fn:
            clone = self._clone_node(n, call, fn, vmap, prefix)
            c.insert_before(call, clone)
            inserted.append(clone)
        self._map_aliases(fn, vmap)
        taken: set[int] = set()
        for k, formal in enumerate(fn.outputs):
            if k >= len(call.outputs):
                break
            actual = call.outputs[k]
            if not actual.name and not actual.num_uses() and not c.is_output(actual):
                continue
            if id(formal) not in vmap:
                raise InlineError(f"{fn.path()}: output {formal.name!r} is not defined by the body")
            src = vmap[id(formal)]
            if src is None:
                raise InlineError(f"{c.path()}: {call!r} leaves out input {formal.name!r}, which "
                                  f"the function returns as output {k}")
            p = src.producer()
            if p is None or p.graph is not c or id(src) in taken or c.is_output(src):
                ident = Node("", "Identity", [src], [self._clone_value(formal, prefix)],
                             name=self.names().fresh(f"{prefix}__output{k}"))
                c.insert_before(call, ident)
                inserted.append(ident)
                src = ident.outputs[0]
            taken.add(id(src))
            transfer_value(actual, src)
        erase_node(call)
        self.inlined += 1
        return inserted

    def process(self, c: Graph | Function, nodes: Iterable[Node], depth: int) -> None:
        for n in list(nodes):
            if n.graph is not c:
                continue
            key = (n.domain, n.op_type, n.overload)
            if key in self.selected and key in self.model.functions:
                inserted = self.expand(c, n, depth)
                if inserted is not None:
                    self.process(c, inserted, depth + 1)
                continue
            if n.attributes:
                for sg in n.subgraphs():
                    self.process(sg, list(sg), depth)


def inline_functions(model: Model, functions: Iterable[FunctionId] | None = None, *,
                     remove_inlined: bool = True, max_depth: int = 64) -> int:
    """Inline calls of local functions (all, or the ids in ``functions``); returns how many."""
    selected = set(model.functions) if functions is None else set(functions)
    if not selected:
        return 0
    inl = _Inliner(model, selected, max_depth)
    inl.process(model.graph, list(model.graph), 0)
    for key, fn in list(model.functions.items()):
        if key not in selected:
            inl.process(fn, list(fn), 0)
    if remove_inlined and inl.inlined and not any(
            st.decoder is not None or st.encoder is not None for st in model.struct_types):
        kept_roots: list[Graph | Function] = [model.graph] + [
            f for k, f in model.functions.items() if k not in selected]
        reached = called_functions(model, kept_roots)
        for key in list(model.functions):
            if key in selected and key not in reached:
                del model.functions[key]
    return inl.inlined


def _function_id(f: object) -> FunctionId:
    if isinstance(f, (tuple, list)) and len(f) == 3 and all(isinstance(x, str) for x in f):
        return (f[0], f[1], f[2])
    raise PassError(f"inline: a function is named by its id (domain, name, overload), three "
                    f"strings; got {f!r}")


@register_pass
class InlinePass(Pass):
    """Inline local-function calls (see the module docstring).

    ``functions``: ids ``(domain, name, overload)`` to inline (default: all);
    ``remove_inlined``: drop inlined functions nothing calls any more.
    """

    name = "inline"
    invalidates = ALL
    preserves = ()
    declares_storage = False

    def __init__(self, functions: Iterable[FunctionId] | None = None, *, remove_inlined: bool = True,
                 max_depth: int = 64):
        check_int_option(self.name, "max_depth", max_depth, 0)
        self.functions = None if functions is None else [_function_id(f) for f in functions]
        self.remove_inlined = remove_inlined
        self.max_depth = max_depth

    def call(self, model: Model) -> PassResult:
        n = inline_functions(model, self.functions, remove_inlined=self.remove_inlined,
                             max_depth=self.max_depth)
        return PassResult(model, n > 0)
