"""Dead-code elimination.

A node is dead when none of its outputs is used (by a node, a subgraph node or
a graph output) and it has no side effects: a node that writes a READ_WRITE
input through a MUST_ALIAS port, produces a bound or aliased output, or calls /
owns code that does, is always kept. Unused dense initializers and (optionally)
unused local functions are removed too; graph inputs are never removed (that
would change the interface) and unused encoded initializers are kept unless
asked for, since they can be addressed by name (``decode_value``).

Before / after::

    graph(x, cache RW, v, p) -> (y, cache_out)      graph(x, cache RW, v, p) -> (y, cache_out)
      d = Neg(x)           # unused                   y = Relu(x)
      y = Relu(x)                                     cache_out = CacheUpdate(cache, v, p)
      u = CacheUpdate(cache, v, p)  # writes cache
      cache_out = Identity(u)  ...                    (the write is kept even if unused)
      w (initializer, unused)

Each node is examined a bounded number of times through a worklist seeded in
reverse order, so the pass is O(N).
"""
from __future__ import annotations

from onnxforge.graphbuilder.ir.core import Function, Graph, Model, Node
from onnxforge.passes.framework.domains import is_default_domain
from onnxforge.passes.analyses.effects import Effects, effect_analysis
from onnxforge.passes.framework.invariants import called_functions, containers
from onnxforge.passes.framework.pass_manager import ALL, Pass, PassResult, register_pass
from onnxforge.passes.rewrites.rename import erase_node

__all__ = ["DeadCodeEliminationPass", "eliminate_dead_code"]

Container = Graph | Function


def _dead(node: Node, outputs: set[int], effects: Effects) -> bool:
    outs = node.outputs
    if not outs and not is_default_domain(node.domain):
        return False  # an output-less custom operator exists for what it does
    for o in outs:
        if o.num_uses() or id(o) in outputs:
            return False
    return not effects.has_side_effects(node)


def _sweep(c: Container, effects: Effects) -> int:
    for n in c:
        if n.attributes:
            for sg in n.subgraphs():
                _sweep(sg, effects)
    outputs = {id(v) for v in c.outputs}
    stack: list[Node] = list(c)
    removed = 0
    while stack:
        n = stack.pop()
        if n.graph is not c or not _dead(n, outputs, effects):
            continue
        read = erase_node(n)
        removed += 1
        for v in read:
            p = v.producer()
            if p is not None and p.graph is c:
                stack.append(p)
    return removed


def _unused_initializers(g: Graph, encoded: bool) -> int:
    keep = {id(v) for v in g.inputs} | {id(v) for v in g.outputs}
    removed = 0
    tables = [g.initializers] + ([g.encoded_initializers] if encoded else [])
    for table in tables:
        for v in [v for v in table.values() if not v.num_uses() and id(v) not in keep]:
            g.remove_initializer(v)
            removed += 1
    return removed


def _unused_functions(model: Model) -> int:
    if not model.functions:
        return 0
    for st in model.struct_types:  # a decoder / encoder body may call local functions
        if st.decoder is not None or st.encoder is not None:
            return 0
    used = called_functions(model, [model.graph])
    dead = [k for k in model.functions if k not in used]
    for k in dead:
        del model.functions[k]
    return len(dead)


def eliminate_dead_code(model: Model, *, remove_encoded_initializers: bool = False,
                        remove_functions: bool = True, effects: Effects | None = None) -> int:
    """Remove dead nodes, unused initializers and unused local functions; returns how many.
    ``effects``: the model's current :class:`~onnxforge.passes.analyses.effects.Effects`
    when the caller has it (default: computed here)."""
    if effects is None:
        effects = effect_analysis(model)
    removed = _sweep(model.graph, effects)
    for fn in model.functions.values():
        removed += _sweep(fn, effects)
    for g in list(containers(model)):
        if isinstance(g, Graph):
            removed += _unused_initializers(g, remove_encoded_initializers)
    if remove_functions:
        removed += _unused_functions(model)
    return removed


@register_pass
class DeadCodeEliminationPass(Pass):
    """Remove unused, side-effect-free nodes, unused initializers and unused local functions.

    ``remove_encoded_initializers`` (default False) also drops unused encoded
    initializers; ``remove_functions`` (default True) drops local functions that
    nothing calls (kept whenever a struct type carries a decoder or encoder body).
    """

    name = "dce"
    invalidates = ALL
    preserves = ()
    declares_storage = False
    runs_after = ("inline", "constant_folding", "identity_elimination", "cse",
                  "dedup_initializers", "rewrite")

    def __init__(self, *, remove_encoded_initializers: bool = False, remove_functions: bool = True):
        self.remove_encoded_initializers = remove_encoded_initializers
        self.remove_functions = remove_functions

    def call(self, model: Model) -> PassResult:
        n = eliminate_dead_code(model, remove_encoded_initializers=self.remove_encoded_initializers,
                                remove_functions=self.remove_functions,
                                effects=self.analyses.get("effects", model))
        return PassResult(model, n > 0)
