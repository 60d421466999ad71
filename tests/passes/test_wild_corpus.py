"""Acceptance: the default pipeline on real-world models made by other tools.

The corpus (``tests/fixtures/wild.py``) holds OCR CNNs and classifiers exported
from Paddle, voice-activity RNNs with ``If`` branches exported by torch and spox,
YOLO/PicoDet detectors and a tf2onnx classifier, all shipped in public PyPI wheels.
For each model:

* ``verify`` accepts the original file and the optimized one;
* onnxruntime computes the same outputs on both (max abs difference at most
  ``1e-5 * max(1, largest magnitude of the output)``) on random inputs of the
  declared shapes;
* the optimized file is at most 1.01x the original's size and has no more nodes
  (all graphs, ``If``/``Loop`` bodies included);
* ``optimize(debug=True)``, which checks every invariant between passes, ends in
  the same model on all but the largest.

The node counts are printed beside the originals' at the end of the module.
Decoders are covered by ``test_optimize_decoders.py``.
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnxruntime.capi.onnxruntime_pybind11_state import Fail, InvalidArgument, RuntimeException

import onnxforge as of
from tests.fixtures.wild import BY_NAME, NAMES, proto_nodes, random_feeds

ORT_ERRORS = (Fail, InvalidArgument, RuntimeException)
SIZE_RATIO_MAX = 1.01
RTOL = 1e-5
DEBUG_MAX_NODES = 1000
"""``optimize(debug=True)`` runs on the models with fewer nodes than this ..."""
DEBUG_NAMES = tuple(n for n in NAMES if n != "layout_cdla")
"""... which are all but layout_cdla (1,493 nodes; checked in the test)."""

pytestmark = pytest.mark.slow

XFAIL: dict[tuple[str, str], str] = {}
"""``(test, model) -> reason`` for the checks that onnxforge fails today (strict xfail)."""


def _params(test: str, names: tuple[str, ...] = NAMES) -> list[object]:
    return [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=XFAIL[(test, n)]))
            if (test, n) in XFAIL else n for n in names]


def model_nodes(path: str | os.PathLike[str]) -> int:
    """Nodes of the model file at ``path`` in all graphs and local functions."""
    proto = onnx.load_model(str(path), load_external_data=False)
    return proto_nodes(proto)


@dataclass
class Optimized:
    original: Path
    path: Path
    nodes_before: int
    nodes_after: int


class _Corpus:
    """Optimizes each model once, on first request, into a temporary folder."""

    def __init__(self, models: dict[str, Path], folder: Path) -> None:
        self.models = models
        self.folder = folder
        self.done: dict[str, Optimized] = {}

    def __call__(self, name: str) -> Optimized:
        if name not in self.done:
            source = self.models[name]
            target = self.folder / f"{name}.opt.onnx"
            of.save(of.optimize(str(source)), target)
            self.done[name] = Optimized(source, target, model_nodes(source), model_nodes(target))
        return self.done[name]


@pytest.fixture(scope="module")
def optimized(wild_models, tmp_path_factory, request) -> Iterator[_Corpus]:
    corpus = _Corpus(wild_models, tmp_path_factory.mktemp("wild"))
    yield corpus
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    lines = [f"{'model':<26} {'kind':<14} {'nodes before':>12} {'after':>7} {'size ratio':>10}"]
    for name, r in corpus.done.items():
        ratio = r.path.stat().st_size / r.original.stat().st_size
        lines.append(f"{name:<26} {BY_NAME[name].kind:<14} {r.nodes_before:>12} {r.nodes_after:>7} "
                     f"{ratio:>10.3f}")
    text = "\n".join(lines)
    print("\n" + text)
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is not None and capture is not None and corpus.done:
        with capture.global_and_fixture_disabled():
            reporter.write_line("")
            reporter.write_sep("-", "onnxforge on the real-world corpus (nodes in all graphs)")
            reporter.write_line(text)


def _session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("name", _params("verify_original"))
def test_verify_accepts_original(name, wild_models):
    of.verify(str(wild_models[name]))
    assert of.check(of.load(str(wild_models[name]))) == []


@pytest.mark.parametrize("name", _params("verify_optimized"))
def test_verify_accepts_optimized(name, optimized):
    result = optimized(name)
    of.verify(str(result.path))
    assert of.check(of.load(str(result.path))) == []


@pytest.mark.parametrize("name", _params("outputs"))
def test_optimized_outputs_match_original(name, optimized):
    result = optimized(name)
    before, after = _session(result.original), _session(result.path)
    assert [o.name for o in after.get_outputs()] == [o.name for o in before.get_outputs()]
    for case, feed in enumerate(random_feeds(name, result.original, seed=17)):
        expected = before.run(None, feed)
        got = after.run(None, feed)
        for output, want, have in zip(before.get_outputs(), expected, got):
            label = f"{name} case {case} output {output.name!r}"
            assert have.dtype == want.dtype and have.shape == want.shape, label
            scale = max(1.0, float(np.abs(want.astype(np.float64)).max(initial=0.0)))
            diff = float(np.abs(want.astype(np.float64) - have.astype(np.float64)).max(initial=0.0))
            assert diff <= RTOL * scale, f"{label}: max abs difference {diff} > {RTOL} x {scale}"


RNN_IF = tuple(n for n in NAMES if BY_NAME[n].kind == "rnn+if")
"""The voice-activity models whose ``If`` branches give a value two ranks: their
decoder's LSTM runs only on chunks of one frame."""


@pytest.mark.parametrize("name", RNN_IF)
@pytest.mark.parametrize("factor", [2, 3])
def test_inputs_the_original_rejects_are_still_rejected(name, factor, optimized):
    """A chunk of several frames makes the original fail in onnxruntime (its LSTM meets a
    5-D input); the optimized model, whose rank tests were folded from that fact
    (``passes/analyses/failing_branches.py``), fails on it too."""
    result = optimized(name)
    before, after = _session(result.original), _session(result.path)
    for feed in random_feeds(name, result.original, seed=23):
        chunk = feed["input"]
        feed = {**feed, "input": np.concatenate([chunk] * factor, axis=-1)}
        for session in (before, after):
            with pytest.raises(ORT_ERRORS, match="LSTM"):
                session.run(None, feed)


def test_the_rnn_if_models_are_covered():
    assert len(RNN_IF) == 3


@pytest.mark.parametrize("name", _params("size"))
def test_optimized_file_is_no_larger(name, optimized):
    result = optimized(name)
    before, after = result.original.stat().st_size, result.path.stat().st_size
    assert after <= SIZE_RATIO_MAX * before, f"{name}: {after:,} B after, {before:,} B before"


@pytest.mark.parametrize("name", _params("nodes"))
def test_optimized_has_no_more_nodes(name, optimized):
    result = optimized(name)
    print(f"{name}: {result.nodes_before} -> {result.nodes_after} nodes (all graphs)")
    assert result.nodes_after <= result.nodes_before


@pytest.mark.parametrize("name", _params("debug", DEBUG_NAMES))
def test_debug_pipeline_checks_invariants_and_agrees(name, optimized, tmp_path):
    result = optimized(name)
    assert result.nodes_before < DEBUG_MAX_NODES
    target = tmp_path / f"{name}.debug.onnx"
    model = of.optimize(str(result.original), debug=True)
    assert of.check(model) == []
    of.save(model, target)
    assert model_nodes(target) == result.nodes_after
