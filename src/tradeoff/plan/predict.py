"""What a serving configuration will do to a traffic, predicted from measured batch costs.

    cost = BatchCost.of({1: 2000.0, 8: 9000.0, 64: 20000.0})   # samples/s per batch size
    run = simulate(traffic.arrivals(10_000), cost, max_batch=8, delay_s=0.0005,
                   instances=1, per_request_ms=0.05)
    run.p99_ms, run.mean_batch

The simulation is the dynamic batcher itself, request by request: requests queue in
arrival order; when an instance is free the batcher takes what waits, up to ``max_batch``,
and waits at most ``delay_s`` after the oldest request for more (Triton's
``max_queue_delay_microseconds``); a batch of ``b`` rows keeps its instance busy
``cost(b) + b * per_request_ms`` (the measured batch time, plus the server's own work per
request, which shares the CPU). Cache hits skip the batcher and take ``per_request_ms``.
The queueing follows from the arrivals: a trace's own gaps and bursts, or the law's.
``tests/unit/test_plan_predict_parity.py`` holds it to the served batcher
(:class:`~tradeoff.scheduling.batch_queue.BatchQueue`): the same batches at the same times.
"""

from __future__ import annotations

import bisect
import heapq
from dataclasses import dataclass

import numpy as np

__all__ = ["BatchCost", "Simulated", "simulate"]


@dataclass(frozen=True)
class BatchCost:
    """The time one batch takes, measured at some batch sizes and interpolated between
    them (extrapolated on the last two past the largest)."""

    sizes: tuple[int, ...]
    batch_ms: tuple[float, ...]

    @classmethod
    def of(cls, throughput_by_batch: dict[int, float]) -> BatchCost:
        """From samples per second at each batch size (``tradeoff optimize``'s figures)."""
        sizes = sorted(b for b, v in throughput_by_batch.items() if v > 0)
        return cls(tuple(sizes), tuple(1e3 * b / throughput_by_batch[b] for b in sizes))

    def ms(self, rows: int | np.ndarray) -> np.ndarray:
        """Milliseconds a batch of ``rows`` takes."""
        sizes = np.array(self.sizes, dtype=np.float64)
        times = np.array(self.batch_ms)
        out = np.interp(rows, sizes, times)
        if sizes.size >= 2:
            slope = (times[-1] - times[-2]) / (sizes[-1] - sizes[-2])
            out = np.where(np.asarray(rows) > sizes[-1],
                           times[-1] + slope * (np.asarray(rows) - sizes[-1]), out)
        return np.asarray(out, dtype=np.float64)

    def linear(self) -> tuple[float, float]:
        """(fixed ms, ms per row): the least-squares line through the measured times."""
        if len(self.sizes) < 2:
            return self.batch_ms[0], 0.0
        per_row, fixed = np.polyfit(self.sizes, self.batch_ms, 1)
        return float(fixed), float(per_row)

    def capacity_rps(self, max_batch: int, instances: int, per_request_ms: float) -> float:
        """Requests per second at full batches on every instance: the most it can serve."""
        busy_ms = float(self.ms(max_batch)) + max_batch * per_request_ms
        return instances * max_batch * 1e3 / busy_ms


@dataclass(frozen=True)
class Simulated:
    """Latency of each request (ms) and the size of each batch that ran."""

    latency_ms: np.ndarray
    batches: np.ndarray

    @property
    def p99_ms(self) -> float:
        return float(np.percentile(self.latency_ms, 99))

    @property
    def p50_ms(self) -> float:
        return float(np.percentile(self.latency_ms, 50))

    @property
    def mean_batch(self) -> float:
        return float(self.batches.mean()) if self.batches.size else 0.0


def simulate(arrivals_s: np.ndarray, cost: BatchCost, max_batch: int, delay_s: float,
             instances: int, per_request_ms: float = 0.0,
             hits: np.ndarray | None = None) -> Simulated:
    """Run the batcher over requests sent at ``arrivals_s`` (sorted); ``hits`` marks the
    requests the response cache answers."""
    arrivals = np.asarray(arrivals_s, dtype=np.float64)
    latency = np.full(arrivals.size, per_request_ms, dtype=np.float64)
    misses = np.flatnonzero(~hits) if hits is not None else np.arange(arrivals.size)
    # the event loop below runs once per batch: plain floats and bisect, not numpy scalars
    queue = arrivals[misses].tolist()
    n = len(queue)
    table = (cost.ms(np.arange(max_batch + 1)) / 1e3 +
             np.arange(max_batch + 1) * per_request_ms / 1e3).tolist()
    free = [0.0] * instances
    ends: list[float] = []
    sizes: list[int] = []
    head = 0
    while head < n:
        start = max(heapq.heappop(free), queue[head])
        last = head + max_batch - 1
        if last < n and queue[last] <= start:
            count = max_batch
        else:
            ready = bisect.bisect_right(queue, start, head) - head
            deadline = queue[head] + delay_s
            if start < deadline:
                # wait for a full batch or the delay, whichever comes first
                start = min(deadline, queue[last]) if last < n else deadline
                ready = bisect.bisect_right(queue, start, head) - head
            count = max(1, min(max_batch, ready))
        end = start + table[count]
        ends.append(end)
        sizes.append(count)
        heapq.heappush(free, end)
        head += count
    done = np.repeat(np.array(ends, dtype=np.float64), sizes)  # batches run in order
    latency[misses] = (done - arrivals[misses]) * 1e3
    return Simulated(latency, np.array(sizes, dtype=np.int64))
