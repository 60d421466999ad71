"""The ``shapes`` analysis and the ``shape_inference`` pass.

``shapes`` (:class:`ShapesAnalysis`) is a
:class:`~onnxforge.graphbuilder.shapes.context.ShapesContext` inferred over the main
graph (control-flow bodies and local-function call sites included), symbolic dims
kept; it does not write ``Value.type``. A result the manager dropped serves the next
one: nodes that read what they read then replay its records
(:mod:`onnxforge.graphbuilder.shapes.replay`).

``shape_inference`` (:class:`ShapeInferencePass`) writes every inferred type to
``Value.type``; it changes no structure.

Before / after (``shape_inference``)::

    x: FLOAT[batch, 8]                  x: FLOAT[batch, 8]
    y = Transpose(x)   # y: unknown     y = Transpose(x)   # y: FLOAT[8, batch]
"""
from __future__ import annotations

from collections.abc import Hashable

from onnxforge.graphbuilder.ir.core import Model
from onnxforge.graphbuilder.shapes.context import ShapesContext
from onnxforge.passes.framework.analysis_manager import Analysis, AnalysisManager, register_analysis
from onnxforge.passes.framework.pass_manager import Pass, PassResult, register_pass

__all__ = ["ShapeInferencePass", "ShapesAnalysis"]


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
