"""One compiled session shared by threads: runs never see each other (DESIGN, *Runs,
faults and many sequences*). Every result is compared bitwise with the same call run
alone on the same session; the decoders are real exports (onnxruntime-genai, torch)."""
from __future__ import annotations

import json
import threading

import numpy as np
import pytest

from onnxforge.kernels_cy.errors import StateInitError
from onnxforge.kernels_cy.runtime.session import InferenceSession, RunCounters
from onnxforge.kernels_cy.runtime.state import make_state
from onnxforge.kernels_cy.runtime.threads import BlasThreads
from onnxforge.passes.stateful.convert import make_stateful

THREADS = 8
STEPS = 200
CAPACITY = 224


def _prompt(i: int) -> list[int]:
    return [(7 * i + 3 * j + 1) % 97 for j in range(3 + i % 4)]


def _decode(state, prompt: list[int], steps: int, mask: bool) -> tuple[list[int], np.ndarray]:
    """Greedy decode; returns the tokens and every step's last-row logits."""
    ids, total, tokens, logits = prompt, 0, [], []
    for _ in range(steps):
        total += len(ids)
        feeds = {"input_ids": np.array([ids], np.int64)}
        if mask:
            feeds["attention_mask"] = np.ones((1, total), np.int64)
        out = state.run(feeds)
        row = out["logits"][0, -1]
        logits.append(row.copy())
        ids = [int(row.argmax())]
        tokens.append(ids[0])
    return tokens, np.stack(logits)


def _run_threads(fn, n: int) -> list:
    results: list = [None] * n
    errors: list = []
    start = threading.Barrier(n)

    def work(i: int) -> None:
        try:
            start.wait()
            results[i] = fn(i)
        except BaseException as e:  # noqa: BLE001 - reported by the test below
            errors.append((i, e))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return results


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["genai_fp32", "genai_int4", "torch23"])
def test_eight_states_over_one_session_decode_like_each_alone(decoder_models, variant):
    """8 threads, one session, a state each, 200 steps each: every thread's tokens and
    logits are bitwise those of the same decode run alone."""
    sess = InferenceSession(make_stateful(str(decoder_models[variant]), max_length=CAPACITY, batch=1), threads=2)
    serial = [_decode(make_state(sess), _prompt(i), STEPS, True) for i in range(THREADS)]
    assert len({tuple(t) for t, _ in serial}) > 1  # the prompts lead to different decodes

    def one(i: int):
        st = make_state(sess)
        assert st.session is sess  # no compile: the session's plan is shared
        return _decode(st, _prompt(i), STEPS, True)

    got = _run_threads(one, THREADS)
    for i, ((tokens, logits), (want_tokens, want_logits)) in enumerate(zip(got, serial)):
        assert tokens == want_tokens, f"thread {i}"
        np.testing.assert_array_equal(logits, want_logits, err_msg=f"thread {i}")


@pytest.mark.slow
def test_one_stateless_session_run_from_threads_equals_each_run_alone(decoder_models):
    """The past/present export (GroupQueryAttention over a new present buffer) run from 8
    threads at once with different lengths: each result is the serial one, bitwise, and
    each caller's counters are its own run's."""
    path = decoder_models["genai_fp32"]
    sess = InferenceSession(str(path), threads=2)
    names = {a.name: a for a in sess.get_inputs()}
    cfg = json.loads((path.parent / "genai_config.json").read_text())["model"]["decoder"]
    rng = np.random.default_rng(0)

    def feeds(i: int) -> dict:
        past, new = 3 + 5 * i, 1 + i % 3
        out = {"input_ids": rng.integers(0, 90, (1, new)).astype(np.int64),
               "attention_mask": np.ones((1, past + new), np.int64)}
        for n, a in names.items():
            if n.startswith("past_key_values"):
                heads, dim = a.shape[1], cfg["head_size"]
                out[n] = rng.standard_normal((1, heads, past, dim)).astype(np.float32)
        return out

    all_feeds = [feeds(i) for i in range(THREADS)]
    serial, serial_counters = [], []
    for f in all_feeds:
        c = RunCounters()
        serial.append(sess.run(None, f, counters=c))
        serial_counters.append(c)

    def one(i: int):
        outs = []
        for _ in range(20):
            c = RunCounters()
            outs.append((sess.run(None, all_feeds[i], counters=c), c))
        return outs

    for i, runs in enumerate(_run_threads(one, THREADS)):
        for outs, c in runs:
            for a, b in zip(outs, serial[i]):
                np.testing.assert_array_equal(a, b)
            assert c == serial_counters[i]


def test_a_state_over_a_session_takes_the_sessions_thread_bound(decoder_models):
    sess = InferenceSession(make_stateful(str(decoder_models["genai_fp32"]), max_length=16, batch=1), threads=2)
    assert make_state(sess, threads=2).session is sess
    with pytest.raises(StateInitError, match="threads=2"):
        make_state(sess, threads=1)


class _FakeBlas:
    user_api = "blas"

    def __init__(self) -> None:
        self.n = 4
        self.calls: list[int] = []

    def get_num_threads(self) -> int:
        return self.n

    def set_num_threads(self, n: int) -> None:
        self.calls.append(n)
        self.n = n


def test_no_run_changes_blas_threads_while_another_run_is_active():
    lib = _FakeBlas()
    blas = BlasThreads()
    blas._libs = [lib]
    first = blas.begin(2)
    assert lib.n == 2  # alone: the run's bound
    blas.want(1)
    assert lib.n == 1
    second = blas.begin(2)
    blas.want(2)  # two runs active: nobody changes the process-wide count
    blas.for_work(1 << 30, 1 << 30)
    assert lib.n == 1 and lib.calls == [2, 1]
    blas.end(first)
    assert lib.n == 1  # the other run is still active
    blas.end(second)
    assert lib.n == 4  # the last run out restores the caller's setting
    assert blas.active == 0
