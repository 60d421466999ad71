"""Optimizer benchmark on the synthetic chain: onnxforge vs onnx_ir vs onnxscript.

    python benchmarks/passes.py            # N = 2,000 for every tool, N = 20,000 and
                                           # 200,000 for onnxforge, 20,000 for onnx_ir
    python benchmarks/passes.py --full     # also onnxscript at N = 20,000 (minutes)

The chain comes from ``benchmarks/chain.py`` (built directly as an IR model);
the script first checks that it is the model of the reference definition
(``/work/shared/bench/chain_model.py``, or ``--reference PATH``): same node
count, initializer count and operator sequence. Every tool starts from a model
already in its own in-memory form: loading (ONNX proto -> IR) is timed
separately in the ``load s`` column and excluded from ``optimize s``. Each
optimization is run ``--repeat`` times on fresh copies and the best time is
kept. At N = 2,000 every optimized model is also run in onnxruntime and must
give the original's outputs bit for bit.
"""
from __future__ import annotations

import argparse
import gc
import importlib.util
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from onnxforge.graphbuilder import serde
from onnxforge.passes import DEFAULT_PIPELINE, default_pass_manager

from benchmarks.chain import build_chain

DEFAULT_REFERENCE = "/work/shared/bench/chain_model.py"


@dataclass
class Row:
    tool: str
    n: int
    nodes: int
    initializers: int
    load_s: float
    optimize_s: float
    outputs_ok: str = "-"


def _reference_builder(path: str) -> Callable[[int], Any]:
    spec = importlib.util.spec_from_file_location("chain_model_reference", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot import the reference chain definition {path!r}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build


def check_same_model(n: int, reference: Callable[[int], Any]) -> Any:
    """Our chain vs the reference build(n): node count, initializer count, op sequence."""
    ref = reference(n)
    ours = build_chain(n)
    got_ops = [nd.op_type for nd in ours.graph]
    want_ops = [nd.op_type for nd in ref.graph.node]
    if len(got_ops) != len(want_ops) or len(ours.graph.initializers) != len(ref.graph.initializer) \
            or got_ops != want_ops:
        raise SystemExit(f"benchmarks/chain.py differs from the reference at N={n}: "
                         f"{len(got_ops)} vs {len(want_ops)} nodes, {len(ours.graph.initializers)} vs "
                         f"{len(ref.graph.initializer)} initializers")
    return ref


def _best(fn: Callable[[], tuple[float, Any]], repeat: int) -> tuple[float, Any]:
    best, result = float("inf"), None
    for _ in range(repeat):
        gc.collect()
        t, r = fn()
        if t < best:
            best, result = t, r
    return best, result


def _ort_outputs(proto: Any, x: np.ndarray) -> list[np.ndarray]:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(proto.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})


def _same(want: list[np.ndarray], proto: Any, x: np.ndarray) -> str:
    got = _ort_outputs(proto, x)
    ok = len(got) == len(want) and all(np.array_equal(a, b) for a, b in zip(want, got))
    return "equal" if ok else "DIFFER"


def run_onnxforge(n: int, ref_proto: Any, repeat: int, verify: Any) -> Row:
    t0 = time.perf_counter()
    serde.from_proto(ref_proto)
    load = time.perf_counter() - t0

    def once() -> tuple[float, Any]:
        m = build_chain(n)  # same model as loading the reference, without the load time
        pm = default_pass_manager()
        t = time.perf_counter()
        pm(m)
        return time.perf_counter() - t, m

    best, m = _best(once, repeat)
    ok = _same(verify[1], serde.to_onnx(m), verify[0]) if verify is not None else "-"
    return Row("onnxforge", n, len(m.graph), len(m.graph.initializers), load, best, ok)


def _onnx_ir_passes() -> Any:
    import onnx_ir as ir
    from onnx_ir.passes import common

    return ir.passes.PassManager([
        common.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0),
        common.DeduplicateInitializersPass(),
        common.IdentityEliminationPass(),
        common.CommonSubexpressionEliminationPass(),
        common.RemoveUnusedNodesPass(),
    ])


def run_onnx_ir(n: int, ref_proto: Any, repeat: int, verify: Any) -> Row:
    import onnx_ir as ir

    t0 = time.perf_counter()
    ir.serde.deserialize_model(ref_proto)
    load = time.perf_counter() - t0

    def once() -> tuple[float, Any]:
        m = ir.serde.deserialize_model(ref_proto)
        pm = _onnx_ir_passes()
        t = time.perf_counter()
        pm(m)
        return time.perf_counter() - t, m

    best, m = _best(once, repeat)
    ok = _same(verify[1], ir.serde.serialize_model(m), verify[0]) if verify is not None else "-"
    return Row("onnx_ir common passes", n, len(m.graph), len(m.graph.initializers), load, best, ok)


def run_onnxscript(n: int, ref_proto: Any, repeat: int, verify: Any) -> Row:
    import onnx_ir as ir
    import onnxscript.optimizer

    t0 = time.perf_counter()
    ir.serde.deserialize_model(ref_proto)
    load = time.perf_counter() - t0

    def once() -> tuple[float, Any]:
        m = ir.serde.deserialize_model(ref_proto)
        t = time.perf_counter()
        onnxscript.optimizer.optimize(m)
        return time.perf_counter() - t, m

    best, m = _best(once, repeat)
    ok = _same(verify[1], ir.serde.serialize_model(m), verify[0]) if verify is not None else "-"
    return Row("onnxscript.optimizer", n, len(m.graph), len(m.graph.initializers), load, best, ok)


def _print(rows: list[Row]) -> None:
    base = {r.n: r.optimize_s for r in rows if r.tool == "onnx_ir common passes"}
    head = (f"{'tool':<24}{'N':>9}{'nodes':>9}{'inits':>7}{'load s':>9}{'optimize s':>12}"
            f"{'vs onnx_ir':>12}  outputs")
    print(head)
    print("-" * len(head))
    for r in rows:
        ratio = f"{r.optimize_s / base[r.n]:.2f}x" if r.n in base and base[r.n] > 0 else "-"
        print(f"{r.tool:<24}{r.n:>9}{r.nodes:>9}{r.initializers:>7}{r.load_s:>9.3f}"
              f"{r.optimize_s:>12.3f}{ratio:>12}  {r.outputs_ok}")


class _Rows(list):
    """Rows, each announced as soon as it is measured (some runs take minutes)."""

    def append(self, row: Row) -> None:
        super().append(row)
        print(f"  measured {row.tool} at N={row.n}: {row.optimize_s:.3f} s", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--full", action="store_true", help="also run onnxscript at N = 20,000 (minutes)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per measurement (best kept)")
    ap.add_argument("--reference", default=DEFAULT_REFERENCE, help="reference chain_model.py")
    ap.add_argument("--skip-200k", action="store_true", help="leave out N = 200,000")
    args = ap.parse_args(argv)

    reference = _reference_builder(args.reference)
    print(f"onnxforge pipeline: {', '.join(DEFAULT_PIPELINE)}", flush=True)
    rows = _Rows()

    small = 2_000
    ref = check_same_model(small, reference)
    x = np.linspace(-3, 3, 64, dtype=np.float32)
    verify = (x, _ort_outputs(ref, x))
    rows.append(run_onnxforge(small, ref, args.repeat, verify))
    rows.append(run_onnx_ir(small, ref, args.repeat, verify))
    rows.append(run_onnxscript(small, ref, 1, verify))

    mid = 20_000
    ref = check_same_model(mid, reference)
    rows.append(run_onnxforge(mid, ref, args.repeat, None))
    rows.append(run_onnx_ir(mid, ref, args.repeat, None))
    if args.full:
        rows.append(run_onnxscript(mid, ref, 1, None))

    if not args.skip_200k:
        big = 200_000
        ref = check_same_model(big, reference)
        rows.append(run_onnxforge(big, ref, 1, None))

    print()
    _print(rows)
    forge = {r.n: r for r in rows if r.tool == "onnxforge"}
    if mid in forge and 200_000 in forge:
        ratio = forge[200_000].optimize_s / forge[mid].optimize_s
        print(f"\nonnxforge N=200,000 / N=20,000 optimize time: {ratio:.1f}x for 10x the nodes "
              f"(goal: within 12x)")
    peers = [r for r in rows if r.n == mid and r.tool != "onnxforge"]
    if mid in forge and peers:
        best_nodes = min(r.nodes for r in peers)
        best_inits = min(r.initializers for r in peers)
        f = forge[mid]
        print(f"end state at N=20,000: onnxforge {f.nodes} nodes / {f.initializers} initializers, "
              f"best peer {best_nodes} / {best_inits}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
