"""Identity elimination.

``y = Identity(x)`` is removed and every use of ``y`` reads ``x``. When ``y`` is a
graph (or function) output, ``x`` takes over its name, declared type, alias and
persistent binding, so the interface is unchanged; when that is impossible (``x``
is a graph input, an initializer, an outer-scope value or itself an output) the
Identity stays.

Before / after::

    graph(x) -> y                     graph(x) -> y
      a = Relu(x)                       y = Relu(x)
      b = Identity(a)
      y = Identity(b)

    graph(cache RW, v, p) -> present, bind cache <- present
      u = CacheUpdate(cache, v, p)      present = CacheUpdate(cache, v, p)
      present = Identity(u)             (present.alias_of = cache; binding kept)

An Identity whose input is a version written in place later (``y = Identity(cache)``
read after ``CacheUpdate(cache, ...)``) stays: forwarding it would make a reader of
``cache`` depend on the write (rule L13); a backend materializes ``y`` before the
write instead.

One walk over the nodes of each graph, subgraph and function body: O(N).
"""
from __future__ import annotations

from collections.abc import Callable

from onnxforge.graphbuilder.ir.core import Function, Graph, Model
from onnxforge.graphbuilder.ir.storage import Storage
from onnxforge.passes.framework.domains import is_default_domain
from onnxforge.passes.framework.invariants import containers
from onnxforge.passes.framework.pass_manager import ALL, Pass, PassResult, register_pass
from onnxforge.passes.rewrites.rename import erase_node, replace_value

__all__ = ["IdentityEliminationPass", "eliminate_identities"]

def _eliminate(c: Graph | Function, storage: Callable[[], Storage]) -> int:
    removed = 0
    for n in c:
        if n.op_type != "Identity" or not is_default_domain(n.domain) or len(n.outputs) != 1:
            continue
        ins = n.inputs
        if len(ins) != 1 or ins[0] is None or n.output_alias:
            continue
        y, x = n.outputs[0], ins[0]
        if y.alias_of is not None and y.alias_of is not x and y.alias_of is not storage().root(x):
            continue
        if replace_value(y, x):
            erase_node(n)
            removed += 1
    return removed


def eliminate_identities(model: Model) -> int:
    """Remove every Identity node that can go; returns how many were removed."""
    made: list[Storage] = []

    def storage() -> Storage:  # built once, only for an Identity that declares alias_of
        if not made:
            made.append(Storage(model))
        return made[0]

    return sum(_eliminate(c, storage) for c in list(containers(model)))


@register_pass
class IdentityEliminationPass(Pass):
    """Remove ``Identity`` nodes, forwarding their input (see the module docstring)."""

    name = "identity_elimination"
    invalidates = ALL
    preserves = ()
    declares_storage = False
    runs_after = ("inline",)

    def call(self, model: Model) -> PassResult:
        return PassResult(model, eliminate_identities(model) > 0)
