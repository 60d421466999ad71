"""The kernel registry (:mod:`.base`) and the generic ONNX operators (elementwise, shape and
data movement, reductions, quantization, control flow, the ``onnx.reference`` fallback).

Importing this package registers every kernel of every family: the families
(``attention``, ``cache``, ``conv``, ``matmul``, ``norm``, ``paged``, ``pool``, ``resize``, ``rnn``) are imported here."""
from __future__ import annotations

from onnxforge.kernels_cy.ops.base import REGISTRY, Kernel, NodeSpec, claimed_ops, register
from onnxforge.kernels_cy.ops import (activations, control, cumulative, einsum, elementwise, nms,  # noqa: F401
                                      quant, rearrange, reduce, scatter, shape_ops, topk, windows)
import onnxforge.kernels_cy.attention.kernels  # noqa: F401,E402
import onnxforge.kernels_cy.cache.kernels  # noqa: F401,E402
import onnxforge.kernels_cy.conv.kernels  # noqa: F401,E402
import onnxforge.kernels_cy.matmul.kernels  # noqa: F401,E402
import onnxforge.kernels_cy.norm.kernels  # noqa: F401,E402
import onnxforge.kernels_cy.paged.kernels  # noqa: F401,E402
import onnxforge.kernels_cy.paged.ragged  # noqa: F401,E402
import onnxforge.kernels_cy.pool.kernels  # noqa: F401,E402
import onnxforge.kernels_cy.resize.grid  # noqa: F401,E402
import onnxforge.kernels_cy.resize.kernels  # noqa: F401,E402
import onnxforge.kernels_cy.rnn.kernels  # noqa: F401,E402

__all__ = ["REGISTRY", "Kernel", "NodeSpec", "claimed_ops", "register"]
