"""Per-token decode latency of the real tiny decoders: onnxforge's CPU backend against
onnxruntime's InferenceSession loop and (builder models) the onnxruntime-genai Generator.

For each decoder family built by ``tests/fixtures/decoders.py`` (torch opset 20 and
23 after ``of.optimize(model, opset=23)``, which fuses the opset-20 export's decomposed
attention and RMS norms into the opset-23 operators; genai fp32 and int4) and each
context ``c``, one decode step
(``input_ids`` [1, 1], a past of ``c`` tokens, a mask of ``c + 1`` ones) is timed:

- ``onnxforge``: ``of.InferenceSession(model, threads=N)``, same feeds every step;
- ``ort``: ``onnxruntime.InferenceSession`` with ``intra_op_num_threads=N``, graph
  optimizations at their default, the same past/present feeds;
- ``genai``: ``onnxruntime_genai.Generator`` over a copy of the model folder whose
  ``genai_config.json`` sets ``intra_op_num_threads=N``; a prompt of ``c`` tokens,
  then each ``generate_next_token`` is one step (shared past/present buffer).

Every timed block is preceded by a warm-up and a pause that lets spinning BLAS and
onnxruntime threads go idle. The table shows ms per token (the best of five block
medians, robust to bursts of load from other processes on a shared machine), the
ratio onnxforge / peer (below 1: onnxforge is faster) and the resident memory each
in-process engine holds after loading and one step (MB). Closing lines report the
process's peak RSS and the run loop's per-node overhead (an empty-kernel plan of 400
steps). Fixtures are built into ``.fixture-cache/`` (or ``$ONNXFORGE_FIXTURE_CACHE``)
when missing. Not part of the test suite.

    python benchmarks/decode.py [--threads 2] [--quick] [--only genai_fp32 torch23]
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.fixtures.decoders import VARIANTS, build_all, load_io_info, random_decoder_feeds  # noqa: E402

BLOCKS = 5
IDLE_S = 0.3  # longer than OpenBLAS's ~125 ms and onnxruntime's ~35 ms spin after work
GENAI = ("genai_fp32", "genai_int4")
TORCH = ("torch20", "torch23")


def _rss_mb() -> float:
    """Resident set size of this process now (MB)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _idle() -> None:
    gc.collect()
    time.sleep(IDLE_S)


def _blocks(step: Callable[[], Any], steps: int) -> float:
    """Best of five block medians (ms): robust to bursts of load from other processes."""
    per = max(3, steps // BLOCKS)
    best = float("inf")
    for _ in range(BLOCKS):
        times = []
        for _ in range(per):
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
        best = min(best, statistics.median(times))
    return best * 1e3


def _timed(step: Callable[[], Any], warm: int, steps: int) -> float:
    """ms per call of ``step`` after ``warm`` calls and an idle pause."""
    for _ in range(warm):
        step()
    _idle()
    for _ in range(max(2, warm // 4)):
        step()
    return _blocks(step, steps)


def _ort_session(path: Path, threads: int) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def _ours(path: Path, variant: str, threads: int) -> Any:
    import onnxforge as of

    model = of.load(str(path))
    if variant in TORCH:
        model = of.optimize(model, opset=23)
    return of.InferenceSession(model, threads=threads)


def _genai_folder(path: Path, threads: int, tmp: Path) -> Path:
    dst = tmp / path.parent.name
    if not dst.exists():
        shutil.copytree(path.parent, dst)
        cfg_path = dst / "genai_config.json"
        cfg = json.loads(cfg_path.read_text())
        cfg["model"]["decoder"].setdefault("session_options", {})["intra_op_num_threads"] = threads
        cfg_path.write_text(json.dumps(cfg, indent=2))
    return dst


def _genai_time(folder: Path, ctx: int, vocab: int, warm: int, steps: int) -> float:
    import onnxruntime_genai as og

    model = og.Model(str(folder))
    prompt = np.random.default_rng(0).integers(0, vocab, size=ctx).astype(np.int32)
    limit = int(json.loads((folder / "genai_config.json").read_text())["model"].get("context_length", 1 << 30))
    # each generator serves either the warm-up or the timed steps, never both
    steps = min(steps, limit - ctx - 2)
    max_length = min(ctx + max(warm, steps + 1) + 1, limit)

    def fresh() -> Any:
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=max_length, do_sample=False)
        gen = og.Generator(model, params)
        gen.append_tokens(prompt)
        return gen

    gen = fresh()
    for _ in range(warm):
        gen.generate_next_token()
    gen = fresh()  # the timed steps start at context ctx again
    _idle()
    gen.generate_next_token()
    ms = _blocks(gen.generate_next_token, steps)
    del gen, model
    return ms


def node_overhead_us(n: int = 400, repeat: int = 200) -> float:
    """µs per step of the run loop over an ``n``-step plan whose kernels return their input."""
    from onnxforge.kernels_cy.runtime.plan import Program
    from onnxforge.kernels_cy.runtime.runctx import RunContext

    class Empty:
        def run(self, x: Any) -> Any:
            return x

    k = Empty()
    prog = Program(n + 1, [None] * (n + 1), [k.run] * n, ["empty"] * n, [[i] for i in range(n)],
                   [[i + 1] for i in range(n)], [[i] for i in range(n)], [[] for _ in range(n)],
                   [[False] for _ in range(n)], list(range(n + 1)), [0], [n])
    ctx = RunContext()
    x = np.zeros(1, np.float32)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(repeat):
            prog.run([x], ctx)
        best = min(best, (time.perf_counter() - t0) / repeat)
    return best / n * 1e6


def bench(variants: list[str], contexts: list[int], threads: int, warm: int, steps: int,
          cache: Path) -> list[dict[str, Any]]:
    paths = build_all(cache, variants)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="of-bench-") as tmpd:
        for variant in variants:
            path = paths[variant]
            info = load_io_info(path)
            feeds0 = random_decoder_feeds(path, info, batch=1, seq=1, past=contexts[0], seed=1)
            rss0 = _rss_mb()
            ours = _ours(path, variant, threads)
            ours.run(None, feeds0)
            rss1 = _rss_mb()
            ort_sess = _ort_session(path, threads)
            ort_sess.run(None, feeds0)
            held = (rss1 - rss0, _rss_mb() - rss1)
            for ctx in contexts:
                feeds = random_decoder_feeds(path, info, batch=1, seq=1, past=ctx, seed=1)
                row: dict[str, Any] = {"variant": variant, "ctx": ctx, "held": held}
                row["ours"] = _timed(lambda: ours.run(None, feeds), warm, steps)
                row["ort"] = _timed(lambda: ort_sess.run(None, feeds), warm, steps)
                if variant in GENAI:
                    try:
                        folder = _genai_folder(path, threads, Path(tmpd))
                        row["genai"] = _genai_time(folder, ctx, int(info["vocab_size"]), warm, steps)
                    except ImportError:
                        pass
                rows.append(row)
                _print_row(row)
            del ours, ort_sess
    return rows


HEADER = (f"{'model':<11} {'ctx':>5} {'onnxforge':>10} {'ort':>8} {'genai':>8} "
          f"{'of/ort':>7} {'of/genai':>8}   {'RSS held MB (of/ort)':<20}")


def _print_row(r: dict[str, Any]) -> None:
    g = r.get("genai")
    gs = f"{g:8.3f}" if g is not None else f"{'-':>8}"
    rg = f"{r['ours'] / g:8.2f}" if g else f"{'-':>8}"
    mb = f"{r['held'][0]:.1f}/{r['held'][1]:.1f}"
    print(f"{r['variant']:<11} {r['ctx']:>5} {r['ours']:10.3f} {r['ort']:8.3f} {gs} "
          f"{r['ours'] / r['ort']:7.2f} {rg}   {mb:<20}", flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--quick", action="store_true", help="fewer steps, contexts 64 and 256")
    ap.add_argument("--only", nargs="*", choices=VARIANTS, help="decoder families to run")
    ap.add_argument("--contexts", nargs="*", type=int, help="override the contexts (default 64 256 1024)")
    ap.add_argument("--cache", type=Path, default=None, help="fixture cache folder")
    args = ap.parse_args(argv)
    cache = args.cache or Path(os.environ.get("ONNXFORGE_FIXTURE_CACHE") or REPO / ".fixture-cache")
    contexts = args.contexts or ([64, 256] if args.quick else [64, 256, 1024])
    warm, steps = (10, 30) if args.quick else (30, 100)
    variants = list(args.only or VARIANTS)
    print(f"threads={args.threads}  ms per decode step (best of {BLOCKS} medians of {steps // BLOCKS}); "
          "ratios onnxforge / peer")
    print(HEADER)
    bench(variants, contexts, args.threads, warm, steps, cache)
    print(f"peak RSS of the process: {_peak_mb():.0f} MB")
    print(f"run loop overhead: {node_overhead_us():.3f} µs per node (empty-kernel plan of 400 nodes)")


if __name__ == "__main__":
    main()
