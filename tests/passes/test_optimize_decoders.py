"""Acceptance: the default pipeline on real exported decoders.

``of.optimize`` reduces node count where the model has redundancy, loses none of
its declarations, and ``to_standard_onnx(optimize(m))`` computes in onnxruntime
what the original computes (max abs diff <= 1e-5 on random token ids with an
all-ones attention mask; int4 models compared with MatMulNBits at accuracy_level 0).
"""
from __future__ import annotations

import numpy as np
import pytest

import onnxforge as of
from onnxforge.passes.framework.pipeline import optimize
from tests.fixtures.decoders import random_decoder_feeds
from tests.passes.export.test_export_decoders import VARIANTS, _original, _session


@pytest.fixture(scope="module")
def optimized(decoder_models):
    out = {}
    for variant in VARIANTS:
        m = of.load(decoder_models[variant])
        before = sum(1 for _ in m.graph)
        optimize(m, debug=True)
        out[variant] = (before, m)
    return out


@pytest.mark.parametrize("variant", VARIANTS)
def test_optimize_keeps_interface_and_verifies(variant, optimized, decoder_models):
    before, m = optimized[variant]
    original = of.load(decoder_models[variant])
    assert [v.name for v in m.graph.inputs] == [v.name for v in original.graph.inputs]
    assert [v.name for v in m.graph.outputs] == [v.name for v in original.graph.outputs]
    assert of.check(m) == []
    assert sum(1 for _ in m.graph) <= before


def test_torch_opset20_export_has_redundancy_that_optimize_removes(optimized):
    before, m = optimized["torch20"]
    assert sum(1 for _ in m.graph) < before


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("past", [0, 3])
def test_standard_export_of_optimized_matches_original(variant, past, optimized, decoder_models):
    path = decoder_models[variant]
    feeds = random_decoder_feeds(path, past=past, seq=4, seed=past + 29)
    expected = _session(_original(path)).run(None, feeds)
    std = of.to_standard_onnx(optimized[variant][1])
    got = _session(std).run(None, feeds)
    diff = max(float(np.abs(a - b).max()) for a, b in zip(expected, got))
    assert diff <= 1e-5, diff
