"""Is a series drifting? The Mann-Kendall trend test with Sen's slope.

Mann-Kendall asks whether later values tend to be larger (or smaller) than earlier ones,
without assuming a shape or a distribution; the p-value uses its normal approximation
with the tie correction. Below 5 points no series can reach p < 0.05; from 6 points a
steady trend does. Sen's slope (the median of all pairwise slopes) says how big
the trend is, and is not thrown by an outlier.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

__all__ = ["Trend", "mann_kendall"]


@dataclass(frozen=True)
class Trend:
    """Direction, size and significance of a trend in a series."""

    n: int
    slope_per_s: float      # Sen's slope, units of the series per second
    change_percent: float   # slope x span, relative to the median of the series
    p_value: float
    direction: str          # up | down | none

    def significant(self, alpha: float = 0.05) -> bool:
        return self.p_value < alpha

    def to_dict(self) -> dict[str, float | int | str]:
        return asdict(self)


def mann_kendall(times: np.ndarray, values: np.ndarray, alpha: float = 0.05) -> Trend:
    """Trend of ``values`` over ``times`` (seconds); NaNs are left out. ``direction`` is
    up or down only when the trend is significant at ``alpha``."""
    times = np.asarray(times, float)
    values = np.asarray(values, float)
    keep = np.isfinite(values) & np.isfinite(times)
    order = np.argsort(times[keep], kind="stable")
    t, x = times[keep][order], values[keep][order]
    n = x.size
    if n < 3:
        return Trend(n, 0.0, 0.0, 1.0, "none")
    upper = np.triu_indices(n, k=1)
    dx = (x[None, :] - x[:, None])[upper]
    dt = (t[None, :] - t[:, None])[upper]
    s = float(np.sign(dx).sum())
    _, ties = np.unique(x, return_counts=True)
    variance = (n * (n - 1) * (2 * n + 5) - float((ties * (ties - 1) * (2 * ties + 5)).sum())) / 18
    z = 0.0 if s == 0 or variance <= 0 else (s - math.copysign(1, s)) / math.sqrt(variance)
    p = math.erfc(abs(z) / math.sqrt(2))
    valid = dt > 0
    slope = float(np.median(dx[valid] / dt[valid])) if valid.any() else 0.0
    median = float(np.median(x))
    span = float(t.max() - t.min())
    change = slope * span / abs(median) * 100 if median else 0.0
    direction = "none" if p >= alpha else ("up" if s > 0 else "down")
    return Trend(n, slope, change, p, direction)
