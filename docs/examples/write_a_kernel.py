"""A kernel for the CPU backend, registered for a custom operator.

This file is the example of docs/backend.rst; tests/test_docs.py runs it (in a
fresh interpreter, since registering a kernel changes the process-wide registry).
Run it by hand with ``python docs/examples/write_a_kernel.py``.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

import onnxforge as of
from onnxforge.graphbuilder.builder.graph_builder import tensor_type
from onnxforge.kernels_cy.ops.base import Kernel, NodeSpec, register


@register("example.docs", "ScaledTanh")
class ScaledTanh(Kernel):
    """``y = alpha * tanh(x)`` for float32 ``x``; attribute ``alpha`` (default 1.0)."""

    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        # plan time: parse and validate attributes once (a bad one fails here, naming the node)
        self.alpha = np.float32(spec.float("alpha", 1.0))

    def run(self, x: np.ndarray) -> np.ndarray:
        # run time: check the arguments before touching memory, then return a new array
        if x.dtype != np.float32:
            raise self.error(f"x must be float32, got {x.dtype}")
        return np.tanh(x) * self.alpha


def main() -> None:
    g = of.GraphBuilder(opset=21, domains={"example.docs": 1})
    x = g.input("x", TensorProto.FLOAT, [2, 3])
    y = g.op["example.docs"].ScaledTanh(x, alpha=2.0)
    # a custom operator has no schema to infer types from: the output declares its own
    # (a model whose outputs are untyped fails verification, which a session runs first)
    g.output(g.op.Relu(y), "y", type=tensor_type(TensorProto.FLOAT, [2, 3]))

    sess = of.InferenceSession(g.to_model())      # compiled once: 2 steps
    feed = np.linspace(-1.0, 1.0, 6, dtype=np.float32).reshape(2, 3)
    (out,) = sess.run(None, {"x": feed})

    # float64 numpy as the oracle
    want = np.maximum(2.0 * np.tanh(feed.astype(np.float64)), 0.0)
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-7)

    assert ("example.docs", "ScaledTanh") in of.backend_ops()
    assert sess.num_steps == 2
    # two fresh float32 [2, 3] outputs (24 bytes each) were allocated, nothing copied
    assert sess.last_run.allocated_bytes == 48
    assert sess.last_run.copied_bytes == 0
    print(out)
    print(sess.last_run)


if __name__ == "__main__":
    main()
