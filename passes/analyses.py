"""Analyses as passes: whole-model shape inference and alias equivalence.

``shape_inference`` runs :class:`~onnxforge.graphbuilder.shapes.ShapesContext`
over the main graph (control-flow bodies and local-function call sites
included) and writes every inferred type to ``Value.type``; symbolic dims stay
symbolic (``past + seq``).

``alias_analysis`` resolves every alias of the model as the mutable-cache
specification describes: MUST_ALIAS ports to names, ``alias_of`` checked
against the port, input and output types merged (incompatible element types,
ranks or dimensions and cycles raise :class:`ShapeError`), and each value's
alias root recorded in ``value.meta["alias_root"]`` for memory planning.
Neither analysis changes the graph's structure.

Before / after (``alias_analysis``)::

    upd = CacheUpdate(cache, v, p)        upd.meta["alias_root"] is cache
    out = Identity(upd)                   (cache: FLOAT[1, 2, cap, 8] learned by upd too)
"""
from __future__ import annotations

from collections.abc import Iterator

from onnxforge.graphbuilder.ir import Model, Value
from onnxforge.graphbuilder.shapes import ShapesContext
from onnxforge.passes.invariants import containers
from onnxforge.passes.manager import Pass, PassResult, register_pass

__all__ = ["ShapeInferencePass", "AliasAnalysisPass", "alias_roots"]


def _snapshot(model: Model) -> list[object]:
    return [v.type for g in model.all_graphs() for v in g.values()]


@register_pass
class ShapeInferencePass(Pass):
    """Infer every value's type (symbolic shapes) into ``Value.type``."""

    name = "shape_inference"

    def __init__(self, strict: bool = False):
        self.strict = strict

    def call(self, model: Model) -> PassResult:
        before = _snapshot(model)
        ctx = ShapesContext(model, strict=self.strict)
        ctx.infer_graph(model.graph)
        changed = any(a is not b and a != b for a, b in zip(before, _snapshot(model)))
        return PassResult(model, changed)


def _aliasable_values(model: Model) -> Iterator[Value]:
    """Inputs and node outputs of every graph, subgraph and function body (initializers
    never alias)."""
    for c in containers(model):
        yield from c.inputs
        for n in c:
            yield from n.outputs


def alias_roots(model: Model, ctx: ShapesContext | None = None) -> dict[Value, Value]:
    """Every aliased value mapped to its root (the storage owner); merges their types."""
    ctx = ctx or ShapesContext(model, strict=False)
    ctx.infer_graph(model.graph)
    out: dict[Value, Value] = {}
    for v in _aliasable_values(model):
        root = ctx.alias_root(v)
        if root is not v:
            ctx.add_alias(v, root, f"alias of {v.name!r}")
            out[v] = root
    return out


@register_pass
class AliasAnalysisPass(Pass):
    """Resolve aliases, merge aliased types, record ``value.meta["alias_root"]``."""

    name = "alias_analysis"

    def call(self, model: Model) -> PassResult:
        roots = alias_roots(model)
        for v in _aliasable_values(model):
            v.meta.pop("alias_root", None)
        for v, root in roots.items():
            v.meta["alias_root"] = root
        return PassResult(model, False)
