"""Unique-name generation shared by the builder, the passes and the export."""
from __future__ import annotations

from collections.abc import Iterable

from onnxforge.graphbuilder.ir.core import Function, Graph, Model

__all__ = ["NameScope", "model_names"]


def model_names(model: Model) -> set[str]:
    """Every value, initializer and node name of the main graph, its subgraphs and the
    local functions (with their subgraphs)."""
    used: set[str] = set()
    bodies: list[Graph | Function] = [*model.graph.all_graphs()]
    for fn in model.functions.values():
        bodies.append(fn)
        bodies.extend(fn.all_graphs())
    for b in bodies:
        used.update(v.name for v in b.inputs)
        if isinstance(b, Graph):
            used.update(b.initializers)
            used.update(b.encoded_initializers)
            used.update(b.sparse_initializers)
        for n in b:
            used.add(n.name)
            used.update(o.name for o in n.outputs)
    used.discard("")
    return used


class NameScope:
    """A set of used names with fresh-name generation: ``fresh("x")`` gives ``x`` if free,
    else ``x{sep}1``, ``x{sep}2``... and reserves it."""

    __slots__ = ("_counters", "used", "sep")

    def __init__(self, used: Iterable[str] | None = None, *, sep: str = "_"):
        self.used: set[str] = set() if used is None else (used if isinstance(used, set) else set(used))
        self._counters: dict[str, int] = {}
        self.sep = sep

    @classmethod
    def from_model(cls, model: Model, *, sep: str = "_") -> "NameScope":
        return cls(model_names(model), sep=sep)

    def __contains__(self, name: str) -> bool:
        return name in self.used

    def fresh(self, base: str) -> str:
        """A name not used yet, derived from ``base``; it is reserved on return."""
        base = base or "v"
        if base not in self.used:
            self.used.add(base)
            return base
        k = self._counters.get(base, 0)
        while True:
            k += 1
            cand = f"{base}{self.sep}{k}"
            if cand not in self.used:
                self._counters[base] = k
                self.used.add(cand)
                return cand

    def claim(self, name: str) -> bool:
        """Reserve ``name``; False if it was already used."""
        if name in self.used:
            return False
        self.used.add(name)
        return True

    def discard(self, name: str) -> None:
        self.used.discard(name)
