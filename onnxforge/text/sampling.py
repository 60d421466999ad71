"""How the next token is picked from the logits: :class:`Sampling` (the values) and
:class:`Sampler` (the values plus a random generator seeded from them).

The steps, in the order onnxruntime-genai and ``transformers`` apply them::

    logits -> repetition penalty (tokens seen: positive logits / R, negative ones * R)
           -> temperature == 0: argmax (greedy; top_k, top_p and the seed do not matter)
           -> / temperature -> top_k (keep the K largest) -> top_p (keep the smallest
              set whose probability reaches P) -> one draw from numpy's Generator
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from onnxforge.text.errors import SamplingError

__all__ = ["Sampler", "Sampling"]


def _number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)):
        raise SamplingError(f"Sampling.{name} must be a finite number, got {value!r}")
    return float(value)


@dataclass(frozen=True, slots=True)
class Sampling:
    """Sampling values: greedy by default (``temperature == 0``).

    ``top_k == 0`` keeps every token, ``top_p == 1`` keeps the whole distribution,
    ``repetition_penalty == 1`` changes nothing; ``seed`` makes the draws reproducible
    (None: a fresh seed from the operating system)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if _number("temperature", self.temperature) < 0:
            raise SamplingError(f"Sampling.temperature must be >= 0 (0 is greedy), got {self.temperature!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise SamplingError(f"Sampling.top_k must be an int >= 0 (0 keeps every token), got {self.top_k!r}")
        if not 0 < _number("top_p", self.top_p) <= 1:
            raise SamplingError(f"Sampling.top_p must be in (0, 1], got {self.top_p!r}")
        if _number("repetition_penalty", self.repetition_penalty) <= 0:
            raise SamplingError(f"Sampling.repetition_penalty must be > 0 (1 changes nothing), "
                                f"got {self.repetition_penalty!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)
                                      or self.seed < 0):
            raise SamplingError(f"Sampling.seed must be None or an int >= 0, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


class Sampler:
    """Picks tokens with ``sampling``; one per sequence (its generator advances per draw)."""

    def __init__(self, sampling: Sampling | None = None, stream: int | None = None) -> None:
        """``stream``: draws from the generator seeded with ``(seed, stream)`` instead of
        ``seed`` (the continuations of one forked sequence, each reproducible)."""
        self.sampling = sampling if sampling is not None else Sampling()
        seed = self.sampling.seed
        self._rng = np.random.default_rng(seed if stream is None or seed is None else [seed, stream])

    def pick(self, logits: np.ndarray, seen: Iterable[int] = ()) -> int:
        """The next token from the last position's ``logits`` [vocabulary]; ``seen``: the
        tokens the repetition penalty applies to (prompt and generated)."""
        s = self.sampling
        x = np.array(logits, dtype=np.float64).reshape(-1)
        if s.repetition_penalty != 1.0:
            idx = np.fromiter(set(seen), dtype=np.int64)
            idx = idx[(idx >= 0) & (idx < x.size)]
            v = x[idx]
            x[idx] = np.where(v > 0, v / s.repetition_penalty, v * s.repetition_penalty)
        if s.greedy:
            return int(x.argmax())
        x = x / s.temperature
        if 0 < s.top_k < x.size:
            kth = np.partition(x, x.size - s.top_k)[x.size - s.top_k]
            x = np.where(x >= kth, x, -np.inf)
        p = np.exp(x - x.max())
        p /= p.sum()
        if s.top_p < 1.0:
            order = np.argsort(-p, kind="stable")
            cum = np.cumsum(p[order])
            keep = order[: int(np.searchsorted(cum, s.top_p)) + 1]
            q = np.zeros_like(p)
            q[keep] = p[keep]
            p = q / q.sum()
        return int(self._rng.choice(p.size, p=p))
