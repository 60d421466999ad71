"""onnxforge/text/sampling.py: validation, greedy, seeds, and each filter against numpy."""
from __future__ import annotations

import numpy as np
import pytest

import onnxforge as of
from onnxforge.text.sampling import Sampler, Sampling


@pytest.mark.parametrize("kwargs", [
    {"temperature": -0.1}, {"temperature": float("nan")}, {"temperature": "hot"}, {"top_k": -1},
    {"top_k": 1.5}, {"top_p": 0.0}, {"top_p": 1.1}, {"repetition_penalty": 0.0}, {"seed": -3},
    {"seed": 1.0}, {"top_k": True},
])
def test_invalid_values_are_typed_errors(kwargs):
    with pytest.raises(of.SamplingError, match=next(iter(kwargs))) as e:
        of.Sampling(**kwargs)
    assert isinstance(e.value, ValueError) and isinstance(e.value, of.OnnxforgeError)


def test_frozen_and_greedy_by_default():
    s = of.Sampling()
    assert s.greedy and (s.temperature, s.top_k, s.top_p, s.repetition_penalty, s.seed) == (0.0, 0, 1.0, 1.0, None)
    with pytest.raises(AttributeError):
        s.temperature = 1.0  # type: ignore[misc]


def _softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


def test_draws_follow_the_filtered_distribution_from_the_seed():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=50).astype(np.float32)
    seen = [3, 4, 7]
    s = Sampling(temperature=0.7, top_k=10, top_p=0.8, repetition_penalty=1.3, seed=11)
    # the oracle: the same steps written out, drawing with the same seeded generator
    x = logits.astype(np.float64).copy()
    x[seen] = np.where(x[seen] > 0, x[seen] / 1.3, x[seen] * 1.3)
    x = x / 0.7
    x[np.argsort(-x)[10:]] = -np.inf
    p = _softmax(x)
    order = np.argsort(-p, kind="stable")
    n = int(np.argmax(np.cumsum(p[order]) >= 0.8)) + 1
    q = np.zeros_like(p)
    q[order[:n]] = p[order[:n]]
    q /= q.sum()
    oracle = np.random.default_rng(11)
    expected = [int(oracle.choice(q.size, p=q)) for _ in range(20)]
    sampler = Sampler(s)
    assert [sampler.pick(logits, seen) for _ in range(20)] == expected
    assert set(expected) <= set(order[:n].tolist())


def test_greedy_and_degenerate_filters_pick_the_argmax():
    logits = np.array([0.1, 2.0, -1.0, 1.9])
    assert Sampler().pick(logits) == 1
    assert Sampler(Sampling(temperature=5.0, top_k=1, seed=1)).pick(logits) == 1
    assert Sampler(Sampling(temperature=5.0, top_p=1e-6, seed=1)).pick(logits) == 1
    # the penalty divides token 1's positive logit by 4: token 3 wins
    assert Sampler(Sampling(repetition_penalty=4.0)).pick(logits, [1]) == 3
