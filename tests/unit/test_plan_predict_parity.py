"""The plan's batcher (plan/predict.py) forms the batches the served one does.

The same arrivals go through :func:`tradeoff.plan.predict.simulate` and through the real
:class:`~tradeoff.scheduling.batch_queue.BatchQueue`, driven as the scheduler drives it
(a decision whenever a request arrives, a batch ends or the queue's wake time comes, a
batch taken only while an instance is free) on a fake clock: every batch has the same
size and every request ends at the same time. Times are whole ticks of 1/64 s, exact in
binary and in nanoseconds, so ties (a burst, an arrival at a batch's deadline or end) are
exact too; at one instant the arrivals are queued before the decision, as the scheduler
dispatches on the loop's next turn. predict.py models neither preferred batch sizes nor
priority levels (the plan sets neither), so they are not compared.
"""

from __future__ import annotations

import heapq

import numpy as np
import pytest

from tradeoff.plan.predict import BatchCost, simulate
from tradeoff.repository.config import DynamicBatching
from tradeoff.scheduling.batch_queue import BatchQueue
from tradeoff.scheduling.request import InferenceRequest

TICK_NS = 15_625_000  # 1/64 s


def _served(arrivals: np.ndarray, cost: dict[int, int], max_batch: int, delay: int,
            instances: int) -> tuple[list[int], np.ndarray]:
    """Batch sizes in the order they formed, and each request's end (ticks), through the
    real queue: ``arrivals`` and ``delay`` in ticks, ``cost[b]`` the ticks a batch of
    ``b`` keeps an instance busy."""
    queue = BatchQueue("m", max_batch, DynamicBatching(max_queue_delay_us=delay * TICK_NS
                                                       // 1000))
    index: dict[int, int] = {}
    ends = np.full(arrivals.size, -1, dtype=np.int64)
    sizes: list[int] = []
    running: list[int] = []  # when each busy instance frees, in ns
    free, head, wake = instances, 0, None
    while head < arrivals.size or len(queue):
        now = min(t for t in (int(arrivals[head]) * TICK_NS if head < arrivals.size else None,
                              running[0] if running else None, wake) if t is not None)
        while running and running[0] <= now:
            heapq.heappop(running)
            free += 1
        while head < arrivals.size and arrivals[head] * TICK_NS <= now:
            request = InferenceRequest({})
            index[id(request)] = head
            queue.push(request, now)
            head += 1
        wake = None
        while free and len(queue):
            batch, wake = queue.next_batch(now)
            if batch is None:
                break
            free -= 1
            end = now + cost[len(batch)] * TICK_NS
            heapq.heappush(running, end)
            sizes.append(len(batch))
            for request in batch:
                ends[index[id(request)]] = end // TICK_NS
    return sizes, ends


def _predicted(arrivals: np.ndarray, cost: dict[int, int], max_batch: int, delay: int,
               instances: int) -> tuple[list[int], np.ndarray]:
    """The same through plan/predict.py, in ticks."""
    sizes = sorted(cost)
    batch_cost = BatchCost(tuple(sizes), tuple(cost[b] * 1000 / 64 for b in sizes))
    seconds = arrivals / 64
    run = simulate(seconds, batch_cost, max_batch, delay / 64, instances)
    ends = seconds + run.latency_ms / 1e3
    return [int(b) for b in run.batches], ends * 64


@pytest.mark.parametrize("max_batch", [1, 4, 8])
@pytest.mark.parametrize("delay", [0, 1, 3])
@pytest.mark.parametrize("instances", [1, 2, 3])
@pytest.mark.parametrize("seed", [0, 1])
def test_predict_forms_the_batches_the_batch_queue_forms(max_batch: int, delay: int,
                                                         instances: int, seed: int) -> None:
    rng = np.random.default_rng([seed, max_batch, delay, instances])
    # bursts (gaps of 0), steady stretches and pauses; the load runs from idle to a queue
    arrivals = np.cumsum(rng.choice([0, 0, 0, 1, 1, 2, 5], size=400))
    cost = {b: 1 + (b + 1) // 2 * instances for b in range(1, max_batch + 1)}
    served_sizes, served_ends = _served(arrivals, cost, max_batch, delay, instances)
    predicted_sizes, predicted_ends = _predicted(arrivals, cost, max_batch, delay, instances)
    assert predicted_sizes == served_sizes
    np.testing.assert_array_equal(predicted_ends, served_ends)
    assert max(served_sizes) == max_batch  # the load fills batches: full ones compared too
