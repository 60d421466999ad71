"""Fallback kernel: runs one node the backend does not claim with ``onnx.reference``.

Used only when the session was created with ``fallback="reference"``; the node
becomes a one-node model (per input dtype signature, built on first use) and its
outputs are counted as fallback copies.
"""
from __future__ import annotations

import threading
from typing import Any

import numpy as np

from onnxforge.graphbuilder.ir.core import Attr, Graph, Model, Node, Value
from onnxforge.kernels_cy.ops.base import Kernel, NodeSpec
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
        from onnx.reference import ReferenceEvaluator

        from onnxforge.graphbuilder import serde

        g = Graph(name="fallback")
        ins: list[Value | None] = []
        for i, x in enumerate(xs):
            if x is None:
                ins.append(None)
                continue
            v = Value(f"in{i}", TensorType(onnx_dtype(x.dtype), (None,) * x.ndim))
            g.add_input(v)
            ins.append(v)
        n = g.append(Node(self.domain, self.op_type, ins, [f"out{j}" for j in range(self.n_out)],
                          name="fallback", attributes=[Attr(a.name, a.type, a.value) for a in self.attrs]))
        for o, t in zip(n.outputs, self.out_types):
            o.type = t
            g.outputs.append(o)
        proto = serde.to_onnx(Model(g, opset_imports=self.opsets, ir_version=10))
        sess = ReferenceEvaluator(proto)
        self._sessions[key] = sess
        return sess

    def run(self, *xs):
        feeds = {f"in{i}": x for i, x in enumerate(xs) if x is not None}
        with self._lock:
            outs = [np.asarray(o) for o in self._session(xs).run(None, feeds)]
        return outs[0] if self.n_out == 1 else tuple(outs)
