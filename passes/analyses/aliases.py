"""The ``aliases`` analysis and the ``alias_analysis`` pass.

``aliases`` (:class:`AliasAnalysis`) is :class:`AliasRoots`: every aliased value
mapped to its storage owner, resolved as the mutable-cache specification describes
(MUST_ALIAS ports to names, ``alias_of`` checked against the port, input and output
types merged in the ``shapes`` context; incompatible element types, ranks or
dimensions and cycles raise :class:`~onnxforge.graphbuilder.shapes.symtensor.ShapeError`).

``alias_analysis`` (:class:`AliasAnalysisPass`) checks the aliases and leaves
:class:`AliasRoots` in the pass manager's cache; it does not change the model.

Before / after (``alias_analysis``)::

    upd = CacheUpdate(cache, v, p)        analyses.get("aliases").root(upd) is cache
    out = Identity(upd)                   (cache: FLOAT[1, 2, cap, 8] learned by upd too)
"""
from __future__ import annotations

from collections.abc import Hashable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from onnxforge.graphbuilder.ir.core import Model, Value
from onnxforge.graphbuilder.shapes.context import ShapesContext
from onnxforge.graphbuilder.shapes.symtensor import ShapeError
from onnxforge.passes.analyses.shapes import ShapesAnalysis
from onnxforge.passes.framework.analysis_manager import Analysis, AnalysisManager, register_analysis
from onnxforge.passes.framework.invariants import containers
from onnxforge.passes.framework.pass_manager import ALL, Pass, PassResult, register_pass

__all__ = ["AliasAnalysis", "AliasAnalysisPass", "AliasRoots", "alias_roots"]


@dataclass(frozen=True, slots=True, eq=False)
class AliasRoots:
    """Every aliased value of a model mapped to its root (the storage owner)."""

    roots: Mapping[Value, Value]

    def root(self, v: Value) -> Value:
        """The storage owner of ``v`` (``v`` itself when it aliases nothing)."""
        return self.roots.get(v, v)

    def is_aliased(self, v: Value) -> bool:
        return v in self.roots

    def members(self, root: Value) -> tuple[Value, ...]:
        """The values whose root is ``root`` (``root`` excluded)."""
        return tuple(v for v, r in self.roots.items() if r is root)


@register_analysis
class AliasAnalysis(Analysis[AliasRoots]):
    """Alias roots, checked and type-merged in the ``shapes`` context."""

    name = "aliases"

    def compute(self, model: Model, analyses: AnalysisManager) -> AliasRoots:
        ctx: ShapesContext = analyses.get(ShapesAnalysis, model)
        return AliasRoots(MappingProxyType(_resolve(model, ctx)))

    def fingerprint(self, result: AliasRoots) -> Hashable:
        """Every aliased value and its root."""
        return frozenset((id(v), id(r)) for v, r in result.roots.items())


def _aliasable_values(model: Model) -> Iterator[Value]:
    """Inputs and node outputs of every graph, subgraph and function body (initializers
    never alias)."""
    for c in containers(model):
        yield from c.inputs
        for n in c:
            yield from n.outputs


def _resolve(model: Model, ctx: ShapesContext) -> dict[Value, Value]:
    out: dict[Value, Value] = {}
    for v in _aliasable_values(model):
        root = ctx.alias_root(v)
        if root is v and v.aliased_input() is not None:
            raise ShapeError(f"value {v.name!r} aliases {v.aliased_input().name!r} but its alias chain "
                             f"ends nowhere (a cycle, or branches that disagree: rules L5, L10)")
        if root is not v:
            ctx.add_alias(v, root, f"alias of {v.name!r}")
            out[v] = root
    return out


def alias_roots(model: Model, ctx: ShapesContext | None = None) -> dict[Value, Value]:
    """Every aliased value mapped to its root; merges their types (into the IR too when
    ``ctx`` writes back, as the default context does)."""
    ctx = ctx or ShapesContext(model, strict=False)
    ctx.infer_graph(model.graph)
    return _resolve(model, ctx)


@register_pass
class AliasAnalysisPass(Pass):
    """Resolve and check aliases; the typed :class:`AliasRoots` stays in the pass
    manager's cache (analysis ``aliases``). The model is not changed."""

    name = "alias_analysis"
    # it never changes the model
    invalidates = ()
    preserves = ALL

    def call(self, model: Model) -> PassResult:
        analyses = self.analyses if self.analyses is not None else AnalysisManager(model)
        analyses.get(AliasAnalysis, model)
        return PassResult(model, False)
