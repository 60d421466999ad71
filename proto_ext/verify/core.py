"""Rule registry and driver of static verification (rule IDs from RULES.md)."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from onnxforge.proto_ext.errors import Violation
from onnxforge.proto_ext.catalogue import Catalogue
from onnxforge.proto_ext.sizes import LayoutCache
from onnxforge.proto_ext.view import GraphView, ModelView

__all__ = ["Report", "Check", "register", "run_checks", "iter_graphs", "CHECKS"]


@dataclass(slots=True)
class Report:
    """Collects violations; ``catalogue`` is the resolved struct-type catalogue and
    ``layouts`` the size and layout memo over it that every check shares."""

    view: ModelView
    catalogue: Catalogue
    violations: list[Violation] = field(default_factory=list)
    layouts: LayoutCache = field(init=False)
    shared: dict[str, Any] = field(default_factory=dict)
    """What one check computed from ``view`` and another reuses (the alias resolution)."""

    def __post_init__(self) -> None:
        self.layouts = LayoutCache(self.catalogue)

    def add(self, rule: str, path: str, message: str) -> None:
        self.violations.append(Violation(rule, path, message))


Check = Callable[[ModelView, Report], None]
CHECKS: list[tuple[str, Check]] = []


def register(group: str) -> Callable[[Check], Check]:
    """Decorator: add a check function (covering the rules of ``group``) to the registry."""

    def deco(fn: Check) -> Check:
        CHECKS.append((group, fn))
        return fn

    return deco


def run_checks(view: ModelView) -> list[Violation]:
    report = Report(view, Catalogue(view.struct_types))
    for _group, check in CHECKS:
        check(view, report)
    return report.violations


def iter_graphs(view: ModelView) -> Iterator[GraphView]:
    """The main graph and its subgraphs, then the subgraphs of local functions, depth first."""
    if view.walk is None:
        walk: list[GraphView] = []
        roots = [view.graph] + [sub for f in view.functions for node in f.nodes for _, sub in node.subgraphs]
        pending = list(reversed(roots))
        while pending:
            g = pending.pop()
            walk.append(g)
            pending.extend(sub for node in reversed(g.nodes) for _, sub in reversed(node.subgraphs))
        view.walk = walk
    return iter(view.walk)
