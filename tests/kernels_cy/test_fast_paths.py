"""The decode-step fast paths against independent oracles: ONNX Attention for one new
token (compiled grouped-head kernel) against onnx.reference, GroupQueryAttention at
batch 1 (decode and prompt, rotary, past longer than the valid length) against
onnxruntime, the small kernels' rewritten paths (Gather, GatherND, Split, Expand,
Sigmoid, ReduceSum, Cast), aligned constants, and the thread controls."""
from __future__ import annotations

import os
import subprocess
import sys
import warnings

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxforge.kernels_cy.errors import KernelError
from onnxforge.kernels_cy.runtime.session import InferenceSession
from onnxforge.kernels_cy.runtime.threads import BLAS, BLAS_PARALLEL_WORK
from onnxforge.proto_ext.errors import VerificationError
from tests.kernels_cy.helpers import F, I64, onnx_model, reference, tensor

I32 = TensorProto.INT32
B = TensorProto.BOOL


def _attention_model(four_d: bool, causal: int, mask: int | None, past: bool):
    ins = ["q", "k", "v", "mask" if mask is not None else "", "pk" if past else "", "pv" if past else ""]
    while ins and ins[-1] == "":
        ins.pop()
    extra = {} if four_d else {"q_num_heads": 4, "kv_num_heads": 2}
    node = helper.make_node("Attention", ins, ["y", "present_k", "present_v"] if past else ["y"],
                            is_causal=causal, **extra)
    if four_d:
        vi = [tensor("q", F, [1, 4, 1, 8]), tensor("k", F, [1, 2, "t", 8]), tensor("v", F, [1, 2, "t", 8])]
    else:
        vi = [tensor("q", F, [1, 1, 32]), tensor("k", F, [1, "t", 16]), tensor("v", F, [1, "t", 16])]
    if mask is not None:
        vi.append(tensor("mask", mask, [1, 1, 1, "T"]))
    if past:
        vi += [tensor("pk", F, [1, 2, "p", 8]), tensor("pv", F, [1, 2, "p", 8])]
    outs = [tensor("y", F, None)] + ([tensor("present_k", F, None), tensor("present_v", F, None)] if past else [])
    return onnx_model([node], vi, outs, opset=23)


_ATTN_CASES = [(four_d, past) for four_d in (True, False) for past in (False, True) if four_d or not past]


@pytest.mark.parametrize("four_d, past", _ATTN_CASES)
@pytest.mark.parametrize("causal", [0, 1])
@pytest.mark.parametrize("mask", [None, "zeros", "true", "partial_bool", "partial_float"])
def test_attention_one_new_token_matches_reference(four_d, causal, mask, past):
    rng = np.random.default_rng(3)
    t_new = 1 if past else 6
    p = 5 if past else 0
    shape_q = (1, 4, 1, 8) if four_d else (1, 1, 32)
    shape_k = (1, 2, t_new, 8) if four_d else (1, t_new, 16)
    feeds = {"q": rng.standard_normal(shape_q, dtype=np.float32),
             "k": rng.standard_normal(shape_k, dtype=np.float32),
             "v": rng.standard_normal(shape_k, dtype=np.float32)}
    total = t_new + p
    elem = None
    if mask is not None:
        if mask == "zeros":
            feeds["mask"], elem = np.zeros((1, 1, 1, total), np.float32), F
        elif mask == "true":
            feeds["mask"], elem = np.ones((1, 1, 1, total), bool), B
        elif mask == "partial_bool":
            m = np.ones((1, 1, 1, total), bool)
            m[..., 1] = False
            feeds["mask"], elem = m, B
        else:
            m = np.zeros((1, 1, 1, total), np.float32)
            m[..., 0] = -np.inf
            m[..., 2] = -1.5
            feeds["mask"], elem = m, F
    if past:
        feeds["pk"] = rng.standard_normal((1, 2, p, 8), dtype=np.float32)
        feeds["pv"] = rng.standard_normal((1, 2, p, 8), dtype=np.float32)
    model = _attention_model(four_d, causal, elem, past)
    want = reference(model, feeds)
    got = InferenceSession(model).run(None, feeds)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, atol=2e-6, rtol=0)


def _gqa(nq, nkv, h, rotary):
    node = helper.make_node(
        "GroupQueryAttention", ["q", "k", "v", "pk", "pv", "seqlens_k", "total", "cos", "sin"],
        ["y", "present_k", "present_v"], domain="com.microsoft", num_heads=nq, kv_num_heads=nkv,
        do_rotary=rotary)
    ins = [tensor("q", F, [1, "s", nq * h]), tensor("k", F, [1, "s", nkv * h]),
           tensor("v", F, [1, "s", nkv * h]), tensor("pk", F, [1, nkv, "p", h]),
           tensor("pv", F, [1, nkv, "p", h]), tensor("seqlens_k", I32, [1]), tensor("total", I32, []),
           tensor("cos", F, [64, h // 2]), tensor("sin", F, [64, h // 2])]
    outs = [tensor("y", F, None), tensor("present_k", F, None), tensor("present_v", F, None)]
    return onnx_model([node], ins, outs, opset=21, domains={"com.microsoft": 1})


@pytest.mark.parametrize("s, p, valid", [(1, 7, 7), (1, 12, 7), (4, 0, 0), (1, 0, 0), (3, 9, 9)])
@pytest.mark.parametrize("rotary", [0, 1])
def test_group_query_attention_batch_one_matches_onnxruntime(s, p, valid, rotary):
    """``valid`` past tokens of a past buffer of ``p`` (a buffer longer than the valid length)."""
    nq, nkv, h = 4, 2, 32
    rng = np.random.default_rng(s * 10 + p + rotary)
    ang = rng.random((64, h // 2)).astype(np.float32) * 3
    feeds = {"q": rng.standard_normal((1, s, nq * h), dtype=np.float32),
             "k": rng.standard_normal((1, s, nkv * h), dtype=np.float32),
             "v": rng.standard_normal((1, s, nkv * h), dtype=np.float32),
             "pk": rng.standard_normal((1, nkv, p, h), dtype=np.float32),
             "pv": rng.standard_normal((1, nkv, p, h), dtype=np.float32),
             "seqlens_k": np.array([valid + s - 1], np.int32), "total": np.array(valid + s, np.int32),
             "cos": np.cos(ang), "sin": np.sin(ang)}
    model = _gqa(nq, nkv, h, rotary)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = InferenceSession(model).run(None, feeds)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, atol=1e-5, rtol=0)


def test_group_query_attention_rotary_positions_past_the_cache_fail():
    model = _gqa(4, 2, 32, 1)
    rng = np.random.default_rng(0)
    feeds = {"q": rng.standard_normal((1, 1, 128), dtype=np.float32),
             "k": rng.standard_normal((1, 1, 64), dtype=np.float32),
             "v": rng.standard_normal((1, 1, 64), dtype=np.float32),
             "pk": np.zeros((1, 2, 64, 32), np.float32), "pv": np.zeros((1, 2, 64, 32), np.float32),
             "seqlens_k": np.array([64], np.int32), "total": np.array(65, np.int32),
             "cos": np.ones((64, 16), np.float32), "sin": np.zeros((64, 16), np.float32)}
    with pytest.raises(KernelError, match="exceed the rotary cache of 64"):
        InferenceSession(model).run(None, feeds)


def _one(op, ins, outs, feeds, **attrs):
    node = helper.make_node(op, [n for n, _, _ in ins], [n for n, _, _ in outs], **attrs)
    return onnx_model([node], [tensor(*i) for i in ins], [tensor(*o) for o in outs], opset=21)


def test_gather_negative_indices_and_range_error():
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    idx = np.array([[-1, 0], [2, -4]], np.int64)
    m = _one("Gather", [("x", F, [4, 3]), ("i", I64, [2, 2])], [("y", F, None)], None, axis=0)
    got = InferenceSession(m).run(None, {"x": x, "i": idx})[0]
    np.testing.assert_array_equal(got, reference(m, {"x": x, "i": idx})[0])
    with pytest.raises(KernelError, match=r"out of range \[-4, 4\)"):
        InferenceSession(m).run(None, {"x": x, "i": np.array([[4, 0], [0, 0]], np.int64)})


def test_gather_axis_out_of_range_is_a_kernel_error():
    m = _one("Gather", [("x", F, None), ("i", I64, [1])], [("y", F, None)], None, axis=1)
    with pytest.raises(KernelError, match="axis 1 is out of range for rank 1"):
        InferenceSession(m).run(None, {"x": np.zeros(4, np.float32), "i": np.array([0], np.int64)})
    ranked = _one("Gather", [("x", F, [4]), ("i", I64, [1])], [("y", F, None)], None, axis=1)
    with pytest.raises(VerificationError, match=r"\[X1\] graph.node\[0\].*axis must be in"):
        InferenceSession(ranked)  # a declared rank: refused before compiling


def test_gather_nd_negative_indices_match_reference():
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    idx = np.array([[[0, -1], [1, 2]], [[-2, 0], [1, -3]]], np.int64)
    m = _one("GatherND", [("x", F, [2, 3, 4]), ("i", I64, [2, 2, 2])], [("y", F, None)], None)
    got = InferenceSession(m).run(None, {"x": x, "i": idx})[0]
    np.testing.assert_array_equal(got, reference(m, {"x": x, "i": idx})[0])
    assert got.flags.c_contiguous
    with pytest.raises(KernelError, match="GatherND index out of range"):
        InferenceSession(m).run(None, {"x": x, "i": np.full((2, 2, 2), 5, np.int64)})


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_split_with_sizes_input_matches_reference(axis):
    x = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    sizes = {0: [1, 2], 1: [1, 3], -1: [2, 2, 1]}[axis]
    node = helper.make_node("Split", ["x", "split"], [f"y{i}" for i in range(len(sizes))], axis=axis)
    m = onnx_model([node], [tensor("x", F, [3, 4, 5])], [tensor(f"y{i}", F, None) for i in range(len(sizes))],
                   opset=21, initializers=[numpy_helper.from_array(np.array(sizes, np.int64), "split")])
    got = InferenceSession(m).run(None, {"x": x})
    for g, w in zip(got, reference(m, {"x": x})):
        np.testing.assert_array_equal(g, w)
        assert g.flags.c_contiguous and not np.shares_memory(g, x)


def test_expand_broadcasts_and_names_incompatible_shapes():
    m = _one("Expand", [("x", F, [3, 1]), ("s", I64, ["r"])], [("y", F, None)], None)
    x = np.arange(3, dtype=np.float32).reshape(3, 1)
    s = np.array([2, 1, 4], np.int64)
    np.testing.assert_array_equal(InferenceSession(m).run(None, {"x": x, "s": s})[0],
                                  reference(m, {"x": x, "s": s})[0])
    with pytest.raises(KernelError, match=r"\[3, 1\] cannot be expanded to \[2, 4\]"):
        InferenceSession(m).run(None, {"x": x, "s": np.array([2, 4], np.int64)})


def test_sigmoid_saturates_without_warnings():
    x = np.array([-1000.0, -88.0, -20.0, -1.0, 0.0, 0.5, 20.0, 1000.0], np.float32).reshape(2, 4)
    m = _one("Sigmoid", [("x", F, [2, 4])], [("y", F, None)], None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = InferenceSession(m).run(None, {"x": x})[0]
    with np.errstate(over="ignore"):
        want = 1.0 / (1.0 + np.exp(-x.astype(np.float64)))
    np.testing.assert_allclose(got, want, atol=1e-7, rtol=1e-6)


@pytest.mark.parametrize("dtype, elem", [(np.int32, I32), (np.int64, I64), (np.float32, F)])
def test_reduce_sum_keeps_the_element_type(dtype, elem):
    x = np.arange(12).reshape(3, 4).astype(dtype)
    node = helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=1)
    m = onnx_model([node], [tensor("x", elem, [3, 4])], [tensor("y", elem, None)], opset=21,
                   initializers=[numpy_helper.from_array(np.array([1], np.int64), "axes")])
    got = InferenceSession(m).run(None, {"x": x})[0]
    want = reference(m, {"x": x})[0]
    assert got.dtype == want.dtype == dtype
    np.testing.assert_array_equal(got, want)


def test_cast_between_plain_types_matches_reference():
    x = np.array([[-2.7, -0.5, 0.0, 1.5, 300.25]], np.float32)
    for to, np_t in ((TensorProto.INT32, np.int32), (TensorProto.FLOAT16, np.float16), (TensorProto.BOOL, bool)):
        m = _one("Cast", [("x", F, [1, 5])], [("y", to, None)], None, to=to)
        got = InferenceSession(m).run(None, {"x": x})[0]
        want = reference(m, {"x": x})[0]
        assert got.dtype == np.dtype(np_t)
        np.testing.assert_array_equal(got, want)


def test_unaligned_inline_constants_are_aligned_once_at_plan_time():
    """Inline raw_data sits at any byte offset; the plan holds aligned read-only copies."""
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    m = _one("MatMul", [("x", F, [2, 3]), ("w", F, [3, 4])], [("y", F, None)], None)
    m.graph.initializer.append(numpy_helper.from_array(w, "w"))
    del m.graph.input[1]
    from onnxforge.graphbuilder import serde
    from onnxforge.kernels_cy.runtime.compile import Compiler

    ir = serde.load(m.SerializeToString())
    arr = Compiler(ir).constant(next(iter(ir.graph.all_initializers())))
    assert arr.flags.aligned and not arr.flags.writeable
    x = np.ones((2, 3), np.float32)
    np.testing.assert_array_equal(InferenceSession(ir).run(None, {"x": x})[0], x @ w)


@pytest.mark.parametrize("preset, want", [(None, "None"), ("ACTIVE", "ACTIVE")])
def test_importing_the_backend_leaves_the_openmp_environment_alone(preset, want):
    """The kernels run on the backend's own pool, not OpenMP: nothing to set for it."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if preset is not None:
        env["OMP_WAIT_POLICY"] = preset
    code = "import os, onnxforge.kernels_cy; print(os.environ.get('OMP_WAIT_POLICY'))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == want


def test_blas_threads_are_bounded_for_small_products_and_restored_after_a_run():
    import threadpoolctl

    # numpy's own BLAS (the one MatMul runs on): another one (scipy's) may be loaded too
    libs = [c for c in threadpoolctl.ThreadpoolController().lib_controllers
            if c.user_api == "blas" and "numpy" in c.filepath]
    assert libs, "numpy's BLAS is not controllable by threadpoolctl"
    before = libs[0].get_num_threads()
    saved = BLAS.begin(1)
    try:
        assert libs[0].get_num_threads() == 1 or before == 1
        BLAS.for_work(BLAS_PARALLEL_WORK * 4)  # a large product stays within the run's bound
        assert libs[0].get_num_threads() == 1
    finally:
        BLAS.end(saved)
    assert libs[0].get_num_threads() == before
    m = _one("MatMul", [("a", F, [2, 3]), ("b", F, [3, 4])], [("y", F, None)], None)
    a, b = np.ones((2, 3), np.float32), np.ones((3, 4), np.float32)
    InferenceSession(m, threads=1).run(None, {"a": a, "b": b})
    assert libs[0].get_num_threads() == before


def test_one_row_products_over_large_weights_use_the_runs_threads():
    from onnxforge.kernels_cy.runtime.threads import BLAS_PARALLEL_BYTES

    saved = BLAS.begin(2)
    try:
        BLAS.for_work(512, 512 * 4)  # a small product over a small weight: one thread
        assert BLAS.current == 1
        BLAS.for_work(1536, BLAS_PARALLEL_BYTES)  # one row over a large weight streams it
        assert BLAS.current == 2
        BLAS.for_work(BLAS_PARALLEL_WORK, 0)  # much arithmetic
        assert BLAS.current == 2
        BLAS.for_work(BLAS_PARALLEL_WORK - 1, BLAS_PARALLEL_BYTES - 1)
        assert BLAS.current == 1
    finally:
        BLAS.end(saved)


@pytest.mark.parametrize("baseline", [0, 2, 1], ids=["best", "avx2", "baseline"])
@pytest.mark.parametrize("zp_kind", [None, "uint8", "float"])
def test_matmul_nbits_one_row_fused_path_matches_float64(baseline, zp_kind):
    """M = 1, block 32: the per-block fused product (every vector path) against float64."""
    from onnxforge.kernels_cy.matmul import _matmul_nbits
    from tests.kernels_cy import reference as ref

    rng = np.random.default_rng(11)
    n, k, blk = 37, 160, 32  # 5 blocks: an odd count of packed zero points
    nblk = k // blk
    bq = ref.pack_int4(rng.integers(0, 16, size=(n, nblk, blk)))
    sc = rng.uniform(0.01, 0.2, n * nblk).astype(np.float32)
    zp = None
    if zp_kind == "uint8":
        zp = ref.pack_int4(rng.integers(0, 16, size=(n, nblk + 1))).reshape(n * ((nblk + 1) // 2))
    elif zp_kind == "float":
        zp = rng.uniform(0, 15, size=n * nblk).astype(np.float32)
    a = rng.standard_normal((1, k)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    out = np.full((1, n), np.nan, np.float32)
    _matmul_nbits._force_baseline_simd(baseline)
    try:
        _matmul_nbits.matmul_nbits(a, bq, sc, zp, k, n, out, block_size=blk, bias=bias, num_threads=2)
    finally:
        _matmul_nbits._force_baseline_simd(0)
    want = a.astype(np.float64) @ ref.dequant_int4(bq, sc, zp, k, blk).T + bias
    np.testing.assert_allclose(out, want, atol=2e-5, rtol=1e-5)


def test_sigmoid_vector_path_matches_float64_over_a_wide_range():
    x = np.linspace(-100.0, 100.0, 4099).astype(np.float32).reshape(1, -1)
    m = _one("Sigmoid", [("x", F, [1, 4099])], [("y", F, None)], None)
    got = InferenceSession(m).run(None, {"x": x})[0]
    with np.errstate(over="ignore"):
        want = 1.0 / (1.0 + np.exp(-x.astype(np.float64)))
    np.testing.assert_allclose(got, want, atol=1e-7, rtol=1e-6)


@pytest.mark.parametrize("sizes, axis", [([512, 256, 256], 2), ([1, 0, 3], 0), ([2, 2], -1), ([1, 2], -2), ([3, 1], -3)])
def test_split_with_constant_sizes_matches_the_reference(sizes, axis):
    shape = [4, 3, 1024]
    shape[axis] = sum(sizes)
    x = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
    outs = [f"y{i}" for i in range(len(sizes))]
    node = helper.make_node("Split", ["x", "split"], outs, axis=axis)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", F, shape)],
                          [helper.make_tensor_value_info(o, F, None) for o in outs],
                          [numpy_helper.from_array(np.array(sizes, np.int64), "split")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    sess = InferenceSession(m)
    got = sess.run(None, {"x": x})
    for a, b in zip(got, reference(m, {"x": x})):
        np.testing.assert_array_equal(a, b)
        assert not np.shares_memory(a, x)  # new buffers, never views of the input
    assert sess.last_run.allocated_bytes == x.nbytes
