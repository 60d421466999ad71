"""The shared worker pool (``_pool``) and the one-row product on it (``_gemv``).

Oracles: float64 numpy for every product; the pool's own self-test job writes each
task's index so a task run twice or never is visible.
"""
from __future__ import annotations

import multiprocessing
import threading
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxforge as of
from onnxforge.kernels_cy.matmul import _gemv
from onnxforge.kernels_cy.runtime import _pool
from onnxforge.kernels_cy.errors import KernelDtypeError, KernelError


def _ref(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return x.astype(np.float64) @ w.astype(np.float64)


@pytest.mark.parametrize("n", [0, 1, 2, 7, 1000])
@pytest.mark.parametrize("threads", [1, 2, 4])
def test_every_task_runs_exactly_once(n, threads):
    assert _pool._selftest(n, threads) == list(range(1, n + 1))


@pytest.mark.parametrize("k,n", [(1, 1), (3, 5), (4, 8), (7, 33), (512, 1536), (1536, 512),
                                 (130, 2048 + 17), (64, 3 * 2048), (1000, 5000)])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_gemv_matches_float64(k, n, threads):
    rng = np.random.default_rng(k * 7919 + n)
    x = rng.standard_normal(k, dtype=np.float32)
    w = rng.standard_normal((k, n), dtype=np.float32)
    y = np.full(n, np.nan, np.float32)
    assert _gemv.gemv(x, w, y, threads) is y
    np.testing.assert_allclose(y, _ref(x, w), rtol=1e-5, atol=2e-5 * np.sqrt(k))


def test_gemv_reads_a_column_slice_of_a_wider_matrix():
    rng = np.random.default_rng(3)
    big = rng.standard_normal((300, 1200), dtype=np.float32)
    w = big[:, 100:900]  # row stride 1200 floats, unit column stride
    x = rng.standard_normal(300, dtype=np.float32)
    y = np.empty(800, np.float32)
    _gemv.gemv(x, w, y, 2)
    np.testing.assert_allclose(y, _ref(x, w), rtol=1e-5, atol=1e-4)


def test_gemv_leaves_the_rows_and_weights_untouched_and_zero_rows_give_zeros():
    x = np.ones(0, np.float32)
    w = np.ones((0, 9), np.float32)
    with pytest.raises(KernelError):  # K = 0 has no row to stream: shapes must still agree
        _gemv.gemv(np.ones(1, np.float32), w, np.empty(9, np.float32))
    rng = np.random.default_rng(4)
    x = rng.standard_normal(600, dtype=np.float32)
    w = rng.standard_normal((600, 700), dtype=np.float32)
    x0, w0 = x.copy(), w.copy()
    _gemv.gemv(x, w, np.empty(700, np.float32), 2)
    assert np.array_equal(x, x0) and np.array_equal(w, w0)


def test_gemv_rejects_bad_operands_before_writing():
    x = np.ones(4, np.float32)
    w = np.ones((4, 6), np.float32)
    y = np.full(6, 7.0, np.float32)
    with pytest.raises(KernelDtypeError):
        _gemv.gemv(x.astype(np.float64), w, y)
    with pytest.raises(KernelDtypeError):
        _gemv.gemv(x, w.astype(np.float16), y)
    with pytest.raises(KernelError, match="do not match"):
        _gemv.gemv(np.ones(5, np.float32), w, y)
    with pytest.raises(KernelError, match="unit column stride"):
        _gemv.gemv(x, np.ones((4, 12), np.float32)[:, ::2], y)
    with pytest.raises(KernelError):
        _gemv.gemv(x, w, np.ones(6, np.float32)[::-1].copy()[None])  # rank 2 output
    ro = np.ones(6, np.float32)
    ro.flags.writeable = False
    with pytest.raises(KernelError):
        _gemv.gemv(x, w, ro)
    assert np.all(y == 7.0)


def test_concurrent_callers_each_get_their_own_product():
    rng = np.random.default_rng(5)
    xs = [rng.standard_normal(512, dtype=np.float32) for _ in range(4)]
    w = rng.standard_normal((512, 1024), dtype=np.float32)
    outs = [np.empty(1024, np.float32) for _ in xs]
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            for _ in range(50):
                _gemv.gemv(xs[i], w, outs[i], 2)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for x, y in zip(xs, outs):
        np.testing.assert_allclose(y, _ref(x, w), rtol=1e-5, atol=1e-3)


def _child(conn) -> None:
    rng = np.random.default_rng(6)
    x = rng.standard_normal(700, dtype=np.float32)
    w = rng.standard_normal((700, 900), dtype=np.float32)
    y = np.empty(900, np.float32)
    _gemv.gemv(x, w, y, 2)
    conn.send(float(np.abs(y - _ref(x, w)).max()))


def test_a_forked_child_starts_its_own_workers():
    _gemv.gemv(np.ones(700, np.float32), np.ones((700, 900), np.float32), np.empty(900, np.float32), 2)
    ctx = multiprocessing.get_context("fork")
    a, b = ctx.Pipe()
    p = ctx.Process(target=_child, args=(b,))
    p.start()
    assert a.poll(60), "the forked child did not finish its product"
    err = a.recv()
    p.join(10)
    assert p.exitcode == 0 and err < 1e-3


def _matmul_model(k: int, n: int) -> onnx.ModelProto:
    w = np.random.default_rng(7).standard_normal((k, n), dtype=np.float32)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Reshape", ["y", "s"], ["z"])],
        "mm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, k])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array([-1, 7], np.int64), "s")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_session_one_row_matmul_uses_the_pool_and_matches_the_reference():
    from onnx.reference import ReferenceEvaluator

    m = _matmul_model(512, 1029)
    sess = of.InferenceSession(of.load(m.SerializeToString()), threads=2)
    x = np.random.default_rng(8).standard_normal((1, 1, 512), dtype=np.float32)
    before = _pool.stats()["jobs"]
    (got,) = sess.run(None, {"x": x})
    assert _pool.stats()["jobs"] > before  # the 2 MB weight went to the pool on 2 threads
    (want,) = ReferenceEvaluator(m).run(None, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    assert sess.last_run.allocated_bytes == 1029 * 4  # the product's output, nothing else
    assert sess.last_run.copied_bytes == 0


def test_no_worker_spins_after_a_run_even_a_failed_one():
    m = _matmul_model(512, 1029)
    sess = of.InferenceSession(of.load(m.SerializeToString()), threads=2)
    x = np.ones((1, 1, 512), np.float32)
    sess.run(None, {"x": x})
    assert _pool.stats()["active_runs"] == 0
    def fail(step: int) -> None:  # a run failing after its product ran on the pool
        raise RuntimeError(f"fault after step {step}")

    with pytest.raises(RuntimeError, match="fault after step 0"):
        sess.run(None, {"x": x}, after_step=fail)
    assert _pool.stats()["active_runs"] == 0
    # let a worker that was spinning notice the run ended, and any BLAS worker an earlier
    # product woke finish its own spin-wait (OpenBLAS's threads spin about 0.1 s)
    time.sleep(0.4)
    c0 = time.process_time()
    time.sleep(0.3)
    assert time.process_time() - c0 < 0.1  # an idle process: no thread is burning a core


@pytest.fixture(params=["simd", "baseline"])
def simd_path(request):
    _gemv._force_baseline_simd(request.param == "baseline")
    yield request.param
    _gemv._force_baseline_simd(0)


@pytest.mark.parametrize("m", [2, 3, 4, 5, 8, 13, 32])
@pytest.mark.parametrize("k,n", [(1, 1), (7, 15), (64, 16), (33, 17), (512, 300), (300, 4096 + 5)])
@pytest.mark.parametrize("threads", [1, 2])
def test_few_row_products_match_float64(m, k, n, threads, simd_path):
    rng = np.random.default_rng(m * 131 + k * 7 + n)
    x = rng.standard_normal((m, k), dtype=np.float32)
    w = rng.standard_normal((k, n), dtype=np.float32)
    y = np.full((m, n), np.nan, np.float32)
    _gemv.gemm_few(x, w, y, threads)
    ref = _ref(x, w)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5 * np.sqrt(k))


def test_few_row_products_refuse_more_rows_or_a_mismatched_weight():
    with pytest.raises(KernelError, match="rows"):
        _gemv.gemm_few(np.ones((_gemv.FEW_ROWS + 1, 4), np.float32), np.ones((4, 3), np.float32),
                       np.empty((_gemv.FEW_ROWS + 1, 3), np.float32))
    with pytest.raises(KernelError):
        _gemv.gemm_few(np.ones((2, 4), np.float32), np.ones((5, 3), np.float32), np.empty((2, 3), np.float32))


@pytest.mark.parametrize("rows", [2, 8, 16, 32, 33])
def test_matmul_of_a_few_rows_matches_onnxruntime(rows):
    import onnxruntime as ort

    k, n = 96, 200
    rng = np.random.default_rng(rows)
    w = rng.standard_normal((k, n), dtype=np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, None, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = rng.standard_normal((1, rows, k), dtype=np.float32)
    (got,) = of.InferenceSession(of.load(model.SerializeToString()), threads=2).run(None, {"x": x})
    (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
