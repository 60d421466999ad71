"""Shape inference, alias equivalence and effects as typed analyses, and the two
analysis passes.

Registered analyses (read them with ``AnalysisManager.get(name)``, or
``self.analyses.get(name)`` inside a pass):

* ``shapes`` (:class:`ShapesAnalysis`): a
  :class:`~onnxforge.graphbuilder.shapes.ShapesContext` inferred over the main
  graph (control-flow bodies and local-function call sites included), symbolic
  dims kept; it does not write ``Value.type``;
* ``aliases`` (:class:`AliasAnalysis`): :class:`AliasRoots`, every aliased value
  mapped to its storage owner, resolved as the mutable-cache specification
  describes (MUST_ALIAS ports to names, ``alias_of`` checked against the port,
  input and output types merged in the ``shapes`` context; incompatible element
  types, ranks or dimensions and cycles raise :class:`ShapeError`);
* ``effects`` (:class:`EffectsAnalysis`): the model's
  :class:`~onnxforge.passes.effects.Effects` (roots, storage versions, in-place
  writers, state, side effects).

Passes: ``shape_inference`` writes every inferred type to ``Value.type``;
``alias_analysis`` checks the aliases and leaves :class:`AliasRoots` in the
pass manager's cache. Neither changes the graph's structure.

Before / after (``alias_analysis``)::

    upd = CacheUpdate(cache, v, p)        analyses.get("aliases").root(upd) is cache
    out = Identity(upd)                   (cache: FLOAT[1, 2, cap, 8] learned by upd too)
"""
from __future__ import annotations

from collections.abc import Hashable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from onnxforge.graphbuilder.ir import Model, Value
from onnxforge.graphbuilder.shapes import ShapeError, ShapesContext
from onnxforge.passes.analysis import Analysis, AnalysisManager, register_analysis
from onnxforge.passes.effects import Effects, effect_analysis
from onnxforge.passes.invariants import containers
from onnxforge.passes.manager import Pass, PassResult, register_pass

__all__ = [
    "AliasAnalysis",
    "AliasAnalysisPass",
    "AliasRoots",
    "EffectsAnalysis",
    "ShapeInferencePass",
    "ShapesAnalysis",
    "alias_roots",
]


# ----------------------------------------------------------------------------- analyses


@register_analysis
class ShapesAnalysis(Analysis[ShapesContext]):
    """Inferred types of the whole model, kept in a context (the IR is not written)."""

    name = "shapes"

    def compute(self, model: Model, analyses: AnalysisManager) -> ShapesContext:
        # nodes whose inputs and attributes are as when the dropped result inferred them
        # are not inferred again (a result kept in debug mode is checked against a fresh
        # one, so the manager of a debug run keeps nothing dropped)
        prior = analyses.dropped(self, model)
        # Recording what each node read costs about a third of an inference. It pays when a
        # later whole inference replays it: in a model with storage (its passes infer it
        # whole) or when this manager infers the model again. The passes of a model without
        # storage ask on demand (``ShapesContext.infer_for``), so its first inference records
        # nothing.
        effects = analyses.get("effects", model)
        memo = analyses.times_computed(self, model) > 0 or not effects.stateless
        return ShapesContext(model, write_back=False, strict=False, memo=memo,
                             prior=prior if isinstance(prior, ShapesContext) else None,
                             storage=effects).infer_graph()

    def fingerprint(self, result: ShapesContext) -> Hashable:
        return frozenset((id(v), str(t)) for v, t in result.values())


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
        return frozenset((id(v), id(r)) for v, r in result.roots.items())


@register_analysis
class EffectsAnalysis(Analysis[Effects]):
    """The model's :class:`~onnxforge.passes.effects.Effects`."""

    name = "effects"

    def compute(self, model: Model, analyses: AnalysisManager) -> Effects:
        return effect_analysis(model)

    def fingerprint(self, result: Effects) -> Hashable:
        """Whether the model declares storage, and the roots and versions of the aliased
        values (writers and side effects follow them)."""
        return result.stateless, frozenset((id(v), id(r), result.version(v)) for v, r in result.aliased().items())


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


# ----------------------------------------------------------------------------- passes


def _snapshot(model: Model) -> list[object]:
    return [v.type for g in model.all_graphs() for v in g.values()]


@register_pass
class ShapeInferencePass(Pass):
    """Infer every value's type (symbolic shapes) into ``Value.type``.

    Writing types changes no structure: only the ``shapes`` analysis (and what was
    computed from it) is dropped when types change."""

    name = "shape_inference"
    invalidates = ("shapes",)

    def __init__(self, strict: bool = False):
        self.strict = strict

    def call(self, model: Model) -> PassResult:
        before = _snapshot(model)
        ctx = ShapesContext(model, strict=self.strict)
        ctx.infer_graph(model.graph)
        changed = any(a is not b and a != b for a, b in zip(before, _snapshot(model)))
        return PassResult(model, changed)


@register_pass
class AliasAnalysisPass(Pass):
    """Resolve and check aliases; the typed :class:`AliasRoots` stays in the pass
    manager's cache (analysis ``aliases``). The model is not changed."""

    name = "alias_analysis"

    def call(self, model: Model) -> PassResult:
        analyses = self.analyses if self.analyses is not None else AnalysisManager(model)
        analyses.get(AliasAnalysis, model)
        return PassResult(model, False)
