"""Storage and side effects of a model, as one typed analysis result.

:func:`effect_analysis` returns :class:`Effects`, the
:class:`~onnxforge.graphbuilder.ir.storage.Storage` of the model (alias roots,
storage versions, in-place writers and side effects, all read from the one
alias resolution of ``proto_ext.aliasing`` that rules L1-L13 use) plus the
questions only passes ask:

* ``is_state(v)``: ``v`` lives in storage that outlives a run (a READ_WRITE or
  persistently bound input, a bound output, or a value aliasing one);
* ``is_pure(n)``: deterministic and free of side effects (may be merged,
  folded or dropped).

Example::

    fx = effect_analysis(model)
    u = CacheUpdate(cache, v, p)        fx.root(u) is cache, fx.version(u) == 1
                                        fx.writer(cache) is the CacheUpdate node

Inside a pass, the registered analysis ``effects`` (:class:`EffectsAnalysis`) gives the
same result, cached by the pass manager: ``self.analyses.get("effects", model)``.
"""
from __future__ import annotations

from collections.abc import Hashable

from onnxforge.graphbuilder.ir.core import READ_WRITE, Graph, Model, Node, Value
from onnxforge.graphbuilder.ir.storage import Storage
from onnxforge.passes.framework.analysis_manager import Analysis, AnalysisManager, register_analysis
from onnxforge.passes.framework.invariants import containers, is_nondeterministic

__all__ = ["Effects", "EffectsAnalysis", "effect_analysis"]


class Effects(Storage):
    """Alias roots, storage versions, in-place writers and side effects of one model."""

    def __init__(self, model: Model):
        super().__init__(model)
        g = model.graph
        self._bound: set[Value] = {o for _i, o in g.bindings} | {i for i, _o in g.bindings}

    def is_written(self, v: Value) -> bool:
        return self.writer(v) is not None

    def aliased(self) -> dict[Value, Value]:
        """Every value that aliases another, mapped to its root."""
        out: dict[Value, Value] = {}
        for c in containers(self.model):
            values = list(c.inputs) + [o for n in c for o in n.outputs]
            if isinstance(c, Graph):
                values += list(c.all_initializers())
            for v in values:
                r = self.root(v)
                if r is not v:
                    out[v] = r
        return out

    def is_state(self, v: Value) -> bool:
        """``v`` lives in storage that outlives a run: its root is a READ_WRITE input or a
        persistently bound input, or ``v`` is a bound output."""
        r = self.root(v)
        return r.access == READ_WRITE or r in self._bound or v in self._bound

    def is_pure(self, n: Node) -> bool:
        """Deterministic and free of side effects: may be merged, folded or dropped."""
        return not is_nondeterministic(n) and not self.has_side_effects(n)


def effect_analysis(model: Model) -> Effects:
    """Compute :class:`Effects` for ``model`` (O(N))."""
    return Effects(model)


@register_analysis
class EffectsAnalysis(Analysis[Effects]):
    """The model's :class:`Effects`, as the registered analysis ``effects``."""

    name = "effects"

    def compute(self, model: Model, analyses: AnalysisManager) -> Effects:
        return effect_analysis(model)

    def fingerprint(self, result: Effects) -> Hashable:
        """What passes ask it, over the model as it is: whether the model declares storage,
        the in-place writers recorded, each aliased value's root and version, the values
        in state and the nodes with side effects (objects by identity)."""
        stateless, writers = result.stateless, frozenset(
            (id(v), id(n)) for v, n in result.writers().items())  # before a question rebuilds it
        aliased = frozenset((id(v), id(r), result.version(v)) for v, r in result.aliased().items())
        state: set[int] = set()
        effects: set[int] = set()
        for c in containers(result.model):
            values = list(c.inputs) + ([*c.all_initializers()] if isinstance(c, Graph) else [])
            for n in c:
                values.extend(n.outputs)
                if result.has_side_effects(n):
                    effects.add(id(n))
            state.update(id(v) for v in values if result.is_state(v))
        return stateless, writers, aliased, frozenset(state), frozenset(effects)
