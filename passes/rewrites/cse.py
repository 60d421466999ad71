"""Common-subexpression elimination.

Two nodes compute the same values when they have the same operator (domain,
op_type, overload), read the same input values (by identity) and carry equal
attributes. The later one is removed and its outputs' uses read the earlier
node's outputs. A subgraph may reuse a computation of an enclosing graph that
precedes its owner node.

Never merged: nodes with side effects (a MUST_ALIAS write, a bound or aliased
output, a call of such a function), nondeterministic operators (random ones,
Dropout in training mode), nodes owning subgraphs (not compared structurally)
and nodes without outputs.

Before / after::

    a = Add(x, w)                     a = Add(x, w)
    b = Add(x, w)                     m = Max(a, a)
    m = Max(a, b)

Attributes are canonicalized (sorted by name; floats compared by bit pattern,
tensors by dtype, dims and a blake2b digest confirmed by a byte comparison).
Visiting nodes in topological order makes a single walk complete: O(N).
"""
from __future__ import annotations

import hashlib
import struct
from collections import ChainMap
from collections.abc import MutableMapping
from typing import Any

from onnx import TensorProto

from onnxforge.graphbuilder.ir.core import Attr, AttrType, Function, Graph, Model, Node
from onnxforge.graphbuilder.ir.tensors import Tensor
from onnxforge.passes.analyses.effects import Effects, effect_analysis
from onnxforge.passes.framework.invariants import is_nondeterministic
from onnxforge.passes.framework.pass_manager import ALL, Pass, PassResult, register_pass
from onnxforge.passes.rewrites.rename import can_replace, erase_node, replace_value

__all__ = ["CommonSubexpressionEliminationPass", "eliminate_common_subexpressions", "node_key"]


def _float_bits(x: float) -> int:
    return struct.unpack("<Q", struct.pack("<d", float(x)))[0]


def _tensor_key(t: Tensor) -> tuple:
    data = bytes(t.tobytes()) if t.dtype != TensorProto.STRING else repr(t.numpy().tolist()).encode()
    return ("tensor", t.dtype, t.dims, hashlib.blake2b(data, digest_size=16).digest(), len(data))


def _attr_key(a: Attr) -> Any:
    if a.ref_attr_name:
        return ("ref", a.ref_attr_name, a.type)
    t, v = a.type, a.value
    if t == AttrType.FLOAT:
        return (t, _float_bits(v))
    if t == AttrType.FLOATS:
        return (t, tuple(_float_bits(x) for x in v))
    if t in (AttrType.INTS, AttrType.STRINGS):
        return (t, tuple(v))
    if t == AttrType.TENSOR:
        return (t, _tensor_key(v)) if isinstance(v, Tensor) else None
    if t == AttrType.TENSORS:
        if not all(isinstance(x, Tensor) for x in v):
            return None
        return (t, tuple(_tensor_key(x) for x in v))
    if t in (AttrType.SPARSE_TENSOR, AttrType.SPARSE_TENSORS):
        return (t, bytes(a.extra) if a.extra else repr(v))
    if t in (AttrType.TYPE_PROTO, AttrType.TYPE_PROTOS):
        try:
            hash(v)
        except TypeError:
            return (t, repr(v))
        return (t, v)
    try:
        hash(v)
    except TypeError:
        return None
    return (t, v)


def node_key(node: Node) -> tuple | None:
    """Hashable identity of what ``node`` computes, or None if it must not be merged."""
    attrs: list[tuple] = []
    for name in sorted(node.attributes):
        a = node.attributes[name]
        if a.type in (AttrType.GRAPH, AttrType.GRAPHS):
            return None
        k = _attr_key(a)
        if k is None:
            return None
        attrs.append((name, k))
    return (node.domain, node.op_type, node.overload, len(node.outputs),
            tuple(None if v is None else id(v) for v in node.inputs), tuple(attrs))


def _same_tensors(a: Node, b: Node) -> bool:
    """Byte comparison of tensor attributes (the key only holds their digest)."""
    for name, x in a.attributes.items():
        if x.type in (AttrType.TENSOR, AttrType.TENSORS) and not x.ref_attr_name:
            y = b.attributes[name]
            xs = x.value if x.type == AttrType.TENSORS else [x.value]
            ys = y.value if y.type == AttrType.TENSORS else [y.value]
            for p, q in zip(xs, ys):
                if p.dtype == TensorProto.STRING:
                    if p.numpy().tolist() != q.numpy().tolist():
                        return False
                elif bytes(p.tobytes()) != bytes(q.tobytes()):
                    return False
    return True


class _CSE:
    def __init__(self, model: Model, effects: Effects | None = None):
        self.effects = effect_analysis(model) if effects is None else effects
        self.removed = 0

    def run(self, c: Graph | Function, table: MutableMapping[tuple, Node]) -> None:
        """Merge within ``c``; ``table`` maps node keys to the first node computing them in
        ``c`` or an enclosing scope (a plain dict at the top: most graphs have no subgraphs)."""
        for n in c:
            if n.attributes and any(a.type in (AttrType.GRAPH, AttrType.GRAPHS)
                                    for a in n.attributes.values()):
                for sg in n.subgraphs():
                    self.run(sg, ChainMap({}, table))
                continue
            if not n.outputs or is_nondeterministic(n) or self.effects.has_side_effects(n):
                continue
            key = node_key(n)
            if key is None:
                continue
            first = table.get(key)
            if first is None or first.graph is None or not _same_tensors(first, n):
                table[key] = n
                continue
            pairs = list(zip(n.outputs, first.outputs))
            if not all(can_replace(old, new) for old, new in pairs):
                continue
            for old, new in pairs:
                replace_value(old, new)
            erase_node(n)
            self.removed += 1


def eliminate_common_subexpressions(model: Model, *, effects: Effects | None = None) -> int:
    """Merge duplicate computations in every graph, subgraph and function; returns how many.
    ``effects``: the model's current :class:`~onnxforge.passes.analyses.effects.Effects`
    when the caller has it (default: computed here)."""
    cse = _CSE(model, effects)
    cse.run(model.graph, {})
    for fn in model.functions.values():
        cse.run(fn, {})
    return cse.removed


@register_pass
class CommonSubexpressionEliminationPass(Pass):
    """Merge nodes computing the same values (see the module docstring)."""

    name = "cse"
    invalidates = ALL
    preserves = ()
    declares_storage = False
    runs_after = ("topological_sort", "dedup_initializers", "constant_folding",
                  "identity_elimination", "inline")

    def call(self, model: Model) -> PassResult:
        effects = self.analyses.get("effects", model)
        return PassResult(model, eliminate_common_subexpressions(model, effects=effects) > 0)
