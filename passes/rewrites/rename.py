"""Renaming values, and the value surgery other passes share.

Values are referenced by object, not by name, so a rename is a change of one
field: consumers, persistent bindings, ``alias_of`` references and value infos
follow by construction. What this module adds is the bookkeeping around it:
names stay unique in the model (rule N3), initializer tables are re-keyed, a
pending ``alias_of`` held as text is updated, and renaming a main-graph input
or output (a visible change of the model's interface) needs an explicit
``io`` mapping.

Before / after ``RenamePass(values={"t": "hidden"}, io={"y": "logits"})``::

    graph(x) -> y                     graph(x) -> logits
      t = Relu(x)                       hidden = Relu(x)
      y = Neg(t)                        logits = Neg(hidden)
      bind x <- y (if bound)            bind x <- logits

:func:`replace_value` and :func:`transfer_value` merge one value into another
(used by CSE, identity elimination, rewrites and inlining): uses move, and a
value that is a graph output hands its name, type, alias and binding to its
replacement instead of being silently dropped.
"""
from __future__ import annotations

from collections.abc import Mapping

from onnxforge.proto_ext.errors import OnnxforgeError
from onnxforge.graphbuilder.ir.core import MUST_ALIAS, READ_WRITE, Function, Graph, Model, Node, Value
from onnxforge.graphbuilder.ir.names import NameScope
from onnxforge.passes.framework.domains import is_default_domain
from onnxforge.passes.framework.invariants import owner_in
from onnxforge.passes.framework.pass_manager import ALL, Pass, PassResult, register_pass

__all__ = [
    "NameScope",
    "RenameError",
    "RenamePass",
    "can_replace",
    "erase_node",
    "keeps_in_place_semantics",
    "rename_value",
    "replace_value",
    "transfer_value",
]

Container = Graph | Function


class RenameError(OnnxforgeError, ValueError):
    """A rename that would break name uniqueness, shadow a name or change the interface silently."""


def _container_of(v: Value) -> Container | None:
    p = v.producer()
    if p is not None:
        return p.graph
    return v.graph


def _rename(value: Value, new_name: str, scope: NameScope | None) -> None:
    """Rename one value (uniqueness, initializer tables); names in order lists are left."""
    old = value.name
    if not new_name:
        raise RenameError(f"cannot give value {old!r} an empty name")
    if scope is not None:
        if new_name in scope.used:
            raise RenameError(f"cannot rename {old!r} to {new_name!r}: the name is already used "
                              "in the model (rule N3: one definition per name)")
        scope.used.add(new_name)
        scope.used.discard(old)
    g = value.graph
    if isinstance(g, Graph) and value.is_initializer() and (
            g.initializers.get(old) is value or g.encoded_initializers.get(old) is value):
        g.rename_initializer(value, new_name)
    else:
        value.name = new_name


def _follow_names(c: Container, renamed: Mapping[str, Value]) -> None:
    """Update what refers to values by name in ``c``: the value-info order and the
    ``alias_of`` references still held as text."""
    order = c.value_info_order
    for k, name in enumerate(order):
        v = renamed.get(name)
        if v is not None:
            order[k] = v.name
    for o in c.outputs:
        if isinstance(o.alias_of, str) and o.alias_of in renamed:
            o.alias_of = renamed[o.alias_of]


def rename_value(value: Value, new_name: str, scope: NameScope | None = None) -> None:
    """Give ``value`` the name ``new_name`` (unique in ``scope`` when given).

    Initializer tables are re-keyed; the value-info order and ``alias_of``
    references held as text are updated; references held as Values (consumers,
    bindings, aliases) follow by construction. Renaming many values is O(N) with
    :class:`RenamePass`, which updates the name lists once.
    """
    old = value.name
    if new_name == old:
        return
    _rename(value, new_name, scope)
    c = _container_of(value)
    if c is not None:
        _follow_names(c, {old: value})


def _is_output(c: Container | None, v: Value) -> bool:
    return c is not None and c.is_output(v)


def _can_take_over(c: Container | None, old: Value, new: Value) -> bool:
    """``new`` can take the place of ``old``, an output of ``c``: a node output of ``c``
    that is not an output itself, and that stands for the storage ``old`` aliases."""
    p = new.producer()
    return (p is not None and p.graph is c and not _is_output(c, new)
            and (old.alias_of is None or old.alias_of is new.aliased_input()))


def _in_place_writers(v: Value, c: Container | None) -> list[Node]:
    """The nodes of ``c`` that write ``v``'s storage in place: a MUST_ALIAS port takes
    ``v``, directly or in a subgraph (a local-function call that writes carries the
    port too, rule L11)."""
    out: list[Node] = []
    for user, i in v.uses():
        if any(a.kind == MUST_ALIAS and a.input_index == i for a in user.output_alias):
            owner = owner_in(user, c) if c is not None else None
            if owner is not None and owner not in out:
                out.append(owner)
    return out


def _may_be_written(v: Value) -> bool:
    """A cheap filter: only READ_WRITE inputs, inputs of subgraphs and functions, and
    outputs of nodes that alias, call or own code can be written in place (rule L7);
    initializers and plain node outputs never are."""
    if v.const is not None:
        return False
    p = v.producer()
    if p is None:
        return v.access == READ_WRITE or not isinstance(v.graph, Graph) or v.graph.parent is not None
    return bool(p.output_alias) or bool(p.attributes) or not is_default_domain(p.domain)


def _reaches(start: Node, targets: set[int], c: Container | None) -> bool:
    """Whether a node of ``targets`` (ids) depends on ``start``'s outputs within ``c``."""
    seen = {id(start)}
    work = [start]
    while work:
        n = work.pop()
        for o in n.outputs:
            for user, _i in o.uses():
                owner = owner_in(user, c) if c is not None else None
                if owner is None or id(owner) in seen:
                    continue
                if id(owner) in targets:
                    return True
                seen.add(id(owner))
                work.append(owner)
    return False


def keeps_in_place_semantics(old: Value, new: Value) -> bool:
    """Whether every reader of ``old`` may read ``new`` instead under rule L13.

    When ``new`` is a version that a node W writes in place, ``old``'s readers
    become readers of that version: each must be schedulable before W (none may
    depend on W's results), and ``old`` must not be an output (the written version
    would become one). The node order stays an in-place schedule: no reader of ``old``
    may be listed after W either. ``y = Identity(cache)`` read after
    ``CacheUpdate(cache, ...)`` therefore keeps its Identity (a backend materializes it
    before the write)."""
    if not _may_be_written(new):
        return True
    c = _container_of(new)
    writers = _in_place_writers(new, c)
    if not writers:
        return True
    if _is_output(_container_of(old), old):
        return False
    readers = {id(owner) for user, _i in old.uses()
               if (owner := owner_in(user, c) if c is not None else None) is not None}
    return not any(_reaches(w, readers, c) or _listed_after(w, readers) for w in writers)


def _listed_after(w: Node, readers: set[int]) -> bool:
    """Whether a node of ``readers`` (ids) comes after ``w`` in its graph's node order (the
    order stays a valid in-place schedule only if every reader precedes its writer)."""
    n = w._next
    while n is not None:
        if id(n) in readers:
            return True
        n = n._next
    return False


def can_replace(old: Value, new: Value) -> bool:
    """True if :func:`replace_value` can merge ``old`` into ``new`` without losing anything
    and without breaking rule L13."""
    if old is new or not keeps_in_place_semantics(old, new):
        return False
    c = _container_of(old)
    return not _is_output(c, old) or _can_take_over(c, old, new)


def transfer_value(old: Value, new: Value) -> None:
    """``new`` takes ``old``'s place: name, declared type and value info, graph-output
    positions, bindings, and every use. ``old`` is left unused and unnamed.

    ``new`` must be a node output of the same container that is not a graph output
    itself (see :func:`can_replace`). Outputs of consumers that alias ``old`` alias
    ``new`` afterwards (the IR's ``replace_all_uses_with`` moves them).
    """
    name = old.name
    old.name = ""
    if old.type is not None:
        new.type = old.type
    new.has_value_info = new.has_value_info or old.has_value_info
    if old.doc_string and not new.doc_string:
        new.doc_string = old.doc_string
    for k, v in old.metadata.items():
        new.metadata.setdefault(k, v)
    old.replace_all_uses_with(new, outputs=True)
    new.name = name
    if old.alias_of is not None:
        new.alias_of = old.alias_of
    elif new.alias_of is None and _is_output(_container_of(new), new):
        src = new.aliased_input()
        if src is not None:
            new.alias_of = src  # rule L4: an output from a MUST_ALIAS port names its source


def replace_value(old: Value, new: Value) -> bool:
    """Merge ``old`` into ``new``: every use of ``old`` reads ``new`` afterwards.

    If ``old`` is a graph (or function) output, ``new`` takes over its name, type,
    alias and bindings (:func:`transfer_value`). Returns False, changing nothing,
    when that is impossible (``new`` is an input, an initializer, an outer value or
    already an output) or would break rule L13 (:func:`keeps_in_place_semantics`):
    the caller then keeps ``old``.
    """
    if old is new or not keeps_in_place_semantics(old, new):
        return False
    c = _container_of(old)
    if _is_output(c, old):
        if not _can_take_over(c, old, new):
            return False
        transfer_value(old, new)
        return True
    old.replace_all_uses_with(new, outputs=False)
    return True


def erase_node(node: Node) -> list[Value]:
    """Unlink ``node`` from its graph, releasing every use it holds, including the uses
    of outer values by nodes of its subgraphs. Returns the values it read (for worklists).
    """
    read: list[Value] = [v for v in node.inputs if v is not None]
    if node.attributes:
        for sg in node.subgraphs():
            for inner in sg.all_nodes():
                read.extend(v for v in inner.inputs if v is not None)
                inner.detach_inputs()
    g = node.graph
    if g is None:
        node.detach_inputs()
    else:
        g.remove(node, safe=False)
    return read


@register_pass
class RenamePass(Pass):
    """Rename values by name.

    ``values`` renames internal values (node outputs, initializers, subgraph
    values); ``io`` renames main-graph inputs and outputs, which changes the
    model's interface and therefore has to be asked for separately. A name of a
    main-graph input or output in ``values`` raises :class:`RenameError`, as does
    a name that is missing or a target that is already used.

    Before / after ``RenamePass(values={"t": "h"})``: ``t = Relu(x); y = Neg(t)``
    becomes ``h = Relu(x); y = Neg(h)``; bindings, aliases and value infos that
    referenced ``t`` reference ``h``.
    """

    name = "rename"
    # results keyed by Value objects survive a rename; effects and shapes look values up by name
    invalidates = ALL
    preserves = ("aliases", "liveness", "memory_plan")

    def __init__(self, values: Mapping[str, str] | None = None, io: Mapping[str, str] | None = None):
        self.values = dict(values or {})
        self.io = dict(io or {})
        for label, mapping in (("values", self.values), ("io", self.io)):
            for old, new in mapping.items():
                if not (isinstance(old, str) and isinstance(new, str) and old and new):
                    raise RenameError(f"`{label}` maps value names to new names, both non-empty "
                                      f"strings; got {old!r}: {new!r}")

    def call(self, model: Model) -> PassResult:
        if not self.values and not self.io:
            return PassResult(model, False)
        g = model.graph
        boundary: dict[str, Value] = {v.name: v for v in g.inputs}
        boundary.update({v.name: v for v in g.outputs})
        for name in self.values:
            if name in boundary:
                raise RenameError(f"{name!r} is a main-graph input or output: renaming it changes "
                                  "the model's interface; give it in the `io` mapping")
        for name in self.io:
            if name not in boundary:
                raise RenameError(f"`io` renames {name!r}, which is not a main-graph input or output")
        found: dict[str, Value] = {}
        wanted = set(self.values)
        if wanted:
            for c in g.all_graphs():
                for v in c.all_initializers():
                    if v.name in wanted:
                        found[v.name] = v
                for v in c.inputs:
                    if c is not g and v.name in wanted:
                        found[v.name] = v
                for n in c:
                    for o in n.outputs:
                        if o.name in wanted:
                            found[o.name] = o
        missing = wanted - set(found)
        if missing:
            raise RenameError(f"no value named {min(missing)!r} in the main graph or its subgraphs")
        targets = list(self.values.values()) + list(self.io.values())
        if len(set(targets)) != len(targets):
            raise RenameError("two values would be renamed to the same name")
        scope = NameScope.from_model(model)
        plan = [(found[k], v) for k, v in self.values.items()] + [
            (boundary[k], v) for k, v in self.io.items()]
        for value, _ in plan:  # free the old names first so that swaps work
            scope.used.discard(value.name)
        for value, new in plan:
            if new in scope.used:
                raise RenameError(f"cannot rename {value.name!r} to {new!r}: the name is already used "
                                  "(rule N3)")
        renamed: dict[str, Value] = {}
        for value, new in plan:
            if value.name != new:
                renamed[value.name] = value
                _rename(value, new, scope)
        if renamed:
            for c in g.all_graphs():
                _follow_names(c, renamed)
        return PassResult(model, bool(renamed))
