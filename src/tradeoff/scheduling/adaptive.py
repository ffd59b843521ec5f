"""The SLA-adaptive batcher: a queue delay and batch cap that follow the load.

A model opts in with ``parameters { key: "target_p99_ms" value: { string_value: "20" } }``
(with ``dynamic_batching``). The controller watches what the scheduler sees (rows
arriving, each batch's rows and compute time, each request's queue + compute time) and,
at most every ``TICK_S``, sets the delay and the cap. The rule (docs/batching.md):

* compute model: ``c(b) = a + k*b``, a least-squares fit over the last batches;
* cap ``B``: the largest batch with ``2*c(B) <= 0.8 * target`` (a request that arrives as
  a batch starts waits for it, then rides the next one), within ``max_batch_size``;
* rows a batch needs so each instance stays under 80% busy at the arrival rate ``r`` per
  instance: ``b* = r*a / (0.8 - r*k)`` (when ``r*k >= 0.8`` no batch is large enough:
  the model is overloaded, and the delay is the longest the target allows,
  ``0.8*target - 2*c(B)``, so every batch is as large as it may be);
* delay: ``0`` when ``b* <= 1`` (light traffic: nothing to wait for); otherwise the time
  the next ``b* - 1`` rows take to arrive, ``(min(b*, B) - 1) / r``, at most
  ``h*target - 2*c(b)``;
* headroom ``h`` (0.1 to 0.8, from 0.5) is the feedback on what was measured: each tick
  whose p99 passed the target multiplies it by 0.7; each tick under half the target adds
  0.05 (multiplicative decrease, additive increase). Between half the target and the
  target nothing changes: the dead band keeps a steady load from oscillating;
* the arrival rate and the delay are smoothed (halfway to the new value per tick).

Light traffic gets no wait; rising load gets the wait that fills the batches it needs;
at a peak the batches fill before the wait ends, so the delay shrinks as the rate grows
while the cap stays as large as the target allows.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from tradeoff.errors import InvalidValue

__all__ = ["BUSY", "CAP_SHARE", "HEADROOM", "MIN_LATENCIES", "TICK_S", "AdaptiveBatcher"]

TICK_S = 0.1
BUSY = 0.8  # utilisation of each instance the delay aims to keep under
CAP_SHARE = 0.8  # share of the target one wait-and-compute of a full batch may take
HEADROOM = (0.1, 0.5, 0.8)  # least, first and most
MIN_LATENCIES = 20  # a tick with fewer finished requests does not move the headroom


class AdaptiveBatcher:
    """Chooses the queue delay (ns) and the batch cap (rows) from what it observes.

        batcher = AdaptiveBatcher(target_ms=20, max_batch_size=64, instances=1)
        batcher.arrived(rows, now_ns); batcher.executed(rows, compute_ns)
        batcher.finished(latency_ns); batcher.update(now_ns) -> True when it changed
    """

    def __init__(self, target_ms: float, max_batch_size: int, instances: int = 1,
                 initial_delay_us: int = 0, now_ns: int = 0) -> None:
        if not target_ms > 0:
            raise InvalidValue(f"target_p99_ms must be positive, got {target_ms}")
        self.target_s = target_ms / 1e3
        self.max_batch_size = max(max_batch_size, 1)
        self.instances = max(instances, 1)
        self.delay_ns = initial_delay_us * 1000
        self.cap = self.max_batch_size
        self.headroom = HEADROOM[1]
        self.rate = 0.0  # rows per second, smoothed
        self.fixed_s = 0.0  # a: compute time of an empty batch
        self.per_row_s = 0.0  # k: compute time of one more row
        self.last_p99_s: float | None = None
        self.ticks = 0
        self._batches: deque[tuple[int, float]] = deque(maxlen=256)
        self._latencies: list[int] = []
        self._arrived = 0
        self._since = now_ns

    # ------------------------------------------------------------ observations

    def arrived(self, rows: int) -> None:
        self._arrived += rows

    def executed(self, rows: int, compute_ns: int) -> None:
        self._batches.append((rows, compute_ns / 1e9))

    def finished(self, latency_ns: int) -> None:
        if len(self._latencies) < 4096:
            self._latencies.append(latency_ns)

    # ------------------------------------------------------------ control

    def compute_s(self, rows: float) -> float:
        """``c(rows)`` of the current fit."""
        return self.fixed_s + self.per_row_s * rows

    def update(self, now_ns: int) -> bool:
        """Recompute the delay and the cap when a tick has passed; True when either
        changed."""
        elapsed = (now_ns - self._since) / 1e9
        if elapsed < TICK_S:
            return False
        self._since = now_ns
        self.ticks += 1
        observed = self._arrived / elapsed
        self._arrived = 0
        self.rate = observed if self.ticks == 1 else (self.rate + observed) / 2
        self._fit()
        self._feedback()
        before = (self.delay_ns, self.cap)
        self.cap = self._cap()
        delay = self._delay()
        self.delay_ns = round((self.delay_ns + delay * 1e9) / 2 / 1e4) * 10_000  # 10 µs steps
        if delay == 0 and self.delay_ns <= 20_000:
            self.delay_ns = 0
        return (self.delay_ns, self.cap) != before

    def _fit(self) -> None:
        if not self._batches:
            return
        rows = np.array([b[0] for b in self._batches], dtype=float)
        times = np.array([b[1] for b in self._batches])
        if np.ptp(rows) > 0:
            slope, intercept = np.polyfit(rows, times, 1)
        else:
            slope, intercept = 0.0, float(times.mean())
        if intercept < 0:  # all cost per row
            slope, intercept = float((times / rows).mean()), 0.0
        self.per_row_s = max(float(slope), 0.0)
        self.fixed_s = max(float(intercept), 0.0)

    def _feedback(self) -> None:
        latencies, self._latencies = self._latencies, []
        if len(latencies) < MIN_LATENCIES:
            return
        p99 = float(np.percentile(latencies, 99)) / 1e9
        self.last_p99_s = p99
        least, _, most = HEADROOM
        if p99 > self.target_s:
            self.headroom = max(least, self.headroom * 0.7)
        elif p99 < self.target_s / 2:
            self.headroom = min(most, self.headroom + 0.05)

    def _cap(self) -> int:
        limit = CAP_SHARE * self.target_s / 2
        if self.per_row_s <= 0:
            return self.max_batch_size if self.fixed_s <= limit else 1
        rows = math.floor((limit - self.fixed_s) / self.per_row_s)
        return min(max(rows, 1), self.max_batch_size)

    def needed_rows(self) -> float:
        """``b*``: rows per batch that keep each instance under 80% busy (inf: overload)."""
        per_instance = self.rate / self.instances
        if per_instance <= 0:
            return 0.0
        if per_instance * self.per_row_s >= BUSY:
            return math.inf
        return per_instance * self.fixed_s / (BUSY - per_instance * self.per_row_s)

    def _delay(self) -> float:
        needed = self.needed_rows()
        if math.isinf(needed):
            return max(0.0, CAP_SHARE * self.target_s - 2 * self.compute_s(self.cap))
        if needed <= 1 or self.rate <= 0:
            return 0.0
        rows = min(needed, self.cap)
        wait = (rows - 1) / self.rate
        longest = self.headroom * self.target_s - 2 * self.compute_s(rows)
        return max(0.0, min(wait, longest))

    def describe(self) -> str:
        return (f"adaptive delay {self.delay_ns / 1e3:,.0f} us, cap {self.cap}, headroom "
                f"{self.headroom:.2f}, rate {self.rate:,.0f} rows/s, c(b) = "
                f"{self.fixed_s * 1e3:.3f} + {self.per_row_s * 1e3:.4f}*b ms")
