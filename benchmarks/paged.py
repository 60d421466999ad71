"""Paged KV cache: bytes per token per page format, decode attention time over paged
int8 / int4 (and every other format) against float32 contiguous attention, attention
output error per format, and the attention workspace.

The contiguous peer is the repository's grouped-query attention kernel
(``kernels_cy/attention/_attention.pyx`` ``gqa_attention``, the GroupQueryAttention path) over
float32 [1, Hkv, L, D] caches; the paged runs call ``PagedKVCache.attend`` (the
PagedAttention kernel) on the same keys and values. Shapes are the medium decoder's
(Hq 8, Hkv 4, head_dim 64, one query token). Not part of the test suite.

The last table decodes a real decoder (the onnxruntime-genai fixture: the tiny one, and
the medium one with ``--medium``) converted by ``make_stateful`` with contiguous
in-place caches and with paged caches of several format policies, side by side:
per-token latency after a prompt, and the cache bytes held.

    python benchmarks/paged.py [--quick] [--threads 1] [--page-sizes 16,64] [--footprint-mb 256]
                               [--medium] [--no-decode]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from onnxforge.kernels_cy.attention._attention import gqa_attention
from onnxforge.kernels_cy.paged.pages import PAGE_FORMATS, PagedKVCache, page_nbytes

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

HQ, HKV, D = 8, 4, 64


def _interleaved(fns: dict[str, Callable[[], object]], repeat: int, rounds: int = 5) -> dict[str, float]:
    """Best time per call of each function, measured in alternating rounds so that the
    load of a shared machine falls on every peer alike."""
    best = {name: float("inf") for name in fns}
    for fn in fns.values():
        fn()
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(repeat):
                fn()
            best[name] = min(best[name], (time.perf_counter() - t0) / repeat)
    return best


def _bytes_table(page_size: int) -> None:
    f16 = page_nbytes("float16", HKV, page_size, D) / page_size
    print(f"\nbytes per token (K and V of one layer, Hkv {HKV}, head_dim {D}, page {page_size})")
    print(f"{'format':<10} {'bytes/token':>12} {'vs float16':>11}")
    for fmt in PAGE_FORMATS:
        b = page_nbytes(fmt, HKV, page_size, D) / page_size
        print(f"{fmt:<10} {b:>12.1f} {b / f16:>10.3f}x")


def _contiguous(q: np.ndarray, k: np.ndarray, v: np.ndarray, threads: int) -> Callable[[], np.ndarray]:
    qc = np.ascontiguousarray(q.transpose(0, 2, 1, 3))        # [1, S, Hq, D]
    total = np.array([k.shape[2]], np.int64)
    out = np.empty_like(qc)

    def run() -> np.ndarray:
        gqa_attention(qc, k, v, total, out, 0.0, num_threads=threads)
        return out
    return run


def _hot(n: int, k: np.ndarray, v: np.ndarray, q: np.ndarray, pages: tuple[int, ...], threads: int,
         repeat: int) -> None:
    """One layer called repeatedly: its cache stays in the CPU caches (compute-bound)."""
    base = _contiguous(q, k, v, threads)
    ref = base().transpose(0, 2, 1, 3).copy()
    scale = float(np.abs(ref).max())
    fns: dict[str, Callable[[], object]] = {"float32 contiguous": base}
    caches: dict[str, PagedKVCache] = {}
    for fmt in ("int8", "int4") + tuple(f for f in PAGE_FORMATS if f not in ("int8", "int4")):
        for p in pages:
            c = PagedKVCache(HKV, D, p, -(-n // p), formats=fmt)
            c.update(k, v, 0)
            caches[f"paged {fmt} p{p}"] = c
    for name, c in caches.items():
        fns[name] = (lambda c=c: c.attend(q, num_threads=threads))
    times = _interleaved(fns, repeat)
    t_base = times["float32 contiguous"]
    print(f"{n:>8} {'float32 contiguous':<22} {t_base * 1e3:>9.3f} {1.0:>8.2f} "
          f"{(k.nbytes + v.nbytes) / 2**20:>9.2f} {0.0:>9.1e} {0:>12}")
    for name, c in caches.items():
        err = float(np.abs(c.attend(q) - ref).max()) / scale
        t = times[name]
        print(f"{n:>8} {name:<22} {t * 1e3:>9.3f} {t_base / t:>8.2f} {c.nbytes / 2**20:>9.2f} "
              f"{err:>9.1e} {c.workspace_bytes:>12}")


def _streamed(n: int, k: np.ndarray, v: np.ndarray, q: np.ndarray, pages: tuple[int, ...], threads: int,
              repeat: int, footprint: int) -> None:
    """Several layers attended in turn, as in one decode step, with more float32 cache than
    the CPU caches hold: every call streams its keys and values from memory."""
    layers = max(2, -(-footprint // (k.nbytes + v.nbytes)))
    conts = [(k.copy(), v.copy()) for _ in range(layers)]     # one cache per layer, as the paged ones
    runs = [_contiguous(q, kk, vv, threads) for kk, vv in conts]
    fns: dict[str, Callable[[], object]] = {"float32 contiguous": lambda: [r() for r in runs]}
    for fmt in ("int8", "int4", "float32"):
        for p in pages:
            cs = []
            for _ in range(layers):
                c = PagedKVCache(HKV, D, p, -(-n // p), formats=fmt)
                c.update(k, v, 0)
                cs.append(c)
            fns[f"paged {fmt} p{p}"] = (lambda cs=cs: [c.attend(q, num_threads=threads) for c in cs])
    times = _interleaved(fns, max(1, repeat // 2), rounds=3)
    t_base = times["float32 contiguous"] / layers
    for name, t in times.items():
        t = t / layers
        print(f"{n:>8} {layers:>7} {name:<22} {t * 1e3:>9.3f} {t_base / t:>8.2f}")


def _decode_table(variant: str, prompt_len: int, steps: int, threads: int, repeat: int) -> None:
    """Per-token decode latency: contiguous in-place caches vs paged caches per policy."""
    from onnxforge.kernels_cy.runtime.state import make_state
    from onnxforge.passes.stateful.convert import make_stateful

    from tests.fixtures.decoders import build_all

    root = Path(os.environ.get("ONNXFORGE_FIXTURE_DIR", Path(__file__).resolve().parents[1] / ".fixture-cache"))
    path = str(build_all(root, which=variant)[variant])
    capacity = prompt_len + steps * repeat + 1
    policies = {"contiguous": None, "paged float32": "float32", "paged int8": "int8",
                "paged float32,int8,int4": "float32,int8,int4", "paged int4": "int4"}
    states = {}
    for name, fmt in policies.items():
        opts = {} if fmt is None else {"cache": "paged", "page_size": 16, "formats": fmt}
        st = make_state(make_stateful(path, max_length=capacity, batch=1, **opts), threads=threads)
        st.run({"input_ids": np.ones((1, prompt_len), np.int64),
                "attention_mask": np.ones((1, prompt_len), np.int64)})
        states[name] = [st, prompt_len]

    def step(name: str) -> Callable[[], object]:
        def run() -> object:
            st = states[name]
            st[1] += 1
            return st[0].run({"input_ids": np.ones((1, 1), np.int64),
                              "attention_mask": np.ones((1, st[1]), np.int64)})
        return run

    best = _interleaved({k: step(k) for k in policies}, steps, rounds=repeat)
    print(f"\nwhole decode step, {variant}, after a {prompt_len}-token prompt, threads {threads}; "
          f"ratio = paged / contiguous")
    print(f"{'cache':<26} {'ms/token':>9} {'ratio':>7} {'cache bytes':>12}")
    for name in policies:
        st = states[name][0]
        print(f"{name:<26} {best[name] * 1e3:>9.3f} {best[name] / best['contiguous']:>7.2f} "
              f"{st.last_run.cache_bytes:>12,}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repeats")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--page-sizes", default="16,64", help="page sizes measured side by side")
    ap.add_argument("--footprint-mb", type=int, default=256,
                    help="float32 cache bytes of the streamed run (above the CPU's last-level cache)")
    ap.add_argument("--medium", action="store_true",
                    help="also decode the medium decoder (built on first use, about a minute)")
    ap.add_argument("--no-decode", action="store_true", help="skip the whole-decode table")
    args = ap.parse_args()
    pages = tuple(int(x) for x in args.page_sizes.split(","))
    repeat = 3 if args.quick else 20
    rng = np.random.default_rng(0)
    _bytes_table(pages[0])
    contexts = (4096, 16384)
    kfull = rng.standard_normal((1, HKV, contexts[-1], D)).astype(np.float32)
    vfull = rng.standard_normal((1, HKV, contexts[-1], D)).astype(np.float32)
    q = rng.standard_normal((1, HQ, 1, D)).astype(np.float32)
    print(f"\ndecode attention, one query token, Hq {HQ}, Hkv {HKV}, head_dim {D}, pages of "
          f"{'/'.join(map(str, pages))} tokens (pN), threads "
          f"{args.threads}; speedup = float32 contiguous / paged")
    print("\nhot: one layer repeated (its cache stays in the CPU caches)")
    print(f"{'context':>8} {'cache':<22} {'time ms':>9} {'speedup':>8} {'cache MB':>9} {'max err':>9} "
          f"{'workspace B':>12}")
    for n in contexts:
        _hot(n, np.ascontiguousarray(kfull[:, :, :n]), np.ascontiguousarray(vfull[:, :, :n]), q, pages,
             args.threads, repeat)
    print("max err: max |paged - float32 contiguous| / max |float32 contiguous| (the format's "
          "quantization error; float32 pages are exact up to rounding)")
    print(f"\nstreamed: layers attended in turn, {args.footprint_mb} MB of float32 cache in all "
          f"(memory-bound, as in a decode step); time per layer")
    print(f"{'context':>8} {'layers':>7} {'cache':<22} {'time ms':>9} {'speedup':>8}")
    for n in contexts:
        _streamed(n, np.ascontiguousarray(kfull[:, :, :n]), np.ascontiguousarray(vfull[:, :, :n]), q, pages,
                  args.threads, repeat, args.footprint_mb << 20)
    if not args.no_decode:
        _decode_table("genai_fp32", 256, 8 if args.quick else 32, args.threads, 3 if args.quick else 5)
        if args.medium:
            _decode_table("genai_medium", 1024, 8 if args.quick else 16, args.threads, 3)


if __name__ == "__main__":
    main()
