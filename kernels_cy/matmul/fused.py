"""Plan-time fusions: node groups the plan runs as one compiled call.

The model is not changed: the plan builder (:mod:`~onnxforge.kernels_cy.runtime.compile`)
finds a group in the body's schedule, runs one kernel in place of its nodes, and
never gives the group's inner values a slot. A group fuses only when no value
inside it is read outside it (or is a graph output), and its result is the same,
bit for bit, as that of its nodes one after the other.

The gated unit of a decoder's MLP (SwiGLU)::

    g = MatMul(x, Wg); u = MatMul(x, Wu)            # Wg, Wu: initializers of one shape
    s = Sigmoid(g); a = Mul(g, s); y = Mul(a, u)    # either operand order of each Mul

becomes one step ``y = swiglu(x, Wg, Wu)``: on a float32 row both products stream in
one pass of the worker pool and the gate is applied on the way out
(``_gemv.OneRowSwiGLU``); many float32 rows (a prefill, a batched engine step) run
the two products on BLAS, then the gate in one compiled pass on the pool
(``_gemv.swiglu_gate``, bitwise the Sigmoid and Mul kernels); any other operands run
the five kernels in turn. It is
placed where the group's first node was, which every input precedes.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from onnxforge.graphbuilder.ir.core import Node, Value
from onnxforge.kernels_cy.ops import fast
from onnxforge.kernels_cy.ops.base import Kernel, norm_domain

__all__ = ["Fused", "SwiGLU", "find_swiglu"]

F32 = np.dtype(np.float32)


@dataclass(slots=True, eq=False)
class Fused:
    """One group: ``nodes`` in schedule order, ``members`` the same nodes in the order of the
    pattern's roles; the step reads ``inputs`` and writes ``output``."""

    kind: str
    nodes: list[Node]
    members: tuple[Node, ...]
    inputs: list[Value]
    output: Value


def _producer(v: Value | None, kind: str) -> Node | None:
    if v is None:
        return None
    n = v.producer()
    if n is None or n.op_type != kind or norm_domain(n.domain) != "" or n.subgraphs() or n.output_alias:
        return None
    return n


def _inner(v: Value, uses: int) -> bool:
    """``v`` is read by exactly ``uses`` nodes and by nothing outside the group."""
    return v.num_uses() == uses and not v.is_graph_output()


def _swiglu_at(y_node: Node, consts: set[int]) -> Fused | None:
    if y_node.op_type != "Mul" or norm_domain(y_node.domain) != "" or len(y_node.inputs) != 2:
        return None
    for a, u in (y_node.inputs, y_node.inputs[::-1]):
        ma, mu = _producer(a, "Mul"), _producer(u, "MatMul")
        if ma is None or mu is None or len(ma.inputs) != 2 or len(mu.inputs) != 2:
            continue
        for g, s in (ma.inputs, ma.inputs[::-1]):
            sig, mg = _producer(s, "Sigmoid"), _producer(g, "MatMul")
            if sig is None or mg is None or sig.inputs[0] is not g or len(mg.inputs) != 2 or mg is mu:
                continue
            x, wg = mg.inputs
            x2, wu = mu.inputs
            if x is None or x is not x2 or wg is None or wu is None:
                continue
            if id(wg) not in consts or id(wu) not in consts:
                continue
            if not (_inner(g, 2) and _inner(s, 1) and _inner(a, 1) and _inner(u, 1)):
                continue
            members = (mg, mu, sig, ma, y_node)
            return Fused("SwiGLU", list(members), members, [x, wg, wu], y_node.outputs[0])
    return None


def find_swiglu(order: Sequence[Node], consts: set[int]) -> list[Fused]:
    """Every SwiGLU group of a schedule ``order`` whose weights are in ``consts`` (ids of
    constant values); each group's nodes come back sorted by their place in ``order``."""
    pos = {id(n): k for k, n in enumerate(order)}
    taken: set[int] = set()
    out: list[Fused] = []
    for n in order:
        f = _swiglu_at(n, consts)
        if f is None or any(id(m) not in pos or id(m) in taken for m in f.nodes):
            continue
        f.nodes.sort(key=lambda m: pos[id(m)])
        taken.update(id(m) for m in f.nodes)
        out.append(f)
    return out


class SwiGLU(Kernel):
    """``y = (g * sigmoid(g)) * u`` with ``g = x @ wg``, ``u = x @ wu`` (one fused step).

    ``steps`` are the group's own kernels' calls (MatMul g, MatMul u, Sigmoid, Mul,
    Mul) with the operand order of each Mul: the path for operands the compiled call
    does not take. Its intermediates are counted as allocated (the run context's
    ``mem.hold``) and released when the call returns."""

    uses_context = True

    def __init__(self, spec, steps: Sequence[Callable], a_first: bool, g_first: bool, threads: int):
        super().__init__(spec)
        self.mm_g, self.mm_u, self.sig, self.mul_a, self.mul_y = steps
        self.a_first = a_first
        self.g_first = g_first
        self.threads = threads
        if fast.OneRowSwiGLU is not None:
            self.run = fast.OneRowSwiGLU(threads, self._run)  # type: ignore[method-assign]

    def run(self, ctx, x, wg, wu):
        return self._run(ctx, x, wg, wu)

    def _run(self, ctx, x, wg, wu):
        g = self.mm_g(x, wg)
        u = self.mm_u(x, wu)
        if (fast.swiglu_gate is not None and isinstance(g, np.ndarray) and isinstance(u, np.ndarray)
                and g.dtype == F32 and u.dtype == F32 and g.shape == u.shape and g.flags.c_contiguous
                and u.flags.c_contiguous):  # many rows: the products, then the gate in one pass
            out = np.empty(g.shape, dtype=F32)
            if fast.swiglu_gate(g.reshape(-1), u.reshape(-1), out.reshape(-1), self.threads) is not None:
                held = g.nbytes + u.nbytes
                ctx.mem.hold(held)
                ctx.mem.live -= held
                return out
        s = self.sig(g)
        a = self.mul_a(g, s) if self.g_first else self.mul_a(s, g)
        held = sum(int(np.asarray(t).nbytes) for t in (g, u, s, a))
        ctx.mem.hold(held)
        ctx.mem.live -= held
        return self.mul_y(a, u) if self.a_first else self.mul_y(u, a)
