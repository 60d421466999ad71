"""Every model of the real-world corpus runs on the backend (no reference fallback), before and
after ``of.optimize``, with outputs within 1e-4 x max(1, max |onnxruntime's output|) of
onnxruntime's (silero_vad_half, a float16 model: 1e-2)."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

import onnxforge as of
from tests.fixtures.wild import CORPUS, random_feeds

NAMES = sorted(m.name for m in CORPUS)


@pytest.mark.parametrize("optimized", [False, True], ids=["original", "optimized"])
@pytest.mark.parametrize("name", NAMES)
def test_corpus_model_runs_on_the_backend_as_onnxruntime_does(wild_models, name, optimized):
    path = str(wild_models[name])
    model = of.optimize(path) if optimized else path
    sess = of.InferenceSession(model, threads=2)
    assert sess.fallback_nodes == []
    ref = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    tol = 1e-2 if name == "silero_vad_half" else 1e-4
    for feeds in random_feeds(name, path)[:2]:
        want = ref.run(None, feeds)
        got = sess.run(None, feeds)
        for g, w in zip(got, want):
            w64 = np.asarray(w, np.float64)
            scale = max(1.0, float(np.abs(w64).max(initial=0.0)))
            np.testing.assert_allclose(np.asarray(g, np.float64), w64, rtol=0, atol=tol * scale)
