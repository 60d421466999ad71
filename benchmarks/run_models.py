"""The real-world corpus on the CPU backend against onnxruntime: per-inference time of each
model (original and after ``of.optimize``), and each silero VAD variant's 32 ms chunk loop
through ``of.make_state`` (the LSTM state bound in place) against onnxruntime's loop that
feeds the state back. 2 threads each, onnxruntime with its default graph optimizations,
measured side by side (best of five block medians). Ratios below 1: onnxforge is faster.

    python benchmarks/run_models.py [--threads 2] [--repeat 20]
"""
from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.fixtures.wild import CORPUS, fetch_all, random_feeds  # noqa: E402
from tests.kernels_cy.test_silero_state import VARIANTS  # noqa: E402


def _best(fn: Callable[[], Any], repeat: int) -> float:
    fn()
    gc.collect()
    time.sleep(0.2)
    best = float("inf")
    for _ in range(5):
        times = []
        for _ in range(max(3, repeat // 5)):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        best = min(best, statistics.median(times))
    return best * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    import onnxruntime as ort

    import onnxforge as of

    cache = Path(os.environ.get("ONNXFORGE_FIXTURE_DIR", REPO / ".fixture-cache"))
    models = fetch_all(cache)
    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    print(f"{'model':26}{'ort ms':>9}{'ours ms':>9}{'ratio':>8}{'optimized':>11}")
    ratios = []
    for m in sorted(CORPUS, key=lambda c: c.name):
        path = str(models[m.name])
        feeds = random_feeds(m.name, path)[0]
        ref = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        ours = of.InferenceSession(path, threads=args.threads)
        opt = of.InferenceSession(of.optimize(path), threads=args.threads)
        t_ref = _best(lambda: ref.run(None, feeds), args.repeat)
        t_ours = _best(lambda: ours.run(None, feeds), args.repeat)
        t_opt = _best(lambda: opt.run(None, feeds), args.repeat)
        ratios.append(t_opt / t_ref)
        print(f"{m.name:26}{t_ref:>9.2f}{t_ours:>9.2f}{t_ours / t_ref:>8.2f}{t_opt / t_ref:>10.2f}x")
    print(f"median ratio after optimize {statistics.median(ratios):.2f} (goal <= 1.5, stretch <= 1.0); "
          f"max {max(ratios):.2f} (goal <= 2.0)")
    print(f"\n{'silero chunk loop':26}{'ort ms':>9}{'ours ms':>9}{'ratio':>8}")
    for name, (bind, width, has_sr) in sorted(VARIANTS.items()):
        path = str(models[name])
        ref = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        ins = {i.name: i for i in ref.get_inputs()}
        dt = np.float16 if "float16" in ins["input"].type else np.float32
        chunk = (np.random.default_rng(0).standard_normal((1, width)) * 0.1).astype(dt)
        feeds = {"input": chunk, **({"sr": np.array(16000, np.int64)} if has_sr else {})}
        init = {k: np.zeros([d if isinstance(d, int) else 1 for d in ins[k].shape],
                            np.float16 if "float16" in ins[k].type else np.float32) for k in bind}
        outs = [o.name for o in ref.get_outputs()]
        fed = dict(init)

        def ort_step() -> None:
            nonlocal fed
            got = ref.run(None, {**feeds, **fed})
            fed = {i: got[outs.index(o)] for i, o in bind.items()}

        state = of.make_state(of.InferenceSession(of.optimize(of.make_stateful(path, 1, bindings=bind, batch=1)),
                                                  threads=args.threads),
                              initial={k: v.copy() for k, v in init.items()})
        t_ref = _best(ort_step, args.repeat * 5)
        t_ours = _best(lambda: state.run(feeds), args.repeat * 5)
        print(f"{name:26}{t_ref:>9.3f}{t_ours:>9.3f}{t_ours / t_ref:>8.2f}")


if __name__ == "__main__":
    main()
