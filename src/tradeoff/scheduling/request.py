"""One inference request as the scheduler sees it, and the timings recorded for it."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tradeoff.scheduling.priority import DEFAULT_TENSOR_PRIORITY, TensorPriority

__all__ = ["InferenceRequest", "Timings"]


@dataclass(slots=True)
class Timings:
    """Nanosecond durations of one request, recorded once where they happen."""

    queue_ns: int = 0
    compute_input_ns: int = 0
    compute_infer_ns: int = 0
    compute_output_ns: int = 0
    batch_size: int = 0
    cache: str = ""  # the response cache's verdict: hit, miss, coalesced; "" when not asked
    cache_ns: int = 0  # its lookup (or, coalesced, the wait for the identical request)
    route: str = ""  # the router's target that answered ("mlp/2"); "" when not routed
    # a replica's own Server-Timing entries, passed on in place of this server's ("":
    # it sent none); None when this server answered
    upstream: str | None = None

    def server_timing(self) -> str:
        """The value of a standard ``Server-Timing`` header (durations in ms)."""
        if self.upstream is not None:
            return ", ".join(part for part in (
                f'route;desc="{self.route}"' if self.route else "", self.upstream) if part)
        text = _QUEUE_TIMING % (self.queue_ns / 1e6, _batch_timing(
            self.compute_input_ns, self.compute_infer_ns, self.compute_output_ns,
            self.batch_size))
        if self.cache:
            text = f"cache;desc={self.cache};dur={self.cache_ns / 1e6:.3f}, {text}"
        if self.route:
            text = f'route;desc="{self.route}", {text}'
        return text


_QUEUE_TIMING = "queue;dur=%.3f, %s"


@functools.lru_cache(maxsize=64)
def _batch_timing(input_ns: int, infer_ns: int, output_ns: int, batch_size: int) -> str:
    """The part of Server-Timing that the requests of one batch share (formatted once)."""
    return 'compute_input;dur=%.3f, compute_infer;dur=%.3f, compute_output;dur=%.3f, ' \
           'batch;desc="%d"' % (input_ns / 1e6, infer_ns / 1e6, output_ns / 1e6, batch_size)


@dataclass(slots=True, eq=False)
class InferenceRequest:
    """Inputs already decoded to numpy, validated against the model's config.

    ``rows`` is the request's own batch size (1 for models that do not batch);
    ``shape_key`` holds the non-batch dims of every input, so only requests with equal
    keys are batched together.
    """

    inputs: dict[str, np.ndarray]
    rows: int = 1
    shape_key: tuple = ()
    priority: TensorPriority = DEFAULT_TENSOR_PRIORITY
    timeout_us: int | None = None
    enqueue_ns: int = 0
    deadline_ns: int | None = None
    timings: Timings = field(default_factory=Timings)
    future: asyncio.Future | None = None
    on_done: Callable[[Any], None] | None = None  # instead of the future: Scheduler.submit_call
    cancelled: bool = False
    # after cancel: called once the scheduler no longer holds the request (True: dropped
    # from the queue before it ran); its inputs may then be reused
    on_released: Callable[[bool], None] | None = None
    result: tuple | BaseException | None = None  # answer held back for ordering
