"""Which prepared request each send uses: round-robin, or drawn from a Zipf law.

Real traffic repeats itself unevenly: a few inputs are asked for often, most rarely.
``--distinct-inputs N --zipf S`` sends N distinct inputs, the k-th most popular with
probability proportional to 1/k**S, drawn with ``--seed`` so a run can be repeated; that
is how a response cache can be measured honestly (round-robin over a few inputs makes
every request after the first round a hit).

    mix = InputMix(zipf=1.0)
    order = mix.order(1000, seed=0)              # request indices, most popular first
    lru_hit_ratio(zipf_probabilities(1000, 1.0), capacity=100)   # ~0.56: what to expect
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

ORDER_LENGTH = 1 << 20  # draws made up front, then reused in the same order


def zipf_probabilities(count: int, s: float) -> np.ndarray:
    """P(k-th input) ∝ 1/k**s for k = 1..count (s = 0: uniform)."""
    weights = np.arange(1, count + 1, dtype=np.float64) ** -s
    return weights / weights.sum()


@dataclass(frozen=True)
class InputMix:
    """Round-robin over the prepared requests (``zipf`` None) or Zipf draws over them."""

    zipf: float | None = None

    def order(self, count: int, seed: int) -> np.ndarray | None:
        """The index of the request each send uses, in turn (None: round-robin)."""
        if self.zipf is None:
            return None
        rng = np.random.default_rng([seed, 0x21BF])  # apart from the arrivals' stream
        return rng.choice(count, size=ORDER_LENGTH,
                          p=zipf_probabilities(count, self.zipf)).astype(np.int32)

    def describe(self, count: int) -> dict[str, Any]:
        """What the result records: how many distinct inputs, drawn how."""
        if self.zipf is None:
            return {"distinct_inputs": count, "draw": "round-robin"}
        return {"distinct_inputs": count, "draw": "zipf", "zipf_s": self.zipf}


def lru_hit_ratio(probabilities: np.ndarray, capacity: int) -> float:
    """Steady-state hit ratio of an LRU cache holding ``capacity`` answers under
    independent draws with these probabilities (Che's approximation: the characteristic
    time T solves sum(1 - exp(-p T)) = capacity; the hit ratio is sum(p (1 - exp(-p T))))."""
    p = np.asarray(probabilities, dtype=np.float64)
    if capacity >= p.size:
        return 1.0
    if capacity <= 0:
        return 0.0
    low, high = 0.0, 1.0
    while np.sum(-np.expm1(-p * high)) < capacity:
        high *= 2
    for _ in range(100):
        middle = (low + high) / 2
        if np.sum(-np.expm1(-p * middle)) < capacity:
            low = middle
        else:
            high = middle
    return float(np.sum(p * -np.expm1(-p * high)))


def first_sight_ratio(probabilities: np.ndarray, draws: int, before: int = 0) -> float:
    """The expected share of ``draws`` requests, sent after ``before`` others, that ask for
    an input never asked before: each is a miss even for a cache that holds everything."""
    p = np.asarray(probabilities, dtype=np.float64)
    if not draws or not p.size:
        return 0.0
    unseen = np.log1p(-p)  # log of P(not drawn) per draw
    new = np.sum(np.exp(before * unseen) - np.exp((before + draws) * unseen))
    return float(new / draws)
