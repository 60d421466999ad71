"""Control flow: If, Loop and Scan run compiled sub-plans; local function calls run the
function body's plan. The sub-plans read the outer values they capture as extra
step inputs (in attribute order), so liveness and scheduling see those reads."""
from __future__ import annotations

from typing import Any

import numpy as np

from onnxforge.graphbuilder.ir.core import Function, Graph, Node
from onnxforge.kernels_cy.ops.base import Kernel, NodeSpec, register

__all__ = ["FunctionCall"]


class _WithBodies(Kernel):
    fresh = False  # the sub-plans count their own allocations
    uses_context = True  # the sub-plans run in the caller's run context

    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        names = [n for n, v in spec.attrs.items() if isinstance(v, Graph)]
        self.bodies = {n: spec.subgraph(n) for n in names}
        self.order = names
        self.n_inputs = spec.n_inputs

    def _split(self, xs: tuple) -> tuple[tuple, dict[str, list]]:
        ins, rest = xs[:self.n_inputs], list(xs[self.n_inputs:])
        caps: dict[str, list] = {}
        for n in self.order:
            k = len(self.bodies[n].captured)
            caps[n], rest = rest[:k], rest[k:]
        return ins, caps


@register("", "If")
class If(_WithBodies):
    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        if "then_branch" not in self.bodies or "else_branch" not in self.bodies:
            raise spec.fail("If needs then_branch and else_branch")
        self.n_out = spec.n_outputs

    def run(self, ctx, *xs):
        ins, caps = self._split(xs)
        branch = "then_branch" if bool(np.asarray(ins[0]).reshape(-1)[0]) else "else_branch"
        outs = self.bodies[branch].program.run(caps[branch], ctx)
        return outs[0] if self.n_out == 1 else tuple(outs)


@register("", "Loop")
class Loop(_WithBodies):
    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.body = self.bodies["body"]
        n_in = len(self.body.inputs)
        self.n_carried = n_in - 2
        self.n_scan = len(self.body.outputs) - 1 - self.n_carried
        self.n_out = spec.n_outputs

    def run(self, ctx, *xs):
        ins, caps = self._split(xs)
        m, cond = ins[0], ins[1]
        carried = list(ins[2:2 + self.n_carried])
        trips = None if m is None else int(np.asarray(m).reshape(-1)[0])
        go = True if cond is None else bool(np.asarray(cond).reshape(-1)[0])
        scans: list[list[np.ndarray]] = [[] for _ in range(self.n_scan)]
        i = 0
        prog = self.body.program
        while go and (trips is None or i < trips):
            outs = prog.run([np.array(i, dtype=np.int64), np.array(go)] + carried + list(caps["body"]), ctx)
            go = bool(np.asarray(outs[0]).reshape(-1)[0])
            carried = list(outs[1:1 + self.n_carried])
            for j in range(self.n_scan):
                scans[j].append(outs[1 + self.n_carried + j])
            i += 1
        stacked = []
        for j in range(self.n_scan):
            if scans[j]:
                stacked.append(np.stack(scans[j]))
            else:
                t = self.body.outputs[1 + self.n_carried + j].type
                stacked.append(_empty_of(t))
        res = [np.asarray(c) for c in carried] + stacked
        return res[0] if self.n_out == 1 else tuple(res)


def _empty_of(t: Any) -> np.ndarray:
    from onnxforge.proto_ext.dtypes import np_dtype

    try:
        dt = np_dtype(t.elem_type)
    except Exception:  # noqa: BLE001 - unknown or missing element type: float32 placeholder
        dt = np.dtype(np.float32)
    shape = [0] + [d if isinstance(d, int) else 0 for d in (t.shape or ())] if t is not None else [0]
    return np.zeros(shape, dtype=dt)


@register("", "Scan")
class Scan(_WithBodies):
    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        if spec.opset < 9:
            raise spec.fail("Scan before opset 9 (batched, with a sequence_lens input) is not supported")
        self.body = self.bodies["body"]
        self.m = spec.int("num_scan_inputs")
        self.n_state = len(self.body.inputs) - self.m
        self.k = len(self.body.outputs) - self.n_state
        self.in_axes = spec.ints("scan_input_axes") or [0] * self.m
        self.in_dirs = spec.ints("scan_input_directions") or [0] * self.m
        self.out_axes = spec.ints("scan_output_axes") or [0] * self.k
        self.out_dirs = spec.ints("scan_output_directions") or [0] * self.k
        self.n_out = spec.n_outputs

    def run(self, ctx, *xs):
        ins, caps = self._split(xs)
        state = list(ins[:self.n_state])
        seqs = list(ins[self.n_state:])
        seqs = [np.moveaxis(s, a % s.ndim, 0) for s, a in zip(seqs, self.in_axes)]
        n = seqs[0].shape[0] if seqs else 0
        if any(s.shape[0] != n for s in seqs):
            raise self.error(f"the scan inputs have {[s.shape[0] for s in seqs]} iterations along their "
                             f"scan axes; they must agree")
        if n == 0 and self.k:
            # no iteration: the scan outputs' element shapes come only from running the body
            # (onnx.reference and onnxruntime refuse this too)
            raise self.error("a scan over zero iterations has no shape for its scan outputs")
        outs_acc: list[list[np.ndarray]] = [[] for _ in range(self.k)]
        prog = self.body.program
        for t in range(n):
            slices = [s[n - 1 - t] if d else s[t] for s, d in zip(seqs, self.in_dirs)]
            outs = prog.run(state + slices + list(caps["body"]), ctx)
            state = list(outs[:self.n_state])
            for j in range(self.k):
                outs_acc[j].append(outs[self.n_state + j])
        res = [np.asarray(s) for s in state]
        for j in range(self.k):
            parts = outs_acc[j][::-1] if self.out_dirs[j] else outs_acc[j]
            y = np.stack(parts) if parts else np.zeros((0,), dtype=np.float32)
            a = self.out_axes[j] % y.ndim
            res.append(np.ascontiguousarray(np.moveaxis(y, 0, a)))
        return res[0] if self.n_out == 1 else tuple(res)


class FunctionCall(Kernel):
    """A call of a model-local function: its body compiled once into a sub-plan."""

    fresh = False
    uses_context = True

    def __init__(self, spec: NodeSpec, compiler: Any, node: Node, fn: Function):
        super().__init__(spec)
        for n in fn:
            for a in n.attributes.values():
                if a.ref_attr_name:
                    raise spec.fail(f"function {fn.name!r} uses attribute parameters "
                                    f"({a.ref_attr_name!r}); not supported")
        self.cg = compiler.compile(fn)
        self.n_formal = len(fn.inputs)
        self.n_out = spec.n_outputs

    def run(self, ctx, *xs):
        args = list(xs[:self.n_formal]) + [None] * (self.n_formal - len(xs))
        outs = self.cg.program.run(args, ctx)
        return outs[0] if self.n_out == 1 else tuple(outs)
