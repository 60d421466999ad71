"""Fallback kernel: runs one node the backend does not claim with ``onnx.reference``.

Used only when the session was created with ``fallback="reference"``; the node
becomes a one-node model (:func:`~onnxforge.passes.rewrites.fold_eval.one_node_model`,
the one constant folding uses, built on first use per input dtype signature) and its
outputs are counted as fallback copies.
"""
from __future__ import annotations

import threading
from typing import Any

import numpy as np

from onnxforge.graphbuilder.ir.core import Attr, Model, Node
from onnxforge.kernels_cy.ops.base import Kernel, NodeSpec
from onnxforge.passes.rewrites.fold_eval import one_node_model, reference_evaluator
from onnxforge.proto_ext.dtypes import onnx_dtype
from onnxforge.proto_ext.types import TensorType

__all__ = ["ReferenceKernel"]


class ReferenceKernel(Kernel):
    is_fallback = True

    def __init__(self, spec: NodeSpec, node: Node, model: Model):
        super().__init__(spec)
        if node.subgraphs():
            raise spec.fail("a node with subgraphs cannot run through the reference fallback")
        self.domain = node.domain
        self.op_type = node.op_type
        self.attrs = [Attr(a.name, a.type, a.value) for a in node.attributes.values()]
        self.present = [v is not None for v in node.inputs]
        self.n_out = len(node.outputs)
        self.opsets = dict(model.opset_imports)
        self.out_types = [v.type for v in node.outputs]
        self._sessions: dict[tuple, Any] = {}  # built on first use, shared by every run
        self._lock = threading.Lock()  # guards the cache and the evaluator, which is not reentrant

    def _session(self, xs: tuple) -> Any:
        key = tuple(None if x is None else (x.dtype.str, x.ndim) for x in xs)
        sess = self._sessions.get(key)
        if sess is not None:
            return sess
        inputs = [None if x is None else TensorType(onnx_dtype(x.dtype), (None,) * x.ndim) for x in xs]
        sess = reference_evaluator(one_node_model(self.domain, self.op_type, self.attrs, inputs,
                                                  self.out_types, self.opsets))
        self._sessions[key] = sess
        return sess

    def run(self, *xs):
        feeds = {f"in{i}": x for i, x in enumerate(xs) if x is not None}
        with self._lock:
            outs = [np.asarray(o) for o in self._session(xs).run(None, feeds)]
        return outs[0] if self.n_out == 1 else tuple(outs)
