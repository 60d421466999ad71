"""The differential fuzz harness (tests/fuzz) on a few hundred cases: no crash, no untyped
error, no mismatch against onnx.reference / onnxruntime / float64 numpy.

The full run is ``python -m tests.fuzz --cases 20000``."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import onnxforge as of
from tests.fuzz import known
from tests.fuzz.case import Draw, Skip
from tests.fuzz.harness import run_fuzz
from tests.fuzz.runner import judge, op_table, ops_for

TABLE = op_table()
OPS = ops_for(TABLE)


def test_every_backend_operator_has_a_generator():
    assert set(of.backend_ops()) <= set(TABLE)


def test_five_hundred_cases_in_worker_processes():
    totals = run_fuzz(500, seed=24, jobs=2, batch=125)
    assert totals.cases == 500
    assert (totals.count("crash"), totals.count("untyped"), totals.count("mismatch")) == (0, 0, 0), \
        totals.report()
    assert totals.count("ok") > 400


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(op=st.sampled_from(OPS), seed=st.integers(0, 2**32 - 1))
def test_drawn_cases_agree_with_their_oracle(op, seed):
    try:
        case = TABLE[op](Draw(np.random.default_rng(seed)))
    except Skip:
        return
    outcome = judge(case)
    assert outcome.status not in ("untyped", "mismatch"), f"{outcome.reason}\n{outcome.detail}"
    if outcome.status == "out-of-spec":
        assert outcome.reason in known.OUT_OF_SPEC or outcome.reason.startswith("onnx.checker")


def test_a_crash_is_counted_not_fatal(monkeypatch, tmp_path):
    """A worker that dies in a case is counted as one crash; the batch goes on after it."""
    import subprocess
    import sys

    from tests.fuzz import harness

    real = harness._spawn

    def spawn(seed, start, stop, path, op):
        if start == 3:  # this batch dies at once: case 3 is the crash, 4.. are run again
            return subprocess.Popen([sys.executable, "-c", "import os; os.abort()"], stderr=subprocess.PIPE)
        return real(seed, start, stop, path, op)

    monkeypatch.setattr(harness, "_spawn", spawn)
    totals = harness.run_fuzz(6, seed=1, jobs=1, batch=3)
    assert totals.cases == 6 and totals.count("crash") == 1
    assert totals.failures[0]["index"] == 3


@pytest.mark.parametrize("key", sorted(known.OUT_OF_SPEC))
def test_out_of_spec_entries_give_their_reason(key):
    assert len(known.OUT_OF_SPEC[key]) > 20
