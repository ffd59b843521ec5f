"""The adaptive batcher in a simulated server: the real BatchQueue and controller, a
fake clock, and an instance whose batch costs 1 ms + 0.1 ms a row (target p99 20 ms).

Worked out from the rule (scheduling/adaptive.py): the cap is the largest B with
2*c(B) <= 16 ms, 70, held to max_batch_size 64. At 2,000 rows/s a batch needs
b* = 2000 * 1 ms / (0.8 - 2000 * 0.1 ms) = 3.33 rows, so the delay is (3.33 - 1) / 2000/s
= 1.17 ms. At 50 rows/s b* < 1: no delay. At 7,000 rows/s b* = 70 -> 64 rows, whose
wait would be 9 ms: the budget (headroom * target - 2 * c(b)) clips it.
"""

from __future__ import annotations

import heapq
import itertools

import numpy as np
import pytest

from tradeoff.errors import ConfigError
from tradeoff.repository.config import DynamicBatching, parse_config_text
from tradeoff.scheduling.adaptive import AdaptiveBatcher
from tradeoff.scheduling.batch_queue import BatchQueue
from tradeoff.scheduling.request import InferenceRequest

FIXED_NS, PER_ROW_NS = 1_000_000, 100_000
TARGET_MS = 20.0
STEADY_DELAY_S = (2000 * 1e-3 / (0.8 - 2000 * 1e-4) - 1) / 2000


class Simulation:
    """Poisson arrivals into a BatchQueue served by one instance, on a fake clock."""

    def __init__(self, seed: int = 7) -> None:
        self.batcher = AdaptiveBatcher(TARGET_MS, 64, instances=1)
        self.queue = BatchQueue("m", 64, DynamicBatching())
        self.rng = np.random.default_rng(seed)
        self.now = 0
        self.busy_until: int | None = None
        self.events: list[tuple[int, int, str, object]] = []
        self.order = itertools.count()
        self.delays: list[tuple[int, int]] = []  # (time, delay_ns) after each tick
        self.latencies: list[tuple[int, int]] = []  # (finish time, latency)
        self.batches: list[int] = []

    def _at(self, when: int, kind: str, payload: object = None) -> None:
        heapq.heappush(self.events, (when, next(self.order), kind, payload))

    def run(self, phases: list[tuple[float, float]]) -> None:
        """Each phase: (seconds, rows per second)."""
        start = self.now
        for seconds, rate in phases:
            end = start + int(seconds * 1e9)
            t = start
            while True:
                t += int(self.rng.exponential(1 / rate) * 1e9)
                if t >= end:
                    break
                self._at(t, "arrive")
            start = end
        while self.events:
            self.now, _, kind, payload = heapq.heappop(self.events)
            if kind == "arrive":
                self.queue.push(InferenceRequest(inputs={}, rows=1), self.now)
                self.batcher.arrived(1)
                self._adapt()
            elif kind == "done":
                batch = payload
                assert isinstance(batch, list)
                self.busy_until = None
                self.batcher.executed(len(batch), FIXED_NS + PER_ROW_NS * len(batch))
                for request in batch:
                    self.latencies.append((self.now, self.now - request.enqueue_ns))
                    self.batcher.finished(self.now - request.enqueue_ns)
                self._adapt()
            self._dispatch()

    def _adapt(self) -> None:
        if self.batcher.update(self.now):
            self.queue.delay_ns = self.batcher.delay_ns
            self.queue.cap = self.batcher.cap
        if self.batcher.ticks and (not self.delays or self.delays[-1][0] < self.now - 50e6):
            self.delays.append((self.now, self.batcher.delay_ns))

    def _dispatch(self) -> None:
        if self.busy_until is not None:
            return
        batch, wake = self.queue.next_batch(self.now)
        if batch:
            self.busy_until = self.now + FIXED_NS + PER_ROW_NS * len(batch)
            self.batches.append(len(batch))
            self._at(self.busy_until, "done", batch)
        elif wake is not None:
            self._at(wake, "wake")

    def delays_between(self, start_s: float, end_s: float) -> np.ndarray:
        return np.array([d for t, d in self.delays if start_s * 1e9 <= t < end_s * 1e9])

    def p99_ms(self, start_s: float, end_s: float) -> float:
        values = [lat for t, lat in self.latencies if start_s * 1e9 <= t < end_s * 1e9]
        return float(np.percentile(values, 99)) / 1e6


def test_light_traffic_gets_no_wait() -> None:
    sim = Simulation()
    sim.run([(4.0, 50.0)])
    assert (sim.delays_between(2, 4) == 0).all()
    assert sim.p99_ms(2, 4) < 2.5  # at most a running batch and its own: nothing waited


def test_a_steady_load_converges_to_the_rule_without_oscillating() -> None:
    sim = Simulation()
    sim.run([(6.0, 2000.0)])
    settled = sim.delays_between(3, 6)
    assert np.median(settled) / 1e9 == pytest.approx(STEADY_DELAY_S, rel=0.25)
    assert settled.std() / settled.mean() < 0.15  # steady: no swings
    assert sim.batcher.cap == 64
    assert sim.batcher.fixed_s == pytest.approx(1e-3, rel=0.01)
    assert sim.batcher.per_row_s == pytest.approx(1e-4, rel=0.01)
    assert sim.p99_ms(3, 6) < TARGET_MS


def test_a_peak_takes_larger_batches_within_the_target() -> None:
    sim = Simulation()
    sim.run([(4.0, 2000.0), (3.0, 7000.0)])
    steady = [b for b in sim.batches[: len(sim.batches) // 3]]
    peak = sim.batches[-200:]
    assert np.mean(peak) > 2 * np.mean(steady)
    assert sim.p99_ms(5, 7) < TARGET_MS
    # the delay stays inside the budget: wait + a running batch + its own <= the target
    delay = np.median(sim.delays_between(5, 7)) / 1e9
    assert delay + 2 * sim.batcher.compute_s(np.mean(peak)) < TARGET_MS / 1e3


def test_a_burst_past_capacity_takes_the_largest_batches_and_the_quiet_brings_it_back(
        ) -> None:
    sim = Simulation()
    # 12,000 rows/s is past what one instance can do (64 rows / 7.4 ms = 8,650/s): the
    # longest wait the target allows, 0.8 * 20 - 2 * c(64) = 1.2 ms, and full batches;
    # after the burst, back to the steady rule.
    sim.run([(4.0, 2000.0), (1.0, 12000.0), (6.0, 2000.0)])
    before = np.median(sim.delays_between(2, 4))
    during = sim.delays_between(4.5, 5.0)
    after = np.median(sim.delays_between(9, 11))
    assert np.median(during) / 1e9 == pytest.approx(0.016 - 2 * 0.0074, abs=1e-4)
    assert max(sim.batches) == 64
    assert after == pytest.approx(before, rel=0.3)
    assert sim.p99_ms(9, 11) < TARGET_MS


def test_a_target_the_model_cannot_meet_lowers_the_headroom() -> None:
    batcher = AdaptiveBatcher(1.0, 64)
    for _ in range(30):
        batcher.arrived(1)
        batcher.executed(1, 3_000_000)
        batcher.finished(5_000_000)
    assert batcher.update(int(0.2e9)) or True
    assert batcher.headroom < 0.5 and batcher.cap == 1 and batcher.last_p99_s == 5e-3


@pytest.mark.parametrize(("text", "says"), [
    ('max_batch_size: 8 dynamic_batching { } parameters { key: "target_p99_ms" '
     'value: { string_value: "fast" } }', "positive number"),
    ('max_batch_size: 8 parameters { key: "target_p99_ms" value: { string_value: "20" } }',
     "needs dynamic_batching"),
    ('max_batch_size: 8 dynamic_batching { } parameters { key: "target_p99_ms" '
     'value: { string_value: "-3" } }', "positive number"),
])
def test_config_mistakes_name_the_parameter(text: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says) as info:
        parse_config_text(f'name: "m" {text}', source="config.pbtxt", default_name="m")
    assert info.value.field == "parameters.target_p99_ms"


def test_the_config_turns_it_on() -> None:
    config = parse_config_text('name: "m" max_batch_size: 8 dynamic_batching { } parameters '
                               '{ key: "target_p99_ms" value: { string_value: "12.5" } }',
                               source="config.pbtxt", default_name="m")
    assert config.dynamic_batching is not None
    assert config.dynamic_batching.target_p99_ms == 12.5
