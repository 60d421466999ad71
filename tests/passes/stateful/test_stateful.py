"""make_stateful on the onnxruntime-genai layout: in-place caches decode like onnxruntime
(the torch.onnx families: test_stateful_torch.py)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto

from onnxforge.graphbuilder.builder.graph_builder import GraphBuilder
from onnxforge.graphbuilder.ir.core import MUST_ALIAS, READ_WRITE
from onnxforge.passes.stateful.convert import StatefulError, make_stateful

PROMPT = [5, 17, 42, 7, 99, 3]
STEPS = 8
MAX_LENGTH = 32


def addr(a: np.ndarray) -> int:
    return int(a.__array_interface__["data"][0])


@pytest.mark.slow
def test_stateful_genai_decoder_decodes_like_onnxruntime_in_place(decoder_models: dict[str, Path]):
    import onnxruntime as ort
    from onnxforge.kernels_cy.runtime.state import make_state

    path = decoder_models["genai_fp32"]
    model = make_stateful(str(path), max_length=MAX_LENGTH, batch=1)
    g = model.graph
    assert len(g.bindings) == 8
    for past, present in g.bindings:
        assert past.access == READ_WRITE and present.alias_of is past
        assert past.type.shape == (1, 2, MAX_LENGTH, 32) and present.type == past.type
        node = present.producer()
        assert (present.index, present.index + 2, MUST_ALIAS) in {
            (a.output_index, a.input_index, a.kind) for a in node.output_alias}
    import onnxforge as of

    of.verify(model)

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    past = {i.name: np.zeros((1, 2, 0, 32), np.float32) for i in sess.get_inputs()
            if i.name.startswith("past_key_values")}
    st = make_state(model)
    addresses = st.addresses()
    ids, total, ref_tokens, tokens = PROMPT, 0, [], []
    ref_ids = PROMPT
    for step in range(STEPS):
        total += len(ids)
        mask = np.ones((1, total), np.int64)
        ref = dict(zip(names, sess.run(None, {"input_ids": np.array([ref_ids], np.int64),
                                             "attention_mask": mask, **past})))
        past = {k: ref[k.replace("past_key_values", "present")] for k in past}
        out = st.run({"input_ids": np.array([ids], np.int64), "attention_mask": mask})
        np.testing.assert_allclose(out["logits"][0, -1], ref["logits"][0, -1], atol=1e-4, rtol=0)
        assert st.addresses() == addresses, f"step {step}: a cache buffer moved"
        assert st.last_run.copied_bytes == 0
        ref_ids = [int(ref["logits"][0, -1].argmax())]
        ids = [int(out["logits"][0, -1].argmax())]
        ref_tokens.append(ref_ids[0])
        tokens.append(ids[0])
    assert tokens == ref_tokens
    # the valid prefix of each in-place cache is onnxruntime's present
    for name, value in st.values.items():
        np.testing.assert_allclose(value[:, :, :total], past[name], atol=1e-5)
        assert not np.any(value[:, :, total:])


def _concat_decoder():
    g = GraphBuilder(opset=23)
    x = g.input("x", TensorProto.FLOAT, [1, 1, 4])
    past = g.input("past_key_values.0.key", TensorProto.FLOAT, [1, 1, "past", 4])
    g.output(g.op.Concat(past, g.op.Unsqueeze(x, g.initializer("ax", np.array([0], np.int64))), axis=2),
             "present.0.key")
    return g.to_model()


def test_an_unrecognized_pair_is_a_typed_error_naming_it():
    with pytest.raises(StatefulError, match=r"Concat-based cache needs the inputs input_ids and "
                                            r"attention_mask"):
        make_stateful(_concat_decoder(), max_length=8)
    with pytest.raises(StatefulError, match="no output 'present.0.value'"):
        _missing_present()
    with pytest.raises(StatefulError, match="not a graph output"):
        make_stateful(_concat_decoder(), max_length=8, bindings={"past_key_values.0.key": "nope"})
    with pytest.raises(StatefulError, match="max_length"):
        make_stateful(_concat_decoder(), max_length=0)


def _missing_present():
    g = GraphBuilder(opset=23)
    past = g.input("past_key_values.0.value", TensorProto.FLOAT, [1, 1, "past", 4])
    g.output(g.op.Identity(past), "y")
    make_stateful(g.to_model(), max_length=8)


@pytest.mark.slow
def test_the_stateful_genai_decoder_survives_optimize_and_exports_its_feedback(decoder_models):
    import json

    import onnxforge as of

    model = of.optimize(make_stateful(str(decoder_models["genai_fp32"]), max_length=MAX_LENGTH))
    of.verify(model)
    pairs = {i.name: o.name for i, o in model.graph.bindings}
    assert pairs == {f"past_key_values.{n}.{k}": f"present.{n}.{k}" for n in range(4) for k in ("key", "value")}
    std = of.to_standard_onnx(model, keep_domains=["com.microsoft"])
    assert json.loads({p.key: p.value for p in std.metadata_props}["onnxforge.feedback"]) == pairs


def test_explicit_bindings_override_names_and_a_rebinding_is_refused():
    with pytest.raises(StatefulError, match="'x' is not a graph input|not a graph input"):
        make_stateful(_concat_decoder(), max_length=8, bindings={"x_missing": "present.0.key"})
    g = GraphBuilder(opset=23)
    past = g.input("past_key_values.0.key", TensorProto.FLOAT, [1, 1, 4, 4])
    g.output(g.op.Identity(past), "present.0.key")
    g.bind(past, "present.0.key")
    with pytest.raises(StatefulError, match="already declares persistent bindings"):
        make_stateful(g.to_model(), max_length=8)
