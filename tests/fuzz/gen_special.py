"""Generators for quantization, attention-family, control-flow and ai.onnxforge operators.

Control flow gets one-level bodies drawn from a small table (each body a few nodes
reading an outer value); CacheUpdate is checked against a float64 numpy oracle on a
READ_WRITE model built with GraphBuilder; the paged operators need a paged state and
are skipped here (tests/kernels_cy/test_paged_*.py check them against paged_ref)."""
from __future__ import annotations

from typing import Any

import numpy as np
from onnx import TensorProto, helper

from tests.fuzz.case import BF16, F16, F32, Case, Draw, Skip, onnx_type, typed_outputs

__all__ = ["GENERATORS"]

I64 = np.dtype(np.int64)
I32 = np.dtype(np.int32)
MS = "com.microsoft"


# -- quantization --------------------------------------------------------------------------
def _qparams(d: Draw, shape: tuple[int, ...], qtype: np.dtype) -> tuple[np.ndarray, np.ndarray | None, dict]:
    """scale (and zero point) per tensor, per axis or blocked, with their attributes."""
    kind = d.pick(["tensor", "axis", "block"]) if shape else "tensor"
    attrs: dict[str, Any] = {}
    if kind == "tensor":
        pshape: tuple[int, ...] = ()
    else:
        a = d.int(-len(shape), len(shape) - 1)
        attrs["axis"] = a
        if kind == "axis":
            pshape = (shape[a],)
        else:
            bs = d.int(1, 3)
            attrs["block_size"] = bs
            ps = list(shape)
            ps[a] = -(-shape[a] // bs)
            pshape = tuple(ps)
    scale = (d.rng.uniform(0.01, 2, size=pshape)).astype(F32)
    zp = None
    if d.chance(0.6):
        info = np.iinfo(qtype)
        zp = d.rng.integers(int(info.min), int(info.max) + 1, size=pshape).astype(qtype)
    return scale, zp, attrs


def quantize(d: Draw) -> Case:
    qtype = d.pick([np.dtype(np.uint8), np.dtype(np.int8), np.dtype(np.int16), np.dtype(np.uint16)])
    # no NaN or inf: both oracles send them through an undefined float -> int cast
    x = d.values(F32, d.shape(), lo=-300, hi=300, special=0.0)
    scale, zp, attrs = _qparams(d, x.shape, qtype)
    if zp is None and qtype != np.uint8:
        attrs["output_dtype"] = onnx_type(np.zeros(0, qtype))
    case = Case("QuantizeLinear", [("x", x), ("scale", scale), ("zp", zp)], attrs)
    case.atol = 1.0  # round-half-to-even against a division rounded in float32: one step at a tie
    return case


def dequantize(d: Draw) -> Case:
    qtype = d.pick([np.dtype(np.uint8), np.dtype(np.int8), np.dtype(np.int32), np.dtype(np.int16)])
    x = d.values(qtype, d.shape(), lo=-1000, hi=1000)
    scale, zp, attrs = _qparams(d, x.shape, qtype if qtype != I32 else np.dtype(np.int8))
    if qtype == I32:
        zp = None
    elif zp is not None:
        zp = zp.astype(qtype)
    return Case("DequantizeLinear", [("x", x), ("scale", scale), ("zp", zp)], attrs)


# -- rotary embeddings ---------------------------------------------------------------------
def rotary(d: Draw) -> Case:
    b, s, n = d.int(1, 2), d.int(1, 4), d.int(1, 3)
    h = d.pick([2, 4, 8])
    rot = h if d.chance(0.7) else d.pick([r for r in (2, 4) if r <= h])
    dt = d.pick([F32, F32, F16])
    four = d.chance(0.5)
    x = d.values(dt, (b, n, s, h) if four else (b, s, n * h), special=0.0)
    attrs: dict[str, Any] = {"interleaved": d.int(0, 1)}
    if rot != h:
        attrs["rotary_embedding_dim"] = rot
    if not four or d.chance(0.3):
        attrs["num_heads"] = n
    if d.chance(0.6):
        rows = d.int(1, 8)
        cos = d.values(dt, (rows, rot // 2), special=0.0)
        sin = d.values(dt, (rows, rot // 2), special=0.0)
        pos = d.indices(rows, (b, s), hostile=0.0)
        pos = np.where(pos < 0, pos + rows, pos)
        if d.chance(0.05):
            pos[0, 0] = d.pick([rows, -1])
        ins = [("x", x), ("cos", cos), ("sin", sin), ("pos", pos)]
    else:
        ins = [("x", x), ("cos", d.values(dt, (b, s, rot // 2), special=0.0)),
               ("sin", d.values(dt, (b, s, rot // 2), special=0.0))]
    case = Case("RotaryEmbedding", ins, attrs)
    if len(ins) == 4 and (ins[3][1] < 0).any():
        case.oracle = "ort"  # onnx.reference wraps a negative position like numpy
    if dt == F16:
        case.rtol, case.atol = 2e-3, 2e-3
    return case


def ms_rotary(d: Draw) -> Case:
    b, s, n = d.int(1, 2), d.int(1, 4), d.int(1, 3)
    h = d.pick([2, 4, 8, 16])
    x = d.values(F32, (b, s, n * h), special=0.0)
    rows = d.int(s, 12)
    cos = d.values(F32, (rows, h // 2), special=0.0)
    sin = d.values(F32, (rows, h // 2), special=0.0)
    if d.chance(0.3):
        pos = np.array([d.int(0, rows - s)], I64)
    else:
        pos = d.rng.integers(0, rows, size=(b, s)).astype(I64)
    if d.chance(0.06):
        pos.reshape(-1)[0] = d.pick([rows, -1, rows + 5])
    attrs = {"interleaved": d.int(0, 1), "num_heads": n}
    return Case("RotaryEmbedding", [("x", x), ("pos", pos), ("cos", cos), ("sin", sin)], attrs, domain=MS,
                oracle="ort", opset=21)


# -- attention -----------------------------------------------------------------------------
def attention(d: Draw) -> Case:
    b, nkv = d.int(1, 2), d.int(1, 2)
    nq = nkv * d.int(1, 2)
    s, kvl, h = d.int(1, 4), d.int(1, 5), d.pick([2, 4, 8])
    hv = h if d.chance(0.8) else d.pick([2, 4])
    past = d.int(1, 3) if d.chance(0.3) else 0
    four = d.chance(0.6)
    if four:
        q, k, v = (d.values(F32, (b, nq, s, h)), d.values(F32, (b, nkv, kvl, h)), d.values(F32, (b, nkv, kvl, hv)))
        attrs: dict[str, Any] = {}
    else:
        q, k, v = (d.values(F32, (b, s, nq * h)), d.values(F32, (b, kvl, nkv * h)), d.values(F32, (b, kvl, nkv * hv)))
        attrs = {"q_num_heads": nq, "kv_num_heads": nkv}
    for a in (q, k, v):
        np.nan_to_num(a, copy=False, nan=0.0, posinf=3.0, neginf=-3.0)
    total = kvl + past
    mask = None
    if d.chance(0.4):
        mshape = d.pick([(s, total), (1, s, total), (b, 1, s, total), (b, nq, s, total)])
        mask = (d.rng.random(mshape) < 0.8) if d.chance(0.5) else d.values(F32, mshape, lo=-5, hi=0, special=0)
    pk = d.values(F32, (b, nkv, past, h), special=0) if past else None
    pv = d.values(F32, (b, nkv, past, hv), special=0) if past else None
    if d.chance(0.3):
        attrs["is_causal"] = 1
    if d.chance(0.3):
        attrs["scale"] = d.pick([0.5, 0.125])
    if d.chance(0.15):
        attrs["softcap"] = d.pick([5.0, 30.0])
    n_out = 3 if past else 1
    ins = [("q", q), ("k", k), ("v", v), ("mask", mask), ("pk", pk), ("pv", pv)]
    while ins[-1][1] is None:
        ins.pop()
    case = Case("Attention", ins, attrs, n_out=n_out)
    case.rtol, case.atol = 1e-4, 1e-5
    return case


def gqa(d: Draw) -> Case:
    b, nkv = 1, d.int(1, 2)
    nq = nkv * d.int(1, 2)
    h = d.pick([8, 16])  # onnxruntime wants a multiple of 8
    past = d.int(0, 4)
    s = 1 if past and d.chance(0.6) else d.int(1, 4)
    total = past + s
    q = d.values(F32, (b, s, nq * h), special=0)
    k = d.values(F32, (b, s, nkv * h), special=0)
    v = d.values(F32, (b, s, nkv * h), special=0)
    pk = d.values(F32, (b, nkv, past, h), special=0)
    pv = d.values(F32, (b, nkv, past, h), special=0)
    seqlens = np.full((b,), total - 1, I32)
    tsl = np.array(total, I32)
    attrs: dict[str, Any] = {"num_heads": nq, "kv_num_heads": nkv}
    if d.chance(0.3):
        attrs["scale"] = 0.25
    if d.chance(0.2):
        attrs["softcap"] = 10.0
    if d.chance(0.2):
        attrs["local_window_size"] = d.int(1, 4)
    ins = [("q", q), ("k", k), ("v", v), ("pk", pk), ("pv", pv), ("seqlens_k", seqlens), ("tsl", tsl)]
    if d.chance(0.3) and h % 16 == 0:  # onnxruntime rotates only heads of a multiple of 16
        rows = total + d.int(0, 4)
        ins += [("cos", d.values(F32, (rows, h // 2), special=0)), ("sin", d.values(F32, (rows, h // 2), special=0))]
        attrs["do_rotary"] = 1
        attrs["rotary_interleaved"] = d.int(0, 1)
    case = Case("GroupQueryAttention", ins, attrs, n_out=3, domain=MS, oracle="ort", opset=21)
    case.rtol, case.atol = 1e-4, 1e-5
    return case


def matmul_nbits(d: Draw) -> Case:
    bs = d.pick([16, 32])
    k = bs * d.int(1, 3) - (d.int(0, 3) if d.chance(0.2) else 0)
    n, m = d.int(1, 6), d.pick([1, 1, 2, 3])
    nblk = -(-k // bs)
    a = d.values(F32, (m, k), special=0)
    codes = d.rng.integers(0, 256, size=(n, nblk, bs // 2)).astype(np.uint8)
    scales = d.rng.uniform(0.01, 0.5, size=n * nblk).astype(F32)
    zp = None
    if d.chance(0.5):
        zp = d.rng.integers(0, 256, size=n * -(-nblk // 2)).astype(np.uint8)
    ins = [("a", a), ("b", codes), ("scales", scales), ("zp", zp)]
    while ins[-1][1] is None:
        ins.pop()
    consts = frozenset({"b", "scales", "zp"}) if d.chance(0.5) else frozenset()
    case = Case("MatMulNBits", ins, {"K": k, "N": n, "bits": 4, "block_size": bs}, domain=MS, oracle="ort",
                opset=21, consts=consts)
    case.rtol, case.atol = 1e-4, 1e-4
    return case


# -- ai.onnxforge CacheUpdate --------------------------------------------------------------
def cache_update(d: Draw) -> Case:
    dt = d.pick([F32, F16, BF16, np.dtype(np.int8), np.dtype(np.uint8)])
    b, h, cap, hd = d.int(1, 2), d.int(1, 2), d.int(0, 8), d.int(1, 4)
    n = d.int(0, cap) if cap else 0
    per_row = d.chance(0.3)
    hi = max(cap - n, 0)
    pos = np.array([d.int(0, hi) for _ in range(b)], I64) if per_row else np.array(d.int(0, hi), I64)
    if d.chance(0.08):
        pos = pos + d.pick([cap + 1, -1 - int(pos.max())])
    cache = d.values(dt if dt != BF16 else F32, (b, h, cap, hd), special=0).astype(dt)
    values = d.values(dt if dt != BF16 else F32, (b, h, n, hd), special=0).astype(dt)

    def oracle(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        c, vals, p = feeds["cache"], feeds["values"], feeds["pos"]
        out = c.copy()
        for r in range(c.shape[0]):
            start = int(p) if p.ndim == 0 else int(p[r])
            if start < 0 or start + vals.shape[2] > c.shape[2]:
                raise IndexError(f"position {start} + {vals.shape[2]} outside the capacity {c.shape[2]}")
            out[r, :, start:start + vals.shape[2]] = vals[r]
        return [out]

    def build(case: Case) -> Any:
        from onnxforge.graphbuilder.builder.graph_builder import GraphBuilder
        from onnxforge.graphbuilder.ir.core import READ_WRITE

        g = GraphBuilder(opset=23)
        et = onnx_type(cache)
        c = g.input("cache", et, list(cache.shape), access=READ_WRITE)
        v = g.input("values", et, list(values.shape))
        p = g.input("pos", TensorProto.INT64, list(pos.shape))
        g.output(g.op.CacheUpdate(c, v, p), "y0")
        return g.to_model()

    return Case("CacheUpdate", [("cache", cache), ("values", values), ("pos", pos)], domain="ai.onnxforge",
                oracle=oracle, build=build, node_name="CacheUpdate")


def paged(d: Draw) -> Case:
    raise Skip("paged operators need a paged cache state (covered by tests/kernels_cy/test_paged_*.py "
               "and, for the ragged batch forms, tests/kernels_cy/test_ragged.py)")


# -- control flow ----------------------------------------------------------------------------
def _vi(name: str, a: np.ndarray | None = None, elem: int | None = None, shape: Any = None) -> Any:
    if a is not None:
        return helper.make_tensor_value_info(name, onnx_type(a), list(a.shape))
    return helper.make_tensor_value_info(name, elem, shape)


# one-level branch bodies: (nodes reading outer "x", "c" -> output "out")
BRANCHES = {
    "add": [helper.make_node("Add", ["x", "c"], ["out"])],
    "mul_neg": [helper.make_node("Mul", ["x", "c"], ["t"]), helper.make_node("Neg", ["t"], ["out"])],
    "reduce": [helper.make_node("ReduceSum", ["x"], ["out"], keepdims=1)],
    "identity": [helper.make_node("Identity", ["c"], ["out"])],
    "softmax": [helper.make_node("Softmax", ["x"], ["out"])],
}


def if_(d: Draw) -> Case:
    shp = d.shape(lo=1, hi=3)
    x, c = d.values(F32, shp), d.values(F32, shp[d.int(0, len(shp)):])
    cond = np.array(d.chance(0.5))
    then_b, else_b = d.pick(list(BRANCHES)), d.pick(list(BRANCHES))
    branches = {}
    for attr, key in (("then_branch", then_b), ("else_branch", else_b)):
        branches[attr] = helper.make_graph(BRANCHES[key], f"{attr}_{key}", [],
                                           [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)])
    names = ["cond", "x", "c"]

    def build(case: Case) -> Any:
        node = helper.make_node("If", ["cond"], ["y0"], name="n0", **branches)
        ident = [helper.make_node("Identity", [n], [f"{n}_use"]) for n in names[1:]]
        g = helper.make_graph([node] + ident, "fuzz", [_vi("cond", cond), _vi("x", x), _vi("c", c)],
                              [helper.make_empty_tensor_value_info("y0")] +
                              [helper.make_empty_tensor_value_info(f"{n}_use") for n in names[1:]])
        return typed_outputs(helper.make_model(g, opset_imports=[helper.make_opsetid("", 23)], ir_version=10))

    return Case("If", [("cond", cond), ("x", x), ("c", c)], build=build, n_out=3)


def loop(d: Draw) -> Case:
    shp = d.shape(lo=0, hi=2)
    x = d.values(F32, shp)
    v0 = d.values(F32, shp)
    trips = np.array(d.int(0, 5), I64) if d.chance(0.85) else None
    cond = np.array(True) if d.chance(0.7) else (np.array(d.chance(0.5)) if trips is not None else np.array(True))
    limit = np.array(d.int(0, 6), I64)
    # body: (iter, cond_in, v) -> (iter < limit, v + x * iter, v * 2 as a scan output)
    body_nodes = [
        helper.make_node("Less", ["iter", "limit"], ["cond_out"]),
        helper.make_node("Cast", ["iter"], ["iter_f"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["x", "iter_f"], ["xi"]),
        helper.make_node("Add", ["v", "xi"], ["v_out"]),
        helper.make_node("Add", ["v", "v"], ["scan_out"]),
    ]
    body = helper.make_graph(body_nodes, "body",
                             [_vi("iter", elem=TensorProto.INT64, shape=[]), _vi("cond_in", elem=TensorProto.BOOL,
                                                                                 shape=[]), _vi("v", v0)],
                             [_vi("cond_out", elem=TensorProto.BOOL, shape=[]), _vi("v_out", v0),
                              _vi("scan_out", v0)])

    def build(case: Case) -> Any:
        node = helper.make_node("Loop", ["trips" if trips is not None else "", "cond", "v0"], ["y0", "y1"],
                                name="n0", body=body)
        ins = ([_vi("trips", trips)] if trips is not None else []) + [_vi("cond", cond), _vi("v0", v0),
                                                                      _vi("x", x), _vi("limit", limit)]
        g = helper.make_graph([node], "fuzz", ins, [helper.make_empty_tensor_value_info("y0"),
                                                    helper.make_empty_tensor_value_info("y1")])
        return typed_outputs(helper.make_model(g, opset_imports=[helper.make_opsetid("", 23)], ir_version=10))

    ins: list[tuple[str, np.ndarray | None]] = [("trips", trips), ("cond", cond), ("v0", v0), ("x", x),
                                                ("limit", limit)]
    case = Case("Loop", [(n, a) for n, a in ins if a is not None], build=build, n_out=2)
    if trips is None and not cond:
        pass
    return case


def scan(d: Draw) -> Case:
    t = d.int(0, 4)
    inner = d.shape(lo=1, hi=2)
    axis = d.int(0, len(inner))
    seq_shape = list(inner)
    seq_shape.insert(axis, t)
    xs = d.values(F32, tuple(seq_shape))
    s0 = d.values(F32, inner)
    body = helper.make_graph(
        [helper.make_node("Add", ["s", "xt"], ["s_out"]), helper.make_node("Mul", ["xt", "s"], ["y"])],
        "body", [_vi("s", s0), _vi("xt", s0)], [_vi("s_out", s0), _vi("y", s0)])
    if 0 in inner:
        raise Skip("Scan with an empty state: onnxruntime, the second opinion, dies of SIGFPE on it")
    attrs: dict[str, Any] = {"num_scan_inputs": 1, "body": body, "scan_input_axes": [axis]}
    if d.chance(0.4):
        attrs["scan_input_directions"] = [d.int(0, 1)]
    if d.chance(0.4):
        attrs["scan_output_directions"] = [d.int(0, 1)]
    if d.chance(0.4):
        attrs["scan_output_axes"] = [d.int(-len(inner) - 1, len(inner))]
    return Case("Scan", [("s0", s0), ("xs", xs)], attrs, n_out=2)


GENERATORS: dict[tuple[str, str], Any] = {
    ("", "QuantizeLinear"): quantize, ("", "DequantizeLinear"): dequantize,
    ("", "RotaryEmbedding"): rotary, (MS, "RotaryEmbedding"): ms_rotary,
    ("", "Attention"): attention, (MS, "GroupQueryAttention"): gqa, (MS, "MatMulNBits"): matmul_nbits,
    ("ai.onnxforge", "CacheUpdate"): cache_update,
    ("ai.onnxforge", "PagedAttention"): paged, ("ai.onnxforge", "PagedCacheUpdate"): paged,
    ("ai.onnxforge", "RaggedPagedAttention"): paged, ("ai.onnxforge", "RaggedPagedCacheUpdate"): paged,
    ("", "If"): if_, ("", "Loop"): loop, ("", "Scan"): scan,
}
_ = BF16
