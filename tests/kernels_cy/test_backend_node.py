"""onnx's node test cases through :mod:`onnxforge.backend`.

Every generated node case whose operators the backend claims runs here (the
``*_expanded`` function-body variants too); the suite prints the claimed
operators and the pass count. A case that fails is listed in KNOWN_FAILURES with
its reason; anything else failing, or a listed case that starts passing, fails
the test so the list stays exact.
"""
from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import onnx
import pytest
from onnx.backend.test.runner import Runner, _normalize_tensor

from onnxforge.backend import OnnxforgeBackend
from onnxforge.kernels_cy.errors import BackendError
from onnxforge.kernels_cy.runtime.session import backend_ops

KNOWN_FAILURES: dict[str, str] = {
    "test_identity_opt": "optional-typed values: the backend supports tensors only",
    "test_identity_sequence": "sequence-typed values: the backend supports tensors only",
    "test_scan_sum": "Scan-8 (batched, with sequence_lens) is refused at plan time; Scan 9+ is supported",
    "test_batchnorm_epsilon_training_mode": "BatchNormalization training_mode=1 is refused at plan time (inference form only)",
    "test_batchnorm_example_training_mode": "BatchNormalization training_mode=1 is refused at plan time (inference form only)",
}
# Resize's align_corners with an output length from scales: the specification and onnxruntime
# divide by the integer output length minus one, onnx's expected outputs (onnx.reference) by
# in * scale - 1 (the same cases are strict expected failures in tests/test_backend_interface.py)
KNOWN_FAILURES.update({
    f"test_resize_downsample_scales_{mode}_align_corners": "onnx's expected outputs divide by a fractional "
    "output length; the specification and onnxruntime by the integer one"
    for mode in ("linear", "cubic")
})
# Dropout with a training_mode graph input is refused at plan time: the backend runs
# inference, and training-mode Dropout draws a random mask
KNOWN_FAILURES.update({
    f"test_training_dropout{tail}": "Dropout with a non-constant training_mode is refused at plan time"
    for tail in ("", "_default", "_default_mask", "_mask", "_zero_ratio", "_zero_ratio_mask")
})


def _ops_of(graph: onnx.GraphProto) -> set[tuple[str, str]]:
    out = set()
    for n in graph.node:
        out.add(("" if n.domain in ("", "ai.onnx") else n.domain, n.op_type))
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                out |= _ops_of(a.g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for g in a.graphs:
                    out |= _ops_of(g)
    return out


def _tensor_only(model: onnx.ModelProto) -> bool:
    vals = list(model.graph.input) + list(model.graph.output)
    return all(v.type.HasField("tensor_type") for v in vals)


@pytest.fixture(scope="module")
def cases() -> list[Any]:
    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        all_cases = load_model_tests(kind="node")
    claimed = set(backend_ops())
    return [c for c in all_cases if c.model is not None and _ops_of(c.model.graph) <= claimed
            and any(op[0] == "" for op in _ops_of(c.model.graph))]


def _run_case(case: Any) -> str | None:
    """None when the case passes, else a one-line reason."""
    try:
        rep = OnnxforgeBackend.prepare(case.model)
        for inputs, ref_outputs in case.data_sets:
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")
                outputs = list(rep.run([_normalize_tensor(x) for x in inputs]))
            Runner.assert_similar_outputs([_normalize_tensor(x) for x in ref_outputs], outputs,
                                          rtol=case.rtol, atol=case.atol, model_dir=None)
    except (AssertionError, BackendError, ValueError, TypeError, IndexError, KeyError,
            AttributeError, NotImplementedError, RuntimeError, OverflowError) as exc:
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
    return None


def test_node_cases_of_claimed_standard_ops(cases: list[Any], capsys: Any) -> None:
    claimed = sorted(op for d, op in backend_ops() if d == "")
    failures: dict[str, str] = {}
    for c in cases:
        reason = _run_case(c)
        if reason is not None:
            failures[c.name] = reason
    passed = len(cases) - len(failures)
    with capsys.disabled():
        print(f"\nclaimed standard ops ({len(claimed)}): {' '.join(claimed)}")
        print(f"onnx node cases: {passed} of {len(cases)} pass; {len(failures)} listed as known failures")
        for name in sorted(failures):
            print(f"  {name}: {KNOWN_FAILURES.get(name, failures[name])}")
    unexpected = {n: r for n, r in failures.items() if n not in KNOWN_FAILURES}
    fixed = sorted(n for n in KNOWN_FAILURES if n not in failures and any(c.name == n for c in cases))
    assert not unexpected, "\n".join(f"{n}: {r}" for n, r in sorted(unexpected.items()))
    assert not fixed, f"listed as failing but now pass: {fixed}"
