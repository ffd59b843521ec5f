"""How often inputs repeat, and what a cache makes of it: a Zipf law's probabilities, the
steady-state hit ratio of an LRU cache under independent draws (Che's approximation), and
the share of requests that ask for an input for the first time.

    p = zipf_probabilities(1000, 1.0)
    lru_hit_ratio(p, capacity=100)        # ~0.56: what a cache of 100 answers should reach
    first_sight_ratio(p, draws=5000)      # the misses no cache avoids
"""

from __future__ import annotations

import numpy as np

__all__ = ["first_sight_ratio", "lru_hit_ratio", "zipf_probabilities"]


def zipf_probabilities(count: int, s: float) -> np.ndarray:
    """P(k-th input) ∝ 1/k**s for k = 1..count (s = 0: uniform)."""
    weights = np.arange(1, count + 1, dtype=np.float64) ** -s
    return weights / weights.sum()


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
    with np.errstate(divide="ignore"):  # an input asked every time: log(0), -inf
        unseen = np.log1p(-p)  # log of P(not drawn) per draw

    def never_drawn(n: int) -> np.ndarray:
        return np.exp(n * unseen) if n else np.ones_like(p)

    new = np.sum(never_drawn(before) - never_drawn(before + draws))
    return float(new / draws)
