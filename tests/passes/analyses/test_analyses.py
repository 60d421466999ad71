"""Shape inference, alias equivalence and effects as typed analyses, and their passes."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

import onnxforge as of
from onnxforge.graphbuilder.ir.core import Value
from onnxforge.graphbuilder.shapes.context import ShapesContext
from onnxforge.graphbuilder.shapes.symtensor import ShapeError
from onnxforge.passes import AnalysisError, AnalysisManager, PassManager, list_analyses
from onnxforge.passes.analyses.aliases import AliasRoots, alias_roots
from onnxforge.passes.analyses.effects import EffectsAnalysis
from onnxforge.passes.analyses.shapes import ShapeInferencePass
from onnxforge.passes.analyses.effects import Effects
from onnxforge.passes.framework.pass_manager import get_pass
from onnxforge.proto_ext.types import TensorType
from onnxforge.samples import build_decoder

FLOAT = TensorProto.FLOAT


def test_shape_inference_pass_gives_symbolic_present_length(decoder_models):
    m = of.load(decoder_models["torch23"])
    for v in m.graph.values():
        if v.producer() is not None:
            v.type = None  # forget what the exporter declared
    result = get_pass("shape_inference")(m)
    assert result.modified
    present = next(v for v in m.graph.outputs if v.name == "present.0.key")
    assert str(present.type) == "FLOAT[batch, 2, past_sequence_length + sequence_length, 32]"
    logits = next(v for v in m.graph.outputs if v.name == "logits")
    assert str(logits.type) == "FLOAT[batch, sequence_length, 512]"


def test_alias_analysis_leaves_typed_roots_in_the_manager_cache():
    m = build_decoder()
    pm = PassManager(["alias_analysis"])
    assert not pm(m).modified
    roots = pm.analyses.cached("aliases", m)
    assert isinstance(roots, AliasRoots)
    outs = {v.name: v for v in m.graph.outputs}
    ins = {v.name: v for v in m.graph.inputs}
    for layer in range(2):
        for kind in ("key", "value"):
            cache = ins[f"cache.{layer}.{kind}"]
            assert roots.root(outs[f"present.{layer}.{kind}"]) is cache
            assert outs[f"present.{layer}.{kind}"] in roots.members(cache)
    assert roots.root(outs["logits"]) is outs["logits"] and not roots.is_aliased(outs["logits"])
    # nothing is left in untyped value metadata
    assert not any("alias_root" in v.meta for g in m.all_graphs() for v in g.values())


def test_registered_analyses_have_typed_results():
    m = build_decoder()
    am = AnalysisManager(m)
    assert {"shapes", "aliases", "effects", "liveness", "memory_plan"} <= set(list_analyses())
    ctx = am.get("shapes")
    assert isinstance(ctx, ShapesContext)
    logits = next(v for v in m.graph.outputs if v.name == "logits")
    assert str(ctx.type_of(logits)) == "FLOAT[1, seq, 64]"
    fx = am.get(EffectsAnalysis)
    assert isinstance(fx, Effects)
    present = next(v for v in m.graph.outputs if v.name == "present.0.key")
    cache = next(v for v in m.graph.inputs if v.name == "cache.0.key")
    assert fx.root(present) is cache and fx.version(present) == 1 and fx.is_state(present)
    assert am.get("aliases").root(present) is cache
    with pytest.raises(AnalysisError, match="no analysis named 'nope'.*shapes"):
        am.get("nope")


def test_shapes_analysis_does_not_write_the_ir_but_the_pass_does():
    g = of.GraphBuilder(opset=23, infer_shapes=False)
    x = g.input("x", FLOAT, ["n", 8])
    y = g.output(g.op.Relu(x), "y")
    m = g.to_model()
    am = AnalysisManager(m)
    assert str(am.get("shapes").type_of(y)) == "FLOAT[n, 8]" and y.type is None
    assert get_pass("shape_inference")(m).modified and str(y.type) == "FLOAT[n, 8]"
    # writing types drops only the shapes and what was computed from them
    plan = am.get("memory_plan")
    fx = am.get("effects")
    live = am.get("liveness")
    dropped = am.invalidate(ShapeInferencePass.invalidates, preserves=ShapeInferencePass.preserves)
    assert sorted(dropped) == ["memory_plan", "shapes"]
    assert am.cached("memory_plan") is None and am.cached("effects") is fx and am.cached("liveness") is live
    assert am.get("memory_plan") is not plan


def _cache_graph(out_type):
    g = of.GraphBuilder(opset=23, infer_shapes=False)
    cache = g.input("cache", FLOAT, [1, 2, 16, 4], access=of.READ_WRITE)
    new = g.input("new", FLOAT, [1, 2, 1, 4])
    pos = g.input("pos", TensorProto.INT64, [])
    g.output(g.op.CacheUpdate(cache, new, pos), "updated", type=out_type)
    return g.to_model()


def test_alias_analysis_merges_constraints_through_the_alias():
    m = _cache_graph(TensorType(FLOAT, (1, 2, None, 4)))
    alias_roots(m)
    out = m.graph.outputs[0]
    assert out.type == TensorType(FLOAT, (1, 2, 16, 4))


@pytest.mark.parametrize("bad", [TensorType(TensorProto.FLOAT16, (1, 2, 16, 4)),
                                 TensorType(FLOAT, (1, 2, 16)),
                                 TensorType(FLOAT, (1, 2, 17, 4))])
def test_alias_analysis_rejects_incompatible_aliased_types(bad):
    m = _cache_graph(bad)
    with pytest.raises(ShapeError) as info:
        get_pass("alias_analysis")(m)
    assert "updated" in str(info.value) and "cache" in str(info.value)


def test_alias_cycle_is_rejected():
    a, b = Value("a", TensorType(FLOAT, (2,))), Value("b", TensorType(FLOAT, (2,)))
    g = of.GraphBuilder(opset=23, infer_shapes=False)
    g.graph.add_input(a)
    g.graph.add_input(b)
    a.alias_of, b.alias_of = b, a
    with pytest.raises(ShapeError, match="cycle"):
        alias_roots(g.to_model())


def test_analyses_do_not_change_structure():
    m = build_decoder()
    names = [n.name for n in m.graph]
    assert not get_pass("alias_analysis")(m).modified
    get_pass("shape_inference")(m)
    assert [n.name for n in m.graph] == names
    assert of.check(m) == []
    np.testing.assert_equal(len(m.graph.bindings), 4)
