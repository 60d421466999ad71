"""Static verification of extended ONNX models (rules of RULES.md).

``verify(model)`` raises :class:`onnxforge.VerificationError` listing every
violation (rule ID + object path); ``check(model)`` returns the list instead.
When every other rule holds, the standard part of the model (a payload-free
skeleton, :mod:`onnxforge.proto_ext.standard`) must pass ``onnx.checker`` with
full checks (rule X1); ``standard=False`` skips that one. ``check_runnable`` is
what a backend calls before compiling a model.
A model is a :class:`~onnxforge.proto_ext.view.ModelView`, an extended or stock
``ModelProto``, serialized bytes, or a path. Objects that are not messages
(the IR's ``Model``) can take part by offering ``verification_view()``.
"""
from __future__ import annotations

from typing import Any

from onnxforge.proto_ext.errors import VerificationError, Violation
from onnxforge.proto_ext import schema
from onnxforge.proto_ext.verify import catalogue_rules as _catalogue_rules  # noqa: F401 (registers)
from onnxforge.proto_ext.verify import graph_rules as _graph_rules  # noqa: F401 (registers)
from onnxforge.proto_ext.verify import alias_rules as _alias_rules  # noqa: F401 (registers)
from onnxforge.proto_ext.verify import inplace_rules as _inplace_rules  # noqa: F401 (registers)
from onnxforge.proto_ext.verify import paged_rules as _paged_rules  # noqa: F401 (registers)
from onnxforge.proto_ext.verify import external_rules as _external_rules  # noqa: F401 (registers)
from onnxforge.proto_ext.verify import standard_rules as _standard_rules  # noqa: F401 (registers)
from onnxforge.proto_ext.verify.core import run_checks
from onnxforge.proto_ext.verify.wire import wire_violations
from onnxforge.proto_ext.view import ModelView, view_from_proto

__all__ = ["check", "check_runnable", "check_view", "verify", "as_view"]


def as_view(model: Any, model_dir: str | None = None) -> tuple[ModelView, list[Violation]]:
    """The verification view of ``model`` plus violations found while reading the wire."""
    if isinstance(model, ModelView):
        return model, []
    if hasattr(model, "verification_view"):
        return model.verification_view(), []
    message, folder = schema.read_model(model, model_dir)
    return view_from_proto(message, folder), wire_violations(message)


def check_view(view: ModelView, wire: list[Violation] | None = None, *,
               standard: bool = True) -> list[Violation]:
    """The violations of ``view`` (after ``wire``, those found reading the wire): every
    registered rule, then, when none is broken and ``standard``, rule X1."""
    violations = list(wire or ()) + run_checks(view)
    if standard and not violations:
        violations = _standard_rules.standard_violations(view)
    return violations


def check(model: Any, model_dir: str | None = None, *, standard: bool = True) -> list[Violation]:
    """Every violation of the static rules, in a stable order (empty list: valid)."""
    view, wire = as_view(model, model_dir)
    return check_view(view, wire, standard=standard)


def verify(model: Any, model_dir: str | None = None) -> None:
    """Raise :class:`VerificationError` if ``model`` breaks any static rule."""
    violations = check(model, model_dir)
    if violations:
        raise VerificationError(violations)


def check_runnable(model: Any, model_dir: str | None = None) -> None:
    """Raise :class:`VerificationError` unless ``model`` (an IR model, a ModelProto,
    bytes or a path) keeps every static rule, X1 and X2 included: what a backend
    checks before it compiles a model, so that a malformed one fails with the rule
    and the path instead of an error from deep inside the compiler."""
    verify(model, model_dir)
