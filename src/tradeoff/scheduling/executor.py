"""What the data plane needs of a tensor model version's executor (its batch queue and
instances), wherever they run. :class:`~tradeoff.scheduling.scheduler.Scheduler` is
the in-process one: the batcher on the event loop, an instance per worker thread.

    executor: TensorExecutor = Scheduler(config, instances, stats)
    await executor.start()
    timings, outputs = await executor.infer(request)
    executor.load().queue_depth
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import msgspec
import numpy as np

from tradeoff.scheduling.request import InferenceRequest, Timings
from tradeoff.scheduling.stats import ModelStats

__all__ = ["Answer", "ExecutorLoad", "Outputs", "TensorExecutor"]

Outputs = dict[str, np.ndarray]
Answer = tuple[Timings, Outputs]


class ExecutorLoad(msgspec.Struct, frozen=True):
    """An executor's queue and batcher now (``/metrics``): requests queued, accepted and
    not yet answered, batches run on the event loop so far, and the adaptive batcher's
    delay (microseconds) and row cap (None without one)."""

    queue_depth: int
    in_flight: int
    inline_batches: int
    adaptive_delay_us: float | None = None
    adaptive_cap: int | None = None


class TensorExecutor(Protocol):
    """Runs one tensor model version's requests in batches."""

    stats: ModelStats
    # called once when the last instance has died, with the cause
    on_dead: Callable[[str], None] | None

    @property
    def queue_depth(self) -> int: ...

    def load(self) -> ExecutorLoad: ...

    async def start(self) -> None: ...

    def drain(self) -> None:
        """Refuse new requests and run every queued one now."""

    async def stop(self) -> None:
        """Answer the queued and running requests, then release the instances."""

    async def infer(self, request: InferenceRequest) -> Answer: ...

    def submit_call(self, request: InferenceRequest,
                    on_done: Callable[[Answer | BaseException], None]) -> None:
        """Queue a request; ``on_done`` gets its answer or error on the loop, never
        after :meth:`cancel`."""

    def cancel(self, request: InferenceRequest) -> None:
        """Nobody waits for ``request`` any more."""
