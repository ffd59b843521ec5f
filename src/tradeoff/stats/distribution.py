"""Exact summaries of raw samples: min, mean, stddev, p50 ... p99.9, max.

    distribution(np.array([1.0, 2.0, 3.0]))["p50"]  # 2.0
"""

from __future__ import annotations

import numpy as np

__all__ = ["PERCENTILES", "QUANTILES", "distribution", "quantiles"]

PERCENTILES = {"p50": 50, "p90": 90, "p95": 95, "p99": 99, "p999": 99.9}
# where a CDF is sampled: 0 (min), every percent, the tail, 100 (max)
QUANTILES = (0.0, *range(1, 100), 99.5, 99.9, 99.99, 100.0)


def distribution(values: np.ndarray) -> dict[str, float] | None:
    """min, mean, stddev, p50 ... p99.9, max of raw samples (None when there are none)."""
    values = values[np.isfinite(values)]
    if not values.size:
        return None
    out = {"min": float(values.min()), "mean": float(values.mean()),
           "stddev": float(values.std())}
    for name, q in PERCENTILES.items():
        out[name] = float(np.percentile(values, q))
    out["max"] = float(values.max())
    return out


def quantiles(values: np.ndarray) -> list[float] | None:
    """``values`` at each of QUANTILES (percent), to 4 decimals: a CDF drawn from the
    samples themselves in about 1 KB (None when there are none)."""
    values = values[np.isfinite(values)]
    if not values.size:
        return None
    return [round(float(v), 4) for v in np.percentile(values, QUANTILES)]
