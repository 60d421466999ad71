"""Recording per-node shape inference, and replaying it in a later
:class:`~onnxforge.graphbuilder.shapes.context.ShapesContext` of the same model.

A context made with ``memo=True`` records, for each node it infers, what the
operator rule read (:func:`record_key`: operator, attributes, the known types and
contents of the inputs, the outputs' names and declared types) and what it wrote
(the outputs' types, contents and sources). A later context of the same model
given that one as ``prior`` takes a node's recorded result instead of running its
rule when it reads the same (:func:`same_values` compares the contents element by
element); rules read values through the context only, so the result is the one
the rule would give.

Before / after (the ``shapes`` analysis, recomputed after a pass changed a few nodes)::

    ctx1 = ShapesContext(m, memo=True).infer_graph()        # every rule runs
    ... a pass folds one Reshape target into a constant ...
    ctx2 = ShapesContext(m, memo=True, prior=ctx1).infer_graph()
    # the Reshape and what reads it run again; every other node replays ctx1's result

The context asks here for each node it infers (:func:`infer_recorded`) and for each
initializer it seeds (:func:`seed_initializer`) when it records; the records,
their keys and the comparisons are below them.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from onnxforge.graphbuilder.ir.core import AttrType, Node, Value
from onnxforge.graphbuilder.ir.tensors import EncodedTensor, Tensor
from onnxforge.proto_ext.types import Type

if TYPE_CHECKING:
    from onnxforge.graphbuilder.shapes.context import ShapesContext
    from onnxforge.graphbuilder.shapes.symtensor import SymTensor

__all__ = ["Record", "find_record", "infer_recorded", "node_label", "record_key", "replay", "same_values",
           "seed_initializer"]

_GRAPH, _GRAPHS, _FLOATS = AttrType.GRAPH, AttrType.GRAPHS, AttrType.FLOATS
_MISSING = object()


def node_label(domain: str, op_type: str, name: str) -> str:
    """How sources and messages name a node."""
    dom = f"{domain}::" if domain else ""
    return f"node {name!r} ({dom}{op_type})" if name else f"{dom}{op_type} node"


def seed_initializer(ctx: ShapesContext, value: Value, c: Tensor | EncodedTensor) -> Type:
    """``ctx._seed_value`` of an initializer, recorded; taken from ``prior`` when the
    payload record and the declared type are the very same objects."""
    hit = ctx._prior_seeds.get(value) if ctx._prior_seeds is not None else None
    if hit is not None and hit[0] is c and hit[1] is value.type:
        _c, _d, t, content, sources = hit
        ctx._types[value] = t
        ctx._sources[value] = list(sources)
        if content is not None:
            ctx._values[value] = content
    else:
        t = ctx._seed_value(value, c)
    ctx._seeds[value] = (c, value.type, t, ctx._values.get(value), tuple(ctx._sources[value]))
    return t


def infer_recorded(ctx: ShapesContext, node: Node) -> list[Type]:
    """``ctx._infer_node(node)``, recorded for a later context of the same model, or replayed
    from a record of the ``prior`` context when the node reads what it read."""
    if ctx._prior_seen is not None and not ctx._alias_parent:
        s = ctx._prior_seen.get(node)
        if s is not None and unchanged(ctx, node, s):  # the very same inputs: no key to build
            rec = s.record
            replay(ctx, node, rec)
            ctx._records[node] = rec
            ctx._seen[node] = s
            ctx.replayed += 1
            return [t for t, _v, _s in rec.results]
    got = record_key(ctx, node)
    if got is None:
        return ctx._infer_node(node)
    key, contents = got
    rec = find_record(ctx, node, key, contents) if ctx._prior is not None else None
    if rec is not None:
        replay(ctx, node, rec)
        ctx._records[node] = rec
        _note_seen(ctx, node, key, contents, rec)
        ctx.replayed += 1
        return [t for t, _v, _s in rec.results]
    equalities, conflicts = ctx.equalities, ctx.conflicts
    n_eq, n_conf, n_alias = len(equalities), len(conflicts), len(ctx._alias_parent)
    n_unknown, n_symbols = ctx._unknown_count, ctx._counter[0]
    out = ctx._infer_node(node)
    if len(ctx._alias_parent) == n_alias:  # alias classes are never replayed
        types, values, sources = ctx._types, ctx._values, ctx._sources
        ctx._records[node] = Record(
            key, contents, tuple((types.get(o), values.get(o), tuple(sources.get(o, ()))) for o in node._outputs),
            tuple(equalities[n_eq:]) if len(equalities) != n_eq else (),
            tuple(conflicts[n_conf:]) if len(conflicts) != n_conf else (),
            ctx._unknown_count != n_unknown, ctx._counter[0] != n_symbols, node)
        _note_seen(ctx, node, key, contents, ctx._records[node])
    return out


def _note_seen(ctx: ShapesContext, node: Node, key: tuple, contents: tuple, rec: Record) -> None:
    if ctx._seen is not None and not ctx._alias_parent:
        s = seen(node, key, contents, rec)
        if s is not None:
            ctx._seen[node] = s


class Record:
    """What inferring one node read (``key``, ``contents``) and wrote (its outputs' types, contents and
    sources, the equalities and conflicts it added, whether its operator was unknown, whether
    it made fresh symbols) and the name of the node that made it, as it was then."""

    __slots__ = ("key", "contents", "results", "equalities", "conflicts", "unknown", "fresh", "name")

    def __init__(self, key: tuple, contents: tuple, results: tuple, equalities: tuple, conflicts: tuple,
                 unknown: bool, fresh: bool, node: Node):
        self.key, self.contents, self.results, self.equalities = key, contents, results, equalities
        self.conflicts, self.unknown, self.fresh = conflicts, unknown, fresh
        self.name = node.name  # the name its sources label it by


class Seen:
    """What one node read when it was inferred or replayed, by identity: its operator, its
    attribute objects and values (lists copied), its input objects, each input's type and content objects, its outputs and
    their declared types. A later context replays the record when the node reads the very
    same objects (:func:`unchanged`), without building its key."""

    __slots__ = ("op", "attrs", "inputs", "types", "contents", "outputs", "declared", "record")

    def __init__(self, node: Node, types: tuple, contents: tuple, record: Record):
        self.op = (node.domain, node.op_type, node.overload)
        self.attrs = tuple((a, a.type, a.value, tuple(a.value) if type(a.value) is list else None)
                           for a in node.attributes.values())
        self.inputs = tuple(node._inputs)
        self.types, self.contents = types, contents
        self.outputs = tuple(node._outputs)
        self.declared = tuple((o.type, bool(o.name)) for o in node._outputs)
        self.record = record


def seen(node: Node, key: tuple, contents: tuple, record: Record) -> Seen | None:
    """The :class:`Seen` of a node whose ``key`` (from :func:`record_key`) led to ``record``;
    None when an input is an encoded payload (its key entry is no type)."""
    types = key[4]
    for v, t in zip(node._inputs, types):
        if v is not None and v.const is not None and not isinstance(v.const, Tensor):
            return None
    return Seen(node, types, contents, record)


def unchanged(ctx: ShapesContext, node: Node, s: Seen) -> bool:
    """Whether ``node`` reads, in ``ctx``, the very objects it read when ``s`` was taken (so
    its record holds: types and contents are immutable, and an attribute edited in place
    shows as another value object or another list)."""
    if (node.domain, node.op_type, node.overload) != s.op or len(node._inputs) != len(s.inputs):
        return False
    attrs = node.attributes
    if len(attrs) != len(s.attrs):
        return False
    for a, (a0, t0, v0, items) in zip(attrs.values(), s.attrs):
        # an attribute edited in place: another value object, or a list changed
        if a is not a0 or a.type != t0 or a.value is not v0 or (items is not None and tuple(v0) != items):
            return False
    types, values = ctx._types, ctx._values
    for v, v0, t0, c0 in zip(node._inputs, s.inputs, s.types, s.contents):
        if v is not v0:
            return False
        if v is None:
            continue
        t = types.get(v, _MISSING)
        if t is _MISSING:
            t = ctx.type_of(v)
        if t is not t0 or values.get(v) is not c0:
            return False
    outs = node._outputs
    if len(outs) != len(s.outputs):
        return False
    for o, o0, (declared, named) in zip(outs, s.outputs, s.declared):
        if o is not o0 or o.type is not declared or bool(o.name) != named or o in types or o.alias_of is not None:
            return False
    return True


def _signed(x: Any) -> Any:
    """A float with its sign (``-0.0 == 0.0``, but a rule may tell them apart)."""
    return (x, math.copysign(1.0, x)) if type(x) is float else x


def _same_element(x: Any, y: Any) -> bool:
    if type(x) is not type(y) or x != y:
        return False
    return type(x) is not float or math.copysign(1.0, x) == math.copysign(1.0, y)  # -0.0 is not 0.0


def _same_content(a: SymTensor, b: SymTensor) -> bool:
    """Element by element the same tensor (numbers of one Python type and sign, equal
    expressions)."""
    if a.elem_type != b.elem_type or a.data.shape != b.data.shape:
        return False
    return all(_same_element(x, y) for x, y in zip(a.data.flat, b.data.flat))


def same_values(a: tuple, b: tuple) -> bool:
    """The known input contents of two records agree: unknown in both, or the same elements."""
    for x, y in zip(a, b):
        if x is y:
            continue
        if x is None or y is None or not _same_content(x, y):
            return False
    return True


def record_key(ctx: ShapesContext, node: Node) -> tuple[tuple, tuple] | None:
    """Everything an operator rule reads about ``node``, as (key, contents): its operator
    and attributes (its name only labels sources and messages); per input, its known type
    and content (an encoded initializer: its payload, by identity); per output, whether it
    is named and its declared type. ``key`` compares with ``==``,
    ``contents`` with :func:`same_values`. Rules read values through the context only,
    so two nodes with equal records infer the same. None for a node whose inference
    reads more: control flow (bodies), calls of local functions, anything with aliases."""
    if node.output_alias:
        return None
    attrs = []
    for a in node.attributes.values():
        t = a.type
        if t == _GRAPH or t == _GRAPHS or a.ref_attr_name:
            return None
        v = a.value
        if type(v) is list:
            v = tuple(_signed(x) for x in v) if t == _FLOATS else tuple(v)
        elif type(v) is float:
            v = _signed(v)
        attrs.append((a.name, t, v))  # tensors compare by identity
    model = ctx.model
    if model is not None and model.functions and (node.domain, node.op_type, node.overload) in model.functions:
        return None
    types, values, parents, type_of = ctx._types, ctx._values, ctx._alias_parent, ctx.type_of
    ins: list[Any] = []
    contents: list[SymTensor | None] = []
    for v in node._inputs:
        if v is None:
            ins.append(None)
            contents.append(None)
            continue
        if v.alias_of is not None or (parents and v in parents):
            return None
        c = v.const
        if c is not None and not isinstance(c, Tensor):
            ins.append((c, v.type))  # an encoded payload: by identity
            contents.append(None)
        else:  # an initializer is seeded as its rule would: it then reads like a Constant's output
            known: Any = types.get(v, _MISSING)
            ins.append(type_of(v) if known is _MISSING else known)
            contents.append(values.get(v))
    outs = []
    for o in node._outputs:
        if o.alias_of is not None or o in types or (parents and o in parents):
            return None
        outs.append((bool(o.name), o.type))
    return ((node.domain, node.op_type, node.overload, tuple(attrs), tuple(ins), tuple(outs)), tuple(contents))


def find_record(ctx: ShapesContext, node: Node, key: tuple, contents: tuple) -> Record | None:
    """The record of ``ctx``'s prior context that ``node`` (reading ``key`` and ``contents``)
    may replay: its own, if it read the same; else one made by another node (a copy, a node
    rebuilt by a rewrite) that read the same, unless that rule made fresh symbols (they name
    the dimensions of that node alone) or noted equalities or conflicts (they name its
    values)."""
    rec = ctx._prior.get(node)
    if rec is not None and rec.key == key and same_values(rec.contents, contents):
        return rec
    index = ctx._prior_index
    if index is None:
        index = ctx._prior_index = {}
        for r in ctx._prior.values():
            if not (r.fresh or r.equalities or r.conflicts):
                try:
                    index.setdefault(r.key, []).append(r)
                except TypeError:  # an attribute value that cannot be hashed
                    pass
    try:
        candidates = index.get(key, ())
    except TypeError:
        return None
    return next((r for r in candidates if same_values(r.contents, contents)), None)


def replay(ctx: ShapesContext, node: Node, rec: Record) -> None:
    """Write ``rec``'s results to ``node``'s outputs in ``ctx``, as its rule would have."""
    renamed = rec.name != node.name  # the node that made the record had another name
    if renamed:
        old, label = node_label(rec.key[0], rec.key[1], rec.name), node_label(node.domain, node.op_type, node.name)
    types, values, all_sources = ctx._types, ctx._values, ctx._sources
    for o, (t, value, sources) in zip(node._outputs, rec.results):
        types[o] = t
        all_sources[o] = [label if x == old else x for x in sources] if renamed else list(sources)
        if value is not None:
            values[o] = value
    if rec.equalities:
        ctx.equalities.extend(rec.equalities)
    if rec.conflicts:
        ctx.conflicts.extend(rec.conflicts)
    if rec.unknown:
        k = (node.domain, node.op_type)
        ctx.unknown_ops[k] = ctx.unknown_ops.get(k, 0) + 1
        ctx._unknown_count += 1
