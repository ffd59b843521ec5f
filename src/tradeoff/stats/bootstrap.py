"""95% bootstrap confidence intervals of a ratio between two sets of raw samples.

    bootstrap_ratio(latencies_a, latencies_b, p99)  # [low, high] of p99(b) / p99(a)

Each side is resampled independently (with replacement) ``BOOTSTRAP_ROUNDS`` times, from
at most ``BOOTSTRAP_SAMPLES`` samples drawn at random, so a long run stays cheap.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = [
    "BOOTSTRAP_ROUNDS",
    "BOOTSTRAP_SAMPLES",
    "STATISTICS",
    "bootstrap_ratio",
    "p50",
    "p99",
]

BOOTSTRAP_ROUNDS = 500
BOOTSTRAP_SAMPLES = 20_000


def bootstrap_ratio(a: np.ndarray, b: np.ndarray, statistic: Callable[..., np.ndarray],
                    seed: int = 0) -> list[float] | None:
    """95% interval of statistic(b) / statistic(a), resampling each side independently.
    ``statistic(samples, axis=1)`` must reduce each row of a 2-D array."""
    if a.size < 2 or b.size < 2:
        return None
    rng = np.random.default_rng(seed)
    a = a if a.size <= BOOTSTRAP_SAMPLES else rng.choice(a, BOOTSTRAP_SAMPLES, replace=False)
    b = b if b.size <= BOOTSTRAP_SAMPLES else rng.choice(b, BOOTSTRAP_SAMPLES, replace=False)
    ratios = []
    chunk = max(1, 2_000_000 // max(a.size, b.size))
    for first in range(0, BOOTSTRAP_ROUNDS, chunk):
        n = min(chunk, BOOTSTRAP_ROUNDS - first)
        sa = statistic(a[rng.integers(0, a.size, (n, a.size), dtype=np.int32)], axis=1)
        sb = statistic(b[rng.integers(0, b.size, (n, b.size), dtype=np.int32)], axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):  # 0/0: dropped below
            ratios.append(sb / sa)
    values = np.concatenate(ratios)
    values = values[np.isfinite(values)]
    if not values.size:
        return None
    return [float(np.percentile(values, 2.5)), float(np.percentile(values, 97.5))]


def p50(x: np.ndarray, axis: int) -> np.ndarray:
    """The median along ``axis``: a statistic for :func:`bootstrap_ratio`."""
    return np.percentile(x, 50, axis=axis)


def p99(x: np.ndarray, axis: int) -> np.ndarray:
    """The 99th percentile along ``axis``: a statistic for :func:`bootstrap_ratio`."""
    return np.percentile(x, 99, axis=axis)


STATISTICS: dict[str, Callable[..., np.ndarray]] = {"mean": np.mean, "p50": p50, "p99": p99}
