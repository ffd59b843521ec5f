"""Where more load stops paying: the knee of a throughput-vs-load curve.

The rule (docs/sweeps.md): walk the points in order of offered load (concurrency or rate).
The step from point i to point i+1 is *flat* when its throughput gain, scaled to one
doubling of the load, is under ``min_gain`` (5%):

    gain_per_doubling = (T[i+1] / T[i]) ** (1 / log2(L[i+1] / L[i])) - 1

The knee is the first point from which *every* later point is flat: past it, more load
buys under 5% throughput per doubling while latency grows (Little's law: at flat
throughput, doubling the concurrency doubles the latency). Comparing with every later
point, not only the next, keeps one noisy dip from passing for the knee. With no such
point (the last point excepted) the knee is not reached.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from tradeoff.errors import InvalidValue

__all__ = ["MIN_GAIN", "find_knee", "gain_per_doubling"]

MIN_GAIN = 0.05


def gain_per_doubling(load_a: float, throughput_a: float, load_b: float,
                      throughput_b: float) -> float:
    """Throughput gain from a to b, scaled to one doubling of the load."""
    if throughput_a <= 0:
        return math.inf if throughput_b > 0 else 0.0
    if load_b <= load_a:
        raise InvalidValue("loads must increase")
    doublings = math.log2(load_b / load_a)
    return (max(throughput_b, 0.0) / throughput_a) ** (1 / doublings) - 1


def find_knee(loads: Sequence[float], throughputs: Sequence[float],
              min_gain: float = MIN_GAIN) -> int | None:
    """Index of the knee (see the module rule), or None when throughput still grows."""
    for i in range(len(loads) - 1):
        if throughputs[i] <= 0:
            continue  # a point that served nothing is not an operating point
        if all(gain_per_doubling(loads[i], throughputs[i], loads[j], throughputs[j]) < min_gain
               for j in range(i + 1, len(loads))):
            return i
    return None
