"""Synthetic chain model for optimizer benchmarks, built directly as an onnxforge IR model.

``build_chain(n)`` returns a model with ``n`` nodes over a float32[64] tensor that
repeats ``Identity -> Add(x, C) -> Constant(D) + Mul(x, D) -> Identity``; the
constants take ten distinct values. Every 100 steps (at step % 100 == 50) a dead
``Neg`` and a duplicated ``Add(t, S)`` pair joined by ``Max`` are appended.
Names follow the pattern ``t<step>``, ``C<step>``, ``D<step>``, ``S<step>``...

    python -m benchmarks.chain 20000     # prints node and initializer counts
"""
from __future__ import annotations

import sys

import numpy as np
from onnx import TensorProto

from onnxforge.graphbuilder.ir.core import Attr, AttrType, Graph, Model, Node, Value
from onnxforge.graphbuilder.ir.tensors import Tensor
from onnxforge.proto_ext.types import TensorType

__all__ = ["WIDTH", "build_chain", "chain_values"]

WIDTH = 64


def chain_values() -> list[np.ndarray]:
    """The ten distinct constant payloads: ``1 + 0.001 * k``."""
    return [np.full((WIDTH,), 1.0 + 0.001 * k, np.float32) for k in range(10)]


def build_chain(n: int) -> Model:
    """The chain as an IR model with at least ``n`` nodes (stops at the first step reaching n)."""
    vals = chain_values()
    ttype = TensorType(TensorProto.FLOAT, (WIDTH,))
    g = Graph("chain")
    prev = g.add_input(Value("x", ttype))

    def node(op: str, ins: list[Value], out: str, name: str, **attrs: Attr) -> Value:
        nd = Node("", op, ins, [Value(out, ttype)], name=name, attributes=list(attrs.values()))
        g.append(nd)
        return nd.outputs[0]

    def init(name: str, arr: np.ndarray) -> Value:
        return g.add_initializer(Value(name, ttype), Tensor.from_numpy(arr))

    step = 0
    while len(g) < n:
        k = step % 4
        out = f"t{step}"
        if k == 0 or k == 3:
            cur = node("Identity", [prev], out, f"n{step}")
        elif k == 1:
            c = init(f"C{step}", vals[step % 10])
            cur = node("Add", [prev, c], out, f"n{step}")
        else:
            value = Attr("value", AttrType.TENSOR, Tensor.from_numpy(vals[(step * 7) % 10]))
            d = node("Constant", [], f"D{step}", f"c{step}", value=value)
            cur = node("Mul", [prev, d], out, f"n{step}")
        if step % 100 == 50:
            node("Neg", [cur], f"dead{step}", f"dead{step}")
            s = init(f"S{step}", vals[0])
            a = node("Add", [cur, s], f"a{step}", f"cseA{step}")
            b = node("Add", [cur, s], f"b{step}", f"cseB{step}")
            cur = node("Max", [a, b], f"m{step}", f"max{step}")
        prev = cur
        step += 1
    g.outputs.append(prev)
    return Model(g, opset_imports={"": 21}, ir_version=10)


if __name__ == "__main__":
    m = build_chain(int(sys.argv[1]) if len(sys.argv) > 1 else 20000)
    print(len(m.graph), "nodes,", len(m.graph.initializers), "initializers")
