"""KV-cache costs on the CPU backend: the in-place state against past/present loops.

Four measurements, all with 2 threads per engine (``--threads``), in one run:

1. **Cache update** of one decode step (8 layers x key and value, [1, 4, ctx, 64]
   fp32, one new token) at contexts 64 ... 16,384: ``CacheUpdate`` writing into
   capacity-sized buffers held by a state (``in place``), against ``Concat(past,
   new)`` on onnxforge's backend and on onnxruntime (``concat``). The in-place
   figure should be flat: the 16,384 one within 1.2x of the 64 one.
2. **Whole decode step** of the medium decoder (``tests/fixtures/decoders.py``
   ``genai_medium``: hidden 512, 8 layers, 8 heads, 4 KV heads, head_dim 64) at
   contexts 64 ... 8,064 (its positions end at 8,192): ``make_stateful`` + state
   (capacity 8,192, caches updated in place), the original past/present model on
   onnxforge's backend, and the plain onnxruntime past/present loop.
3. **Per-token latency against onnxruntime-genai**: its ``Generator`` with the shared
   past/present buffer (``past_present_share_buffer``) and ``intra_op_num_threads``
   set in a copied ``genai_config.json``, at contexts 256, 1024 and 4096, in the
   same table as 2; plus the growth of each engine's step time from 1024 to 4096.
4. **Peak RSS** of a fresh process that holds the medium decoder's weights and one
   state (capacity 8,192) and decodes a few steps: it should be about weights + one
   cache, not two caches.

The state's caches are filled with random values and given published lengths
(``make_state(..., lengths=...)``) instead of a prefill, so every context starts
at once; each timed in-place step then appends one token (the context grows by the
steps timed, a few dozen; genai's Generator likewise after a prefill of ctx tokens).
Past/present engines get the same feeds every step. Timings of the whole step: after
a warm-up, five rounds in which every engine runs one block of steps in turn, each
after an idle pause; each engine keeps its best block median, so a burst of load from
other processes hits all engines alike. The update alone: best of five block medians
(see ``benchmarks/decode.py``). Not part of the test suite.

    python benchmarks/kv.py [--quick] [--threads 2]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

from decode import _blocks, _genai_folder, _idle, _ort_session  # noqa: E402

from tests.fixtures.decoders import MEDIUM_QWEN3, build_all, load_io_info  # noqa: E402

LAYERS = int(MEDIUM_QWEN3["num_hidden_layers"])
KV = int(MEDIUM_QWEN3["num_key_value_heads"])
HEAD = int(MEDIUM_QWEN3["head_dim"])
POSITIONS = int(MEDIUM_QWEN3["max_position_embeddings"])


def _timed_advancing(step: Callable[[], Any], warm: int, steps: int) -> float:
    """ms per call of a ``step`` that appends a token each call (warm-up included)."""
    for _ in range(warm):
        step()
    _idle()
    step()
    return _blocks(step, steps)


# -- 1. the cache update alone ---------------------------------------------------------


def _update_models(cap: int) -> tuple[Any, Any]:
    """(in place, concat): 2 * LAYERS caches [1, KV, cap | ctx, HEAD] and one new token."""
    from onnx import TensorProto

    from onnxforge.graphbuilder.builder.graph_builder import GraphBuilder
    from onnxforge.graphbuilder.ir.core import READ_WRITE

    f, i64 = TensorProto.FLOAT, TensorProto.INT64
    g = GraphBuilder(opset=23)
    new = g.input("new", f, [1, KV, 1, HEAD])
    pos = g.input("pos", i64, [])
    caches = [g.input(f"cache.{i}", f, [1, KV, cap, HEAD], access=READ_WRITE) for i in range(2 * LAYERS)]
    for i, c in enumerate(caches):
        g.output(g.op.CacheUpdate(c, new, pos), f"updated.{i}")
        g.bind(c, f"updated.{i}")
    inplace = g.to_model()
    g = GraphBuilder(opset=23)
    new = g.input("new", f, [1, KV, 1, HEAD])
    for i in range(2 * LAYERS):
        past = g.input(f"past.{i}", f, [1, KV, "ctx", HEAD])
        g.output(g.op.Concat(past, new, axis=2), f"present.{i}")
    return inplace, g.to_model()


UPDATE_WARM, UPDATE_BLOCK, UPDATE_BLOCKS = 20, 20, 12
"""The in-place update alone (~0.1 ms a step): one state per context, and blocks of
``UPDATE_BLOCK`` steps taken from every context in turn (``UPDATE_BLOCKS`` rounds), each
context keeping its best block median. A burst of load from other processes then falls on
every context alike instead of on the one being measured."""


def _inplace_update_times(contexts: list[int], threads: int, new: np.ndarray) -> dict[int, float]:
    from onnxforge.kernels_cy.runtime.state import make_state

    budget = UPDATE_WARM + UPDATE_BLOCK * UPDATE_BLOCKS + 16
    states, where = {}, {}
    for ctx in contexts:
        cap = ctx + budget
        model, _ = _update_models(cap)
        initial = {f"cache.{i}": np.ones((1, KV, cap, HEAD), np.float32) for i in range(2 * LAYERS)}  # pre-faulted
        states[ctx] = make_state(model, initial=initial, threads=threads)
        states[ctx].reset(initial, lengths=dict.fromkeys(initial, ctx))
        where[ctx] = ctx

    def step(ctx: int) -> None:
        states[ctx].run({"new": new, "pos": np.array(where[ctx], np.int64)})
        where[ctx] += 1

    for ctx in contexts:
        for _ in range(UPDATE_WARM):
            step(ctx)
    _idle()
    best = dict.fromkeys(contexts, float("inf"))
    for _ in range(UPDATE_BLOCKS):
        for ctx in contexts:
            times = []
            for _ in range(UPDATE_BLOCK):
                t0 = time.perf_counter()
                step(ctx)
                times.append(time.perf_counter() - t0)
            best[ctx] = min(best[ctx], statistics.median(times) * 1e3)
    for st in states.values():
        st.close()
    return best


def bench_update(contexts: list[int], threads: int, warm: int, steps: int) -> list[dict[str, Any]]:
    import onnxruntime as ort

    from onnxforge.graphbuilder import serde
    from onnxforge.kernels_cy.runtime.session import InferenceSession

    new = np.random.default_rng(0).standard_normal((1, KV, 1, HEAD), dtype=np.float32)
    inplace = _inplace_update_times(contexts, threads, new)
    _, concat = _update_models(max(contexts))
    ours_concat = InferenceSession(concat, threads=threads)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    ort_concat = ort.InferenceSession(serde.to_bytes(concat), so, providers=["CPUExecutionProvider"])
    rows = []
    for ctx in contexts:
        row = {"ctx": ctx, "inplace": inplace[ctx]}
        feeds = {"new": new, **{f"past.{i}": np.ones((1, KV, ctx, HEAD), np.float32) for i in range(2 * LAYERS)}}
        row["of_concat"] = _timed_advancing(lambda: ours_concat.run(None, feeds), warm, steps)
        row["ort_concat"] = _timed_advancing(lambda: ort_concat.run(None, feeds), warm, steps)
        rows.append(row)
        print(f"{ctx:>6} {row['inplace'] * 1e3:>12.1f} {row['of_concat'] * 1e3:>12.1f} "
              f"{row['ort_concat'] * 1e3:>12.1f} {row['of_concat'] / row['inplace']:>10.1f} "
              f"{row['ort_concat'] / row['inplace']:>10.1f}", flush=True)
    return rows


# -- 2 and 3. the whole decode step ------------------------------------------------------


def _random_caches(model: Any, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {p.name: rng.standard_normal(p.type.shape, dtype=np.float32) for p, _ in model.graph.bindings}


def _genai_stepper(folder: Path, ctx: int, vocab: int, total_steps: int) -> Callable[[], Any] | None:
    """A Generator whose prompt of ``ctx`` tokens is appended (its prefill), and its next-token
    call; None when onnxruntime-genai is not installed."""
    try:
        import onnxruntime_genai as og
    except ImportError:
        return None
    model = og.Model(str(folder))
    limit = int(json.loads((folder / "genai_config.json").read_text())["model"].get("context_length", 1 << 30))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=min(ctx + total_steps + 2, limit), do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens(np.random.default_rng(0).integers(0, vocab, size=ctx).astype(np.int32))

    def step() -> None:
        gen.generate_next_token()

    step.model = model  # type: ignore[attr-defined]  # the model lives as long as its generator
    return step


def _interleaved(engines: dict[str, Callable[[], Any]], warm: int, steps: int) -> dict[str, float]:
    """ms per call of each engine: a warm-up, then ``BLOCKS`` rounds in which every engine
    runs one block of steps in turn (after an idle pause, so no engine's spinning threads
    steal a core from the next); each engine keeps its best block median. A burst of load
    from other processes then hits every engine's blocks alike."""
    from decode import BLOCKS, _idle

    per = max(3, steps // BLOCKS)
    for step in engines.values():
        for _ in range(warm):
            step()
    best = dict.fromkeys(engines, float("inf"))
    for _ in range(BLOCKS):
        for name, step in engines.items():
            _idle()
            step()
            times = []
            for _ in range(per):
                t0 = time.perf_counter()
                step()
                times.append(time.perf_counter() - t0)
            best[name] = min(best[name], statistics.median(times))
    return {k: v * 1e3 for k, v in best.items()}


def bench_step(path: Path, contexts: list[int], genai_contexts: set[int], threads: int, warm: int,
               steps: int, tmp: Path) -> list[dict[str, Any]]:
    import onnxforge as of
    from decode import BLOCKS
    from onnxforge.kernels_cy.runtime.state import make_state
    from onnxforge.passes.stateful.convert import make_stateful

    info = load_io_info(path)
    stateful = make_stateful(str(path), max_length=POSITIONS, batch=1)
    initial = _random_caches(stateful)
    st = make_state(stateful, initial=initial, threads=threads)
    plain = of.InferenceSession(of.load(str(path)), threads=threads)
    ort_sess = _ort_session(path, threads)
    ids = np.array([[7]], np.int64)
    mask = np.ones((1, POSITIONS), np.int64)
    rng = np.random.default_rng(1)
    # the advancing engines run warm + BLOCKS * (block + 1) steps from ctx
    total = warm + BLOCKS * (max(3, steps // BLOCKS) + 1) + 1
    rows = []
    for ctx in contexts:
        st.reset(initial, lengths=dict.fromkeys(initial, ctx))
        where = [ctx]

        def step() -> None:
            st.run({"input_ids": ids, "attention_mask": mask[:, :where[0] + 1]})
            where[0] += 1

        feeds = {"input_ids": ids, "attention_mask": mask[:, :ctx + 1],
                 **{p.name: rng.standard_normal((1, KV, ctx, HEAD), dtype=np.float32)
                    for p, _ in stateful.graph.bindings}}
        engines: dict[str, Callable[[], Any]] = {
            "inplace": step,
            "of_loop": lambda: plain.run(None, feeds),
            "ort_loop": lambda: ort_sess.run(None, feeds),
        }
        if ctx in genai_contexts:
            genai = _genai_stepper(_genai_folder(path, threads, tmp), ctx, int(info["vocab_size"]), total)
            if genai is not None:
                engines["genai"] = genai
        row: dict[str, Any] = {"ctx": ctx, **_interleaved(engines, warm, steps)}
        row["alloc"] = st.last_run.allocated_bytes
        row["copied"] = st.last_run.copied_bytes
        del engines
        rows.append(row)
        _print_step(row)
    st.close()
    return rows


def _print_step(r: dict[str, Any]) -> None:
    g = r.get("genai")
    gs = f"{g:8.3f}" if g else f"{'-':>8}"
    rg = f"{r['inplace'] / g:9.2f}" if g else f"{'-':>9}"
    print(f"{r['ctx']:>6} {r['inplace']:9.3f} {r['of_loop']:9.3f} {r['ort_loop']:9.3f} {gs} "
          f"{r['inplace'] / r['of_loop']:9.2f} {r['inplace'] / r['ort_loop']:9.2f} {rg} "
          f"{r['alloc']:>10} {r['copied']:>7}", flush=True)


# -- 4. peak RSS in a fresh process ----------------------------------------------------------


def _status_bytes(field: str) -> int:
    """A ``/proc/self/status`` size (VmRSS, VmHWM) in bytes; VmHWM starts anew at exec."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def rss_child(path: Path, ctx: int, threads: int) -> None:
    """Run in a subprocess: load, hold one state, prefill and decode a few steps, print JSON."""
    import onnxforge  # noqa: F401  (imported before the baseline)
    from onnxforge.kernels_cy.runtime.state import make_state
    from onnxforge.passes.stateful.convert import make_stateful

    base = _status_bytes("VmRSS")
    stateful = make_stateful(str(path), max_length=POSITIONS, batch=1)
    caches = {p.name: np.full(p.type.shape, 0.0, np.float32) for p, _ in stateful.graph.bindings}  # resident
    st = make_state(stateful, initial=caches, threads=threads)
    mask = np.ones((1, POSITIONS), np.int64)
    st.run({"input_ids": np.arange(ctx, dtype=np.int64)[None] % 500, "attention_mask": mask[:, :ctx]})
    for i in range(8):
        st.run({"input_ids": np.array([[7]], np.int64), "attention_mask": mask[:, :ctx + i + 1]})
    weights = sum(f.stat().st_size for f in path.parent.glob("*.onnx*"))
    print(json.dumps({"base": base, "peak": _status_bytes("VmHWM"), "weights": weights, "cache": st.cache_bytes}))


def bench_rss(path: Path, threads: int) -> dict[str, int]:
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(threads))
    out = subprocess.run([sys.executable, __file__, "--rss-child", str(path), "--threads", str(threads)],
                         capture_output=True, text=True, check=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


# -- main ----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="fewer steps and contexts")
    ap.add_argument("--cache", type=Path, default=None, help="fixture cache folder")
    ap.add_argument("--rss-child", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.rss_child is not None:
        rss_child(args.rss_child, 256, args.threads)
        return
    cache = args.cache or Path(os.environ.get("ONNXFORGE_FIXTURE_DIR") or REPO / ".fixture-cache")
    warm, steps = (8, 20) if args.quick else (20, 60)
    top = POSITIONS - (warm + steps + 16)
    if args.quick:
        upd_ctx, step_ctx, genai_ctx = [64, 1024, 16384], [64, 256, 1024, 4096], [256, 1024, 4096]
    else:
        upd_ctx = [64, 256, 1024, 4096, 16384]
        step_ctx, genai_ctx = [64, 256, 1024, 4096, top], [256, 1024, 4096]
    print(f"threads={args.threads}; times are the best of 5 block medians of {max(3, steps // 5)} steps, "
          f"the engines' blocks in turn (the in-place update alone: blocks of {UPDATE_BLOCK} steps, "
          "contexts in turn)")

    print("\n1. cache update of one decode step (16 caches [1, 4, ctx, 64] fp32, one token), µs")
    print(f"{'ctx':>6} {'in place':>12} {'of concat':>12} {'ort concat':>12} {'of/inpl':>10} {'ort/inpl':>10}")
    upd = bench_update(upd_ctx, args.threads, warm, steps)
    flat = upd[-1]["inplace"] / upd[0]["inplace"]
    print(f"in place at {upd[-1]['ctx']} / at {upd[0]['ctx']}: {flat:.2f}x (goal <= 1.2x)")

    path = build_all(cache, which="genai_medium")["genai_medium"]
    print("\n2./3. whole decode step of the medium decoder, ms per token "
          "(in place: state; of loop / ort loop: past/present; genai: Generator, shared buffer)")
    print(f"{'ctx':>6} {'in place':>9} {'of loop':>9} {'ort loop':>9} {'genai':>8} {'/of loop':>9} "
          f"{'/ort':>9} {'/genai':>9} {'alloc B':>10} {'copied':>7}")
    with tempfile.TemporaryDirectory(prefix="of-kv-") as tmpd:
        rows = bench_step(path, step_ctx, set(genai_ctx), args.threads, warm, steps, Path(tmpd))
    by = {r["ctx"]: r for r in rows}
    if 1024 in by and 4096 in by:
        grow = {k: by[4096][k] / by[1024][k] for k in ("inplace", "ort_loop", "genai") if by[1024].get(k)}
        print("growth 1024 -> 4096: " + ", ".join(f"{k} {v:.2f}x" for k, v in grow.items()))

    r = bench_rss(path, args.threads)
    mb = 2 ** 20
    print(f"\n4. peak RSS of a fresh process holding weights + one state (capacity {POSITIONS}): "
          f"{(r['peak'] - r['base']) / mb:.0f} MB above its {r['base'] / mb:.0f} MB baseline; "
          f"weights {r['weights'] / mb:.0f} MB + one cache {r['cache'] / mb:.0f} MB = "
          f"{(r['weights'] + r['cache']) / mb:.0f} MB")


if __name__ == "__main__":
    main()
