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

from onnxforge.graphbuilder.ir.core import Graph, Model
from onnxforge.graphbuilder.shapes.context import ShapesContext
from onnxforge.graphbuilder.shapes.symtensor import ShapeError
from onnxforge.passes.framework.analysis_manager import Analysis, AnalysisManager, register_analysis
from onnxforge.passes.framework.invariants import containers
from onnxforge.passes.framework.pass_manager import ALL, Pass, PassResult, register_pass

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
        """The type it gives each value of the model (inputs, initializers and node outputs
        of every graph and function body; as text, symbolic dims by their expression). A
        value it has not met yet gets its declared type, as when a pass asks; asked of a
        copy, so that the result stays as it was."""
        ask = result.scratch()
        out: list[tuple[int, str]] = []
        for c in containers(result.model):
            values = [*c.inputs, *(c.all_initializers() if isinstance(c, Graph) else ()),
                      *(o for n in c for o in n.outputs)]
            for v in values:
                try:
                    out.append((id(v), str(ask.type_of(v))))
                except ShapeError as exc:  # a declared type its initializer contradicts
                    out.append((id(v), f"ShapeError: {exc}"))
        return frozenset(out)


def _snapshot(model: Model) -> list[object]:
    return [v.type for g in model.all_graphs() for v in g.values()]


@register_pass
class ShapeInferencePass(Pass):
    """Infer every value's type (symbolic shapes) into ``Value.type``.

    Writing types changes no structure: when types change, the ``shapes`` analysis and
    the memory plan are dropped; alias roots, effects and liveness, which read no
    type, stay valid."""

    name = "shape_inference"
    invalidates = ALL
    preserves = ("aliases", "effects", "liveness")

    def __init__(self, strict: bool = False):
        self.strict = strict

    def call(self, model: Model) -> PassResult:
        before = _snapshot(model)
        ctx = ShapesContext(model, strict=self.strict)
        ctx.infer_graph(model.graph)
        changed = any(a is not b and a != b for a, b in zip(before, _snapshot(model)))
        return PassResult(model, changed)
