"""Rules of the standard part (X1, X2): what stock ONNX requires of the operators.

X2 (a standard operator's required inputs are non-empty names) is a registered check;
X1 (the payload-free standard skeleton passes ``onnx.checker`` with full checks) runs
after every other rule holds (``verify.check``), since it reads types and shapes that
the other rules vouch for. Both live in :mod:`onnxforge.proto_ext.standard`.
"""
from __future__ import annotations

from onnxforge.proto_ext.standard import required_input_violations, standard_violations
from onnxforge.proto_ext.verify.core import Report, iter_graphs, register
from onnxforge.proto_ext.view import ModelView

__all__ = ["check_required_inputs", "standard_violations"]


@register("standard")
def check_required_inputs(view: ModelView, report: Report) -> None:
    """X2: every required input of a standard operator is a non-empty name."""
    report.violations.extend(required_input_violations(view, iter_graphs(view)))
