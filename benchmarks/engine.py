"""Many requests at once on the medium decoder: ``of.Engine`` against (a) one
``of.make_state`` decoding the requests one after another and (b) the
onnxruntime-genai Generator decoding them as one padded batch.

Eight requests with prompts of 256 to 1,024 tokens and 64 new tokens each (greedy, no
end-of-sequence stop), all added at once, 2 threads per engine. Two throughputs:

- **decode-only**: tokens from steps without a prefill chunk / the time in those steps
  (for (a): every step after a prompt's prefill; for (b): every ``generate_next_token``
  after ``append_tokens``);
- **end to end**: from the first ``add`` (or prompt) to the last token.

Before timing (b), its padded batch is checked to give each prompt's greedy tokens (the
first 8 tokens against the prompt decoded alone); a mismatch is printed. A last table
compares one 1,024-token prefill of the medium decoder on our backend with
onnxruntime's session on the past/present model. Ratios above 1 mean onnxforge is
faster. Fixtures are built into ``.fixture-cache/`` (or ``$ONNXFORGE_FIXTURE_DIR``)
when missing. Not part of the test suite.

    python benchmarks/engine.py [--threads 2] [--requests 8] [--new 64] [--quick]
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.fixtures.decoders import build_all  # noqa: E402


def _idle() -> None:
    gc.collect()
    time.sleep(0.3)


def _prompts(n: int, lo: int, hi: int, vocab: int) -> list[list[int]]:
    rng = np.random.default_rng(0)
    lengths = np.linspace(lo, hi, n).astype(int)
    return [[int(t) for t in rng.integers(3, vocab, k)] for k in lengths]  # 0..2: pad, bos, eos


def engine_run(path: Path, prompts: list[list[int]], new: int, threads: int) -> dict[str, Any]:
    import onnxforge as of

    longest = max(len(q) for q in prompts) + new
    with of.Engine(str(path), max_sequences=len(prompts), max_length=longest, threads=threads) as eng:
        warm = eng.add(prompts[0][:64], 4, eos_token_id=())  # compile-time work and first-call costs
        eng.run()
        eng.result(warm)
        _idle()
        t0 = time.perf_counter()
        rids = [eng.add(q, new, eos_token_id=()) for q in prompts]
        decode_s, decode_tokens = 0.0, 0
        while eng.stats["running"] or eng.stats["waiting"]:
            s0 = time.perf_counter()
            produced = eng.step()
            dt = time.perf_counter() - s0
            if eng.last_step.get("prefill_rows", 1) == 0:
                decode_s += dt
                decode_tokens += len(produced)
        total = time.perf_counter() - t0
        tokens = [eng.result(r) for r in rids]
        stats = eng.stats
    return {"tokens": tokens, "total_s": total, "decode_tps": decode_tokens / decode_s if decode_s else 0.0,
            "e2e_tps": sum(map(len, tokens)) / total, "steps": stats["steps"]}


def sequential_run(path: Path, prompts: list[list[int]], new: int, threads: int) -> dict[str, Any]:
    import onnxforge as of

    longest = max(len(q) for q in prompts) + new
    sess = of.InferenceSession(of.make_stateful(str(path), longest, batch=1), threads=threads)

    def one(prompt: list[int], n: int, st: Any) -> tuple[list[int], float]:
        r = st.run({"input_ids": np.array([prompt], np.int64),
                    "attention_mask": np.ones((1, len(prompt)), np.int64)})
        t = int(r["logits"][0, -1].argmax())
        out, total = [t], len(prompt) + 1
        d0 = time.perf_counter()
        for _ in range(n - 1):
            r = st.run({"input_ids": np.array([[t]], np.int64), "attention_mask": np.ones((1, total), np.int64)})
            t = int(r["logits"][0, -1].argmax())
            out.append(t)
            total += 1
        return out, time.perf_counter() - d0

    one(prompts[0][:64], 4, of.make_state(sess))
    _idle()
    t0 = time.perf_counter()
    tokens, decode_s = [], 0.0
    for q in prompts:
        with of.make_state(sess) as st:
            out, d = one(q, new, st)
        tokens.append(out)
        decode_s += d
    total = time.perf_counter() - t0
    return {"tokens": tokens, "total_s": total, "decode_tps": len(prompts) * (new - 1) / decode_s,
            "e2e_tps": sum(map(len, tokens)) / total}


def _genai_folder(path: Path, threads: int, tmp: Path) -> Path:
    dst = tmp / "genai"
    if not dst.exists():
        shutil.copytree(path.parent, dst)
        cfg = json.loads((dst / "genai_config.json").read_text())
        cfg["model"]["decoder"].setdefault("session_options", {})["intra_op_num_threads"] = threads
        (dst / "genai_config.json").write_text(json.dumps(cfg, indent=2))
    return dst


def genai_run(folder: Path, prompts: list[list[int]], new: int) -> dict[str, Any]:
    import onnxruntime_genai as og

    model = og.Model(str(folder))
    width = max(len(q) for q in prompts)
    padded = np.zeros((len(prompts), width), np.int32)  # pad_token_id 0, on the left
    for k, q in enumerate(prompts):
        padded[k, width - len(q):] = q

    def generate(batch: np.ndarray, n: int) -> tuple[list[list[int]], float, float]:
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=batch.shape[1] + n, min_length=batch.shape[1] + n,
                                  do_sample=False, batch_size=batch.shape[0])
        gen = og.Generator(model, params)
        t0 = time.perf_counter()
        gen.append_tokens(batch)
        d0 = time.perf_counter()
        for _ in range(n):
            gen.generate_next_token()
        t1 = time.perf_counter()
        seqs = [list(gen.get_sequence(k))[batch.shape[1]:] for k in range(batch.shape[0])]
        return seqs, t1 - t0, t1 - d0

    generate(padded[:, -64:], 4)
    _idle()
    tokens, total, decode = generate(padded, new)
    return {"tokens": tokens, "total_s": total, "decode_tps": len(prompts) * (new - 1) / decode,
            "e2e_tps": sum(map(len, tokens)) / total}


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def shared_prompt(path: Path, n: int, requests: int, new: int, threads: int) -> dict[str, Any]:
    """``requests`` requests with one ``n``-token prompt: the second added after the first's
    first token; pages held against one request's, times to first token."""
    import onnxforge as of

    prompt = _prompts(1, n, n, 512)[0]
    with of.Engine(str(path), max_sequences=requests, max_length=n + new, threads=threads,
                   max_step_tokens=max(256, n)) as eng:
        warm = eng.add(prompt[::-1], 2, eos_token_id=())  # first-call costs
        eng.run()
        eng.result(warm)
        _idle()
        first = eng.add(prompt, new, eos_token_id=())
        while first not in eng.stats["ttft_ms"]:
            eng.step()
        second = eng.add(prompt, new, eos_token_id=())
        while second not in eng.stats["ttft_ms"]:
            eng.step()
        others = [second] + [eng.add(prompt, new, eos_token_id=()) for _ in range(requests - 2)]
        eng.step()
        st = eng.stats
        layers, p = eng._pool.layers, eng.page_size
        one = -(-(n + 1) // p) * layers
        new_pages = (requests - 1) * layers  # each newcomer's own last page
        eng.run()
        return {"pages_in_use": st["pages_in_use"], "one_request_pages": one, "new_token_pages": new_pages,
                "ttft_first_ms": st["ttft_ms"][first], "ttft_second_ms": st["ttft_ms"][others[0]]}


def small_pool_memory(path: Path, prompts: list[list[int]], new: int, threads: int) -> dict[str, Any]:
    """A pool of a third of the requests' pages: preemptions, resident memory growth against
    the pool's largest use."""
    import onnxforge as of

    longest = max(len(q) for q in prompts) + new
    probe = of.Engine(str(path), max_sequences=len(prompts), max_length=longest, threads=threads)
    page = probe._pool.page_bytes * probe._pool.layers
    probe.close()
    need = sum(-(-(len(q) + new) // 16) + 1 for q in prompts) * page
    with of.Engine(str(path), max_sequences=len(prompts), max_length=longest, threads=threads,
                   pool_bytes=need // 3) as eng:
        warm = eng.add(prompts[0], 2, eos_token_id=())  # first-call costs (BLAS buffers, workspaces)
        eng.run()
        eng.result(warm)
        gc.collect()
        base, peak, used = _rss(), 0, 0
        for q in prompts:
            eng.add(q, new, eos_token_id=())
        while eng.stats["running"] or eng.stats["waiting"]:
            eng.step()
            peak = max(peak, _rss())
            used = max(used, eng.stats["used_bytes"])
        return {"preemptions": eng.stats["preemptions"], "rss_growth": peak - base, "pool_used": used,
                "pool_bytes": eng.stats["pool_bytes"]}


def prefill_ms(path: Path, n: int, threads: int) -> tuple[float, float]:
    """One ``n``-token prefill: onnxforge (stateful session) and onnxruntime (past/present)."""
    import onnxruntime as ort

    import onnxforge as of

    sess = of.InferenceSession(of.make_stateful(str(path), n + 1, batch=1), threads=threads)
    ids = np.random.default_rng(1).integers(3, 512, (1, n)).astype(np.int64)
    mask = np.ones((1, n), np.int64)

    def ours() -> None:
        with of.make_state(sess) as st:
            st.run({"input_ids": ids, "attention_mask": mask})

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    ref = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    feeds: dict[str, Any] = {"input_ids": ids, "attention_mask": mask}
    dec = json.loads((path.parent / "genai_config.json").read_text())["model"]["decoder"]
    for i in ref.get_inputs():
        if i.name.startswith("past_key_values"):
            feeds[i.name] = np.zeros((1, dec["num_key_value_heads"], 0, dec["head_size"]), np.float32)

    def theirs() -> None:
        ref.run(None, feeds)

    best = []
    for f in (ours, theirs):
        f()
        _idle()
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            f()
            times.append(time.perf_counter() - t0)
        best.append(min(times) * 1e3)
    return best[0], best[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--quick", action="store_true", help="prompts of 64-256 tokens, 16 new tokens")
    args = ap.parse_args()
    lo, hi, new = (64, 256, 16) if args.quick else (256, 1024, args.new)
    cache = Path(os.environ.get("ONNXFORGE_FIXTURE_DIR", REPO / ".fixture-cache"))
    path = build_all(cache, which="genai_medium")["genai_medium"]
    vocab = json.loads((path.parent / "genai_config.json").read_text())["model"]["vocab_size"]
    prompts = _prompts(args.requests, lo, hi, vocab)
    print(f"medium decoder, {len(prompts)} requests, prompts {lo}-{hi} tokens, {new} new each, "
          f"{args.threads} threads")
    eng = engine_run(path, prompts, new, args.threads)
    seq = sequential_run(path, prompts, new, args.threads)
    agree = sum(a == b for a, b in zip(eng["tokens"], seq["tokens"]))
    print(f"engine tokens equal the sequential ones for {agree}/{len(prompts)} requests")
    with tempfile.TemporaryDirectory() as tmp:
        folder = _genai_folder(path, args.threads, Path(tmp))
        gen = genai_run(folder, prompts, new)
    same = sum(a[:8] == b[:8] for a, b in zip(gen["tokens"], seq["tokens"]))
    print(f"onnxruntime-genai's padded batch gives each prompt's first 8 tokens for {same}/{len(prompts)} requests")
    print(f"{'':28}{'decode tok/s':>14}{'end-to-end tok/s':>18}")
    for name, r in (("of.Engine", eng), ("(a) make_state, one by one", seq), ("(b) genai Generator, batch", gen)):
        print(f"{name:28}{r['decode_tps']:>14.1f}{r['e2e_tps']:>18.1f}")
    print(f"engine / (a): decode {eng['decode_tps'] / seq['decode_tps']:.2f}x (goal 4.0x), "
          f"end to end {eng['e2e_tps'] / seq['e2e_tps']:.2f}x (goal 1.5x)")
    print(f"engine / (b): decode {eng['decode_tps'] / gen['decode_tps']:.2f}x (goal 1.0x), "
          f"end to end {eng['e2e_tps'] / gen['e2e_tps']:.2f}x (goal 1.2x)")
    sp = shared_prompt(path, hi, len(prompts), new, args.threads)
    bound = 1.15 * sp["one_request_pages"] + sp["new_token_pages"]
    print(f"{len(prompts)} requests sharing a {hi}-token prompt hold {sp['pages_in_use']} pages; one request "
          f"{sp['one_request_pages']}, bound 1.15x + new tokens {bound:.0f} "
          f"({'ok' if sp['pages_in_use'] <= bound else 'OVER'}); time to first token {sp['ttft_first_ms']:.0f} ms "
          f"then {sp['ttft_second_ms']:.1f} ms (ratio {sp['ttft_second_ms'] / sp['ttft_first_ms']:.3f}, goal <= 0.1)")
    mem = small_pool_memory(path, prompts, new, args.threads)
    print(f"pool of {mem['pool_bytes'] / 2**20:.1f} MiB: {mem['preemptions']} preemptions; resident memory grew "
          f"{mem['rss_growth'] / 2**20:.1f} MiB for {mem['pool_used'] / 2**20:.1f} MiB of pages at most "
          f"(bound: pages + 64 MiB)")
    ours, theirs = prefill_ms(path, hi, args.threads)
    print(f"{hi}-token prefill: onnxforge {ours:.0f} ms, onnxruntime {theirs:.0f} ms "
          f"(ratio {ours / theirs:.2f}, goal at most 1.0)")


if __name__ == "__main__":
    main()
