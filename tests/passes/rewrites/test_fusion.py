"""Conv / ConvTranspose + BatchNormalization / Mul / Add fusion, MatMul + Add -> Gemm."""
from __future__ import annotations

import numpy as np
import pytest
from onnxforge.graphbuilder.builder.graph_builder import READ_WRITE, GraphBuilder
from onnxforge.graphbuilder.ir.core import Model
from onnxforge.graphbuilder.serde import load, to_onnx
from onnxforge.passes import FusionPass, optimize

from tests.passes.helpers import FLOAT, assert_sound, ort_run

RNG = np.random.default_rng(11)


def _ops(m: Model) -> list[str]:
    return [n.op_type for n in m.graph]


def _close(before, after: Model, feeds) -> None:
    """Fusion rounds differently from the unfused chain: equal within float32 rounding;
    so does the whole default pipeline (invariants checked between passes) run on ``before``."""
    want = ort_run(before, feeds)
    for got in (ort_run(after, feeds), ort_run(optimize(load(before), debug=True), feeds)):
        for w, g in zip(want, got):
            assert w.shape == g.shape and w.dtype == g.dtype
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(w).max())))


def _f32(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _conv(g: GraphBuilder, x, op: str, bias: bool, group: int = 1):
    if op == "Conv":
        w = g.initializer("W", _f32(4, 4 // group, 3, 3))
    else:
        w = g.initializer("W", _f32(4, 6 // group, 3, 3))
    ins = [x, w] + ([g.initializer("B0", _f32(4 if op == "Conv" else 6))] if bias else [])
    return getattr(g.op, op)(*ins, group=group, pads=[1, 1, 1, 1])


@pytest.mark.parametrize("op", ["Conv", "ConvTranspose"])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("group", [1, 2])
def test_conv_batchnorm_fuses_into_conv(op, bias, group):
    # BN(W*x + b) = (a*W)*x + (b - mean)*a + B, a = s / sqrt(var + eps)
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [1, 4, 5, 5])
    y = _conv(g, x, op, bias, group)
    ch = 4 if op == "Conv" else 6
    params = [g.initializer(k, v) for k, v in (
        ("s", _f32(ch)), ("b", _f32(ch)), ("mean", _f32(ch)), ("var", np.abs(_f32(ch)) + 0.1))]
    g.output(g.op.BatchNormalization(y, *params, epsilon=1e-3), "y")
    m = g.to_model()
    before = to_onnx(m)
    assert FusionPass()(m).modified
    assert _ops(m) == [op]
    assert_sound(m)
    _close(before, m, {"x": _f32(1, 4, 5, 5)})
    optimize(m, debug=True)
    assert _ops(m) == [op]
    assert sorted(m.graph.initializers) and len(m.graph.initializers) == 2


@pytest.mark.parametrize("op", ["Conv", "ConvTranspose"])
@pytest.mark.parametrize("shape", [(4, 1, 1), (1, 4, 1, 1), ()])
@pytest.mark.parametrize("kind", ["Mul", "Add"])
def test_conv_times_or_plus_per_channel_constant_fuses(op, shape, kind):
    # (W*x + b) * c = (c*W)*x + c*b ; (W*x + b) + c = W*x + (b + c)
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [1, 4, 5, 5])
    y = _conv(g, x, op, bias=False)
    ch = 4 if op == "Conv" else 6
    cshape = tuple(ch if d == 4 else d for d in shape)
    c = g.initializer("c", _f32(*cshape) if cshape else np.float32(1.5))
    g.output(getattr(g.op, kind)(c, y) if kind == "Mul" else getattr(g.op, kind)(y, c), "y")
    m = g.to_model()
    before = to_onnx(m)
    FusionPass()(m)
    assert _ops(m) == [op]
    assert_sound(m)
    _close(before, m, {"x": _f32(1, 4, 5, 5)})


def test_conv_not_fused_when_its_output_or_weight_has_other_readers():
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [1, 4, 5, 5])
    y = _conv(g, x, "Conv", bias=False)
    g.output(g.op.Mul(y, g.initializer("c", np.float32(2))), "y")
    g.output(g.op.Relu(y), "r")
    m = g.to_model()
    FusionPass()(m)
    assert _ops(m) == ["Conv", "Mul", "Relu"]
    # a spatially varying constant is no per-channel affine map
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [1, 4, 5, 5])
    y = _conv(g, x, "Conv", bias=False)
    g.output(g.op.Add(y, g.initializer("c", _f32(1, 1, 5, 5))), "y")
    m = g.to_model()
    FusionPass()(m)
    assert _ops(m) == ["Conv", "Add"]


@pytest.mark.parametrize("cshape", [(8,), (1, 8), (3, 8), (3, 1), ()])
def test_matmul_add_becomes_gemm(cshape):
    # MatMul(A, B) + C = Gemm(A, B, C)  (A 2-D, B constant 2-D, C broadcast to [M, N])
    g = GraphBuilder(opset=21)
    a = g.input("a", FLOAT, [3, 4])
    t = g.op.MatMul(a, g.initializer("B", _f32(4, 8)))
    c = g.initializer("C", _f32(*cshape) if cshape else np.float32(0.25))
    g.output(g.op.Add(c, t), "y")
    m = g.to_model()
    before = to_onnx(m)
    FusionPass()(m)
    assert _ops(m) == ["Gemm"]
    assert_sound(m)
    _close(before, m, {"a": _f32(3, 4)})


def _conv_bn_gemm_model(stateful: bool, flatten: bool = True):
    """Three Conv + BatchNormalization + Relu, pooled and flattened (then normalized unless
    ``flatten``), then MatMul + Add; ``stateful`` adds a READ_WRITE input."""
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [1, 4, 5, 5])
    y = x
    for k in range(3):
        bn = [g.initializer(f"{p}{k}", (np.abs(_f32(4)) + 0.5) if p == "v" else _f32(4)) for p in "sbmv"]
        conv = g.op.Conv(y, g.initializer(f"W{k}", _f32(4, 4, 3, 3)), pads=[1, 1, 1, 1])
        y = g.op.Relu(g.op.BatchNormalization(conv, *bn))
    pooled = g.op.GlobalAveragePool(y)
    flat = g.op.Flatten(pooled)
    if not flatten:  # an operator the graph's rank reading does not know
        flat = g.op.LpNormalization(flat, axis=1)
    flat = g.op.Identity(flat)  # for identity_elimination
    g.output(g.op.Add(g.op.MatMul(flat, g.initializer("B", _f32(4, 8))), g.initializer("C", _f32(8))), "z")
    if stateful:
        cache = g.input("cache", FLOAT, [1, 8], access=READ_WRITE)
        g.output(g.op.Identity(cache), "seen")
    return g.to_model()


def _shape_contexts(monkeypatch) -> tuple[list, list]:
    """Record every whole-model ``shapes`` analysis and every node an inference reads."""
    import onnxforge.passes.analyses.shapes as analyses
    from onnxforge.graphbuilder.shapes.context import ShapesContext

    contexts, inferred = [], []
    compute = analyses.ShapesAnalysis.compute
    monkeypatch.setattr(analyses.ShapesAnalysis, "compute",
                        lambda self, model, am: contexts.append(compute(self, model, am)) or contexts[-1])
    infer_node = ShapesContext.infer_node
    monkeypatch.setattr(ShapesContext, "infer_node",
                        lambda self, node: inferred.append(node.op_type) or infer_node(self, node))
    return contexts, inferred


@pytest.mark.parametrize("flatten", [True, False])
def test_gemm_fusion_infers_only_what_the_matmul_input_depends_on(monkeypatch, flatten):
    """The Gemm rule needs A's rank: a Flatten states it, with no inference. An
    LpNormalization does not: in a model without storage the question infers the nodes
    the MatMul's input depends on, as the Conv fusions left them, and nothing else."""
    m = _conv_bn_gemm_model(stateful=False, flatten=flatten)
    before = to_onnx(m)
    optimize(m, passes=["shape_folding", "identity_elimination"])
    contexts, inferred = _shape_contexts(monkeypatch)
    optimize(m, passes=["fusion"])
    tail = ["Gemm"] if flatten else ["LpNormalization", "Gemm"]
    assert _ops(m) == ["Conv", "Relu"] * 3 + ["GlobalAveragePool", "Flatten", *tail]
    assert contexts == []  # no whole-model inference
    # the fused weights are Constant nodes until the pass ends (then initializers)
    want = [] if flatten else ["Conv", "Relu"] * 3 + ["GlobalAveragePool", "Flatten", "LpNormalization"]
    assert sorted(op for op in inferred if op != "Constant") == sorted(want)
    _close(before, m, {"x": _f32(1, 4, 5, 5)})


def test_gemm_fusion_infers_a_stateful_model_before_the_conv_fusions_rewrite(monkeypatch):
    """A model with storage is inferred whole. The pass infers before any rewrite, so every
    node of the last inference replays it; asked after the Conv + BatchNormalization
    fusions rebuilt their nodes, the inference would replay none of those."""
    contexts, _ = _shape_contexts(monkeypatch)
    m = _conv_bn_gemm_model(stateful=True)
    before = to_onnx(m)
    optimize(m, passes=["shape_folding", "identity_elimination", "fusion"])
    assert _ops(m) == ["Conv", "Relu"] * 3 + ["GlobalAveragePool", "Flatten", "Gemm", "Identity"]
    assert len(contexts) == 2  # shape_folding's, then fusion's (identity_elimination dropped it)
    nodes = len(before.graph.node) - 1  # the Identity went
    assert contexts[0].replayed == 0 and contexts[1].replayed == nodes
    feeds = {"x": _f32(1, 4, 5, 5), "cache": _f32(1, 8)}
    _close(before, m, feeds)


def test_matmul_add_kept_for_3d_input_or_unknown_rank_or_row_bias_on_symbolic_rows():
    for shape, cshape in (([2, 3, 4], (8,)), (None, (8,)), (["n", 4], (3, 8))):
        g = GraphBuilder(opset=21)
        a = g.input("a", FLOAT, shape)
        t = g.op.MatMul(a, g.initializer("B", _f32(4, 8)))
        g.output(g.op.Add(t, g.initializer("C", _f32(*cshape))), "y")
        m = g.to_model()
        FusionPass()(m)
        assert _ops(m) == ["MatMul", "Add"], (shape, cshape)


@pytest.mark.parametrize("opset", [11, 21])
def test_complementary_slices_become_one_split(opset):
    # Slice(t, 0, 16, axis 3), Slice(t, 16, end, axis 3) -> Split(t, [16, 16], axis=3)
    from onnxforge.passes import SliceSplitPass

    g = GraphBuilder(opset=opset)
    x = g.input("x", FLOAT, ["b", 2, 32])
    def i(name: str, v: int):
        return g.initializer(name, np.array([v], np.int64))

    lo = g.op.Slice(x, i("s0", 0), i("e0", 16), i("a0", -1))
    hi = g.op.Slice(x, i("s1", 16), i("e1", np.iinfo(np.int64).max), i("a1", 2))
    g.output(g.op.Concat(g.op.Neg(hi), lo, axis=-1), "y")
    g.output(hi, "hi")
    m = g.to_model()
    before = to_onnx(m)
    assert SliceSplitPass()(m).modified
    assert _ops(m) == ["Split", "Neg", "Concat"]
    assert [v.name for v in m.graph.outputs] == ["y", "hi"]
    assert_sound(m)
    _close(before, m, {"x": _f32(3, 2, 32)})


def _int_initializer(g: GraphBuilder):
    def make(name: str, v: int):
        return g.initializer(name, np.array([v], np.int64))
    return make


def test_slices_with_a_gap_or_a_symbolic_axis_are_kept():
    from onnxforge.passes import SliceSplitPass

    for shape, ends in (([2, 32], (16, 30)), ([2, "n"], (16, 1 << 40))):
        g = GraphBuilder(opset=21)
        x = g.input("x", FLOAT, shape)
        i = _int_initializer(g)
        lo = g.op.Slice(x, i("s0", 0), i("e0", ends[0]), i("a0", 1))
        hi = g.op.Slice(x, i("s1", 17 if shape[1] == 32 else 16), i("e1", ends[1]), i("a1", 1))
        g.output(lo, "lo")
        g.output(hi, "hi")
        m = g.to_model()
        assert not SliceSplitPass()(m).modified


def test_slice_of_a_slice_on_other_axes_becomes_one_slice():
    # w = Slice(Slice(x, 0:2 on axis 1), 1:9:2 on axis -1) -> Slice(x, [0, 1], [2, 9], [1, 2], [1, 2])
    from onnxforge.passes import SliceSplitPass

    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, ["b", 4, 12])
    i = _int_initializer(g)
    u = g.op.Slice(x, i("s0", 0), i("e0", 2), i("a0", 1))
    w = g.op.Slice(u, i("s1", 1), i("e1", 9), i("a1", -1), i("p1", 2))
    g.output(g.op.Neg(w), "y")
    m = g.to_model()
    before = to_onnx(m)
    assert SliceSplitPass()(m).modified
    assert _ops(m) == ["Slice", "Neg"]
    sl = next(iter(m.graph))
    assert sl.inputs[0].name == "x"
    assert [v.const.numpy().tolist() for v in sl.inputs[1:]] == [[0, 1], [2, 9], [1, 2], [1, 2]]
    assert_sound(m)
    _close(before, m, {"x": _f32(3, 4, 12)})


def test_slices_on_one_axis_or_with_a_second_reader_or_a_noop_are_not_composed():
    from onnxforge.passes import SliceSplitPass

    for case in ("same_axis", "second_reader", "noop"):
        g = GraphBuilder(opset=21)
        x = g.input("x", FLOAT, [2, 4, 12])
        i = _int_initializer(g)
        u = g.op.Slice(x, i("s0", 0), i("e0", 3), i("a0", 1))
        if case == "noop":
            w = g.op.Slice(u, i("s1", 0), i("e1", np.iinfo(np.int64).max), i("a1", 2))
        else:
            w = g.op.Slice(u, i("s1", 1), i("e1", 2), i("a1", 1 if case == "same_axis" else 2))
        g.output(w, "y")
        if case == "second_reader":
            g.output(g.op.Neg(u), "z")
        m = g.to_model()
        SliceSplitPass()(m)
        assert _ops(m).count("Slice") == 2, case


def test_slices_of_one_weight_fold_into_the_shuffled_weight_without_growth():
    # Concat(Slice(W, 0:2), Slice(W, 4:6), Slice(W, 2:4)) of a weight W: the pipeline's
    # Split of W folds (it frees W), then the Concat: one initializer of W's size remains
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [6, 6])
    w = g.initializer("W", _f32(6, 64))
    i = _int_initializer(g)
    parts = [g.op.Slice(w, i(f"s{k}", a), i(f"e{k}", a + 2), i(f"a{k}", 0)) for k, a in enumerate((0, 2, 4))]
    g.output(g.op.MatMul(x, g.op.Concat(parts[0], parts[2], parts[1], axis=0)), "y")
    m = g.to_model()
    before = to_onnx(m)
    out = optimize(load(before))
    assert _ops(out) == ["MatMul"]
    inits = [v for v in out.graph.all_initializers()]
    assert sum(v.const.nbytes for v in inits) == 6 * 64 * 4
    _close(before, out, {"x": _f32(6, 6)})
