"""The run over time and the latency CDF, both from the raw records."""

from __future__ import annotations

import numpy as np

from tradeoff.bench.records import OK, RecordBuffer
from tradeoff.bench.result import timeline
from tradeoff.stats.distribution import QUANTILES, quantiles

S = 1_000_000_000


def _records(ends_s: list[float], latencies_ms: list[float], failed: int = 0):
    buffer = RecordBuffer()
    for i, (end, latency) in enumerate(zip(ends_s, latencies_ms, strict=True)):
        outcome = OK if i >= failed else 1
        start = int(end * S - latency * 1e6)
        buffer.add(start, start, int(end * S), outcome, 200, 10, 10, 1, None)
    return buffer.freeze()


def test_each_second_counts_the_requests_that_ended_in_it() -> None:
    # 10 requests in the first second (1 ms each), none in the second, 4 in the third (5 ms)
    ends = [0.05 + 0.09 * i for i in range(10)] + [2.1, 2.3, 2.5, 2.7]
    line = timeline(_records(ends, [1.0] * 10 + [5.0] * 4), 0, 3 * S)
    assert line is not None and line["bin_s"] == 1.0
    assert line["throughput_rps"] == [10.0, 0.0, 4.0]
    assert line["p50_ms"][0] == 1.0 and line["p50_ms"][1] is None
    assert line["p99_ms"][2] == 5.0


def test_long_runs_get_longer_bins_and_failures_are_left_out() -> None:
    ends = list(np.linspace(0.5, 999.5, 1000))
    line = timeline(_records(ends, [2.0] * 1000, failed=10), 0, 1000 * S)
    assert line is not None and line["bin_s"] == 4.0 and len(line["throughput_rps"]) == 250
    assert sum(c * line["bin_s"] for c in line["throughput_rps"]) == 990
    assert timeline(_records([], []), 0, S) is None


def test_quantiles_sample_the_cdf_from_min_to_max() -> None:
    values = np.arange(1, 10_001, dtype=float)
    q = quantiles(values)
    assert q is not None and len(q) == len(QUANTILES)
    assert q[0] == 1.0 and q[-1] == 10_000.0 and q[50] == 5_000.5
    assert q == sorted(q)
    assert quantiles(np.array([np.nan])) is None
