"""Shape rules of the vision, audio, recurrent and miscellaneous operators with
symbolic inputs, checked against ``onnx.reference`` for several sizes (the harness
of ``test_infer_ops``): every inferred dimension, evaluated under the sizes, must
equal the computed output's."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnxforge.graphbuilder.shapes.context import ShapesContext
from onnxforge.graphbuilder.shapes.symbolic import SymExpr

from tests.graphbuilder.shapes.test_infer_ops import Net, check

F, I64 = TP.FLOAT, TP.INT64
SIZES = ({"b": 2, "h": 7, "w": 9}, {"b": 1, "h": 8, "w": 5}, {"b": 3, "h": 12, "w": 11})


def _image(n: Net, c: int = 3) -> object:
    return n.input("x", F, ("b", c, "h", "w"))


@pytest.mark.parametrize("attrs", [
    {"pads": [1, 1, 1, 1]},
    {"strides": [2, 3], "pads": [0, 1, 2, 0]},
    {"dilations": [2, 1], "strides": [2, 2]},
    {"auto_pad": "SAME_UPPER", "strides": [2, 2]},
    {"auto_pad": "VALID", "strides": [3, 2]},
])
def test_conv_symbolic_spatial_sizes(attrs: dict) -> None:
    n = Net()
    x = _image(n)
    w = n.const("w", np.ones((4, 3, 3, 3), np.float32))
    y = n.op("Conv", x, w, **attrs)
    ctx = check(n, [y], envs=SIZES)
    assert all(isinstance(d, (int, SymExpr)) for d in ctx.shape_of(y))


def test_conv_transpose_and_grouped_conv() -> None:
    n = Net()
    x = _image(n, 4)
    wt = n.const("wt", np.ones((4, 2, 3, 3), np.float32))
    wg = n.const("wg", np.ones((6, 2, 3, 3), np.float32))
    ct = n.op("ConvTranspose", x, wt, strides=[2, 2], pads=[1, 0, 1, 0], output_padding=[1, 0])
    cg = n.op("Conv", x, wg, group=2)
    check(n, [ct, cg], envs=SIZES)


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool", "LpPool"])
def test_pools(op: str) -> None:
    n = Net()
    x = _image(n)
    y = n.op(op, x, kernel_shape=[3, 2], strides=[2, 1], pads=[1, 0, 1, 1])
    outs = [y] if op == "LpPool" else [y, n.op("Global" + op, x)]  # no GlobalLpPool in onnx.reference
    check(n, outs, envs=SIZES)


def test_max_pool_ceil_mode_and_indices() -> None:
    n = Net()
    x = n.input("x", F, (1, 2, 7, 6))
    node = n.node("MaxPool", [x], 2, kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)
    check(n, list(node.outputs), envs=SIZES[:1])


def test_resize_upsample_depth_space() -> None:
    n = Net()
    x = n.input("x", F, ("b", 4, "h", "w"))
    scales = n.const("scales", np.array([1, 1, 2, 3], np.float32))
    r = n.op("Resize", x, None, scales, mode="nearest")
    half = n.const("half", np.array([1, 1, 0.5, 0.5], np.float32))
    d2s = n.op("DepthToSpace", x, blocksize=2)
    s2d = n.op("SpaceToDepth", d2s, blocksize=2)
    ctx = check(n, [r, d2s, s2d], envs=SIZES)
    assert [str(d) for d in ctx.shape_of(r)] == ["b", "4", "2*h", "3*w"]
    n2 = Net()
    x2 = n2.input("x", F, ("b", 1, "h", "w"))
    sizes = n2.const("sizes", np.array([2, 1, 5, 6], np.int64))
    r2 = n2.op("Resize", x2, None, None, sizes)
    check(n2, [r2], envs=SIZES)
    del half


@pytest.mark.parametrize("op,gates", [("RNN", 1), ("GRU", 3), ("LSTM", 4)])
@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
@pytest.mark.parametrize("layout", [0, 1])
def test_recurrent(op: str, gates: int, direction: str, layout: int) -> None:
    n = Net()
    dirs = 2 if direction == "bidirectional" else 1
    x = n.input("x", F, ("h", "b", 3) if layout == 0 else ("b", "h", 3))
    w = n.const("w", np.full((dirs, gates * 5, 3), 0.1, np.float32))
    r = n.const("r", np.full((dirs, gates * 5, 5), 0.1, np.float32))
    node = n.node(op, [x, w, r], 3 if op == "LSTM" else 2, hidden_size=5, direction=direction, layout=layout)
    check(n, list(node.outputs), envs=SIZES)


def test_einsum_topk_det_compress_unique_nonzero() -> None:
    n = Net()
    a, c = n.input("a", F, ("b", "h", 4)), n.input("c", F, ("b", 4, "w"))
    e1 = n.op("Einsum", a, c, equation="bij,bjk->bik")
    e2 = n.op("Einsum", a, equation="...ij->...ji")
    e3 = n.op("Einsum", a, equation="bij->j")
    k = n.const("k", np.array([2], np.int64))
    top = n.node("TopK", [a, k], 2, axis=1)
    sq = n.input("sq", F, ("b", 3, 3))
    det = n.op("Det", sq)
    cond = n.const("cond", np.array([True, False, True, True]))
    comp = n.op("Compress", a, cond, axis=2)
    uniq = n.node("Unique", [n.input("u", I64, ("h",))], 4)
    ctx = check(n, [e1, e2, e3, *top.outputs, det, comp], envs=SIZES)
    ctx2 = ShapesContext(n.model()).infer_graph()
    y, idx, inv, counts = (ctx2.shape_of(o) for o in uniq.outputs)
    assert y == idx == counts and str(inv[0]) == "h"
    del ctx


def test_quantize_dequantize_and_dynamic() -> None:
    n = Net(opset=21)
    x = n.input("x", F, ("b", "h"))
    scale, zp = n.const("scale", np.float32(0.5)), n.const("zp", np.int8(3))
    q = n.op("QuantizeLinear", x, scale, zp)
    dq = n.op("DequantizeLinear", q, scale, zp)
    dyn = n.node("DynamicQuantizeLinear", [x], 3)
    check(n, [q, dq, *dyn.outputs], envs=SIZES)


def test_spectral_and_windows() -> None:
    n = Net(opset=20)
    sig = n.input("sig", F, ("b", 64, 1))
    dft = n.op("DFT", sig)
    step = n.const("step", np.array(8, np.int64))
    window = n.op("HannWindow", n.const("size", np.array(16, np.int64)))
    stft = n.op("STFT", sig, step, window)
    check(n, [dft, window, stft], envs=SIZES)


def test_roi_align_and_nms_outputs() -> None:
    n = Net()
    x = _image(n)
    rois = n.input("rois", F, ("h", 4))
    idx = n.const("idx", np.zeros(0, np.int64))
    ctx = ShapesContext(n.model()).infer_graph()
    node = n.node("RoiAlign", [x, rois, idx], 1, output_height=2, output_width=3)
    ctx = ShapesContext(n.model()).infer_graph()
    assert [str(d) for d in ctx.shape_of(node.outputs[0])] == ["h", "3", "2", "3"]
    boxes, scores = n.input("boxes", F, ("b", "h", 4)), n.input("scores", F, ("b", 2, "h"))
    nms = n.op("NonMaxSuppression", boxes, scores)
    ctx = ShapesContext(n.model()).infer_graph()
    first, second = ctx.shape_of(nms)
    assert isinstance(first, SymExpr) and second == 3
