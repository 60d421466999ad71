"""Rule registry and driver of static verification (rule IDs from RULES.md)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from onnxforge.errors import Violation
from onnxforge.proto_ext.catalogue import Catalogue
from onnxforge.proto_ext.view import ModelView

__all__ = ["Report", "Check", "register", "run_checks", "CHECKS"]


@dataclass(slots=True)
class Report:
    """Collects violations; ``catalogue`` is the resolved struct-type catalogue."""

    view: ModelView
    catalogue: Catalogue
    violations: list[Violation] = field(default_factory=list)

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
