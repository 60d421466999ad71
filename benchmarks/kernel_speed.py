"""Micro-benchmarks of the Cython kernels against numpy and one-node onnxruntime models.

Prints one table: time per call of each kernel and its peers, and the ratio
peer / ours (above 1 means the kernel is faster). Shapes are those of the medium
decoder (hidden 512, 8 heads, 4 KV heads, head_dim 64). Not part of the test suite.

    python benchmarks/kernel_speed.py [--threads 2] [--repeat 200]
"""
from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

from onnxforge.kernels_cy.attention._attention import gqa_attention
from onnxforge.kernels_cy.cache._cache import cache_update
from onnxforge.kernels_cy.matmul._matmul_nbits import matmul_nbits
from onnxforge.kernels_cy.norm._norm import rms_norm, skip_rms_norm
from onnxforge.kernels_cy.attention._rotary import rotary
from onnxforge.kernels_cy.ops._softmax import softmax

_ONNX = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.int32): TensorProto.INT32,
         np.dtype(np.int64): TensorProto.INT64, np.dtype(np.uint8): TensorProto.UINT8}


def _best(fn: Callable[[], object], repeat: int) -> float:
    for _ in range(max(3, repeat // 10)):
        fn()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(repeat):
            fn()
        best = min(best, (time.perf_counter() - t0) / repeat)
    return best


def _ort_node(op: str, feeds: dict[str, np.ndarray], n_out: int, threads: int,
              domain: str = "com.microsoft", **attrs: object) -> Callable[[], object]:
    inputs = [helper.make_tensor_value_info(k, _ONNX[v.dtype], list(v.shape)) for k, v in feeds.items()]
    outs = [f"o{i}" for i in range(n_out)]
    node = helper.make_node(op, list(feeds), outs, domain=domain, **attrs)
    graph = helper.make_graph([node], "g", inputs, [helper.make_empty_tensor_value_info(o) for o in outs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid("com.microsoft", 1)], ir_version=10)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return lambda: sess.run(None, feeds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=200)
    args = ap.parse_args()
    nt, rep = args.threads, args.repeat
    rng = np.random.default_rng(0)
    rows: list[tuple[str, float, dict[str, float]]] = []

    def row(name: str, ours: Callable[[], object], **peers: Callable[[], object]) -> None:
        t = _best(ours, rep)
        rows.append((name, t, {k: _best(v, rep) for k, v in peers.items()}))

    H = 512
    for r in (1, 64):
        x = rng.standard_normal((r, H)).astype(np.float32)
        s = rng.standard_normal((r, H)).astype(np.float32)
        w = rng.standard_normal(H).astype(np.float32)
        out, tot = np.empty_like(x), np.empty_like(x)
        row(f"rms_norm [{r}, {H}]", lambda: rms_norm(x, w, 1e-6, out, nt),
            numpy=lambda: x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * w)
        row(f"skip_rms_norm [{r}, {H}]", lambda: skip_rms_norm(x, s, None, w, 1e-6, out, tot, nt),
            ort=_ort_node("SkipSimplifiedLayerNormalization",
                          {"x": x[None], "s": s[None], "w": w}, 4, nt, epsilon=1e-6))
    for n in (256, 4096):
        x = rng.standard_normal((8, n)).astype(np.float32)
        out = np.empty_like(x)

        def np_softmax(x=x):
            e = np.exp(x - x.max(-1, keepdims=True))
            return e / e.sum(-1, keepdims=True)
        row(f"softmax [8, {n}]", lambda: softmax(x, out, nt), numpy=np_softmax)
    Hq, Hkv, D = 8, 4, 64
    cos = np.cos(rng.uniform(0, 6, (8192, D // 2))).astype(np.float32)
    sin = np.sin(rng.uniform(0, 6, (8192, D // 2))).astype(np.float32)
    q1 = rng.standard_normal((1, 1, Hq, D)).astype(np.float32)
    qo = np.empty_like(q1)
    start = np.array([1000], np.int64)

    def np_rotary():
        c, s_ = cos[1000], sin[1000]
        a, b = q1[..., :32], q1[..., 32:]
        return np.concatenate([a * c - b * s_, b * c + a * s_], -1)
    row("rotary [1, 1, 8, 64]", lambda: rotary(q1, cos, sin, qo, start=start, num_threads=nt),
        numpy=np_rotary)
    for ctx in (256, 1024, 4096):
        cap = 4096 + 64
        kc = rng.standard_normal((1, Hkv, cap, D)).astype(np.float32)
        vc = rng.standard_normal((1, Hkv, cap, D)).astype(np.float32)
        total = np.array([ctx], np.int64)
        out = np.empty_like(q1)
        kv, vv = kc[0, :, :ctx], vc[0, :, :ctx]

        def np_attn(kv=kv, vv=vv):
            qs = q1[0, 0].reshape(Hkv, Hq // Hkv, D)
            sc = np.einsum("gtd,gqd->gqt", kv, qs) / 8.0
            e = np.exp(sc - sc.max(-1, keepdims=True))
            return np.einsum("gqt,gtd->gqd", e / e.sum(-1, keepdims=True), vv)
        feeds = {"q": q1.reshape(1, 1, Hq * D), "k": rng.standard_normal((1, 1, Hkv * D)).astype(np.float32),
                 "v": rng.standard_normal((1, 1, Hkv * D)).astype(np.float32),
                 "pk": np.ascontiguousarray(kc[:, :, :ctx - 1]), "pv": np.ascontiguousarray(vc[:, :, :ctx - 1]),
                 "sl": np.array([ctx - 1], np.int32), "t": np.array(ctx, np.int32)}
        row(f"gqa_attention decode ctx {ctx}",
            lambda kc=kc, vc=vc, total=total, out=out: gqa_attention(q1, kc, vc, total, out, num_threads=nt),
            numpy=np_attn,
            ort_past_present=_ort_node("GroupQueryAttention", feeds, 3, nt, num_heads=Hq, kv_num_heads=Hkv))
    for M, K, N in ((1, 512, 1536), (1, 1536, 512), (64, 512, 1536)):
        blk = 32
        nblk = K // blk
        bq = rng.integers(0, 256, size=(N, nblk, blk // 2)).astype(np.uint8)
        sc = rng.uniform(0.01, 0.1, N * nblk).astype(np.float32)
        a = rng.standard_normal((M, K)).astype(np.float32)
        out = np.empty((M, N), np.float32)
        wf = rng.standard_normal((K, N)).astype(np.float32)
        row(f"matmul_nbits [{M}, {K}] x [{K}, {N}]",
            lambda a=a, bq=bq, sc=sc, out=out, K=K, N=N: matmul_nbits(a, bq, sc, None, K, N, out,
                                                                      num_threads=nt),
            ort_level0=_ort_node("MatMulNBits", {"a": a, "b": bq, "s": sc}, 1, nt, K=K, N=N, bits=4,
                                 block_size=blk, accuracy_level=0),
            numpy_fp32_matmul=lambda a=a, wf=wf: a @ wf)
    for ctx in (64, 16384):
        cache = np.zeros((1, 8, ctx + 1, 128), np.float16)
        cache += 0
        val = np.ones((1, 8, 1, 128), np.float16)

        def np_slice(cache=cache, ctx=ctx):
            cache[:, :, ctx:ctx + 1] = val
        row(f"cache_update ctx {ctx}", lambda cache=cache, ctx=ctx: cache_update(cache, val, ctx),
            numpy_slice=np_slice, numpy_concat=lambda cache=cache, ctx=ctx: np.concatenate(
                [cache[:, :, :ctx], val], axis=2))

    print(f"threads={nt}; times per call in microseconds; ratio = peer / ours (>1: ours faster)")
    print(f"{'kernel':40s} {'ours':>9s}  peers")
    for name, t, peers in rows:
        cells = "  ".join(f"{k} {v * 1e6:9.1f} ({v / t:5.2f}x)" for k, v in peers.items())
        print(f"{name:40s} {t * 1e6:9.1f}  {cells}")


if __name__ == "__main__":
    main()
