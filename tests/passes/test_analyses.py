"""Shape inference and alias equivalence as passes."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

import onnxforge as of
from onnxforge.graphbuilder.ir import Value
from onnxforge.graphbuilder.shapes import ShapeError
from onnxforge.passes.analyses import alias_roots
from onnxforge.passes.manager import get_pass
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


def test_alias_analysis_records_roots_on_the_builtin_decoder():
    m = build_decoder()
    get_pass("alias_analysis")(m)
    outs = {v.name: v for v in m.graph.outputs}
    ins = {v.name: v for v in m.graph.inputs}
    for layer in range(2):
        for kind in ("key", "value"):
            assert outs[f"present.{layer}.{kind}"].meta["alias_root"] is ins[f"cache.{layer}.{kind}"]
    assert "alias_root" not in outs["logits"].meta


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
