"""``Attention`` over repeated KV heads (torch's repeat_kv) reads the grouped heads directly."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto
from onnxforge.graphbuilder.builder.graph_builder import GraphBuilder
from onnxforge.graphbuilder.ir.core import Model
from onnxforge.graphbuilder.serde import load, to_onnx
from onnxforge.kernels_cy.runtime.session import InferenceSession
from onnxforge.passes import FusionPass, optimize

from tests.passes.helpers import FLOAT, assert_sound, ort_run, reference_run

RNG = np.random.default_rng(23)
KV, G, D = 2, 3, 8


def _i64(*vals: int) -> np.ndarray:
    return np.array(vals, np.int64)


def _repeat(g: GraphBuilder, x, *, axis: int = 2, reps: int = G, heads: int = KV * G):
    """torch's repeat_kv: Reshape(Expand(Unsqueeze(x, [axis]), [B, H, reps, T, D]), [B, H*reps, T, D]),
    both shapes assembled from Shape(x) at run time as the exporter writes them."""
    b = g.op.Shape(x, start=0, end=1)
    h = g.op.Shape(x, start=1, end=2)
    td = g.op.Shape(x, start=2, end=4)
    if axis == 2:
        target = g.op.Concat(b, h, g.initializer(f"r{id(x)}", _i64(reps)), td, axis=0)
    else:
        target = g.op.Concat(b, g.initializer(f"r{id(x)}", _i64(reps)), h, td, axis=0)
    ex = g.op.Expand(g.op.Unsqueeze(x, g.initializer(f"a{id(x)}", _i64(axis))), target)
    return g.op.Reshape(ex, g.op.Concat(b, g.initializer(f"h{id(x)}", _i64(heads)), td, axis=0))


def _model(*, mask: bool = True, k_axis: int = 2, v_axis: int = 2, repeat_v: bool = True,
           present: bool = False) -> Model:
    g = GraphBuilder(opset=23)
    q = g.input("q", FLOAT, ["b", KV * G, "s", D])
    k = g.input("k", FLOAT, ["b", KV, "t", D])
    v = g.input("v", FLOAT, ["b", KV, "t", D])
    ins = [q, _repeat(g, k, axis=k_axis), _repeat(g, v, axis=v_axis) if repeat_v else v]
    if mask:
        ins.append(g.input("mask", TensorProto.BOOL, ["s", "t"]))
    if present:
        y, pk, _ = g.op.Attention(*ins, _outputs=3, scale=0.3)
        g.output(pk, "present_k")
    else:
        y = g.op.Attention(*ins, scale=0.3)
    g.output(y, "y")
    return g.to_model()


def _feeds(b: int = 2, s: int = 3, t: int = 7, mask: bool = True) -> dict[str, np.ndarray]:
    f = {"q": RNG.standard_normal((b, KV * G, s, D)).astype(np.float32),
         "k": RNG.standard_normal((b, KV, t, D)).astype(np.float32),
         "v": RNG.standard_normal((b, KV, t, D)).astype(np.float32)}
    if mask:
        f["mask"] = np.tril(np.ones((s, t), bool), t - s)
    return f


def _attention_inputs(m: Model) -> list[list[str]]:
    return [[i.name if i is not None else "" for i in n.inputs] for n in m.graph if n.op_type == "Attention"]


@pytest.mark.parametrize("mask", [True, False])
def test_attention_reads_grouped_kv_heads_instead_of_their_repeat(mask):
    # y = Attention(q, repeat(k, 3), repeat(v, 3), mask) -> Attention(q, k, v, mask): query head
    # h reads KV head h // 3 either way, so every output is unchanged
    m = _model(mask=mask)
    before = to_onnx(m)
    assert FusionPass()(m).modified
    assert _attention_inputs(m) == [["q", "k", "v"] + (["mask"] if mask else [])]
    assert_sound(m)
    for b, s, t in ((2, 3, 7), (1, 1, 12)):
        feeds = _feeds(b, s, t, mask)
        want = reference_run(before, feeds)[0]
        for got in (ort_run(before, feeds)[0], ort_run(m, feeds)[0], InferenceSession(m).run(None, feeds)[0]):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # the default pipeline drops the repeat and the shape arithmetic that fed it
    opt = optimize(load(before), debug=True)
    assert not any(n.op_type in ("Expand", "Unsqueeze") for n in opt.graph)


@pytest.mark.parametrize("case", ["tiled_keys", "tiled_values", "values_not_repeated", "present_read"])
def test_other_head_orders_or_extra_reads_keep_the_repeat(case):
    # Unsqueeze on axis 1 tiles the heads ([k0, k1, k0, k1, ...]): query head h would read
    # KV head h % 2, not h // 3, so the rule must not fire; nor when only one side is
    # repeated or the node's present_key output (the repeated keys) is read
    kwargs = {"tiled_keys": {"k_axis": 1}, "tiled_values": {"v_axis": 1},
              "values_not_repeated": {"repeat_v": False}, "present_read": {"present": True}}[case]
    m = _model(**kwargs)
    before = to_onnx(m)
    FusionPass()(m)
    assert sum(n.op_type == "Expand" for n in m.graph) == sum(n.op_type == "Expand" for n in load(before).graph)
    if case != "values_not_repeated":
        feeds = _feeds()
        for w, g in zip(reference_run(before, feeds), ort_run(m, feeds)):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_torch_opset23_export_attention_reads_the_present_caches(decoder_models):
    # every layer's Attention reads its present key and value: no repeated copy is made
    m = optimize(load(str(decoder_models["torch23"])), debug=True)
    reads = _attention_inputs(m)
    assert len(reads) == 4
    assert [r[1:3] for r in reads] == [[f"present.{i}.key", f"present.{i}.value"] for i in range(4)]
    presents = [v for v in m.graph.outputs if v.name.startswith("present.")]
    assert len(presents) == 8 and all(u.op_type == "Attention" for v in presents for u, _ in v.uses())
