"""Kernel objects of the CPU backend; importing this package registers every kernel."""
from __future__ import annotations

from onnxforge.kernels_cy.ops import attention, control, elementwise, nn, paged, quant, shape_ops  # noqa: F401
from onnxforge.kernels_cy.ops.base import REGISTRY, Kernel, NodeSpec, claimed_ops, register

__all__ = ["REGISTRY", "Kernel", "NodeSpec", "claimed_ops", "register"]
